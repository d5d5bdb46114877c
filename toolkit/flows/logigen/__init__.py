"""The logigen flow ("LOGIGEN: Logic-Driven Generation of Verifiable Agentic Tasks" (arXiv 2603.00540)): registers its strategies on import.

Modules: analysis (trigger analysis, no registration), domain_check (the deterministic domain
check), architect (gen-plan --strategy logigen), gentask (gen-task: explorer, set_designer,
projection, llm_explorer), validate (validate-task). Keep this a plain import list."""

from toolkit.flows.logigen import architect  # noqa: F401  gen-plan logigen
from toolkit.flows.logigen import gentask, validate  # noqa: F401  gen-task / validate-task logigen
