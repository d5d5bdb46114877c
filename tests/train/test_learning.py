"""Learning signal: `sft` then `grpo` (its defaults: on-policy) on a task the tiny model can learn
raises the policy's success rate.

Task: "Open a ticket with code X" in a one-table sqlite environment (the only tool is insert_ticket);
reward = verify's state_diff R (the ticket table equals the target). SFT on replayed, verified
episodes of four codes for 60 steps leaves the tiny model (hidden 64) right 22-56% of the time on
"red" at T = 1 (junk tokens in the call); GRPO on that task, 4 groups of 8 episodes per step for 30
steps, must lift it. Two statistics with margins of several standard errors (docs/training.md,
"Learning signal": five seeds of this test gave SFT 0.22-0.56 -> GRPO 0.76-0.80, +0.23 to +0.56;
training reward first quarter 0.35-0.56 -> last quarter 0.84-0.88):
- the policy: 256 episodes sampled (T = 1, one sampler seed) from the SFT checkpoint and from the
  GRPO checkpoint: success up by >= 0.1 and >= 0.6 after (SE of the difference ~0.04);
- the training curve (metrics.jsonl): reward_mean of the last quarter of the steps >= the first
  quarter's + 0.15 and >= 0.7 (224 episodes per quarter).
Seeded, CPU: ~40 CPU-seconds.
"""

import asyncio
import json

from tests.conftest import requires_train
from tests.train.test_grpo import ticket_tasks

pytestmark = requires_train


def success_rate(model_dir, record, n=256, seed=1234):
    """The share of `n` episodes sampled at T = 1 from the checkpoint that pass (verify state_diff)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.train import grpo as G

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opts = G.GRPOOptions.from_config({"num_generations": n, "max_new_tokens": 40, "max_turns": 1,
                                      "tool_schema": "minimal", "system_prompt": "drop"})
    rollouts = G.Rollouts({}, opts, tok, G.HFGenerator(model, tok, 1.0, seed=seed))
    group, _ = asyncio.run(rollouts.group(record, 0))
    return sum(1 for r in group.rewards if r >= 1.0) / n


def test_sft_then_grpo_raises_reward(tiny_model, tmp_path):
    from toolkit.stages import rollout, verify
    from toolkit.train import export as X
    from toolkit.train import grpo as G
    from toolkit.train import sft

    recs = ticket_tasks(tmp_path)
    roll = rollout.build({"agent_kind": "replay"}, None)
    ver = verify.build({"strategy": ["state_diff"]}, None)

    async def replay():
        return [await ver(await roll(r.model_copy(deep=True))) for r in recs]

    verified = asyncio.run(replay())
    assert all(t.reward == 1.0 for r in verified for t in r.trajectories)
    rows = [x for r in verified for x in X.record_rows(r, filter="passed", tool_schema="minimal",
                                                       system_prompt="drop")]
    sft.train(rows * 8, {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "max_steps": 60,
                         "learning_rate": 5e-3, "per_device_train_batch_size": 4, "save_strategy": "no",
                         "lr_scheduler_type": "constant", "logging_steps": 10, "seed": 0, "report_to": "none"},
              tiny_model, str(tmp_path / "sft"))
    red = [r for r in recs if r.id == "tk-red"]
    # the variant's defaults (on-policy: max_staleness 0 is every preset's); the knobs of this run only
    cfg = {"use_cpu": True, "learning_rate": 1e-3, "max_new_tokens": 40, "max_turns": 1, "tool_schema": "minimal",
           "system_prompt": "drop", "num_generations": 8, "tasks_per_step": 4, "max_steps": 30, "variant": "grpo",
           "seed": 0}
    run = G.GRPORun(cfg, red, str(tmp_path / "sft"), str(tmp_path / "grpo"))
    assert run.opts.max_staleness == 0 and run.opts.temperature == 1.0
    res = run.train()
    with open(tmp_path / "grpo" / "metrics.jsonl") as f:
        rewards = [json.loads(x)["reward_mean"] for x in f]
    assert res["steps"] == 30 and len(rewards) == 30
    before, after = success_rate(str(tmp_path / "sft"), red[0]), success_rate(str(tmp_path / "grpo"), red[0])
    q = len(rewards) // 4
    first, last = sum(rewards[:q]) / q, sum(rewards[-q:]) / q
    print(json.dumps({"learning": {"before": before, "after": after, "first_quarter": first, "last_quarter": last}}))
    assert after >= before + 0.1 and after >= 0.6, (before, after, rewards)
    assert last >= first + 0.15 and last >= 0.7, (before, after, rewards)
