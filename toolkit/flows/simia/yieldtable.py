"""The Simia recipe's yield table: how many records survive each step, and why the others did not.

Minimal and Simia-specific (no generic yield-table module existed in the repository when this was
written): `collect(paths)` reads the recipe's intermediate JSONL files and rejects files and
returns rows `(section, item, count)`; `render(rows)` prints them aligned.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from toolkit.flows.simia.prefilter import CHECKS


def _lines(path: str | Path | None) -> Iterable[dict]:
    if not path or not Path(path).exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


def _rule(error: str) -> str:
    head = (error or "").split(":", 1)[0].strip()
    return head if head and " " not in head else "other"


def collect(validated: str, simulated: str, sim_rejects: str, cleaned: str, rule_rejects: str,
            grounded: str | None = None, grounding_rejects: str | None = None, seeds_in: str | None = None,
            validate_rejects: str | None = None) -> list[tuple[str, str, object]]:
    rows: list[tuple[str, str, object]] = []
    seeds = list(_lines(validated))
    vrej = list(_lines(validate_rejects))
    kept = 0
    failed = Counter()
    for r in seeds:
        vs = {v["name"]: v for v in r.get("verdicts") or [] if v.get("stage") == "validate-task"}
        s = vs.get("seed_prefilter")
        if s and s["passed"]:
            kept += 1
            continue
        bad = [c for c in CHECKS if c in vs and not vs[c]["passed"]]
        if bad:
            failed.update(bad)
        elif s and (s.get("scores") or {}).get("malformed"):
            failed["llm_grade_malformed"] += 1
        else:
            for k in ("completeness", "logic", "format"):
                if s and (s.get("scores") or {}).get(k) == 0.0:
                    failed[f"llm_{k}"] += 1
    rows.append(("seeds", "read", len(list(_lines(seeds_in))) if seeds_in else len(seeds) + len(vrej)))
    rows.append(("seeds", "kept (pre-filter passed)", kept))
    for k, n in sorted(Counter(("error: " + x.get("error", "")[:60]) for x in vrej).items()):
        rows.append(("seeds", f"rejected ({k})", n))
    for k, n in sorted(failed.items()):
        rows.append(("seeds", f"failed: {k}", n))
    sims = list(_lines(simulated))
    rows.append(("simulate", "trajectories generated", sum(len(r.get("trajectories") or []) for r in sims)))
    rows.append(("simulate", "strict parse ok", sum(1 for r in sims for t in r.get("trajectories") or []
                                                    if not t.get("error"))))
    lost = sum(1 for r in sims for t in r.get("trajectories") or [] if ((t.get("extra") or {}).get("simia") or {}).get("llm_error"))
    if lost:
        rows.append(("simulate", "passes lost (LLM error)", lost))
    srej = list(_lines(sim_rejects))
    if srej:
        rows.append(("simulate", "seeds rejected", len(srej)))
    clean = list(_lines(cleaned))
    drops: Counter = Counter(_rule(x.get("error", "")) for x in _lines(rule_rejects))
    fixes: Counter = Counter()
    for r in clean:
        for v in r.get("verdicts") or []:
            if v.get("stage") == "repair" and v.get("name") == "simia_rules":
                if v["passed"]:
                    fixes.update((v.get("scores") or {}).get("fixes") or {})
                else:
                    drops[(v.get("scores") or {}).get("dropped") or "other"] += 1
    rows.append(("rules", "trajectories kept", sum(len(r.get("trajectories") or []) for r in clean)))
    for k, n in sorted(drops.items()):
        rows.append(("rules", f"dropped: {k}", n))
    for k, n in sorted(fixes.items()):
        rows.append(("rules", f"fixed: {k}", n))
    if grounded is not None:
        shares = []
        for r in _lines(grounded):
            for v in r.get("verdicts") or []:
                if v.get("stage") == "verify" and v.get("name") == "grounding":
                    shares.append((v.get("score") or 0.0, (v.get("scores") or {}).get("total") or 0))
        rows.append(("grounding", "trajectories grounded", len(shares)))
        calls = sum(t for _, t in shares)
        if shares:
            rows.append(("grounding", "mean share (per trajectory)", round(sum(s for s, _ in shares) / len(shares), 3)))
            rows.append(("grounding", "fully grounded (share 1.0)", sum(1 for s, _ in shares if s >= 1.0)))
            rows.append(("grounding", "calls replayed", calls))
        grej = list(_lines(grounding_rejects))
        if grej:
            rows.append(("grounding", "not groundable (no real env)", len(grej)))
    return rows


def render(rows: list[tuple[str, str, object]]) -> str:
    w1 = max([4] + [len(a) for a, _, _ in rows])
    w2 = max([4] + [len(b) for _, b, _ in rows])
    out = [f"{'step':<{w1}}  {'item':<{w2}}  count", f"{'-' * w1}  {'-' * w2}  -----"]
    for a, b, c in rows:
        out.append(f"{a:<{w1}}  {b:<{w2}}  {c}")
    return "\n".join(out)
