"""Rollout benchmark against a real loopback OpenAI-compatible server with a fixed delay.

    python bench/rollout_bench.py                 # 256 concurrent episodes, delay 0.5 s, 1024 episodes
    python bench/rollout_bench.py --memory        # + RSS over 2,000 vs 10,000 episodes
    python bench/rollout_bench.py --tau2          # + the same scripted server through tau2-bench's runner

Every episode makes exactly 4 sequential LLM calls (user opens, agent calls a tool, agent answers,
user sends ###STOP###), so the server-bound limit is  concurrency / (4 x delay)  episodes/s.
The scripted server runs in its own process so it does not share the GIL with the client.
"""
import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
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
        name = next((t["function"]["name"] for t in tools if t["function"]["name"].startswith("query_")),
                    tools[0]["function"]["name"])
        return {"tool_calls": [{"name": name, "arguments": {"limit": 1}}]}
    return "All done: I found your reservation."


def serve(delay: float, q) -> None:
    from toolkit.llm.testserver import ScriptedServer

    srv = ScriptedServer(script, delay=delay).start()
    q.put(srv.base_url)
    while True:
        time.sleep(3600)


def start_server(delay: float):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=serve, args=(delay, q), daemon=True)
    p.start()
    return p, q.get(timeout=30)


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


def run_ours(base_url: str, episodes: int, conc: int) -> float:
    import asyncio

    from toolkit.llm import Meter
    from toolkit.stages import rollout

    cfg = {"n": 1, "agent_kind": "llm", "max_turns": 10, "base_url": base_url, "model": "scripted",
           "concurrency": conc, "tool_protocol": "native", "max_tokens": 64}
    fn = rollout.build(cfg, Meter())
    recs = task_records(episodes)

    async def go():
        sem = asyncio.Semaphore(conc)

        async def one(r):
            async with sem:
                return await fn(r)
        return await asyncio.gather(*(one(r) for r in recs))

    t = time.perf_counter()
    out = asyncio.run(go())
    dt = time.perf_counter() - t
    bad = [tr.termination for r in out for tr in r.trajectories if tr.termination != "user_stop"]
    assert not bad, f"unexpected terminations: {bad[:5]}"
    return dt


def _stream_child(url: str, n: int, conc: int, q) -> None:
    import tempfile

    from toolkit.io import IOOptions, RecordStream
    from toolkit.llm import Meter
    from toolkit.stages import rollout

    path = tempfile.mktemp(suffix=".jsonl")
    with open(path, "w") as f:
        for r in task_records(n):
            f.write(r.model_dump_json(by_alias=True) + "\n")
    cfg = {"n": 1, "agent_kind": "llm", "max_turns": 10, "base_url": url, "model": "scripted",
           "concurrency": conc, "tool_protocol": "native", "max_tokens": 64}
    s = RecordStream(IOOptions(input=path, output="/dev/null", concurrency=conc, progress=False), "bench")
    s.run(rollout.build(cfg, Meter()))
    os.unlink(path)
    q.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)


def stream_rss(url: str, n: int, conc: int) -> int:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_stream_child, args=(url, n, conc, q))
    p.start()
    r = q.get()
    p.join()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--delay", type=float, default=0.5)
    ap.add_argument("--episodes", type=int, default=1024)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--tau2", action="store_true")
    a = ap.parse_args()
    proc, url = start_server(a.delay)
    try:
        dt = run_ours(url, a.episodes, a.concurrency)
        bound = a.concurrency / (CALLS_PER_EPISODE * a.delay)
        ours = a.episodes / dt
        print(f"toolkit rollout: {a.episodes} episodes x {CALLS_PER_EPISODE} LLM calls, concurrency {a.concurrency}, "
              f"delay {a.delay}s: {dt:.2f}s, {ours:.1f} episodes/s; server-bound limit {bound:.1f} episodes/s; "
              f"ratio {ours / bound:.3f}")
        if a.memory:
            proc.terminate()
            proc, url = start_server(0.005)
            rss = [stream_rss(url, n, a.concurrency) for n in (2000, 10000)]
            for n, r in zip((2000, 10000), rss):
                print(f"rollout stream of {n} episodes (stdin→stdout /dev/null): peak RSS {r} MB")
            print(f"peak RSS growth 2,000 → 10,000 episodes: {rss[1] - rss[0]:+d} MB")
        if a.tau2:
            from bench_tau2_runner import compare  # noqa: F401  (see bench/bench_tau2_runner.py)

            compare(url, a)
    finally:
        proc.terminate()


if __name__ == "__main__":
    main()
