"""The astra flow ("ASTRA: Automated Synthesis of agentic Trajectories and Reinforcement Arenas").

Modules, one per step: tooldocs (A1 ingestion), chains (A2 graph / walks / dependency check),
plan (gen-plan), tasks (gen-task astra, A3), qa (gen-task astra-qa, B1), validate (validate-task,
A3 scores + B2 QS), envsynth (make-verifier, B3/B4), mixing (irrelevant-tool bands, §3.2.2).

Importing the package registers nothing: each command's module is its own entry point
(pyproject.toml, toolkit.registry.BUILTINS), so a command imports only its strategy's module.
"""
