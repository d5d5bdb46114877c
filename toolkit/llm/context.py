"""Prompts that fit the serving model's context window.

The client learns the context size once per endpoint (`LLMConfig.context_tokens` / `--context-tokens`
first; the embedded server's `TOOLKIT_EMBEDDED_N_CTX`; else the server's metadata: vLLM's
`/v1/models` `max_model_len`, llama.cpp `llama-server`'s `/props` `n_ctx`; else a context-length
HTTP 400 teaches it and the request is fitted and sent again), counts a request's tokens (a
conservative estimate first; near the limit the server's own tokenizer: vLLM `/tokenize`,
llama-server `/tokenize`, llama-cpp-python `/extras/tokenize/count`) and, when the prompt plus
`max_tokens` does not fit, in this order:

1. renders the tools compactly (`toolkit.formats.tools.compact_tool`, the one shared renderer);
2. lowers `max_tokens` to what is left, not below `min_completion` (a quarter of it, at least 256);
3. leaves out the oldest conversation messages (the system message and the first user message
   stay; an assistant tool call goes with its tool results) and says so in the system message;
4. else raises `ContextOverflow` (an `LLMError`, status "context") with the counts: the reason is in
   the reject line, never only an HTTP 400.

Every step taken is a note on the result (`ChatResult.context`, in `provenance()`) and a counted
fallback (`toolkit.io.note_fallback`: summary line, yield table, the record's provenance).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .base import LLMError

__all__ = [
    "MARGIN_TOKENS",
    "ContextOverflow",
    "Fitted",
    "estimate_tokens",
    "fit_request",
    "parse_context_error",
]

MARGIN_TOKENS = 32  # chat-template tokens a count of the contents does not see
PER_MESSAGE_TOKENS = 8


class ContextOverflow(LLMError):
    """The request cannot be made to fit the model's context: the message says by how much."""

    def __init__(self, message: str, *, endpoint: str | None = None, prompt_tokens: int = 0,
                 context_tokens: int = 0):
        super().__init__(message, endpoint=endpoint, status="context", attempts=0)
        self.prompt_tokens, self.context_tokens = prompt_tokens, context_tokens


def _text_of(messages: list[dict], tools: Any) -> tuple[str, int]:
    parts = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):  # content parts
            c = " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in c)
        parts.append(str(c or ""))
        if m.get("tool_calls"):
            parts.append(json.dumps(m["tool_calls"], ensure_ascii=False))
    if tools:
        parts.append(_tools_json(tools))
    return "\n".join(parts), len(messages)


def _tools_json(tools: Any) -> str:
    jb = getattr(tools, "json_bytes", None)
    if jb is not None:
        return jb().decode("utf-8")
    return json.dumps(list(tools), ensure_ascii=False)


def estimate_tokens(messages: list[dict], tools: Any = None) -> int:
    """A conservative token count (over-counts for English and JSON: UTF-8 bytes / 3, plus a few
    tokens of template per message): used when the server cannot count, and as the fast path."""
    text, n = _text_of(messages, tools)
    return (len(text.encode("utf-8")) + 2) // 3 + PER_MESSAGE_TOKENS * n + MARGIN_TOKENS


_CTX_ERROR_RES = (
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),          # vLLM / OpenAI
    re.compile(r"context window of (\d+)", re.IGNORECASE),                   # llama-cpp-python
    re.compile(r"n_ctx(?:_slot)?\"?\s*[:=]\s*(\d+)", re.IGNORECASE),         # llama-server's error JSON
    re.compile(r"context (?:size|length) (?:of |is )?(\d+)", re.IGNORECASE),
)
_CTX_WORDS = re.compile(r"context (length|window|size)|n_ctx|too many tokens|exceeds? the", re.IGNORECASE)


def parse_context_error(status: Any, message: str) -> tuple[bool, int | None]:
    """(is this a context-length error, the context size it names)."""
    if status not in (400, 413, 422) or not _CTX_WORDS.search(message or ""):
        return False, None
    for rx in _CTX_ERROR_RES:
        m = rx.search(message)
        if m:
            return True, int(m.group(1))
    return True, None


@dataclass
class Fitted:
    messages: list[dict]            # what the caller passed, possibly shortened
    tools: Any
    compact: bool                   # render the tools compactly
    max_tokens: int | None
    prompt_tokens: int              # counted (or estimated) for the rendered request
    counted_by: str                 # "estimate" or the server tokenizer used
    notes: list[str] = field(default_factory=list)


Renderer = Callable[[list[dict], Any, bool], tuple[list[dict], Any]]  # (messages, tools, compact) -> wire
Counter = Callable[[list[dict], Any], Awaitable[tuple[int, str]]]      # wire -> (tokens, counted_by)


def _droppable_groups(messages: list[dict]) -> list[list[int]]:
    """Indices of the messages that may be left out, oldest first, in groups that go together (an
    assistant tool call with its tool results). The leading system messages and the first user
    message are kept, and so is the last message."""
    keep = set()
    i = 0
    while i < len(messages) and messages[i].get("role") == "system":
        keep.add(i)
        i += 1
    first_user = next((j for j in range(len(messages)) if messages[j].get("role") == "user"), None)
    if first_user is not None:
        keep.add(first_user)
    if messages:
        keep.add(len(messages) - 1)
    groups: list[list[int]] = []
    j = 0
    while j < len(messages):
        if j in keep:
            j += 1
            continue
        g = [j]
        if messages[j].get("tool_calls"):
            k = j + 1
            while k < len(messages) and messages[k].get("role") == "tool" and k not in keep:
                g.append(k)
                k += 1
            j = k
        else:
            j += 1
        groups.append(g)
    # a tool result whose call is kept must stay: drop it only with its call (its group above)
    return [g for g in groups if messages[g[0]].get("role") != "tool"]


def _with_notice(messages: list[dict], dropped: int, ctx: int) -> list[dict]:
    notice = (f"[context: {dropped} earlier message(s) of this conversation were left out to fit the "
              f"model's {ctx}-token context]")
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = (str(out[0].get("content") or "") + "\n\n" + notice).strip()
    else:
        out.insert(0, {"role": "system", "content": notice})
    return out


async def fit_request(messages: list[dict], tools: Any, *, max_tokens: int | None, context_tokens: int,
                      render: Renderer, count: Counter, compact: bool = False,
                      endpoint: str | None = None) -> Fitted:
    """Make (messages, tools, max_tokens) fit `context_tokens`; see the module docstring."""
    ctx = int(context_tokens)
    want = int(max_tokens or 0)
    notes: list[str] = []

    async def measure(msgs: list[dict], cmp: bool, exact: bool) -> tuple[int, str]:
        wm, wt = render(msgs, tools, cmp)
        est = estimate_tokens(wm, wt)
        if not exact or est + want <= ctx:
            return est, "estimate"
        n, by = await count(wm, wt)
        return n + (MARGIN_TOKENS if by != "estimate" else 0), by

    n, by = await measure(messages, compact, exact=False)
    if n + want <= ctx:
        return Fitted(messages, tools, compact, max_tokens, n, by)
    n, by = await measure(messages, compact, exact=True)
    if n + want <= ctx:
        return Fitted(messages, tools, compact, max_tokens, n, by)
    first = n
    # 1. compact tools
    if tools and not compact:
        n2, by2 = await measure(messages, True, exact=True)
        if n2 < n:
            notes.append(f"tools compacted ({n} -> {n2} prompt tokens)")
            compact, n, by = True, n2, by2
            if n + want <= ctx:
                return Fitted(messages, tools, compact, max_tokens, n, by, notes)
    # 2. lower max_tokens, not below the floor
    floor = min(want, max(256, want // 4)) if want else 0
    if want and ctx - n >= floor:
        new = ctx - n
        notes.append(f"max_tokens lowered {want} -> {new} (prompt {n} of {ctx} tokens)")
        return Fitted(messages, tools, compact, new, n, by, notes)
    # 3. leave out the oldest messages (keeping the floor of completion tokens)
    groups = _droppable_groups(messages)
    target = want and floor
    dropped: set[int] = set()
    msgs = messages
    for g in groups:
        dropped.update(g)
        msgs = _with_notice([m for i, m in enumerate(messages) if i not in dropped], len(dropped), ctx)
        n_est, _ = await measure(msgs, compact, exact=False)
        if n_est + target > ctx:  # clearly still too long: keep dropping before asking the server
            continue
        n, by = await measure(msgs, compact, exact=True)
        if n + target <= ctx:
            break
    else:
        if dropped:
            n, by = await measure(msgs, compact, exact=True)
    if dropped and n + target <= ctx:
        notes.append(f"history truncated: {len(dropped)} of {len(messages)} message(s) left out "
                     f"({first} -> {n} prompt tokens)")
        new = min(want, ctx - n) if want else None
        if want and new < want:
            notes.append(f"max_tokens lowered {want} -> {new}")
        return Fitted(msgs, tools, compact, new if want else max_tokens, n, by, notes)
    done = "; ".join(notes + ([f"{len(dropped)} message(s) left out"] if dropped else [])) or "nothing to drop"
    raise ContextOverflow(
        f"prompt does not fit the model's context: {n} prompt tokens ({by}) + at least {floor} completion "
        f"tokens > {ctx} (max_tokens {want}; tried: {done}). Shorten the input, use a model with a longer "
        f"context, or set context_tokens if the server's is larger",
        endpoint=endpoint, prompt_tokens=n, context_tokens=ctx)
