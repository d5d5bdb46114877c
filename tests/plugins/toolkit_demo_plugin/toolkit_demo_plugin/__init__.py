"""Demo toolkit plugin: a counter environment, a gen-task strategy writing counter tasks, a scorer
and an export format. Each module registers on import; pyproject.toml lists them as entry points."""
