"""Per-stage yield / cost table of a pipeline run (any flow).

Every streaming command appends its summary as one JSON line to the file named by
$TOOLKIT_STAGE_LOG (toolkit.io): command, records read / written / rejected / filtered, reject
reasons (by field or message shape), filter reasons (the failing verdict), fallbacks taken (context
compaction, a rule instead of an LLM ...: the `fallbacks` column, each reason in `reasons`), warnings
(replies cut at max_tokens ...), seconds and, when the
command used an LLM, requests, cache hits, prompt/completion tokens and cost. A recipe sets the
variable, runs its stages, then renders the table:

    export TOOLKIT_STAGE_LOG=out/run/stages.jsonl
    gen-task ... | validate-task --filter passed | rollout ... | verify --filter passed > out.jsonl
    python -m toolkit.yieldtable out/run/stages.jsonl [--json out/run/yield.json] [--markdown]

A stage run with $TOOLKIT_STAGE_LABEL set is shown under that label instead of its command name
(`verify f1 (replay)`); with $TOOLKIT_STAGE_GROUP set (a pilot iteration, a repair round) the table
gets a `group` column. `pass` is the pass rate of the verdicts that the stage itself added to the
records it wrote (validate-task, verify, make-verifier). A flow adds its own per-stage counts (Simia:
rows dropped per rule, grounding share) with `add_notes(rows, {label: {key: value}})`; they show in a
`notes` column.

A run whose final dataset is empty must fail, naming the stage that emptied it (the first stage that
read records and wrote none, with its reasons): `python -m toolkit.yieldtable LOG --require-nonempty
DATASET` exits 1 then (the recipes end with it).

Library: `load(path) -> list[dict]`, `rows(summaries) -> list[dict]`, `add_notes(rows, notes)`,
`render(rows, markdown=False)`, `emptied_by(summaries) -> row | None`, `check_nonempty(dataset, summaries)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from toolkit.io import parse_jsonl

COLUMNS = ("stage", "in", "out", "yield", "rejected", "filtered", "fallbacks", "pass", "llm_requests", "tokens", "cost",
           "seconds", "reasons")


def load(path: str | Path) -> list[dict]:
    return parse_jsonl(Path(path).read_text(encoding="utf-8"), str(path))


def rows(summaries: list[dict]) -> list[dict]:
    """One row per stage run, in order, plus a total row (for a grouped log, whose stages loop, the
    total counts only rejects, filtered records, requests, tokens, cost and time)."""
    out = []
    grouped = any(s.get("group") is not None for s in summaries)
    for s in summaries:
        llm = s.get("llm") or {}
        fallbacks = s.get("fallback_reasons") or {}
        reasons = {**{f"reject: {k}": v for k, v in (s.get("reject_reasons") or {}).items()},
                   **{f"filter: {k}": v for k, v in (s.get("drop_reasons") or {}).items()},
                   **{f"fallback: {k}": v for k, v in fallbacks.items()},
                   **{f"warning: {k}": v for k, v in (s.get("warning_reasons") or {}).items()}}
        read, written = int(s.get("read", 0)), int(s.get("written", 0))
        ver = s.get("verdicts") or {}
        row = {"stage": s.get("label") or s.get("command", "?"), "in": read, "out": written,
               "yield": round(written / read, 3) if read else None,
               "rejected": int(s.get("rejected", 0)), "filtered": int(s.get("dropped", 0)),
               "fallbacks": sum(int(v) for v in fallbacks.values()),
               "pass": round(ver["passed"] / ver["total"], 3) if ver.get("total") else None,
               "llm_requests": int(llm.get("requests", 0) or 0),
               "tokens": int(llm.get("prompt_tokens", 0) or 0) + int(llm.get("completion_tokens", 0) or 0),
               "cost": round(float(llm.get("cost", 0.0) or 0.0), 6),
               "seconds": round(float(s.get("seconds", 0.0) or 0.0), 2), "reasons": reasons}
        out.append({"group": str(s.get("group", "")), **row} if grouped else row)
    if out:
        total = {"stage": "total", "in": out[0]["in"], "out": out[-1]["out"],
                 "yield": round(out[-1]["out"] / out[0]["in"], 3) if out[0]["in"] else None,
                 "rejected": sum(r["rejected"] for r in out), "filtered": sum(r["filtered"] for r in out),
                 "fallbacks": sum(r["fallbacks"] for r in out), "pass": None, "llm_requests": sum(r["llm_requests"] for r in out),
                 "tokens": sum(r["tokens"] for r in out), "cost": round(sum(r["cost"] for r in out), 6),
                 "seconds": round(sum(r["seconds"] for r in out), 2), "reasons": {}}
        if grouped:
            total = {"group": "", **total, "in": None, "out": None, "yield": None}
        out.append(total)
    return out


def add_notes(table: list[dict], notes: dict[str, dict]) -> list[dict]:
    """Attach a flow's own counts to the rows of the named stages (label or command; the first row
    of that name): `notes={"repair": {"dropped: unknown_tool": 1}}`. A stage that did not run gets no
    row. Returns the table."""
    for stage, extra in notes.items():
        row = next((r for r in table if r["stage"] == stage), None)
        if row is not None and extra:
            row["notes"] = {**row.get("notes", {}), **extra}
    return table


def columns(table: list[dict]) -> list[str]:
    cols = list(COLUMNS)
    if any("group" in r for r in table):
        cols.insert(0, "group")
    if any(r.get("notes") for r in table):
        cols.append("notes")
    return cols


def _cell(r: dict, c: str) -> str:
    v = r.get(c)
    if c == "reasons":
        return "; ".join(f"{k} x{n}" for k, n in sorted(v.items(), key=lambda kv: -kv[1])) or "-"
    if c == "notes":
        return "; ".join(f"{k}: {n}" for k, n in (v or {}).items()) or "-"
    if v is None or v == "":
        return "-"
    return f"{v:.4f}" if c == "cost" else str(v)


def render(table: list[dict], markdown: bool = False) -> str:
    cols = columns(table)
    cells = [[_cell(r, c) for c in cols] for r in table]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines) + "\n"
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    widths[-1] = len(cols[-1])  # the last column (reasons / notes) is left ragged
    fmt = lambda row: "  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cols), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells]) + "\n"


def emptied_by(summaries: list[dict]) -> dict | None:
    """The row of the first stage that read records and wrote none (None: no such stage)."""
    for r in rows(summaries):
        if r["stage"] != "total" and (r["in"] or 0) > 0 and r["out"] == 0:
            return r
    return None


def count_records(path: str | Path) -> int:
    """Non-blank lines of a JSONL file (.gz ok); 0 when it does not exist."""
    p = Path(path)
    if not p.exists():
        return 0
    import gzip

    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _where(r: dict) -> str:
    return f"stage {r['stage']!r}" + (f" (group {r['group']})" if r.get("group") else "")


def check_nonempty(dataset: str | Path, summaries: list[dict]) -> str | None:
    """None when `dataset` holds records; else the message naming the stage that emptied the run: the
    first that read records and wrote none (with its reasons), or the step between a stage that wrote
    records and one that read none, or the step after the last logged stage."""
    if count_records(dataset) > 0:
        return None
    table = [r for r in rows(summaries) if r["stage"] != "total"]
    prev = None
    for r in table:
        if (r["in"] or 0) > 0 and r["out"] == 0:
            why = "; ".join(f"{k} x{n}" for k, n in sorted(r["reasons"].items(), key=lambda kv: -kv[1])[:5])
            return (f"{dataset} is empty: {_where(r)} emptied the run (read {r['in']}, wrote 0, rejected "
                    f"{r['rejected']}, filtered {r['filtered']}" + (f"; {why}" if why else "") + ")")
        if not r["in"]:
            if prev is None:
                return f"{dataset} is empty: the first {_where(r)} read no records"
            if prev["out"]:
                return (f"{dataset} is empty: the step between {_where(prev)} (wrote {prev['out']}) and "
                        f"{_where(r)} (read 0) emptied the run")
        prev = r
    if prev is None:
        return f"{dataset} is empty and no stage logged a summary"
    return (f"{dataset} is empty: the step after the last logged {_where(prev)} (wrote {prev['out']}) "
            f"emptied the run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolkit.yieldtable", description=__doc__.splitlines()[0])
    ap.add_argument("log", help="stage log written through $TOOLKIT_STAGE_LOG")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--markdown", action="store_true", help="markdown table")
    ap.add_argument("--require-nonempty", metavar="DATASET",
                    help="exit 1 when DATASET has no records, naming the stage that emptied the run")
    a = ap.parse_args(argv)
    try:
        table = rows(load(a.log))
    except (OSError, ValueError) as e:
        sys.stderr.write(f"yieldtable: {e}\n")
        return 2
    if not table:
        sys.stderr.write(f"yieldtable: {a.log} holds no stage summaries\n")
        if a.require_nonempty and count_records(a.require_nonempty) == 0:
            sys.stderr.write(f"yieldtable: {a.require_nonempty} is empty and no stage logged a summary\n")
        return 1
    sys.stdout.write(render(table, markdown=a.markdown))
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    if a.require_nonempty:
        msg = check_nonempty(a.require_nonempty, load(a.log))
        if msg:
            sys.stderr.write(f"yieldtable: {msg}\n")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
