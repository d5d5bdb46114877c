"""The orchestration layer's Judge (EigenData §4.1): multi-axis scores and structured critiques of
every artifact of a pilot batch, which reflect hands to the Prompt Engineer.

The paper's axes, each in [0, 1] (None when the artifact gives nothing to measure):
  executability        "whether the task is solvable given the available tools and environment
                       state": the task validators' verdicts (task_mechanics, task_feasibility /
                       task_quality: every call of the feasibility probe really ran)
  tool_correctness     "schema compliance, argument validity, and call ordering": the share of the
                       trajectories' tool calls the environment accepted (no UNKNOWN_TOOL /
                       INVALID_ARGUMENTS / other error), times the judge's function_correctness
                       rating when there is one
  trajectory_coherence "turn-level consistency and goal progression": the TrajectoryValidation
                       ratings of conversation_quality and intent_alignment (Good 1, Acceptable
                       0.5, Poor 0) and goal_progress; else how the dialogue ended (user_stop 1,
                       max_turns / max_errors / error 0, others 0.5)
  difficulty_coverage  "novelty, compositionality, and long-tail edge cases": compositionality =
                       distinct functions the task needs / 3 (capped at 1; the paper's tasks need
                       "2+ sequential function calls"), novelty = 1 / how many artifacts of the
                       batch use the same function set; their mean

Every score is computed from the artifact itself and the verdicts the worker validators (LLM
judges whose prompts are the paper's) already gave: the Judge adds no LLM request of its own (a
toolkit choice, docs/eigendata.md). `judge_batch` returns per-artifact scores with critique lines,
the batch means and the axes whose mean is below its target (JUDGE_TARGETS, toolkit defaults: the
paper gives none) — the signal that lets a set with no failures still evolve (§4.3: the Prompt
Engineer revises prompts from the Judge's "critiques and multi-axis scores", including "adjusting
style controls to improve realism").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

AXES = ("executability", "tool_correctness", "trajectory_coherence", "difficulty_coverage")
JUDGE_TARGETS = {"executability": 0.8, "tool_correctness": 0.9, "trajectory_coherence": 0.6,
                 "difficulty_coverage": 0.4}
RATING = {"Good": 1.0, "Acceptable": 0.5, "Poor": 0.0}
GOAL = {"Complete": 1.0, "Partial": 0.5, "None": 0.0}
ENDING = {"user_stop": 1.0, "replay_done": 1.0, "agent_stop": 0.5, "transfer": 0.5, "out_of_scope": 0.5,
          "max_turns": 0.0, "max_errors": 0.0, "error": 0.0, "context_length": 0.0}
COMPOSITIONAL_TARGET = 3


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _functions(record: Any) -> list[str]:
    """Functions the artifact's task needs: its trajectories' agent calls, else the expected actions."""
    names = [s.name for t in record.trajectories for s in t.steps if s.side != "user" and s.name]
    if not names and record.task is not None and record.task.ground_truth is not None:
        names = [a.name for a in record.task.ground_truth.actions]
        names += list(record.task.ground_truth.must_have_functions)
    return sorted(set(names))


def executability(record: Any) -> tuple[float | None, list[str]]:
    vs = [v for v in record.verdicts if v.stage == "validate-task"]
    if not vs:
        return None, []
    bad = [v for v in vs if not v.passed]
    crit = [f"executability: {v.name} failed: " + "; ".join(v.reasons)[:200] for v in bad]
    return (0.0 if bad else 1.0), crit


def tool_correctness(record: Any) -> tuple[float | None, list[str]]:
    steps = [s for t in record.trajectories for s in t.steps if s.side != "user"]
    ratings = [v.scores.get("ratings", {}).get("function_correctness") for v in record.verdicts
               if v.stage == "verify" and isinstance(v.scores.get("ratings"), dict)]
    ratings = [RATING[r] for r in ratings if r in RATING]
    if not steps and not ratings:
        return None, []
    parts, crit = [], []
    if steps:
        ok = sum(1 for s in steps if s.ok)
        parts.append(ok / len(steps))
        codes = Counter(s.error_code or "error" for s in steps if not s.ok)
        if codes:
            crit.append(f"tool_correctness: {len(steps) - ok} of {len(steps)} calls refused ("
                        + ", ".join(f"{k} x{n}" for k, n in codes.most_common()) + ")")
    if ratings:
        parts.append(min(ratings))
        if min(ratings) < 1:
            crit.append("tool_correctness: the trajectory judge rated function_correctness below Good")
    score = 1.0
    for p in parts:
        score *= p
    return score, crit


def coherence(record: Any) -> tuple[float | None, list[str]]:
    vals, crit = [], []
    for v in record.verdicts:
        if v.stage != "verify":
            continue
        r = v.scores.get("ratings")
        if isinstance(r, dict):
            for d in ("conversation_quality", "intent_alignment"):
                if r.get(d) in RATING:
                    vals.append(RATING[r[d]])
                    if r[d] == "Poor":
                        crit.append(f"trajectory_coherence: {d} rated Poor")
        gp = v.scores.get("goal_progress")
        if isinstance(gp, str) and gp.capitalize() in GOAL:
            vals.append(GOAL[gp.capitalize()])
    if not vals:
        for t in record.trajectories:
            if t.termination in ENDING:
                vals.append(ENDING[t.termination])
                if ENDING[t.termination] == 0.0:
                    crit.append(f"trajectory_coherence: dialogue {t.id} ended with {t.termination}")
    return _mean(vals), crit


def judge_batch(records: Iterable[Any], targets: dict | None = None, max_artifacts: int = 50) -> dict:
    """{"axes", "means", "targets", "low": [axes below target], "artifacts": [{id, scores, critiques}]}"""
    recs = list(records)
    t = dict(JUDGE_TARGETS, **(targets or {}))
    fsets = {r.id: tuple(_functions(r)) for r in recs}
    same = Counter(fsets.values())
    arts = []
    for r in recs:
        scores: dict[str, float | None] = {}
        crit: list[str] = []
        for axis, fn in (("executability", executability), ("tool_correctness", tool_correctness),
                         ("trajectory_coherence", coherence)):
            s, c = fn(r)
            scores[axis] = s
            crit += c
        fs = fsets[r.id]
        if fs:
            comp = min(1.0, len(fs) / COMPOSITIONAL_TARGET)
            novelty = 1.0 / same[fs]
            scores["difficulty_coverage"] = (comp + novelty) / 2
            if comp < 1:
                crit.append(f"difficulty_coverage: needs {len(fs)} distinct function(s) ({', '.join(fs)})")
            if same[fs] > 1:
                crit.append(f"difficulty_coverage: {same[fs]} artifacts of the batch use the same functions")
        else:
            scores["difficulty_coverage"] = None
        arts.append({"id": r.id, "scores": scores, "critiques": crit})
    means = {a: _mean([x["scores"][a] for x in arts if x["scores"][a] is not None]) for a in AXES}
    low = [a for a in AXES if means[a] is not None and means[a] < t[a]]
    means = {a: _r(v) for a, v in means.items()}
    for x in arts:
        x["scores"] = {a: _r(v) for a, v in x["scores"].items()}
    return {"axes": list(AXES), "means": means, "targets": t, "low": low, "artifacts": arts[:max_artifacts],
            "n_artifacts": len(arts)}


def low_categories(judge: dict) -> list[str]:
    """Judge findings as reflect categories (`judge_low_<axis>`), so the Prompt Engineer's changes
    can address them like failure categories. Executability is left out: a non-executable task is
    a validate-task failure whose own categories (missing_resource ...) are already there."""
    return [f"judge_low_{a}" for a in judge.get("low") or [] if a != "executability"]
