"""`toolkit stats --quality`: how deep and varied a task set is (any flow; tasks or trajectories).

Per dataset (one JSONL file of records) and in total:
- tasks; archetype and difficulty distributions; writes per archetype and per difficulty;
- writes / actions / turns per task (mean, p50, max), share of tasks with >= 3 writes;
- share with a read-dependent write (task.complexity.read_dependent when the generator or
  validate computed it; else: a write argument value that appears in an earlier action's
  arguments of a read tool's result is unknown offline, so the metric is reported as None);
- violation-first and boundary tasks, boundary tasks with a verified N-1 seed
  (complexity.boundary.seeded.n_minus_1), rules covered by each (complexity.violation.rule,
  complexity.boundary.rule);
- tool coverage (distinct tools called in the reference actions or trajectories) and the
  distinct action-signature ratio (distinct sequences of tool names / tasks);
- n-gram diversity of the user text (distinct bigrams / bigrams over instruction and
  user_scenario, and distinct trigrams), and the share of near-duplicate user texts;
- leak rate: records whose `projection` verdict failed or whose user text names a column of
  their sqlite domain (a non-key snake_case column, a multi-word column name with spaces, "a
  <plural table>", or a column followed by one of its enum values: `column_mentions`);
- yield per stage: records passing each stage's verdicts (validate-task, verify, ...).

Writes are counted from task.complexity.writes when present (a replayed count of state
changes), else as reference actions whose tool name does not look like a read
(query_/get_/list_/search_/find_/check_/lookup) and that expect no error.

`flat_metrics` gives the scalar metrics a CI gate compares with `--baseline` (`toolkit stats`'s
`--max-drop METRIC=X`); `chart` writes a PNG (matplotlib, the `plot` extra).
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections import Counter, defaultdict
from typing import Any

from toolkit.scoring.rewards import looks_like_read
from toolkit.stats import Dataset
from toolkit.envs import load_env
from toolkit.envs.sqlite.vocab import domain_words

LOWER_IS_BETTER = ("leak_rate", "near_duplicate_share")


def _dist(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    return {"n": len(s), "mean": round(statistics.fmean(s), 3), "p50": s[len(s) // 2], "max": s[-1]}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def user_text(rec: dict) -> str:
    task = rec.get("task") or {}
    us = task.get("user_scenario") or {}
    parts = [task.get("instruction")] + [us.get(k) for k in ("persona", "reason_for_call", "known_info",
                                                             "unknown_info", "instructions")]
    return "\n".join(str(p) for p in parts if p)


def _actions(rec: dict) -> list[dict]:
    gt = ((rec.get("task") or {}).get("ground_truth") or {})
    acts = gt.get("actions") or []
    if acts:
        return [a for a in acts if isinstance(a, dict)]
    out = []
    for t in rec.get("trajectories") or []:
        for m in t.get("messages") or []:
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                out.append({"name": fn.get("name") or tc.get("name"), "arguments": fn.get("arguments")})
        break
    return out


_COLS: dict[str, Any] = {}


def domain_columns(env: Any) -> dict | None:
    """{"snake": non-key snake_case column names, "enums": {column: values}, "named": the
    domain's banned-words patterns (a multi-word column name with underscores or spaces, "a
    <plural table>": `toolkit.envs.sqlite.vocab`)} of a record's sqlite domain (None for other
    backends or a domain that does not load); cached per domain."""
    if not isinstance(env, dict) or env.get("backend") != "sqlite":
        return None
    ref = str(env.get("path") or env.get("id") or "")
    if ref in _COLS:
        return _COLS[ref]
    out = None
    try:

        e = load_env({k: v for k, v in env.items() if k in ("backend", "id", "path")})
        try:
            snake, enums = set(), {}
            for t in e.domain.tables.values():
                fks = {f.get("column") for f in t.fks}
                for c in t.columns:
                    if c.pk or c.name in fks:
                        continue  # keys (primary and foreign) are identities, not columns to hide
                    if "_" in c.name:
                        snake.add(c.name)
                    if c.enum:
                        enums[c.name] = [str(v) for v in c.enum]
            out = {"snake": sorted(snake), "enums": enums, "named": domain_words(e.domain).patterns()}
        finally:
            e.close()
    except Exception:  # noqa: BLE001 - quality stats never fail on a domain that moved
        out = None
    _COLS[ref] = out
    return out


def column_mentions(text: str, cols: dict | None) -> list[str]:
    """Columns the user text names: a non-key snake_case column, a multi-word column name with
    spaces ("due day") or "a <plural table>" ("a new loans"), or a column (or its words) followed
    by one of its enum values ("status cancelled", "tier: gold")."""
    if not cols:
        return []
    found = [c for c in cols["snake"] if re.search(r"(?<![\w-])" + re.escape(c) + r"(?![\w-])", text)]
    for pat in cols.get("named") or []:
        found += [m.group(0) for m in re.finditer(pat, text) if m.group(0) not in found]
    for c, vals in cols["enums"].items():
        names = sorted({c, c.replace("_", " ")}, key=len, reverse=True)
        vs = sorted({v for v in vals} | {v.replace("_", " ") for v in vals}, key=len, reverse=True)
        pat = (r"(?i)\b(?:" + "|".join(map(re.escape, names)) + r")\b\W{0,3}(?:(?:is|to|of|=|as|set to)\W{1,3})?(?:"
               + "|".join(map(re.escape, vs)) + r")\b")
        m = re.search(pat, text)
        if m:
            found.append(m.group(0))
    return found


def _turns(rec: dict) -> list[int]:
    return [sum(1 for m in t.get("messages") or [] if m.get("role") == "assistant")
            for t in rec.get("trajectories") or []]


class _Acc:
    def __init__(self) -> None:
        self.n = 0
        self.arch: Counter = Counter()
        self.diff: Counter = Counter()
        self.writes: list[int] = []
        self.writes_by_arch: dict[str, list[int]] = defaultdict(list)
        self.writes_by_diff: dict[str, list[int]] = defaultdict(list)
        self.actions: list[int] = []
        self.turns: list[int] = []
        self.read_dep: list[bool] = []
        self.viol = 0
        self.bound = 0
        self.bound_n1 = 0
        self.viol_rules: set = set()
        self.bound_rules: set = set()
        self.tools: set = set()
        self.sigs: Counter = Counter()
        self.bigrams: Counter = Counter()
        self.trigrams: Counter = Counter()
        self.texts: Counter = Counter()
        self.leaks = 0
        self.stage: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def add(self, rec: dict) -> None:
        self.n += 1
        task = rec.get("task") or {}
        cx = task.get("complexity") or {}
        arch = str(cx.get("archetype") or "none")
        diff = str(task.get("difficulty") or cx.get("level") or "none")
        self.arch[arch] += 1
        self.diff[diff] += 1
        acts = _actions(rec)
        names = [str(a.get("name")) for a in acts]
        if isinstance(cx.get("writes"), int) and "read_dependent" in cx:
            w = cx["writes"]
        else:
            w = sum(1 for a in acts if not a.get("expect_error") and not looks_like_read(str(a.get("name"))))
        self.writes.append(w)
        self.writes_by_arch[arch].append(w)
        self.writes_by_diff[diff].append(w)
        self.actions.append(len(acts))
        self.turns += _turns(rec)
        if "read_dependent" in cx:
            self.read_dep.append(bool(cx.get("read_dependent")))
        if any(a.get("expect_error") for a in acts) or cx.get("violation_first"):
            self.viol += 1
            r = (cx.get("violation") or {}).get("rule")
            if r:
                self.viol_rules.add(r)
        b = cx.get("boundary")
        if isinstance(b, dict):
            self.bound += 1
            if b.get("rule"):
                self.bound_rules.add(b["rule"])
            if (b.get("seeded") or {}).get("n_minus_1"):
                self.bound_n1 += 1
        self.tools |= set(names)
        self.sigs[tuple(names)] += 1
        text = user_text(rec)
        ws = _words(text)
        self.bigrams.update(itertools.pairwise(ws))
        self.trigrams.update(zip(ws, ws[1:], ws[2:]))
        self.texts[" ".join(ws)] += 1
        failed_proj = any(v.get("name") == "projection" and not v.get("passed") for v in rec.get("verdicts") or [])
        if failed_proj or column_mentions(text, domain_columns(rec.get("env"))):
            self.leaks += 1
        by_stage: dict[str, bool] = {}
        for v in rec.get("verdicts") or []:
            s = str(v.get("stage"))
            by_stage[s] = by_stage.get(s, True) and bool(v.get("passed"))
        for s, ok in by_stage.items():
            st = self.stage[s]
            st[0] += int(ok)
            st[1] += 1

    def result(self) -> dict:
        n = self.n or 1
        bi, tri = sum(self.bigrams.values()), sum(self.trigrams.values())
        return {
            "tasks": self.n,
            "archetypes": dict(self.arch.most_common()),
            "difficulty": dict(sorted(self.diff.items())),
            "writes": _dist(self.writes),
            "writes_by_archetype": {k: _dist(v) for k, v in sorted(self.writes_by_arch.items())},
            "writes_by_difficulty": {k: _dist(v) for k, v in sorted(self.writes_by_diff.items())},
            "share_writes_ge3": round(sum(w >= 3 for w in self.writes) / n, 4),
            "actions": _dist(self.actions),
            "turns": _dist(self.turns),
            "read_dependent_share": round(sum(self.read_dep) / len(self.read_dep), 4) if self.read_dep else None,
            "violation_first": self.viol, "boundary": self.bound,
            "boundary_n_minus_1_share": round(self.bound_n1 / self.bound, 4) if self.bound else None,
            "violation_rules": sorted(self.viol_rules), "boundary_rules": sorted(self.bound_rules),
            "tools_used": len(self.tools),
            "signature_ratio": round(len(self.sigs) / n, 4),
            "distinct_2": round(len(self.bigrams) / bi, 4) if bi else None,
            "distinct_3": round(len(self.trigrams) / tri, 4) if tri else None,
            "near_duplicate_share": round(sum(c - 1 for c in self.texts.values()) / n, 4),
            "leak_rate": round(self.leaks / n, 4),
            "yield_by_stage": {s: round(ok / tot, 4) for s, (ok, tot) in sorted(self.stage.items()) if tot},
        }


def compute(inputs: list[str]) -> dict:
    """Quality of the record files `inputs` (none: stdin), read through the streaming commands'
    reader (`toolkit.stats.Dataset`): bad lines are rejected on stderr and counted in `bad_lines`."""
    inputs = inputs or ["-"]
    total = _Acc()
    datasets = {}
    bad = 0
    for path in inputs:
        acc = _Acc()
        ds = Dataset(path, command="stats --quality")
        for _n, raw, _rec in ds:
            obj = json.loads(raw)  # a valid record's line: the dict view the metrics read
            acc.add(obj)
            total.add(obj)
        bad += ds.bad_lines
        datasets[ds.name] = acc.result()
    tot = total.result()
    out = {"quality": True, "datasets": datasets, "total": tot, "bad_lines": bad}
    out["metrics"] = flat_metrics(tot)
    return out


def flat_metrics(q: dict) -> dict[str, float]:
    out: dict[str, float] = {"tasks": q["tasks"], "share_writes_ge3": q["share_writes_ge3"],
                             "signature_ratio": q["signature_ratio"], "leak_rate": q["leak_rate"],
                             "near_duplicate_share": q["near_duplicate_share"], "tools_used": q["tools_used"],
                             "violation_rules": len(q["violation_rules"]), "boundary_rules": len(q["boundary_rules"])}
    for k in ("read_dependent_share", "distinct_2", "distinct_3", "boundary_n_minus_1_share"):
        if q.get(k) is not None:
            out[k] = q[k]
    for k in ("writes", "actions", "turns"):
        if q[k].get("n"):
            out[f"{k}_mean"] = q[k]["mean"]
    for s, v in q["yield_by_stage"].items():
        out[f"yield/{s}"] = v
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    if isinstance(v, list):
        return str(len(v))
    return str(v)


def markdown(q: dict) -> str:
    names = list(q["datasets"]) + (["total"] if len(q["datasets"]) > 1 else [])
    cols = [(n, q["datasets"].get(n) or q["total"]) for n in names]
    rows = [("tasks", "tasks"), ("archetypes", "archetypes"), ("difficulty", "difficulty"),
            ("writes mean", lambda d: d["writes"].get("mean")), ("writes max", lambda d: d["writes"].get("max")),
            ("share >= 3 writes", "share_writes_ge3"), ("actions mean", lambda d: d["actions"].get("mean")),
            ("turns mean", lambda d: d["turns"].get("mean")), ("read-dependent share", "read_dependent_share"),
            ("violation-first", "violation_first"), ("boundary", "boundary"),
            ("boundary at N-1", "boundary_n_minus_1_share"), ("rules violated", "violation_rules"),
            ("rules at a boundary", "boundary_rules"), ("tools used", "tools_used"),
            ("signature ratio", "signature_ratio"), ("distinct-2", "distinct_2"), ("distinct-3", "distinct_3"),
            ("near duplicates", "near_duplicate_share"), ("leak rate", "leak_rate"),
            ("yield by stage", "yield_by_stage")]
    lines = ["| quality | " + " | ".join(n for n, _ in cols) + " |", "|---|" + "---|" * len(cols)]
    for label, key in rows:
        f = key if callable(key) else (lambda d, k=key: d.get(k))
        lines.append(f"| {label} | " + " | ".join(_fmt(f(d)) for _, d in cols) + " |")
    return "\n".join(lines) + "\n"


def chart(q: dict, path: str) -> bool:
    """PNG: writes per task by archetype, difficulty mix, and the key ratios per dataset."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ds = q["datasets"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    archs = sorted({a for d in ds.values() for a in d["writes_by_archetype"]})
    width = 0.8 / max(len(ds), 1)
    for j, (name, d) in enumerate(ds.items()):
        axes[0].bar([i + j * width for i in range(len(archs))],
                    [(d["writes_by_archetype"].get(a) or {}).get("mean", 0) for a in archs], width=width,
                    label=name[-30:])
    axes[0].set_xticks([i + 0.4 - width / 2 for i in range(len(archs))], archs, rotation=20)
    axes[0].set_title("writes per task by archetype (mean)")
    axes[0].legend(fontsize=7)
    levels = sorted({lv for d in ds.values() for lv in d["difficulty"]})
    for j, (name, d) in enumerate(ds.items()):
        axes[1].bar([i + j * width for i in range(len(levels))],
                    [d["difficulty"].get(lv, 0) / max(d["tasks"], 1) for lv in levels], width=width, label=name[-30:])
    axes[1].set_xticks([i + 0.4 - width / 2 for i in range(len(levels))], levels)
    axes[1].set_title("difficulty mix (share of tasks)")
    keys = ["share_writes_ge3", "read_dependent_share", "signature_ratio", "distinct_2", "leak_rate"]
    for j, (name, d) in enumerate(ds.items()):
        axes[2].bar([i + j * width for i in range(len(keys))], [d.get(k) or 0 for k in keys], width=width,
                    label=name[-30:])
    axes[2].set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], keys, rotation=20, fontsize=8)
    axes[2].set_ylim(0, 1)
    axes[2].set_title("ratios")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
