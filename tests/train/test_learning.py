"""Learning signal: `sft` then `grpo` on a task the tiny model can learn raises the reward.

Task: "Open a ticket with code X" in a one-table sqlite environment (the only tool is
insert_ticket); reward = verify's state_diff R (the ticket table equals the target). SFT on
replayed, verified episodes of four codes for 60 steps leaves the tiny model (hidden 64) right
about a third of the time on "red" (wrong code, broken JSON); GRPO on that task, 16 episodes per
step for 20 steps, must lift it. Seeded, CPU: ~1.5 minutes on two cores.
"""

import asyncio
import json

from tests.conftest import requires_train
from tests.train.test_grpo import ticket_tasks

pytestmark = requires_train


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
    cfg = {"use_cpu": True, "learning_rate": 1e-3, "max_new_tokens": 40, "max_turns": 1, "tool_schema": "minimal",
           "system_prompt": "drop", "num_generations": 8, "tasks_per_step": 2, "max_steps": 20, "variant": "grpo",
           "temperature": 1.0, "seed": 0, "max_staleness": 0}  # synchronous: see docs/training.md (async curve)
    res = G.GRPORun(cfg, red, str(tmp_path / "sft"), str(tmp_path / "grpo")).train()
    with open(tmp_path / "grpo" / "metrics.jsonl") as f:
        rewards = [json.loads(x)["reward_mean"] for x in f]
    assert res["steps"] == 20 and len(rewards) == 20
    first, last = sum(rewards[:4]) / 4, sum(rewards[-10:]) / 10  # the first steps vs the second half
    # measured (seed 0, torch 2.13 CPU, minimal tool rendering since the tool block carries the
    # schematic example; the same curve in 4 runs): 0.25 0.44 0.31 0.5 ... 0.69 0.38 0.56 0.62 ->
    # 0.375 vs 0.631 (lr 2e-3 rose to ~0.5 and collapsed to ~0.1 by step 20)
    assert last >= first + 0.2 and last >= 0.5, rewards
