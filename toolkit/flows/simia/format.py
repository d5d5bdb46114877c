"""Tool-call formats of a conversation: native OpenAI `tool_calls` ⇄ Hermes `<tool_call>` text.

Reusable by any exporter (e.g. the sft exporter):

    from toolkit.flows.simia.format import to_hermes, to_native
    text_msgs = to_hermes(messages, tools)   # assistant calls as <tool_call> JSON blocks, tool results as
                                             # <tool_response> user turns, the tool list in the system prompt
    native = to_native(text_msgs)            # and back (fresh deterministic call ids)

`to_hermes` is the training Hermes export (`toolkit.formats.hermes.hermes_messages`, which
`render_hermes` / `sft --export hermes` frame in ChatML): one implementation, so these turns
rendered as ChatML are byte for byte the toolkit chat template's text (tests check it).
`to_native` parses with the Simia transcript parser (`transcript.to_messages`, repair on: broken
argument JSON is repaired, `<function>` tags are read).
"""

from __future__ import annotations

import re
from typing import Any

from toolkit.flows.simia import transcript as T
from toolkit.formats.chat import chat_messages
from toolkit.formats.hermes import hermes_messages
from toolkit.formats.tools import prepare_tools

_RESPONSE_RE = re.compile(r"<tool_response(?:\s[^>]*)?>\s*(.*?)\s*</tool_response>", re.DOTALL)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def messages_to_turns(messages: list[dict]) -> tuple[list[T.Turn], bool]:
    """Transcript turns of OpenAI messages; Hermes text is recognised (assistant `<tool_call>`
    blocks stay in the ASSISTANT turn for the parser; a user turn made only of `<tool_response>`
    blocks becomes OBSERVATION turns). Returns (turns, whether any Hermes text was seen)."""
    turns: list[T.Turn] = []
    hermes = False
    for m in messages:
        role = m.get("role")
        content = _text(m.get("content"))
        if role == "system":
            turns.append(T.Turn(T.SYSTEM, content))
        elif role == "user":
            blocks = _RESPONSE_RE.findall(content)
            if blocks and not _RESPONSE_RE.sub("", content).strip():
                hermes = True
                turns.extend(T.Turn(T.OBS, b) for b in blocks)
            else:
                turns.append(T.Turn(T.HUMAN, content))
        elif role in ("tool", "function"):
            turns.append(T.Turn(T.OBS, content))
        elif role == "assistant":
            if m.get("tool_calls"):
                if content.strip():
                    turns.append(T.Turn(T.ASSISTANT, content))
                turns.append(T.Turn(T.CALL, "", calls=list(m["tool_calls"])))
            else:
                if "<tool_call>" in content or T._FUNCTION_TAG_RE.search(content):
                    hermes = True
                turns.append(T.Turn(T.ASSISTANT, content))
    return turns, hermes


def to_native(messages: list[dict], id_prefix: str = "call") -> list[dict]:
    """OpenAI messages with native tool_calls (system messages kept in place); raises ValueError
    naming the problem when a call cannot be read."""
    out: list[dict] = []
    body: list[dict] = []
    for m in messages:
        if m.get("role") == "system" and not body:
            out.append({"role": "system", "content": _text(m.get("content"))})
        else:
            body.append(m)
    turns, _ = messages_to_turns(body)
    conv = T.to_messages(turns, repair=True, id_prefix=id_prefix)
    if conv.problems:
        raise ValueError("; ".join(map(str, conv.problems)))
    return out + conv.messages


def to_hermes(messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
    """Plain role/content messages with Hermes `<tool_call>` / `<tool_response>` text and the tool
    list in the system prompt: the training Hermes export (`toolkit.formats.hermes.hermes_messages`,
    the turns `sft --export hermes` and the toolkit chat template write), after
    `toolkit.formats.chat.chat_messages` (JSON-string arguments decoded to dicts, once).
    Raises toolkit.io.StageError when a call's arguments are not a JSON object."""
    return hermes_messages(chat_messages(messages), prepare_tools(tools) if tools else None)
