"""The eigendata flow (EigenData / AReaL-SEA, see ../shared/FLOWS.md §1-2): registers its
strategies on import (gen-task, validate-task, make-verifier, repair, gen-plan, reflect)."""

from toolkit.flows.eigendata import gen_task  # noqa: F401
from toolkit.flows.eigendata import validate_task  # noqa: F401
from toolkit.flows.eigendata import make_verifier  # noqa: F401
from toolkit.flows.eigendata import repair  # noqa: F401
from toolkit.flows.eigendata import gen_plan  # noqa: F401
from toolkit.flows.eigendata import reflect  # noqa: F401
