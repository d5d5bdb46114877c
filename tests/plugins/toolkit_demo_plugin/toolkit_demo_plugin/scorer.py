"""verify --strategy demo-scorer: the counter's value after the agent's successful add calls equals
the sum the reference actions add (score = reached / expected, capped at 1)."""

from __future__ import annotations

from toolkit.scorers import Outcome, Scoring, scorer


@scorer("demo-scorer", verdict_kind="rule", help="demo plugin: the adds sum to the target")
def score(s: Scoring) -> Outcome:
    gt = s.record.task.ground_truth if s.record.task else None
    expected = sum(int(a.arguments.get("n", 0)) for a in (gt.actions if gt else []))
    reached = sum(int((c.args or {}).get("n", 0)) for c in s.calls
                  if c.name == "add" and c.ok is not False and '"error"' not in (c.result or ""))
    ok = reached == expected
    return Outcome(passed=ok, score=min(1.0, reached / expected) if expected else 1.0,
                   scores={"expected": expected, "reached": reached},
                   reasons=[] if ok else [f"counter reached {reached}, expected {expected}"])
