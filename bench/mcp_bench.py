"""MCP episode start-up cost: a confined server vs the same server unconfined, in the same run.

    python bench/mcp_bench.py [--episodes 8] [--compare-src DIR] [--json]

On a template git repository (20 files) with the live `mcp-server-git` (extra `mcp`), it runs
episodes for
  - namespaces:   this checkout, the default (user/pid/mount/net namespaces, read-only root,
                  seccomp, rlimits, for the server and for each state command run);
  - none-unsafe:  this checkout, the explicit opt-out (rlimits and process group only);
  - DIR:          with --compare-src, another checkout (e.g. the commit before issue 30:
                  `mkdir /tmp/base && git archive <rev> | tar -x -C /tmp/base`);
in rounds that alternate between them (each in its own process, imports not timed), and prints
the median / min of
  - reset:     copy the workdir, start the server, initialize + tools/list (one episode's start)
  - snapshot:  one run of the state command (`git status --porcelain; git log --format=%T`)
  - close:     stop the server, remove the episode directory
  - snapshot_cpu: CPU seconds of one state command run, its launcher included (a server killed at
                the end is never waited for, so its CPU is not counted anywhere: not reported)
and each one's ratio to namespaces. The machine may be shared: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENT = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
KEYS = ("reset", "snapshot", "close", "snapshot_cpu")


def _repo(root: str) -> str:
    r = os.path.join(root, "repo")
    os.makedirs(r)
    env = {**os.environ, **IDENT}
    subprocess.run(["git", "init", "-q"], cwd=r, check=True, env=env)
    for i in range(20):
        with open(os.path.join(r, f"f{i}.txt"), "w") as f:
            f.write(f"file {i}\n" * 50)
    subprocess.run(["git", "add", "."], cwd=r, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "init"], cwd=r, check=True, env=env)
    return r


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def worker(src: str, iso: str, root: str, repo: str, exe: str, n: int) -> list[dict]:
    """n episodes with the toolkit of `src` (this process only), after one not timed."""
    sys.path.insert(0, src)
    from toolkit.envs import load_env
    from toolkit.envs.mcp import set_servers
    from toolkit.sandbox import set_default_isolation

    entry = {"command": exe, "args": ["--repository", "{workdir}"], "env": IDENT,
             "state_command": "git status --porcelain; git log --format=%T",
             "limits": {"cpu_seconds": 600, "wall_seconds": 60}}
    if hasattr(sys.modules["toolkit.envs.mcp.servers"], "resolve_workdir"):  # issue 30 on
        entry["workdir_roots"] = [root]
    set_servers({"mcpServers": {"git": entry}})
    set_default_isolation(iso)
    ref = {"backend": "mcp", "id": "git", "config": {"workdir": repo}}
    out = []
    for i in range(n + 1):
        env = load_env(ref)
        t0 = time.perf_counter()
        env.reset()
        t1 = time.perf_counter()
        c0 = _cpu()
        env.snapshot()
        c1 = _cpu()
        t2 = time.perf_counter()
        env.close()
        t3 = time.perf_counter()
        if i:  # the first one warms the page cache
            out.append({"reset": t1 - t0, "snapshot": t2 - t1, "close": t3 - t2, "snapshot_cpu": c1 - c0})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=8, help="episodes per configuration")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compare-src", metavar="DIR", help="also time another checkout (its code, same server)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=5, metavar=("SRC", "ISO", "ROOT", "REPO", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    exe = shutil.which("mcp-server-git", path=os.path.dirname(sys.executable)) or shutil.which("mcp-server-git")
    if not exe:
        sys.exit("mcp-server-git is not installed (pip install -e '.[mcp]')")
    if a.worker:
        src, iso, root, repo, n = a.worker
        print(json.dumps(worker(src, iso, root, repo, exe, int(n))))
        return
    configs = {"namespaces": (HERE, "namespaces"), "none-unsafe": (HERE, "none-unsafe")}
    if a.compare_src:
        configs[os.path.abspath(a.compare_src)] = (os.path.abspath(a.compare_src), "namespaces")
    root = tempfile.mkdtemp(prefix="mcp-bench-")
    runs: dict[str, list[dict]] = {k: [] for k in configs}
    try:
        repo = _repo(root)
        per = max(1, -(-a.episodes // a.rounds))
        for _ in range(a.rounds):
            for name, (src, iso) in configs.items():
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", src, iso, root, repo,
                                    str(per)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": src})
                if p.returncode != 0:
                    sys.exit(f"{name}: {p.stderr[-2000:]}")
                runs[name] += json.loads(p.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    res: dict = {}
    for name, xs in runs.items():
        res[name] = {k: {"median": statistics.median(x[k] for x in xs), "min": min(x[k] for x in xs)} for k in KEYS}
        res[name]["episodes"] = len(xs)
    base = res["namespaces"]
    for name in res:
        res[name]["ratio_to_namespaces"] = {k: res[name][k]["median"] / base[k]["median"] for k in KEYS}
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for name, r in res.items():
        print(f"{name:14s} reset {r['reset']['median'] * 1e3:7.1f} ms (min {r['reset']['min'] * 1e3:6.1f})  "
              f"snapshot {r['snapshot']['median'] * 1e3:6.1f} ms (min {r['snapshot']['min'] * 1e3:6.1f})  "
              f"close {r['close']['median'] * 1e3:6.1f} ms  snapshot cpu {r['snapshot_cpu']['median'] * 1e3:5.1f} ms  "
              f"[n={r['episodes']}; /namespaces: reset x{r['ratio_to_namespaces']['reset']:.2f}, "
              f"snapshot x{r['ratio_to_namespaces']['snapshot']:.2f}, "
              f"snapshot cpu x{r['ratio_to_namespaces']['snapshot_cpu']:.2f}]")


if __name__ == "__main__":
    main()
