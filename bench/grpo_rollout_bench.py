"""Rollout-side throughput inside `grpo` versus TRL's built-in tool loop, same tiny model, CPU.

Both sides generate with transformers `generate` on the same weights (a tiny Qwen2 built offline,
SFT-warmed for a few seconds so it emits tool calls), on the same tasks ("open a ticket with code
X": one sqlite tool, G episodes per task), at the same temperature and per-turn token cap:

- toolkit: `GRPORun.rollouts.group` for every task concurrently — rollout's `run_episode` engine,
  the real sqlite environment, `verify --strategy state_diff` rewards, batched generation across
  episodes; also with batching off (one episode at a time) as the unbatched baseline;
- TRL: `GRPOTrainer(tools=[insert_ticket])._generate(prompts)` — TRL 1.x's own multi-turn tool loop
  (generation, `parse_response`, tool execution, suffix tokenization), no reward or user turns.

Figures: episodes/s, generated tokens/s, tool calls, mean reward where known. Usage:
    OMP_NUM_THREADS=1 python bench/grpo_rollout_bench.py [--tasks 8 --group 8 --rounds 2]
    python bench/grpo_rollout_bench.py --demo      # sft then grpo on the tiny model: reward per step
    python bench/grpo_rollout_bench.py --async-only --repeats 3   # async vs sync GRPO steps/s only

Async vs sync: the same GRPO run (real generation, env, verify, TRL trainer) for `--async-steps`
steps with max_staleness 0 (rollout and training alternate) and 1 (the next step's first rollout
round runs in a background thread on a behaviour copy of the weights while TRL trains), median of
`--repeats` interleaved runs, printed as ratio_steps_per_s_async_vs_sync.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

TICKETS = (ROOT / "tests" / "data" / "tickets.yaml").read_text()  # the GRPO tests' one-table domain
CODES = ["red", "blue", "green", "gold", "teal", "pink", "gray", "navy", "lime", "plum", "rose", "sand"]


def tasks(tmp: Path, n: int):
    from toolkit.schema import Record

    path = tmp / "tickets.yaml"
    path.write_text(TICKETS)
    return [Record.model_validate({
        "id": f"tk-{c}", "env": {"backend": "sqlite", "path": str(path)},
        "task": {"instruction": f"Open a ticket with code {c}.",
                 "ground_truth": {"actions": [{"name": "insert_ticket", "arguments": {"code": c}}]}}})
        for c in CODES[:n]]


def warm_model(tmp: Path, recs, steps: int, lr: float = 5e-3) -> str:
    """Tiny model + a short SFT on replayed, verified episodes of the tasks."""
    from toolkit.stages import rollout, verify
    from toolkit.train import export as X
    from toolkit.train import sft
    from toolkit.train.tiny import build_tiny_model

    base = build_tiny_model(Path(tempfile.gettempdir()) / "toolkit-tiny-model")
    if steps <= 0:
        return base
    roll = rollout.build({"agent_kind": "replay"}, None)
    ver = verify.build({"strategy": ["state_diff"]}, None)

    async def go():
        return [await ver(await roll(r.model_copy(deep=True))) for r in recs]

    rows = [x for r in asyncio.run(go()) for x in X.record_rows(r, tool_schema="compact", system_prompt="drop")]
    out = tmp / "sft"
    sft.train(rows * 8, {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "max_steps": steps,
                         "learning_rate": lr, "per_device_train_batch_size": 4, "save_strategy": "no",
                         "lr_scheduler_type": "constant", "logging_steps": 10, "seed": 0, "report_to": "none"},
              base, str(out))
    return str(out)


def ours(model: str, recs, tmp: Path, group: int, max_new: int, rounds: int, batched: bool = True) -> dict:
    from toolkit.train import advantages as ADV
    from toolkit.train import grpo as G

    cfg = {"use_cpu": True, "max_new_tokens": max_new, "max_turns": 2, "tool_schema": "compact",
           "system_prompt": "drop", "num_generations": group, "tasks_per_step": len(recs), "max_steps": 1,
           "temperature": 1.0, "strict_tool_calls": True}  # parse like TRL: no JSON repair
    run = G.GRPORun(cfg, recs, model, str(tmp / "grpo-bench"))
    gen = run.generator

    async def one_round(step):
        if batched:
            return await asyncio.gather(*(run.rollouts.group(r, step) for r in recs))
        out = []
        for r in recs:  # one episode at a time: no cross-episode batching
            run.opts.num_generations = 1
            eps = []
            for _ in range(group):
                g, _ = await run.rollouts.group(r, step)
                eps += g.items
            run.opts.num_generations = group
            out.append((ADV.Group(r.id, [e.reward for e in eps], eps), None))
        return out

    asyncio.run(one_round(-1))  # warm-up (first generate call, env compile)
    tok0, s0, n_ep, calls, rewards = gen.generated_tokens, gen.seconds, 0, 0, []
    t0 = time.perf_counter()
    for k in range(rounds):
        res = asyncio.run(one_round(k))
        for g, _ in res:
            n_ep += len(g.items)
            rewards += g.rewards
            calls += sum(1 for e in g.items for s in e.traj.steps if s.side == "agent")
    dt = time.perf_counter() - t0
    toks = gen.generated_tokens - tok0
    return {"episodes": n_ep, "seconds": round(dt, 3), "episodes_per_s": round(n_ep / dt, 2),
            "gen_tokens": toks, "gen_tokens_per_s": round(toks / dt, 1), "tool_calls": calls,
            "reward_mean": round(sum(rewards) / len(rewards), 3), "generate_calls": gen.calls,
            "generate_seconds": round(gen.seconds - s0, 3)}


def trl_loop(model_path: str, recs, tmp: Path, group: int, max_new: int, rounds: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_schema, qwen3_template

    from toolkit.envs import load_env

    env = load_env(recs[0].env)
    counter = {"calls": 0}

    def insert_ticket(code: str) -> str:
        """Create one row in table `ticket`.

        Args:
            code: code

        Returns:
            The inserted row as stored.
        """
        counter["calls"] += 1
        return env.call("insert_ticket", {"code": code}).to_content()

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.response_template = qwen3_template  # same assistant output format (<tool_call> JSON, <|im_end|>)
    tok.response_schema = qwen3_schema
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    prompts = [[{"role": "user", "content": r.task.instruction}] for r in recs]
    ds = Dataset.from_list([{"prompt": p} for p in prompts])
    args = GRPOConfig(output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=group, num_generations=group, max_completion_length=2 * max_new,
                      max_tool_calling_iterations=1, temperature=1.0, top_k=0, logging_steps=1,
                      gradient_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=ds, processing_class=tok, tools=[insert_ticket])
    # render the prompt with exactly the tool schemas our episodes send (compact, from the sqlite env);
    # the callable stays the executor (_sync_tool_dicts)
    from toolkit.formats.tools import prepare_tools

    trainer.tools = prepare_tools(env.tools("agent"), "compact")
    batch = [p for p in prompts for _ in range(group)]
    # what _generate_and_score_completions sets up before calling _generate (standalone tools only)
    trainer._sync_tool_dicts = [{"insert_ticket": insert_ticket} for _ in batch]
    trainer._async_tool_dicts = [{} for _ in batch]
    trainer._generate(batch[:group])  # warm-up
    counter["calls"] = 0
    n_ep, toks, gen_s = 0, 0, [0.0]
    orig = trainer._generate_single_turn

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            gen_s[0] += time.perf_counter() - t

    trainer._generate_single_turn = timed
    t0 = time.perf_counter()
    for _ in range(rounds):
        out = trainer._generate(batch)
        # (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images)
        completion_ids, tool_mask = out[1], out[2]
        n_ep += len(completion_ids)
        if tool_mask is not None:
            toks += sum(int(sum(m)) for m in tool_mask)
        else:
            toks += sum(len(c) for c in completion_ids)
    dt = time.perf_counter() - t0
    return {"episodes": n_ep, "seconds": round(dt, 3), "episodes_per_s": round(n_ep / dt, 2),
            "gen_tokens": toks, "gen_tokens_per_s": round(toks / dt, 1), "tool_calls": counter["calls"],
            "generate_seconds": round(gen_s[0], 3)}


def train_steps(model: str, recs, tmp: Path, steps: int, staleness: int, group: int, max_new: int, tag: str) -> dict:
    """`steps` GRPO steps (real HF generation, sqlite env, state_diff reward) with max_staleness
    `staleness` (0 = rollout and training alternate; 1 = the next step's rollouts overlap training)."""
    from toolkit.train import grpo as G

    cfg = {"use_cpu": True, "learning_rate": 1e-3, "max_new_tokens": max_new, "max_turns": 2, "tool_schema": "compact",
           "system_prompt": "drop", "num_generations": group, "tasks_per_step": len(recs), "max_steps": steps,
           "variant": "grpo", "temperature": 1.0, "max_staleness": staleness, "strict_tool_calls": True}
    run = G.GRPORun(cfg, recs, model, str(tmp / f"async-{tag}"))
    t0 = time.perf_counter()
    run.train()
    dt = time.perf_counter() - t0
    h = run.history
    isr = [m["importance_sampling_ratio_mean"] for m in h if "importance_sampling_ratio_mean" in m]
    return {"steps": len(h), "seconds": round(dt, 3), "steps_per_s": round(len(h) / dt, 3),
            "staleness": [m.get("staleness") for m in h], "rollout_wait_s": [m.get("rollout_wait_s") for m in h],
            "reward_mean": round(sum(m["reward_mean"] for m in h) / len(h), 3),
            "importance_sampling_ratio_mean": round(sum(isr) / len(isr), 4) if isr else None}


def async_vs_sync(model: str, recs, tmp: Path, a) -> dict:
    runs: dict[str, list] = {"sync": [], "async": []}
    for i in range(a.repeats):  # interleaved, median
        runs["sync"].append(train_steps(model, recs, tmp, a.async_steps, 0, a.group, a.max_new_tokens, f"s{i}"))
        runs["async"].append(train_steps(model, recs, tmp, a.async_steps, 1, a.group, a.max_new_tokens, f"a{i}"))
    out = {}
    for k, v in runs.items():
        v.sort(key=lambda r: r["steps_per_s"])
        out[k] = {**v[len(v) // 2], "steps_per_s_all": [r["steps_per_s"] for r in v]}
    out["ratio_steps_per_s_async_vs_sync"] = round(out["async"]["steps_per_s"] / out["sync"]["steps_per_s"], 2)
    return out


def demo(tmp: Path, n_tasks: int, sft_steps: int, grpo_steps: int) -> None:
    from toolkit.train import grpo as G

    recs = tasks(tmp, n_tasks)
    model = warm_model(tmp, recs, sft_steps)
    cfg = {"use_cpu": True, "learning_rate": 2e-3, "max_new_tokens": 40, "max_turns": 2, "tool_schema": "compact",
           "system_prompt": "drop", "num_generations": 8, "tasks_per_step": n_tasks, "max_steps": grpo_steps,
           "variant": "eigendata", "temperature": 1.0}
    res = G.GRPORun(cfg, recs, model, str(tmp / "grpo")).train()
    print(json.dumps(res))
    with open(tmp / "grpo" / "metrics.jsonl") as f:
        for line in f:
            m = json.loads(line)
            print(f"step {m['step']:3d}  reward {m['reward_mean']:.3f}  groups {m['groups_trained']}/{m['groups']}  "
                  f"format errors {m['format_errors']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the median is reported")
    ap.add_argument("--demo", action="store_true", help="sft then grpo on the tiny model; print reward per step")
    ap.add_argument("--grpo-steps", type=int, default=30)
    ap.add_argument("--async-steps", type=int, default=6, help="GRPO steps per async-vs-sync measurement (0 = skip)")
    ap.add_argument("--async-only", action="store_true", help="only the async vs sync comparison")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if a.demo:
            demo(tmp, min(a.tasks, 4), a.sft_steps, a.grpo_steps)
            return
        recs = tasks(tmp, a.tasks)
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its logs on stdout
            model = warm_model(tmp, recs, a.sft_steps)
        res = {"config": {"tasks": a.tasks, "group": a.group, "max_new_tokens_per_turn": a.max_new_tokens,
                          "rounds": a.rounds, "threads": torch.get_num_threads(), "repeats": a.repeats}}
        if a.async_steps:
            with contextlib.redirect_stdout(sys.stderr):
                res["async_vs_sync"] = async_vs_sync(model, recs[: max(2, a.tasks // 2)], tmp, a)
        if a.async_only:
            print(json.dumps(res, indent=2))
            return
        runs: dict[str, list] = {"toolkit_batched": [], "trl_tool_loop": []}
        for _ in range(a.repeats):  # interleaved, median: the machine may be shared
            runs["toolkit_batched"].append(ours(model, recs, tmp, a.group, a.max_new_tokens, a.rounds, batched=True))
            runs["trl_tool_loop"].append(trl_loop(model, recs, tmp, a.group, a.max_new_tokens, a.rounds))
        for k, v in runs.items():
            v.sort(key=lambda r: r["episodes_per_s"])
            res[k] = {**v[len(v) // 2], "episodes_per_s_all": [r["episodes_per_s"] for r in v]}
        res["toolkit_unbatched"] = ours(model, recs, tmp, a.group, a.max_new_tokens, 1, batched=False)
        b, t = res["toolkit_batched"], res["trl_tool_loop"]
        res["ratio_episodes_per_s_toolkit_vs_trl"] = round(b["episodes_per_s"] / t["episodes_per_s"], 2)
        res["ratio_tokens_per_s_toolkit_vs_trl"] = round(b["gen_tokens_per_s"] / max(1e-9, t["gen_tokens_per_s"]), 2)
        print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
