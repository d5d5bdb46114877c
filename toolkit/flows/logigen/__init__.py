"""The logigen flow ("LOGIGEN: Logic-Driven Generation of Verifiable Agentic Tasks" (arXiv 2603.00540)).

Modules: analysis (trigger analysis, no registration), domain_check (the deterministic domain
check), architect (gen-plan --strategy logigen), gentask (gen-task: explorer, set_designer,
projection, llm_explorer), validate (validate-task).

Importing the package registers nothing: each command's module is its own entry point
(pyproject.toml, toolkit.registry.BUILTINS), so a command imports only its strategy's module.
"""
