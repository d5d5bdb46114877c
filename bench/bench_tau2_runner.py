"""Side by side: τ²-bench's own runner vs the toolkit's rollout on the same τ² tasks, the same
scripted loopback server and the same concurrency.

    python bench/bench_tau2_runner.py                        # 50 airline tasks x 8 trials, concurrency 256, delay 1 s
    python bench/rollout_bench.py --tau2 --skip-ours         # the same, from the rollout benchmark
    python bench/bench_tau2_runner.py --delay 0.5 --trials 6 --tau2-eval

Both harnesses play the identical 4-call episode against `ScriptedServer` (rollout_bench.script,
keyed on the user simulator's system prompt, "playing the role of a customer", which τ²'s
UserSimulator and our tau2 backend share): the agent greets with τ²'s fixed first message, the
user simulator opens, the agent calls `list_all_airports` (executed in τ²'s airline environment),
the agent answers, the user sends ###STOP###.

- τ²: `tau2.run.run_tasks(domain="airline", agent="llm_agent", user="user_simulator",
  llm_agent="openai/scripted", llm_args={"api_base": <server>, "api_key": "dummy"},
  num_trials=k, max_concurrency=C)`: its ThreadPoolExecutor of C threads, each running an
  Orchestrator whose LLMAgent / UserSimulator call litellm. Its post-episode scoring
  (`evaluate_simulation`) is switched off unless --tau2-eval, so both sides measure rollout only.
- ours: `toolkit.stages.rollout` over `toolkit.tau2.load_tasks("airline")` records (the
  tau2 env backend: τ²'s own environment, tools, agent and user-simulator prompts),
  first_message="simulate" (τ²'s flow), C concurrent episodes on one event loop.

Each side runs in a fresh process with its own server process (same delay); each does one
untimed warm-up episode first (imports, lazy initialisation), then the k x tasks episodes are
timed. Printed: episodes/s for both, the ratio, and each against the server-bound limit
C / (4 x delay).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

CALLS = 4  # user opens, agent tool call, agent answer, user ###STOP###


def _quiet() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:  # τ² logs through loguru at import (registry dump, cache notes)
        from loguru import logger

        logger.remove()
        logger.add(sys.stderr, level="ERROR")
    except ImportError:
        pass


def _tau2_child(url: str, task_ids: list, trials: int, conc: int, evaluate: bool, q) -> None:
    _quiet()
    try:
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink):  # τ² prints a line per task
            import tau2.run as tr
            from tau2.data_model.simulation import RewardInfo
            from tau2.evaluator.evaluator import EvaluationType

            if not evaluate:
                tr.evaluate_simulation = lambda **kw: RewardInfo(reward=0.0)
            tasks = tr.get_tasks(task_set_name="airline", task_split_name="base", task_ids=task_ids)
            # `_skip_mcp_handler`: litellm's completion() imports its MCP bridge whenever tools are
            # passed, which needs the optional `mcp` package (not installed here); the bridge only
            # matters for MCP-typed tools, τ²'s are plain functions.
            args = {"api_base": url, "api_key": "dummy", "temperature": 0.0, "_skip_mcp_handler": True}

            def run(ts, k, c):
                return tr.run_tasks(
                    domain="airline", tasks=ts, agent="llm_agent", user="user_simulator",
                    llm_agent="openai/scripted", llm_args_agent=dict(args),
                    llm_user="openai/scripted", llm_args_user=dict(args),
                    num_trials=k, max_steps=30, save_to=None, console_display=False,
                    evaluation_type=EvaluationType.ALL, max_concurrency=c, log_level="ERROR")

            run(tasks[:1], 1, 1)  # warm-up
            sink.truncate(0)
            c0 = time.process_time()
            t = time.perf_counter()
            res = run(tasks, trials, conc)
            dt = time.perf_counter() - t
            cpu = time.process_time() - c0
        terms: dict = {}
        for s in res.simulations:
            k = str(getattr(s.termination_reason, "value", s.termination_reason))
            terms[k] = terms.get(k, 0) + 1
        q.put({"seconds": dt, "episodes": len(res.simulations), "terminations": terms, "cpu": cpu})
    except BaseException as e:  # report, do not hang the parent
        import traceback

        q.put({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})


def _ours_child(url: str, trials: int, conc: int, q) -> None:
    _quiet()
    try:
        from rollout_bench import rollout_cfg, run_records

        from toolkit import tau2 as tau2_bridge
        from toolkit.llm import Meter
        from toolkit.schema import Record
        from toolkit.stages import rollout

        base = [Record.model_validate(r) for r in tau2_bridge.load_tasks("airline")]
        cfg = dict(rollout_cfg(url, conc), first_message="simulate", max_turns=30)
        fn = rollout.build(cfg, Meter())

        def copies(k_from: int, k_to: int) -> list:
            out = []
            for k in range(k_from, k_to):
                for r in base:
                    c = r.model_copy(deep=True)
                    c.id = f"{r.id}-k{k}"
                    out.append(c)
            return out

        run_records(fn, copies(0, 1)[:1], 1)  # warm-up
        records = copies(0, trials)
        c0 = time.process_time()
        dt, bad = run_records(fn, records, conc)
        cpu = time.process_time() - c0
        terms = {"user_stop": len(records) - len(bad)}
        for b in bad:
            terms[str(b)] = terms.get(str(b), 0) + 1
        q.put({"seconds": dt, "episodes": len(records), "terminations": terms, "cpu": cpu,
               "task_ids": [str(r.env.config.get("task_id")) for r in base]})
    except BaseException as e:
        import traceback

        q.put({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})


def _in_child(target, args: tuple, timeout: float = 1800) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=args + (q,))
    p.start()
    try:
        r = q.get(timeout=timeout)
    finally:
        p.join(10)
        if p.is_alive():
            p.terminate()
    if "error" in r:
        raise RuntimeError(f"{target.__name__} failed: {r['error']}\n{r.get('trace', '')}")
    return r


def _task_ids() -> list:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from toolkit import tau2 as tau2_bridge

    return [str(r["env"]["config"]["task_id"]) for r in tau2_bridge.load_tasks("airline")]


def compare(url: str | None, args) -> dict:
    """`url` is unused (each side gets a fresh server process with the same delay); `args` needs
    concurrency, and optionally tau2_delay / delay, tau2_trials, tau2_eval."""
    from rollout_bench import proc_cpu, start_server

    conc = int(getattr(args, "concurrency", 256))
    delay = float(getattr(args, "tau2_delay", None) or getattr(args, "delay", None) or 1.0)
    trials = int(getattr(args, "tau2_trials", 8))
    evaluate = bool(getattr(args, "tau2_eval", False))
    task_ids = _task_ids()
    bound = conc / (CALLS * delay)
    out: dict = {"delay": delay, "concurrency": conc, "tasks": len(task_ids), "trials": trials,
                 "bound_episodes_per_s": round(bound, 2), "tau2_evaluation": evaluate}
    for side in ("tau2", "ours"):
        proc, surl = start_server(delay)
        try:
            s0 = proc_cpu(proc.pid)
            if side == "tau2":
                r = _in_child(_tau2_child, (surl, task_ids, trials, conc, evaluate))
            else:
                r = _in_child(_ours_child, (surl, trials, conc))
            r["server_cpu"] = proc_cpu(proc.pid) - s0
        finally:
            proc.terminate()
        rate = r["episodes"] / r["seconds"]
        out[side] = {"episodes": r["episodes"], "seconds": round(r["seconds"], 3),
                     "episodes_per_s": round(rate, 2), "ratio_to_bound": round(rate / bound, 4),
                     "client_cpu_ms_per_episode": round(r["cpu"] / r["episodes"] * 1000, 2),
                     "terminations": r["terminations"]}
        label = "τ²-bench runner (run_tasks, threads + litellm)" if side == "tau2" else \
            "toolkit rollout (tau2 env backend, asyncio)"
        print(f"{label}: {r['episodes']} episodes ({len(task_ids)} airline tasks x {trials}), "
              f"concurrency {conc}, delay {delay}s: {r['seconds']:.2f}s = {rate:.1f} episodes/s "
              f"({rate / bound:.3f} of the server-bound {bound:.1f}/s; client CPU "
              f"{out[side]['client_cpu_ms_per_episode']:.1f} ms/episode; terminations {r['terminations']})",
              flush=True)
    ratio = out["ours"]["episodes_per_s"] / out["tau2"]["episodes_per_s"]
    out["ours_over_tau2"] = round(ratio, 3)
    print(f"toolkit rollout / τ²-bench runner throughput: {ratio:.2f}x"
          + ("" if evaluate else "  (τ² post-episode scoring off: rollout only)"), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--trials", type=int, default=8, help="trials per task (50 airline tasks)")
    ap.add_argument("--tau2-eval", action="store_true", help="keep τ²'s post-episode scoring on")
    a = ap.parse_args()
    a.tau2_delay = a.delay
    a.tau2_trials = a.trials
    compare(None, a)


if __name__ == "__main__":
    main()
