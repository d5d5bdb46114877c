"""Simia transcripts ⇄ our chat messages: the deterministic parser behind `simulate-env --mode
trajectory`, `repair --strategy rules` and the seed pre-filter.

Simia's synthesizer writes a whole trajectory as text (appendix C, Fig 9/10):

    HUMAN: I need to change my flight.
    FUNCTION_CALL:
    <think>The user wants ... I will call the function get_reservation.</think>
    {"name": "get_reservation", "arguments": {"reservation_id": "R1"}}
    OBSERVATION: {"status": "confirmed"}
    ASSISTANT: Your reservation R1 is confirmed ...

Accepted on input
-----------------
- turn labels at the start of a line, any case, optionally bold (`**HUMAN:**`): HUMAN / USER,
  ASSISTANT / GPT / AGENT, FUNCTION_CALL / FUNCTION CALL / TOOL_CALL, OBSERVATION / TOOL /
  FUNCTION_RESPONSE / TOOL_RESPONSE, SYSTEM; text before the first label (a preamble such as
  "Here is the conversation:") and ``` fence lines are ignored;
- JSON variants: a list of ShareGPT turns `{"from": "human"|"gpt"|"function_call"|"observation"|
  "system", "value": ...}`, of chat turns `{"role", "content"[, "tool_calls"]}`, or an object holding
  such a list under "conversations" / "messages";
- a FUNCTION_CALL body: optional `<think>...</think>`, then one call `{"name", "arguments"}` (bare,
  in a ``` fence, in `<tool_call>` tags, or a JSON list of calls); ASSISTANT turns may also carry
  Hermes `<tool_call>` blocks (APIGen-MT style).

`to_messages(turns, repair=False)` is strict: arguments must be valid JSON, `<function>` tags are
an error, a SYSTEM turn is kept. With `repair=True` (the rule post-process) broken argument JSON
is repaired with `toolkit.llm.toolcalls.repair_json` (fix `json_repaired`), `<function>` tags are
read as tool calls (fix `function_tag`) and SYSTEM turns are dropped (fix `system_dropped`).
What cannot be fixed is reported as a `Problem(rule, detail, turn)`; rules are named in
`RULES`. Tool call ids are deterministic: `<id_prefix>_<n>` (n from 1).

`render(messages)` writes our messages back in the transcript format (the seed exemplar in the
simulation prompt); `parse(render(m))` gives `m` back up to call ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from toolkit.llm.toolcalls import call_pairs, decoded_call, parse_tool_calls, repair_json

# canonical turn roles
HUMAN, ASSISTANT, CALL, OBS, SYSTEM = "HUMAN", "ASSISTANT", "FUNCTION_CALL", "OBSERVATION", "SYSTEM"

_LABELS = {
    "human": HUMAN, "user": HUMAN,
    "assistant": ASSISTANT, "gpt": ASSISTANT, "agent": ASSISTANT,
    "function_call": CALL, "function call": CALL, "tool_call": CALL, "tool call": CALL, "functioncall": CALL,
    "observation": OBS, "tool": OBS, "function_response": OBS, "tool_response": OBS, "function": OBS,
    "system": SYSTEM,
}
_LABEL_RE = re.compile(
    r"^[ \t]*(?:\*\*|__)?(HUMAN|USER|ASSISTANT|GPT|AGENT|FUNCTION[_ ]CALL|TOOL[_ ]CALL|FUNCTIONCALL|OBSERVATION|"
    r"TOOL[_ ]RESPONSE|FUNCTION[_ ]RESPONSE|TOOL|SYSTEM)(?:\*\*|__)?[ \t]*:(?:\*\*|__)?[ \t]?",
    re.IGNORECASE | re.MULTILINE)
_FENCE_LINE_RE = re.compile(r"^[ \t]*```[\w+-]*[ \t]*$", re.MULTILINE)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
_TOOL_CALL_BLOCK_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_CALL_START_RE = re.compile(r"^[ \t]*(?:\{|\[|<tool_call>|<function|```)", re.MULTILINE)
_FUNCTION_TAG_RE = re.compile(r"<function(?:=[^>\s]+|\s+name=[\"'][^\"']+[\"'])?\s*>")

# every rule the parser / post-process can report (fixes and drops)
RULES = {
    "json_repaired": "fix: malformed argument JSON repaired (unescaped quotes, missing brackets ...)",
    "function_tag": "fix: <function> tags read as a tool call (normalized to native tool_calls)",
    "system_dropped": "fix: a SYSTEM turn the synthesizer was told not to write was dropped",
    "llm_error": "drop: the simulation pass's LLM call failed (infrastructure)",
    "truncated": "drop: the simulation reply was cut at max_tokens (finish_reason=length): raise max_tokens",
    "empty": "drop: no turns could be read from the text",
    "unparseable_call": "drop: a tool call that cannot be parsed even after repair",
    "orphan_observation": "drop: an OBSERVATION that answers no tool call",
    "unanswered_call": "drop: a tool call without an OBSERVATION",
    "unknown_tool": "drop: a call to a tool that is not offered",
    "schema_violation": "drop: arguments that violate the tool's parameter schema",
    "no_user_turn": "drop: no HUMAN turn",
    "unfinished": "drop: the trajectory does not end with an assistant reply",
    "invalid_messages": "drop: the messages do not validate against the record schema",
}


@dataclass
class Turn:
    role: str  # HUMAN | ASSISTANT | FUNCTION_CALL | OBSERVATION | SYSTEM
    text: str
    calls: list[dict] | None = None  # pre-parsed OpenAI tool calls (chat-JSON variant)


@dataclass
class Problem:
    rule: str
    detail: str
    turn: int | None = None

    def __str__(self) -> str:
        at = f" (turn {self.turn})" if self.turn is not None else ""
        return f"{self.rule}{at}: {self.detail}"


@dataclass
class Conversion:
    messages: list[dict] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)  # ids of calls with no observation

    @property
    def ok(self) -> bool:
        return not self.problems


# ----------------------------------------------------------------------------------------------
# text → turns


def _label(s: str) -> str | None:
    return _LABELS.get(" ".join(s.lower().split()))


def _value_text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False)


def _turns_from_json(obj: Any) -> list[Turn] | None:
    if isinstance(obj, dict):
        for k in ("conversations", "messages", "conversation"):
            if isinstance(obj.get(k), list):
                return _turns_from_json(obj[k])
        return None
    if not isinstance(obj, list) or not obj or not all(isinstance(x, dict) for x in obj):
        return None
    turns: list[Turn] = []
    for x in obj:
        if "from" in x:
            role = _label(str(x.get("from")))
            text = _value_text(x.get("value"))
        elif "role" in x:
            role = _label(str(x.get("role")))
            text = _value_text(x.get("content"))
            if role == ASSISTANT and x.get("tool_calls"):
                if text.strip():
                    turns.append(Turn(ASSISTANT, text.strip()))
                turns.append(Turn(CALL, "", calls=list(x["tool_calls"])))
                continue
        else:
            return None
        if role is None:
            return None
        turns.append(Turn(role, text.strip()))
    return turns


def split_turns(text: str | None) -> list[Turn]:
    """The turns of a transcript (text with labels, or a JSON variant). Never raises."""
    if not text or not text.strip():
        return []
    s = text.strip()
    if s[:1] in "[{" or s.startswith("```"):
        body = _FENCE_LINE_RE.sub("", s).strip()
        try:
            turns = _turns_from_json(json.loads(body))
        except ValueError:
            turns = None
        if turns is not None:
            return turns
    if "```" in s:
        s = _FENCE_LINE_RE.sub("", s)
    turns = []
    marks = list(_LABEL_RE.finditer(s))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(s)
        role = _label(m.group(1)) or ASSISTANT
        turns.append(Turn(role, s[m.end():end].strip()))
    return turns


# ----------------------------------------------------------------------------------------------
# turns → messages


class _CallError(ValueError):
    def __init__(self, rule: str, detail: str):
        super().__init__(detail)
        self.rule = rule


def _call_objs(obj: Any) -> list[tuple[Any, Any]]:
    try:
        return call_pairs(obj)
    except ValueError as e:
        raise _CallError("unparseable_call", str(e)) from None


def _load(s: str, repair: bool, fixes: list[str]) -> Any:
    try:
        return json.loads(s)
    except ValueError as e:
        if not repair:
            raise _CallError("unparseable_call", f"invalid JSON ({e.msg} at char {e.pos}): {s[:120]!r}") from None

    try:
        out = repair_json(s)
    except ValueError as e:
        raise _CallError("unparseable_call", f"{e}: {s[:120]!r}") from None
    fixes.append("json_repaired")
    return out


def _parse_call_body(body: str, repair: bool, fixes: list[str]) -> list[tuple[str, dict]]:
    """(name, arguments) pairs of one FUNCTION_CALL body (think block already removed)."""
    if "```" in body:
        body = _FENCE_LINE_RE.sub("", body)
    body = body.strip()
    if "<function" in body and _FUNCTION_TAG_RE.search(body):
        if not repair:
            raise _CallError("function_tag", "tool call wrapped in <function> tags instead of <tool_call>")

        _, calls, err = parse_tool_calls(body)
        if err or not calls:
            raise _CallError("unparseable_call", err or f"no call in <function> block {body[:120]!r}")
        fixes.append("function_tag")
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    blocks = [b.strip() for b in _TOOL_CALL_BLOCK_RE.findall(body)] if "<tool_call>" in body else [body]
    out: list[tuple[str, dict]] = []
    for b in blocks:
        if not b:
            raise _CallError("unparseable_call", "empty tool call")
        for name, args in _call_objs(_load(b, repair, fixes)):
            if isinstance(args, str):
                args = _load(args, repair, fixes) if args.strip() else {}
            if not isinstance(name, str) or not name.strip():
                raise _CallError("unparseable_call", f"tool call without a function name: {b[:120]!r}")
            if args is None:
                args = {}
            if not isinstance(args, dict):
                raise _CallError("unparseable_call", f"arguments of {name!r} are not a JSON object")
            out.append((name.strip(), args))
    return out


def to_messages(turns: list[Turn], *, repair: bool = False, id_prefix: str = "call") -> Conversion:
    """Our OpenAI-format messages from transcript turns (see the module doc for strict vs repair)."""
    conv = Conversion()
    pending: list[tuple[str, str]] = []  # (call id, tool name), oldest first
    n = 0
    if not turns:
        conv.problems.append(Problem("empty", "no turns found in the text"))
        return conv
    for i, t in enumerate(turns):
        if t.role == SYSTEM:
            if repair:
                conv.fixes.append("system_dropped")
            else:
                conv.messages.append({"role": "system", "content": t.text})
            continue
        if t.role == HUMAN:
            conv.messages.append({"role": "user", "content": t.text})
            continue
        if t.role == OBS:
            if not pending:
                conv.problems.append(Problem("orphan_observation", f"observation {t.text[:80]!r} answers no call", i))
                continue
            cid, name = pending.pop(0)
            if not cid:  # the observation of a call that could not be parsed (already reported)
                continue
            conv.messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": t.text})
            continue
        # ASSISTANT or FUNCTION_CALL
        text = t.text
        content_parts: list[str] = []
        call_text = ""
        if t.role == CALL:
            thinks = _THINK_RE.findall(text)
            content_parts += thinks
            call_text = _THINK_RE.sub("", text).strip()
            m = _CALL_START_RE.search(call_text)
            if m and m.start() > 0:  # free text before the call: keep it as content
                content_parts.append(call_text[:m.start()].strip())
                call_text = call_text[m.start():].strip()
        else:
            if "<tool_call>" in text or _FUNCTION_TAG_RE.search(text):
                cut = min(i_ for i_ in (text.find("<tool_call>"), _first_function_tag(text)) if i_ >= 0)
                content_parts.append(text[:cut].strip())
                call_text = text[cut:].strip()
            else:
                content_parts.append(text)
        msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(p for p in content_parts if p) or None}
        try:
            pairs: list[tuple[str, dict]] = []
            if t.calls is not None:
                for c in t.calls:
                    for name, args in _call_objs(c):
                        if isinstance(args, str):
                            args = _load(args, repair, conv.fixes) if args.strip() else {}
                        pairs.append((str(name), args if isinstance(args, dict) else {}))
            elif call_text:
                pairs = _parse_call_body(call_text, repair, conv.fixes)
            elif t.role == CALL:
                raise _CallError("unparseable_call", "FUNCTION_CALL turn without a call")
        except _CallError as e:
            conv.problems.append(Problem(e.rule, str(e), i))
            pending.append(("", ""))  # its observation (if any) is consumed without a second problem
            continue
        if pairs:
            msg["tool_calls"] = []
            for name, args in pairs:
                n += 1
                cid = f"{id_prefix}_{n}"
                msg["tool_calls"].append({"id": cid, "type": "function", "function": {
                    "name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
                pending.append((cid, name))
        if msg["content"] is None and not pairs:
            msg["content"] = ""
        conv.messages.append(msg)
    conv.unanswered = [cid for cid, _ in pending if cid]
    return conv


def _first_function_tag(text: str) -> int:
    m = _FUNCTION_TAG_RE.search(text)
    return m.start() if m else -1


def parse(text: str | None, *, repair: bool = False, id_prefix: str = "call") -> Conversion:
    return to_messages(split_turns(text), repair=repair, id_prefix=id_prefix)


# ----------------------------------------------------------------------------------------------
# messages → text (the exemplar in the prompt)


def render(messages: list[dict], *, assistant_label: str = "ASSISTANT") -> str:
    """Our messages as a transcript (system messages left out: Simia keeps them separately)."""
    lines: list[str] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
        if role == "system":
            continue
        if role == "user":
            lines.append(f"HUMAN: {content or ''}")
        elif role == "tool":
            lines.append(f"OBSERVATION: {content or ''}")
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if not calls:
                lines.append(f"{assistant_label}: {content or ''}")
                continue
            for j, tc in enumerate(calls):
                name, args = decoded_call(tc, repair=False)
                head = f"{content}\n" if (content and j == 0) else ""
                lines.append("FUNCTION_CALL:\n" + head + json.dumps({"name": name, "arguments": args},
                                                                      ensure_ascii=False))
    return "\n".join(lines)
