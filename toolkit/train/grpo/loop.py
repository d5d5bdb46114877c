"""The GRPO training loop: task stream, rollout rounds, filtering, optimizer steps, checkpoints."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from dataclasses import asdict
from typing import Any

from toolkit.io import log
from toolkit.schema import Record
from toolkit.train import advantages as ADV
from toolkit.train.grpo.episodes import Rollouts
from toolkit.train.grpo.generators import HFGenerator, VLLMGenerator
from toolkit.train.grpo.loss import compute_old_logps, policy_loss, sequence_advantages
from toolkit.train.grpo.options import GRPOOptions

# ----------------------------------------------------------------------------------------------
# the trainer


def _task_stream(records: list[Record], seed: int):
    rng = random.Random(seed)
    while True:
        order = list(records)
        rng.shuffle(order)
        yield from order


class GRPORun:
    def __init__(self, cfg: dict, records: list[Record], model_path: str, out_dir: str, generator=None):
        import torch
        from accelerate import Accelerator
        from transformers import AutoModelForCausalLM

        from toolkit.stages import make_meter
        from toolkit.train.sft import apply_template, cpu_defaults, lora_config

        self.cfg, self.records, self.out_dir = cfg, records, out_dir
        self.opts = GRPOOptions.from_config(cfg)
        o = self.opts
        torch.manual_seed(o.seed)
        use_cpu = bool(cfg.get("use_cpu", cpu_defaults().get("use_cpu", False)))
        acc_kw = dict(cfg.get("accelerator") or {})
        self.acc = Accelerator(cpu=use_cpu, **acc_kw)
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_path)
        apply_template(self.tok, cfg.get("chat_template"))
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32 if use_cpu else "auto")
        lc = lora_config(cfg)
        if lc is not None:
            from peft import get_peft_model

            self.model = get_peft_model(self.model, lc)
        self.ref = None
        if o.beta:
            if lc is not None:
                self.ref = None  # adapters disabled = reference (see _ref_ctx)
            else:
                self.ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.model.dtype).eval()
                for p in self.ref.parameters():
                    p.requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(params, lr=o.learning_rate, weight_decay=o.weight_decay)
        from transformers import get_scheduler

        self.sched = get_scheduler(o.lr_scheduler_type, self.optim,
                                   num_warmup_steps=int(o.warmup_ratio * o.max_steps), num_training_steps=o.max_steps)
        self.model, self.optim, self.sched = self.acc.prepare(self.model, self.optim, self.sched)
        if self.ref is not None:
            self.ref = self.ref.to(self.acc.device)
        self.unwrapped = self.acc.unwrap_model(self.model)
        if generator is not None:  # a factory (model, tokenizer) -> generator (tests, custom backends)
            self.generator = generator(self.unwrapped, self.tok)
        elif o.generation == "vllm":
            self.generator = VLLMGenerator(self.unwrapped, self.tok, o, is_main=self.acc.is_main_process)
        else:
            self.generator = HFGenerator(self.unwrapped, self.tok, o.temperature, o.top_p, seed=o.seed)
        self.meter = make_meter()
        self.rollouts = Rollouts(cfg, o, self.tok, self.generator, self.meter)
        self.batcher = ADV.AdaptiveBatcher(o.tasks_per_step, o.delta) if o.filter == "adaptive" else None
        self.step = 0
        # each process rolls out its own shard of the tasks
        shard = [r for i, r in enumerate(records) if i % self.acc.num_processes == self.acc.process_index] or records
        self.tasks = _task_stream(shard, o.seed + self.acc.process_index)
        os.makedirs(out_dir, exist_ok=True)
        self.metrics_path = os.path.join(out_dir, "metrics.jsonl")
        self.rollouts_path = cfg.get("rollouts")

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, final: bool = False) -> str:
        path = self.out_dir if final else os.path.join(self.out_dir, f"checkpoint-{self.step}")
        self.acc.wait_for_everyone()
        if not final:
            self.acc.save_state(os.path.join(path, "accelerate"))
        if self.acc.is_main_process:
            self.unwrapped.save_pretrained(path)
            self.tok.save_pretrained(path)
            with open(os.path.join(path, "trainer_state.json"), "w") as f:
                json.dump({"step": self.step, "options": asdict(self.opts)}, f, indent=2, default=str)
        return path

    def resume(self, spec: Any) -> str | None:
        if spec in (None, False, "", "no"):
            return None
        path = spec
        if spec in (True, "auto", "last", "latest"):
            cks = sorted((d for d in os.listdir(self.out_dir) if d.startswith("checkpoint-")),
                         key=lambda d: int(d.split("-")[1])) if os.path.isdir(self.out_dir) else []
            if not cks:
                log(f"grpo: no checkpoint in {self.out_dir}; starting fresh")
                return None
            path = os.path.join(self.out_dir, cks[-1])
        self.acc.load_state(os.path.join(path, "accelerate"))
        with open(os.path.join(path, "trainer_state.json")) as f:
            self.step = int(json.load(f)["step"])
        for _ in range(self.step * self.opts.tasks_per_step):  # same task order as an uninterrupted run
            next(self.tasks)
        return path

    # -- one step ------------------------------------------------------------------------------
    async def _rollout_round(self) -> tuple[list[ADV.Group], list[Record]]:
        recs = [next(self.tasks) for _ in range(self.opts.tasks_per_step)]
        res = await asyncio.gather(*(self.rollouts.group(r, self.step) for r in recs))
        return [g for g, _ in res], [r for _, r in res]

    def _ref_ctx(self):
        import contextlib

        if self.opts.beta and self.ref is None and hasattr(self.unwrapped, "disable_adapter"):
            return self.unwrapped.disable_adapter()
        return contextlib.nullcontext()

    async def train_step(self) -> dict:
        o = self.opts
        t0 = time.time()
        g0 = (self.generator.generated_tokens, self.generator.seconds)
        all_groups: list[ADV.Group] = []
        scored: list[Record] = []
        batch: list[ADV.Group] | None = None
        fill = {"rounds": 0, "from_buffer": 0, "overflow": 0}
        while True:
            groups, recs = await self._rollout_round()
            fill["rounds"] += 1
            all_groups += groups
            scored += recs
            if o.filter == "none":
                batch = groups
                break
            if o.filter == "dynamic":
                batch, _ = ADV.dynamic_filter(groups, o.delta)
                break
            batch, st = self.batcher.offer(groups)
            fill["from_buffer"] += st["from_buffer"]
            fill["overflow"] += st["overflow"]
            if batch is not None or fill["rounds"] >= o.max_fill_rounds:
                break
        t_roll = time.time() - t0
        if self.rollouts_path and self.acc.is_main_process:
            with open(self.rollouts_path, "a", encoding="utf-8") as f:
                for r in scored:
                    r.extra = {**r.extra, "grpo_step": self.step}
                    f.write(r.model_dump_json(by_alias=True) + "\n")
        t1 = time.time()
        train_stats = {"loss": 0.0, "kl": 0.0, "clipped": 0, "tokens": 0}
        trained = bool(batch)
        if batch:
            items = sequence_advantages(batch, o)
            items = [it for it in items if it[0].policy_tokens > 0]
            if items:
                self.model.train()
                old = compute_old_logps(self.unwrapped, items, o) if o.num_iterations > 1 else None
                for _ in range(max(1, o.num_iterations)):
                    self.optim.zero_grad(set_to_none=True)
                    if self.ref is None and o.beta:
                        ref_model = _AdapterOff(self.unwrapped)
                    else:
                        ref_model = self.ref
                    st = policy_loss(self.model, ref_model, items, o, self.acc.backward, old)
                    if o.max_grad_norm:
                        self.acc.clip_grad_norm_(self.model.parameters(), o.max_grad_norm)
                    self.optim.step()
                    for k in train_stats:
                        train_stats[k] += st[k]
                self.sched.step()
                self.acc.wait_for_everyone()
                self.generator.sync_weights()
            else:
                trained = False
        self.step += 1
        eps = [e for g in all_groups for e in g.items]
        rewards = [e.reward for e in eps]
        mu = sum(rewards) / len(rewards) if rewards else 0.0
        gen_tok = self.generator.generated_tokens - g0[0]
        gen_s = self.generator.seconds - g0[1]
        terms: dict[str, int] = {}
        for e in eps:
            terms[e.traj.termination or "none"] = terms.get(e.traj.termination or "none", 0) + 1
        n_groups = len(all_groups)
        rec = {
            "step": self.step, "variant": o.variant, "reward_mean": mu,
            "reward_std": math.sqrt(sum((r - mu) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0,
            "success_rate": sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0,
            "groups": n_groups, "groups_trained": len(batch or []),
            "filtered_fraction": (sum(1 for g in all_groups if g.std <= o.delta) / n_groups) if (n_groups and o.filter != "none") else 0.0,
            "buffer": len(self.batcher.buffer) if self.batcher else 0, "fill_rounds": fill["rounds"],
            "from_buffer": fill["from_buffer"], "episodes": len(eps),
            "turns_mean": sum(len(e.calls_per_turn) for e in eps) / len(eps) if eps else 0.0,
            "tool_calls": sum(1 for e in eps for s in e.traj.steps if s.side == "agent"),
            "tool_errors": sum(1 for e in eps for s in e.traj.steps if s.side == "agent" and not s.ok),
            "format_errors": sum(e.format_errors for e in eps),
            "policy_tokens": sum(e.policy_tokens for e in eps), "generated_tokens": gen_tok,
            "gen_tokens_per_s": gen_tok / gen_s if gen_s > 0 else None,
            "rollout_s": round(t_roll, 3), "train_s": round(time.time() - t1, 3), "trained": trained,
            "loss": train_stats["loss"], "kl": train_stats["kl"] / max(1, train_stats["tokens"]),
            "clip_fraction": train_stats["clipped"] / max(1, train_stats["tokens"]),
            "trained_tokens_per_s": train_stats["tokens"] / max(1e-9, time.time() - t1) if trained else None,
            "terminations": terms, "lr": self.sched.get_last_lr()[0],
        }
        if o.log_completions and eps:
            rec["sample"] = self.tok.decode([t for t, m in zip(eps[0].ids, eps[0].mask) if m])[:500]
        if self.acc.is_main_process:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, default=float) + "\n")
        return rec

    def train(self) -> dict:
        o = self.opts
        resumed = self.resume(self.cfg.get("resume_from_checkpoint"))
        t0 = time.time()
        history = []

        async def loop():
            while self.step < o.max_steps:
                rec = await self.train_step()
                history.append(rec)
                log(f"grpo step {rec['step']}/{o.max_steps}: reward {rec['reward_mean']:.3f}±{rec['reward_std']:.3f} "
                    f"groups {rec['groups_trained']}/{rec['groups']} buffer {rec['buffer']} "
                    f"turns {rec['turns_mean']:.1f} tool errors {rec['tool_errors']} loss {rec['loss']:.4f}")
                if o.save_steps and (self.step % o.save_steps == 0 or self.step == o.max_steps):
                    self.save()

        asyncio.run(loop())
        self.save(final=True)
        return {"steps": self.step, "resumed_from": resumed, "seconds": round(time.time() - t0, 2),
                "reward_first": history[0]["reward_mean"] if history else None,
                "reward_last": history[-1]["reward_mean"] if history else None, "output_dir": self.out_dir}


class _AdapterOff:
    """Reference model for LoRA runs: the same network with adapters disabled."""

    def __init__(self, peft_model):
        self.m = peft_model

    def __call__(self, **kw):
        with self.m.disable_adapter():
            return self.m(**kw)
