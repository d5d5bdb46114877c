"""Typed options: one pydantic model per command (and per registered strategy); defaults live here.

The CLI merges defaults < recipe `defaults:` + `<command>:` < `TOOLKIT_<KEY>` env < flags
(`toolkit.config.resolve`) and validates the result against the command's model:

- an unknown key in a recipe's `<command>:` section, or in `defaults:` when no command knows it, is
  a usage error naming the key and the nearest valid one (`defaults:` keys valid for some other
  command are skipped: one recipe serves every command);
- every key can come from the environment as `TOOLKIT_<KEY>`, parsed by the field's type (lists and
  dicts as JSON/YAML); `TOOLKIT_*` variables that are not option keys (`NON_OPTION_ENV`) are left to
  whoever reads them; an unknown one warns on stderr (environments are shared), never fails.

A registered strategy may declare its own model (`@strategy(..., options=Model)`): its keys join the
command's valid keys (as optional fields: several strategies may share a key with different
defaults); the chosen strategy's defaults are filled in after the merge. A strategy's factory gets
its own model, typed, with those defaults (`toolkit.stages.strategies.build`).

Library use: `VerifyOptions(strategy=["state_diff"], lambda_err=0.2)` and the stage objects of
`toolkit.pipeline` take these models.
"""


import difflib
import functools
from typing import Any, ClassVar, Literal, Optional, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from toolkit import registry
from toolkit.io.base import UsageError
from toolkit.io.options import IOOptions

# TOOLKIT_* environment variables that are not option keys (read directly by their modules).
NON_OPTION_ENV = ("HOME", "STAGE_LOG", "STAGE_LABEL", "STAGE_GROUP", "PROMPTS", "SANDBOX", "SANDBOX_CGROUP",
                  "SANDBOX_DOCKER_IMAGE", "PYTHON", "BIN", "HTTP_TRANSPORT", "GC_TUNE", "TAU2_FULL", "TORCH",
                  "EXTRAS", "PREFILTER_LLM", "REGISTRY_CACHE", "LOGIGEN_SEARCH_CACHE", "SQLITE_DOMAIN_CACHE",
                  "GGUF_TEMPLATE_CACHE")
# families of variables read by one component each: the embedded server, `toolkit serve` (and its
# vLLM backend), the MCP operator registry
NON_OPTION_ENV_PREFIXES = ("EMBEDDED_", "SERVE_", "VLLM_", "MCP_")

# click parameter names that differ from the option key (toolkit.cli)
FLAG_KEYS = {"filter_": "filter"}
# the registry-driven commands: their options models gain the registered strategies' keys
STRATEGY_COMMANDS = ("gen-plan", "gen-task", "validate-task", "repair", "reflect", "make-verifier")

# LLM roles whose `<role>_<llm key>` options (agent_model, judge_base_url ...) core stages read;
# flows declare theirs on their strategy models (`llm_roles`).
CORE_ROLES = {"rollout": ("agent", "user", "env"), "verify": ("judge",), "eval-tau2": ("agent", "user", "judge"),
              "grpo": ("user", "judge"), "simulate-env": ("env",)}


def as_list(v: Any) -> list[str] | None:
    """A list option from a scalar, a comma-separated string or a sequence (None stays None)."""
    if v is None:
        return None
    if isinstance(v, str):
        v = [v]
    out: list[str] = []
    for item in v:
        for part in str(item).split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    return out


class Options(BaseModel):
    """Base of every options model: unknown keys are errors; `typed()` validates a mapping."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), validate_assignment=False, defer_build=True)
    command: ClassVar[str] = ""
    llm_roles: ClassVar[tuple[str, ...]] = ()
    # (field, registry kind): the registered preset that the field's value names fills the keys no
    # layer set (`with_preset`); e.g. grpo's ("variant", "variants")
    preset: ClassVar[Optional[tuple[str, str]]] = None

    @classmethod
    def typed(cls, src: Any) -> "Options":
        """This model from itself or, for library callers, a mapping of its keys (None = unset;
        an unknown or ill-typed key is a usage error naming it, as on the command line)."""
        if isinstance(src, cls):
            return src
        if isinstance(src, BaseModel):
            src = src.model_dump()
        try:
            return cls.model_validate({k: v for k, v in (src or {}).items() if v is not None})
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(x) for x in err.get("loc", ())) or "?"
            raise UsageError(f"{cls.command or cls.__name__}: {key}: {err['msg']} (got {err.get('input')!r})") from None

    @classmethod
    def of(cls, src: Any) -> "Options":
        """This model from a merged config dict (keys it does not declare are ignored; None = unset)
        or from another options model."""
        if isinstance(src, cls):
            return src
        if isinstance(src, BaseModel):
            src = src.model_dump()
        src = src or {}
        return cls.model_validate({k: v for k, v in src.items() if k in cls.model_fields and v is not None})


# ----------------------------------------------------------------------------------------------
# shared groups


class ConfigOpts(Options):
    recipe: Optional[str] = None
    print_config: bool = False
    sandbox_isolation: Optional[Literal["namespaces", "docker", "none-unsafe"]] = None
    # the operator's limits for generated code: a mapping or a JSON object string (toolkit.sandbox.parse_limits)
    sandbox_limits: Optional[Any] = None
    # the operator's MCP servers: an mcpServers JSON file (toolkit.envs.mcp.servers)
    mcp_servers: Optional[str] = None
    recipe_hash: Optional[str] = None  # set by the merge (provenance)


class LLMOpts(Options):
    """The LLMConfig keys (toolkit.llm.LLMConfig holds their defaults); None = LLMConfig's default."""

    model: Optional[str] = None
    base_url: Optional[str] = None
    api_key_env: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    max_tokens: Optional[int] = None
    timeout: Optional[float] = None
    max_retries: Optional[int] = None
    cache: Optional[str] = None
    tool_protocol: Optional[Literal["auto", "native", "hermes"]] = None
    price_prompt_per_1k: Optional[float] = None
    price_completion_per_1k: Optional[float] = None
    backoff_base: Optional[float] = None
    backoff_max: Optional[float] = None
    compact_tools: Optional[Any] = None  # bool, or simia's "auto"
    hermes_fewshot: Optional[bool] = None
    # constrained decoding of tool calls (toolkit.llm.constrain); default off
    constrain_tool_calls: Optional[Literal["off", "grammar", "json_schema", "strict"]] = None
    context_tokens: Optional[int] = Field(None, ge=1)  # the serving model's context (else asked of the server)


LLM_KEYS = tuple(f for f in LLMOpts.model_fields)
ROLE_LLM_TYPES = {f: LLMOpts.model_fields[f].annotation for f in LLM_KEYS}
ROLE_LLM_TYPES["concurrency"] = Optional[int]


class StreamOpts(IOOptions, ConfigOpts, LLMOpts):
    pass


Filter = Literal["all", "passed", "failed"]


# ----------------------------------------------------------------------------------------------
# commands


class StrategyOptions(Options):
    """Base of a strategy's own options model: the keys every registry-driven command has, so
    the model a strategy gets has them typed too."""

    strategy: Optional[str] = None
    n: Optional[int] = None          # per strategy: each has its own default
    attempts: int = Field(3, ge=1)   # tries per LLM role call
    seed: Optional[int] = None
    recipe_hash: Optional[str] = None


class StrategyCommandOptions(StrategyOptions, StreamOpts):
    """gen-plan, gen-task, validate-task, repair, reflect, make-verifier."""


class GenPlanOptions(StrategyCommandOptions):
    command: ClassVar[str] = "gen-plan"
    max_rounds: Optional[int] = None
    out_dir: Optional[str] = None


class GenTaskOptions(StrategyCommandOptions):
    command: ClassVar[str] = "gen-task"
    explorer: Optional[Literal["llm", "symbolic"]] = None


class ValidateTaskOptions(StrategyCommandOptions):
    command: ClassVar[str] = "validate-task"
    filter: Filter = "all"
    min_qs: Optional[float] = None
    theta_qq: Optional[float] = None
    theta_sr: Optional[float] = None
    theta_tn: Optional[float] = None


class RepairOptions(StrategyCommandOptions):
    command: ClassVar[str] = "repair"
    max_rounds: Optional[int] = None


class ReflectOptions(StrategyCommandOptions):
    command: ClassVar[str] = "reflect"
    prompts_dir: Optional[str] = None


class MakeVerifierOptions(StrategyCommandOptions):
    command: ClassVar[str] = "make-verifier"
    filter: Filter = "all"
    out_dir: Optional[str] = None


class SimulateEnvOptions(StreamOpts):
    command: ClassVar[str] = "simulate-env"
    llm_roles: ClassVar[tuple[str, ...]] = CORE_ROLES["simulate-env"]
    strategy: Literal["simia", "astra"] = "simia"
    fault_rate: float = 0.0
    mode: str = "call"  # a registered simulate-env mode (registry scope "simulate-env:mode")
    n: int = Field(1, ge=1)  # --mode trajectory: passes (new trajectories) per seed record
    # --mode trajectory (Simia appendix C)
    prompt_family: Literal["apigen", "officebench"] = "apigen"
    temperatures: Optional[list[float]] = None  # cycled over the passes (a list or "0.2,0.9")
    temperature_spread: float = 0.3
    seed_trajectory: int = 0

    @field_validator("temperatures", mode="before")
    @classmethod
    def _temperature_list(cls, v: Any) -> Any:
        return as_list(v) if isinstance(v, str) else v


class RolloutOptions(StreamOpts):
    command: ClassVar[str] = "rollout"
    llm_roles: ClassVar[tuple[str, ...]] = CORE_ROLES["rollout"]
    n: int = Field(1, ge=1)
    agent_kind: Literal["llm", "replay"] = "llm"
    max_turns: int = 30
    max_tool_errors: int = 5
    max_context_tokens: int = 16000
    first_message: Literal["auto", "instruction", "simulate"] = "auto"
    # drop: the agent model gets no system prompt (the domain policy) - for a model trained with
    # sft/grpo `system_prompt: drop`; trajectories keep it either way
    agent_system_prompt: Literal["keep", "drop"] = "keep"
    user_simulator: str = "auto"  # a registered user simulator (kind "users"): auto | llm | scripted
    distractor_tools: int = Field(0, ge=0)
    distractor_mode: str = "auto"  # a registered distractor source (kind "distractors"); auto: by flow
    distractor_pool: Optional[list[Any]] = None
    embed_base_url: Optional[str] = None
    embed_model: Optional[str] = None


class VerifyOptions(StreamOpts):
    command: ClassVar[str] = "verify"
    llm_roles: ClassVar[tuple[str, ...]] = CORE_ROLES["verify"]
    strategy: list[str] = ["state_diff"]
    require: Optional[list[str]] = None
    filter: Filter = "all"
    judge_rubric: str = "sea"
    lambda_err: float = Field(0.1, ge=0)
    proximity_epsilon: Optional[float] = None  # None: toolkit.scoring.rewards.DEFAULT_EPSILON
    diff_exclude: Optional[list[str]] = None
    sandbox: Literal["auto", "process", "docker"] = "auto"
    code_cpu_seconds: float = 10.0
    code_wall_seconds: float = 20.0
    code_memory_mb: int = 1024
    # the code verifier's reward: binary = 1.0 iff overall_pass (EigenData §5: "only a full match"
    # is success); verifier = the verifier's own (possibly partial) `reward`
    code_reward: Literal["binary", "verifier"] = "binary"
    judge_attempts: int = 3
    judge_threshold: float = 0.5
    f1_threshold: Optional[float] = None
    f1_epsilon: Optional[float] = None  # None: toolkit.scoring.rewards.DEFAULT_EPSILON
    replay_memo: bool = True
    penalize_invalid_calls: bool = True
    # state_diff on a task whose target is its start state (refusal / read-only) also needs: no
    # write attempted, the reference reads done, a text answer with every communicate_info item
    # (tau2's DB + ACTION + COMMUNICATE); False = the bare DIFF, which any do-nothing episode passes
    no_write_basis: bool = True
    # actions: strict = expected actions done by successful calls AND no unexpected successful write
    # AND no forbidden write attempt (docs/scoring.md); subset = tau2's rule (every expected action
    # matches some call; extra calls, harmful ones included, are free)
    actions_mode: Literal["strict", "subset"] = "strict"
    min_pass_rate: Optional[float] = Field(None, ge=0.0, le=1.0)
    grounding_match: Literal["exact", "subset"] = "exact"  # simia grounding (toolkit.flows.simia.grounding)
    grounding_threshold: float = Field(1.0, ge=0.0, le=1.0)  # simia grounding: passed iff share >= this

    @field_validator("strategy", "require", "diff_exclude", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return as_list(v)

    @field_validator("judge_rubric", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return str(v).lower() if v is not None else v


class EvalTau2Options(ConfigOpts, LLMOpts):
    command: ClassVar[str] = "eval-tau2"
    llm_roles: ClassVar[tuple[str, ...]] = CORE_ROLES["eval-tau2"]
    input: Optional[str] = None
    output: Optional[str] = None
    resume: bool = False
    rejects: Optional[str] = None
    progress: Optional[bool] = None
    concurrency: int = 4
    domain: str = "airline"
    k: int = Field(1, ge=1)
    split: Optional[str] = None
    task_ids: Optional[str] = None
    oracle: bool = False
    max_turns: int = 30
    summary_json: Optional[str] = None
    chart: Optional[str] = None
    compare: Literal["none", "paper"] = "none"
    exclude_infra_errors: bool = False
    attribute: bool = False
    no_official_check: bool = False


class TrainOptions(ConfigOpts):
    """sft / grpo: besides these, any key of trl's config dataclasses passes through (checked by
    the trainer), so these models allow extra keys."""

    model_config = ConfigDict(extra="allow", protected_namespaces=(), defer_build=True)
    input: Optional[str] = None
    rejects: Optional[str] = None
    shard: Optional[str] = None
    limit: Optional[int] = None
    progress: Optional[bool] = None
    model: Optional[str] = None
    output_dir: Optional[str] = None
    chat_template: Optional[str] = None
    resume_from_checkpoint: Optional[str] = None
    max_steps: Optional[int] = None
    learning_rate: Optional[float] = None
    seed: Optional[int] = None
    tool_schema: Optional[Literal["full", "compact", "minimal"]] = None
    model_dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = None
    system_prompt: Optional[Literal["keep", "drop"]] = None
    lora: Optional[Any] = None


class SFTOptions(TrainOptions):
    command: ClassVar[str] = "sft"
    output: Optional[str] = None
    role: Literal["assistant", "user"] = "assistant"
    filter: Filter = "all"
    min_reward: Optional[float] = None
    export: Optional[str] = None  # a registered export format (kind "exporters")
    num_train_epochs: Optional[float] = None
    merge_lora: Optional[bool] = None
    # forward a batch's common prefix (system prompt, tools) once (exact; toolkit.train.prefix);
    # None = auto: one process, no DeepSpeed / FSDP / gradient checkpointing
    shared_prefix: Optional[bool] = None
    # train on the assistant (or user) turns only (false: every token); the mask is built here, in
    # the dataset, from the chat template's {% generation %} markers
    assistant_only_loss: bool = True
    max_length: Optional[int] = Field(None, ge=1)  # tokens per example (longer ones are cut); None = no cut


GRPO_LOSS_TYPES = ("grpo", "bnpo", "dapo", "group_token", "dr_grpo", "turn")  # toolkit.train.advantages.LOSS_TYPES


class GRPOOptions(Options):
    """grpo's own keys and their defaults, the one model the trainer reads (toolkit.train.grpo).
    The chosen `variant` (registry kind "variants") presets some of them: the effective value of a
    key is model default < variant preset < recipe < `TOOLKIT_<KEY>` env < flag (`with_preset`), and
    `grpo --print-config` prints exactly that."""

    preset: ClassVar[Optional[tuple[str, str]]] = ("variant", "variants")
    variant: str = "grpo"
    num_generations: int = Field(4, ge=2)  # G: advantages are relative to the group
    tasks_per_step: int = Field(2, ge=1)   # groups per step (ASTRA: the batch size n, in groups)
    max_steps: int = 10
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant"   # any transformers scheduler name (constant, cosine, linear ...)
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # a step whose gradient is exactly zero (every group zero-variance or filtered out, beta 0): skip =
    # no optimizer update (Adam's moments would otherwise keep moving the weights along the last
    # informative gradient for many steps, weight decay would shrink them); step = TRL's behaviour
    empty_steps: Literal["skip", "step"] = "skip"
    temperature: float = 1.0               # the policy's sampling temperature (> 0: checked before loading)
    top_p: float = 1.0
    max_turns: int = 8
    # who opens an episode: instruction (task.instruction verbatim) | simulate (the user simulator,
    # as rollout's first_message); read by the episode engine
    first_message: Literal["instruction", "simulate"] = "instruction"
    max_tool_errors: int = 5
    max_new_tokens: int = 256              # per agent turn
    max_total_tokens: int = 4096           # per episode (context)
    num_iterations: int = Field(1, ge=1)   # policy updates per batch (mu); > 1 uses importance ratios
    beta: float = 0.0                      # KL to the reference model (k3 estimator); 0 = no reference model
    epsilon: float = 0.2                   # clip low
    epsilon_high: Optional[float] = None   # clip high (DAPO clip-higher); None = epsilon
    loss_type: Literal[GRPO_LOSS_TYPES] = "grpo"  # type: ignore[valid-type]
    advantage: Literal["grpo", "ta_grpo"] = "grpo"
    scale_rewards: bool = True             # divide by sigma (False: Dr. GRPO)
    filter: Literal["none", "dynamic", "adaptive"] = "none"  # zero-variance groups: kept (advantage 0), dropped, refilled
    delta: float = 0.0                     # a group is valid when Std(R) > delta
    max_fill_rounds: int = Field(16, ge=1)  # rollout rounds per step before training on what is valid
    verify_strategy: list[str] = ["state_diff"]
    judge_rubric: Optional[str] = None     # verify's judge rubric (None: verify's default)
    lambda_err: float = Field(VerifyOptions.model_fields["lambda_err"].default, ge=0)  # r_t of a penalized call
    # r_t = -lambda_err also for calls to unknown tools / with invalid arguments (true), or for policy
    # violations only (false: LOGIGEN eq. 4, the ta-grpo preset); verify's key of the same name
    penalize_invalid_calls: bool = VerifyOptions.model_fields["penalize_invalid_calls"].default
    micro_batch: int = Field(1, ge=1)      # sequences per forward in the no-grad passes (old / reference log-probs)
    # forward the rows' common prefix (system prompt, tools, a group's task) once per batch and repeat
    # its KV cache (exact gradient); None = auto: on with one process, no DeepSpeed / FSDP / checkpointing
    shared_prefix: Optional[bool] = None
    gradient_accumulation_steps: int = Field(1, ge=1)  # slices of each rank's rows, one backward each
    save_steps: int = 0                    # 0 = only at the end
    seed: int = 0
    tool_schema: Literal["full", "compact", "minimal"] = "full"
    system_prompt: Literal["keep", "drop"] = "keep"
    distractor_tools: int = Field(0, ge=0)  # ASTRA irrelevant-tool mixing from the rollout side
    # a registered distractor source (auto: similarity bands for ASTRA records)
    distractor_mode: str = "auto"
    # transformers: HF generate on the training model; llamacpp: llama.cpp on an F16 GGUF of the
    # current weights, exported each step (CPU, llama checkpoints); vllm: TRL's; scripted: tests
    generation: Literal["transformers", "llamacpp", "vllm", "scripted"] = "transformers"
    scripted_completions: Optional[str] = None  # generation scripted: JSON {episode key: [turn texts]} or [texts]
    vllm_mode: Literal["server", "colocate"] = "server"  # server (`trl vllm-serve`) | colocate (in each process)
    vllm_server_host: str = "127.0.0.1"    # also TOOLKIT_VLLM_SERVER_HOST (the sbatch files pass it)
    vllm_server_port: int = 8000           # also TOOLKIT_VLLM_SERVER_PORT
    vllm_server_timeout: float = 10.0      # seconds: the early reachability check and TRL's own wait
    importance_sampling: bool = True       # correct sampler/trainer mismatch with the sampler's log-probs
    importance_sampling_cap: float = 3.0   # per-token ratio truncated at this value
    report_to: str = "none"                # transformers trackers: none | wandb | tensorboard | ...
    gradient_checkpointing: Optional[bool] = None  # None: TRL's default on GPU, off on CPU
    # asynchronous rollouts: generation of step k+1 overlaps training of step k with weights at most
    # this many updates old; 0 = on-policy (the papers' setting; pays only with generation on other
    # devices, docs/training.md)
    max_staleness: int = Field(0, ge=0)
    turn_ratio: Literal["token", "turn"] = "token"  # ta-grpo: per-token ratios | the turn's ratio (eq. 5)
    log_completions: bool = False
    strict_tool_calls: bool = False        # a <tool_call> block must be valid JSON as generated (no repair)
    trl: Optional[dict] = None             # any other trl.GRPOConfig field (deepspeed, fsdp, bf16 ...)

    @field_validator("verify_strategy", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return as_list(v) or ["state_diff"]

    @classmethod
    def from_config(cls, cfg: Any) -> "GRPOOptions":
        """The trainer's options from the CLI's merged options or a plain mapping (library use, tests):
        keys it does not declare are ignored, None means unset; the variant's preset filled in; the
        combinations that cannot run are usage errors."""
        if isinstance(cfg, BaseModel):
            cfg = {k: getattr(cfg, k) for k in cfg.model_fields_set if k in cls.model_fields}
        try:
            o = with_preset(typed_options(cls, cfg))
        except ValueError as e:
            raise UsageError(str(e)) from None
        assert isinstance(o, GRPOOptions)
        if o.generation == "scripted" and not o.scripted_completions:
            raise UsageError("generation scripted needs scripted_completions (a JSON file)")
        if o.max_staleness and o.generation == "llamacpp":
            raise UsageError("max_staleness > 0 needs generation on other devices than training: generation "
                             "llamacpp samples in the training process (use max_staleness 0)")
        if o.max_staleness and o.generation == "vllm" and o.vllm_mode == "colocate":
            raise UsageError("max_staleness > 0 needs generation on other devices than training: use vllm_mode "
                             "server, or max_staleness 0 with colocate")
        return o

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else float(self.epsilon_high)


class GRPOCommandOptions(GRPOOptions, TrainOptions, LLMOpts):
    model_config = ConfigDict(extra="allow", protected_namespaces=(), defer_build=True)
    command: ClassVar[str] = "grpo"
    llm_roles: ClassVar[tuple[str, ...]] = CORE_ROLES["grpo"]
    rollouts: Optional[str] = None
    use_cpu: bool = False  # train on the CPU even where an accelerator exists (TRL's use_cpu)


COMMAND_MODELS: dict[str, type[Options]] = {m.command: m for m in (
    GenPlanOptions, GenTaskOptions, ValidateTaskOptions, RepairOptions, ReflectOptions, MakeVerifierOptions,
    SimulateEnvOptions, RolloutOptions, VerifyOptions, EvalTau2Options, SFTOptions, GRPOCommandOptions)}


# ----------------------------------------------------------------------------------------------
# a command's full model: its own fields + its strategies' + role-prefixed LLM keys


def _optional(tp: Any) -> Any:
    if get_origin(tp) is Optional or type(None) in get_args(tp):
        return tp
    return Optional[tp]


@functools.lru_cache(maxsize=None)
def _build(command: str, strategy_models: tuple[type[Options], ...]) -> type[Options]:
    base = COMMAND_MODELS[command]
    fields: dict[str, Any] = {}
    roles = set(base.llm_roles)
    for sm in strategy_models:
        roles |= set(sm.llm_roles)
        for name, f in sm.model_fields.items():
            if name in base.model_fields or name in fields:
                continue
            fields[name] = (_optional(f.annotation), None)
    for role in sorted(roles):
        for key, tp in ROLE_LLM_TYPES.items():
            name = f"{role}_{key}"
            if name not in base.model_fields and name not in fields:
                fields[name] = (tp, None)
    name = base.__name__.replace("Options", "") + "FullOptions"
    return create_model(name, __base__=base, **fields)  # type: ignore[call-overload]


def model_for(command: str, strategy_models: tuple[type[Options], ...] = ()) -> type[Options]:
    """The model a command's merged config validates against (cached per strategy set)."""
    return _build(command, tuple(strategy_models))


def nearest(key: str, valid: set[str] | list[str]) -> str | None:
    m = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return m[0] if m else None


def env_field_value(annotation: Any, raw: str) -> Any:
    """A `TOOLKIT_<KEY>` string for a field: strings stay strings, lists/dicts/Any are parsed as
    JSON (YAML flow syntax also works); scalars are left to the model's coercion ("8" -> 8,
    "true" -> True)."""
    import yaml

    def structured(tp: Any) -> bool:
        if tp is Any:
            return True
        origin = get_origin(tp)
        if origin in (list, dict, tuple, set):
            return True
        if tp in (list, dict, tuple, set):
            return True
        return any(structured(a) for a in get_args(tp) if a is not type(None)) if origin is not Literal else False

    if structured(annotation):
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError:
            return raw
    return raw


def typed_options(model: type[Options], src: Any) -> Any:
    """`model.of(src)` for library entry points that accept a dict or a model: an invalid value is
    a toolkit.io.UsageError naming the key. Unlike `model.typed`, keys the model does not declare
    are ignored (an engine reading its keys out of another command's options: grpo's verifier)."""
    try:
        return model.of(src)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err.get("loc", ())) or "?"
        raise UsageError(f"{key}: {err['msg']} (got {err.get('input')!r})") from None


def preset_values(model: type[Options], name: Any) -> dict:
    """The registered preset (registry kind `model.preset[1]`) that `name` names, restricted to the
    model's keys. Unknown name: ValueError naming the registered ones."""
    field_name, kind = model.preset or ("", "")
    e = registry.lookup(kind, str(name))
    if e is None:
        raise ValueError(f"unknown {field_name} {name!r}; choose from {', '.join(registry.names(kind))}")
    return {k: v for k, v in dict(e.obj).items() if k in model.model_fields}


def with_preset(opts: Options) -> Options:
    """`opts` with the preset its `preset` field names filled in for every key no layer set
    (`model_fields_set`): model default < preset < recipe < env < flags. Options without a preset
    are returned as they are. A bad preset value is a ValueError naming the key."""
    model = type(opts)
    if not model.preset:
        return opts
    field_name = model.preset[0]
    preset = {k: v for k, v in preset_values(model, getattr(opts, field_name)).items()
              if k not in opts.model_fields_set}
    if not preset:
        return opts
    given = {k: getattr(opts, k) for k in opts.model_fields_set}
    from pydantic import ValidationError

    try:
        return model.model_validate({**given, **(opts.__pydantic_extra__ or {}), **preset})
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err.get("loc", ())) or "?"
        raise ValueError(f"{field_name} {getattr(opts, field_name)!r} presets {key}: {err['msg']}") from None
