"""What every command declares: option decorators (defined once), the command wrapper, registry-driven
choices and --help sections, and the console-script wrapper. This is all a command's `--help` and
its parsing load (click and the registry's manifest); what runs a command (the config merge and its
--print-config, the stage runner: `run.py`) is imported when the command runs. The commands are in
`commands.py`, the `toolkit` utilities in `utilities.py`."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from typing import Any

import click

from toolkit import registry
from toolkit.cli.lazy import load

# ----------------------------------------------------------------------------------------------
# shared options (defined once)


def compose(*decorators: Callable) -> Callable:
    def deco(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f
    return deco


def io_options(f: Callable) -> Callable:
    return compose(
        click.option("-i", "--input", "input", metavar="FILE", help="Input JSONL (.gz ok). Default: stdin."),
        click.option("-o", "--output", "output", metavar="FILE", help="Output JSONL (.gz ok). Default: stdout."),
        click.option("--rejects", metavar="FILE", help="Append rejected lines here (with line, id, field, error)."),
        click.option("--resume", is_flag=True, help="Skip ids already in --output and append (rerun after a kill)."),
        click.option("--shard", metavar="I/N", help="Process only the stable hash partition I of N (job arrays)."),
        click.option("--limit", type=int, metavar="N", help="Process at most N records."),
        click.option("--unordered", is_flag=True, help="Emit records as they complete instead of input order."),
        click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when a TTY)."),
        click.option("--heartbeat", type=click.FloatRange(min=0), metavar="SECONDS", default=None,
                     help="When progress is off (stderr not a TTY): one stderr line every SECONDS with records "
                          "done, in flight and LLM requests waiting (default 30; 0 = none; env TOOLKIT_HEARTBEAT)."),
        click.option("--concurrency", type=int, show_default=True, help="Records processed at once."),
        click.option("--max-line-bytes", type=click.IntRange(min=1), show_default=True,
                     help="Longer input lines are rejected without being read into memory."),
    )(f)


def config_options(f: Callable) -> Callable:
    return compose(
        click.option("--recipe", metavar="YAML", help="Recipe file; its `defaults:` and `<command>:` sections apply."),
        click.option("--print-config", is_flag=True, help="Print the merged config (YAML) and exit."),
        click.option("--sandbox-isolation", type=click.Choice(["namespaces", "docker", "none-unsafe"]),
                     default=None, help="Isolation for generated code (default namespaces; it never "
                     "downgrades on its own). none-unsafe runs it WITHOUT kernel isolation."),
        click.option("--sandbox-limits", metavar="JSON", default=None,
                     help='Operator limits for generated code, e.g. \'{"memory_mb": 1024, "wall_seconds": 20}\' '
                     "(keys cpu_seconds, wall_seconds, memory_mb, file_size_mb, max_processes, network); "
                     "a record may only narrow them."),
        click.option("--mcp-servers", metavar="FILE", default=None,
                     help='MCP servers records may name (env backend mcp): an {"mcpServers": {id: {command, args, '
                     'env, state_command, state_excludes, limits} | {url}}} JSON file (also TOOLKIT_MCP_SERVERS).'),
    )(f)


def llm_options(role: str | None = None, label: str = "LLM") -> Callable:
    """--model/--base-url/... (or --agent-model/--agent-base-url/... for a role)."""
    p = f"{role}-" if role else ""
    opts = [
        click.option(f"--{p}model", help=f"{label} model name (default: the embedded CPU model)."),
        click.option(f"--{p}base-url", help=f"{label} OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 "
                                            "(default: start/reuse the embedded server)."),
        click.option(f"--{p}temperature", type=float, help=f"{label} sampling temperature."),
    ]
    if role is None:
        opts += [
            click.option("--seed", type=int, help="Sampling seed passed to every model call."),
            click.option("--max-tokens", type=int, help="Max completion tokens per call."),
            click.option("--cache", metavar="SQLITE", help="Request cache file: identical calls are answered from it."),
            click.option("--tool-protocol", type=click.Choice(["auto", "native", "hermes"]),
                         help="How tools reach the model: native tool_calls or Hermes <tool_call> text."),
            click.option("--constrain-tool-calls", type=click.Choice(["off", "grammar", "json_schema", "strict"]),
                         default=None, help="Constrained decoding of tool calls: a call always names an offered "
                         "tool (grammar/json_schema: llama.cpp, vLLM; strict: native strict tools). Default off."),
            click.option("--llm-timeout", "timeout", type=float, help="Seconds per LLM request."),
            click.option("--max-retries", type=int, help="Retries on 429/5xx/timeouts (exponential backoff)."),
            click.option("--context-tokens", type=click.IntRange(min=1), default=None,
                         help="The model's context size in tokens (default: asked of the server; prompts "
                              "are compacted/truncated to fit, or rejected with a reason)."),
        ]
    return compose(*opts)


def train_io_options(f: Callable) -> Callable:
    return compose(
        click.option("-i", "--input", "input", metavar="FILE", help="Input records JSONL (.gz ok). Default: stdin."),
        click.option("--rejects", metavar="FILE", help="Append rejected input lines here."),
        click.option("--shard", metavar="I/N", help="Read only the stable hash partition I of N."),
        click.option("--limit", type=int, metavar="N", help="Read at most N records."),
        click.option("--progress/--no-progress", default=None, help="Progress on stderr (default: when a TTY)."),
        click.option("--model", metavar="PATH|NAME", help="Local HF checkpoint directory (model + tokenizer) to train, or a known model name (smollm2-135m-instruct: materialized once, see `toolkit models`)."),
        click.option("--output-dir", metavar="DIR", help="Checkpoints, final model, metrics.jsonl, run.json."),
        click.option("--chat-template", metavar="model|toolkit|FILE", default=None,
                     help="Chat template: the model's (default), the toolkit's Hermes template, or a Jinja file."),
        click.option("--resume-from-checkpoint", metavar="DIR|auto", default=None,
                     help="Resume training from a checkpoint directory (auto = the newest in --output-dir)."),
        click.option("--max-steps", type=int, default=None, help="Stop after N optimizer steps (TRL max_steps)."),
        click.option("--learning-rate", type=float, default=None, help="Learning rate (recipe: learning_rate)."),
        click.option("--seed", type=int, default=None, help="Training seed."),
        click.option("--tool-schema", type=click.Choice(["full", "compact", "minimal"]), default=None,
                     help="Tool schemas in the prompt: as offered (default), compact (short descriptions) or "
                          "minimal (names, parameter types/enums, required; no descriptions)."),
        click.option("--system-prompt", type=click.Choice(["keep", "drop"]), default=None,
                     help="Keep the system prompt (domain policy; default) or drop it."),
    )(f)


# ----------------------------------------------------------------------------------------------
# running a command


def stage_command(fn: Callable[[Any], int]) -> Callable:
    """Wrap a command body `fn(opts) -> exit code` (opts: the typed options, toolkit.options):
    config merge, --print-config, error → exit code (toolkit.cli.run.invoke)."""

    @click.pass_context
    @functools.wraps(fn)
    def wrapper(ctx: click.Context, **_: Any) -> None:
        # the execution layer (config, streams, stages) loads when a command runs, not for --help
        load("run").invoke(ctx, fn)

    return wrapper


# ----------------------------------------------------------------------------------------------
# choices and --help sections read from the registry (toolkit.registry)


class RegistryChoice(click.Choice):
    """A choice whose values are whatever the registry holds for a kind (read when first needed)."""

    def __init__(self, kind: str, scope: str | None = None):
        self.kind, self.scope = kind, scope
        super().__init__([], case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self):
        return registry.names(self.kind, self.scope)

    @choices.setter
    def choices(self, value):  # click assigns in __init__
        pass


class RegistryHelp(click.Command):
    """A command whose --help ends with one section per registry kind it takes a choice from:
    `name (flow: x) — help` per entry."""

    def __init__(self, *args: Any, sections: tuple = (), **kw: Any):
        self.sections = sections  # ((title, kind, scope), ...)
        self.defaults: Callable[[], dict] | None = None  # {parameter: default}, set by commands.py
        self._bound = False
        super().__init__(*args, **kw)

    def bind_defaults(self) -> None:
        """Give each option the default `self.defaults()` names (shown by --help), once, before the
        first parse: the defaults live in the options models only, and a flag not given never
        reaches the config merge, so the model's default applies either way."""
        if self._bound or self.defaults is None:
            return
        self._bound = True
        given = self.defaults()
        for p in self.params:
            if p.name in given:
                v = given[p.name]
                p.default = tuple(v) if getattr(p, "multiple", False) else v
                if isinstance(p, click.Option):
                    p.show_default = True

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        self.bind_defaults()
        return super().parse_args(ctx, args)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, kind, scope in self.sections:
            with formatter.section(title):
                formatter.write_text("\b\n" + registry.describe(kind, scope))
        super().format_epilog(ctx, formatter)


class StrategyChoice(RegistryChoice):
    """--strategy whose choices are the command's registered strategies."""

    def __init__(self, command: str):
        self.command = command
        super().__init__("strategies", command)


# ----------------------------------------------------------------------------------------------
# a command: registry --help sections + the standard epilog

EPILOG = "Reads JSONL records (toolkit.record/v1) on stdin or --input; writes JSONL on stdout or --output."


def cli_command(name: str, help: str, sections: tuple = ()) -> Callable:
    return click.command(name, cls=RegistryHelp, sections=sections, help=help, epilog=EPILOG,
                         context_settings={"max_content_width": 110})


# ----------------------------------------------------------------------------------------------
# console-script entry points


def entry_point(cmd: click.Command) -> Callable[[], None]:
    def main() -> None:
        if hasattr(signal, "SIGPIPE"):
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends quietly
        cmd.main(prog_name=cmd.name)

    return main

