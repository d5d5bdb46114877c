"""Training-side code: training-row export, GRPO advantage math, and the `sft` / `grpo` trainers
(toolkit.train.sft, toolkit.train.grpo; need the `train` extra). Reward functions live in
`toolkit.scoring.rewards` (verify and training share them)."""
