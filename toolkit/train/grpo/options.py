"""The paper variants that preset GRPO's options (registered, kind "variants"); the options model
itself is `toolkit.options.GRPOOptions` (one model: defaults and help in its fields), re-exported here."""

from __future__ import annotations

from typing import get_args

from toolkit import registry
from toolkit.io import UsageError
from toolkit.options import GRPOOptions
from toolkit.train import advantages as ADV

# ----------------------------------------------------------------------------------------------
# options


# GRPO variants (kind "variants"): presets of GRPOOptions fields, applied between the options'
# defaults and the recipe (toolkit.options.with_preset); recipe keys, env and flags override them.
# Every preset trains on-policy (max_staleness 0: the papers' setting, ASTRA §3.2 "strictly
# on-policy", LOGIGEN and Simia on VeRL); asynchronous rollouts stay an option (docs/training.md).
# A plugin registers its own the same way: registry.register("variants", name, {...}, help=...).
registry.register("variants", "grpo",
                  {"loss_type": "grpo", "advantage": "grpo", "filter": "none", "beta": 0.0, "max_staleness": 0},
                  help="plain GRPO (DeepSeek): per-sequence mean, (R-mu)/sigma, no filtering")
registry.register("variants", "eigendata",
                  {"loss_type": "group_token", "advantage": "grpo", "filter": "dynamic", "beta": 0.0,
                   "max_staleness": 0}, flow="eigendata",
                  help="EigenData §5: token-level normalization over the group, dynamic filtering")
registry.register("variants", "astra",
                  {"loss_type": "dapo", "advantage": "grpo", "filter": "adaptive", "beta": 0.0, "delta": 0.0,
                   "max_staleness": 0},
                  flow="astra", help="ASTRA §3.2.2: adaptive batch filling Std(R) > delta with a buffer, no KL, "
                                     "strictly on-policy")
registry.register("variants", "ta-grpo",
                  {"loss_type": "turn", "advantage": "ta_grpo", "filter": "none", "beta": 0.0,
                   "verify_strategy": ["state_diff"], "turn_ratio": "turn", "penalize_invalid_calls": False,
                   "max_staleness": 0}, flow="logigen",
                  help="LOGIGEN §4.3 eq. 5: A_it = A_i + min(r_t, 0), the turn's ratio clipped per turn, "
                       "r_t = -lambda_err for policy violations only, state_diff reward")
registry.register("variants", "simia",
                  {"loss_type": "grpo", "advantage": "grpo", "filter": "none", "beta": 0.001, "epsilon_high": 0.28,
                   "verify_strategy": ["judge"], "judge_rubric": "simia", "max_staleness": 0}, flow="simia",
                  help="Simia App. B.2: LLM judge reward (simia rubric), KL 0.001, clip-high 0.28")


def variant_preset(name: str) -> dict:
    """The registered preset of a GRPO variant (UsageError naming the registered ones)."""
    e = registry.lookup("variants", name)
    if e is None:
        raise UsageError(f"unknown --variant {name!r}; choose from {', '.join(registry.names('variants'))}")
    return dict(e.obj)


if tuple(get_args(GRPOOptions.model_fields["loss_type"].annotation)) != ADV.LOSS_TYPES:  # pragma: no cover
    raise AssertionError("GRPOOptions.loss_type and advantages.LOSS_TYPES differ")
