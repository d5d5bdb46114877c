"""The eigendata flow (EigenData / AReaL-SEA: "From Self-Evolving Synthetic Data to Verifiable-Reward RL: Post-Training Multi-turn Interactive Tool-Using Agents" (arXiv 2601.22607; EigenData is v1, AReaL-SEA v3)): registers its
strategies on import (gen-task, validate-task, make-verifier, repair, gen-plan, reflect)."""

from toolkit.flows.eigendata import gen_task  # noqa: F401
from toolkit.flows.eigendata import validate_task  # noqa: F401
from toolkit.flows.eigendata import make_verifier  # noqa: F401
from toolkit.flows.eigendata import repair  # noqa: F401
from toolkit.flows.eigendata import gen_plan  # noqa: F401
from toolkit.flows.eigendata import reflect  # noqa: F401
