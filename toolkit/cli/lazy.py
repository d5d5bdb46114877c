"""What a command runs, loaded when it runs: one import-string table (click's lazy-loading pattern).

Importing the CLI, as every console script and `--help` does, loads click, the option decorators
and the registry manifest only (bench/startup_bench.py: every `--help` <= 0.25 CPU-s). A command's
body asks `load(key)` for its implementation (its stage, the config merge, a library module): the
module is imported then, once, and the table below is the one place that says which modules a
command may load that way. `tests/test_cli.py` imports every entry and checks that `--help` loads
none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

# key -> "module" or "module:attribute"
IMPLEMENTATIONS: dict[str, str] = {
    # the run path: the config merge, --print-config, run_stage (toolkit.cli.run)
    "run": "toolkit.cli.run",
    "options": "toolkit.options",
    # the streaming commands' stages
    "simulate-env": "toolkit.stages.simulate_env:SimulateEnv",
    "verify": "toolkit.stages.verify:Verify",
    "rollout": "toolkit.stages.rollout:Rollout",
    "eval-tau2": "toolkit.stages.eval_tau2:main",
    "strategy-stages": "toolkit.stages.strategies:STAGES",
    "strategies": "toolkit.stages.strategies",
    "scorer-names": "toolkit.scorers:scorer_names",
    "sft": "toolkit.train.sft:main",
    "grpo": "toolkit.train.grpo:main",
    # `toolkit ...` utilities
    "models": "toolkit.llm.models",
    "embedded": "toolkit.llm.embedded",
    "serve-hf": "toolkit.llm.serve_hf",
    "stats": "toolkit.stats",
    "quality": "toolkit.quality",
    "doctor": "toolkit.doctor:report",
    "ray-shard": "toolkit.cluster.ray_shard",
    "domains": "toolkit.domains",
    "bfcl": "toolkit.bfcl",
    "sandbox": "toolkit.sandbox",
    "mcp-servers": "toolkit.envs.mcp.servers",
    "domain-check": "toolkit.flows.logigen.domain_check",
    "tooldocs": "toolkit.flows.astra.tooldocs",
    "mcp-import": "toolkit.cli.mcp_import",
    # `toolkit env export|serve` (toolkit.cli.integrations)
    "integrations": "toolkit.integrations.core",
    "verifiers-package": "toolkit.integrations.verifiers_package:export_package",
    "nemo-gym-rows": "toolkit.integrations.nemo_gym:rows",
}


def load(key: str) -> Any:
    """The module (or its attribute) that `IMPLEMENTATIONS[key]` names, imported on first use."""
    module, _, attr = IMPLEMENTATIONS[key].partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod
