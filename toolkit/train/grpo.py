"""`grpo`: GRPO on live multi-turn episodes against our environments, rewards from `verify`.

One optimizer step:
  1. pick `tasks_per_step` task records; for each run G episodes (`num_generations`) with
     `toolkit.stages.rollout.run_episode` — the same engine `rollout` uses — where the agent is a
     `PolicyAgent` sampling from the model being trained, the user simulator is rollout's `LLMUser`
     (task records with a user scenario) and the environment is `load_env(record.env)`;
  2. score the group with `toolkit.stages.verify.build(...)` — the same function `verify` runs
     (state_diff R and dense r_t per call, actions, f1, code, judge, tau2);
  3. advantages (`toolkit.train.advantages`): group (R − μ)/σ, TA-GRPO per turn, EigenData dynamic
     filtering or ASTRA adaptive batch filling with a carry-over buffer;
  4. a clipped policy-gradient update (ε_low / ε_high, optional k3 KL to the reference model) on the
     policy tokens only, normalized per the variant's loss type.

No re-tokenization drift: each episode keeps ONE append-only token list. Policy tokens are the ids
the generator returned, appended verbatim (never decoded and re-encoded); everything else (system,
tools, user turns, tool results, the template's glue between turns) is tokenized once, as the
*suffix* of the chat-template rendering after the last assistant message, and appended. The next
turn is sampled from exactly that list, and the loss is computed on exactly that list, so the
tokens trained are the tokens sampled, with the context they were sampled in. The mask is 1 on the
generated ids and 0 elsewhere; `tests/test_train_grpo.py` decodes both sides.

Why a loop of our own on accelerate + TRL pieces rather than `trl.GRPOTrainer(rollout_func=...)`:
see docs/training.md ("Why not GRPOTrainer"). In short: ASTRA's adaptive filling runs a variable
number of rollout rounds per optimizer step and carries samples over steps, EigenData drops groups
(GRPOTrainer's batch shapes and its `steps_per_generation` split are fixed per step), and the
group-token (EigenData) and turn-level (LOGIGEN) normalizations are not among its loss types. We
reuse TRL's `selective_log_softmax` and its vLLM server client (`trl vllm-serve`) for generation.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from toolkit.io import IOOptions, RecordStream, UsageError, log
from toolkit.options import VerifyOptions
from toolkit.schema import Record, Trajectory
from toolkit.train import advantages as ADV
from toolkit.train.export import prepare_system, prepare_tools

# ----------------------------------------------------------------------------------------------
# options


VARIANTS: dict[str, dict] = {
    # plain GRPO (DeepSeek): per-sequence mean, (R-μ)/σ, no filtering
    "grpo": {"loss_type": "grpo", "advantage": "grpo", "filter": "none", "beta": 0.0},
    # EigenData [E] §5: trajectory-level advantage, token-level normalization over the group, dynamic filtering
    "eigendata": {"loss_type": "group_token", "advantage": "grpo", "filter": "dynamic", "beta": 0.0},
    # ASTRA [A] §3.2.2: adaptive batch filling Std(R) > δ with a buffer, batch-level token mean, no KL
    "astra": {"loss_type": "dapo", "advantage": "grpo", "filter": "adaptive", "beta": 0.0, "delta": 0.0},
    # LOGIGEN [L] §4.3: A_it = A_i + min(r_t, 0), 1/G turn-level objective, β = 0, state_diff reward
    "ta-grpo": {"loss_type": "turn", "advantage": "ta_grpo", "filter": "none", "beta": 0.0,
                "verify_strategy": ["state_diff"]},
    # Simia [M] App. B.2: simulated env + LLM judge reward, KL 0.001, clip-high 0.28
    "simia": {"loss_type": "grpo", "advantage": "grpo", "filter": "none", "beta": 0.001, "epsilon_high": 0.28,
              "verify_strategy": ["judge"], "judge_rubric": "simia"},
}


@dataclass
class GRPOOptions:
    variant: str = "grpo"
    num_generations: int = 4           # G
    tasks_per_step: int = 2            # groups per step (ASTRA: the batch size n, in groups)
    max_steps: int = 10
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant"  # any transformers scheduler name (constant, cosine, linear ...)
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 8
    max_tool_errors: int = 5
    max_new_tokens: int = 256          # per agent turn
    max_total_tokens: int = 4096       # per episode (context)
    num_iterations: int = 1            # policy updates per batch (μ); >1 uses importance ratios
    beta: float = 0.0                  # KL to the reference model (k3 estimator); 0 = no reference model
    epsilon: float = 0.2               # clip low
    epsilon_high: float | None = None  # clip high (DAPO clip-higher); None = epsilon
    loss_type: str = "grpo"
    advantage: str = "grpo"            # grpo | ta_grpo
    scale_rewards: bool = True         # divide by σ (False: Dr. GRPO)
    filter: str = "none"               # none | dynamic | adaptive
    delta: float = 0.0                 # Std(R) > δ
    max_fill_rounds: int = 4           # adaptive: rollout rounds per step before giving up
    verify_strategy: list = field(default_factory=lambda: ["state_diff"])
    lambda_err: float = VerifyOptions.model_fields["lambda_err"].default  # written once, in verify's options
    micro_batch: int = 1               # sequences per forward/backward
    save_steps: int = 0                # 0 = only at the end
    seed: int = 0
    tool_schema: str = "full"
    system_prompt: str = "keep"
    distractor_tools: int = 0          # ASTRA irrelevant-tool mixing from the rollout side
    generation: str = "transformers"   # transformers | vllm (TRL's `trl vllm-serve`)
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = 8000
    log_completions: bool = False
    strict_tool_calls: bool = False    # a <tool_call> block must be valid JSON as generated (no repair)

    @classmethod
    def from_config(cls, cfg: dict) -> "GRPOOptions":
        variant = cfg.get("variant") or "grpo"
        if variant not in VARIANTS:
            raise UsageError(f"unknown --variant {variant!r}; choose from {', '.join(VARIANTS)}")
        vals: dict[str, Any] = {"variant": variant, **VARIANTS[variant]}
        names = {f for f in cls.__dataclass_fields__}
        for k, v in cfg.items():
            if k in names and v is not None and v != () and k != "variant":
                vals[k] = v
        if isinstance(vals.get("verify_strategy"), (str, tuple)):
            vs = vals["verify_strategy"]
            vals["verify_strategy"] = [vs] if isinstance(vs, str) else list(vs)
        o = cls(**{k: v for k, v in vals.items() if k in names})
        if o.loss_type not in ADV.LOSS_TYPES:
            raise UsageError(f"loss_type must be one of {', '.join(ADV.LOSS_TYPES)}")
        if o.advantage not in ("grpo", "ta_grpo"):
            raise UsageError("advantage must be grpo or ta_grpo")
        if o.filter not in ("none", "dynamic", "adaptive"):
            raise UsageError("filter must be none, dynamic or adaptive")
        if o.num_generations < 2:
            raise UsageError("num_generations (G) must be >= 2: advantages are relative to the group")
        return o

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else float(self.epsilon_high)


# ----------------------------------------------------------------------------------------------
# generation backends: ids in -> sampled completion ids out


class HFGenerator:
    """transformers `generate` on the training model. Concurrent episodes' requests are batched
    (left-padded) into one `generate` call when they arrive together."""

    def __init__(self, model, tok, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0):
        self.model, self.tok = model, tok
        self.temperature, self.top_p = temperature, top_p
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.flushing = False
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0
        import torch

        self.gen = torch.Generator().manual_seed(seed)

    async def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((ids, max_new_tokens, fut))
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        try:
            while True:  # let every runnable episode reach its generate() call
                n = len(self.pending)
                for _ in range(3):
                    await asyncio.sleep(0)
                if len(self.pending) == n:
                    break
            batch, self.pending = self.pending, []
            try:
                outs = self._run([b[0] for b in batch], max(b[1] for b in batch))
            except Exception as e:  # pragma: no cover - surfaced to every waiting episode
                for *_, f in batch:
                    f.set_exception(e)
                return
            for (ids, mx, f), o in zip(batch, outs):
                f.set_result(o[:mx])
        finally:
            self.flushing = False
            if self.pending:
                self.flushing = True
                asyncio.get_running_loop().create_task(self._flush())

    def _run(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        import torch

        t0 = time.time()
        pad = self.tok.pad_token_id
        eos = self.tok.eos_token_id
        L = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        was_training = self.model.training
        self.model.eval()
        # torch's global RNG drives sampling; fork it so generation is seeded and training's RNG is not consumed
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=self.gen)))
            out = self.model.generate(input_ids=input_ids.to(self.model.device), attention_mask=attn.to(self.model.device),
                                      do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0,
                                      max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad)
        if was_training:
            self.model.train()
        res = []
        for row in out[:, L:].tolist():
            if eos in row:
                row = row[: row.index(eos) + 1]
            res.append(row)
            self.generated_tokens += len(row)
        self.seconds += time.time() - t0
        self.calls += 1
        return res

    def sync_weights(self) -> None:  # same model object: nothing to do
        pass


class VLLMGenerator:
    """Generation on a TRL vLLM server (`trl vllm-serve --model PATH` on its own GPU): prompts are
    sent as token ids, completions come back as token ids; weights are pushed after every update
    through TRL's NCCL communicator. Not exercised by the CPU tests (no GPU here)."""

    def __init__(self, model, tok, opts: GRPOOptions, is_main: bool = True):
        from trl.generation.vllm_client import VLLMClient

        self.model, self.tok, self.opts, self.is_main = model, tok, opts, is_main
        self.client = VLLMClient(host=opts.vllm_server_host, server_port=opts.vllm_server_port)
        if is_main:  # one weight-sync communicator: DDP keeps every rank's weights equal
            self.client.init_communicator(device=getattr(model, "device", 0))
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.flushing = False
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0

    generate = HFGenerator.generate
    _flush = HFGenerator._flush

    def _run(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        t0 = time.time()
        out = self.client.generate(prompts=prompts, n=1, temperature=self.opts.temperature, top_p=self.opts.top_p,
                                   max_tokens=max_new, logprobs=0)
        res = [list(c) for c in out["completion_ids"]]
        self.generated_tokens += sum(len(r) for r in res)
        self.seconds += time.time() - t0
        self.calls += 1
        return res

    def sync_weights(self) -> None:
        if not self.is_main:
            return
        model = self.model
        if hasattr(model, "merge_adapter"):  # peft: push merged weights
            model.merge_adapter()
            try:
                for name, p in model.named_parameters():
                    name = name.replace("base_model.model.", "").replace(".base_layer", "")
                    if "lora_" in name:
                        continue
                    self.client.update_named_param(name, p.data)
            finally:
                model.unmerge_adapter()
        else:
            for name, p in model.named_parameters():
                self.client.update_named_param(name, p.data)
        self.client.reset_prefix_cache()


class ScriptedGenerator:
    """Returns pre-written completions (tests, and to replay a fixed policy): texts are tokenized
    once and returned as ids, in order, per episode key."""

    def __init__(self, tok, scripts: dict[str, list[str]] | list[str]):
        self.tok = tok
        self.scripts = scripts
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0

    async def generate(self, ids: list[int], max_new_tokens: int, key: str = "") -> list[int]:
        seq = self.scripts if isinstance(self.scripts, list) else self.scripts[key]
        i = self._i = getattr(self, "_i", {})
        k = i.get(key, 0)
        i[key] = k + 1
        text = seq[min(k, len(seq) - 1)]
        out = self.tok(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
        self.generated_tokens += len(out)
        self.calls += 1
        return out

    def sync_weights(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------
# the policy as a rollout agent


class ContextFull(Exception):
    pass


def _render_copy(messages: list[dict]) -> list[dict]:
    """Messages for the chat template: tool-call arguments as dicts (never double-encoded)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m)
            calls = []
            for tc in m["tool_calls"]:
                fn = dict(tc["function"])
                a = fn.get("arguments")
                if isinstance(a, str):
                    try:
                        a = json.loads(a) if a.strip() else {}
                    except json.JSONDecodeError:
                        pass
                fn["arguments"] = a
                calls.append({**tc, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


_TOOL_BLOCK = None


def _strictly_valid(text: str) -> bool:
    """Every <tool_call> block is a JSON object {"name": str, "arguments": object} exactly as written."""
    import re

    global _TOOL_BLOCK
    if _TOOL_BLOCK is None:
        _TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
    blocks = _TOOL_BLOCK.findall(text)
    if not blocks:
        return False
    for b in blocks:
        try:
            obj = json.loads(b)
        except json.JSONDecodeError:
            return False
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments", {}), dict)):
            return False
    return True


class PolicyAgent:
    """rollout's Agent protocol (`act(messages, tools, usage) -> assistant message`) backed by the
    policy being trained; records the token stream of its episode (see module doc)."""

    name = "policy"

    def __init__(self, tok, generator, opts: GRPOOptions, key: str = ""):
        self.tok, self.generator, self.opts, self.key = tok, generator, opts, key
        self.ids: list[int] = []
        self.mask: list[int] = []       # 1 = sampled by the policy
        self.turn_of: list[int] = []    # agent turn of each token (-1 = context)
        self.calls_per_turn: list[int] = []
        self.seen: list[dict] | None = None
        self.format_errors = 0
        self.eos_text = tok.eos_token
        self.prompt_len = 0
        self.truncated = False

    def _render(self, msgs: list[dict], tools: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(_render_copy(msgs), tools=tools or None, tokenize=False,
                                            add_generation_prompt=gen)

    def _append(self, ids: list[int], policy: bool, turn: int = -1) -> None:
        self.ids.extend(ids)
        self.mask.extend([1 if policy else 0] * len(ids))
        self.turn_of.extend([turn if policy else -1] * len(ids))

    async def act(self, messages: list[dict], tools: list[dict], usage: Any) -> dict:
        from toolkit.llm.toolcalls import parse_tool_calls

        msgs = prepare_system([dict(m) for m in messages], self.opts.system_prompt)
        rtools = prepare_tools(list(tools or []), self.opts.tool_schema)
        if self.seen is None:
            text = self._render(msgs, rtools, True)
            self._append(self.tok(text, add_special_tokens=False)["input_ids"], False)
            self.prompt_len = len(self.ids)
        else:
            k = len(self.seen)
            if msgs[:k] != self.seen:
                raise RuntimeError("the conversation history changed between agent turns; cannot extend the token stream")
            prev = self._render(self.seen, rtools, False)
            full = self._render(msgs, rtools, True)
            if not full.startswith(prev):
                raise RuntimeError("chat template is not prefix-stable (rendering of earlier turns changed); "
                                   "use --chat-template toolkit or a prefix-preserving template")
            glue = prev[prev.rindex(self.eos_text) + len(self.eos_text):] if self.eos_text in prev else ""
            closing = "" if (self.ids and self.ids[-1] == self.tok.eos_token_id) else self.eos_text
            self._append(self.tok(closing + glue + full[len(prev):], add_special_tokens=False)["input_ids"], False)
        room = self.opts.max_total_tokens - len(self.ids)
        if room <= 0:
            self.truncated = True
            raise ContextFull(f"context_length: episode reached max_total_tokens={self.opts.max_total_tokens}")
        before = len(self.ids)
        kw = {"key": self.key} if isinstance(self.generator, ScriptedGenerator) else {}
        comp = await self.generator.generate(list(self.ids), min(self.opts.max_new_tokens, room), **kw)
        turn = len(self.calls_per_turn)
        self._append(comp, True, turn)
        usage.prompt_tokens += before
        usage.completion_tokens += len(comp)
        usage.requests += 1
        text = self.tok.decode(comp, skip_special_tokens=False)
        if text.endswith(self.eos_text):
            text = text[: -len(self.eos_text)]
        for sp in (self.tok.pad_token,):
            if sp:
                text = text.replace(sp, "")
        content, calls, err = parse_tool_calls(text)
        if calls and self.opts.strict_tool_calls and not _strictly_valid(text):
            content, calls, err = text, [], "tool call is not valid JSON as generated"
        if err:
            self.format_errors += 1
        msg: dict = {"role": "assistant", "content": content if content is not None else ("" if not calls else None)}
        if calls:
            msg["tool_calls"] = calls
        self.calls_per_turn.append(len(calls))
        self.seen = msgs + [msg]
        return msg


# ----------------------------------------------------------------------------------------------
# episodes and groups


@dataclass
class Episode:
    record_id: str
    traj: Trajectory
    ids: list[int]
    mask: list[int]
    turn_of: list[int]
    calls_per_turn: list[int]
    prompt_len: int
    format_errors: int
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)

    @property
    def policy_tokens(self) -> int:
        return sum(self.mask)


class Rollouts:
    """Runs groups of episodes and verifies them (rollout's engine + verify's strategies)."""

    def __init__(self, cfg: dict, opts: GRPOOptions, tok, generator, meter: Any = None):
        from toolkit.stages import verify

        self.opts, self.tok, self.generator = opts, tok, generator
        # the policy's --model is a checkpoint path, never the simulator's / judge's model name
        side_cfg = {k: v for k, v in cfg.items() if k not in ("model", "base_url")}
        self.side_cfg = side_cfg
        self.meter = meter
        vcfg = {**side_cfg, "strategy": list(opts.verify_strategy), "lambda_err": opts.lambda_err,
                "filter": "all", "require": cfg.get("require"),
                "judge_rubric": cfg.get("judge_rubric") or VARIANTS[opts.variant].get("judge_rubric")}
        self.verify_fn = verify.build(vcfg, meter)
        self._user_client = None

    def user_client(self):
        if self._user_client is None:
            from toolkit.config import llm_config
            from toolkit.llm import get_client

            self._user_client = get_client(llm_config(self.side_cfg, role="user"), self.meter)
        return self._user_client

    async def episode(self, record: Record, k: int, step: int) -> Episode:
        from toolkit.envs import load_env
        from toolkit.stages.rollout import EpisodeLimits, LLMUser, distractor_tools, run_episode, scenario_text

        key = f"{record.id}-s{step}-g{k}"
        agent = PolicyAgent(self.tok, self.generator, self.opts, key=key)
        env = load_env(record.env)
        try:
            env.reset(record.env.state if record.env and record.env.state else None)
            if hasattr(env, "bind_llm"):
                from toolkit.config import llm_config
                from toolkit.llm import get_client

                env.bind_llm(get_client(llm_config(self.side_cfg, role="env"), self.meter))
            user = None
            if record.task and record.task.user_scenario:
                usp = env.user_simulator_system_prompt() if hasattr(env, "user_simulator_system_prompt") else None
                user = LLMUser(self.user_client(), scenario_text(record), sample_index=step * 1000 + k,
                               system_prompt=usp)
            extra = (distractor_tools(record, env.tools("agent"), self.opts.distractor_tools, step * 1000 + k)
                     if self.opts.distractor_tools else [])
            limits = EpisodeLimits(max_turns=self.opts.max_turns, max_tool_errors=self.opts.max_tool_errors,
                                   max_context_tokens=10**9)
            traj = await run_episode(record, env, agent, user, key, limits, extra_tools=extra,
                                     agent_model="policy", user_model="user-simulator" if user else None)
        finally:
            env.close()
        if agent.truncated:
            traj.termination = "context_length"
        return Episode(record.id, traj, agent.ids, agent.mask, agent.turn_of, agent.calls_per_turn,
                       agent.prompt_len, agent.format_errors)

    async def group(self, record: Record, step: int) -> tuple[ADV.Group, Record]:
        eps = await asyncio.gather(*(self.episode(record, k, step) for k in range(self.opts.num_generations)))
        rec = record.model_copy(deep=True)
        rec.trajectories = [e.traj for e in eps]
        scored = await self.verify_fn(rec)
        for e, t in zip(eps, scored.trajectories):
            e.traj = t
            e.reward = float(t.reward) if t.reward is not None else 0.0
            agent_steps = [s for s in t.steps if s.side == "agent"]
            step_turns = [ti for ti, n in enumerate(e.calls_per_turn) for _ in range(n)]
            if len(agent_steps) == len(step_turns):
                e.turn_rewards = ADV.turn_dense_rewards([s.reward for s in agent_steps], step_turns,
                                                        len(e.calls_per_turn))
            else:  # an episode cut short mid-turn: no dense signal rather than a misaligned one
                e.turn_rewards = [0.0] * len(e.calls_per_turn)
        return ADV.Group(record.id, [e.reward for e in eps], list(eps)), scored


# ----------------------------------------------------------------------------------------------
# loss


def sequence_advantages(groups: Sequence[ADV.Group], opts: GRPOOptions) -> list[tuple[Episode, list[float], int]]:
    """(episode, per-policy-token advantages, group index) for every episode of the batch."""
    out = []
    for gi, g in enumerate(groups):
        adv = ADV.group_advantages(g.rewards, scale=opts.scale_rewards)
        for a, ep in zip(adv, g.items):
            turns = [t for t, m in zip(ep.turn_of, ep.mask) if m]
            if opts.advantage == "ta_grpo":
                per_turn = ADV.turn_advantages(a, ep.turn_rewards or [0.0] * len(ep.calls_per_turn))
                tok_adv = ADV.token_advantages(per_turn, turns)
            else:
                tok_adv = [a] * len(turns)
            out.append((ep, tok_adv, gi))
    return out


def policy_loss(model, ref_model, items, opts: GRPOOptions, backward, old_logps: dict | None = None) -> dict:
    """Accumulate gradients of the clipped surrogate over `items` (episode, token advantages, group).
    Returns summed statistics. `backward(loss)` is accelerator.backward."""
    import torch
    from trl.trainer.utils import selective_log_softmax

    seq_lens = [ep.policy_tokens for ep, _, _ in items]
    turns = [[t for t, m in zip(ep.turn_of, ep.mask) if m] for ep, _, _ in items]
    weights = ADV.token_weights(seq_lens, opts.loss_type, group_of=[g for _, _, g in items], token_turns=turns,
                                max_tokens=opts.max_total_tokens)
    device = next(model.parameters()).device
    stats = {"loss": 0.0, "kl": 0.0, "clipped": 0, "tokens": 0}
    mb = max(1, int(opts.micro_batch))
    for s in range(0, len(items), mb):
        chunk = list(range(s, min(s + mb, len(items))))
        L = max(len(items[i][0].ids) for i in chunk)
        pad = 0
        ids = torch.tensor([items[i][0].ids + [pad] * (L - len(items[i][0].ids)) for i in chunk], device=device)
        att = torch.tensor([[1] * len(items[i][0].ids) + [0] * (L - len(items[i][0].ids)) for i in chunk], device=device)
        pmask = torch.zeros(len(chunk), L - 1, device=device)
        adv = torch.zeros(len(chunk), L - 1, device=device)
        w = torch.zeros(len(chunk), L - 1, device=device)
        for r, i in enumerate(chunk):
            ep, tok_adv, _ = items[i]
            pos = [p - 1 for p, m in enumerate(ep.mask) if m and p > 0]
            if pos:
                idx = torch.tensor(pos, device=device)
                pmask[r, idx] = 1.0
                adv[r, idx] = torch.tensor(tok_adv[-len(pos):], device=device, dtype=adv.dtype)
                w[r, idx] = torch.tensor(weights[i][-len(pos):], device=device, dtype=w.dtype)
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1, :]
        logps = selective_log_softmax(logits, ids[:, 1:], temperature=opts.temperature)
        if old_logps is not None:  # sampling-time log-probs (num_iterations > 1), padded to this chunk
            old = torch.zeros_like(logps)
            for r, i in enumerate(chunk):
                old[r, : old_logps[i].shape[0]] = old_logps[i].to(device)
        else:
            old = logps.detach()
        ratio = torch.exp(logps - old)
        s1 = ratio * adv
        s2 = torch.clamp(ratio, 1 - opts.epsilon, 1 + opts.eps_high) * adv
        per_tok = -torch.min(s1, s2)
        if opts.beta and ref_model is not None:
            with torch.no_grad():
                rl = ref_model(input_ids=ids, attention_mask=att).logits[:, :-1, :]
                ref = selective_log_softmax(rl, ids[:, 1:], temperature=opts.temperature)
            kl = torch.exp(ref - logps) - (ref - logps) - 1
            per_tok = per_tok + opts.beta * kl
            stats["kl"] += float((kl.detach() * pmask).sum())
        loss = (per_tok * w * pmask).sum()
        backward(loss)
        stats["loss"] += float(loss.detach())
        stats["clipped"] += int((((ratio < 1 - opts.epsilon) | (ratio > 1 + opts.eps_high)).float() * pmask).sum())
        stats["tokens"] += int(pmask.sum())
    return stats


def compute_old_logps(model, items, opts: GRPOOptions) -> dict:
    import torch
    from trl.trainer.utils import selective_log_softmax

    out = {}
    device = next(model.parameters()).device
    with torch.no_grad():
        for i, (ep, _, _) in enumerate(items):
            ids = torch.tensor([ep.ids], device=device)
            logits = model(input_ids=ids).logits[:, :-1, :]
            out[i] = selective_log_softmax(logits, ids[:, 1:], temperature=opts.temperature)[0]
    return out


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


# ----------------------------------------------------------------------------------------------
# the command


def read_tasks(cfg: dict) -> tuple[list[Record], RecordStream]:
    import dataclasses

    opts = dataclasses.replace(IOOptions.from_config(cfg), output=None, resume=False)
    recs: list[Record] = []

    def fn(record: Record):
        from toolkit.io import StageError

        if record.env is None:
            raise StageError("grpo needs an environment reference", field="env")
        if not (record.task and (record.task.instruction or record.task.user_scenario)):
            raise StageError("grpo needs task.instruction or task.user_scenario to open the episode", field="task")
        recs.append(record)
        return None

    stream = RecordStream(opts, "grpo")
    stream.run(fn)
    return recs, stream


def main(cfg: dict) -> int:
    if not cfg.get("model"):
        raise UsageError("grpo needs --model PATH (a local HF checkpoint directory)")
    if not cfg.get("output_dir"):
        raise UsageError("grpo needs --output-dir DIR")
    GRPOOptions.from_config(cfg)  # usage errors before reading anything
    recs, stream = read_tasks(cfg)
    if not recs:
        log("grpo: no task records")
        return 1
    run = GRPORun(cfg, recs, cfg["model"], cfg["output_dir"])
    res = run.train()
    log(f"grpo: {json.dumps(res)}")
    return stream.exit_code()
