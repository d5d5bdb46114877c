"""The seed papers' published τ²-bench numbers (percent) and our summary beside them.

The numbers are data: `paper_numbers.csv` next to this module (model, domain, metric, value,
source, ref, note; one row per published value) from EigenData Tables 1-2, ASTRA Table 1, Simia
Table 1 and Figure 5, LOGIGEN Table 3 (docs/tau2.md)."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from toolkit.tau2.summary import pct

DATA = Path(__file__).with_name("paper_numbers.csv")


def load_paper_numbers(path: Path = DATA) -> list[dict]:
    """The rows of the CSV as dicts: value a float, note only where one is given."""
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            e = {k: row[k] for k in ("model", "domain", "metric", "source", "ref")}
            e["value"] = float(row["value"])
            if row.get("note"):
                e["note"] = row["note"]
            out.append(e)
    return out


PAPER_NUMBERS: list[dict] = load_paper_numbers()


def compare_paper(summary: dict, metrics: Iterable[str] | None = None, sources: Iterable[str] | None = None,
                  top: int | None = None) -> str:
    """Our numbers beside the seed papers', per domain and metric (percent)."""
    k = summary.get("k", 1)
    want = list(metrics) if metrics else [f"pass^{j}" for j in range(1, k + 1)] + [f"pass@{k}"]
    src = [s.lower() for s in sources] if sources else None
    blocks = []
    doms = list(summary.get("domains", {}))
    if len(doms) > 1:
        doms.append("average")
    for dom in doms:
        ours = summary["average"] if dom == "average" else summary["domains"][dom]
        for m in want:
            theirs = [p for p in PAPER_NUMBERS if p["domain"] == dom and p["metric"] == m
                      and (src is None or any(s in p["source"].lower() for s in src))]
            if not theirs and ours.get(m) is None:
                continue
            theirs.sort(key=lambda p: -p["value"])
            if top:
                theirs = theirs[:top]
            lines = [f"{dom} {m}: ours {pct(ours.get(m))}"]
            w = max([len(p["model"]) for p in theirs] + [5])
            for p in theirs:
                note = f"  ({p['note']})" if dom == "average" and p.get("note", "").endswith("mean") else ""
                lines.append(f"    {p['model'].ljust(w)}  {p['value']:5.1f}  [{p['ref']}]{note}")
            blocks.append("\n".join(lines))
    return "\n".join(blocks)
