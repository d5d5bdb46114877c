"""The command-line shell: the 12 JSONL commands and the `toolkit` utilities, a thin layer over the
library (toolkit.stages, toolkit.train, ...).

- `common.py`: the shared option decorators, the command wrapper, registry-driven choices and
  --help sections (what `--help` and parsing need);
- `run.py`: what runs a command: the config merge and --print-config, the stage runner;
- `commands.py`: the 12 commands and their console-script entry points (`gen_plan_main` ...);
- `utilities.py`: the `toolkit` group (the commands as subcommands, stats, schema, doctor, serve,
  tasks, plugins, domain check, tools import) and its entry point `main`.

The names below are the package's interface: `[project.scripts]` in pyproject.toml (`toolkit.cli:main`,
`toolkit.cli:gen_plan_main` ...), the bin/ shims (`getattr(cli, entry)()`) and tests use them. The
ones from `run.py` and `utilities.py` resolve on first use (`__getattr__`): a console script such as
`gen-task` imports this package, and its start-up should not pay for the `toolkit` group or the
stream machinery (bench/startup_bench.py)."""

import importlib
import os
from typing import Any

from toolkit.cli.commands import (
    COMMANDS,
    eval_tau2,
    eval_tau2_main,
    gen_plan,
    gen_plan_main,
    gen_task,
    gen_task_main,
    grpo,
    grpo_main,
    make_verifier,
    make_verifier_main,
    reflect,
    reflect_main,
    repair,
    repair_main,
    rollout,
    rollout_main,
    sft,
    sft_main,
    simulate_env,
    simulate_env_main,
    strategy_command,
    validate_task,
    validate_task_main,
    verify,
    verify_main,
)
from toolkit.cli.common import (
    RegistryChoice,
    RegistryHelp,
    config_options,
    io_options,
    llm_options,
    stage_command,
    train_io_options,
)

# pydantic's plugin loader reads the entry points of every installed distribution the first time a
# model is built: ~0.1 CPU-s of each command's start in a venv with torch and vLLM. The commands use
# no pydantic plugin; whoever wants one sets PYDANTIC_DISABLE_PLUGINS themselves (kept as given).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

_LAZY = {"FLAG_KEYS": "run", "merged_config": "run", "options_model": "run", "printable": "run",
         "run_stage": "run", "main": "utilities", "toolkit_group": "utilities"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"toolkit.cli.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'toolkit.cli' has no attribute {name!r}")

__all__ = [
    "COMMANDS",
    "FLAG_KEYS",
    "RegistryChoice",
    "RegistryHelp",
    "config_options",
    "eval_tau2",
    "eval_tau2_main",
    "gen_plan",
    "gen_plan_main",
    "gen_task",
    "gen_task_main",
    "grpo",
    "grpo_main",
    "io_options",
    "llm_options",
    "main",
    "make_verifier",
    "make_verifier_main",
    "merged_config",
    "options_model",
    "printable",
    "reflect",
    "reflect_main",
    "repair",
    "repair_main",
    "rollout",
    "rollout_main",
    "run_stage",
    "sft",
    "sft_main",
    "simulate_env",
    "simulate_env_main",
    "stage_command",
    "strategy_command",
    "toolkit_group",
    "train_io_options",
    "validate_task",
    "validate_task_main",
    "verify",
    "verify_main",
]
