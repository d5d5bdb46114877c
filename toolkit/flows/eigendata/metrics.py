"""Deterministic batch analysis for reflect, the pilot loop and drift monitoring (EigenData §4.3).

- `failure_categories(record)`: the failure categories a record's verdicts carry (feasibility
  categories, judge critical issues, mechanical-check kinds, SEA rejections, verifier self-test).
- `group_key(record)`: (prompt set, prompt version) — plan.prompt_set or plan.id, plan.prompt_version.
- `batch_metrics(records)`: per-batch rates over the first-pass records: infeasibility
  (task_feasibility / task_quality fails over validated tasks), tool validity (task_mechanics pass
  rate), quality (verify pass rate over verified trajectories); mean repair rounds per task (from the
  repaired records `<root>-rep<k>` given with the batch) and the repaired tasks' final pass rate;
  category counts over every record.
- `pilot_criteria(m, thresholds)`: EigenData's Phase-2 stop rule with the toolkit's numbers (the
  paper gives none): infeasibility ≤ 0.2, tool validity ≥ 0.9, quality ≥ 0.7 (each only when
  measured).
- `drift(current, baseline, thresholds)`: Phase-3 drift signals: infeasibility up by > 0.15, tool
  validity down by > 0.1, quality down by > 0.15, mean repair rounds up by > 0.5.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

_REP = re.compile(r"(-rep\d+)+$")
PILOT_DEFAULTS = {"max_infeasibility": 0.2, "min_tool_validity": 0.9, "min_quality": 0.7}
DRIFT_DEFAULTS = {"infeasibility_up": 0.15, "tool_validity_down": 0.1, "quality_down": 0.15, "repair_rounds_up": 0.5}


def _mech_kind(reason: str) -> str:
    r = reason.lower()
    if "unknown function" in r:
        return "unknown_function"
    if "sequential" in r:
        return "too_few_calls"
    if "expected action" in r:
        return "expected_action_fails"
    return "mechanics_other"


def failure_categories(record: Any) -> list[str]:
    out: list[str] = []
    for v in record.verdicts:
        if v.passed:
            continue
        if v.name == "task_feasibility":
            out += list(v.scores.get("failure_categories") or []) or ["infeasible"]
        elif v.name == "task_mechanics":
            out += [_mech_kind(r) for r in v.reasons] or ["mechanics_other"]
        elif v.name == "task_quality":
            out.append("task_quality_reject")
        elif v.stage == "verify":
            crit = v.scores.get("critical") or []
            if crit:
                out += list(crit)
            elif v.scores.get("malformed"):
                out.append("judge_malformed")
            else:
                out.append(f"trajectory_failed_{v.attribution or 'trajectory'}")
        elif v.stage == "make-verifier":
            out.append("verifier_self_test")
    return out


def group_key(record: Any) -> tuple[str, str]:
    p = record.plan
    if p is None:
        return ("no-plan", "1")
    return (p.prompt_set or p.id or "no-plan", str(p.prompt_version or "1"))


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def root_id(record: Any) -> str:
    """The task a repaired record descends from (repair writes `<root>-rep<round>`)."""
    return str(record.extra.get("repair_root") or _REP.sub("", record.id))


def batch_metrics(records: Iterable[Any]) -> dict:
    """Rates over the FIRST-PASS records (repair_round 0: what the prompt set itself produced);
    repair_rounds = mean over tasks (roots) of the highest repair round any of its records reached,
    so a batch given with its repaired records (the recipe's reflect / drift input) shows the
    repair effort (EigenData Phase 3: "increasing repair iterations")."""
    n = 0
    feas = feas_fail = mech = mech_ok = traj = traj_ok = 0
    rounds: dict[str, int] = {}
    repaired_ok: dict[str, tuple[int, bool]] = {}
    cats: Counter = Counter()
    for r in records:
        n += 1
        rnd = int(r.extra.get("repair_round") or 0)
        root = root_id(r)
        rounds[root] = max(rounds.get(root, 0), rnd)
        cats.update(failure_categories(r))
        vv = [v for v in r.verdicts if v.stage == "verify"]
        if rnd and vv and rnd >= repaired_ok.get(root, (0, False))[0]:
            repaired_ok[root] = (rnd, all(v.passed for v in vv))
        if rnd:
            continue
        for v in r.verdicts:
            if v.stage == "validate-task" and v.name in ("task_feasibility", "task_quality"):
                feas += 1
                feas_fail += 0 if v.passed else 1
            if v.stage == "validate-task" and v.name == "task_mechanics":
                mech += 1
                mech_ok += 1 if v.passed else 0
            if v.stage == "verify":
                traj += 1
                traj_ok += 1 if v.passed else 0
    rr = list(rounds.values())
    return {"records": n, "infeasibility": _rate(feas_fail, feas), "tool_validity": _rate(mech_ok, mech),
            "quality": _rate(traj_ok, traj), "repair_rounds": round(sum(rr) / len(rr), 4) if rr else None,
            "repaired": len(repaired_ok), "repair_success": _rate(sum(ok for _, ok in repaired_ok.values()),
                                                                  len(repaired_ok)),
            "categories": dict(sorted(cats.items(), key=lambda kv: (-kv[1], kv[0]))),
            "counts": {"validated": feas, "mechanics": mech, "verified": traj}}


def pilot_criteria(m: dict, thresholds: dict | None = None) -> dict:
    t = dict(PILOT_DEFAULTS, **(thresholds or {}))
    checks = {}
    if m.get("infeasibility") is not None:
        checks["infeasibility"] = m["infeasibility"] <= t["max_infeasibility"]
    if m.get("tool_validity") is not None:
        checks["tool_validity"] = m["tool_validity"] >= t["min_tool_validity"]
    if m.get("quality") is not None:
        checks["quality"] = m["quality"] >= t["min_quality"]
    return {"met": bool(checks) and all(checks.values()), "checks": checks, "thresholds": t}


def drift(current: dict, baseline: dict, thresholds: dict | None = None) -> dict:
    t = dict(DRIFT_DEFAULTS, **(thresholds or {}))
    signals = []

    def both(k):
        return current.get(k) is not None and baseline.get(k) is not None

    if both("infeasibility") and current["infeasibility"] - baseline["infeasibility"] > t["infeasibility_up"]:
        signals.append(f"infeasibility {baseline['infeasibility']} → {current['infeasibility']}")
    if both("tool_validity") and baseline["tool_validity"] - current["tool_validity"] > t["tool_validity_down"]:
        signals.append(f"tool validity {baseline['tool_validity']} → {current['tool_validity']} (new schema errors)")
    if both("quality") and baseline["quality"] - current["quality"] > t["quality_down"]:
        signals.append(f"quality {baseline['quality']} → {current['quality']} (degraded realism / success)")
    if both("repair_rounds") and current["repair_rounds"] - baseline["repair_rounds"] > t["repair_rounds_up"]:
        signals.append(f"repair rounds {baseline['repair_rounds']} → {current['repair_rounds']}")
    new_cats = sorted(set(current.get("categories") or {}) - set(baseline.get("categories") or {}))
    return {"drift": bool(signals), "signals": signals, "new_categories": new_cats, "thresholds": t}


def sample(records: list, rate: float, key: str = "id") -> list:
    """A deterministic audit sample: records whose id hashes below `rate` (stable across runs)."""
    import hashlib

    if rate >= 1:
        return list(records)
    out = []
    for r in records:
        h = int(hashlib.sha256(getattr(r, key).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if h < rate:
            out.append(r)
    return out


