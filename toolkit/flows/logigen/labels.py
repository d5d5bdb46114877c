"""Honest labels of a LOGIGEN task, computed from what the task requires (by replaying it).

`analyze_path(env, origin, actions, user_texts)` replays the reference path step by step:
- writes: steps that change the state hash;
- read_dependent: writes with an argument value that appears in an EARLIER tool result and
  nowhere in what the user says or knows (found by a look-up, an option menu or an insert's
  returned key);
- state_dependent: writes that fail (or do something else) when run on s_origin alone, i.e. they
  need what an earlier write changed (an entangled chain);
- waterfall: a write whose trigger side effects UPDATE an existing row of another table (rows an
  AFTER trigger appends to a journal/audit table are not a waterfall);
- violation_first: a step that expects POLICY_VIOLATION.

`labels(facts, boundary, patterns, injections)` turns that into the archetype, the tags and the
level (L1-L3):
- archetype: Mismatch (a request the policy rejects) > Edge (a goal exactly at a rule's limit,
  from an N-1 state) > Entangled (a later write needs an earlier one: its key or its state
  change) > Rookie (the user lacks identifiers: some write depends on a read) > Direct;
- tags: Multi-Step (>= 2 writes), Conditional-Logic (a rejection to handle, an option menu, a
  trade-off), State-Based (a boundary or an entangled write), Waterfall (above), Adversarial
  (the user insists after a refusal), Reasoning (option menu, trade-off, distractor / substitute /
  trade-off rows), Hidden-Constraint (a rule the user does not state: violation or boundary);
- level: points for >= 3 writes, >= 5 writes, a read dependency, an entangled write, a
  violation, a boundary, a waterfall, reasoning, a mind change: L1 <= 1, L2 2-3, L3 >= 4.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from toolkit.flows.logigen.projection import view_texts
from toolkit.flows.logigen.replay import waterfall

TAGS = ("Conditional-Logic", "Multi-Step", "State-Based", "Waterfall", "Adversarial", "Reasoning",
        "Hidden-Constraint")


def _scalars(obj: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for v in obj.values():
            out |= _scalars(v)
    elif isinstance(obj, list):
        for v in obj:
            out |= _scalars(v)
    elif obj is not None and not isinstance(obj, bool):
        out.add(str(obj))
    return out


def _in_text(v: str, blob: str) -> bool:
    return re.search(r"(?<![\w.-])" + re.escape(v) + r"(?![\w-])", blob) is not None


def analyze_path(env: Any, origin: dict | None, actions: list[dict], user_texts: list[str]) -> dict:
    """Replay `actions` on `origin` (None: the env's current reset state) in `env` (a sqlite
    environment, reset before and after); see the module doc for the fields."""
    tools = env.domain.tools
    blob = "\n".join(t for t in user_texts if t)
    env.reset(origin) if origin is not None else env.reset()
    start = env.checkpoint() if hasattr(env, "checkpoint") else None
    seen_results: set[str] = set()
    out = {"writes": 0, "read_dependent": 0, "state_dependent": 0, "waterfall": 0, "violation_first": False,
           "actions": len(actions), "write_tables": [], "dependent_args": []}
    try:
        for i, a in enumerate(actions):
            td = tools.get(a["name"])
            is_write = td is not None and td.kind in ("insert", "update")
            if a.get("expect_error"):
                out["violation_first"] = out["violation_first"] or out["writes"] == 0
            before = env.snapshot() if is_write else None
            h0 = env.state_hash()
            r = env.call(a["name"], copy.deepcopy(a.get("arguments") or {}))
            changed = r.ok and env.state_hash() != h0
            if changed and is_write:
                out["writes"] += 1
                out["write_tables"].append(td.table)
                dep = [str(v) for v in (a.get("arguments") or {}).values()
                       if v is not None and not isinstance(v, bool) and str(v) in seen_results
                       and not _in_text(str(v), blob)]
                if dep:
                    out["read_dependent"] += 1
                    out["dependent_args"].append({"step": i, "values": dep})
                after = env.snapshot()
                if waterfall(env, td.table, before, after):
                    out["waterfall"] += 1
                if out["writes"] > 1 and start is not None and not a.get("expect_error"):
                    # does this write need an earlier one? run it alone on s_origin
                    cp = env.checkpoint()
                    env.restore(start)
                    h_a = env.state_hash()
                    r2 = env.call(a["name"], copy.deepcopy(a.get("arguments") or {}))
                    if not r2.ok or env.state_hash() == h_a:
                        out["state_dependent"] += 1
                    env.restore(cp)
            if r.ok:
                seen_results |= _scalars(r.content)
    finally:
        env.reset()
    return out


def facts_from_trace(trace: dict, user_texts: list[str]) -> dict:
    """analyze_path's facts from the generator's own execution trace (replay.run_traced) instead
    of a second replay; validation keeps replaying independently (record_labels)."""
    blob = "\n".join(t for t in user_texts if t)
    actions = trace["actions"]
    out = {"writes": 0, "read_dependent": 0, "state_dependent": 0, "waterfall": 0, "violation_first": False,
           "actions": len(actions), "write_tables": [], "dependent_args": []}
    for i, (a, st) in enumerate(zip(actions, trace["steps"])):
        if a.get("expect_error"):
            out["violation_first"] = out["violation_first"] or out["writes"] == 0
        if not st["write"]:
            continue
        out["writes"] += 1
        out["write_tables"].append(st["table"])
        dep = [v for v in st["dep"] if not _in_text(v, blob)]
        if dep:
            out["read_dependent"] += 1
            out["dependent_args"].append({"step": i, "values": dep})
        out["waterfall"] += bool(st["waterfall"])
        out["state_dependent"] += bool(st["alone_fails"])
    return out


def labels(facts: dict, boundary: bool, patterns: list[str], injections: list[dict]) -> dict:
    pats = set(patterns or [])
    viol = bool(facts.get("violation_first"))
    w = facts.get("writes", 0)
    reasoning = bool(pats & {"option-menu", "trade-off"}) or any(
        i.get("strategy") in ("distractor", "substitute", "tradeoff") for i in injections or [])
    entangled = facts.get("state_dependent", 0) > 0 or "uses-created-row" in pats
    if viol:
        arche = "Mismatch"
    elif boundary:
        arche = "Edge"
    elif entangled and w >= 2:
        arche = "Entangled"
    elif facts.get("read_dependent", 0) > 0:
        arche = "Rookie"
    else:
        arche = "Direct"
    tags = set()
    if w >= 2:
        tags.add("Multi-Step")
    if viol or pats & {"option-menu", "trade-off"}:
        tags.add("Conditional-Logic")
    if boundary or entangled:
        tags.add("State-Based")
    if facts.get("waterfall", 0) > 0:
        tags.add("Waterfall")
    if "insist" in pats:
        tags.add("Adversarial")
    if reasoning:
        tags.add("Reasoning")
    if viol or boundary:
        tags.add("Hidden-Constraint")
    points = sum([w >= 3, w >= 5, facts.get("read_dependent", 0) > 0, entangled, viol, boundary,
                  facts.get("waterfall", 0) > 0, reasoning, "mind-change" in pats])
    level = "L3" if points >= 4 else "L2" if points >= 2 else "L1"
    return {"archetype": arche, "tags": [t for t in TAGS if t in tags], "level": level, "points": points}


def record_labels(env: Any, record: Any) -> tuple[dict, dict]:
    """(facts, labels) of a task record (its env.state is s_origin, env is built from it)."""
    task = record.task
    cx = task.complexity or {}
    acts = [a.model_dump(exclude_none=True) if hasattr(a, "model_dump") else dict(a) for a in task.ground_truth.actions]
    texts = view_texts(task)
    facts = analyze_path(env, None, acts, texts)
    lab = labels(facts, bool(cx.get("boundary")), list(cx.get("patterns") or []), list(cx.get("injection") or []))
    return facts, lab


def compare(stored: dict, computed: dict) -> list[str]:
    """Differences between a task's stored labels and the computed ones."""
    out = []
    for k in ("archetype", "level"):
        if stored.get(k) != computed.get(k):
            out.append(f"complexity.{k} is {stored.get(k)!r}, the task requires {computed.get(k)!r}")
    if sorted(stored.get("tags") or []) != sorted(computed.get("tags") or []):
        out.append(f"complexity.tags are {json.dumps(sorted(stored.get('tags') or []))}, the task requires "
                   f"{json.dumps(sorted(computed.get('tags') or []))}")
    return out
