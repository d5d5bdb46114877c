"""The astra flow ("ASTRA: Automated Synthesis of agentic Trajectories and Reinforcement Arenas"): registers its strategies on import.

Modules, one per step: tooldocs (A1 ingestion), chains (A2 graph / walks / dependency check),
plan (gen-plan), tasks (gen-task astra, A3), qa (gen-task astra-qa, B1), validate (validate-task,
A3 scores + B2 QS), envsynth (make-verifier, B3/B4), mixing (irrelevant-tool bands, §3.2.2).
"""

from toolkit.flows.astra import envsynth, plan, qa, tasks, validate  # noqa: F401  (mixing: used by rollout)
