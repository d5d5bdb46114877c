"""GRPO options (`GRPOOptions`) and the paper variants that preset them (registered, kind "variants")."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict

from toolkit import registry
from toolkit.io import UsageError
from toolkit.options import GRPOOpts, typed_options, with_preset
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


class GRPOOptions(GRPOOpts):
    """The trainer's typed options: `toolkit.options.GRPOOpts` (every key and its default) with the
    variant's preset applied. `from_config` takes the CLI's merged options or a plain dict (library
    use, tests): keys it does not declare are ignored, None means unset."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    @classmethod
    def from_config(cls, cfg: Any) -> GRPOOptions:
        if isinstance(cfg, BaseModel):
            cfg = {k: getattr(cfg, k) for k in cfg.model_fields_set if k in cls.model_fields}
        try:
            o = with_preset(typed_options(cls, cfg))
        except ValueError as e:
            raise UsageError(str(e)) from None
        assert isinstance(o, GRPOOptions)
        if tuple(get_args(cls.model_fields["loss_type"].annotation)) != ADV.LOSS_TYPES:  # pragma: no cover
            raise AssertionError("GRPOOpts.loss_type and advantages.LOSS_TYPES differ")
        if o.generation == "scripted" and not o.scripted_completions:
            raise UsageError("generation scripted needs scripted_completions (a JSON file)")
        if o.max_staleness and o.generation == "vllm" and o.vllm_mode == "colocate":
            raise UsageError("max_staleness > 0 needs generation on other devices than training: use vllm_mode "
                             "server, or max_staleness 0 with colocate")
        return o

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else float(self.epsilon_high)
