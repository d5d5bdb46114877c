"""GRPO options (`GRPOOptions`) and the paper variants that preset them (registered, kind "variants")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkit import registry
from toolkit.io import UsageError
from toolkit.options import VerifyOptions
from toolkit.train import advantages as ADV

# ----------------------------------------------------------------------------------------------
# options


# GRPO variants (kind "variants"): presets of GRPOOptions fields; recipe keys and flags override them.
# A plugin registers its own the same way: registry.register("variants", name, {...}, help=...).
registry.register("variants", "grpo", {"loss_type": "grpo", "advantage": "grpo", "filter": "none", "beta": 0.0},
                  help="plain GRPO (DeepSeek): per-sequence mean, (R-mu)/sigma, no filtering")
registry.register("variants", "eigendata",
                  {"loss_type": "group_token", "advantage": "grpo", "filter": "dynamic", "beta": 0.0}, flow="eigendata",
                  help="EigenData §5: token-level normalization over the group, dynamic filtering")
registry.register("variants", "astra",
                  {"loss_type": "dapo", "advantage": "grpo", "filter": "adaptive", "beta": 0.0, "delta": 0.0},
                  flow="astra", help="ASTRA §3.2.2: adaptive batch filling Std(R) > delta with a buffer, no KL")
registry.register("variants", "ta-grpo",
                  {"loss_type": "turn", "advantage": "ta_grpo", "filter": "none", "beta": 0.0,
                   "verify_strategy": ["state_diff"]}, flow="logigen",
                  help="LOGIGEN §4.3: A_it = A_i + min(r_t, 0), turn-level objective, state_diff reward")
registry.register("variants", "simia",
                  {"loss_type": "grpo", "advantage": "grpo", "filter": "none", "beta": 0.001, "epsilon_high": 0.28,
                   "verify_strategy": ["judge"], "judge_rubric": "simia"}, flow="simia",
                  help="Simia App. B.2: LLM judge reward (simia rubric), KL 0.001, clip-high 0.28")


def variant_preset(name: str) -> dict:
    """The registered preset of a GRPO variant (UsageError naming the registered ones)."""
    e = registry.lookup("variants", name)
    if e is None:
        raise UsageError(f"unknown --variant {name!r}; choose from {', '.join(registry.names('variants'))}")
    return dict(e.obj)


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
    first_message: str = "instruction"  # instruction (task.instruction verbatim) | simulate (the user simulator opens)
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
    max_fill_rounds: int = 16          # rollout rounds per step before training on what is valid (see batch.Selector)
    verify_strategy: list = field(default_factory=lambda: ["state_diff"])
    lambda_err: float = VerifyOptions.model_fields["lambda_err"].default  # written once, in verify's options
    micro_batch: int = 1               # sequences per forward in the no-grad passes (old / reference log-probs)
    gradient_accumulation_steps: int = 1  # slices of each rank's rows, one backward each (TRL steps_per_generation)
    save_steps: int = 0                # 0 = only at the end
    seed: int = 0
    tool_schema: str = "full"
    system_prompt: str = "keep"
    distractor_tools: int = 0          # ASTRA irrelevant-tool mixing from the rollout side
    distractor_mode: str = "auto"      # a registered distractor source (auto: similarity bands for ASTRA records)
    generation: str = "transformers"   # transformers | vllm (TRL's VLLMGeneration) | scripted (replay a file)
    scripted_completions: str | None = None  # generation scripted: JSON {episode key: [turn texts]} or [texts]
    vllm_mode: str = "server"          # server (`trl vllm-serve`) | colocate (vLLM inside each training process)
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = 8000
    vllm_server_timeout: float = 10.0  # seconds: the early reachability check and TRL's own wait
    importance_sampling: bool = True   # correct sampler/trainer mismatch with the sampler's log-probs (TRL's IS)
    importance_sampling_cap: float = 3.0  # per-token ratio truncated at this value
    report_to: str = "none"            # transformers trackers: none | wandb | tensorboard | ...
    gradient_checkpointing: bool | None = None  # None: TRL's default on GPU, off on CPU
    max_staleness: int = 1             # async rollouts: generation of step k+1 overlaps training of step k
    #                                    (weights at most this many updates old; 0 = synchronous)
    turn_ratio: str = "token"          # ta-grpo: token (per-token ratios, token mean per turn) | turn (paper eq. 5)
    log_completions: bool = False
    strict_tool_calls: bool = False    # a <tool_call> block must be valid JSON as generated (no repair)

    @classmethod
    def from_config(cls, cfg: dict) -> GRPOOptions:
        variant = cfg.get("variant") or "grpo"
        vals: dict[str, Any] = {"variant": variant, **variant_preset(variant)}
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
        if o.generation not in ("transformers", "vllm", "scripted"):
            raise UsageError("generation must be transformers, vllm or scripted")
        if o.generation == "scripted" and not o.scripted_completions:
            raise UsageError("generation scripted needs scripted_completions (a JSON file)")
        if o.vllm_mode not in ("server", "colocate"):
            raise UsageError("vllm_mode must be server or colocate")
        if o.turn_ratio not in ("token", "turn"):
            raise UsageError("turn_ratio must be token or turn")
        if o.max_staleness < 0:
            raise UsageError("max_staleness must be >= 0 (0 = synchronous rollouts)")
        if o.max_staleness and o.generation == "vllm" and o.vllm_mode == "colocate" and not cfg.get("max_staleness"):
            o.max_staleness = 0  # the default (1) does not apply: colocated vLLM shares the training devices
        if o.max_staleness and o.generation == "vllm" and o.vllm_mode == "colocate":
            raise UsageError("max_staleness > 0 needs generation on other devices than training: use vllm_mode "
                             "server, or max_staleness 0 with colocate")
        if o.max_fill_rounds < 1 or o.gradient_accumulation_steps < 1:
            raise UsageError("max_fill_rounds and gradient_accumulation_steps must be >= 1")
        if o.num_generations < 2:
            raise UsageError("num_generations (G) must be >= 2: advantages are relative to the group")
        return o

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else float(self.epsilon_high)
