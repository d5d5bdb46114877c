"""The offline oracle: a task's expected actions replayed in our τ² backend, then scored (checks the
bridge end to end without a model)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from copy import deepcopy
from typing import Any

from toolkit.tau2.convert import ORACLE_MODEL, load_tasks, resolve_task
from toolkit.tau2.scoring import same_score, score_fast, score_official
from toolkit.envs.base import load_env

# ==============================================================================================
# Oracle


def _communicate_text(infos: list[str]) -> str:
    if not infos:
        return "Your request has been completed. Is there anything else I can help you with?"
    return "Here is the information you asked for:\n" + "\n".join(f"- {i}" for i in infos)


def oracle_trajectory(record: Any, env: Any = None) -> dict:
    """Replay a task's expected actions in OUR tau2 backend (user-side actions with side="user")
    and state the task's communicate_info in a final assistant message. Returns a Trajectory dict."""
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
