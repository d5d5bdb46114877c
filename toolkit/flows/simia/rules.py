"""`repair --strategy rules`: Simia's rule-based post-process (§2.2.1 stage 4). Deterministic, no LLM.

Per trajectory, in order:
1. messages: a simulated trajectory (`extra.simia.raw`, from `simulate-env --mode trajectory`) is
   re-read from its raw text with repair on; any other trajectory from its messages, where Hermes
   text (`<tool_call>` in assistant content, `<tool_response>` user turns) is normalized to native
   `tool_calls` / `tool` messages (fix `hermes_to_native`). Repairs (fixes): `json_repaired`
   (malformed argument JSON: unescaped quotes, missing brackets — `toolkit.llm.toolcalls.repair_json`),
   `function_tag` (`<function>` instead of `<tool_call>`), `system_dropped` (a SYSTEM turn the
   synthesizer was told not to write);
2. system prompt: the target deployment's (`system_prompt` or `system_prompt_file` recipe keys)
   replaces the trajectory's (fix `system_replaced`); else the seed's system prompt is kept;
3. drops (first failing rule wins): `llm_error` (the simulation pass's LLM call failed), `empty`, `unparseable_call`, `orphan_observation`,
   `unanswered_call`, `unknown_tool` (a call to a tool not offered: trajectory.tools, else the
   env's), `schema_violation` (arguments against the tool's parameter schema:
   `toolkit.envs.python.validate_arguments` — required, unknown keys, types, enums),
   `no_user_turn`, `truncated` (the simulation reply was cut at max_tokens), `unfinished` (the last message is not an assistant reply), `invalid_messages`.

Outcome (documented choice): each trajectory gets a `Verdict(stage="repair", kind="rule",
name="simia_rules", trajectory_id, scores={"fixes": {rule: count}, "dropped": rule|None})`. Dropped
trajectories are removed from the record (their failed verdict stays, with the reason); a record
left with no trajectory is rejected (StageError, so it goes to --rejects) with the message
`<rule>: <detail>` — the one-trajectory records `simulate-env --mode trajectory` writes are thus
kept or rejected whole, and the yield table counts drops per rule from the rejects. Kept
trajectories keep their id, `error` is cleared and `extra.simia.raw` is removed unless `keep_raw`.
Hermes text for export: `toolkit.flows.simia.format.to_hermes`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from pydantic import TypeAdapter

from toolkit.flows.simia import transcript as T
from toolkit.io import StageError, UsageError, add_provenance
from toolkit.schema import Message, Record, Trajectory, Verdict
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.simia import options as O
from toolkit.envs.python import validate_arguments
from toolkit.flows.simia.format import messages_to_turns
from toolkit.flows.simia.prefilter import env_tools

_MESSAGES = TypeAdapter(list[Message])

DROP_RULES = ("llm_error", "truncated", "empty", "unparseable_call", "orphan_observation", "unanswered_call", "unknown_tool",
              "schema_violation", "no_user_turn", "unfinished", "invalid_messages")
FIX_RULES = ("json_repaired", "function_tag", "system_dropped", "hermes_to_native", "system_replaced")


class Dropped(Exception):
    def __init__(self, rule: str, detail: str):
        super().__init__(f"{rule}: {detail}")
        self.rule, self.detail = rule, detail


def tool_index(tools: list[dict]) -> dict[str, dict]:
    out = {}
    for t in tools:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn.get("name"), str):
            out[fn["name"]] = fn.get("parameters") or {}
    return out


def clean_messages(traj: dict, tools: dict[str, dict], system_prompt: str | None = None) -> tuple[list[dict], list[str]]:
    """The rule post-process of one trajectory (a dict in record JSON shape): (messages, fixes) or
    raises Dropped(rule, detail). Pure and deterministic."""
    sim = (traj.get("extra") or {}).get("simia") or {}
    fixes: list[str] = []
    system: str | None
    if sim.get("llm_error"):
        raise Dropped("llm_error", "the simulation call failed (see the trajectory's error)")
    if sim.get("finish_reason") == "length":  # the cause, before whatever the cut text breaks
        raise Dropped("truncated", "the simulated trajectory was cut at max_tokens (finish_reason=length): "
                                   "raise simulate-env's max_tokens")
    if isinstance(sim.get("raw"), str):
        conv = T.parse(sim["raw"], repair=True)
        system = sim.get("system")
        if system is None:
            first = (traj.get("messages") or [{}])[0]
            system = first.get("content") if first.get("role") == "system" else None
    else:
        msgs = list(traj.get("messages") or [])
        system = None
        if msgs and msgs[0].get("role") == "system":
            system = msgs[0].get("content")
            msgs = msgs[1:]
        turns, hermes = messages_to_turns(msgs)
        conv = T.to_messages(turns, repair=True)
        if hermes:
            fixes.append("hermes_to_native")
    fixes += conv.fixes
    if conv.problems:
        p = conv.problems[0]
        raise Dropped(p.rule, str(p).split(": ", 1)[-1] if ": " in str(p) else str(p))
    if conv.unanswered:
        raise Dropped("unanswered_call", f"tool call(s) {', '.join(conv.unanswered)} have no observation")
    messages = conv.messages
    for i, m in enumerate(messages):
        for tc in m.get("tool_calls") or []:
            name = tc["function"]["name"]
            if name not in tools:
                raise Dropped("unknown_tool", f"message {i} calls {name!r}, not among the offered tools "
                                              f"({', '.join(sorted(tools)) or 'none'})")
            err = validate_arguments(tools[name], json.loads(tc["function"]["arguments"]))
            if err:
                raise Dropped("schema_violation", f"message {i} {name}: {err}")
    if not any(m["role"] == "user" for m in messages):
        raise Dropped("no_user_turn", "no user message")
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant" or last.get("tool_calls") or not (last.get("content") or "").strip():
        raise Dropped("unfinished", "the trajectory does not end with an assistant reply")
    if system_prompt is not None:
        fixes.append("system_replaced")
        system = system_prompt
    return ([{"role": "system", "content": system}] if system else []) + messages, fixes


def load_system_prompt(opts: O.RulesOptions) -> str | None:
    if opts.system_prompt is not None:
        return opts.system_prompt
    path = opts.system_prompt_file
    if path:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"system_prompt_file: cannot read {path}: {e}") from None
    return None


def _env_tools(record: Record) -> list[dict]:
    return env_tools(record)


@strategy("repair", "rules", options=O.RulesOptions, help="Simia rule post-process: repair call JSON / <function> tags, drop SYSTEM "
                                  "turns, unknown tools, schema violations; native tool_calls; system swap")
def build(opts: O.RulesOptions, ctx: StageContext):
    system_prompt = load_system_prompt(opts)
    keep_raw = opts.keep_raw

    def fn(record: Record) -> Record:
        if not record.trajectories:
            raise StageError("record has no trajectories to post-process", field="trajectories")
        kept: list[Trajectory] = []
        drops: list[tuple[int, Dropped]] = []
        env_tools: list[dict] | None = None
        record.verdicts = [v for v in record.verdicts if not (v.stage == "repair" and v.name == "simia_rules")]
        for i, traj in enumerate(record.trajectories):
            tools = [{"type": "function", "function": t.function} for t in traj.tools]
            if not tools:
                env_tools = _env_tools(record) if env_tools is None else env_tools
                tools = env_tools
            try:
                sim = traj.extra.get("simia") if isinstance(traj.extra.get("simia"), dict) else {}
                view = {"extra": traj.extra, "messages": (
                    [{"role": m.role, "content": m.content} for m in traj.messages[:1]] if isinstance(sim.get("raw"), str)
                    else [m.model_dump(mode="json", exclude_none=True) for m in traj.messages])}
                msgs, fixes = clean_messages(view, tool_index(tools), system_prompt)
                try:  # the parser pairs every tool message with an earlier call, so the messages suffice
                    traj.messages = _MESSAGES.validate_python(msgs)
                except ValueError as e:
                    raise Dropped("invalid_messages", str(e).splitlines()[0]) from None
            except Dropped as d:
                drops.append((i, d))
                record.verdicts.append(Verdict(stage="repair", kind="rule", name="simia_rules", passed=False,
                                               reasons=[str(d)], trajectory_id=traj.id,
                                               scores={"dropped": d.rule, "fixes": {}}))
                continue
            if not traj.tools and tools:
                traj.tools = tools  # type: ignore[assignment]
            traj.error = None
            sim = dict(traj.extra.get("simia") or {})
            if not keep_raw:
                sim.pop("raw", None)
            sim["fixes"] = fixes
            traj.extra["simia"] = sim
            kept.append(traj)
            record.verdicts.append(Verdict(stage="repair", kind="rule", name="simia_rules", passed=True,
                                           trajectory_id=traj.id, reasons=[f"fixed: {', '.join(fixes)}"] if fixes else [],
                                           scores={"dropped": None, "fixes": dict(Counter(fixes))}))
        if not kept:
            i, d = drops[0]
            raise StageError(str(d), field=f"trajectories.{i}")
        record.trajectories = kept
        add_provenance(record, "repair", strategy="rules", recipe_hash=opts.recipe_hash)
        return record

    return fn
