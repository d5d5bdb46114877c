"""The tool calls of a trajectory, in execution order (what state_diff replays and f1/code read)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from toolkit.schema import Trajectory


@dataclass
class Call:
    id: str
    name: str
    args: dict | None  # None: not recoverable (unparseable / unknown)
    side: str = "agent"
    ok: bool | None = None  # as recorded (None: no step)
    error_code: str | None = None
    result: str | None = None  # the tool message content
    step_index: int | None = None


def _parse_args(raw: Any) -> dict | None:
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return None
    try:
        v = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None


def _content_text(c: Any) -> str | None:
    if c is None or isinstance(c, str):
        return c
    return json.dumps(c, ensure_ascii=False)


def _result_error(text: str | None) -> dict | None:
    """The {"error": {...}} of a tool result that is a structured error (else None)."""
    if not text or not text.lstrip().startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, dict) and set(obj) == {"error"}:
        return obj["error"] if isinstance(obj["error"], dict) else {}
    return None


def _result_failed(text: str | None) -> bool:
    """A tool result that is a structured error {"error": {...}}."""
    return _result_error(text) is not None


def trajectory_calls(traj: Trajectory) -> list[Call]:
    """Executed tool calls in order: from `steps` when present (agent + user side), else the
    assistant tool calls that have a tool answer. User-side arguments come from the step's
    `arguments` (when the schema has it) or `extra.user_tool_messages`."""
    defs: dict[str, tuple[str, Any, str]] = {}
    results: dict[str, str | None] = {}
    answered: list[str] = []
    for m in traj.messages:
        if m.role == "assistant" and m.tool_calls:
            for tc in m.tool_calls:
                # tau2 bridge convention: a user-side call is an assistant message named "user"
                defs.setdefault(tc.id, (tc.function.name, tc.function.arguments,
                                        "user" if m.name == "user" else "agent"))
        elif m.role == "tool" and m.tool_call_id:
            results[m.tool_call_id] = m.content
            answered.append(m.tool_call_id)
    for pm in (traj.extra.get("user_tool_messages") or []):
        if not isinstance(pm, dict):
            continue
        for tc in pm.get("tool_calls") or []:
            try:
                defs.setdefault(tc["id"], (tc["function"]["name"], tc["function"].get("arguments"), "user"))
            except (KeyError, TypeError):
                continue
        if pm.get("role") == "tool" and pm.get("tool_call_id"):
            results.setdefault(pm["tool_call_id"], _content_text(pm.get("content")))
    calls: list[Call] = []
    if traj.steps:
        for i, st in enumerate(traj.steps):
            d = defs.get(st.tool_call_id)
            raw = getattr(st, "arguments", None)
            if raw is None and d is not None:
                raw = d[1]
            args = _parse_args(raw) if raw is not None else None
            calls.append(Call(id=st.tool_call_id, name=st.name, args=args, side=st.side, ok=st.ok,
                              error_code=st.error_code, result=_content_text(results.get(st.tool_call_id)),
                              step_index=i))
        return calls
    seen: set[str] = set()
    for tcid in answered:
        if tcid in seen or tcid not in defs:
            continue
        seen.add(tcid)
        name, raw, side = defs[tcid]
        calls.append(Call(id=tcid, name=name, args=_parse_args(raw), side=side,
                          result=_content_text(results.get(tcid))))
    return calls


def final_answer(traj: Trajectory) -> str | None:
    for m in reversed(traj.messages):
        if m.role == "assistant" and m.content and m.content.strip():
            return m.content
    return None


def _call_ok(c: Call) -> bool:
    if c.ok is not None:
        return bool(c.ok)
    return not _result_failed(c.result)


def _call_error_code(c: Call) -> str | None:
    """The error code of a failed call: the step's, else the structured error's `code`."""
    if c.error_code:
        return c.error_code
    err = _result_error(c.result)
    code = err.get("code") if err else None
    return code if isinstance(code, str) else None
