"""`ToolkitGRPOTrainer`: `trl.GRPOTrainer` with our episode engine and our advantages.

What comes from TRL / transformers / accelerate unchanged: the training loop (optimizer, scheduler,
clipping, gradient accumulation, DDP / DeepSpeed / FSDP wrapping), `_prepare_inputs` (the generation
buffer reused `num_iterations` times and split into `steps_per_generation` slices), the fused
log-prob forward `_get_per_token_logps_and_entropies`, the reference model (a frozen copy, or the
LoRA base with adapters disabled), vLLM server / colocate setup and weight sync
(`VLLMGeneration.sync_weights`, ZeRO-3 / FSDP gathers included), gradient checkpointing, `report_to`
trackers, checkpoints and resume.

What we override, and why:
- `_generate_and_score_completions`: the generation step. Instead of TRL's single-prompt tool loop,
  each rank runs its share of the step's tasks through rollout's `run_episode` (environment, user
  simulator, policy as agent), verify scores the groups, the groups are GATHERED from every rank
  and `batch.Selector` decides the batch on the gathered data (filtering, ASTRA filling with its
  buffer, refill rounds) identically everywhere; rows are split round robin and padded with
  zero-weight rows so every rank runs the same passes.
- `_compute_loss`: the clipped surrogate with per-token advantages and the GLOBAL per-token
  weights of our loss normalizations (grpo, bnpo/dapo, group_token, dr_grpo, turn), which are not
  all among TRL's `loss_type`s and must be computed over the gathered batch.
- `training_step` (metrics.jsonl line per optimizer step, gathered) and `_save_checkpoint` (the
  ASTRA buffer, the task-stream position and the sampler RNG go into the checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import time
import types

try:  # the train extra; this module is imported only when `grpo` trains (toolkit.train.grpo.loop)
    import torch
    from trl import GRPOTrainer
except ModuleNotFoundError as e:  # say which extra, keep the missing module's name
    raise ModuleNotFoundError(f"grpo's trainer needs the train extra (pip install 'tooluse-toolkit[train]'): {e}",
                              name=e.name) from e

from toolkit import aio
from toolkit.train.grpo import batch as B
from toolkit.train.prefix import prefix_len, shared_forward

STATE_FILE = "toolkit_grpo_state.pkl"
# rows whose loss has an exactly zero gradient skip the model's forward (ToolkitGRPOTrainer._zero_gradient)
SKIP_ZERO_ADVANTAGE = True


class ToolkitGRPOTrainer(GRPOTrainer):
    def __init__(self, *a, run=None, **kw):
        super().__init__(*a, **kw)
        self.run = run
        self._stats: dict = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "is_ratio_sum": 0.0}
        self._pending: dict | None = None

    # -- generation step -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _generation_model(self):
        """The policy's weights as a plain module for `generate` (ZeRO-3 gathered / FSDP summoned)."""
        from trl.models.utils import unwrap_model_for_generation

        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs) as m, \
                torch.no_grad(), self._dist.summon_full_params(self.model_wrapped, recurse=False):
            yield m

    def _gather(self, obj: list) -> list:
        if self.accelerator.num_processes == 1:
            return obj
        from accelerate.utils import gather_object

        return gather_object(obj)

    def _draw(self) -> list:
        """The next `tasks_per_step` tasks of the global stream (same on every rank); this rank's share."""
        run, acc = self.run, self.accelerator
        recs = [run.next_task() for _ in range(run.opts.tasks_per_step)]
        return [(j, r) for j, r in enumerate(recs) if j % acc.num_processes == acc.process_index]

    @staticmethod
    def _local_rollouts(mine: list, step: int, rollouts) -> list:
        async def go():
            return await asyncio.gather(*(rollouts.group(r, step) for _, r in mine))

        return aio.run(go())

    def _sync_vllm(self) -> None:
        if self.use_vllm and self.state.global_step != self._last_loaded_step:
            with torch.no_grad():
                self.vllm_generation.sync_weights()  # every rank: ZeRO-3 / FSDP gathers are collective
            self._last_loaded_step = self.state.global_step

    def _finish_round(self, mine: list, res: list) -> tuple:
        """GATHER this rank's groups with every other rank's: (groups, forced flags, scored records) in
        task order, and the episode count per rank."""
        acc = self.accelerator
        forced = B.forced_filter_rank() == acc.process_index
        local = [(j, g, scored, forced, acc.process_index) for (j, _), (g, scored) in zip(mine, res)]
        every = sorted(self._gather(local), key=lambda x: x[0])
        return ([x[1] for x in every], [x[3] for x in every], [x[2] for x in every],
                {x[4]: sum(len(y[1].items) for y in every if y[4] == x[4]) for x in every})

    def _rollout_round(self, step: int) -> tuple:
        """One synchronous round with the current weights."""
        run = self.run
        mine = self._draw()
        self._sync_vllm()
        if run.uses_policy_weights:
            with self._generation_model() as m:
                run.generator.model = m
                res = self._local_rollouts(mine, step, run.rollouts)
        else:
            load = getattr(run.generator, "load_weights", None)
            if load is not None:  # llama.cpp: the current weights exported once per optimizer step
                with self._generation_model() as m:
                    load(m, self.state.global_step)
            res = self._local_rollouts(mine, step, run.rollouts)
        return self._finish_round(mine, res)

    # -- asynchronous rollouts (max_staleness > 0) -----------------------------------------------
    def _first_round(self, step: int) -> tuple:
        """The step's first round: the prefetched one when there is one (generated by weights up to
        max_staleness updates old while earlier steps trained), else a synchronous round."""
        q = self.run.prefetch
        if q and q[0][0] == step:
            _, mine, fut, version = q.pop(0)
            t = time.time()
            res = fut.result()
            self._async_info = {"staleness": self.state.global_step - version, "rollout_wait_s": round(time.time() - t, 3)}
            return self._finish_round(mine, res)
        self._async_info = {"staleness": 0, "rollout_wait_s": None}
        return self._rollout_round(step)

    def _launch_prefetches(self, step: int) -> None:
        """Start the rounds of the next `max_staleness` generation steps in the background thread,
        each from a snapshot of the weights as they are now (the behaviour policy)."""
        run = self.run
        if run.pool is None:
            return
        queued = {g for g, *_ in run.prefetch}
        for k in range(1, run.opts.max_staleness + 1):
            g = step + k * self.num_iterations
            if g >= self.args.max_steps or g in queued:
                continue
            mine = self._draw()
            self._sync_vllm()
            snap = run.behaviour_snapshot()
            fut = run.pool.submit(run.behaviour_rollouts, mine, g, snap, self._local_rollouts)
            run.prefetch.append((g, mine, fut, self.state.global_step))

    def _generate_and_score_completions(self, inputs):
        run, acc = self.run, self.accelerator
        o = run.opts
        t0 = time.time()
        step = self.state.global_step
        g0 = run.gen_counters()
        sel = run.selector.start()
        scored_all, per_rank = [], {}
        first = True
        while True:
            groups, forced, scored, counts = self._first_round(step) if first else self._rollout_round(step)
            first = False
            scored_all += scored
            for k, v in counts.items():
                per_rank[k] = per_rank.get(k, 0) + v
            if run.selector.offer(sel, groups, forced):
                break
        self._launch_prefetches(step)  # after the refill rounds: in-flight tasks are the last drawn
        t_roll = time.time() - t0
        if run.rollouts_path and acc.is_main_process:
            with open(run.rollouts_path, "a", encoding="utf-8") as f:
                for r in scored_all:
                    r.extra = {**r.extra, "grpo_step": step}
                    f.write(r.model_dump_json(by_alias=True) + "\n")
        rows = B.global_rows(sel.batch, o)
        world = acc.num_processes
        mine, pad = B.rank_rows(rows, acc.process_index, world, self.args.steps_per_generation)
        out = B.rows_to_tensors(mine, self._tokenizer.pad_token_id, scale=float(world), device=acc.device)
        self._add_logps(out)
        g1 = run.gen_counters()
        gen_tok = self._gather([g1[0] - g0[0]])
        gen_s = max(self._gather([g1[1] - g0[1]]))
        self._pending = run.step_record(sel, step + 1, rows=len(rows), t_roll=t_roll, per_rank=per_rank,
                                        gen_tokens=sum(gen_tok), gen_s=gen_s, pad=pad)
        self._pending.update(self._async_info)
        self._stats = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "is_ratio_sum": 0.0}
        self._t_train = time.time()
        return out

    @torch.no_grad()
    def _add_logps(self, out: dict) -> None:
        """old (num_iterations > 1, or a behaviour policy other than these weights), reference
        (beta) log-probs and the importance-sampling ratio against the sampler's log-probs."""
        from trl.models.utils import disable_gradient_checkpointing

        ids, att = out["input_ids"], out["attention_mask"]
        T = ids.size(1) - 1
        bs = max(1, int(self.run.opts.micro_batch))
        need_old = self.num_iterations > 1 or "sampling_per_token_logps" in out
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if need_old:
                out["old_per_token_logps"] = self._logps(self.model, ids, att, out["policy_mask"], batch_size=bs)
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref = self._logps(self.ref_model, ids, att, out["policy_mask"], batch_size=bs)
                else:
                    from trl.trainer.utils import use_adapter

                    m = self.accelerator.unwrap_model(self.model)
                    with use_adapter(m, adapter_name="ref" if "ref" in m.peft_config else None):
                        ref = self._get_per_token_logps_and_entropies(self.model, ids, att, T, batch_size=bs)[0]
                out["ref_per_token_logps"] = ref
        if "sampling_per_token_logps" in out and self.run.opts.importance_sampling:
            diff = torch.nan_to_num((out["old_per_token_logps"] - out["sampling_per_token_logps"]) * out["policy_mask"],
                                    nan=0.0)
            out["importance_sampling_ratio"] = torch.clamp(torch.exp(diff), max=float(self.run.opts.importance_sampling_cap))
        out.pop("sampling_per_token_logps", None)

    # -- log-probs: the rows' common prefix forwarded once ----------------------------------------
    def _shared_prefix_ok(self) -> bool:
        """shared_prefix auto: one process, no DeepSpeed / FSDP (they shard or wrap the forward) and no
        gradient checkpointing (its recomputation would append to the prefix's cache twice)."""
        o = self.run.opts
        if o.shared_prefix is False:
            return False
        plain = (self.accelerator.num_processes == 1 and not self.is_deepspeed_enabled and not self.is_fsdp_enabled
                 and not self.args.gradient_checkpointing)
        return plain

    def _logps(self, model, ids, att, pm, batch_size=None):
        """Per-token log-probs aligned with ids[:, 1:] (0 where not needed). Rows of one step share a
        long prefix (system prompt, tool schemas, and within a group the task's first user turn):
        with `shared_prefix` it is forwarded ONCE and its key/value cache (with its graph, so the
        gradient is exact) is repeated for the rows' suffixes, instead of forwarding it per row."""
        P = prefix_len(ids, att, pm) if self._shared_prefix_ok() else 0
        if not P:
            return self._get_per_token_logps_and_entropies(model, ids, att, ids.size(1) - 1, batch_size=batch_size)[0]
        with self.accelerator.autocast():  # positions before P predict context tokens: log-prob 0
            return shared_forward(model, ids, att, ids.masked_fill(att == 0, -100), P).log_probs

    # -- loss ------------------------------------------------------------------------------------
    def _zero_gradient(self, inputs) -> bool:
        """The rows' loss has an exactly zero gradient (all weighted advantages 0, beta 0), in one
        plain process (DDP / DeepSpeed / FSDP expect the forward their backward hooks were set up in)."""
        if not SKIP_ZERO_ADVANTAGE or self.beta or self.accelerator.num_processes != 1:
            return False
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return False
        return not bool(((inputs["advantages"] * inputs["loss_weight"]) != 0).any())

    def _compute_loss(self, model, inputs):
        o = self.run.opts
        ids, att = inputs["input_ids"], inputs["attention_mask"]
        if self._zero_gradient(inputs):
            # every advantage of these rows is 0 (zero-variance groups, no turn penalty) and there is no
            # KL term: the loss and its gradient are exactly 0 whatever the log-probs. Skip the model's
            # forward and backward; every parameter still gets its (zero) gradient, so the optimizer
            # steps exactly as it would have (momentum, weight decay).
            self._stats["tokens"] += float(inputs["policy_mask"].sum())
            self._stats["skipped_rows"] = self._stats.get("skipped_rows", 0.0) + ids.size(0)
            return sum((p * 0.0).sum() for p in model.parameters() if p.requires_grad)
        logps = self._logps(model, ids, att, inputs["policy_mask"])
        per_tok, info = surrogate(logps, inputs, o.epsilon, o.eps_high, self.beta,
                                  turn_ratio=o.turn_ratio == "turn" and o.loss_type == "turn")
        loss = (per_tok * inputs["loss_weight"]).sum()
        world = self.accelerator.num_processes
        st = self._stats
        st["loss"] += float(loss.detach()) / world
        st["kl"] += info["kl"]
        st["clipped"] += info["clipped"]
        st["tokens"] += info["tokens"]
        st["is_ratio_sum"] += info["is_ratio_sum"]
        return loss

    # -- steps without a learning signal ----------------------------------------------------------
    def _can_skip_steps(self) -> bool:
        """`empty_steps: skip` applies where every process holds the whole gradient after the step's
        last backward (one process, or DDP's all-reduce) and the optimizer is torch's own."""
        return (self.run.opts.empty_steps == "skip" and not self.is_deepspeed_enabled
                and not self.is_fsdp_enabled)

    def create_optimizer(self, model=None):
        """TRL's optimizer; with `empty_steps: skip` its `step` does nothing on a step whose gradient is
        exactly zero (decided in `training_step`, after the step's last backward)."""
        opt = super().create_optimizer(model)
        if self._can_skip_steps() and not getattr(opt.step, "_toolkit_skips", False):
            inner = opt.step
            trainer = self

            def step(_opt, *a, **kw):  # bound with MethodType: torch's LR scheduler re-wraps opt.step.__func__
                if trainer._empty_step:
                    return None
                return inner(*a, **kw)

            step._toolkit_skips = True
            opt.step = types.MethodType(step, opt)
        return opt

    _empty_step = False

    def _gradient_is_zero(self, model) -> bool:
        for p in model.parameters():
            if p.requires_grad and p.grad is not None and bool(p.grad.any()):
                return False
        return True

    # -- one metrics line per optimizer step -----------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        out = super().training_step(model, inputs, num_items_in_batch)
        if self._step % self.current_gradient_accumulation_steps == 0:
            # the step's last backward is done (and, with DDP, all-reduced): the optimizer step that
            # follows is skipped when it would only replay momentum
            self._empty_step = self._can_skip_steps() and self._gradient_is_zero(model)
            self._flush_step_metrics()
        return out

    def _flush_step_metrics(self) -> None:
        acc = self.accelerator
        st = self._stats
        vec = torch.tensor([st.get(k, 0.0) for k in ("loss", "kl", "clipped", "tokens", "is_ratio_sum")],
                           device=acc.device, dtype=torch.float64)
        if acc.num_processes > 1:
            vec = acc.reduce(vec, reduction="sum")
        loss, kl, clipped, tokens, is_sum = vec.tolist()
        rec = dict(self._pending or {"step": self.state.global_step + 1, "reused_rollouts": True})
        rec["step"] = self.state.global_step + 1
        train_s = time.time() - getattr(self, "_t_train", time.time())
        rec.update({"loss": loss, "kl": kl / max(1.0, tokens), "clip_fraction": clipped / max(1.0, tokens),
                    "trained_tokens": int(tokens), "train_s": round(train_s, 3),
                    "trained_tokens_per_s": tokens / train_s if tokens and train_s > 0 else None,
                    "lr": self._get_learning_rate() if hasattr(self, "_get_learning_rate") else None})
        if is_sum:
            rec["importance_sampling_ratio_mean"] = is_sum / max(1.0, tokens)
        rec["zero_gradient_rows"] = int(st.get("skipped_rows", 0))  # not forwarded: every advantage 0
        rec["update_skipped"] = bool(self._empty_step)  # empty_steps skip: no signal, no optimizer step
        self._pending = None
        self._stats = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "is_ratio_sum": 0.0}
        self._t_train = time.time()
        for k in ("reward_mean", "reward_std", "success_rate", "filtered_fraction", "groups_trained", "buffer",
                  "fill_rounds", "turns_mean", "tool_errors", "policy_tokens"):
            if isinstance(rec.get(k), (int, float)):
                self._metrics["train"][f"toolkit/{k}"].append(float(rec[k]))
        self.run.history.append(rec)
        if acc.is_main_process:
            with open(self.run.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, default=float) + "\n")

    # -- checkpoints -----------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        path = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(path, exist_ok=True)
        self.run.save_state(path, self.accelerator.process_index, self.accelerator.is_main_process)


def turn_log_ratio(log_ratio, turn_index, policy_mask):
    """LOGIGEN eq. 5: the log of ρ_it = π_θ(y_it)/π_old(y_it) — the sum of the token log-ratios of agent
    turn t — broadcast back to every token of the turn (0 off-policy)."""
    idx = turn_index.clamp(min=0)
    n_turns = int(idx.max()) + 1 if idx.numel() else 1
    per_turn = torch.zeros(log_ratio.size(0), n_turns, dtype=log_ratio.dtype, device=log_ratio.device)
    per_turn = per_turn.scatter_add(1, idx, log_ratio * policy_mask)
    return per_turn.gather(1, idx) * policy_mask


def surrogate(logps, inputs: dict, eps_low: float, eps_high: float, beta: float, turn_ratio: bool = False):
    """Per-token loss −min(ρA, clip(ρ)A) (× IS ratio) + β·k3 KL, and statistics. ρ = exp(logp − old)
    per token, or (turn_ratio) the ratio of the whole agent turn the token belongs to."""
    adv, pm = inputs["advantages"], inputs["policy_mask"]
    old = inputs.get("old_per_token_logps")
    old = logps.detach() if old is None else old
    log_ratio = logps - old
    if turn_ratio:
        log_ratio = turn_log_ratio(log_ratio, inputs["turn_index"], pm)
    ratio = torch.exp(log_ratio)
    per_tok = -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    info = {"kl": 0.0, "is_ratio_sum": 0.0}
    if "importance_sampling_ratio" in inputs:
        per_tok = per_tok * inputs["importance_sampling_ratio"]
        info["is_ratio_sum"] = float((inputs["importance_sampling_ratio"] * pm).sum())
    if beta:
        ref = inputs["ref_per_token_logps"]
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_tok = per_tok + beta * kl
        info["kl"] = float((kl.detach() * pm).sum())
    info["clipped"] = float((((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).float() * pm).sum())
    info["tokens"] = float(pm.sum())
    return per_tok, info


def load_state(path: str, rank: int) -> dict | None:
    f = os.path.join(path, STATE_FILE)
    if not os.path.exists(f):
        return None
    with open(f, "rb") as fh:
        shared = pickle.load(fh)
    rf = os.path.join(path, f"toolkit_grpo_rank{rank}.pkl")
    if os.path.exists(rf):
        with open(rf, "rb") as fh:
            shared["rank"] = pickle.load(fh)
    return shared
