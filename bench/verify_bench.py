"""verify benchmark: `state_diff` throughput — DIFF(final state, target) verifications per second on
one core, the indexed target (toolkit.scoring.rewards.TargetIndex) against the naive per-pair DIFF
(toolkit.scoring.state.diff) in the same run. Target: >= 20,000 verifications/s per core.

    python bench/verify_bench.py            # ~30 s of CPU
    python bench/verify_bench.py --quick    # ~5 s
    python bench/verify_bench.py --json out.json

Workload ("realistic states"): 5 tables x 50 rows x 8 columns (ids, names, enums, money floats,
counts, foreign keys, free text, a timestamp declared technical so DIFF excludes it), as a SQLite snapshot gives them
(rows in primary-key order). Each final state differs from the target in a few rows (1-4 edited
cells, sometimes an inserted row), like a trajectory that got most of the task right. 256 distinct
final states are cycled. Scenarios:
  ordered   final rows in the same order as the target (how snapshots come out)
  shuffled  final rows in another order (the index falls back to its tuple-set path)
  equal     final state equal to the target (a successful trajectory)
plus two end-to-end lines: the whole verify stage (replay + DIFF + dense rewards) on the bundled
domain tasks' oracle trajectories, records/s; and `verify --strategy state_diff` on the bundled
airline tasks with 4 trajectories per record, JSON line in -> JSON line out, trajectories/s.
`--compare-src DIR` runs that last line against another checkout in the same run, e.g.
    mkdir /tmp/base && git archive <rev> | tar -x -C /tmp/base
    python bench/verify_bench.py --compare-src /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import random
import sys
import time

# VERIFY_BENCH_SRC: another checkout's root (e.g. the code before a change) to measure instead
sys.path.insert(0, os.environ.get("VERIFY_BENCH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from toolkit.scoring.state import diff as naive_diff  # noqa: E402
from toolkit.scoring.rewards import TargetIndex  # noqa: E402

TABLES, ROWS = 5, 50
TECH = ["updated_at"]  # declared technical column (only declared columns are left out of DIFF)
STATUSES = ("active", "pending", "cancelled", "landed", "refunded")


def make_target(rng: random.Random) -> dict:
    st = {}
    for t in range(TABLES):
        rows = []
        for i in range(ROWS):
            rows.append({
                f"t{t}_id": f"T{t}-{i:04d}", "name": f"name {t}-{i}", "status": rng.choice(STATUSES),
                "amount": round(rng.uniform(10, 2000), 2), "count": rng.randint(0, 9),
                "owner_id": f"user_{rng.randint(1, 40):03d}", "note": rng.choice(["", "vip", "called twice"]),
                "updated_at": f"2024-05-{rng.randint(1, 28):02d}T10:00:00"})
        st[f"table_{t}"] = rows
    return st


def make_finals(target: dict, rng: random.Random, n: int, shuffle: bool, equal: bool) -> list[dict]:
    out = []
    for _ in range(n):
        f = copy.deepcopy(target)
        if not equal:
            for _ in range(rng.randint(1, 4)):
                t = f"table_{rng.randrange(TABLES)}"
                r = f[t][rng.randrange(ROWS)]
                col = rng.choice(["status", "amount", "count", "note"])
                r[col] = {"status": "changed", "amount": r["amount"] + 1.5, "count": r["count"] + 1,
                          "note": "edited"}[col]
            if rng.random() < 0.3:
                t = f"table_{rng.randrange(TABLES)}"
                row = dict(f[t][0])
                row[f"{t.replace('table_', 't')}_id"] = f"NEW-{rng.randrange(10**6)}"
                f[t].append(row)
        for rows in f.values():  # timestamps always differ: excluded from DIFF
            for r in rows:
                r["updated_at"] = "2024-06-01T00:00:00"
        if shuffle:
            for rows in f.values():
                rng.shuffle(rows)
        out.append(f)
    return out


def rate(fn, finals: list[dict], seconds: float) -> tuple[float, float, int]:
    """(verifications per CPU second of this process, per wall second, count). The CPU rate is the
    per-core figure; the wall rate is lower when other processes share the core."""
    n = 0
    k = len(finals)
    c0, t0 = time.process_time(), time.perf_counter()
    while True:
        for i in range(256):
            fn(finals[(n + i) % k])
        n += 256
        cpu = time.process_time() - c0
        if cpu >= seconds:
            return n / cpu, n / (time.perf_counter() - t0), n


def bench_scenario(name: str, shuffle: bool, equal: bool, seconds: float, seed: int = 1) -> dict:
    rng = random.Random(seed)
    target = make_target(rng)
    finals = make_finals(target, rng, 256, shuffle, equal)
    idx = TargetIndex(target, exclude_keys=TECH)
    # the two implementations must agree on every pair
    for f in finals:
        a, b = idx.diff(f), naive_diff(f, target, TECH)["total"]
        if a != b:
            raise SystemExit(f"{name}: indexed DIFF {a} != naive DIFF {b}")
    mean_diff = sum(idx.diff(f) for f in finals) / len(finals)
    fast, fast_wall, n_fast = rate(idx.diff, finals, seconds)
    naive, naive_wall, n_naive = rate(lambda f: naive_diff(f, target, TECH), finals, max(1.0, seconds / 3))
    return {"scenario": name, "indexed_per_s": round(fast), "naive_per_s": round(naive),
            "ratio": round(fast / naive, 1), "indexed_per_wall_s": round(fast_wall),
            "naive_per_wall_s": round(naive_wall), "mean_diff": round(mean_diff, 2), "n_indexed": n_fast,
            "n_naive": n_naive}


def bench_stage(seconds: float) -> dict | None:
    try:
        from toolkit.domains import list_domains, load_tasks
        from toolkit.schema import Record
        from toolkit.stages.verify import build
    except Exception as e:  # pragma: no cover
        return {"error": str(e)}
    recs = []
    for d in list_domains():
        for t in load_tasks(d):
            acts = t["task"]["ground_truth"].get("actions") or []
            if any(a.get("side", "agent") == "user" for a in acts):
                continue
            recs.append(Record.model_validate(dict(t, trajectories=[{"id": "oracle", "messages": _oracle_messages(acts)}]))
                        .dump())
    if not recs:
        return None
    fn = build({"strategy": ["state_diff"]}, None)

    async def go() -> tuple[int, float, int]:
        n, ok = 0, 0
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            for r in recs:
                out = await fn(Record.model_validate(r))
                ok += out.trajectories[0].reward == 1.0
                n += 1
        return n, time.process_time() - t0, ok

    n, dt, ok = asyncio.run(go())
    return {"scenario": "stage (bundled tasks, replay + DIFF + dense)", "records_per_s": round(n / dt, 1),
            "records": n, "reward_1": ok}


def _oracle_messages(acts: list[dict]) -> list[dict]:
    msgs = [{"role": "user", "content": "task"}]
    for i, a in enumerate(acts):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": a["name"], "arguments": json.dumps(a["arguments"])}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "{}"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


def bench_e2e(seconds: float, copies: int = 4, memo: bool = True) -> dict:
    """`verify --strategy state_diff` end to end on one core: the bundled airline tasks, each
    record carrying `copies` trajectories (the oracle's calls; the last copy drops the first call
    so not every trajectory succeeds), as JSON lines -> Record -> verify -> JSON line, like the CLI
    does per line. Rate: trajectories per CPU second."""
    from toolkit.domains import load_tasks
    from toolkit.schema import Record
    from toolkit.stages.verify import build

    lines = []
    for t in load_tasks("airline"):
        acts = t["task"]["ground_truth"].get("actions") or []
        trajs = [{"id": f"t{k}", "messages": _oracle_messages(acts if k < copies - 1 else acts[1:])}
                 for k in range(copies)]
        lines.append(Record.model_validate(dict(t, trajectories=trajs)).model_dump_json(exclude_none=True))
    cfg = {"strategy": ["state_diff"]}
    if not memo:
        cfg["replay_memo"] = False
    fn = build(cfg, None)

    async def go() -> tuple[int, float, int]:
        n, ok = 0, 0
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            for line in lines:
                out = await fn(Record.model_validate_json(line))
                out.model_dump_json(exclude_none=True)
                for tr in out.trajectories:
                    ok += tr.reward == 1.0
                    n += 1
        return n, time.process_time() - t0, ok

    n, dt, ok = asyncio.run(go())
    return {"scenario": f"verify --strategy state_diff end-to-end (airline tasks x{copies} trajectories"
                        f"{'' if memo else ', replay memo off'})",
            "trajectories_per_s": round(n / dt, 1), "trajectories": n, "reward_1": ok}


def bench_e2e_src(src: str, seconds: float) -> dict:
    """bench_e2e run in a subprocess against another checkout (same machine, same run)."""
    import subprocess

    env = dict(os.environ, VERIFY_BENCH_SRC=src, PYTHONPATH=src)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--e2e-only", "--seconds", str(seconds)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="~5 s instead of ~30 s")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--compare-src", metavar="DIR",
                    help="also run the end-to-end line against this checkout (e.g. `git archive <rev> | "
                         "tar -x -C DIR`), in a subprocess of the same run, and print the speed-up")
    ap.add_argument("--e2e-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.e2e_only:
        print(json.dumps(bench_e2e(args.seconds or 2.0)))
        return
    secs = 1.0 if args.quick else 6.0
    print(f"verify_bench: python {platform.python_version()} on {platform.machine()}, one core "
          f"(single thread; rates per CPU-second of this process), states {TABLES} tables x {ROWS} rows "
          f"x 8 columns, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    results = []
    for name, shuffle, equal in (("ordered", False, False), ("shuffled", True, False), ("equal", False, True)):
        r = bench_scenario(name, shuffle, equal, secs)
        results.append(r)
        print(f"  state_diff {name:9s} indexed {r['indexed_per_s']:>9,} verifications/s   naive base.diff "
              f"{r['naive_per_s']:>7,}/s   ratio x{r['ratio']:<6}  (mean DIFF {r['mean_diff']}; wall-clock "
              f"{r['indexed_per_wall_s']:,} vs {r['naive_per_wall_s']:,}/s)")
    st = bench_stage(1.0 if args.quick else 4.0)
    if st:
        results.append(st)
        if "records_per_s" in st:
            print(f"  verify stage end-to-end: {st['records_per_s']} records/s ({st['records']} records, "
                  f"{st['reward_1']} with reward 1.0)")
    e2e_secs = 1.5 if args.quick else 5.0
    e2e = bench_e2e(e2e_secs)
    results.append(e2e)
    print(f"  {e2e['scenario']}: {e2e['trajectories_per_s']:,} trajectories/s "
          f"({e2e['trajectories']} trajectories, {e2e['reward_1']} with reward 1.0)")
    nomemo = bench_e2e(e2e_secs, memo=False)  # every trajectory replayed (none deduplicated)
    results.append(nomemo)
    print(f"  {nomemo['scenario']}: {nomemo['trajectories_per_s']:,} trajectories/s "
          f"({nomemo['trajectories']} trajectories, {nomemo['reward_1']} with reward 1.0)")
    if args.compare_src:
        before = bench_e2e_src(args.compare_src, e2e_secs)
        before["src"] = args.compare_src
        results.append(before)
        print(f"  same line on {args.compare_src}: {before['trajectories_per_s']:,} trajectories/s "
              f"-> x{e2e['trajectories_per_s'] / before['trajectories_per_s']:.1f} "
              f"(x{nomemo['trajectories_per_s'] / before['trajectories_per_s']:.1f} with the replay memo off; "
              f"{before['reward_1']} of {before['trajectories']} with reward 1.0)")
    target = 20_000
    ordered = results[0]["indexed_per_s"]
    print(f"target >= {target:,} verifications/s per core: {'MET' if ordered >= target else 'NOT MET'} "
          f"(ordered {ordered:,}/s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"results": results, "target_per_s": target}, f, indent=2)


if __name__ == "__main__":
    main()
