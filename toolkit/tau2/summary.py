"""pass^k / pass@k, the per-domain summary of eval-tau2 records and its text table."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from toolkit.envs import tau2 as t2env
from toolkit.tau2.convert import SUCCESS_EPS, attr_or_key

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
    tid = attr_or_key(traj, "id")
    for v in reversed(attr_or_key(record, "verdicts") or []):
        if attr_or_key(v, "kind") == "tau2" and attr_or_key(v, "trajectory_id") in (tid, None):
            s = attr_or_key(v, "score")
            if s is not None:
                return float(s)
            return 1.0 if attr_or_key(v, "passed") else 0.0
    r = attr_or_key(traj, "reward")
    if r is not None:
        return float(r)
    sc = (attr_or_key(traj, "scores") or {}).get("tau2")
    if isinstance(sc, dict) and sc.get("reward") is not None:
        return float(sc["reward"])
    return None


def _record_domain(record: Any) -> str:
    env = attr_or_key(record, "env")
    if env is not None and attr_or_key(env, "id"):
        return str(attr_or_key(env, "id"))
    for t in attr_or_key(record, "tags") or []:
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
        env_config = attr_or_key(attr_or_key(rec, "env"), "config") or {}
        tkey = str(env_config.get("task_id") if env_config.get("task_id") is not None else (attr_or_key(rec, "parent_id") or attr_or_key(rec, "id")))
        st = stats.setdefault(dom, {"infrastructure_errors": 0, "unscored": 0, "rewards": [],
                                    "attribution": {"agent": 0, "user_simulator": 0, "infrastructure": 0, "task": 0}})
        verdict_attr: dict[Any, str] = {}
        for v in attr_or_key(rec, "verdicts") or []:
            if not attr_or_key(v, "passed") and attr_or_key(v, "attribution"):
                verdict_attr[attr_or_key(v, "trajectory_id")] = _ATTR.get(attr_or_key(v, "attribution"), attr_or_key(v, "attribution"))
        for traj in attr_or_key(rec, "trajectories") or []:
            infra = attr_or_key(traj, "termination") == "error"
            if infra:
                st["infrastructure_errors"] += 1
            a = verdict_attr.get(attr_or_key(traj, "id")) or ("infrastructure" if infra else None)
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


def pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def render_table(summary: dict) -> str:
    k = summary.get("k", 1)
    cols = ["domain", "tasks", "trials"] + [f"pass^{j}" for j in range(1, k + 1)] + \
        [f"pass@{k}", "avg_rew", "infra_err", "attr(agent/user/infra/task)"]
    rows = []
    for dom, d in summary.get("domains", {}).items():
        a = d.get("attribution") or {}
        rows.append([dom, str(d["tasks"]), str(d["trials"])] +
                    [pct(d.get(f"pass^{j}")) for j in range(1, k + 1)] +
                    [pct(d.get(f"pass@{k}")), pct(d.get("avg_reward")), str(d["infrastructure_errors"]),
                     f"{a.get('agent', 0)}/{a.get('user_simulator', 0)}/{a.get('infrastructure', 0)}/{a.get('task', 0)}"])
    if len(summary.get("domains", {})) > 1:
        avg = summary.get("average") or {}
        rows.append(["average", "", ""] + [pct(avg.get(f"pass^{j}")) for j in range(1, k + 1)] +
                    [pct(avg.get(f"pass@{k}")), pct(avg.get("avg_reward")), "", ""])
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]

    def line(r: list[str]) -> str:
        return "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths)))

    out = [line(cols), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    note = "(percent; infra errors " + ("excluded)" if summary.get("exclude_infra_errors") else "counted as failures)")
    warns = [f"{dom}: {w}" for dom, d in summary.get("domains", {}).items() for w in d.get("warnings", [])]
    return "\n".join(out + [note] + warns)
