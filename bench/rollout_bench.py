"""Rollout benchmark against a real loopback OpenAI-compatible server with a fixed delay.

    python bench/rollout_bench.py                      # 256 concurrent episodes at delays 0.5, 1, 2 s
    python bench/rollout_bench.py --delay 1.0 --episodes 512
    python bench/rollout_bench.py --memory             # + peak RSS of a 2,000 vs 10,000-episode stream
    python bench/rollout_bench.py --tau2               # + the same tasks/server through tau2-bench's runner

The server is `toolkit.llm.testserver.ScriptedServer` (a real HTTP/1.1 server on loopback) in its
own process, so it does not share the client's GIL; every chat completion is answered after a
fixed `delay`. Every episode is an airline task (11 tool schemas, ~35 KB of JSON, sent with every
agent turn) and makes exactly 3 sequential LLM calls: the agent calls a tool, the agent answers,
the user simulator sends ###STOP### (the opening user message is the task instruction). So the
server-bound limit is  concurrency / (3 x delay)  episodes/s, and the ratio printed is measured
throughput over that limit.

Each timed run starts from a fresh event loop (new connections, new SDK clients); a few untimed
warm-up episodes before it only import modules. Finished records are checked and dropped, as
the streaming CLI writes them out and drops them.
"""
import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CALLS_PER_EPISODE = 3  # agent tool call, agent answer, user ###STOP### (the opening is task.instruction)


def script(req: dict):
    msgs = req.get("messages") or []
    system = (msgs[0].get("content") or "") if msgs else ""
    if "playing the role of a customer" in system:  # the user simulator
        said = sum(1 for m in msgs if m.get("role") == "assistant")
        return "Hi, please look up my reservation." if said == 0 else "Thanks! ###STOP###"
    tools = req.get("tools") or []
    if not any(m.get("role") == "tool" for m in msgs) and tools:
        # one read-only lookup: a query_* tool of our sqlite domains, τ² airline's list_all_airports
        names = [t["function"]["name"] for t in tools]
        name = next((n for n in names if n.startswith("query_")), None)
        if name is not None:
            return {"tool_calls": [{"name": name, "arguments": {"limit": 1}}]}
        name = "list_all_airports" if "list_all_airports" in names else names[0]
        return {"tool_calls": [{"name": name, "arguments": {}}]}
    return "All done: I found your reservation."


# ----------------------------------------------------------------------------------------------
# the server process


def serve(delay: float, q, reply=None) -> None:
    import gc

    from toolkit.llm.testserver import ScriptedServer

    gc.freeze()  # this process's imports: out of the GC's way
    srv = ScriptedServer(reply or script, delay=delay, keep_requests=False, reuse_tools=True).start()
    q.put(srv.base_url)
    while True:
        time.sleep(3600)


def start_server(delay: float, reply=None):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=serve, args=(delay, q, reply), daemon=True)
    p.start()
    return p, q.get(timeout=30)


def proc_cpu(pid: int) -> float:
    """user+system CPU seconds of a process (Linux)."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


# ----------------------------------------------------------------------------------------------
# our rollout


def task_records(n: int) -> list:
    from toolkit import domains
    from toolkit.schema import Record

    base = [Record.model_validate(r) for r in domains.load_tasks("airline")]
    out = []
    for i in range(n):
        r = base[i % len(base)].model_copy(deep=True)
        r.id = f"{r.id}-b{i}"
        out.append(r)
    return out


def rollout_cfg(url: str, conc: int) -> dict:
    return {"n": 1, "agent_kind": "llm", "max_turns": 10, "base_url": url, "model": "scripted",
            "concurrency": conc, "tool_protocol": "native", "max_tokens": 64}


def run_records(fn, records, conc: int, expect: str | None = "user_stop",
                done_at: list | None = None) -> tuple[float, list]:
    """`conc` workers pull records through the rollout fn on a fresh event loop; finished records
    are checked and dropped. Returns (seconds, unexpected terminations); `done_at` collects each
    record's completion time (seconds from the start)."""
    import asyncio
    from collections import deque

    todo = deque(records)
    bad: list = []

    async def worker():
        while todo:
            out = await fn(todo.popleft())
            if done_at is not None:
                done_at.append(time.perf_counter() - t)
            bad.extend(tr.termination for tr in out.trajectories
                       if expect is not None and tr.termination != expect)

    async def go():
        await asyncio.gather(*(worker() for _ in range(conc)))

    t = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t, bad


def run_ours(base_url: str, episodes: int, conc: int, warmup: int = 4) -> dict:
    from toolkit.llm import Meter
    from toolkit.stages import rollout

    fn = rollout.build(rollout_cfg(base_url, conc), Meter())
    if warmup:
        run_records(fn, task_records(warmup), warmup)  # imports only: the timed loop starts afresh
    records = task_records(episodes)
    done_at: list = []
    c0 = time.process_time()
    dt, bad = run_records(fn, records, conc, done_at=done_at)
    cpu = time.process_time() - c0
    assert not bad, f"unexpected terminations: {bad[:5]}"
    done_at.sort()
    steady = None
    if episodes > conc:  # completions after the first round, over the time they took
        span = done_at[-1] - done_at[conc - 1]
        steady = (episodes - conc) / span if span > 0 else None
    return {"seconds": dt, "client_cpu": cpu, "steady": steady}


def bench_delay(delay: float, episodes: int, conc: int, warmup: int) -> dict:
    proc, url = start_server(delay)
    try:
        s0 = proc_cpu(proc.pid)
        r = run_ours(url, episodes, conc, warmup)
        server_cpu = proc_cpu(proc.pid) - s0
    finally:
        proc.terminate()
    bound = conc / (CALLS_PER_EPISODE * delay)
    rate = episodes / r["seconds"]
    out = {"delay": delay, "episodes": episodes, "concurrency": conc, "seconds": round(r["seconds"], 3),
           "episodes_per_s": round(rate, 2), "bound_episodes_per_s": round(bound, 2),
           "ratio": round(rate / bound, 4),
           "steady_state_ratio": round(r["steady"] / bound, 4) if r["steady"] else None,
           "client_cpu_ms_per_episode": round(r["client_cpu"] / episodes * 1000, 2),
           "server_cpu_ms_per_request": round(server_cpu / (episodes * CALLS_PER_EPISODE) * 1000, 3)}
    print(f"delay {delay:>4}s: {episodes} episodes x {CALLS_PER_EPISODE} LLM calls at concurrency {conc}: "
          f"{r['seconds']:.2f}s = {rate:.1f} episodes/s; server-bound limit {bound:.1f} episodes/s; "
          f"ratio {rate / bound:.3f}" + (f"; after the first round {r['steady'] / bound:.3f}" if r["steady"] else "")
          + f"  (client CPU {out['client_cpu_ms_per_episode']:.2f} ms/episode, "
          f"server CPU {out['server_cpu_ms_per_request']:.3f} ms/request)", flush=True)
    return out


# ----------------------------------------------------------------------------------------------
# memory: a streaming rollout (file -> RecordStream -> /dev/null) in a fresh process


def write_inputs(path: str, n: int) -> None:
    from toolkit import domains

    base = domains.load_tasks("airline")
    with open(path, "w") as f:
        for i in range(n):
            r = dict(base[i % len(base)])
            r["id"] = f"{r['id']}-m{i}"
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _stream_child(url: str, path: str, n: int, conc: int, q) -> None:
    from toolkit.io import IOOptions, RecordStream
    from toolkit.llm import Meter
    from toolkit.stages import rollout

    t = time.perf_counter()
    s = RecordStream(IOOptions(input=path, output="/dev/null", concurrency=conc, progress=False,
                               limit=n), "bench")
    s.run(rollout.build(rollout_cfg(url, conc), Meter()))
    q.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, time.perf_counter() - t,
           s.summary.written))


def stream_rss(url: str, path: str, n: int, conc: int) -> tuple:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_stream_child, args=(url, path, n, conc, q))
    p.start()
    r = q.get()
    p.join()
    return r


def bench_memory(conc: int, sizes=(2000, 10000)) -> dict:
    proc, url = start_server(0.005)
    path = tempfile.mktemp(suffix=".jsonl")
    try:
        write_inputs(path, max(sizes))
        res = {}
        for n in sizes:
            rss, secs, written = stream_rss(url, path, n, conc)
            res[n] = rss
            print(f"rollout stream of {n} episodes (file -> RecordStream -> /dev/null, concurrency {conc}): "
                  f"peak RSS {rss} MB, {secs:.1f}s" + (f", {written} records written" if written is not None else ""),
                  flush=True)
        a, b = res[sizes[0]], res[sizes[-1]]
        print(f"peak RSS growth {sizes[0]:,} -> {sizes[-1]:,} episodes: {b - a:+d} MB ({(b - a) / a * 100:+.1f}%)")
        return res
    finally:
        proc.terminate()
        if os.path.exists(path):
            os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--delay", type=float, action="append",
                    help="server delay in seconds (repeatable; default 0.5, 1 and 2)")
    ap.add_argument("--episodes", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=4, help="untimed warm-up episodes (imports)")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--tau2", action="store_true")
    ap.add_argument("--tau2-delay", type=float, default=1.0)
    ap.add_argument("--tau2-trials", type=int, default=8, help="trials per τ² airline task (50 tasks)")
    ap.add_argument("--tau2-eval", action="store_true", help="keep τ²'s post-episode scoring on")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--skip-ours", action="store_true")
    a = ap.parse_args()
    delays = a.delay or [0.5, 1.0, 2.0]
    a.delay = delays[0]
    results: dict = {"rollout": []}
    if not a.skip_ours:
        for d in delays:
            results["rollout"].append(bench_delay(d, a.episodes, a.concurrency, a.warmup))
    if a.memory:
        results["memory_peak_rss_mb"] = bench_memory(a.concurrency)
    if a.tau2:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_tau2_runner import compare

        results["tau2"] = compare(None, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
