"""τ²-bench records and messages: τ² tasks ⇄ records, our OpenAI-format messages ⇄ τ² messages
(dual-control convention in toolkit/tau2/__init__.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from copy import deepcopy
from typing import Any

from toolkit.envs import tau2 as t2env
from toolkit.schema import SCHEMA_VERSION

SUCCESS_EPS = 1e-6  # tau2.metrics.agent_metrics.is_successful
ORACLE_MODEL = "oracle"
_ID_OK = re.compile(r"[^A-Za-z0-9._:/@+=-]")

# our Trajectory.termination -> τ² TerminationReason
TERMINATION = {
    None: "user_stop", "": "user_stop", "user_stop": "user_stop", "transfer": "user_stop",
    "out_of_scope": "user_stop", "replay_done": "user_stop", "simulated": "user_stop",
    "agent_stop": "agent_stop", "max_turns": "max_steps", "max_errors": "too_many_errors",
    "context_length": "agent_error", "error": "agent_error",
}


# ==============================================================================================
# Records


def record_id(domain: str, task_id: Any) -> str:
    """`tau2-<domain>-<task id>`; characters outside the id alphabet become `_` and then a short
    hash of the raw id is appended so the mapping stays injective (telecom ids hold `[]|`)."""
    raw = str(task_id)
    safe = _ID_OK.sub("_", raw)
    rid = f"tau2-{domain}-{safe}"
    if safe != raw:
        rid += "-" + hashlib.sha1(raw.encode()).hexdigest()[:8]
    return rid[:256]


def task_to_record(domain: str, tau2_task: Any) -> dict:
    """A `toolkit.schema.Record` dict for one τ² task (the raw task JSON kept in task.extra)."""
    task = t2env.as_tau2_task(tau2_task)
    raw = task.model_dump(mode="json")
    us = task.user_scenario
    ins = us.instructions
    if isinstance(ins, str):
        scenario = {"persona": us.persona, "instructions": ins}
        instruction = ins
    else:
        scenario = {"persona": us.persona, "reason_for_call": ins.reason_for_call,
                    "known_info": ins.known_info, "unknown_info": ins.unknown_info,
                    "instructions": ins.task_instructions}
        instruction = ins.reason_for_call
    ec = task.evaluation_criteria
    gt: dict[str, Any] = {"actions": [], "communicate_info": [], "nl_assertions": [], "extra": {}}
    if ec is not None:
        for a in ec.actions or []:
            gt["actions"].append({"name": a.name, "arguments": deepcopy(a.arguments),
                                  "compare_args": list(a.compare_args) if a.compare_args is not None else None,
                                  "side": "user" if a.requestor == "user" else "agent",
                                  "id": a.action_id})
        gt["communicate_info"] = list(ec.communicate_info or [])
        gt["nl_assertions"] = list(ec.nl_assertions or [])
        gt["extra"] = {"reward_basis": [r.value for r in ec.reward_basis],
                       "env_assertions": [e.model_dump(mode="json") for e in ec.env_assertions or []]}
    desc = task.description.model_dump(mode="json") if task.description is not None else None
    return {
        "schema": SCHEMA_VERSION,
        "id": record_id(domain, task.id),
        "flow": "tau2",
        "tags": ["tau2", domain],
        "env": {"backend": "tau2", "id": domain, "config": {"task_id": task.id}},
        "task": {
            "instruction": instruction,
            "user_scenario": scenario,
            "ground_truth": gt,
            "extra": {"tau2_task": raw, "tau2_domain": domain,
                      "tau2_user_instructions": str(task.user_scenario), "description": desc,
                      "ticket": task.ticket},
        },
    }


def load_tasks(domain: str, split: str | None = None, task_ids: Iterable[Any] | None = None,
               task_set: str | None = None) -> list[dict]:
    """Record dicts for a domain's τ² tasks (τ²'s default split, i.e. "base", unless `split`)."""
    d = t2env.domain(domain)
    if split in ("all", "__all__"):
        tasks = t2env._all_tasks(d, task_set)
    else:
        tasks = d.tasks(task_set, split)
    if task_ids is not None:
        want = [str(t) for t in task_ids]
        missing = [t for t in want if t not in tasks]
        if missing:
            extra = t2env._all_tasks(d, task_set)
            tasks = {**tasks, **{t: extra[t] for t in missing if t in extra}}
        return [task_to_record(domain, tasks[t]) for t in want if t in tasks]
    return [task_to_record(domain, t) for t in tasks.values()]


def attr_or_key(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def resolve_task(record_or_task: Any, domain: str | None = None) -> tuple[str, Any]:
    """(domain, τ² Task) from a record (dict or model), a τ² Task, or a raw τ² task dict."""
    T = t2env._tau2()["Task"]
    if isinstance(record_or_task, T):
        if not domain:
            raise ValueError("a bare tau2 Task needs domain=")
        return domain, record_or_task
    env = attr_or_key(record_or_task, "env")
    task = attr_or_key(record_or_task, "task")
    if env is not None or (task is not None and attr_or_key(task, "extra") is not None):
        dom = domain or attr_or_key(env, "id")
        raw = (attr_or_key(task, "extra") or {}).get("tau2_task")
        if raw is not None:
            return dom, t2env.as_tau2_task(raw)
        env_config = attr_or_key(env, "config") or {}
        if env_config.get("task") is not None:
            return dom, t2env.as_tau2_task(env_config["task"])
        if env_config.get("task_id") is not None:
            return dom, t2env.get_task(dom, env_config["task_id"], env_config.get("task_set"))
        raise ValueError("record carries no tau2 task (task.extra.tau2_task or env.config.task_id)")
    if isinstance(record_or_task, dict) and "user_scenario" in record_or_task:
        if not domain:
            raise ValueError("a raw tau2 task dict needs domain=")
        return domain, t2env.as_tau2_task(record_or_task)
    raise TypeError(f"cannot read a tau2 task from {type(record_or_task).__name__}")


# ==============================================================================================
# Message conversion


def _msg_dict(m: Any) -> dict:
    if hasattr(m, "model_dump"):
        return m.model_dump(exclude_none=True)
    return dict(m)


def _tool_error_message(content: Any) -> str | None:
    """The τ² error text if `content` is our structured tool error, else None."""
    if not isinstance(content, str) or not content.startswith("{"):
        return None
    try:
        obj = json.loads(content)
    except (json.JSONDecodeError, ValueError):
        return None
    if isinstance(obj, dict) and set(obj) == {"error"} and isinstance(obj["error"], dict) \
            and "code" in obj["error"] and "message" in obj["error"]:
        return str(obj["error"]["message"])
    return None


def _parse_args(a: Any) -> dict:
    if isinstance(a, dict):
        return a
    if not a or not str(a).strip():
        return {}
    try:
        v = json.loads(a)
    except json.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def messages_to_tau2(messages: Iterable[Any], user_tool_call_ids: Iterable[str] | None = None) -> list:
    """Our OpenAI-format messages → τ² message objects (system messages dropped).

    A tool call is user-side (τ² requestor "user") when its message has ``name == "user"`` or its
    id is in `user_tool_call_ids` (e.g. the ids of steps with side "user"). Tool results follow
    their calls in call order, as τ²'s replay requires.
    """
    t2 = t2env._tau2()
    AM, UM, TM, TC = t2["AssistantMessage"], t2["UserMessage"], t2["ToolMessage"], t2["ToolCall"]
    user_ids = set(user_tool_call_ids or ())
    msgs = [_msg_dict(m) for m in messages]
    out: list = []
    side_of: dict[str, str] = {}
    i = 0
    while i < len(msgs):
        m = msgs[i]
        role = m.get("role")
        if role == "system":
            i += 1
            continue
        if role == "user":
            out.append(UM(role="user", content=m.get("content")))
            i += 1
            continue
        if role == "assistant":
            tcs = m.get("tool_calls") or []
            if not tcs:
                out.append(AM(role="assistant", content=m.get("content")))
                i += 1
                continue
            # group consecutive calls by side, keeping order
            groups: list[tuple[str, list]] = []
            for tc in tcs:
                tc = _msg_dict(tc)
                fn = tc.get("function") or {}
                side = "user" if (m.get("name") == "user" or tc.get("id") in user_ids) else "assistant"
                call = TC(id=tc.get("id") or "", name=fn.get("name") or "",
                          arguments=_parse_args(fn.get("arguments")), requestor=side)
                side_of[call.id] = side
                if groups and groups[-1][0] == side:
                    groups[-1][1].append(call)
                else:
                    groups.append((side, [call]))
            # the tool results answering this message
            j = i + 1
            results: dict[str, dict] = {}
            while j < len(msgs) and msgs[j].get("role") == "tool":
                results.setdefault(msgs[j].get("tool_call_id"), msgs[j])
                j += 1
            content = m.get("content")
            for gi, (side, calls) in enumerate(groups):
                cls = UM if side == "user" else AM
                out.append(cls(role="user" if side == "user" else "assistant",
                               content=content if gi == 0 else None, tool_calls=calls))
                for c in calls:
                    r = results.pop(c.id, None)
                    if r is None:
                        continue
                    out.append(_tool_to_tau2(TM, r, side))
            for r in results.values():  # results answering nothing here (kept for τ² to judge)
                out.append(_tool_to_tau2(TM, r, side_of.get(r.get("tool_call_id"), "assistant")))
            i = j
            continue
        if role == "tool":  # an orphan tool message
            out.append(_tool_to_tau2(TM, m, side_of.get(m.get("tool_call_id"), "assistant")))
            i += 1
            continue
        i += 1
    return out


def _tool_to_tau2(TM: Any, m: dict, side: str) -> Any:
    content = m.get("content")
    err = _tool_error_message(content)
    if err is not None:
        return TM(id=m.get("tool_call_id") or "", role="tool", content=t2env.TOOL_ERROR_PREFIX + err,
                  requestor=side, error=True)
    if isinstance(content, str) and content.startswith(t2env.TOOL_ERROR_PREFIX):
        return TM(id=m.get("tool_call_id") or "", role="tool", content=content, requestor=side, error=True)
    return TM(id=m.get("tool_call_id") or "", role="tool", content=content, requestor=side, error=False)


def tau2_to_messages(tau2_messages: Iterable[Any], with_steps: bool = False):
    """τ² messages (objects or dicts) → our OpenAI-format message dicts.

    User tool calls become assistant-role messages with ``name="user"``; τ² error results become
    our structured error content. With `with_steps`, also returns Step dicts (side, ok, error_code).
    """
    t2 = t2env._tau2()
    out: list[dict] = []
    steps: list[dict] = []
    names: dict[str, tuple[str, str]] = {}
    flat: list = []
    for m in tau2_messages:
        if isinstance(m, dict):
            m = _tau2_from_dict(t2, m)
        if isinstance(m, t2["MultiToolMessage"]):
            flat.extend(m.tool_messages)
        else:
            flat.append(m)
    for m in flat:
        role = m.role
        if role == "system":
            out.append({"role": "system", "content": m.content or ""})
        elif role in ("user", "assistant") and m.tool_calls:
            side = "user" if role == "user" else "agent"
            msg: dict = {"role": "assistant", "content": m.content if m.has_text_content() else None,
                         "tool_calls": [{"id": tc.id, "type": "function",
                                         "function": {"name": tc.name,
                                                      "arguments": json.dumps(tc.arguments, ensure_ascii=False)}}
                                        for tc in m.tool_calls]}
            if side == "user":
                msg["name"] = "user"
            for tc in m.tool_calls:
                names[tc.id] = (tc.name, side)
            out.append(msg)
        elif role == "user":
            out.append({"role": "user", "content": m.content or ""})
        elif role == "assistant":
            out.append({"role": "assistant", "content": m.content})
        elif role == "tool":
            content = m.content
            if m.error:
                text = content[len(t2env.TOOL_ERROR_PREFIX):] if (content or "").startswith(
                    t2env.TOOL_ERROR_PREFIX) else (content or "")
                content = json.dumps({"error": {"code": "TOOL_ERROR", "message": text,
                                                "violated_rule": None, "hint": None}},
                                     ensure_ascii=False, sort_keys=True)
            out.append({"role": "tool", "tool_call_id": m.id, "content": content})
            name, side = names.get(m.id, ("", "user" if m.requestor == "user" else "agent"))
            steps.append({"tool_call_id": m.id, "name": name or "unknown", "side": side,
                          "ok": not m.error, "error_code": "TOOL_ERROR" if m.error else None})
    return (out, steps) if with_steps else out


def _tau2_from_dict(t2: dict, m: dict) -> Any:
    role = m.get("role")
    if role == "tool" and "tool_messages" in m:
        return t2["MultiToolMessage"].model_validate(m)
    cls = {"system": t2["SystemMessage"], "user": t2["UserMessage"], "assistant": t2["AssistantMessage"],
           "tool": t2["ToolMessage"]}[role]
    return cls.model_validate(m)


def trajectory_parts(trajectory: Any) -> tuple[list, set, str | None]:
    """(messages, user-side tool_call ids, termination) from a Trajectory or a message list."""
    if isinstance(trajectory, (list, tuple)):
        return list(trajectory), set(), None
    msgs = attr_or_key(trajectory, "messages") or []
    steps = attr_or_key(trajectory, "steps") or []
    uids = {(attr_or_key(s, "tool_call_id")) for s in steps if attr_or_key(s, "side") == "user"}
    return list(msgs), uids, attr_or_key(trajectory, "termination")
