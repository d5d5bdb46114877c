"""The simia flow ("Simulating Environments with Reasoning Models for Agent Training" (Simia)).

Modules (one per step): `transcript` (the deterministic transcript ⇄ messages parser),
`prefilter` (validate-task --strategy simia), `simulate` (simulate-env --mode trajectory),
`rules` (repair --strategy rules), `format` (native ⇄ Hermes tool-call text, reused by exporters),
`grounding` (verify --strategy grounding), `rl` (Simia-RL task records on the simulated backend),
`recipe` (the recipe; its yield table is toolkit.yieldtable with Simia notes).

Importing the package registers nothing: each command's module is its own entry point
(pyproject.toml, toolkit.registry.BUILTINS), so a command imports only its strategy's module.
"""
