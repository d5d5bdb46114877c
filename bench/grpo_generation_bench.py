"""GRPO's generation backends on the CPU, same model, same prompts, same run: HF `generate` on the
training model (`generation: transformers`, concurrent requests batched over their shared prefix)
against llama.cpp on a GGUF of the live weights (`generation: llamacpp`, one request at a time,
prefix kept in its KV cache, the export timed separately).

    python bench/grpo_generation_bench.py [--model CKPT] [--tasks 2] [--group 4] [--new 64] [--threads 2]

Model: a llama checkpoint (default: SmolLM2-135M-Instruct, `toolkit models materialize`). Prompts:
the first agent turn of `--tasks` airline tasks (the toolkit chat template, `minimal` tool schemas,
no system prompt: the learn recipe's CPU rendering), each repeated `--group` times (a GRPO group).
Sampling at T 1.0 with at most `--new` tokens per request. Prints one JSON line: seconds and tokens
per backend, seconds per generated token, and the ratio (HF / llama.cpp).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit import domains
    from toolkit.envs import load_env
    from toolkit.formats.tools import prepare_tools
    from toolkit.llm.models import materialize
    from toolkit.schema import Record
    from toolkit.train.grpo.generators import HFGenerator, LlamaCppGenerator
    from toolkit.train.sft import apply_template

    torch.set_num_threads(a.threads)
    ck = a.model or materialize("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(ck)
    apply_template(tok, "toolkit")
    model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
    prompts = []
    for t in domains.load_tasks("airline")[: a.tasks]:
        rec = Record.model_validate(t)
        tools = prepare_tools(load_env(rec.env).tools(), "minimal")
        text = tok.apply_chat_template([{"role": "user", "content": rec.task.instruction}], tools=tools,
                                       tokenize=False, add_generation_prompt=True)
        prompts += [tok(text, add_special_tokens=False)["input_ids"]] * a.group

    async def run(g):
        return await asyncio.gather(*(g.generate(p, a.new) for p in prompts))

    out: dict = {"model": ck, "requests": len(prompts), "prompt_tokens": [len(p) for p in prompts[:: a.group]],
                 "max_new_tokens": a.new, "threads": a.threads}
    g = LlamaCppGenerator(tok, ck, temperature=1.0, seed=0, n_ctx=max(map(len, prompts)) + a.new + 8,
                          threads=a.threads)
    try:
        t = time.time()
        g.load_weights(model, 0)
        out["llamacpp_first_export_s"] = round(time.time() - t, 2)
        t = time.time()
        g.load_weights(model, 1)  # a later step: the template's metadata is cached
        out["llamacpp_export_s"] = round(time.time() - t, 2)
        t = time.time()
        res = asyncio.run(run(g))
        out["llamacpp_s"] = round(time.time() - t, 2)
        out["llamacpp_tokens"] = sum(map(len, res))
    finally:
        g.close()
    h = HFGenerator(model, tok, 1.0, seed=0)
    t = time.time()
    res = asyncio.run(run(h))
    out["hf_s"] = round(time.time() - t, 2)
    out["hf_tokens"] = sum(map(len, res))
    out["hf_s_per_token"] = round(out["hf_s"] / max(1, out["hf_tokens"]), 4)
    out["llamacpp_s_per_token"] = round(out["llamacpp_s"] / max(1, out["llamacpp_tokens"]), 4)
    out["ratio_s_per_token_hf_vs_llamacpp"] = round(out["hf_s_per_token"] / max(1e-9, out["llamacpp_s_per_token"]), 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
