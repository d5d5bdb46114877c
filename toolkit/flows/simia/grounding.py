"""Grounding check (beyond the Simia paper): replay a simulated trajectory's tool calls in the real
environment and compare each simulated observation with the real one. `verify --strategy grounding`.

Simia states its data is "bounded by the synthesizer's semantic correctness" and checks nothing
after the rules; where the tools exist in a real environment (bundled sqlite domains, τ² domains,
python environments) this measures how much of a trajectory's simulated world is the real one.

Environment: `record.env` rebuilt with `load_env` (reset to `env.state` when given); a record on
the `simulated` backend names its real counterpart in `env.config.grounding_env` (an env ref), else
it is rejected (field `env`). Calls are replayed in execution order (`verify.trajectory_calls`:
steps, else answered assistant calls), each against the real state the earlier *real* results
left, so one hallucinated id costs the calls that depend on it, not the whole trajectory.

Match (recipe key `grounding_match`):
- `exact` (default): a real error matches a simulated error (a JSON object with an "error" key, or
  text starting with "error"), whatever the wording; a real success matches when both are equal as
  canonical JSON (key order, 1 vs 1.0, surrounding whitespace ignored) or, for text, equal up to
  whitespace;
- `subset`: as exact, but a simulated JSON object matches when every key it states has the real
  value (recursively; lists must be equal) — for synthesizers that abbreviate outputs.

Verdict: `kind=rule, name=grounding, score = share = matched / total` (1.0 with a note when there is
no call), `scores={"share", "matched", "total", "mismatches": [{"i", "name", "why"}...] (first 20)}`,
passed when share >= `grounding_threshold` (default 1.0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolkit.envs import backend_capabilities
from toolkit.io import StageError
from toolkit.scorers import Outcome, Scoring, scorer, trajectory_calls

from toolkit.envs import load_env
from toolkit.options import VerifyOptions

MATCH_MODES = ("exact", "subset")


def _canon(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        f = float(v)
        return int(f) if f.is_integer() else f
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    return str(v)


def _as_json(x: Any) -> tuple[bool, Any]:
    if not isinstance(x, str):
        return True, x
    s = x.strip()
    if s[:1] in "{[\"" or s in ("true", "false", "null") or s[:1].isdigit() or s[:1] == "-":
        try:
            return True, json.loads(s)
        except ValueError:
            pass
    return False, s


def _is_error(text: str | None) -> bool:
    if text is None:
        return False
    ok, v = _as_json(text)
    if ok and isinstance(v, dict) and "error" in v:
        return True
    return isinstance(text, str) and text.strip().lower().startswith("error")


def _subset(sim: Any, real: Any) -> bool:
    if isinstance(sim, dict) and isinstance(real, dict):
        return all(k in real and _subset(v, real[k]) for k, v in sim.items())
    return sim == real


def observation_matches(simulated: str | None, real_ok: bool, real_content: Any, mode: str = "exact") -> tuple[bool, str]:
    """(match, why) for one simulated observation vs the real tool result."""
    if simulated is None:
        return False, "no simulated observation"
    sim_err = _is_error(simulated)
    if not real_ok:
        return (True, "both errors") if sim_err else (False, "the real call failed, the simulation says it succeeded")
    if sim_err:
        return False, "the simulation says the call failed, the real call succeeded"
    sj, sv = _as_json(simulated)
    rj, rv = _as_json(real_content)
    if sj and rj:
        a, b = _canon(sv), _canon(rv)
        if a == b or (mode == "subset" and _subset(a, b)):
            return True, "equal"
        return False, "different result"
    if not sj and not rj:
        return (" ".join(str(sv).split()) == " ".join(str(rv).split())), "text"
    return False, "different result (JSON vs text)"


def real_env_ref(record: Any) -> Any:
    env = record.env
    if env is None:
        raise StageError("grounding needs record.env (a real environment to replay the calls in)", field="env")
    if backend_capabilities(env.backend).simulated:
        real = (env.config or {}).get("grounding_env")
        if not real:
            raise StageError("env backend 'simulated' has no real counterpart: set env.config.grounding_env to the "
                             "real environment's ref to check grounding", field="env.config.grounding_env")
        return real
    return env


def ground(record: Any, traj: Any, mode: str = "exact") -> dict:
    """Replay `traj`'s calls in the record's real environment; {"share", "matched", "total", "mismatches"}."""
    if mode not in MATCH_MODES:
        raise StageError(f"grounding_match must be one of {', '.join(MATCH_MODES)} (got {mode!r})")
    ref = real_env_ref(record)
    try:
        env = load_env(ref)
    except Exception as e:
        raise StageError(f"grounding: cannot build the real environment: {type(e).__name__}: {e}", field="env") from None
    try:
        state = ref.get("state") if isinstance(ref, dict) else getattr(ref, "state", None)
        env.reset(state or None)
        calls = trajectory_calls(traj)
        matched, mismatches = 0, []
        for i, c in enumerate(calls):
            if c.args is None:
                mismatches.append({"i": i, "name": c.name, "why": "arguments cannot be read"})
                continue
            res = env.call(c.name, dict(c.args), side=c.side)
            ok, why = observation_matches(c.result, res.ok, res.content if res.ok else None, mode)
            if ok:
                matched += 1
            else:
                mismatches.append({"i": i, "name": c.name, "why": why})
    finally:
        try:
            env.close()
        except Exception:  # pragma: no cover
            pass
    total = len(calls)
    return {"share": (matched / total) if total else 1.0, "matched": matched, "total": total,
            "mismatches": mismatches[:20]}


@scorer("grounding", verdict_kind="rule",
        help="Simia: replay the calls in the real env, share of simulated observations that match")
def score_grounding(s: Scoring) -> Outcome:
    return run_grounding(s.record, s.traj, s.opts)


def run_grounding(record: Any, traj: Any, opts: VerifyOptions | Mapping[str, Any]):
    """verify's strategy entry: an Outcome for one trajectory (opts: verify's typed options, or a
    mapping of their keys from a library caller, converted once here)."""
    o = VerifyOptions.of(opts)
    thr = o.grounding_threshold
    g = ground(record, traj, o.grounding_match)
    reasons = [f"call {m['i']} ({m['name']}): {m['why']}" for m in g["mismatches"]]
    if not g["total"]:
        reasons.append("no tool calls to ground")
    return Outcome(passed=g["share"] >= thr, score=g["share"], scores=g, reasons=reasons)
