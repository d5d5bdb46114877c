"""THE record schema (pydantic v2). The only place record fields are defined.

One JSONL line = one `Record`: an envelope that stages fill in as it flows down a pipe. A stage
never drops fields it does not own. Unknown keys are refused at the top level and inside the
strict parts (messages, tool calls, verdicts) so that typos fail loudly; users carry their own
data under the documented `extra` field (a free-form dict present on Record, Task, Plan, EnvRef
and Trajectory).

Messages use the OpenAI chat format (roles system/user/assistant/tool, `tool_calls` with JSON-string
`arguments`, `tool_call_id` on tool results) because TRL, vLLM, HF datasets and LLaMA-Factory read it.

Versioning: `SCHEMA_VERSION` is written into every record's `schema` field. Readers accept the
current major version; `schemas/record.schema.json` is generated from this module
(`toolkit schema export`) and a test fails when it is stale.
"""


import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = "toolkit.record/v1"
FLOWS = ("eigendata", "astra", "simia", "logigen", "tau2", "custom")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,255}$")


# allow_inf_nan=False: a NaN/Infinity reward, score or cost is a validation error naming the field,
# never a float that pydantic would write back as null
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, defer_build=True)


class _Open(BaseModel):
    """Strict on declared fields, with a free-form `extra` dict for user data."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, defer_build=True)
    extra: dict[str, Any] = Field(default_factory=dict, description="Free-form user data; never interpreted.")


def _check_id(v: str | None) -> str | None:
    if v is not None and not _ID_RE.match(v):
        raise ValueError(
            "ids are 1-256 chars of letters, digits and ._:/@+=- and start with a letter or digit"
        )
    return v


# ---------------------------------------------------------------------------------------------
# Messages (OpenAI chat format)


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON-encoded object, as in the OpenAI API")

    @field_validator("arguments", mode="before")
    @classmethod
    def _args_to_json(cls, v: Any) -> Any:
        # tolerant on input: a dict is encoded; a string must decode to a JSON object
        if isinstance(v, dict):
            return json.dumps(v, ensure_ascii=False, sort_keys=True)
        return v

    @field_validator("arguments")
    @classmethod
    def _args_are_object(cls, v: str) -> str:
        try:
            obj = json.loads(v) if v.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments is not valid JSON: {e.msg} at char {e.pos}") from None
        if not isinstance(obj, dict):
            raise ValueError("arguments must encode a JSON object")
        return v

    def args(self) -> dict:
        return json.loads(self.arguments) if self.arguments.strip() else {}


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> "Message":
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError(f"only assistant messages carry tool_calls (got role {self.role!r})")
        if self.role != "tool" and self.tool_call_id:
            raise ValueError("tool_call_id is only valid on role 'tool'")
        if self.role in ("system", "user") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self


class ToolSchema(_Strict):
    """An OpenAI function tool: {"type": "function", "function": {name, description, parameters}}."""

    type: Literal["function"] = "function"
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _has_name(cls, v: dict) -> dict:
        if not isinstance(v.get("name"), str) or not v["name"]:
            raise ValueError("function.name is required")
        return v


# ---------------------------------------------------------------------------------------------
# Environment reference


class EnvRef(_Open):
    backend: str = Field(description="sqlite | python | simulated | tau2 | any registered backend")
    id: str | None = Field(None, description="bundled domain or tau2 domain name")
    path: str | None = Field(None, description="environment directory or file")
    state: dict[str, Any] | None = Field(None, description="inline initial state (small states)")
    state_ref: str | None = Field(None, description="sha256 of the canonical initial-state dump")
    config: dict[str, Any] = Field(default_factory=dict, description="backend-specific settings")


# ---------------------------------------------------------------------------------------------
# Plan


class Plan(_Open):
    id: str | None = None
    synthesis_plan: str | None = None
    evaluation_rules: str | None = None
    prompt_set: str | None = Field(None, description="prompt-set id")
    prompt_version: str | None = None
    tool_chain: list[str] | None = Field(None, description="ASTRA tool chain (walk in the transition graph)")
    policy_id: str | None = None


# ---------------------------------------------------------------------------------------------
# Task


class UserScenario(_Open):
    persona: str | None = None
    reason_for_call: str | None = None
    known_info: str | None = None
    unknown_info: str | None = None
    instructions: str | None = Field(None, description="behaviour instructions for the user simulator")


class Action(_Strict):
    """An expected (reference) action: a tool call with its arguments."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    compare_args: list[str] | None = Field(None, description="argument keys compared; None = all")
    side: Literal["agent", "user"] = "agent"
    id: str | None = None
    expect_error: str | None = Field(
        None, description="error code this reference call is expected to return (e.g. POLICY_VIOLATION: "
                          "a violating attempt before a correction); replay expects that error, the state is unchanged")


class SubQuestion(_Strict):
    """ASTRA QA decomposition node: q_i, a_i and dependencies d_i (indices of earlier nodes)."""

    q: str
    a: Any = None
    d: list[int] = Field(default_factory=list)
    tool: str | None = None


class GroundTruth(_Open):
    actions: list[Action] = Field(default_factory=list)
    sub_questions: list[SubQuestion] = Field(default_factory=list)
    target_state: dict[str, Any] | None = None
    target_state_ref: str | None = None
    must_have_functions: list[str] = Field(default_factory=list)
    rubrics: list[str] = Field(default_factory=list)
    communicate_info: list[str] = Field(default_factory=list)
    nl_assertions: list[str] = Field(default_factory=list)
    final_answer: Any = None
    turns: list[list[Action]] | None = Field(
        None, description="reference actions per scripted user turn (task.user_turns; BFCL multi-turn): the "
                          "replay agent answers turn k with turns[k], then ends its reply")


class Task(_Open):
    instruction: str | None = Field(None, description="user-facing instruction / first user message")
    user_scenario: UserScenario | None = None
    ground_truth: GroundTruth | None = None
    difficulty: str | None = None
    complexity: dict[str, Any] = Field(default_factory=dict)
    user_turns: list[list[dict[str, Any]]] | None = Field(
        None, description="scripted user turns (BFCL multi-turn): turn k's user messages; rollout's `scripted` "
                          "user simulator sends turn k+1 when the agent ends its reply")
    held_out_tools: dict[str, list[str]] = Field(
        default_factory=dict, description="tool names offered only from the given turn index on (BFCL miss_func)")


# ---------------------------------------------------------------------------------------------
# Trajectories


class Step(_Strict):
    """One executed tool call inside a trajectory (parallel to the tool messages)."""

    tool_call_id: str
    name: str
    side: Literal["agent", "user"] = "agent"
    arguments: dict[str, Any] | None = Field(
        None, description="set for user-side calls (dual control), which have no assistant message")
    ok: bool
    error_code: str | None = None
    state_hash: str | None = Field(None, description="environment state hash after the call")
    reward: float | None = Field(None, description="dense per-step reward r_t once verified")
    proximity: float | None = None


class Usage(_Strict):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    cache_hits: int = 0
    cost: float = 0.0


TERMINATIONS = (
    "user_stop", "transfer", "out_of_scope", "agent_stop", "max_turns", "max_errors",
    "context_length", "error", "replay_done", "simulated",
)


class Trajectory(_Open):
    id: str
    messages: list[Message]
    tools: list[ToolSchema] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    initial_state_hash: str | None = None
    final_state_hash: str | None = None
    termination: str | None = Field(None, description="one of " + ", ".join(TERMINATIONS))
    error: str | None = None
    agent_model: str | None = None
    user_model: str | None = None
    usage: Usage = Field(default_factory=Usage)
    reward: float | None = None
    scores: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _tid(cls, v: str) -> str:
        return _check_id(v)  # type: ignore[return-value]

    @model_validator(mode="after")
    def _tool_results_answer_calls(self) -> "Trajectory":
        open_ids: set[str] = set()
        for i, m in enumerate(self.messages):
            if m.role == "assistant" and m.tool_calls:
                open_ids |= {tc.id for tc in m.tool_calls}
            elif m.role == "tool" and m.tool_call_id not in open_ids:
                raise ValueError(f"messages[{i}]: tool_call_id {m.tool_call_id!r} answers no earlier tool call")
        return self


# ---------------------------------------------------------------------------------------------
# Verdicts, verifier, provenance


class Verdict(_Strict):
    stage: str = Field(description="command that produced it, e.g. verify, validate-task")
    kind: Literal["rule", "llm", "state_diff", "actions", "f1", "verifier", "tau2", "schema"]
    name: str | None = Field(None, description="strategy / rule name")
    passed: bool
    score: float | None = None
    scores: dict[str, Any] = Field(default_factory=dict)
    reasons: list[str] = Field(default_factory=list)
    attribution: Literal["task", "trajectory", "user_simulator", "infrastructure"] | None = None
    trajectory_id: str | None = None


class Verifier(_Strict):
    spec: Literal["state_diff", "actions", "f1", "code"]
    source: str | None = Field(None, description="for spec=code: Python defining evaluate_submission(reference, eval)")
    self_test: dict[str, Any] | None = None


class Provenance(_Strict):
    command: str
    version: str
    strategy: str | None = None
    recipe_hash: str | None = None
    model: str | None = None
    time: str
    cost: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sandbox_isolation: str | None = None  # isolation generated code ran under in this command
    # sandbox limits this record's data asked for and did not get (the operator's applied instead)
    sandbox_clamped: list[str] | None = None
    # fallback paths taken for this record in this command (context compaction, a rule instead of
    # an LLM, tools that could not be loaded ...): also counted in the summary line and yield table
    fallbacks: list[str] | None = None


# ---------------------------------------------------------------------------------------------
# The record


class Record(_Open):
    id: str
    parent_id: str | None = None
    schema_: str = Field(SCHEMA_VERSION, alias="schema")
    flow: str | None = Field(None, description="one of " + ", ".join(FLOWS))
    tags: list[str] = Field(default_factory=list)
    env: EnvRef | None = None
    plan: Plan | None = None
    task: Task | None = None
    trajectories: list[Trajectory] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)
    verifier: Verifier | None = None
    provenance: list[Provenance] = Field(default_factory=list)

    @field_validator("id", "parent_id")
    @classmethod
    def _ids(cls, v: str | None) -> str | None:
        return _check_id(v)

    @field_validator("schema_")
    @classmethod
    def _version(cls, v: str) -> str:
        major = SCHEMA_VERSION.rsplit("/", 1)[0]
        if not v.startswith(major + "/"):
            raise ValueError(f"unsupported schema {v!r}; this toolkit reads {major}/v1")
        return v

    @field_validator("trajectories")
    @classmethod
    def _unique_traj_ids(cls, v: list[Trajectory]) -> list[Trajectory]:
        seen: set[str] = set()
        for t in v:
            if t.id in seen:
                raise ValueError(f"duplicate trajectory id {t.id!r}")
            seen.add(t.id)
        return v

    def dump(self) -> dict:
        """The JSON-able dict written to JSONL (by alias; None kept so every line has the same keys)."""
        return self.model_dump(mode="json", by_alias=True)


def json_schema() -> dict:
    """JSON Schema of one record line, as checked into schemas/record.schema.json."""
    s = Record.model_json_schema(by_alias=True)
    s["$id"] = "https://toolkit.local/schemas/record.schema.json"
    s["title"] = "Record"
    s["description"] = (__doc__ or "").strip().splitlines()[0] + f" Version {SCHEMA_VERSION}."
    return s
