"""`validate-task --strategy simia`: Simia's seed pre-filter (§2.2.1 stage 1) — completeness, logic,
format — with deterministic checks first and an LLM judgement for what rules can't see.

Input: seed records. The seed is `record.extra["conversations"]` when present (a ShareGPT list
`[{"from", "value"}]` or a transcript text, as APIGen-MT / AgentTuning ship them), else the first
trajectory (`seed_trajectory` recipe key picks another index); its tools are the trajectory's
`tools`, else `record.extra["tools"]`, else the environment's.

Deterministic checks (each a `kind=rule` verdict named after the check):
- `roles_alternate`   a SYSTEM turn only first; the first turn after it is HUMAN; HUMAN is followed by
                      the assistant (text or call); a call by its observation or another call; an
                      observation by another observation or the assistant; assistant text by
                      HUMAN, a call, or the end (a call without its observation is left to
                      `tool_result_present`)
- `tool_call_parses`  every tool call is valid JSON `{"name", "arguments": {...}}` (no repair, no
                      `<function>` tags)
- `tool_is_listed`    every call names a listed tool (a seed with no tool list fails)
- `tool_result_present` every call has an observation and every observation answers a call
- `task_finishes`     there is a HUMAN turn and the trajectory ends with an assistant reply (not a
                      call, an observation or a user message)

Then, when all pass (and `prefilter_llm` is not false), one LLM call (prompt `simia/prefilter`,
via `toolkit.roles.structured.ask_structured`) grades completeness / logic / format PASS|FAIL.
The summary verdict is `kind=llm, name=seed_prefilter, scores={completeness, logic, format}`
(1.0 / 0.0; completeness and format need both the rules and the LLM; logic is the LLM's; a score
is null when the LLM was not asked) and passes when all three are 1.0. A malformed LLM reply after
`--attempts` tries is a failed verdict with the reasons, not a crash.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.flows.simia import transcript as T
from toolkit.envs import backend_capabilities
from toolkit.io import StageError, add_provenance
from toolkit.schema import Record, Verdict
from toolkit.formats.tools import tools_text
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.simia import options as O
from toolkit import prompts
from toolkit.envs import load_env
from toolkit.flows.simia.format import messages_to_turns as to_turns
from toolkit.io import note_fallback
from toolkit.roles.structured import RoleRejected, ask_structured, need_enum, parse_json_object

CHECKS = ("roles_alternate", "tool_call_parses", "tool_is_listed", "tool_result_present", "task_finishes")
COMPLETENESS = ("tool_result_present", "task_finishes")
FORMAT = ("roles_alternate", "tool_call_parses", "tool_is_listed")


def messages_to_turns(messages: list[dict]) -> list[T.Turn]:
    """Our messages as transcript turns (Hermes text recognised; see `format.messages_to_turns`)."""
    return to_turns(messages)[0]


def extra_tools(record: Record) -> list[dict]:
    """`record.extra["tools"]` as OpenAI tools: a list, or a JSON string of one (APIGen-MT ships its
    tool list as a string); bare function dicts (`{"name", "description", "parameters"}`) are wrapped
    as `{"type": "function", "function": ...}`. Anything else is a StageError naming the field."""
    raw = record.extra.get("tools")
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise StageError(f"extra.tools is a string but not JSON: {e.msg} at char {e.pos}",
                             field="extra.tools") from None
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise StageError(f"extra.tools must be a list of tools (or a JSON string of one), got {type(raw).__name__}",
                         field="extra.tools")
    out = []
    for i, t in enumerate(raw):
        if isinstance(t, str):  # a list of JSON strings
            try:
                t = json.loads(t)
            except json.JSONDecodeError as e:
                raise StageError(f"extra.tools[{i}] is not JSON: {e.msg}", field=f"extra.tools.{i}") from None
        if not isinstance(t, dict):
            raise StageError(f"extra.tools[{i}] must be an object, got {type(t).__name__}", field=f"extra.tools.{i}")
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise StageError(f"extra.tools[{i}] has no name", field=f"extra.tools.{i}")
        out.append(t if fn is not t else {"type": "function", "function": t})
    return out


def seed_of(record: Record, index: int = 0) -> tuple[list[T.Turn], list[dict], list[dict]]:
    """(turns, tools, original messages) of the record's seed."""
    conv = record.extra.get("conversations")
    if conv is not None:
        turns = T.split_turns(conv if isinstance(conv, str) else json.dumps(conv, ensure_ascii=False))
        msgs: list[dict] = []
        tools = extra_tools(record)
    else:
        if not record.trajectories:
            raise StageError("a seed needs a trajectory (or extra.conversations)", field="trajectories")
        if index >= len(record.trajectories):
            raise StageError(f"seed_trajectory {index} out of range ({len(record.trajectories)} trajectories)",
                             field="trajectories")
        traj = record.trajectories[index]
        msgs = [m.model_dump(mode="json", exclude_none=True) for m in traj.messages]
        turns = messages_to_turns(msgs)
        tools = [t.model_dump(mode="json") for t in traj.tools] or extra_tools(record)
    if not tools:
        tools = env_tools(record)
    return turns, tools, msgs


def env_tools(record: Record) -> list[dict]:
    if record.env is None:
        return []
    env_config = record.env.config or {}  # the record's environment (data, not options)
    if env_config.get("tools"):
        return list(env_config["tools"])

    try:
        with load_env(record.env) as env:
            return env.tools("agent")
    except Exception as e:  # noqa: BLE001 - any backend's failure: the record is rejected with it
        raise StageError(f"the seed lists no tools and its environment's cannot be loaded "
                         f"({type(e).__name__}: {e})", field="env") from None


def env_policy(record: Record, messages: list[dict]) -> str:
    if record.env is not None and (record.env.config or {}).get("policy"):
        return str(record.env.config["policy"])
    for m in messages:
        if m.get("role") == "system" and m.get("content"):
            return str(m["content"])
    if record.env is not None and not backend_capabilities(record.env.backend).simulated:
        try:
            with load_env(record.env) as env:
                return env.policy()
        except Exception as e:  # noqa: BLE001 - any backend's failure is counted, the prompt says "(none)"
            note_fallback(f"policy not loadable ({type(e).__name__}): prompt without a policy")
            return ""
    return ""


def prompt_tools(tools: list[dict], compact: O.CompactTools | None) -> str:
    """The tool list for a prompt: full OpenAI function schemas, or compact ones
    (`toolkit.formats.tools.compact_tool`: first sentence, parameter types, enums, required) when
    `compact_tools` is true, or "auto" (default) and the full list is over 12,000 characters — the
    bundled airline domain's 11 tools are 35 KB in full, more than a small model's context."""
    mode = "auto" if compact is None else str(compact).lower()
    return tools_text(tools, compact=True if mode == "true" else "auto" if mode == "auto" else False)


def _kind(t: T.Turn) -> str:
    if t.role == T.ASSISTANT and ("<tool_call>" in t.text or T._FUNCTION_TAG_RE.search(t.text)):
        return T.CALL
    return t.role


_NEXT = {  # what may follow each turn kind
    T.SYSTEM: {T.HUMAN},
    T.HUMAN: {T.ASSISTANT, T.CALL},
    T.CALL: {T.OBS, T.CALL, T.ASSISTANT, T.HUMAN},  # a missing observation is tool_result_present's
    T.OBS: {T.OBS, T.ASSISTANT, T.CALL},
    T.ASSISTANT: {T.HUMAN, T.CALL},
}


def check_roles(turns: list[T.Turn]) -> list[str]:
    bad: list[str] = []
    kinds = [_kind(t) for t in turns]
    first = next((i for i, k in enumerate(kinds) if k != T.SYSTEM), None)
    for i, k in enumerate(kinds):
        if k == T.SYSTEM and i != 0:
            bad.append(f"turn {i}: SYSTEM turn after the start")
    if first is not None and kinds[first] != T.HUMAN:
        bad.append(f"turn {first}: the conversation starts with {kinds[first]}, not HUMAN")
    for i in range(len(kinds) - 1):
        a, b = kinds[i], kinds[i + 1]
        if b == T.SYSTEM:
            continue
        if b not in _NEXT.get(a, set()):
            bad.append(f"turn {i + 1}: {b} after {a}")
    return bad


def run_checks(turns: list[T.Turn], tools: list[dict]) -> dict[str, list[str]]:
    """{check name: reasons} — empty reasons = passed."""
    conv = T.to_messages(turns, repair=False)
    out: dict[str, list[str]] = {c: [] for c in CHECKS}
    out["roles_alternate"] = check_roles(turns) if turns else ["no turns"]
    for p in conv.problems:
        if p.rule in ("unparseable_call", "function_tag"):
            out["tool_call_parses"].append(str(p))
        elif p.rule == "orphan_observation":
            out["tool_result_present"].append(str(p))
        elif p.rule == "empty":
            out["task_finishes"].append(str(p))
    names = {(t.get("function") or t).get("name") for t in tools}
    calls = [tc for m in conv.messages for tc in (m.get("tool_calls") or [])]
    if not tools:
        out["tool_is_listed"].append("no tools are listed (trajectory.tools, extra.tools or the environment)")
    else:
        for tc in calls:
            if tc["function"]["name"] not in names:
                out["tool_is_listed"].append(f"call {tc['id']}: tool {tc['function']['name']!r} is not listed")
    for cid in conv.unanswered:
        name = next((tc["function"]["name"] for tc in calls if tc["id"] == cid), "?")
        out["tool_result_present"].append(f"call {cid} ({name}) has no observation")
    kinds = [_kind(t) for t in turns if t.role != T.SYSTEM]
    if T.HUMAN not in kinds:
        out["task_finishes"].append("no HUMAN turn")
    if kinds and kinds[-1] != T.ASSISTANT:
        out["task_finishes"].append(f"the trajectory ends with {kinds[-1]}, not an assistant reply")
    return out


def parse_grade(text: str | None) -> dict:
    obj = parse_json_object(text, required=("completeness", "logic", "format"))
    return {k: need_enum(obj, k, ("PASS", "FAIL")) == "PASS" for k in ("completeness", "logic", "format")} | {
        "reason": str(obj.get("reason") or "")}


@strategy("validate-task", "simia", options=O.PrefilterOptions, help="Simia seed pre-filter: rule checks (roles, call JSON, listed tools, "
                                         "results, ending) + LLM completeness/logic/format")
def build(o: O.PrefilterOptions, ctx: StageContext):
    use_llm = o.prefilter_llm
    attempts = o.attempts
    index = o.seed_trajectory

    async def fn(record: Record) -> Record:
        turns, tools, msgs = seed_of(record, index)
        checks = run_checks(turns, tools)
        tid = record.trajectories[index].id if (record.trajectories and "conversations" not in record.extra) else None
        record.verdicts = [v for v in record.verdicts if not (v.stage == "validate-task" and
                                                              (v.name in CHECKS or v.name == "seed_prefilter"))]
        for c in CHECKS:
            record.verdicts.append(Verdict(stage="validate-task", kind="rule", name=c, passed=not checks[c],
                                           reasons=checks[c], trajectory_id=tid))
        det = {c: not checks[c] for c in CHECKS}
        comp = all(det[c] for c in COMPLETENESS)
        fmt = all(det[c] for c in FORMAT)
        scores: dict[str, Any] = {"completeness": 1.0 if comp else 0.0, "logic": None,
                                  "format": 1.0 if fmt else 0.0, "checks": det}
        reasons = [f"{c}: {r}" for c in CHECKS for r in checks[c]]
        usage: dict = {}
        model = None
        if not reasons and use_llm:
            p = prompts.load("simia/prefilter")
            policy = env_policy(record, msgs or [{"role": "system", "content": t.text}
                                                 for t in turns if t.role == T.SYSTEM])
            text = p.render(policy=policy or "(none)",
                            tools=prompt_tools(tools, o.compact_tools),
                            trajectory=T.render(T.to_messages(turns).messages))
            try:
                res = await ask_structured(ctx.llm("judge"), [
                    {"role": "system", "content": "You grade agent trajectories. Reply with one JSON object only."},
                    {"role": "user", "content": text}], parse_grade, role="seed_prefilter", attempts=attempts)
                g = res.value
                usage, model = res.usage, res.model
                scores.update(completeness=1.0 if (comp and g["completeness"]) else 0.0, logic=1.0 if g["logic"] else 0.0,
                              format=1.0 if (fmt and g["format"]) else 0.0, prompt=p.id)
                reasons.append(g["reason"] or "(no reason given)")
            except RoleRejected as e:
                usage = e.usage
                scores["logic"] = 0.0
                scores["malformed"] = True
                reasons += ["seed_prefilter: malformed LLM grade"] + e.reasons
        elif not reasons:
            scores["logic"] = None
            reasons.append("LLM judgement off (prefilter_llm: false): rule checks only")
        passed = (scores["completeness"] == 1.0 and scores["format"] == 1.0
                  and (scores["logic"] == 1.0 or (scores["logic"] is None and not use_llm and not any(checks.values()))))
        record.verdicts.append(Verdict(stage="validate-task", kind="llm", name="seed_prefilter", passed=passed,
                                       score=1.0 if passed else 0.0, scores=scores, reasons=reasons,
                                       trajectory_id=tid))
        add_provenance(record, "validate-task", strategy="simia",
                       model=(model or ctx.model_name("judge")) if usage else None,
                       recipe_hash=o.recipe_hash, usage=usage)
        return record

    return fn
