"""Sandbox latency: warm pool calls vs cold process starts, measured in the same run.

    python bench/sandbox_bench.py [--calls 300] [--cold 20] [--json]

Prints median / p95 of
  - warm:        SandboxPool.run_function (fork from a warm zygote, rlimits, fresh tmpfs, uid drop)
  - warm_code:   SandboxPool.run_code with stdout capture
  - cold_subprocess: `python -I -c <exec source, call f, print JSON>` (no isolation at all)
  - cold_unshare:    `unshare -rn python -I -c ...` (user + net namespace only), if permitted
  - cold_zygote:     starting one sandbox worker (all namespaces + read-only root + imports)
and the cold/warm ratio. Runs in well under 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from toolkit.sandbox import SandboxLimits, SandboxPool  # noqa: E402
from toolkit.sandbox.pool import _Worker  # noqa: E402

SRC = "def f(a, b):\n    return {'sum': a + b, 'items': list(range(10))}\n"
COLD = ("import json\nns = {}\nexec(compile(" + repr(SRC) + ", '<sandbox>', 'exec'), ns)\n"
        "print(json.dumps(ns['f'](1, 2)))\n")


def stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]
    return {"n": len(xs), "median_ms": statistics.median(xs) * 1e3, "p95_ms": p95 * 1e3,
            "min_ms": xs[0] * 1e3}


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--cold", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res: dict = {}
    lim = SandboxLimits(wall_seconds=10)

    pool = SandboxPool(size=2)
    pool.warm(2)
    rep = pool.isolation_report(probe=False)
    res["isolation"] = {"mode": rep["mode"], "namespaces": rep["namespaces"]}

    def warm_call() -> None:
        r = pool.run_function(SRC, "f", args=[1, 2], limits=lim)
        assert r.ok and r.value["sum"] == 3, r

    def warm_code() -> None:
        r = pool.run_code("print('hello')", limits=lim)
        assert r.ok and r.stdout == "hello\n", r

    for _ in range(10):
        warm_call()
    res["warm"] = stats(timed(warm_call, a.calls))
    res["warm_code"] = stats(timed(warm_code, max(20, a.calls // 3)))

    # throughput with 2 threads (pool size 2)
    n_thr = max(20, a.calls // 2)

    def worker() -> None:
        for _ in range(n_thr):
            warm_call()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    res["throughput_2_threads_calls_per_s"] = 2 * n_thr / (time.perf_counter() - t0)

    def cold_sub() -> None:
        p = subprocess.run([sys.executable, "-I", "-c", COLD], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
        assert p.returncode == 0 and json.loads(p.stdout)["sum"] == 3, p.stderr

    res["cold_subprocess"] = stats(timed(cold_sub, a.cold))

    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        def cold_unshare() -> None:
            p = subprocess.run([unshare, "-rn", sys.executable, "-I", "-c", COLD],
                               capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            assert p.returncode == 0, p.stderr

        res["cold_unshare_rn"] = stats(timed(cold_unshare, a.cold))
    else:
        res["cold_unshare_rn"] = None

    cfg = pool._cfg(pool._mode or "namespaces", False)

    def cold_zygote() -> None:
        w = _Worker(dict(cfg), 30.0)
        w.close()

    res["cold_zygote_start"] = stats(timed(cold_zygote, max(3, a.cold // 4)))
    pool.shutdown()

    res["ratio_cold_subprocess_over_warm"] = (res["cold_subprocess"]["median_ms"]
                                              / res["warm"]["median_ms"])
    res["target_warm_median_le_30ms"] = res["warm"]["median_ms"] <= 30.0

    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"sandbox isolation: {res['isolation']['mode']} ({', '.join(rep['namespaces']) or '-'})")
    print(f"{'':28s}{'median ms':>10s}{'p95 ms':>10s}{'min ms':>10s}{'n':>6s}")
    for k in ("warm", "warm_code", "cold_subprocess", "cold_unshare_rn", "cold_zygote_start"):
        s = res[k]
        if s is None:
            print(f"{k:28s}{'(unshare not permitted)':>36s}")
            continue
        print(f"{k:28s}{s['median_ms']:10.2f}{s['p95_ms']:10.2f}{s['min_ms']:10.2f}{s['n']:6d}")
    print(f"throughput (2 threads, pool of 2): {res['throughput_2_threads_calls_per_s']:.0f} calls/s")
    print(f"cold subprocess / warm call (median): {res['ratio_cold_subprocess_over_warm']:.1f}x")
    print(f"warm median <= 30 ms: {res['target_warm_median_le_30ms']}")


if __name__ == "__main__":
    main()
