"""Start-up and synthesis speed of `gen-task --strategy logigen --explorer symbolic`, against a
baseline revision measured in the same run.

    python bench/logigen_speed.py [--ref main] [--domain tests/data/gym ...] [-n 300] [--seed 0]

Per domain and code (this checkout, and `--ref`'s `toolkit/` extracted with `git archive` into a
temporary directory), in fresh processes of the installed `gen-task` command with one input record
`{"id": "x", "flow": "logigen", "env": {"backend": "sqlite", "path": DOMAIN}}` on stdin:

- `n1_cpu_s`: CPU seconds (user + sys of the child, getrusage) of `-n 1`;
- `tasks_per_cpu_s`: (N - 1) / (CPU(-n N) - CPU(-n 1)), the synthesis rate without the start-up;
- cold: the rule search cache off (TOOLKIT_LOGIGEN_SEARCH_CACHE=0; a baseline without the cache
  ignores it); warm (this checkout only): after one `-n N` run filled the cache.

Each code gets its own TOOLKIT_HOME and bytecode cache, warmed by one unmeasured run, so neither
pays for compiling or for the first entry-point scan. CPU seconds hold on a shared machine (wall
time does not). Prints one JSON line per domain and code, then a summary line per domain with the
ratios this/ref.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOMAINS = ["tests/data/gym", "tests/data/citypermits", "tests/data/courier", "tests/data/vet"]
GEN_TASK = str(Path(sys.executable).with_name("gen-task"))


def cpu_of(cmd: list[str], stdin: str, env: dict, cwd: str) -> tuple[float, int]:
    """(user + sys CPU seconds of the child, JSONL lines it wrote)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), len(p.stdout.splitlines())


def measure(code: str, domain: str, n: int, seed: int, tmp: str, warm: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=code, TOOLKIT_HOME=os.path.join(tmp, "home"), PYTHONPYCACHEPREFIX=os.path.join(tmp, "pyc"))
    rec = json.dumps({"id": "x", "flow": "logigen", "env": {"backend": "sqlite", "path": domain}}) + "\n"

    def gen(k: int, cache: bool) -> tuple[float, int]:
        e = dict(env, TOOLKIT_LOGIGEN_SEARCH_CACHE="1" if cache else "0")
        return cpu_of([GEN_TASK, "--strategy", "logigen", "--explorer", "symbolic", "-n", str(k), "--seed",
                       str(seed)], rec, e, code)

    gen(1, False)  # unmeasured: bytecode and the entry-point manifest
    c1, _ = gen(1, False)
    cn, got = gen(n, False)
    row = {"n1_cpu_s": round(c1, 3), f"n{n}_cpu_s": round(cn, 3), "tasks": got,
           "tasks_per_cpu_s": round((got - 1) / max(1e-9, cn - c1), 1)}
    if warm:
        gen(n, True)  # fills the cache
        w1, _ = gen(1, True)
        wn, wgot = gen(n, True)
        row.update(n1_warm_cpu_s=round(w1, 3), tasks_per_cpu_s_warm=round((wgot - 1) / max(1e-9, wn - w1), 1))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git revision of the baseline ('none': no baseline)")
    ap.add_argument("--domain", action="append", default=None, help="domain directory (repeatable)")
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    domains = [str(Path(d).resolve()) for d in (a.domain or [str(ROOT / d) for d in DOMAINS])]
    with tempfile.TemporaryDirectory(prefix="logigen-speed-") as tmp:
        codes = {"this": str(ROOT)}
        if a.ref != "none":
            ref_dir = os.path.join(tmp, "ref")
            os.makedirs(ref_dir)
            arch = subprocess.run(["git", "-C", str(ROOT), "archive", a.ref, "toolkit"], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", ref_dir], input=arch.stdout, check=True)
            codes = {"ref": ref_dir, **codes}
        for d in domains:
            rows = {}
            for name, code in codes.items():
                work = tempfile.mkdtemp(dir=tmp)
                rows[name] = measure(code, d, a.n, a.seed, work, warm=name == "this")
                print(json.dumps({"domain": Path(d).name, "code": a.ref if name == "ref" else "this", **rows[name]}),
                      flush=True)
            if "ref" in rows:
                r, t = rows["ref"], rows["this"]
                print(json.dumps({"domain": Path(d).name, "summary": True,
                                  "n1_cpu_ratio": round(t["n1_cpu_s"] / max(1e-9, r["n1_cpu_s"]), 3),
                                  "rate_ratio": round(t["tasks_per_cpu_s"] / max(1e-9, r["tasks_per_cpu_s"]), 3)}),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
