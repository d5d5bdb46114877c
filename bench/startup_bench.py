"""Start-up benchmark: CPU seconds of the streaming commands' `--help` and of a one-task `gen-task`,
against bare Python measured in the same run.

    python bench/startup_bench.py [--repeat 5] [--domain airline] [--json]

Each figure is the minimum over --repeat fresh processes of the child's user + system CPU time
(resource.getrusage(RUSAGE_CHILDREN)): CPU time, not wall time, so a loaded machine inflates it
less; the minimum, because interference only ever adds. Every command runs through the checkout's
bin/ shim with this interpreter, in a private TOOLKIT_HOME (a temporary directory): the first run of
each command fills the registry manifest (reported as `cold`), the timed runs find it warm.

Rows:
- `python -c pass`: the baseline (the interpreter's own start with this venv's site-packages);
- `<command> --help` for gen-plan gen-task validate-task rollout verify repair reflect simulate-env
  make-verifier eval-tau2;
- the floor under a run path built on the project's chosen libraries, no toolkit code: `import
  click`, pydantic's first model (import, one model class, one validation), `asyncio.run` of a
  no-op, and the three together (what every streaming command's run loads before its own code);
- `gen-task ... -n 1 (no input)`: `gen-task --strategy logigen --explorer symbolic -n 1` on empty
  stdin: the run path's start (config merge, the strategy's modules, the stream) without synthesis;
- `gen-task ... -n 1 < <domain>`: the same with one domain record (`{"env": {"backend": "sqlite",
  "id": <domain>}}`): start-up plus one task's synthesis (for LOGIGEN this includes the domain's
  rule-coverage search, a per-record cost of the flow).

`--ref REF` adds an A/B of the two `gen-task` rows against REF's `toolkit/` and `bin/` (extracted
with `git archive` into a temporary directory, its own warm TOOLKIT_HOME), the two trees run in
turn --repeat times: min and median of each, and the ratio of the medians (this machine's CPU
time for one command varies by up to +-30% from run to run, so compare medians of the same run).
`--domain` takes a bundled domain's name or a domain directory.

Goals (issue 34): every `--help` <= 0.25 CPU-s, `gen-task -n 1` <= 0.5 CPU-s. Figures in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STREAMING = ("gen-plan", "gen-task", "validate-task", "rollout", "verify", "repair", "reflect", "simulate-env",
             "make-verifier", "eval-tau2")
GOAL_HELP, GOAL_RUN = 0.25, 0.5
_MODEL = "from pydantic import BaseModel, Field\nclass A(BaseModel):\n    x: int = Field(1)\nA(x=2)"


def cpu_of(argv: list[str], env: dict, stdin: str = "") -> float:
    """User + system CPU seconds of one child process (it must exit 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
                       check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--domain", default="airline", help="bundled sqlite domain for gen-task -n 1")
    ap.add_argument("--json", action="store_true", help="one JSON object per row on stdout")
    ap.add_argument("--ref", help="a git ref to A/B the gen-task rows against (e.g. main)")
    args = ap.parse_args()

    home = tempfile.mkdtemp(prefix="startup-bench-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # users have .pyc files
    env.update(TOOLKIT_HOME=home, PYTHONPATH=str(ROOT))
    py = sys.executable
    gen = [py, str(ROOT / "bin" / "gen-task"), "--strategy", "logigen", "--explorer", "symbolic", "-n", "1"]
    where = {"path": str(Path(args.domain).resolve())} if Path(args.domain).is_dir() else {"id": args.domain}
    domain = json.dumps({"id": "bench", "env": {"backend": "sqlite", **where}}) + "\n"
    cases: list[tuple[str, list[str], str, float | None]] = [("python -c pass", [py, "-c", "pass"], "", None)]
    floor = {"import click": "import click",
             "pydantic: first model": _MODEL,
             "asyncio.run(no-op)": "import asyncio\nasync def f(): pass\nasyncio.run(f())",
             "click + pydantic model + asyncio.run": "import click\n" + _MODEL
             + "\nimport asyncio\nasync def f(): pass\nasyncio.run(f())"}
    cases += [(f"floor: {k}", [py, "-c", code], "", None) for k, code in floor.items()]
    cases += [(f"{c} --help", [py, str(ROOT / "bin" / c), "--help"], "", GOAL_HELP) for c in STREAMING]
    cases += [("gen-task logigen symbolic -n 1 (no input)", gen, "", GOAL_RUN),
              (f"gen-task logigen symbolic -n 1 < {args.domain}", gen, domain, GOAL_RUN)]

    rows = []
    for name, argv, stdin, goal in cases:
        cold = cpu_of(argv, env, stdin)  # compiles .pyc files, writes the registry manifest
        best = min(cpu_of(argv, env, stdin) for _ in range(args.repeat))
        rows.append({"case": name, "cpu_s": round(best, 3), "cold_cpu_s": round(cold, 3), "goal": goal})
    base = rows[0]["cpu_s"] or 1e-9
    for r in rows:
        r["x_python"] = round(r["cpu_s"] / base, 1)
        r["ok"] = None if r["goal"] is None else r["cpu_s"] <= r["goal"]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    print(f"{'case':<48} {'CPU-s (min of ' + str(args.repeat) + ')':>16} {'x python':>9} {'cold':>7}  goal",
          file=sys.stderr if args.json else sys.stdout)
    for r in rows:
        goal = "" if r["goal"] is None else f"<= {r['goal']}: {'ok' if r['ok'] else 'NOT MET'}"
        print(f"{r['case']:<48} {r['cpu_s']:>16.3f} {r['x_python']:>9.1f} {r['cold_cpu_s']:>7.3f}  {goal}",
              file=sys.stderr if args.json else sys.stdout)
    if args.ref:
        ab(args.ref, args.repeat, env, domain, args.domain, args.json)


def ab(ref: str, repeat: int, env: dict, domain: str, label: str, as_json: bool) -> None:
    """The two gen-task rows for this checkout and `ref`, in turn."""
    tmp = tempfile.mkdtemp(prefix="startup-ref-")
    arch = subprocess.run(["git", "archive", ref, "toolkit", "bin"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=arch, check=True)
    trees = {"this": ROOT, ref: Path(tmp)}
    envs = {k: {**env, "TOOLKIT_HOME": tempfile.mkdtemp(prefix="startup-home-"), "PYTHONPATH": str(root)}
            for k, root in trees.items()}
    rows = {}
    for case, stdin in (("-n 1 (no input)", ""), (f"-n 1 < {label}", domain)):
        got: dict[str, list[float]] = {k: [] for k in trees}
        for k, root in trees.items():  # warm: .pyc files, the manifest, the caches
            cpu_of([sys.executable, str(root / "bin" / "gen-task"), "--strategy", "logigen", "--explorer", "symbolic",
                    "-n", "1"], envs[k], stdin)
        for _ in range(repeat):
            for k, root in trees.items():
                got[k].append(cpu_of([sys.executable, str(root / "bin" / "gen-task"), "--strategy", "logigen",
                                      "--explorer", "symbolic", "-n", "1"], envs[k], stdin))
        rows[case] = {k: {"min": round(min(v), 3), "median": round(statistics.median(v), 3)} for k, v in got.items()}
        rows[case]["median_ratio"] = round(rows[case]["this"]["median"] / rows[case][ref]["median"], 3)
    out = sys.stderr if as_json else sys.stdout
    if as_json:
        print(json.dumps({"ab": ref, "repeat": repeat, "rows": rows}))
    print(f"\nA/B against {ref} ({repeat} runs each, in turn): CPU-s min / median", file=out)
    for case, r in rows.items():
        print(f"gen-task logigen symbolic {case:<26} this {r['this']['min']:.3f} / {r['this']['median']:.3f}   "
              f"{ref} {r[ref]['min']:.3f} / {r[ref]['median']:.3f}   median ratio {r['median_ratio']:.2f}", file=out)


if __name__ == "__main__":
    main()
