"""Benchmark of the LOGIGEN flow's deterministic parts.

    python bench/logigen_bench.py [--domain airline --domain clinic --domain PATH] [--repeat 3]

- domain check: wall time of `check_domain` per domain (compile, analysis, every check, and the
  provocation search that finds a violating call for every rule), median of --repeat runs, with
  the number of tool calls the search made and the rules provoked.
- symbolic task synthesis: `gen-task --strategy logigen --explorer symbolic -n N --seed 7` per
  domain (one domain record in, N tasks out: exploration, seeding, injection, execution, template
  user view), tasks/s over --repeat runs, and `validate-task --strategy logigen` records/s on them.
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


def bench_symbolic(domains: list[str], repeat: int, n: int) -> list[dict]:
    import asyncio

    from toolkit.schema import Record
    from toolkit.stages import strategies

    rows = []
    for d in domains:
        env = {"backend": "sqlite", "path": d} if Path(d).exists() else {"backend": "sqlite", "id": d}
        gen_t, val_t, out = [], [], []
        for _ in range(repeat):
            fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": 7}, None)
            t0 = time.perf_counter()
            out = asyncio.run(fn(Record.model_validate({"id": "bench", "env": env})))
            gen_t.append(time.perf_counter() - t0)
            vfn = strategies.build("validate-task", {"strategy": "logigen"}, None)
            t0 = time.perf_counter()

            async def _all(vfn=vfn, out=out):
                return [await vfn(r) for r in out]

            checked = asyncio.run(_all())
            val_t.append(time.perf_counter() - t0)
        passed = sum(all(v.passed for v in r.verdicts if v.stage == "validate-task") for r in checked)
        viol = sum(bool(r.task.complexity.get("violation_first")) for r in out)
        g = statistics.median(gen_t)
        rows.append({"bench": "symbolic_tasks", "domain": Path(d).name, "tasks": len(out),
                     "seconds_median": round(g, 3), "tasks_per_s": round(len(out) / g, 1),
                     "validate_per_s": round(len(out) / statistics.median(val_t), 1),
                     "validate_passed": passed, "violation_first": viol,
                     "boundary": sum("boundary" in r.task.complexity for r in out)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", action="append", default=None,
                    help="bundled name or domain path (repeatable; default: airline, clinic, tests/data/library, tests/data/retail)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=50, help="symbolic tasks per domain (gen-task -n)")
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    domains = a.domain or ["airline", "clinic", str(root / "tests" / "data" / "library"),
                           str(root / "tests" / "data" / "retail")]
    rows = bench_domain_check(domains, a.repeat)
    for r in rows:
        print(json.dumps(r))
    print(f"{'domain':<12} {'check s':>8} {'rules':>6} {'provoked':>9} {'calls':>7}", file=sys.stderr)
    for r in rows:
        print(f"{r['domain']:<12} {r['seconds_median']:>8.3f} {r['rules']:>6} {r['provoked']:>9} "
              f"{r['search_calls']!s:>7}", file=sys.stderr)
    srows = bench_symbolic(domains, a.repeat, a.tasks)
    for r in srows:
        print(json.dumps(r))
    print(f"{'domain':<12} {'tasks':>6} {'gen s':>7} {'tasks/s':>8} {'valid/s':>8} {'passed':>7} {'viol':>5} {'bound':>6}",
          file=sys.stderr)
    for r in srows:
        print(f"{r['domain']:<12} {r['tasks']:>6} {r['seconds_median']:>7.2f} {r['tasks_per_s']:>8.1f} "
              f"{r['validate_per_s']:>8.1f} {r['validate_passed']:>7} {r['violation_first']:>5} {r['boundary']:>6}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
