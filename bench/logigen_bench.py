"""Benchmark of the LOGIGEN flow's deterministic parts.

    python bench/logigen_bench.py [--domain airline --domain clinic --domain PATH] [--repeat 3]

- domain check: wall time of `check_domain` per domain (compile, analysis, every check, and the
  provocation search that finds a violating call for every rule), median of --repeat runs, with
  the number of tool calls the search made and the rules provoked.
- symbolic task synthesis: `gen-task --strategy logigen --explorer symbolic -n N --seed 7` per
  domain (one domain record in, N tasks out: exploration, seeding, injection, execution, template
  user view), tasks/s over --repeat runs, and `validate-task --strategy logigen` records/s on them.
- the same synthesis with a baseline's code measured in the same run (`--baseline-ref`, default
  the merge-base with main: its `toolkit/` is extracted with `git archive` into a temporary
  directory and run in a subprocess), with tasks/s, writes per task and the ratio new/baseline.
  `--baseline-ref none` skips it.
- wall time and CPU time (process_time) of each synthesis: on a shared, loaded machine the wall
  figures follow the load; tasks per CPU-second compare the code.
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
        gen_t, cpu_t, val_t, out = [], [], [], []
        for _ in range(repeat):
            fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": 7}, None)
            t0, c0 = time.perf_counter(), time.process_time()
            out = asyncio.run(fn(Record.model_validate({"id": "bench", "env": env})))
            gen_t.append(time.perf_counter() - t0)
            cpu_t.append(time.process_time() - c0)
            vfn = strategies.build("validate-task", {"strategy": "logigen"}, None)
            t0 = time.perf_counter()

            async def _all(vfn=vfn, out=out):
                return [await vfn(r) for r in out]

            checked = asyncio.run(_all())
            val_t.append(time.perf_counter() - t0)
        passed = sum(all(v.passed for v in r.verdicts if v.stage == "validate-task") for r in checked)
        viol = sum(bool(r.task.complexity.get("violation_first")) for r in out)
        g = statistics.median(gen_t)
        writes = [r.task.complexity.get("writes") or 0 for r in out]
        rows.append({"bench": "symbolic_tasks", "domain": Path(d).name, "tasks": len(out),
                     "writes_mean": round(sum(writes) / max(len(writes), 1), 2),
                     "seconds_median": round(g, 3), "tasks_per_s": round(len(out) / g, 1),
                     "cpu_seconds_median": round(statistics.median(cpu_t), 3),
                     "tasks_per_cpu_s": round(len(out) / max(statistics.median(cpu_t), 1e-9), 1),
                     "validate_per_s": round(len(out) / statistics.median(val_t), 1),
                     "validate_passed": passed, "violation_first": viol,
                     "boundary": sum("boundary" in r.task.complexity for r in out)})
    return rows


_BASE_SNIPPET = r"""
import asyncio, json, statistics, sys, time
from pathlib import Path
from toolkit.schema import Record
from toolkit.stages import strategies
d, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import importlib, pkgutil, toolkit.flows.logigen as _lg, toolkit.envs.sqlite  # imports are not synthesis
for _m in pkgutil.iter_modules(_lg.__path__):
    try:
        importlib.import_module("toolkit.flows.logigen." + _m.name)
    except Exception:
        pass
env = {"backend": "sqlite", "path": d} if Path(d).exists() else {"backend": "sqlite", "id": d}
ts, cs, out = [], [], []
for _ in range(repeat):
    fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": 7}, None)
    t0, c0 = time.perf_counter(), time.process_time()
    out = asyncio.run(fn(Record.model_validate({"id": "bench", "env": env})))
    ts.append(time.perf_counter() - t0)
    cs.append(time.process_time() - c0)
reads = ("query_", "get_", "list_", "search_")
w = [sum(1 for a in r.task.ground_truth.actions if not a.expect_error and not a.name.startswith(reads)) for r in out]
print(json.dumps({"tasks": len(out), "seconds_median": statistics.median(ts), "cpu_seconds_median": statistics.median(cs),
                  "writes_mean": sum(w) / max(len(w), 1)}))
"""


def bench_baseline(domains: list[str], repeat: int, n: int, ref: str) -> list[dict]:
    """The symbolic synthesis of the baseline `ref`'s code and of this checkout's code, each in a
    fresh subprocess with the flow's modules imported before the clock starts (same machine, same
    run; rows `symbolic_baseline` and `symbolic_this`)."""
    import os
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parent.parent
    rows = []
    with tempfile.TemporaryDirectory(prefix="logigen-baseline-") as tmp:
        arch = subprocess.run(["git", "-C", str(root), "archive", ref, "toolkit"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=arch.stdout, check=True)
        for d in domains:
          for bench, code in (("symbolic_baseline", tmp), ("symbolic_this", str(root))):
            p = subprocess.run([sys.executable, "-c", _BASE_SNIPPET, d, str(n), str(repeat)], capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=code), cwd=code, timeout=1800, check=False)
            if p.returncode != 0:
                rows.append({"bench": bench, "domain": Path(d).name, "ref": ref,
                             "error": p.stderr.strip().splitlines()[-1:] or ["failed"]})
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append({"bench": bench, "domain": Path(d).name, "ref": ref, "tasks": r["tasks"],
                         "seconds_median": round(r["seconds_median"], 3),
                         "tasks_per_s": round(r["tasks"] / r["seconds_median"], 1),
                         "tasks_per_cpu_s": round(r["tasks"] / max(r["cpu_seconds_median"], 1e-9), 1),
                         "writes_mean": round(r["writes_mean"], 2)})
    return rows


def _default_ref() -> str:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run(["git", "-C", str(root), "merge-base", "HEAD", "main"], capture_output=True, text=True,
                       check=False)
    return p.stdout.strip() or "HEAD"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", action="append", default=None,
                    help="bundled name or domain path (repeatable; default: airline, clinic, tests/data/library, tests/data/retail)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=50, help="symbolic tasks per domain (gen-task -n)")
    ap.add_argument("--baseline-ref", default=None,
                    help="git ref whose toolkit/ is the baseline (default: merge-base with main; 'none' skips it)")
    ap.add_argument("--skip-check", action="store_true", help="skip the domain-check timings")
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    domains = a.domain or ["airline", "clinic", str(root / "tests" / "data" / "library"),
                           str(root / "tests" / "data" / "retail")]
    rows = [] if a.skip_check else bench_domain_check(domains, a.repeat)
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
    ref = a.baseline_ref or _default_ref()
    if ref.lower() == "none":
        return
    brows = bench_baseline(domains, a.repeat, a.tasks, ref)
    for r in brows:
        print(json.dumps(r))
    print(f"baseline {ref[:12]} vs this checkout, each in a fresh subprocess (same machine, same run):",
          file=sys.stderr)
    print(f"{'domain':<12} {'base t/s':>9} {'new t/s':>8} {'ratio':>6} {'base t/cpu-s':>13} {'new t/cpu-s':>12} "
          f"{'ratio':>6} {'base writes':>12} {'new writes':>11}", file=sys.stderr)
    # both sides from the same fresh-subprocess snippet (imports done before the clock)
    new = {r["domain"]: r for r in brows if r["bench"] == "symbolic_this" and "error" not in r}
    for b in (r for r in brows if r["bench"] == "symbolic_baseline"):
        n_ = new.get(b["domain"], {})
        if "error" in b:
            print(f"{b['domain']:<12} baseline failed: {b['error']}", file=sys.stderr)
            continue
        ratio = n_.get("tasks_per_s", 0) / b["tasks_per_s"] if b["tasks_per_s"] else float("nan")
        cratio = n_.get("tasks_per_cpu_s", 0) / b["tasks_per_cpu_s"] if b["tasks_per_cpu_s"] else float("nan")
        print(f"{b['domain']:<12} {b['tasks_per_s']:>9.1f} {n_.get('tasks_per_s', 0):>8.1f} {ratio:>6.2f} "
              f"{b['tasks_per_cpu_s']:>13.1f} {n_.get('tasks_per_cpu_s', 0):>12.1f} {cratio:>6.2f} "
              f"{b['writes_mean']:>12.2f} {n_.get('writes_mean', 0):>11.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
