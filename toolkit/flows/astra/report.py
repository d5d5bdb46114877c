"""Per-stage yield / cost table for the ASTRA recipes (recipes/astra.sh).

Uses `toolkit.yieldtable` over $TOOLKIT_STAGE_LOG when that module and log exist (they count
rejects, filtered records and every LLM call); otherwise this minimal table, built from the files
each stage read and wrote: in / out / yield / rejected lines, and the tokens and cost that the
surviving records' provenance entries of that command carry (filtered records' cost is not seen).

    python -m toolkit.flows.astra.report STAGE_LOG NAME:IN:OUT:REJECTS ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _lines(p: str) -> list[str]:
    path = Path(p)
    if not p or not path.is_file():
        return []
    return [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def minimal_rows(stages: list[tuple[str, str, str, str]]) -> list[dict]:
    rows = []
    for name, inp, out, rej in stages:
        n_in, outs, n_rej = len(_lines(inp)), _lines(out), len(_lines(rej))
        tok = cost = 0.0
        cmd = name.split(" ")[0]
        for line in outs:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            prov = [p for p in rec.get("provenance") or [] if p.get("command") == cmd]
            if prov:
                p = prov[-1]
                tok += (p.get("prompt_tokens") or 0) + (p.get("completion_tokens") or 0)
                cost += p.get("cost") or 0.0
        why: dict[str, int] = {}
        for line in _lines(rej):
            try:
                err = str(json.loads(line).get("error") or "?")
            except json.JSONDecodeError:
                err = "?"
            key = err.split(": attempt 1")[0].split(" (")[0][:60]
            why[key] = why.get(key, 0) + 1
        rows.append({"stage": name, "in": n_in, "out": len(outs),
                     "yield": round(len(outs) / n_in, 3) if n_in else None, "rejected": n_rej,
                     "tokens(kept)": int(tok), "cost(kept)": round(cost, 6),
                     "reject reasons": "; ".join(f"{k} x{v}" for k, v in sorted(why.items(), key=lambda kv: -kv[1]))
                     or None})
    return rows


def render(rows: list[dict]) -> str:
    if not rows:
        return "(no stages)\n"
    cols = list(rows[0])
    cells = [[("-" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    w = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    fmt = lambda xs: "  ".join(x.ljust(n) for x, n in zip(xs, w)).rstrip()  # noqa: E731
    return "\n".join([fmt(cols), fmt(["-" * n for n in w])] + [fmt(x) for x in cells]) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(__doc__ or "")
        return 2
    log, specs = args[0], args[1:]
    try:
        from toolkit import yieldtable  # type: ignore[attr-defined]

        if Path(log).is_file() and _lines(log):
            sys.stdout.write(yieldtable.render(yieldtable.rows(yieldtable.load(log))))
            return 0
    except ImportError:
        pass
    stages = []
    for s in specs:
        parts = s.split(":")
        if len(parts) != 4:
            sys.stderr.write(f"report: expected NAME:IN:OUT:REJECTS, got {s!r}\n")
            return 2
        stages.append(tuple(parts))
    sys.stdout.write(render(minimal_rows(stages)))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
