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
generated ids and 0 elsewhere; `tests/train/test_grpo.py` decodes both sides.

Why a loop of our own on accelerate + TRL pieces rather than `trl.GRPOTrainer(rollout_func=...)`:
see docs/training.md ("Why not GRPOTrainer"). In short: ASTRA's adaptive filling runs a variable
number of rollout rounds per optimizer step and carries samples over steps, EigenData drops groups
(GRPOTrainer's batch shapes and its `steps_per_generation` split are fixed per step), and the
group-token (EigenData) and turn-level (LOGIGEN) normalizations are not among its loss types. We
reuse TRL's `selective_log_softmax` and its vLLM server client (`trl vllm-serve`) for generation.

Modules: `options` (GRPOOptions, variant_preset), `generators` (HF, vLLM server, scripted), `agent`
(PolicyAgent: the token list), `episodes` (Rollouts), `loss` (advantages, policy loss), `loop`
(GRPORun); this module is the `grpo` command.
"""

from __future__ import annotations

import dataclasses
import json

from toolkit.io import IOOptions, RecordStream, StageError, UsageError, log
from toolkit.schema import Record
from toolkit.train.grpo.agent import PolicyAgent
from toolkit.train.grpo.episodes import Episode, Rollouts
from toolkit.train.grpo.generators import HFGenerator, ScriptedGenerator, VLLMGenerator
from toolkit.train.grpo.loop import GRPORun
from toolkit.train.grpo.loss import compute_old_logps, policy_loss, sequence_advantages
from toolkit.train.grpo.options import GRPOOptions, variant_preset

__all__ = ["variant_preset", "Episode", "GRPOOptions", "GRPORun", "HFGenerator", "PolicyAgent", "Rollouts",
           "ScriptedGenerator", "VLLMGenerator", "compute_old_logps", "main", "policy_loss", "read_tasks",
           "sequence_advantages"]


# ----------------------------------------------------------------------------------------------
# the command


def read_tasks(cfg: dict) -> tuple[list[Record], RecordStream]:
    opts = dataclasses.replace(IOOptions.from_config(cfg), output=None, resume=False)
    recs: list[Record] = []

    def fn(record: Record):
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
