"""`toolkit stats`: dataset statistics for CI data-regression checks.

Reads record JSONL files (one dataset each; `-` or none: stdin; `.gz` allowed) through the reader
every streaming command uses (`toolkit.io.RecordStream.read`: the same validation, the same
rejects, a cut .gz keeps the records before the cut), and optional `--rejects` files (through
`toolkit.io.read_json_lines`). A bad line is counted (`bad_lines`, `bad_line_reasons`), named on
stderr with its file and line number (and written to `--write-rejects FILE`), never a traceback;
the run then exits 1. Reports per dataset and in total:

- counts: records, trajectories, records per flow;
- pass rates: per verdict (stage/strategy, e.g. `verify/state_diff`), per flow, and overall
  (`pass_rate`: trajectories whose `scores.verify.passed` is true — else whose verify verdicts all
  pass — over the trajectories that were verified);
- reward distribution (n, mean, min, p50, p90, max, share at 1.0, 10-bin histogram on [0, 1]);
- turns (assistant messages per trajectory), tool calls and tool errors (steps with ok=false, or
  tool messages that are a structured {"error": ...}), terminations;
- tokens and cost: trajectory usage plus provenance entries (prompt/completion tokens, cost);
- rejects by reason (`--rejects FILE`, the files commands write with --rejects): per command and
  field, and the most frequent messages.

Outputs: JSON on stdout; a markdown table on stderr (or `--markdown FILE`); a PNG with `--chart FILE`
(needs matplotlib, in the dev extra; without it a warning is printed and the rest still works).

Regression gate: `--baseline FILE` (a JSON written by an earlier `toolkit stats`) with
`--max-drop METRIC=X` (repeatable): exit 1 when `baseline[METRIC] - current[METRIC] > X` for the
total's flat metrics (see `flat_metrics`); an equal run exits 0. A metric absent from both is a
usage error (exit 2); absent from the current run only counts as a drop to 0.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from toolkit.io import IOOptions, RecordStream, Summary, UsageError, log, read_json_lines
from toolkit.schema import Record, Trajectory, Verdict

LOWER_IS_BETTER = ("tool_error_rate", "reject_count", "cost", "tokens", "bad_lines")


class StatsError(ValueError):
    """A usage problem (unreadable file, bad --max-drop); exit 2."""


class Dataset:
    """One input file's records through the streaming commands' reader (`RecordStream.read`):
    iterate for (line number, raw line, Record); bad lines are rejected as every command rejects
    them (stderr naming the file and line, `rejects_out`), and counted in `summary`."""

    def __init__(self, path: str, rejects_out: str | None = None, command: str = "stats"):
        self.path = path
        std = path in ("-", "")
        self.name = "stdin" if std else path
        opts = IOOptions(input=None if std else path, rejects=rejects_out, progress=False, heartbeat=0)
        self._stream = RecordStream(opts, command)
        self._stream.source = self.name
        self.summary: Summary = self._stream.summary

    def __iter__(self) -> Iterator[tuple[int, bytes, Record]]:
        try:
            yield from self._stream.read()
        except UsageError as e:  # a file that cannot be read at all (missing, not gzip ...)
            raise StatsError(str(e)) from None

    @property
    def bad_lines(self) -> int:
        return self.summary.rejected


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] if lo == hi else s[lo] + (s[hi] - s[lo]) * (k - lo)


def _dist(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": sum(values) / len(values), "min": min(values),
            "p50": _pct(values, 0.5), "p90": _pct(values, 0.9), "max": max(values)}


def _is_error_content(c: Any) -> bool:
    if not isinstance(c, str) or not c.lstrip().startswith("{"):
        return False
    try:
        obj = json.loads(c)
    except (ValueError, RecursionError):  # tool output is free text: any content is "not an error"
        return False
    return isinstance(obj, dict) and set(obj) == {"error"}


class _Acc:
    """Accumulates one dataset."""

    def __init__(self, name: str):
        self.name = name
        self.records = 0
        self.bad_lines = 0
        self.bad_reasons: Counter = Counter()  # the reader's reject reasons (field or message shape)
        self.trajectories = 0
        self.flows: Counter = Counter()
        self.verdicts: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [n, passed]
        self.flow_pass: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.verified = 0
        self.passed = 0
        self.rewards: list[float] = []
        self.turns: list[float] = []
        self.tool_calls = 0
        self.tool_errors = 0
        self.terminations: Counter = Counter()
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost = 0.0

    def add(self, rec: Record) -> None:
        """One record, validated by the reader (typed fields: nothing here can fail on its content)."""
        self.records += 1
        flow = str(rec.flow or "none")
        self.flows[flow] += 1
        verdicts = rec.verdicts
        for v in verdicts:
            key = f"{v.stage or '?'}/{v.name or v.kind or '?'}"
            self.verdicts[key][0] += 1
            self.verdicts[key][1] += bool(v.passed)
        for p in rec.provenance:
            self.prompt_tokens += p.prompt_tokens
            self.completion_tokens += p.completion_tokens
            self.cost += p.cost
        for t in rec.trajectories:
            self.trajectories += 1
            msgs = t.messages
            self.turns.append(sum(1 for m in msgs if m.role == "assistant"))
            if t.steps:
                self.tool_calls += len(t.steps)
                self.tool_errors += sum(1 for s in t.steps if s.ok is False)
            else:
                tool_msgs = [m for m in msgs if m.role == "tool"]
                self.tool_calls += len(tool_msgs)
                self.tool_errors += sum(1 for m in tool_msgs if _is_error_content(m.content))
            if t.termination:
                self.terminations[str(t.termination)] += 1
            r = t.reward
            if isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r):
                self.rewards.append(float(r))
            # trajectory usage is LLM work of the rollout (provenance may hold the same totals:
            # rollout adds its usage there too, so it is counted only when provenance has none)
            if not rec.provenance:
                self.prompt_tokens += t.usage.prompt_tokens
                self.completion_tokens += t.usage.completion_tokens
                self.cost += t.usage.cost
            ok = _trajectory_passed(t, verdicts)
            if ok is not None:
                self.verified += 1
                self.passed += ok
                self.flow_pass[flow][0] += 1
                self.flow_pass[flow][1] += ok

    def result(self) -> dict:
        hist = [0] * 10
        for r in self.rewards:
            hist[min(9, max(0, int(r * 10)))] += 1
        reward = _dist(self.rewards)
        if self.rewards:
            reward["share_1"] = sum(1 for r in self.rewards if r >= 1.0) / len(self.rewards)
            reward["histogram_0_1"] = hist
        return {
            "records": self.records, "bad_lines": self.bad_lines,
            "bad_line_reasons": dict(sorted(self.bad_reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "trajectories": self.trajectories,
            "flows": dict(sorted(self.flows.items())),
            "pass_rate": (self.passed / self.verified) if self.verified else None,
            "verified_trajectories": self.verified, "passed_trajectories": self.passed,
            "pass_rate_by_verdict": {k: {"n": n, "passed": p, "pass_rate": p / n}
                                     for k, (n, p) in sorted(self.verdicts.items())},
            "pass_rate_by_flow": {k: {"n": n, "passed": p, "pass_rate": p / n}
                                  for k, (n, p) in sorted(self.flow_pass.items())},
            "reward": reward,
            "turns": _dist(self.turns),
            "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
            "tool_error_rate": (self.tool_errors / self.tool_calls) if self.tool_calls else 0.0,
            "terminations": dict(sorted(self.terminations.items())),
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens,
                       "total": self.prompt_tokens + self.completion_tokens},
            "cost": round(self.cost, 6),
        }


def _trajectory_passed(t: Trajectory, verdicts: list[Verdict]) -> int | None:
    v = t.scores.get("verify")
    if isinstance(v, dict) and isinstance(v.get("passed"), bool):
        return int(v["passed"])
    mine = [x for x in verdicts if x.stage == "verify" and x.trajectory_id == t.id]
    if mine:
        return int(all(bool(x.passed) for x in mine))
    return None


_NUM = re.compile(r"\d+")


def rejects_summary(paths: Iterable[str]) -> dict:
    """Rejects files (what commands write with --rejects) by reason; a line that is not a reject
    (not a JSON object, or not JSON at all) is counted as "(unreadable reject line)" and in
    `unreadable`, and named on stderr with its line number."""
    by_reason: Counter = Counter()
    messages: Counter = Counter()
    total = unreadable = 0
    for p in paths:
        if p not in ("-", "") and not os.path.exists(p):
            continue  # a command writes its --rejects file only when it rejects something
        try:
            lines = list(read_json_lines(None if p in ("-", "") else p))
        except UsageError as e:
            raise StatsError(f"--rejects: {e}") from None
        for n, obj, err in lines:
            total += 1
            if not isinstance(obj, dict):
                by_reason["(unreadable reject line)"] += 1
                unreadable += 1
                log(f"stats: --rejects {p} line {n}: not a reject: "
                    + (err or f"a JSON {type(obj).__name__}, not an object"))
                continue
            by_reason[f"{obj.get('command') or '?'}:{obj.get('field') or '-'}"] += 1
            msg = _NUM.sub("N", str(obj.get("error") or ""))[:120]
            messages[msg] += 1
    return {"total": total, "unreadable": unreadable, "by_reason": dict(by_reason.most_common()),
            "top_messages": [{"message": m, "count": c} for m, c in messages.most_common(10)]}


def flat_metrics(ds: dict, rejects: dict | None = None) -> dict[str, float]:
    """The scalar metrics `--max-drop` can name."""
    out: dict[str, float] = {"records": ds["records"], "bad_lines": ds["bad_lines"], "trajectories": ds["trajectories"],
                             "tool_calls": ds["tool_calls"], "tool_error_rate": ds["tool_error_rate"],
                             "tokens": ds["tokens"]["total"], "cost": ds["cost"]}
    if ds["pass_rate"] is not None:
        out["pass_rate"] = ds["pass_rate"]
    rw = ds["reward"]
    if rw.get("n"):
        out["reward_mean"] = rw["mean"]
        out["reward_share_1"] = rw["share_1"]
    if ds["turns"].get("n"):
        out["turns_mean"] = ds["turns"]["mean"]
    for k, v in ds["pass_rate_by_verdict"].items():
        out[f"pass_rate/{k}"] = v["pass_rate"]
    for k, v in ds["pass_rate_by_flow"].items():
        out[f"pass_rate/flow/{k}"] = v["pass_rate"]
    if rejects is not None:
        out["reject_count"] = rejects["total"]
    return out


def compute(inputs: list[str], rejects: list[str] | None = None, rejects_out: str | None = None) -> dict:
    """Statistics of the record files `inputs` (none: stdin) and the rejects files `rejects`;
    bad lines of the inputs go to `rejects_out` (a rejects file, as every command writes). The
    result's `bad_lines` (total and per dataset) counts them: the CLI then exits 1."""
    inputs = inputs or ["-"]
    total = _Acc("total")
    datasets = {}
    for path in inputs:
        ds = Dataset(path, rejects_out)
        acc = _Acc(ds.name)
        for _n, _raw, rec in ds:
            acc.add(rec)
            total.add(rec)
        acc.bad_lines = ds.bad_lines
        acc.bad_reasons.update(ds.summary.reject_reasons)
        total.bad_lines += acc.bad_lines
        total.bad_reasons.update(ds.summary.reject_reasons)
        if acc.bad_lines:
            log(f"stats: {ds.name}: {acc.records} records read, {acc.bad_lines} bad line(s) rejected")
        datasets[ds.name] = acc.result()
    tot = total.result()
    rj = rejects_summary(rejects) if rejects else None
    out = {"datasets": datasets, "total": tot, "bad_lines": tot["bad_lines"] + (rj["unreadable"] if rj else 0)}
    if rj is not None:
        out["rejects"] = rj
    out["metrics"] = flat_metrics(tot, rj)
    return out


def parse_max_drop(items: Iterable[str]) -> dict[str, float]:
    out = {}
    for it in items:
        name, sep, val = str(it).partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = float(val)
        except ValueError:
            raise StatsError(f"--max-drop {it!r}: expected METRIC=X, e.g. pass_rate=0.05") from None
    return out


def check_regressions(current: dict, baseline: dict, limits: dict[str, float],
                      lower_is_better: tuple[str, ...] = LOWER_IS_BETTER) -> list[str]:
    """Messages for every metric that dropped by more than its limit (rose, for metrics where
    lower is better: tool_error_rate, reject_count, cost, tokens; with --quality: leak_rate,
    near_duplicate_share)."""
    LOWER_IS_BETTER = lower_is_better  # noqa: N806 - the module default, or the caller's list
    cur = current.get("metrics") or {}
    base = baseline.get("metrics") or {}
    bad = []
    for m, lim in limits.items():
        if m not in cur and m not in base:
            raise StatsError(f"--max-drop {m}: no such metric in this run or the baseline; "
                             f"metrics: {', '.join(sorted(cur))}")
        if m not in base:
            continue
        b = float(base[m])
        c = float(cur.get(m, 0.0))
        drop = (c - b) if m in LOWER_IS_BETTER else (b - c)
        if drop > lim + 1e-12:
            bad.append(f"{m}: {b:.6g} -> {c:.6g} ({'+' if m in LOWER_IS_BETTER else '-'}{drop:.6g}, "
                       f"limit {lim:g})")
    return bad


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def markdown(stats: dict) -> str:
    names = list(stats["datasets"]) + (["total"] if len(stats["datasets"]) > 1 else [])
    cols = [(n, stats["datasets"].get(n) or stats["total"]) for n in names]
    rows = [("records", lambda d: d["records"]), ("bad lines", lambda d: d["bad_lines"]),
            ("trajectories", lambda d: d["trajectories"]),
            ("pass rate", lambda d: d["pass_rate"]), ("reward mean", lambda d: d["reward"].get("mean")),
            ("reward = 1", lambda d: d["reward"].get("share_1")), ("turns mean", lambda d: d["turns"].get("mean")),
            ("tool calls", lambda d: d["tool_calls"]), ("tool error rate", lambda d: d["tool_error_rate"]),
            ("tokens", lambda d: d["tokens"]["total"]), ("cost", lambda d: d["cost"])]
    keys = sorted({k for _, d in cols for k in d["pass_rate_by_verdict"]})
    rows += [(f"pass {k}", lambda d, k=k: (d["pass_rate_by_verdict"].get(k) or {}).get("pass_rate"))
             for k in keys]
    terms = sorted({k for _, d in cols for k in d["terminations"]})
    rows += [(f"termination {k}", lambda d, k=k: d["terminations"].get(k, 0)) for k in terms]
    lines = ["| metric | " + " | ".join(n for n, _ in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for label, f in rows:
        lines.append(f"| {label} | " + " | ".join(_fmt(f(d)) for _, d in cols) + " |")
    rj = stats.get("rejects")
    if rj:
        lines += ["", "| rejects by reason | count |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in rj["by_reason"].items()]
    return "\n".join(lines) + "\n"


def chart(stats: dict, path: str) -> bool:
    """Write a PNG (reward histogram + pass rate per verdict); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tot = stats["total"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    hist = tot["reward"].get("histogram_0_1") or [0] * 10
    axes[0].bar([i / 10 + 0.05 for i in range(10)], hist, width=0.09)
    axes[0].set_title(f"reward (n={tot['reward'].get('n', 0)})")
    axes[0].set_xlabel("reward")
    pr = tot["pass_rate_by_verdict"]
    labels = list(pr) or ["(no verdicts)"]
    axes[1].barh(labels, [pr[k]["pass_rate"] for k in pr] or [0])
    axes[1].set_xlim(0, 1)
    axes[1].set_title(f"pass rate (overall {_fmt(tot['pass_rate'])})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
