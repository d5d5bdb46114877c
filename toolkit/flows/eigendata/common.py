"""Shared pieces of the EigenData / AReaL-SEA flow: the environment as the roles see it (tools,
policy, a state summary), versioned prompts with reflect's guidance, real tool execution and
the record bookkeeping. Nothing here is domain-specific: every backend of toolkit.envs works.
"""

from __future__ import annotations

import json
import re
from typing import Any

from toolkit.io import StageError, note_fallback  # noqa: F401  (C.note_fallback: counted, in provenance)
from toolkit import prompts
from toolkit.envs import load_env
from toolkit.envs.base import ToolResult
from toolkit.schema import Step, Trajectory

FLOW = "eigendata"
TOOL_CALL_TAG = re.compile(r"<function>\s*(\{.*?\})\s*</function>", re.S)


# ----------------------------------------------------------------------------------------------
# environment views


def load_record_env(record: Any):
    """A fresh environment built from `record.env` (a scratch instance: nothing it does persists)."""
    if record.env is None:
        raise StageError("record has no `env`: the eigendata flow needs an environment", field="env")

    try:
        return load_env(record.env)
    except Exception as e:
        raise StageError(f"cannot build the environment from `env`: {type(e).__name__}: {e}", field="env") from None


def tool_schemas(env: Any, side: str = "agent") -> list[dict]:
    try:
        return env.tools(side) or []
    except Exception:
        return []


def tool_names(env: Any, sides: tuple[str, ...] = ("agent", "user")) -> list[str]:
    out: list[str] = []
    for s in sides:
        for t in tool_schemas(env, s):
            n = (t.get("function") or {}).get("name")
            if n and n not in out:
                out.append(n)
    return out


def policy_text(env: Any, limit: int = 8000) -> str:
    try:
        p = env.policy() or ""
    except Exception:
        p = ""
    return p if len(p) <= limit else p[:limit] + "\n...(truncated)"


def state_summary(env: Any, rows_per_table: int = 3, limit: int = 6000) -> str:
    """Row counts per table plus a few example rows (real ids the roles can ground tasks in)."""
    try:
        snap = env.snapshot()
    except Exception as e:  # a backend without snapshots
        return f"(no state summary: {type(e).__name__})"
    parts = []
    for table in sorted(snap):
        if table.startswith("_"):
            continue
        rows = snap[table]
        if not isinstance(rows, list):
            continue
        ex = [json.dumps(r, ensure_ascii=False, sort_keys=True, default=str)[:300] for r in rows[:rows_per_table]]
        parts.append(f"{table}: {len(rows)} rows" + ("".join(f"\n  e.g. {e}" for e in ex)))
    s = "\n".join(parts)
    return s if len(s) <= limit else s[:limit] + "\n...(truncated)"


def safe_hash(env: Any) -> str | None:
    try:
        return env.state_hash()
    except Exception:
        return None


# ----------------------------------------------------------------------------------------------
# prompts: shipped versions + the guidance reflect adds per prompt set


def prompt_pin(record: Any, role: str) -> tuple[int | None, list | None]:
    """(pinned version, prompt dirs) of a role in the record's plan (prompt set)."""
    pinned, dirs = None, None
    if record is not None and record.plan is not None:
        pinned = (record.plan.extra.get("prompt_versions") or {}).get(role)
        pd = record.plan.extra.get("prompts_dir")
        dirs = [pd] if isinstance(pd, str) and pd else None
    return (int(pinned) if pinned else None), dirs


def role_prompt(role: str, record: Any = None):
    """The prompt for a role in the record's prompt set: the version pinned in
    `plan.extra.prompt_versions[role]`, else the newest version that is not another prompt set's
    evolved copy (toolkit.prompts.load_for_set: no leaking between sets). Searched: the plan's
    `extra.prompts_dir` (where `reflect` wrote the evolved versions), $TOOLKIT_PROMPTS, the
    shipped prompts."""
    pinned, dirs = prompt_pin(record, role)
    return prompts.load_for_set(f"{FLOW}/{role}", pinned, dirs=dirs)


def guidance(record: Any, role: str) -> str:
    """Guidance lines (constraints, negative examples, relaxed/tightened rules) that `reflect`
    recorded for this role in the record's plan (prompt set); empty when none."""
    if record is None or record.plan is None:
        return ""
    parts = []
    if role in ("random_pool", "user_intent") and record.plan.synthesis_plan:
        parts.append("Synthesis plan / focus of this prompt set (follow it):\n" + record.plan.synthesis_plan[:4000])
    g = (record.plan.extra.get("guidance") or {}).get(role) or []
    if g:
        parts.append("Additional guidance from earlier iterations (follow it):\n" + "\n".join(f"- {x}" for x in g))
    return "\n\n".join(parts)


def prompt_id(record: Any, role: str) -> str:
    p = role_prompt(role, record)
    pv = record.plan.prompt_version if (record is not None and record.plan is not None) else None
    return p.id + (f"+plan.{pv}" if pv else "")


# ----------------------------------------------------------------------------------------------
# tool execution (real results only)


def function_tags(text: str | None) -> list[dict]:
    """Tool calls written in the paper's text format `<function>{"name":..,"arguments":{..}}</function>`."""
    out = []
    for m in TOOL_CALL_TAG.finditer(text or ""):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments") or {}
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {}
            out.append({"name": obj["name"], "arguments": args if isinstance(args, dict) else {}})
    return out


def execute(env: Any, name: str, args: dict, side: str = "agent") -> dict:
    """Run one call in `env`; {name, arguments, side, ok, error_code, content, state_changed}."""
    before = safe_hash(env)
    try:
        res = env.call(name, dict(args or {}), side=side)
    except Exception as e:  # a backend bug must not end the run

        res = ToolResult.fail("INTERNAL_ERROR", f"{type(e).__name__}: {e}")
    after = safe_hash(env)
    return {"name": name, "arguments": args, "side": side, "ok": bool(res.ok),
            "error_code": (res.error or {}).get("code"), "content": res.to_content(),
            "state_changed": before is not None and after is not None and before != after}


def calls_to_trajectory(env: Any, items: list[dict], traj_id: str, system: str | None = None,
                        tools: list[dict] | None = None):
    """Build a Trajectory by EXECUTING every tool call in `env` (fresh results, never copied).

    items: {"role": "user"|"assistant", "content"} | {"tool_call": {"name", "arguments"}, "side"?}
    Consecutive tool calls become one assistant message each (one call per message)."""
    msgs: list[dict] = []
    if system:
        msgs.append({"role": "system", "content": system})
    steps = []
    init = safe_hash(env)
    n = 0
    for it in items:
        tc = it.get("tool_call")
        if tc:
            n += 1
            cid = f"call_{n}"
            side = it.get("side") or tc.get("side") or "agent"
            r = execute(env, tc["name"], tc.get("arguments") or {}, side=side)
            m = {"role": "assistant", "content": None, "tool_calls": [{
                "id": cid, "type": "function",
                "function": {"name": tc["name"], "arguments": json.dumps(tc.get("arguments") or {}, ensure_ascii=False)}}]}
            if side == "user":
                m["name"] = "user"
            msgs.append(m)
            msgs.append({"role": "tool", "tool_call_id": cid, "content": r["content"]})
            steps.append(Step(tool_call_id=cid, name=tc["name"], side=side, ok=r["ok"], error_code=r["error_code"],
                              arguments=tc.get("arguments") if side == "user" else None, state_hash=safe_hash(env)))
        elif it.get("role") in ("user", "assistant") and it.get("content") is not None:
            msgs.append({"role": it["role"], "content": str(it["content"])})
    return Trajectory(id=traj_id, messages=msgs, tools=tools or [], steps=steps, initial_state_hash=init,
                      final_state_hash=safe_hash(env), termination="replay_done")


# ----------------------------------------------------------------------------------------------
# bookkeeping


def as_list(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, list):
        return v
    if isinstance(v, str):
        return [v] if v.strip() else []
    return [v]


def text_list(v: Any) -> list[str]:
    out = []
    for x in as_list(v):
        out.append(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False))
    return out


def short(s: Any, n: int = 400) -> str:
    s = s if isinstance(s, str) else json.dumps(s, ensure_ascii=False, default=str)
    return s if len(s) <= n else s[:n] + "..."
