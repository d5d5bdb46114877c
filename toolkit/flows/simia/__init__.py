"""The simia flow ("Simulating Environments with Reasoning Models for Agent Training" (Simia)): registers its strategies on import.

Modules (one per step): `transcript` (the deterministic transcript ⇄ messages parser),
`prefilter` (validate-task --strategy simia), `simulate` (simulate-env --mode trajectory),
`rules` (repair --strategy rules), `format` (native ⇄ Hermes tool-call text, reused by exporters),
`grounding` (verify --strategy grounding), `rl` (Simia-RL task records on the simulated backend),
`recipe` (the recipe; its yield table is toolkit.yieldtable with Simia notes).
"""

from toolkit.flows.simia import (
    prefilter,  # noqa: F401  (registers validate-task simia)
    rl,  # noqa: F401  (registers gen-task simia: Simia-RL tasks)
    rules,  # noqa: F401  (registers repair rules)
    simulate,  # noqa: F401  (registers simulate-env --mode trajectory)
)
