"""OpenAI chat messages in chat-template shape: tool-call arguments as dicts (chat templates write
them with `tojson`; a JSON string would come out double-encoded), tool results named after their
call. Used by the training export (`toolkit.train.export`) and by flows that render transcripts."""

from __future__ import annotations

import json
from typing import Any

from toolkit.io import StageError


def arguments_dict(raw: Any, where: str) -> dict:
    """Tool-call arguments as a dict (a JSON string decoded, twice when double-encoded);
    StageError naming `where` when they are not a JSON object."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    try:
        val = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as e:
        raise StageError(f"tool-call arguments are not JSON ({e}); refusing to train on them", field=where) from None
    if isinstance(val, str):  # already double-encoded upstream: decode once more
        try:
            val = json.loads(val)
        except json.JSONDecodeError:
            pass
    if not isinstance(val, dict):
        raise StageError(f"tool-call arguments must be a JSON object, got {type(val).__name__}", field=where)
    return val


def plain_message(m: Any) -> dict:
    d = m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)
    return d


def chat_messages(msgs: list, ti: int = 0) -> list[dict]:
    """OpenAI messages (dicts or schema Messages) in chat-template shape: tool-call arguments
    decoded to dicts (StageError naming trajectories[ti].messages[j]...arguments when they are not
    a JSON object), tool results named after their call and given string content, assistant text
    never None."""
    msgs = [plain_message(m) for m in msgs]
    out: list[dict] = []
    names: dict[str, str] = {}
    for j, m in enumerate(msgs):
        m = dict(m)
        if m["role"] == "assistant":
            m.pop("name", None)
            if m.get("tool_calls"):
                calls = []
                for k, tc in enumerate(m["tool_calls"]):
                    fn = tc["function"]
                    where = f"trajectories[{ti}].messages[{j}].tool_calls[{k}].function.arguments"
                    calls.append({"id": tc.get("id"), "type": "function",
                                  "function": {"name": fn["name"], "arguments": arguments_dict(fn.get("arguments"), where)}})
                    if tc.get("id"):
                        names[tc["id"]] = fn["name"]
                m["tool_calls"] = calls
            else:
                m.pop("tool_calls", None)
                m["content"] = m.get("content") or ""
        elif m["role"] == "tool":
            if m.get("tool_call_id") in names:
                m["name"] = names[m["tool_call_id"]]
            m["content"] = m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        out.append(m)
    return out
