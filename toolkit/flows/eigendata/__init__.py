"""The eigendata flow (EigenData / AReaL-SEA: "From Self-Evolving Synthetic Data to Verifiable-Reward RL: Post-Training Multi-turn Interactive Tool-Using Agents" (arXiv 2601.22607; EigenData is v1, AReaL-SEA v3)). Its modules
register its strategies (gen-task, validate-task, make-verifier, repair, gen-plan, reflect).

Importing the package registers nothing: each command's module is its own entry point
(pyproject.toml, toolkit.registry.BUILTINS), so a command imports only its strategy's module.
"""
