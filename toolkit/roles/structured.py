"""One way to ask an LLM for a structured answer: prompt → strict parse → retry → result or reject.

Every synthesis role (planners, designers, validators, repairers, verifier writers) uses
`ask_structured`: the reply is handed to the role's `parse(text) -> value`, which raises
`Malformed` (or ValueError) with a reason when the reply breaks the output contract (bad JSON,
a missing verdict line, a wrong enum, truncated output); reasoning models' `<think>...</think>`
blocks are stripped before it sees the text (`strip_think`). A malformed reply is retried up to
`attempts` times with a request that differs: a new `sample_index` (so a cached bad answer is not
replayed; the client sends `seed + index`) and, when the temperature is below 1, a temperature
step of `RETRY_TEMPERATURE_STEP` per attempt (greedy decoding would repeat the same text); each
retry logs one stderr line saying what changed, and is counted as a summary warning; then
`RoleRejected` carries every attempt's reason, which stages turn into a reject or a failed
verdict — never a crash, never a silent pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit.io import log, note_warning
from toolkit.roles.reply import MalformedJudgeOutput, extract_json_object, strip_think

RETRY_TEMPERATURE_STEP = 0.3


class Malformed(MalformedJudgeOutput):
    """A reply that breaks the role's output contract."""


class RoleRejected(Exception):
    def __init__(self, role: str, reasons: list[str], usage: dict | None = None, model: str | None = None):
        self.role, self.reasons, self.usage, self.model = role, reasons, usage or new_usage(), model
        super().__init__(f"{role}: no valid reply after {len(reasons)} attempt(s): " + "; ".join(reasons))


def new_usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "requests": 0, "cache_hits": 0}


def add_usage(total: dict, res: Any) -> dict:
    """Add one ChatResult (or a usage dict) into `total`."""
    if isinstance(res, dict):
        for k in new_usage():
            total[k] = total.get(k, 0) + (res.get(k) or 0)
        return total
    total["requests"] += 0 if res.cached else 1
    total["cache_hits"] += 1 if res.cached else 0
    total["prompt_tokens"] += int(res.usage.get("prompt_tokens", 0) or 0)
    total["completion_tokens"] += int(res.usage.get("completion_tokens", 0) or 0)
    total["cost"] += float(res.cost or 0.0)
    return total


@dataclass
class Structured:
    value: Any
    text: str
    attempts: int
    usage: dict = field(default_factory=new_usage)
    model: str | None = None
    errors: list[str] = field(default_factory=list)


def parse_json_object(text: str | None, required: tuple[str, ...] = ()) -> dict:
    """Strict: one JSON object (whole reply, a ``` fence, or first '{' .. last '}'), no repair;
    every key in `required` present."""
    try:
        obj = extract_json_object(text)
    except MalformedJudgeOutput as e:
        raise Malformed(str(e)) from None
    for k in required:
        if k not in obj:
            raise Malformed(f"missing key {k!r}")
    return obj


def tagged_text(text: str | None, tag: str, *, required: bool = True, allow_empty: bool = True) -> str | None:
    """The stripped text inside <tag>...</tag> (the first block); None when the block is absent and
    not `required`. Malformed: no block (required), an unclosed block, an empty one (not allow_empty)."""
    s = strip_think(text) or ""
    a, b = s.find(f"<{tag}>"), s.find(f"</{tag}>")
    if a < 0:
        if required:
            raise Malformed(f"no <{tag}> block")
        return None
    if b < 0:
        raise Malformed(f"<{tag}> block is not closed (truncated?)")
    body = s[a + len(tag) + 2:b].strip()
    if not body and not allow_empty:
        raise Malformed(f"<{tag}> is empty")
    return body


def parse_tagged_json(text: str | None, tag: str) -> Any:
    """The JSON inside <tag>...</tag> (EigenData's <intent>, <plan> ...)."""
    body = tagged_text(text, tag)
    if body.startswith("```"):
        body = body.strip("`")
        body = body[4:] if body.lower().startswith("json") else body
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise Malformed(f"<{tag}> is not valid JSON: {e.msg} at char {e.pos}") from None


def need_enum(obj: dict, key: str, allowed: tuple[str, ...]) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or v.strip().upper() not in {a.upper() for a in allowed}:
        raise Malformed(f"{key!r} must be one of {', '.join(allowed)}, got {v!r}")
    return next(a for a in allowed if a.upper() == v.strip().upper())


async def ask_structured(client: Any, messages: list[dict], parse: Callable[[str | None], Any], *,
                         role: str = "llm", attempts: int = 3, **overrides: Any) -> Structured:
    """Ask, parse strictly, retry on a malformed reply. Raises RoleRejected after `attempts`.
    LLM transport errors (LLMError) propagate: they are infrastructure, not the model's answer."""
    usage = new_usage()
    errors: list[str] = []
    model = None
    base = int(overrides.pop("sample_index", 0) or 0)
    config = getattr(client, "config", None)
    temp0 = overrides.get("temperature", getattr(config, "temperature", None))
    seed0 = overrides.get("seed", getattr(config, "seed", None))
    for attempt in range(max(1, attempts)):
        send = dict(overrides)
        if attempt:
            change = [f"sample_index {base + attempt} (seed {int(seed0 or 0) + base + attempt})"]
            if temp0 is not None and float(temp0) < 1.0:
                send["temperature"] = round(min(1.0, float(temp0) + RETRY_TEMPERATURE_STEP * attempt), 3)
                change.append(f"temperature {float(temp0):g} -> {send['temperature']:g}")
            log(f"{role}: attempt {attempt + 1}/{max(1, attempts)} after a malformed reply "
                f"({errors[-1].split(': ', 1)[-1][:120] if errors else '?'}): {', '.join(change)}")
            note_warning(f"{role}: malformed reply retried", log_first=False)
        res = await client.chat(messages, sample_index=base + attempt, **send)
        model = res.model
        add_usage(usage, res)
        text = strip_think(res.message.get("content"))
        if res.finish_reason == "length" and not text:
            errors.append(f"attempt {attempt + 1}: empty reply (cut at max_tokens)")
            continue
        try:
            value = parse(text)
        except (ValueError, KeyError, TypeError) as e:
            cut = " (reply cut at max_tokens)" if res.finish_reason == "length" else ""
            errors.append(f"attempt {attempt + 1}: {e}{cut}")
            continue
        return Structured(value=value, text=text or "", attempts=attempt + 1, usage=usage, model=model,
                          errors=errors)
    raise RoleRejected(role, errors, usage, model)


async def ask_prompt(client: Any, prompt: str, parse: Callable[[str | None], Any], *, usage: dict | None = None,
                     role: str = "llm", attempts: int = 3, **overrides: Any) -> Structured:
    """`ask_structured` with one user message; its requests are added into `usage` (when given)
    whether a valid reply came or RoleRejected is raised."""
    try:
        got = await ask_structured(client, [{"role": "user", "content": prompt}], parse, role=role,
                                   attempts=attempts, **overrides)
    except RoleRejected as e:
        if usage is not None:
            add_usage(usage, e.usage)
        raise
    if usage is not None:
        add_usage(usage, got.usage)
    return got
