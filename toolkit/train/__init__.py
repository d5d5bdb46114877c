"""Training-side code: reward functions (pure), training-row export, GRPO advantage math, and the
`sft` / `grpo` trainers (toolkit.train.sft, toolkit.train.grpo; need the `train` extra).

`toolkit.train.rewards` has no heavy dependencies (no torch/trl) so that `verify` can use it.
"""

from toolkit.train.rewards import (  # noqa: F401
    TargetIndex,
    binary_success,
    dense_rewards,
    f1_reward,
    grpo_advantages,
    match_actions,
    proximity,
    state_diff,
    state_diff_detail,
    ta_grpo_advantages,
)
