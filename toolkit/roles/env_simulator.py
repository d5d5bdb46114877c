"""The environment-simulator role (Simia appendix D; ASTRA's emulator with fault injection).

Given the policy, the offered tools, the episode so far and one tool call, ask the LLM for the tool's
result as strict JSON {"success": bool, "observation": ...}. Malformed replies are retried (with a
new sample index so a cached bad answer is not replayed) and, if still malformed, reported as a
structured SIMULATOR_ERROR result rather than raising.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from toolkit import prompts
from toolkit.llm.toolcalls import repair_json
from toolkit.roles.structured import RoleRejected, ask_structured, new_usage
from toolkit.toolresult import ToolResult

FAULTS = (
    ("TIMEOUT", "The request timed out after 30 seconds. Please try again later."),
    ("SERVICE_UNAVAILABLE", "503 Service Unavailable: the upstream server is unreachable."),
    ("CONNECTION_RESET", "Connection reset by peer while contacting the service."),
)


def inject_fault(fault_rate: float, key: str) -> ToolResult | None:
    """ASTRA-style failure injection, deterministic per key (record id + call id) for reproducibility."""
    if fault_rate <= 0:
        return None
    rng = random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big"))
    if rng.random() >= fault_rate:
        return None
    code, msg = FAULTS[rng.randrange(len(FAULTS))]
    return ToolResult.fail(code, msg, hint="transient failure: retrying the same call may succeed")


def render_history(messages: list[dict], limit_chars: int = 12000) -> str:
    lines = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if m.get("tool_calls"):
            for tc in m["tool_calls"]:
                f = tc["function"]
                lines.append(f"ASSISTANT tool call [{tc['id']}]: {f['name']}({f['arguments']})")
            if m.get("content"):
                lines.append(f"ASSISTANT: {m['content']}")
        elif role == "tool":
            lines.append(f"TOOL RESULT [{m.get('tool_call_id')}]: {m.get('content')}")
        else:
            lines.append(f"{str(role).upper()}: {m.get('content')}")
    text = "\n".join(lines)
    if len(text) > limit_chars:  # keep the most recent part: it carries the current state
        text = "...(earlier history truncated)...\n" + text[-limit_chars:]
    return text


def _parse(text: str | None) -> dict:
    if not text or not text.strip():
        raise ValueError("empty reply")
    s = text.strip()
    if "```" in s:  # fenced block
        parts = s.split("```")
        s = max(parts[1::2], key=len) if len(parts) > 2 else s.replace("```", "")
        if s.lstrip().startswith("json"):
            s = s.lstrip()[4:]
    start = s.find("{")
    if start < 0:
        raise ValueError("no JSON object in reply")
    obj = repair_json(s[start:])
    if not isinstance(obj, dict) or "success" not in obj:
        raise ValueError('reply lacks the "success" key')
    if not isinstance(obj["success"], bool):
        if str(obj["success"]).lower() in ("true", "false"):
            obj["success"] = str(obj["success"]).lower() == "true"
        else:
            raise ValueError('"success" is not a boolean')
    return obj


async def simulate_call(client: Any, *, policy: str, tools: list[dict], history: list[dict],
                        tool_call: dict, reference: str = "", attempts: int = 3,
                        fault_rate: float = 0.0, fault_key: str = "") -> tuple[ToolResult, dict]:
    """Simulate one tool call. Returns (result, usage dict {prompt_tokens, completion_tokens, cost})."""
    usage = new_usage()
    fault = inject_fault(fault_rate, fault_key or json.dumps(tool_call, sort_keys=True))
    if fault is not None:
        return fault, usage
    names = {t.get("function", {}).get("name") for t in tools}
    fname = tool_call["function"]["name"]
    if tools and fname not in names:  # rule check before spending tokens (Simia rule-based check)
        return ToolResult.fail("UNKNOWN_TOOL", f"Tool {fname!r} is not available.",
                               hint="available: " + ", ".join(sorted(n for n in names if n))), usage
    prompt = prompts.load("env_simulator").render(
        policy=policy or "(none)",
        tools=json.dumps([t.get("function", t) for t in tools], ensure_ascii=False, indent=1) if tools else "(not given)",
        reference=reference or "(none)",
        history=render_history(history) or "(empty)",
        tool_call=json.dumps({"name": fname, "arguments": json.loads(tool_call["function"]["arguments"] or "{}")},
                             ensure_ascii=False),
    )
    try:
        got = await ask_structured(client, [
            {"role": "system", "content": "You simulate tool execution and reply with JSON only."},
            {"role": "user", "content": prompt}], _parse, role="environment simulator", attempts=attempts)
    except RoleRejected as e:
        last_err = e.reasons[-1].split(": ", 1)[-1] if e.reasons else ""
        return ToolResult.fail("SIMULATOR_ERROR", f"the simulator's reply was malformed after {attempts} attempts: "
                               f"{last_err}", hint="retry, or use a stronger simulator model"), e.usage
    obj = got.value
    obs = obj.get("observation")
    if obj["success"]:
        return ToolResult.success(obs if obs is not None else {}), got.usage
    return ToolResult.fail("TOOL_ERROR", obs if isinstance(obs, str) else json.dumps(obs)), got.usage
