"""Benchmark of the LOGIGEN flow's deterministic parts.

    python bench/logigen_bench.py [--domain airline --domain clinic --domain PATH] [--repeat 3]

- domain check: wall time of `check_domain` per domain (compile, analysis, every check, and the
  provocation search that finds a violating call for every rule), median of --repeat runs, with
  the number of tool calls the search made and the rules provoked.
(Other LOGIGEN figures, e.g. symbolic tasks/s, are added to this file by their stages.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def bench_domain_check(domains: list[str], repeat: int) -> list[dict]:
    from toolkit.flows.logigen.domain_check import check_domain

    rows = []
    for d in domains:
        times, rep = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            rep = check_domain(d)
            times.append(time.perf_counter() - t0)
        provoked = sum(1 for r in rep.rules.values() if r.get("provoked"))
        rows.append({"bench": "domain_check", "domain": rep.domain, "ok": rep.ok,
                     "seconds_median": round(statistics.median(times), 4), "seconds_min": round(min(times), 4),
                     "rules": len(rep.rules), "provoked": provoked,
                     "search_calls": rep.checks.get("provoked", {}).get("calls")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", action="append", default=None,
                    help="bundled name or domain path (repeatable; default: airline, clinic, tests/data/library)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    domains = a.domain or ["airline", "clinic", str(root / "tests" / "data" / "library")]
    rows = bench_domain_check(domains, a.repeat)
    for r in rows:
        print(json.dumps(r))
    print(f"{'domain':<12} {'check s':>8} {'rules':>6} {'provoked':>9} {'calls':>7}", file=sys.stderr)
    for r in rows:
        print(f"{r['domain']:<12} {r['seconds_median']:>8.3f} {r['rules']:>6} {r['provoked']:>9} "
              f"{r['search_calls']!s:>7}", file=sys.stderr)


if __name__ == "__main__":
    main()
