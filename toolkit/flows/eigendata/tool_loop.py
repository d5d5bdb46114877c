"""A tool-calling loop for agentic roles (feasibility validator, SEA task verifier): the LLM calls
the environment's tools, every call is EXECUTED in a scratch environment and its real result is
fed back ("execute, don't assume"); the final text answer goes through a strict parser with
retries (the role's output contract).

Write policy (`mode`):
- "scratch"  (default) writes change only this scratch environment, which is thrown away after
             the role ends (so later reads see the write's effect: state-transition validation);
- "readonly" a call that changed the state is undone at once (the environment is reset to the
             initial state, since no write is ever kept) and the model is told the write was refused.

Tool calls are read from the API's `tool_calls` or, for models that write the papers' text
format, from `<function>{"name": .., "arguments": {..}}</function>` tags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit.flows.eigendata.common import execute, function_tags, short
from toolkit.roles.structured import Malformed, RoleRejected, add_usage, new_usage


@dataclass
class LoopResult:
    value: Any
    text: str
    transcript: list[dict] = field(default_factory=list)
    usage: dict = field(default_factory=new_usage)
    attempts: int = 1
    errors: list[str] = field(default_factory=list)
    model: str | None = None


def _clean(m: dict) -> dict:
    return {k: v for k, v in m.items() if v is not None}


async def tool_loop(client: Any, messages: list[dict], env: Any, tools: list[dict],
                    parse: Callable[[str | None, list[dict]], Any], *, role: str, attempts: int = 3,
                    max_calls: int = 12, calls_per_turn: int | None = None, mode: str = "scratch",
                    result_chars: int = 4000) -> LoopResult:
    """parse(text, transcript) -> value, raising Malformed. Raises RoleRejected after `attempts`
    malformed final answers (each retry tells the model what was wrong)."""
    msgs = [dict(m) for m in messages]
    transcript: list[dict] = []
    usage = new_usage()
    errors: list[str] = []
    model = None
    valid = {(t.get("function") or {}).get("name") for t in tools}
    bad = 0
    turn = 0
    budget_told = False
    while True:
        turn += 1
        if turn > max_calls + attempts + 4:  # a model that neither answers nor stops calling
            raise RoleRejected(role, errors + [f"no final answer after {turn - 1} turns"], usage)
        exhausted = len(transcript) >= max_calls
        res = await client.chat([_clean(m) for m in msgs], tools=None if exhausted else (tools or None),
                                sample_index=bad)
        model = res.model
        add_usage(usage, res)
        content = res.message.get("content")
        calls = [{"id": tc.get("id"), "name": tc["function"]["name"], "arguments": tc["function"].get("arguments")}
                 for tc in res.tool_calls]
        if not calls:
            calls = [{"id": None, **c} for c in function_tags(content)]
        if calls and not exhausted:
            amsg: dict = {"role": "assistant", "content": content, "tool_calls": []}
            results = []
            for i, c in enumerate(calls):
                cid = c["id"] or f"v{turn}_{i}"
                args = c["arguments"]
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        args = None
                amsg["tool_calls"].append({"id": cid, "type": "function", "function": {
                    "name": c["name"], "arguments": json.dumps(args if isinstance(args, dict) else {}, ensure_ascii=False)}})
                if calls_per_turn is not None and i >= calls_per_turn:
                    out = json.dumps({"error": {"code": "TOO_MANY_CALLS",
                                                "message": f"at most {calls_per_turn} function call per response; not executed"}})
                elif len(transcript) >= max_calls:
                    out = json.dumps({"error": {"code": "BUDGET", "message": "tool-call budget exhausted; not executed"}})
                elif not isinstance(args, dict):
                    out = json.dumps({"error": {"code": "INVALID_ARGUMENTS", "message": "arguments are not a JSON object"}})
                elif c["name"] not in valid:
                    out = json.dumps({"error": {"code": "UNKNOWN_TOOL", "message": f"no tool {c['name']!r}"}})
                    transcript.append({"function": c["name"], "arguments": args, "ok": False,
                                       "error_code": "UNKNOWN_TOOL", "result": out, "state_changed": False,
                                       "source": "env"})
                else:
                    r = execute(env, c["name"], args)
                    entry = {"function": c["name"], "arguments": args, "ok": r["ok"], "error_code": r["error_code"],
                             "result": short(r["content"], result_chars), "state_changed": r["state_changed"],
                             "source": "env"}
                    out = r["content"]
                    if r["state_changed"] and mode == "readonly":
                        env.reset()
                        entry["write_undone"] = True
                        out = json.dumps({"error": {"code": "READ_ONLY", "message": "this call changes the state; "
                                                    "validation is read-only, the change was undone",
                                                    "would_return": short(r["content"], 1000)}})
                    transcript.append(entry)
                results.append({"role": "tool", "tool_call_id": cid, "content": short(out, result_chars)})
            msgs.append(amsg)
            msgs.extend(results)
            continue
        if calls and exhausted and not budget_told:
            budget_told = True
            msgs.append({"role": "user", "content": "The tool-call budget is exhausted. Give your final answer now, "
                                                    "without calling tools, in the required format."})
            continue
        try:
            value = parse(content, transcript)
        except (Malformed, ValueError, KeyError, TypeError) as e:
            bad += 1
            errors.append(f"attempt {bad}: {e}")
            if bad >= max(1, attempts):
                raise RoleRejected(role, errors, usage) from None
            msgs.append({"role": "assistant", "content": content or ""})
            msgs.append({"role": "user", "content": f"Your reply was rejected: {e}. Reply again in exactly the "
                                                    "required output format."})
            continue
        return LoopResult(value=value, text=content or "", transcript=transcript, usage=usage,
                          attempts=bad + 1, errors=errors, model=model)
