"""Same output check for speed work on the symbolic LOGIGEN path.

    python bench/logigen_same_output.py [--ref REF] [--domain airline --domain PATH] [-n 50] [--seed 7]

Runs `gen-task --strategy logigen --explorer symbolic -n N --seed SEED` with this checkout's code
and with `REF`'s `toolkit/` (default: HEAD~0's merge-base with main; extracted with `git archive`
into a temporary directory), each in a fresh subprocess, and compares the sha256 of the JSONL
output (provenance timestamps removed, keys sorted). Prints one JSON line per domain and exits 1
when any differs. A change meant to be output-neutral (caches, memoization) must print
`"same": true`. `--tasks-only` leaves the first task's coverage report (`task.extra.rule_coverage`)
out of the comparison: for a change to how much of the rule search a small `-n` runs, whose
report says what it left unsearched while the tasks stay the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SNIPPET = r"""
import asyncio, hashlib, json, sys, time
from pathlib import Path
from toolkit.schema import Record
from toolkit.stages import strategies
d, n, seed, tasks_only = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
env = {"backend": "sqlite", "path": d} if Path(d).exists() else {"backend": "sqlite", "id": d}
fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": seed}, None)
t0 = time.process_time()
out = asyncio.run(fn(Record.model_validate({"id": "same", "env": env})))
cpu = time.process_time() - t0
lines = []
for r in out:
    x = json.loads(r.model_dump_json())
    for p in x.get("provenance") or []:
        p.pop("time", None)
    if tasks_only:
        ((x.get("task") or {}).get("extra") or {}).pop("rule_coverage", None)
    lines.append(json.dumps(x, sort_keys=True))
print(json.dumps({"tasks": len(out), "cpu_s": round(cpu, 3),
                  "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()}))
"""


def run(code_root: str, d: str, n: int, seed: int, tasks_only: bool = False) -> dict:
    p = subprocess.run([sys.executable, "-c", _SNIPPET, d, str(n), str(seed), "1" if tasks_only else "0"],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=code_root), cwd=code_root, timeout=1800, check=False)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default=None, help="git ref of the code to compare with (default: merge-base with main)")
    ap.add_argument("--domain", action="append", default=None, help="bundled name or domain path (repeatable)")
    ap.add_argument("-n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tasks-only", action="store_true", help="leave task.extra.rule_coverage out of the comparison")
    a = ap.parse_args()
    ref = a.ref or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True,
                                  text=True, check=False).stdout.strip() or "HEAD"
    domains = a.domain or ["airline", str(ROOT / "tests" / "data" / "carrental")]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="logigen-same-") as tmp:
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "toolkit"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=arch.stdout, check=True)
        for d in domains:
            d = str(Path(d).resolve()) if Path(d).exists() else d
            old, new = run(tmp, d, a.n, a.seed, a.tasks_only), run(str(ROOT), d, a.n, a.seed, a.tasks_only)
            same = "sha256" in old and old.get("sha256") == new.get("sha256")
            bad += not same
            print(json.dumps({"domain": Path(d).name, "ref": ref[:12], "seed": a.seed, "n": a.n, "same": same,
                              "ref_run": old, "this_run": new}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
