"""What runs a command: the config merge (model defaults < recipe < TOOLKIT_<KEY> env < flags) and
its --print-config, operator options, the stage runner. `common.stage_command` calls `invoke` when
a command runs; command bodies (commands.py) take `run_stage` and `log` from here, as they load
their stage, when they run (`toolkit.cli.lazy`): `--help` never loads this layer (bench/startup_bench.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from toolkit import config as C
from toolkit import registry
from toolkit.cli.lazy import load
from toolkit.io import IOOptions, RecordStream, UsageError, log
from toolkit.options import COMMAND_MODELS, FLAG_KEYS, STRATEGY_COMMANDS, model_for

__all__ = ["FLAG_KEYS", "all_option_keys", "apply_operator_options", "invoke", "log", "merged_config", "options_model",
           "printable", "run_stage"]


def _flags_given(ctx: click.Context) -> dict:
    out = {}
    for name, value in ctx.params.items():
        src = ctx.get_parameter_source(name)
        if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP"):
            out[FLAG_KEYS.get(name, name)] = value
    return out


def options_model(command: str) -> type:
    """The typed options model of a command (toolkit.options), with its strategies' keys."""
    if command in STRATEGY_COMMANDS:
        return load("strategies").options_model(command)
    return model_for(command)


@functools.lru_cache(maxsize=1)
def all_option_keys() -> frozenset:
    """Every key some command knows (recipe `defaults:` keys and TOOLKIT_* env vars are checked
    against it)."""
    return frozenset(k for c in COMMAND_MODELS for k in options_model(c).model_fields)


def _chosen_strategy_model(ctx: click.Context, command: str) -> type | None:
    """The command's model with only the keys of the strategy named by `--strategy` on the command
    line (its module alone is imported, through the registry manifest), or None."""
    name = ctx.params.get("strategy")
    src = ctx.get_parameter_source("strategy")
    if command not in STRATEGY_COMMANDS or not isinstance(name, str) or src is None or src.name != "COMMANDLINE":
        return None
    e = registry.lookup("strategies", name, command)
    if e is None:
        return None
    return model_for(command, (e.options,) if e.options is not None else ())


def merged_config(ctx: click.Context) -> Any:
    """The command's typed options: model defaults < recipe < TOOLKIT_<KEY> env < flags.

    A strategy command run with `--strategy NAME` validates first against the command's keys plus
    that strategy's (importing no other flow); when that fails (a recipe or variable sets another
    strategy's key, a bad value) or the strategy comes from elsewhere, against the model with every
    registered strategy's keys, as before: the options that reach the strategy are the same (other
    strategies' keys are unset either way), and so are the errors."""
    command = ctx.command.name
    path = ctx.params.get("recipe")
    recipe = C.load_recipe(path)
    flags = _flags_given(ctx)
    opts = None
    narrow = None if ctx.params.get("print_config") else _chosen_strategy_model(ctx, command)
    if narrow is not None:
        notes: list[str] = []  # said once: after this attempt succeeds, or by the one below
        try:
            opts = C.resolve(command, narrow, recipe, flags, known_anywhere=all_option_keys, recipe_path=path,
                             warn=notes.append)
        except C.ConfigError:
            opts = None
        else:
            for n in notes:
                log(n)
    if opts is None:
        opts = C.resolve(command, options_model(command), recipe, flags,
                         known_anywhere=all_option_keys, recipe_path=path, warn=log)
    opts.recipe_hash = C.recipe_hash(path)
    if command in STRATEGY_COMMANDS:
        opts = load("strategies").with_strategy_defaults(command, opts)
    return opts


def printable(opts: Any) -> dict:
    """--print-config: every key of the command (None included) and the strategy / role keys that
    are set (the unset role-prefixed LLM keys would only repeat null dozens of times)."""
    own = COMMAND_MODELS[type(opts).command].model_fields
    return {k: v for k, v in opts.model_dump(mode="json").items() if v is not None or k in own}


def apply_operator_options(sandbox_isolation: Any = None, sandbox_limits: Any = None, mcp_servers: Any = None) -> None:
    """--sandbox-isolation / --sandbox-limits / --mcp-servers (config_options): set for this
    process; a bad value is a usage error naming the key."""
    if sandbox_isolation:
        try:
            load("sandbox").set_default_isolation(str(sandbox_isolation))
        except ValueError as e:
            raise click.UsageError(f"sandbox_isolation: {e}") from None
    if sandbox_limits is not None:
        try:
            load("sandbox").set_operator_limits(sandbox_limits)
        except ValueError as e:
            raise click.UsageError(f"sandbox_limits: {e}") from None
    if mcp_servers is not None:
        servers = load("mcp-servers")
        try:
            servers.set_servers(mcp_servers)
        except servers.McpConfigError as e:
            raise click.UsageError(f"mcp_servers: {e}") from None


def invoke(ctx: click.Context, fn: Callable[[Any], int]) -> None:
    """Run a command body `fn(opts) -> exit code` (common.stage_command): config merge,
    --print-config, operator options, error → exit code."""
    try:
        opts = merged_config(ctx)
    except (C.ConfigError, UsageError) as e:
        raise click.UsageError(str(e)) from None
    if opts.print_config:
        click.echo(C.dump(printable(opts)), nl=False)
        ctx.exit(0)
    apply_operator_options(opts.sandbox_isolation, opts.sandbox_limits, opts.mcp_servers)
    try:
        code = fn(opts)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
    ctx.exit(code or 0)


def run_stage(command: str, opts: Any, stage: Any) -> int:
    """Standard streaming command: run the stage object over the stream; the exit code."""
    stream = RecordStream(opts if isinstance(opts, IOOptions) else IOOptions.for_reading(opts), command,
                          meter=stage.meter)
    stream.run_stage(stage, concurrency=opts.concurrency)
    return stream.exit_code()
