"""Yield / cost table of an eigendata run directory (minimal; a generic yield-table module may
replace it).

Layout written by recipes/eigendata.sh: `<run>/it<k>/<stage>.jsonl` (the stage's output) and
`<run>/it<k>/<stage>.rejects.jsonl`, for the stages in STAGES order; the Validate <-> Modify rounds
in `<run>/it<k>/repair<r>/` (rows labelled `<k>.r<r>`). Per iteration and stage: records
in (`<stage>.in.jsonl` when the recipe saved one, else the previous stage's output, or the plans
for gen-task), out, rejected, verdict pass rate of
that stage (validate-task, verify, make-verifier), LLM requests / tokens / cost from the stage's
summary line in `<stage>.log` (every request, rejected lines included), else prompt/completion
tokens and cost from the output records' provenance entries of that command.

    python -m toolkit.flows.eigendata.yield_table RUN_DIR [--json]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

STAGES = (("gen-task", "gen-task"), ("validate-task", "validate-task"), ("validated", None), ("rollout", "rollout"),
          ("verify", "verify"), ("repair", "repair"), ("make-verifier", "make-verifier"), ("reflect", "reflect"))


def _read(p: Path) -> list[dict]:
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


_SUMMARY = re.compile(r"llm requests (\d+) \(cache hits (\d+)\), tokens (\d+), cost \$([0-9.]+)")


def summary_usage(log: Path, command: str) -> dict | None:
    """requests / tokens / cost from the stage's own summary line (counts rejected lines too)."""
    if not log.is_file():
        return None
    hit = None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(f"{command}: read "):
            m = _SUMMARY.search(line)
            if m:
                hit = {"requests": int(m.group(1)), "tokens": int(m.group(3)), "cost": float(m.group(4))}
    return hit


def stage_row(recs: list[dict], rejects: list[dict], command: str | None, n_in: int | None) -> dict:
    tok_p = tok_c = 0
    cost = 0.0
    passed = total = 0
    for r in recs:
        for pv in r.get("provenance") or []:
            if command and pv.get("command") == command:
                tok_p += int(pv.get("prompt_tokens") or 0)
                tok_c += int(pv.get("completion_tokens") or 0)
                cost += float(pv.get("cost") or 0.0)
        for v in r.get("verdicts") or []:
            if command and v.get("stage") == command:
                total += 1
                passed += 1 if v.get("passed") else 0
    return {"in": n_in, "out": len(recs), "rejected": len(rejects),
            "pass_rate": round(passed / total, 3) if total else None,
            "prompt_tokens": tok_p, "completion_tokens": tok_c, "cost": round(cost, 6)}


def _rows(folder: Path, label: str, prev: int | None) -> list[dict]:
    rows = []
    for name, command in STAGES:
        f = folder / f"{name}.jsonl"
        if not f.is_file():
            continue
        recs = _read(f)
        fin = folder / f"{name}.in.jsonl"  # a branching stage's own input (repair, make-verifier, reflect)
        n_in = len(_read(fin)) if fin.is_file() else prev
        row = stage_row(recs, _read(folder / f"{name}.rejects.jsonl"), command, n_in)
        su = summary_usage(folder / f"{name}.log", command) if command else None
        if su is not None:  # the meter saw every request, rejected lines included
            row.update(requests=su["requests"], tokens=su["tokens"], cost=su["cost"])
        rows.append(dict(iteration=label, stage=name, **row))
        prev = len(recs)
    return rows


def table(run: str | Path) -> list[dict]:
    run = Path(run)
    rows = []
    for it in sorted((p for p in run.glob("it*") if p.is_dir()), key=lambda p: int(p.name[2:] or 0)):
        k = int(it.name[2:])
        main = _rows(it, str(k), len(_read(run / f"plans.{it.name}.in.jsonl")) or None)
        # the Validate <-> Modify rounds (it<k>/repair<r>/) come right after the iteration's repair row
        subs = []
        for sub in sorted((p for p in it.glob("repair*") if p.is_dir()), key=lambda p: int(p.name[6:] or 0)):
            subs += _rows(sub, f"{k}.r{sub.name[6:]}", None)
        at = next((i + 1 for i, r in enumerate(main) if r["stage"] == "repair"), len(main))
        rows += main[:at] + subs + main[at:]
    return rows


def _tokens(r: dict) -> str:
    if "tokens" in r:
        return str(r["tokens"])
    return f"{r['prompt_tokens']}/{r['completion_tokens']}"


def render(rows: list[dict]) -> str:
    head = ["iter", "stage", "in", "out", "rejected", "yield", "pass", "requests", "tokens", "cost"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        y = f"{r['out'] / r['in']:.0%}" if r["in"] else "-"
        pr = "-" if r["pass_rate"] is None else f"{r['pass_rate']:.0%}"
        lines.append(f"| {r['iteration']} | {r['stage']} | {r['in'] if r['in'] is not None else '-'} | {r['out']} | "
                     f"{r['rejected']} | {y} | {pr} | {r.get('requests', '-')} | {_tokens(r)} | {r['cost']:.4f} |")
    tot_c = sum(r["cost"] for r in rows)
    tot_t = sum(r["tokens"] if "tokens" in r else r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    lines.append(f"\ntotal: {tot_t} tokens, cost {tot_c:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = table(argv[0])
    if "--json" in argv:
        for r in rows:
            print(json.dumps(r))
    else:
        print(render(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
