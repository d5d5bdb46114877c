"""Simia rule post-process benchmark: `repair --strategy rules` throughput (records/s) on 100k
simulated trajectories vs a plain JSONL copy, measured in the same run.

    python bench/simia_rules_bench.py             # 100k records
    python bench/simia_rules_bench.py --n 20000

Input: records as `simulate-env --mode trajectory` writes them (one trajectory, the raw synthesizer
text in extra.simia.raw, ~2 KB a line), 80% well-formed, 20% spread over the malformations of
tests/flows/simia/fixtures.py (unescaped quotes, missing bracket, <function> tags, SYSTEM turn, unknown
tool, schema violation, unparseable call, unfinished). Cases, each over the same file:
- copy      json.loads + json.dumps per line (the baseline: what any JSONL stage costs at least)
- stream    toolkit RecordStream pass-through (schema validation in and out, no stage work)
- rules     `repair --strategy rules` through RecordStream, as the CLI runs it (kept + rejects)
  (the per-reject log lines go to a file, as with `2> log`)
- core      the rule function alone (`rules.clean_messages` on parsed dicts, no schema, no IO)

Throughput varies ~2x with the load of a shared machine; compare the ratios of one run.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import tests.flows.simia.fixtures as FX

MIX = ["GOOD"] * 8 * 8 + [n for n in FX.EXPECTED if n != "GOOD"] * 2  # 64 good : 18 others ≈ 78% good


def make_file(path: str, n: int) -> None:
    tools = FX.TOOLS
    with open(path, "w") as f:
        for i in range(n):
            name = MIX[i % len(MIX)]
            raw = FX.REPLIES[name].replace("R9", f"R{i}")
            rec = {"id": f"seed-{i // 4}-sim{i % 4}", "parent_id": f"seed-{i // 4}", "flow": "simia",
                   "tags": ["simulated"], "trajectories": [{
                       "id": f"seed-{i // 4}-sim{i % 4}-t0", "messages": [], "tools": tools,
                       "termination": "simulated", "error": "needs repair",
                       "extra": {"simia": {"raw": raw, "system": FX.POLICY, "prompt": "simia/synth_apigen.v1",
                                           "family": "apigen", "temperature": 1.0, "pass": i % 4}}}]}
            f.write(json.dumps(rec) + "\n")


def bench_copy(path: str) -> tuple[int, float]:
    t = time.perf_counter()
    n = 0
    with open(path) as f, open(os.devnull, "w") as out:
        for line in f:
            out.write(json.dumps(json.loads(line)) + "\n")
            n += 1
    return n, time.perf_counter() - t


def bench_stream(path: str, rules: bool) -> tuple[int, float, int, int]:
    from toolkit.io import IOOptions, RecordStream

    rej = tempfile.mktemp(suffix=".jsonl")
    opts = IOOptions(input=path, output=os.devnull, rejects=rej, concurrency=64, progress=False)
    s = RecordStream(opts, "repair")
    # the stage's stderr (one line per rejected record, as `2> log` in a pipeline) goes to a file
    with open(rej + ".log", "w") as logf, contextlib.redirect_stderr(logf):
        t = time.perf_counter()
        if rules:
            from toolkit.stages import strategies

            fn = strategies.stream_fn(strategies.build("repair", {"strategy": "rules"}, None))  # as the CLI does
            s.run(fn)
        else:
            s.run(lambda r: r)
        dt = time.perf_counter() - t
    os.unlink(rej + ".log")
    n_rej = sum(1 for _ in open(rej)) if os.path.exists(rej) else 0
    if os.path.exists(rej):
        os.unlink(rej)
    return s.summary.read, dt, s.summary.written, n_rej


def bench_core(path: str) -> tuple[int, float, int]:
    from toolkit.flows.simia.rules import Dropped, clean_messages, tool_index

    recs = [json.loads(line) for line in open(path)]
    idx = tool_index(FX.TOOLS)
    t = time.perf_counter()
    kept = 0
    for r in recs:
        try:
            clean_messages(r["trajectories"][0], idx)
            kept += 1
        except Dropped:
            pass
    return len(recs), time.perf_counter() - t, kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    path = os.path.join(d, "sims.jsonl")
    make_file(path, a.n)
    size = os.path.getsize(path)
    print(f"input: {a.n} records, {size / a.n:.0f} B/line, {size / 1e6:.1f} MB")
    n, dt = bench_copy(path)
    base = n / dt
    print(f"copy    {n:>8} records {dt:7.2f} s {base:10.0f} rec/s  (baseline)")
    n, dt, w, _ = bench_stream(path, rules=False)
    print(f"stream  {n:>8} records {dt:7.2f} s {n / dt:10.0f} rec/s  ({n / dt / base:.2f}x copy)")
    n, dt, kept, rej = bench_stream(path, rules=True)
    print(f"rules   {n:>8} records {dt:7.2f} s {n / dt:10.0f} rec/s  ({n / dt / base:.2f}x copy; kept {kept}, "
          f"rejected {rej})")
    n, dt, kept = bench_core(path)
    print(f"core    {n:>8} records {dt:7.2f} s {n / dt:10.0f} rec/s  ({n / dt / base:.2f}x copy; kept {kept})")
    os.unlink(path)


if __name__ == "__main__":
    main()
