"""τ²-bench scoring of our trajectories: the official evaluators (`score_official`) and the fast
path over the same evaluators with cached gold states (`score_fast`), `verify_record`."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable
from typing import Any

from toolkit.envs import tau2 as t2env
from toolkit.tau2.convert import (
    SUCCESS_EPS,
    TERMINATION,
    attr_or_key,
    messages_to_tau2,
    resolve_task,
    trajectory_parts,
)

# ==============================================================================================
# Scoring


def _simulation(task: Any, tau2_msgs: list, termination: str | None) -> Any:
    from tau2.data_model.simulation import SimulationRun

    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    return SimulationRun(id="toolkit", task_id=task.id, start_time=now, end_time=now, duration=0.0,
                         termination_reason=TERMINATION.get(termination, "agent_error"),
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
    msgs, uids, term = trajectory_parts(trajectory_messages)
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

    if TERMINATION.get(termination, "agent_error") not in ("agent_stop", "user_stop"):
        return RewardInfo(reward=0.0, reward_basis=None, info={
            "note": f"Simulation terminated prematurely. Termination reason: "
                    f"{TERMINATION.get(termination, 'agent_error')}"})
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
    msgs, uids, term = trajectory_parts(trajectory_messages)
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
    for traj in attr_or_key(record, "trajectories") or []:
        res = score(record, traj)
        term = attr_or_key(traj, "termination")
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
            "reasons": reasons, "attribution": attribution, "trajectory_id": attr_or_key(traj, "id"),
        })
    return out
