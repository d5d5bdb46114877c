"""Official vs fast τ²-bench scoring on the same oracle trajectories.

    python bench/tau2_verify_bench.py [--domain airline] [--n 50] [--repeat 1]

Prints seconds/task for τ²'s own `evaluate_simulation` (score_official) and for `score_fast`
(cold: first scoring of each task, gold state computed; warm: gold state cached, as when several
trials of a task are scored), the speedup ratios, and whether every score agreed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from toolkit import tau2 as B  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domain", default="airline")
    ap.add_argument("--n", type=int, default=None, help="first N tasks (default: all)")
    ap.add_argument("--repeat", type=int, default=1, help="timed passes per scorer")
    args = ap.parse_args(argv)

    recs = B.load_tasks(args.domain)[: args.n]
    trajs = [B.oracle_trajectory(r) for r in recs]
    B.score_fast(recs[0], trajs[0])  # one-time per-process setup (τ² import, pristine DB load)
    B.score_official(recs[0], trajs[0])

    def timed(fn) -> tuple[float, list]:
        t0 = time.perf_counter()
        out = [fn(r, t) for r, t in zip(recs, trajs)]
        return (time.perf_counter() - t0) / len(recs), out

    off_t, fast_cold_t, fast_warm_t = [], [], []
    agree = True
    for _ in range(args.repeat):
        t, off = timed(B.score_official)
        off_t.append(t)
        B.scoring._GOLD.clear()
        t, fast = timed(B.score_fast)
        fast_cold_t.append(t)
        t, fast2 = timed(B.score_fast)
        fast_warm_t.append(t)
        agree &= all(B.same_score(a, b) and B.same_score(a, c) for a, b, c in zip(off, fast, fast2))
    o, fc, fw = min(off_t), min(fast_cold_t), min(fast_warm_t)
    passed = sum(1 for x in off if x["passed"])
    print(f"domain={args.domain} tasks={len(recs)} oracle reward 1.0: {passed}/{len(recs)} agree={agree}")
    print(f"official (tau2 evaluate_simulation): {o:.4f} s/task")
    print(f"fast, cold gold cache:               {fc:.4f} s/task   speedup {o / fc:.1f}x")
    print(f"fast, warm gold cache:               {fw:.4f} s/task   speedup {o / fw:.1f}x")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
