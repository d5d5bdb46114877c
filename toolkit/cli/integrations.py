"""`toolkit env`: the toolkit's environments for other trainers (toolkit/integrations,
docs/integrations.md): `env export` (a verifiers package, NeMo Gym rows) and `env serve` (OpenEnv)."""

from __future__ import annotations

import json
import sys

import click

from toolkit.cli.common import compose
from toolkit.cli.lazy import load
from toolkit.cli.run import apply_operator_options
from toolkit.io import UsageError, check_input, log


def operator_options(f):
    return compose(
        click.option("--sandbox-isolation", type=click.Choice(["namespaces", "docker", "none-unsafe"]), default=None,
                     help="Isolation for generated code (python environments); default namespaces."),
        click.option("--sandbox-limits", metavar="JSON", default=None,
                     help="Operator limits for generated code (a record may only narrow them)."),
        click.option("--mcp-servers", metavar="FILE", default=None,
                     help="The MCP servers records may name (env backend mcp); also TOOLKIT_MCP_SERVERS."),
    )(f)


def task_options(f):
    return compose(
        click.option("--tasks", "tasks", metavar="TASKS.jsonl", required=True,
                     help="Task records (toolkit.record/v1; .gz ok): env ref, task, ground truth."),
        click.option("--rejects", metavar="FILE", help="Append rejected task lines here (line, id, field, error)."),
        click.option("--strategy", "strategies", multiple=True, metavar="NAME",
                     help="verify strategy of the reward (repeatable; default state_diff)."),
    )(f)


def _read(tasks: str, rejects: str | None, strategies: tuple[str, ...]):
    core, scorer_names = load("integrations"), load("scorer-names")
    TaskFileError, read_tasks = core.TaskFileError, core.read_tasks
    unknown = [s for s in strategies if s not in scorer_names()]
    if unknown:
        raise click.UsageError(f"--strategy {', '.join(unknown)}: unknown; choose from {', '.join(scorer_names())}")
    try:
        check_input(tasks)
        return read_tasks(tasks, rejects=rejects, strategies=strategies)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
    except TaskFileError as e:
        log(f"env: {e}")
        sys.exit(1)


def _peer(module: str, extra: str = "integrations"):
    """Import a toolkit.integrations module whose peer may be missing: exit 1 naming it."""
    import importlib

    try:
        return importlib.import_module(f"toolkit.integrations.{module}")
    except ModuleNotFoundError as e:
        log(f"env: {module} needs the package {e.name!r} (bin/setup installs the `{extra}` extra; "
            "docs/integrations.md)")
        sys.exit(1)


@click.group("env", help="""The toolkit's environments in other trainers' environment APIs (docs/integrations.md).

\b
Every task record becomes a task of the framework; each episode runs against a fresh toolkit
environment (load_env: sqlite, python in the sandbox, mcp confined) and is rewarded by the
toolkit's verify (state_diff by default).""")
def env_group() -> None:
    pass


@env_group.command("export", help="""Export task records for another framework.

\b
--format verifiers: an installable verifiers 0.4 environment package in --out DIR (module --name
    with dashes as underscores); load it with the null harness and the subprocess runtime.
--format nemo-gym: NeMo Gym rows (BaseRunRequest, Responses-API tools) in --out FILE.jsonl.
Rejected task lines are reported with line and field (and appended to --rejects); exit 1 then.

\b
Example:
  toolkit tasks airline > airline.jsonl
  toolkit env export --format verifiers --tasks airline.jsonl --out airline-vf --name toolkit-airline
  pip install --no-deps ./airline-vf
  toolkit env export --format nemo-gym --tasks airline.jsonl --out airline.nemo.jsonl""")
@click.option("--format", "fmt", type=click.Choice(["verifiers", "nemo-gym"]), required=True)
@task_options
@click.option("--out", "out", metavar="PATH", required=True, help="verifiers: a new directory; nemo-gym: a JSONL file.")
@click.option("--name", default=None, help="verifiers: the environment id (default: the --out directory's name).")
@click.option("--agent-ref", default=None, help="nemo-gym: the responses_api_agents name each row routes to.")
@operator_options
def export_cmd(fmt: str, tasks: str, rejects: str | None, strategies: tuple[str, ...], out: str, name: str | None,
               agent_ref: str | None, sandbox_isolation, sandbox_limits, mcp_servers) -> None:
    import os

    apply_operator_options(sandbox_isolation, sandbox_limits, mcp_servers)
    strategies = strategies or ("state_diff",)
    records = _read(tasks, rejects, strategies)
    if fmt == "verifiers":
        export_package = load("verifiers-package")
        pkg_name = name or os.path.basename(os.path.abspath(out).rstrip("/"))
        try:
            path = export_package(records, out, pkg_name, strategies=strategies)
        except (FileExistsError, FileNotFoundError, ValueError) as e:
            raise click.UsageError(str(e)) from None
        log(f"env export: {len(records)} task(s) → {path} (verifiers environment {pkg_name!r}; "
            f"pip install --no-deps {path})")
    else:
        rows = load("nemo-gym-rows")
        n = 0
        with open(out, "w", encoding="utf-8") as f:
            for row in rows(records, agent_ref=agent_ref):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
        log(f"env export: {n} NeMo Gym row(s) → {out}")
    sys.exit(1 if records.rejected else 0)


@env_group.command("serve", help="""Serve task records as an environment of another framework.

\b
--format openenv: an OpenEnv (openenv-core 0.3) server: /health, /ws sessions (reset(task_id=ID),
    list_tools / call_tool actions, a `done` tool that ends the episode with the verify reward;
    other steps reward 0). Prints its URL on stdout once listening; runs until interrupted.

\b
Example:
  toolkit env serve --format openenv --tasks airline.jsonl --host 127.0.0.1 --port 8011
  python -c 'from openenv import GenericEnvClient; ...'   # docs/integrations.md""")
@click.option("--format", "fmt", type=click.Choice(["openenv"]), required=True)
@task_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: a free port.")
@click.option("--max-sessions", type=click.IntRange(min=1), default=16, show_default=True,
              help="Concurrent /ws sessions (one environment each).")
@operator_options
def serve_cmd(fmt: str, tasks: str, rejects: str | None, strategies: tuple[str, ...], host: str, port: int,
              max_sessions: int, sandbox_isolation, sandbox_limits, mcp_servers) -> None:
    apply_operator_options(sandbox_isolation, sandbox_limits, mcp_servers)
    strategies = strategies or ("state_diff",)
    records = _read(tasks, rejects, strategies)
    oe = _peer("openenv")

    def ready(url: str) -> None:
        log(f"env serve: {len(records)} task(s) as an OpenEnv environment on {url} (/ws, /health)")
        click.echo(url)
        sys.stdout.flush()

    try:
        oe.serve(records, host=host, port=port, strategies=strategies, max_sessions=max_sessions, ready=ready)
    except OSError as e:
        log(f"env serve: {e}")
        sys.exit(1)
