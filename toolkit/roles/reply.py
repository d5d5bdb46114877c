"""Strict parsing of an LLM reply that must be one JSON object (judges, structured roles, τ² failure
attribution): no repair, a malformed reply raises `MalformedJudgeOutput` with the reason."""

from __future__ import annotations

import json
import re


class MalformedJudgeOutput(ValueError):
    pass


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def strip_think(text: str | None) -> str | None:
    """The reply without reasoning models' `<think>...</think>` blocks (Qwen3, DeepSeek-R1 ...), also
    a leading block whose `<think>` was in the prompt (the reply starts inside it and closes it) and
    an unclosed trailing `<think>` (a reply cut while thinking). Every structured parse reads this."""
    if not text or "think>" not in text.lower():
        return text
    s = _THINK_BLOCK.sub("", text)
    low = s.lower()
    close = low.find("</think>")
    if close >= 0 and "<think>" not in low[:close]:
        s = s[close + len("</think>"):]
        low = s.lower()
    opened = low.find("<think>")
    if opened >= 0:
        s = s[:opened]
    return s.strip()


def extract_json_object(text: str | None) -> dict:
    """The single JSON object of a reply: the whole reply, or the body of one ``` fence, or the
    span from the first '{' to the last '}'. No repair: invalid JSON raises."""
    text = strip_think(text)
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
