"""Strict parsing of an LLM reply that must be one JSON object (judges, structured roles, τ² failure
attribution): no repair, a malformed reply raises `MalformedJudgeOutput` with the reason."""

from __future__ import annotations

import json


class MalformedJudgeOutput(ValueError):
    pass


def extract_json_object(text: str | None) -> dict:
    """The single JSON object of a reply: the whole reply, or the body of one ``` fence, or the
    span from the first '{' to the last '}'. No repair: invalid JSON raises."""
    if text is None or not str(text).strip():
        raise MalformedJudgeOutput("empty reply")
    s = str(text).strip()
    if "```" in s:
        parts = s.split("```")
        if len(parts) >= 3:
            body = parts[1]
            if body.lstrip().lower().startswith("json"):
                body = body.lstrip()[4:]
            s = body.strip()
    if not s.startswith("{"):
        a, b = s.find("{"), s.rfind("}")
        if a < 0 or b < a:
            raise MalformedJudgeOutput("no JSON object in the reply")
        s = s[a:b + 1]
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        raise MalformedJudgeOutput(f"invalid JSON: {e.msg} at char {e.pos}") from None
    if not isinstance(obj, dict):
        raise MalformedJudgeOutput("the reply's JSON is not an object")
    return obj
