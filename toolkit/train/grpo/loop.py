"""`GRPORun`: builds the `GRPOConfig`, the task stream, the generator and `ToolkitGRPOTrainer`, and
runs it (resume included). The training loop itself is TRL's (see `trainer.py`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import random
import sys
import time
from collections.abc import Mapping
from typing import Any

from toolkit.io import UsageError, log
from toolkit.options import GRPOCommandOptions
from toolkit.stages import make_meter
from toolkit.schema import Record
from toolkit.train import advantages as ADV
from toolkit.train.grpo.batch import Selection, Selector
from toolkit.train.grpo.episodes import Rollouts
from toolkit.train.grpo.generators import (
    HFGenerator,
    LlamaCppGenerator,
    ScriptedGenerator,
    TRLVLLMGenerator,
    reloadable_cpu_weights,
)
from toolkit.train.grpo.options import GRPOOptions
from toolkit.train.sft import apply_template, cpu_defaults, lora_config, model_dtype, resolve_resume

# GRPOOptions fields that are ours (never forwarded to GRPOConfig under the same name)
_TRL_MAP = {"learning_rate", "lr_scheduler_type", "weight_decay", "max_grad_norm", "seed",
            "temperature", "top_p", "num_iterations", "beta", "epsilon", "epsilon_high", "report_to",
            "gradient_accumulation_steps"}


def _task_stream(records: list[Record], seed: int):
    rng = random.Random(seed)
    while True:
        order = list(records)
        rng.shuffle(order)
        yield from order


def grpo_config(copts: GRPOCommandOptions, o: GRPOOptions, out_dir: str):
    """The `trl.GRPOConfig` of a run: our options mapped onto its fields, CPU defaults, and any
    field of the recipe's `trl:` mapping (deepspeed, fsdp, ds3_gather_for_generation, bf16, ...)."""
    from trl import GRPOConfig

    cpu = cpu_defaults()
    if copts.use_cpu:
        cpu = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "dataloader_pin_memory": False}
    ga = int(o.gradient_accumulation_steps)
    kw: dict[str, Any] = {
        "output_dir": out_dir, "max_steps": o.max_steps, "logging_steps": 1, "save_strategy": "steps" if o.save_steps else "no",
        "save_steps": o.save_steps or 500, "per_device_train_batch_size": o.num_generations,
        "num_generations": o.num_generations, "steps_per_generation": ga, "max_completion_length": o.max_total_tokens,
        "loss_type": "bnpo", "log_completions": False, "disable_tqdm": True, "use_vllm": o.generation == "vllm",
        "vllm_mode": o.vllm_mode, "vllm_server_host": o.vllm_server_host, "vllm_server_port": o.vllm_server_port,
        "vllm_server_timeout": o.vllm_server_timeout, "vllm_importance_sampling_correction": False,
        "epsilon_high": o.eps_high, "top_k": 0, "warmup_steps": int(o.warmup_ratio * o.max_steps), "dataloader_num_workers": 0, "save_only_model": False,
        **cpu,
    }
    for k in _TRL_MAP:
        v = getattr(o, k)
        if v is not None:
            kw[k] = v
    if o.gradient_checkpointing is not None:
        kw["gradient_checkpointing"] = o.gradient_checkpointing
    extra = o.trl or {}
    names = set(GRPOConfig.__dataclass_fields__)
    bad = [k for k in extra if k not in names]
    if bad:
        raise UsageError(f"grpo: unknown trl: key(s) {', '.join(sorted(bad))} (fields of trl.GRPOConfig)")
    kw.update(extra)
    return GRPOConfig(**kw)


def verify_reward(*_, **__):
    """Placeholder for GRPOTrainer's reward slot: rewards come from verify inside the episode engine
    (`Rollouts.group`), and `_calculate_rewards` is never reached."""
    raise RuntimeError("grpo rewards come from verify in the generation step")


class GRPORun:
    def __init__(self, opts: GRPOCommandOptions | Mapping, records: list[Record], model_path: str, out_dir: str,
                 generator=None):
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from toolkit.train.grpo.trainer import ToolkitGRPOTrainer

        self.copts = copts = GRPOCommandOptions.typed(opts)  # the command's options (a mapping: library use)
        self.records, self.out_dir = records, out_dir
        self.opts = o = GRPOOptions.from_config(copts)
        os.makedirs(out_dir, exist_ok=True)
        self.tok = AutoTokenizer.from_pretrained(model_path)
        apply_template(self.tok, copts.chat_template)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        args = grpo_config(copts, o, out_dir)
        if o.generation == "vllm" and o.vllm_mode == "colocate" and not torch.cuda.is_available():
            # vLLM's CPU build would reserve TRL's vllm_gpu_memory_utilization (0.9) of the machine's RAM
            # for its KV cache, and refuse to start when less is free: give it an explicit size (GiB)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            reloadable_cpu_weights()  # TRL's weight sync writes into the layers vLLM computes from
        # model_dtype float32 with `trl: {bf16: true}`: fp32 weights and optimizer, bf16 autocast (as sft)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=model_dtype(copts.model_dtype, args))
        # the dataloader only paces TRL's loop; tasks come from our own seeded stream (exact resume)
        n_rows = max(8, len(records)) * args.world_size * o.gradient_accumulation_steps
        ds = Dataset.from_dict({"prompt": [str(i) for i in range(n_rows)]})
        self.trainer = ToolkitGRPOTrainer(model=model, reward_funcs=[verify_reward], args=args, train_dataset=ds,
                                          processing_class=self.tok, peft_config=lora_config(copts.lora), run=self)
        acc = self.trainer.accelerator
        self.unwrapped = self.trainer.model
        # fp32 weights under bf16 mixed precision: generation autocasts too (training's forward does)
        self.gen_autocast = torch.bfloat16 if args.bf16 and model.dtype == torch.float32 else None
        self.uses_policy_weights = False
        if generator is not None:  # a factory (model, tokenizer) -> generator (tests, custom backends)
            self.generator = generator(self.unwrapped, self.tok)
        elif o.generation == "scripted":
            with open(o.scripted_completions, encoding="utf-8") as f:
                self.generator = ScriptedGenerator(self.tok, json.load(f))
        elif o.generation == "vllm":
            self.generator = TRLVLLMGenerator(self.trainer.vllm_generation, o)
        elif o.generation == "llamacpp":
            if copts.lora:
                raise UsageError("grpo: generation llamacpp exports the full weights; with lora use generation "
                                 "transformers")
            self.generator = LlamaCppGenerator(self.tok, model_path, o.temperature, o.top_p,
                                               seed=o.seed + acc.process_index, n_ctx=o.max_total_tokens + 64)
        else:
            self.generator = HFGenerator(self.unwrapped, self.tok, o.temperature, o.top_p, seed=o.seed + acc.process_index,
                                         autocast=self.gen_autocast, shared_prefix=o.shared_prefix is not False)
            self.uses_policy_weights = True
        self.meter = make_meter()
        self.rollouts = Rollouts(copts, o, self.tok, self.generator, self.meter)
        self.batcher = ADV.AdaptiveBatcher(o.tasks_per_step, o.delta) if o.filter == "adaptive" else None
        self.selector = Selector(o, self.batcher)
        self.stream = _task_stream(records, o.seed)  # the same global order on every rank
        self.drawn = 0
        self.empty_steps = 0
        self.fill_bound_hits = 0
        self.history: list[dict] = []
        self.metrics_path = os.path.join(out_dir, "metrics.jsonl")
        self.rollouts_path = copts.rollouts
        self._setup_async(args, generator)

    # -- asynchronous rollouts -------------------------------------------------------------------
    def _setup_async(self, args, factory) -> None:
        """max_staleness > 0: one background thread rolls out the next steps' first rounds with a
        behaviour copy of the weights (transformers), or on the vLLM server, while TRL trains."""
        import copy
        from concurrent.futures import ThreadPoolExecutor

        o = self.opts
        self.pool, self.prefetch, self.behaviour = None, [], None
        if not o.max_staleness:
            return
        if self.uses_policy_weights and (args.deepspeed or args.fsdp):
            raise UsageError("grpo: max_staleness > 0 with generation transformers keeps a full copy of the weights; "
                             "under DeepSpeed / FSDP use generation vllm (server) or max_staleness 0")
        if factory is not None:
            gen = factory(self.unwrapped, self.tok)
        elif self.opts.generation == "scripted":
            gen = self.generator
        elif self.opts.generation == "vllm":
            gen = TRLVLLMGenerator(self.trainer.vllm_generation, o)
        else:
            self.behaviour = copy.deepcopy(self.unwrapped).eval()
            # TRL patches `forward` with a fused-LM-head wrapper whose closure calls the ORIGINAL model's
            # forward; a deep copy keeps that closure, so the copy would sample from the live training
            # weights. Drop the patch: the copy runs its class forward on its own weights.
            for m in self.behaviour.modules():
                fwd = m.__dict__.get("forward")
                code = getattr(getattr(fwd, "__func__", None), "__code__", None)
                if code is not None and code.co_name == "_fused_forward":
                    del m.__dict__["forward"]
            for p in self.behaviour.parameters():
                p.requires_grad_(False)
            gen = HFGenerator(self.behaviour, self.tok, o.temperature, o.top_p,
                              seed=o.seed + 1000 + self.acc.process_index, record_logps=True,
                              autocast=self.gen_autocast, shared_prefix=o.shared_prefix is not False)
        self.behaviour_generator = gen
        self.rollouts_async = Rollouts(self.copts, o, self.tok, gen, self.meter)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-rollouts")

    def behaviour_snapshot(self):
        """The weights a prefetched round will sample from (copied now, loaded when it starts)."""
        if self.behaviour is None:
            return None
        return {k: v.detach().clone() for k, v in self.unwrapped.state_dict().items()}

    def behaviour_rollouts(self, mine: list, step: int, snapshot, run_local):
        if snapshot is not None:
            self.behaviour.load_state_dict(snapshot)
        return run_local(mine, step, self.rollouts_async)

    def gen_counters(self) -> tuple[int, float]:
        gens = [self.generator] + ([self.behaviour_generator] if self.pool is not None else [])
        gens = list({id(g): g for g in gens}.values())
        return sum(g.generated_tokens for g in gens), sum(g.seconds for g in gens)

    def shutdown(self) -> None:
        close = getattr(self.generator, "close", None)
        if close is not None:
            close()
        if self.pool is not None:
            for *_, fut, _v in self.prefetch:
                fut.cancel()
            self.pool.shutdown(wait=True)
            self.pool, self.prefetch = None, []

    @property
    def ref(self):
        return self.trainer.ref_model

    @property
    def acc(self):
        return self.trainer.accelerator

    def next_task(self) -> Record:
        self.drawn += 1
        return next(self.stream)

    # -- state in checkpoints --------------------------------------------------------------------
    def save_state(self, path: str, rank: int, is_main: bool) -> None:
        from toolkit.train.grpo.trainer import STATE_FILE

        if is_main:
            in_flight = self.opts.tasks_per_step * len(self.prefetch)  # redrawn on resume (first step synchronous)
            with open(os.path.join(path, STATE_FILE), "wb") as f:
                pickle.dump({"drawn": self.drawn - in_flight, "buffer": self.batcher.buffer if self.batcher else [],
                             "empty_steps": self.empty_steps, "fill_bound_hits": self.fill_bound_hits}, f)
        gen = getattr(self.generator, "gen", None)
        with open(os.path.join(path, f"toolkit_grpo_rank{rank}.pkl"), "wb") as f:
            pickle.dump({"generator_rng": gen.get_state() if gen is not None else None}, f)

    def restore_state(self, path: str) -> None:
        from toolkit.train.grpo.trainer import load_state

        st = load_state(path, self.acc.process_index)
        if st is None:
            log(f"grpo: {path} has no toolkit state; task order and buffer start fresh")
            return
        self.stream = _task_stream(self.records, self.opts.seed)
        self.drawn = 0
        for _ in range(st["drawn"]):
            self.next_task()
        if self.batcher is not None:
            self.batcher.buffer = list(st["buffer"])
        self.empty_steps, self.fill_bound_hits = st["empty_steps"], st["fill_bound_hits"]
        rng = (st.get("rank") or {}).get("generator_rng")
        if rng is not None and getattr(self.generator, "gen", None) is not None:
            self.generator.gen.set_state(rng)

    # -- metrics ---------------------------------------------------------------------------------
    def step_record(self, sel: Selection, step: int, rows: int, t_roll: float, per_rank: dict, gen_tokens: int,
                    gen_s: float, pad: int) -> dict:
        o = self.opts
        eps = [e for g in sel.groups_seen for e in g.items]
        rewards = [e.reward for e in eps]
        mu = sum(rewards) / len(rewards) if rewards else 0.0
        terms: dict[str, int] = {}
        for e in eps:
            terms[e.traj.termination or "none"] = terms.get(e.traj.termination or "none", 0) + 1
        n_groups = len(sel.groups_seen)
        empty = not rows
        if empty:
            self.empty_steps += 1
        if sel.bound_hit:
            self.fill_bound_hits += 1
        return {
            "step": step, "variant": o.variant, "reward_mean": mu,
            "reward_std": math.sqrt(sum((r - mu) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0,
            "success_rate": sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0,
            "groups": n_groups, "groups_trained": len(sel.batch), "sequences_trained": rows,
            "filtered_fraction": ((sel.invalid + sel.forced_filtered) / n_groups) if n_groups else 0.0,
            "forced_filtered": sel.forced_filtered,
            "buffer": len(self.batcher.buffer) if self.batcher else 0, "fill_rounds": sel.rounds,
            "from_buffer": sel.from_buffer, "overflow": sel.overflow, "fill_bound_hit": sel.bound_hit,
            "fill_bound_hits": self.fill_bound_hits, "trained": not empty, "empty_steps": self.empty_steps,
            "episodes": len(eps), "episodes_per_rank": {str(k): v for k, v in sorted(per_rank.items())},
            "turns_mean": sum(len(e.calls_per_turn) for e in eps) / len(eps) if eps else 0.0,
            "tool_calls": sum(1 for e in eps for s in e.traj.steps if s.side == "agent"),
            "tool_errors": sum(1 for e in eps for s in e.traj.steps if s.side == "agent" and not s.ok),
            "format_errors": sum(e.format_errors for e in eps),
            "policy_tokens": sum(e.policy_tokens for e in eps), "generated_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / gen_s if gen_s > 0 else None, "rollout_s": round(t_roll, 3),
            "padding_rows": pad, "terminations": terms, "tasks_drawn": self.drawn,
            **({"sample": self.tok.decode([t for t, m in zip(eps[0].ids, eps[0].mask) if m])[:500]}
               if o.log_completions and eps else {}),
        }

    # -- run -------------------------------------------------------------------------------------
    def train(self) -> dict:
        t0 = time.time()
        resume = resolve_resume(self.copts.resume_from_checkpoint, self.out_dir)
        if resume:
            self.restore_state(resume)
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout is for records only
                self.trainer.train(resume_from_checkpoint=resume or None)
                self.trainer.save_model(self.out_dir)
        finally:
            self.shutdown()
        if self.acc.is_main_process:
            self.tok.save_pretrained(self.out_dir)
        res = {"steps": self.trainer.state.global_step, "resumed_from": resume or None,
               "seconds": round(time.time() - t0, 2),
               "reward_first": self.history[0].get("reward_mean") if self.history else None,
               "reward_last": self.history[-1].get("reward_mean") if self.history else None,
               "empty_steps": self.empty_steps, "fill_bound_hits": self.fill_bound_hits, "output_dir": self.out_dir}
        if self.acc.is_main_process:
            with open(os.path.join(self.out_dir, "run.json"), "w", encoding="utf-8") as f:
                json.dump({"result": res, "options": self.opts.model_dump(mode="json")}, f, indent=2, default=str)
        return res
