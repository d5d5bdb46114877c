"""The closed-loop experiment's data steps (recipes/learn.sh): split synthesized tasks into train
and held-out by target, and turn verified held-out rollouts of base / SFT / GRPO into the table,
summary.json, details.json and curves.

    python -m toolkit.train.learn split --heldout 0.3 --seed 7 --train T.jsonl --heldout-out H.jsonl < tasks.jsonl
    python -m toolkit.train.learn report --out DIR base=B.jsonl sft=S.jsonl grpo=G.jsonl [--curves sft=DIR ...]
    (--curves last: it takes the NAME=DIR pairs after it)

Split: each task's "keys" are its target (the target state's hash, or its reference actions when
there is no target) and the entities its reference actions name (every `*_id` / `id` argument
value, except the `shared` ones: for a sqlite domain, the primary-key names of catalogue tables,
those the agent has no insert/update tool for, e.g. airline's flights and payment methods; every
customer would otherwise share a flight with every other, and no task could go to train).
Held-out tasks are drawn (seeded) until the fraction is reached; every other task that shares a
key with a held-out task is dropped from train (counted), so train and held-out have disjoint
targets and entities (customers, reservations...).

Report: per model over its verified trajectories (verify --strategy state_diff): n, mean reward,
pass rate, valid tool-call rate (agent turns whose every tool call parsed, named a real tool and
had object arguments / all agent turns), passes that changed nothing (task target = start
state), each with a 95% bootstrap interval; differences (sft - base, grpo - sft) of mean reward
with a paired bootstrap over held-out tasks (2,000 resamples, seeded).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from collections.abc import Iterable
from toolkit.envs.sqlite import SqliteEnvironment
from toolkit.train.principals import add_principals

BAD_CALL_CODES = ("UNKNOWN_TOOL", "INVALID_ARGUMENTS")
FORBIDDEN_CODE = "POLICY_VIOLATION"  # a write the domain's policy forbids, attempted (and rejected)
MODELS = ("base", "sft", "grpo")


def _read(path: str | None) -> list[dict]:
    if not path or path == "-":
        return [json.loads(line) for line in sys.stdin if line.strip()]
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_stdout(recs: Iterable[dict]) -> None:
    sys.stdout.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)


def _write(path: str, recs: Iterable[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)


# ----------------------------------------------------------------------------------------------
# split


def shared_args(rec: dict) -> set[str]:
    """Argument names that name catalogue rows (not a task's own entities): for a sqlite domain,
    the single-column primary keys of tables the agent cannot insert into or update, unless a
    writable table's key has the same name. Other backends: none."""
    env = rec.get("env") or {}
    if env.get("backend") != "sqlite":
        return set()
    dom = SqliteEnvironment.from_ref({k: v for k, v in env.items() if k in ("backend", "id", "path", "config")}).domain
    writable = {td.table for td in dom.tools.values() if td.kind in ("insert", "update") and not td.hidden}
    keys = {t.name: t.pk[0] for t in dom.tables.values() if len(t.pk) == 1}
    own = {keys[t] for t in writable if t in keys}
    return {k for t, k in keys.items() if t not in writable and k not in own}


def task_keys(rec: dict, shared: set[str] | frozenset = frozenset()) -> set[str]:
    gt = ((rec.get("task") or {}).get("ground_truth") or {})
    keys: set[str] = set()
    target = gt.get("target_state_ref")
    if not target and gt.get("target_state") is not None:
        target = hashlib.sha256(json.dumps(gt["target_state"], sort_keys=True).encode()).hexdigest()
    if not target:
        target = hashlib.sha256(json.dumps(gt.get("actions") or [], sort_keys=True).encode()).hexdigest()
    keys.add(f"target:{target}")
    for a in gt.get("actions") or []:
        for k, v in (a.get("arguments") or {}).items():
            if k in shared:
                continue
            if (k == "id" or k.endswith("_id")) and isinstance(v, (str, int)) and not isinstance(v, bool):
                keys.add(f"entity:{k}={v}")
    return keys


def signature(rec: dict) -> tuple[str, ...]:
    """A task's action signature: the sequence of its reference actions' tool names."""
    gt = ((rec.get("task") or {}).get("ground_truth") or {})
    return tuple(str(a.get("name")) for a in gt.get("actions") or [])


def task_kind(rec: dict) -> str:
    """LOGIGEN's kind of task: violation-first (the reference path starts with a forbidden attempt),
    boundary (s_origin one action from a rule's edge), or plain."""
    cx = ((rec.get("task") or {}).get("complexity") or {})
    if cx.get("violation"):
        return "violation-first"
    if cx.get("boundary"):
        return "boundary"
    return "plain"


def _sig_counts(recs: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in recs:
        k = " > ".join(signature(r))
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def split(tasks: list[dict], heldout_frac: float, seed: int,
          max_heldout: int | None = None, stratify: bool = True) -> tuple[list[dict], list[dict], list[dict]]:
    """(train, heldout, dropped): disjoint targets and entities between train and held-out; at most
    `max_heldout` held-out tasks (train keeps what only the uncapped set would have excluded).
    `stratify`: the held-out set takes the action signatures in turn (the next task has the
    signature held out least so far), so it is not all one kind of task because one customer's
    tasks happened to add the fewest new keys (airline, seed 7: 15 of 20 were new reservations)."""
    order = sorted(range(len(tasks)),
                   key=lambda i: hashlib.sha256(f"{seed}:{tasks[i].get('id')}".encode()).hexdigest())
    shared_by_env: dict[str, set[str]] = {}
    keys = []
    for t in tasks:
        ek = json.dumps({k: v for k, v in (t.get("env") or {}).items() if k != "state"}, sort_keys=True)
        if ek not in shared_by_env:
            shared_by_env[ek] = shared_args(t)
        keys.append(task_keys(t, shared_by_env[ek]))
    want = max(1, round(heldout_frac * len(tasks))) if tasks else 0
    if max_heldout is not None:
        want = min(want, max_heldout)
    held: list[int] = []
    held_keys: set[str] = set()
    sigs = [signature(t) if stratify else () for t in tasks]
    n_sig: dict[tuple, int] = {}
    # each next held-out task: the least held-out signature, then the fewest new keys (ties: seeded
    # order), so the held-out set mixes the kinds of task, gathers around few entities and train
    # keeps the rest
    rank = {i: n for n, i in enumerate(order)}
    left = set(order)
    while left and len(held) < want:
        i = min(left, key=lambda j: (n_sig.get(sigs[j], 0), len(keys[j] - held_keys), rank[j]))
        left.discard(i)
        held.append(i)
        held_keys |= keys[i]
        n_sig[sigs[i]] = n_sig.get(sigs[i], 0) + 1
    hs = set(held)
    train = [tasks[i] for i in order if i not in hs and not (keys[i] & held_keys)]
    dropped = [tasks[i] for i in order if i not in hs and (keys[i] & held_keys)]
    return train, [tasks[i] for i in sorted(held)], dropped


def exclude(tasks: list[dict], others: list[dict]) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): the tasks that share no key (target, entity) with any of `others` (e.g. RL
    tasks against the SFT and held-out ones), and the rest."""
    shared_by_env: dict[str, set[str]] = {}

    def keys(t: dict) -> set[str]:
        ek = json.dumps({k: v for k, v in (t.get("env") or {}).items() if k not in ("state", "state_ref")},
                        sort_keys=True)
        if ek not in shared_by_env:
            shared_by_env[ek] = shared_args(t)
        return task_keys(t, shared_by_env[ek])

    taken = set().union(*(keys(o) for o in others)) if others else set()
    kept, dropped = [], []
    for t in tasks:
        (dropped if keys(t) & taken else kept).append(t)
    return kept, dropped


# ----------------------------------------------------------------------------------------------
# metrics


def agent_turns(traj: dict) -> tuple[int, int]:
    """(agent turns, turns with only valid tool calls)."""
    codes = {s.get("tool_call_id"): s.get("error_code") for s in traj.get("steps") or []}
    turns = valid = 0
    for m in traj.get("messages") or []:
        if m.get("role") != "assistant" or m.get("name") == "user":
            continue
        turns += 1
        calls = m.get("tool_calls") or []
        if calls and all(codes.get(c.get("id")) not in BAD_CALL_CODES for c in calls):
            valid += 1
    return turns, valid


def rows(recs: list[dict]) -> list[dict]:
    """One row per trajectory: task id, reward, passed, agent turns, valid turns, noop pass."""
    out = []
    for r in recs:
        for t in r.get("trajectories") or []:
            sd = (t.get("scores") or {}).get("state_diff") or {}
            reward = float(t.get("reward") or 0.0)
            passed = bool(sd.get("R")) if "R" in sd else reward >= 1.0
            turns, valid = agent_turns(t)
            forbidden = sum(1 for s in t.get("steps") or [] if s.get("side", "agent") == "agent"
                            and s.get("error_code") == FORBIDDEN_CODE)
            out.append({"task": r.get("id"), "reward": reward, "passed": passed, "turns": turns, "valid": valid,
                        "noop_pass": passed and bool(sd.get("noop_target")), "model": t.get("agent_model"),
                        "signature": " > ".join(signature(r)), "kind": task_kind(r), "forbidden": forbidden})
    return out


def _boot(values: list[float], n_boot: int, rng: random.Random) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    means = sorted(sum(rng.choice(values) for _ in values) / len(values) for _ in range(n_boot))
    return means[int(0.025 * n_boot)], means[min(n_boot - 1, int(0.975 * n_boot))]


def _by(rs: list[dict], key: str) -> dict[str, dict]:
    """Passes (and attempted forbidden writes) per value of `key`: which kinds a model learned."""
    out: dict[str, dict] = {}
    for r in rs:
        d = out.setdefault(r.get(key) or "", {"n": 0, "passes": 0, "forbidden_episodes": 0})
        d["n"] += 1
        d["passes"] += int(bool(r["passed"]))
        d["forbidden_episodes"] += int(bool(r.get("forbidden")))
    return dict(sorted(out.items()))


def _by_signature(rs: list[dict]) -> dict[str, dict]:
    """Passes per kind of task (action signature): which kinds a model learned."""
    return {k: {"n": v["n"], "passes": v["passes"]} for k, v in _by(rs, "signature").items()}


def model_stats(rs: list[dict], n_boot: int = 2000, seed: int = 0) -> dict:
    rng = random.Random(seed)
    n = len(rs)
    turns = sum(r["turns"] for r in rs)
    valid = sum(r["valid"] for r in rs)
    rewards = [r["reward"] for r in rs]
    passes = [1.0 if r["passed"] else 0.0 for r in rs]
    per_traj_valid = [r["valid"] / r["turns"] for r in rs if r["turns"]]
    forb = [1.0 if r.get("forbidden") else 0.0 for r in rs]
    st = {"n": n, "reward_mean": (sum(rewards) / n) if n else 0.0, "pass_rate": (sum(passes) / n) if n else 0.0,
          "valid_tool_call_rate": (valid / turns) if turns else 0.0,
          # episodes with at least one write the policy forbids (POLICY_VIOLATION), attempted
          "forbidden_write_rate": (sum(forb) / n) if n else 0.0}
    detail = dict(st, agent_turns=turns, valid_turns=valid, passes=int(sum(passes)),
                  noop_passes=sum(1 for r in rs if r["noop_pass"]),
                  reward_ci=_boot(rewards, n_boot, rng), pass_ci=_boot(passes, n_boot, rng),
                  valid_ci=_boot(per_traj_valid, n_boot, rng),
                  models=sorted({str(r["model"]) for r in rs if r.get("model")}),
                  by_signature=_by_signature(rs),
                  forbidden_calls=sum(int(r.get("forbidden") or 0) for r in rs),
                  forbidden_ci=_boot(forb, n_boot, rng), by_kind=_by(rs, "kind"))
    return {"summary": st, "detail": detail}


def paired_diff(a: list[dict], b: list[dict], n_boot: int = 2000, seed: int = 0) -> dict:
    """mean reward of b - a, paired by task (the per-task mean over its trajectories), bootstrap CI."""
    def per_task(rs):
        d: dict = {}
        for r in rs:
            d.setdefault(r["task"], []).append(r["reward"])
        return {k: sum(v) / len(v) for k, v in d.items()}
    pa, pb = per_task(a), per_task(b)
    common = sorted(set(pa) & set(pb))
    if not common:
        return {"diff": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    diffs = [pb[k] - pa[k] for k in common]
    lo, hi = _boot(diffs, n_boot, random.Random(seed))
    return {"diff": sum(diffs) / len(diffs), "ci_low": lo, "ci_high": hi}


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _diff_cell(v: dict | None) -> str:
    if not v or v.get("diff") != v.get("diff"):  # absent or NaN
        return "-"
    return f"{v['diff']:+.2f} [{v['ci_low']:+.2f}, {v['ci_high']:+.2f}]"


def table(details: dict, diffs: dict, by_kind_diffs: dict | None = None, training: dict | None = None) -> str:
    """table.md: one row per model, then per kind of task (action signature; LOGIGEN kind when the
    tasks mix plain, violation-first and boundary ones) the passes of each model and the paired
    differences with their intervals, then the differences and GRPO's training curve in numbers."""
    lines = [("| model | n | valid tool-call rate [95% CI] | mean reward [95% CI] | pass rate [95% CI] | "
              "passes that changed nothing | episodes attempting a forbidden write [95% CI] |"),
             "|---|---|---|---|---|---|---|"]
    for m, d in details.items():
        lines.append(f"| {m} | {d['n']} | {d['valid_tool_call_rate']:.3f} {_fmt_ci(d['valid_ci'])} "
                     f"({d['valid_turns']}/{d['agent_turns']} turns) | {d['reward_mean']:.3f} {_fmt_ci(d['reward_ci'])} | "
                     f"{d['pass_rate']:.3f} {_fmt_ci(d['pass_ci'])} | {d['noop_passes']} of {d['passes']} | "
                     f"{d.get('forbidden_write_rate', 0.0):.3f} {_fmt_ci(d.get('forbidden_ci') or (0.0, 0.0))} |")
    by_kind_diffs = by_kind_diffs or {}
    for title, field_, dkey in (("kind of task (action signature)", "by_signature", "signature"),
                                ("LOGIGEN kind of task", "by_kind", "kind")):
        keys = sorted({k for d in details.values() for k in d.get(field_) or {}})
        if len(keys) < 2:
            continue
        dnames = [n for n in ("sft_vs_base", "grpo_vs_sft") if n in diffs]
        head = [f"passes per {title}", *details, *(n.replace("_vs_", " − ") for n in dnames)]
        if dkey == "kind":
            head += [f"{m}: forbidden writes" for m in details]
        lines += ["", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for k in keys:
            got = [(d.get(field_) or {}).get(k) for d in details.values()]
            cells = [f"{c['passes']}/{c['n']}" if c else "-" for c in got]
            cells += [_diff_cell((by_kind_diffs.get(dkey) or {}).get(k, {}).get(n)) for n in dnames]
            if dkey == "kind":
                cells += [f"{c['forbidden_episodes']}/{c['n']}" if c else "-" for c in got]
            lines.append(f"| {k or '(no actions)'} | " + " | ".join(cells) + " |")
    lines.append("")
    for k, v in diffs.items():
        lines.append(f"- {k}: mean reward difference {v['diff']:+.3f}, 95% paired bootstrap CI "
                     f"[{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]")
    for name, t in (training or {}).items():
        lines.append(f"- {name} training ({t['steps']} steps): reward_mean first quarter {t['reward_first_quarter']:.3f} "
                     f"-> last quarter {t['reward_last_quarter']:.3f}; success_rate "
                     f"{t['success_first_quarter']:.3f} -> {t['success_last_quarter']:.3f}")
    return "\n".join(lines) + "\n"


def training_curve(run_dir: str) -> dict | None:
    """GRPO's per-step training reward in numbers (metrics.jsonl): steps, reward_mean and
    success_rate averaged over the first and the last quarter of the steps (at least one step each)."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
            ms = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return None
    ms = [m for m in ms if isinstance(m.get("reward_mean"), (int, float)) and not m.get("reused_rollouts")]
    if not ms:
        return None
    q = max(1, len(ms) // 4)

    def mean(xs: list, k: str) -> float:
        v = [float(x.get(k) or 0.0) for x in xs]
        return sum(v) / len(v)

    return {"steps": len(ms), "reward_first_quarter": mean(ms[:q], "reward_mean"),
            "reward_last_quarter": mean(ms[-q:], "reward_mean"),
            "success_first_quarter": mean(ms[:q], "success_rate"), "success_last_quarter": mean(ms[-q:], "success_rate"),
            "reward_per_step": [round(float(m["reward_mean"]), 4) for m in ms],
            "success_per_step": [round(float(m.get("success_rate") or 0.0), 4) for m in ms]}


def curves(runs: dict[str, str], png: str) -> bool:
    """Plot metrics.jsonl of each training run (loss / reward per step) into one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, max(1, len(runs)), figsize=(5 * max(1, len(runs)), 3.5), squeeze=False)
    for ax, (name, d) in zip(axes[0], runs.items()):
        pts: dict[str, list] = {}
        try:
            with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
                for i, line in enumerate(f):
                    m = json.loads(line)
                    step = m.get("step", i)
                    for k in ("loss", "reward_mean", "success_rate", "reward"):
                        if isinstance(m.get(k), (int, float)):
                            pts.setdefault(k, []).append((step, m[k]))
        except (OSError, ValueError):
            pass
        for k, v in pts.items():
            ax.plot([p[0] for p in v], [p[1] for p in v], marker="o", label=k)
        ax.set_title(name)
        ax.set_xlabel("step")
        if pts:
            ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return True


def report(evals: dict[str, str], out: str, curve_runs: dict[str, str] | None = None) -> dict:
    os.makedirs(out, exist_ok=True)
    rs = {m: rows(_read(p)) for m, p in evals.items() if p and os.path.exists(p)}
    stats = {m: model_stats(v) for m, v in rs.items()}
    # NAME+VARIANT rows (e.g. base+grammar: constrained decoding) go to the table and details, and
    # to summary.json under "variants", leaving its base/sft/grpo shape as documented
    summary: dict = {m: s["summary"] for m, s in stats.items() if "+" not in m}
    variants = {m: s["summary"] for m, s in stats.items() if "+" in m}
    if variants:
        summary["variants"] = variants
    diffs = {}
    pairs = [(n, a, b) for n, a, b in (("sft_vs_base", "base", "sft"), ("grpo_vs_sft", "sft", "grpo"))
             if a in rs and b in rs]
    for n, a, b in pairs:
        diffs[n] = summary[n] = paired_diff(rs[a], rs[b])
    # the same differences within each kind of task (action signature; LOGIGEN kind)
    by_kind_diffs: dict = {}
    for key in ("signature", "kind"):
        for n, a, b in pairs:
            for k in sorted({r.get(key) or "" for r in rs[a] + rs[b]}):
                by_kind_diffs.setdefault(key, {}).setdefault(k, {})[n] = paired_diff(
                    [r for r in rs[a] if (r.get(key) or "") == k], [r for r in rs[b] if (r.get(key) or "") == k])
    training = {}
    for name, d in (curve_runs or {}).items():
        t = training_curve(d) if name != "sft" else None
        if t is not None:
            training[name] = t
    if "grpo" in training:
        summary["grpo_training"] = {k: v for k, v in training["grpo"].items() if not k.endswith("_per_step")}
    details = {m: s["detail"] for m, s in stats.items()}
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "details.json"), "w", encoding="utf-8") as f:
        json.dump({"models": details, "diffs": diffs, "diffs_by_kind": by_kind_diffs, "training": training}, f,
                  indent=1)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write(table(details, diffs, by_kind_diffs, training))
    if curve_runs:
        curves(curve_runs, os.path.join(out, "curves.png"))
    return summary


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        if not v:
            raise SystemExit(f"expected NAME=PATH, got {it!r}")
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolkit.train.learn")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="split tasks (stdin) into train / held-out by target and entities")
    sp.add_argument("--heldout", type=float, default=0.3)
    sp.add_argument("--seed", type=int, default=7)
    sp.add_argument("--max-heldout", type=int, default=None)
    sp.add_argument("--no-stratify", dest="stratify", action="store_false",
                    help="do not mix the held-out set's action signatures (fewest new keys only)")
    sp.add_argument("--train", required=True)
    sp.add_argument("--heldout-out", required=True)
    xp = sub.add_parser("exclude", help="tasks (stdin) sharing no key (target, entity) with the tasks of FILES")
    xp.add_argument("files", nargs="+")
    pp = sub.add_parser("principals", help="domain records (stdin) with env.state = the base state with its "
                                           "principals replaced by K clones (toolkit.train.principals)")
    pp.add_argument("-k", type=int, default=40)
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--keep-original", action="store_true", help="add the clones instead of replacing")
    rp = sub.add_parser("report", help="table + summary.json from verified held-out rollouts")
    rp.add_argument("--out", required=True)
    rp.add_argument("--curves", nargs="*", default=[])
    rp.add_argument("evals", nargs="+", help="MODEL=verified.jsonl")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        tasks = _read(None)
        train, held, dropped = split(tasks, a.heldout, a.seed, a.max_heldout, a.stratify)
        _write(a.train, train)
        _write(a.heldout_out, held)
        info = {"tasks": len(tasks), "train": len(train), "heldout": len(held), "dropped_shared_keys": len(dropped),
                "heldout_signatures": _sig_counts(held), "train_signatures": _sig_counts(train)}
        print(json.dumps(info), file=sys.stderr)
        print(json.dumps(info))
        return 0 if train and held else 1
    if a.cmd == "exclude":
        tasks = _read(None)
        kept, dropped = exclude(tasks, [t for p in a.files for t in _read(p)])
        _write_stdout(kept)
        print(json.dumps({"tasks": len(tasks), "kept": len(kept), "dropped_shared_keys": len(dropped),
                          "signatures": _sig_counts(kept)}), file=sys.stderr)
        return 0 if kept else 1
    if a.cmd == "principals":
        for rec in _read(None):
            state, info = add_principals(rec.get("env") or {}, a.k, a.seed, a.keep_original)
            rec = {**rec, "env": {**(rec.get("env") or {}), "state": state}}
            print(json.dumps({"id": rec.get("id"), **{k: v for k, v in info.items() if k != "principals"},
                              "principals": len(info["principals"]), "examples": info["principals"][:5]}),
                  file=sys.stderr)
            _write_stdout([rec])
        return 0
    summary = report(_pairs(a.evals), a.out, _pairs(a.curves) if a.curves else None)
    with open(os.path.join(a.out, "table.md"), encoding="utf-8") as f:
        sys.stderr.write(f.read())
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
