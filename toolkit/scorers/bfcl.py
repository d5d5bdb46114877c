"""`verify --strategy bfcl`: BFCL's multi-turn checker (bfcl-eval's own `multi_turn_checker`, run
in the sandbox: the state of every API instance after each turn equals the ground truth's, and
the ground truth's execution results appear among the model's) on records from
`toolkit tasks bfcl:<category>` (extra.bfcl; needs the optional extra `bfcl`)."""

from __future__ import annotations

from toolkit.bfcl.check import check
from toolkit.io import StageError
from toolkit.scorers.core import Outcome, Scoring, scorer


@scorer("bfcl", verdict_kind="rule",
        help="BFCL multi-turn: bfcl-eval's own checker (state after each turn + execution responses), sandboxed")
def score_bfcl(s: Scoring) -> Outcome:
    bfcl = (s.record.extra or {}).get("bfcl")
    if not isinstance(bfcl, dict) or "ground_truth" not in bfcl:
        raise StageError("the bfcl strategy needs extra.bfcl (records from `toolkit tasks bfcl:<category>`)",
                         field="extra.bfcl")
    env = s.record.env
    bfcl_state = ((env.state or {}).get("bfcl") or {}) if env is not None else {}
    msgs = [m.model_dump(mode="json", exclude_none=True) for m in s.traj.messages]
    r = check(msgs, bfcl, bfcl_state.get("initial_config") or {})
    ok = bool(r.get("valid"))
    reasons = [] if ok else [f"{r.get('error_type')}: {r.get('error_message')}"]
    for k in ("differences", "missing_items"):
        if r.get(k):
            reasons.append(f"{k}: {r[k]}"[:1500])
    return Outcome(passed=ok, score=1.0 if ok else 0.0,
                   scores={"valid": ok, "error_type": r.get("error_type")}, reasons=reasons)
