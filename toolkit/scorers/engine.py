"""The scoring engine: every requested scorer on every trajectory of a record, then the verdicts,
component scores and reward written on the record (`apply`). Used by `verify` (which adds
`--filter`), GRPO's reward and the trainer integrations alike."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

from toolkit import registry
from toolkit.io import StageError, add_provenance
from toolkit.llm import get_client, llm_config
from toolkit.options import VerifyOptions
from toolkit.schema import Record, Trajectory, Verdict
from toolkit.scorers.calls import trajectory_calls
from toolkit.scorers.core import Outcome, Plan, Scoring, _jsonable, verify_options
from toolkit.scorers.replay import EnvContext, TargetCache


def apply(record: Record, traj: Trajectory, outcomes: dict[str, Outcome], plan: Plan) -> bool:
    """Write verdicts, scores and reward of one trajectory; returns whether it passes."""
    run = [s for s in plan.strategies if s in outcomes]
    record.verdicts = [v for v in record.verdicts
                       if not (v.stage == "verify" and v.trajectory_id == traj.id and v.name in run)]
    for s in run:
        o = outcomes[s]
        sc = _jsonable(o.scores)
        record.verdicts.append(Verdict(stage="verify", kind=plan.verdict_kinds.get(s) or "rule", name=s,
                                       passed=o.passed, score=o.score, scores=sc, reasons=o.reasons,
                                       attribution=o.attribution, trajectory_id=traj.id))
        traj.scores[s] = dict(sc)  # (nested lists are shared with the verdict; both are only serialized)
    primary = plan.required[0] if plan.required else plan.strategies[0]
    traj.reward = outcomes[primary].score
    passed = all(outcomes[s].passed for s in plan.required)
    traj.scores["verify"] = {"passed": passed, "required": list(plan.required), "reward_from": primary}
    return passed


class Verifier:
    """Scores records with the strategies of the typed `VerifyOptions` (a mapping of its keys for
    library callers). `await verifier.score(record)` writes every trajectory's verdicts, scores
    and reward and the verify provenance, and returns whether all trajectories pass.

    `counts` (verified trajectories, passed: for --min-pass-rate) and `cache` (targets and replay
    memo of the run) live for the verifier's lifetime."""

    def __init__(self, opts: VerifyOptions | Mapping | None, meter: Any):
        self.opts = verify_options(opts)
        self.plan = Plan.of(self.opts)
        self.meter = meter
        self.cache = TargetCache()
        self.counts = {"trajectories": 0, "passed": 0}
        self.scorers = {s: registry.get("scorers", s) for s in self.plan.strategies}
        self._clients: dict[str, Any] = {}
        self._models: dict[str, str] = {}
        self.llm_roles = [e.meta["llm_role"] for e in self.scorers.values() if e.meta.get("llm_role")]
        for role in self.llm_roles:
            self.llm(role)

    def llm(self, role: str) -> Any:
        """The run's LLM client for `role` (judge ...), built once."""
        if role not in self._clients:
            lcfg = llm_config(self.opts, role=role)
            self._models[role] = lcfg.model or "embedded"
            self._clients[role] = get_client(lcfg, self.meter)
        return self._clients[role]

    async def _outcomes(self, record: Record, ctx: EnvContext) -> tuple[list[dict[str, Outcome]], dict]:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
        per: list[dict[str, Outcome]] = []
        pending: list[tuple[int, str, Any]] = []
        for ti, traj in enumerate(record.trajectories):
            sc = Scoring(record, traj, trajectory_calls(traj), ctx, self.opts, self.plan, self.llm)
            out: dict[str, Outcome] = {}
            for s in self.plan.strategies:
                try:
                    res = self.scorers[s].obj(sc)
                except BaseException:
                    for p in pending:  # never awaited: close them quietly
                        getattr(p[2], "close", lambda: None)()
                    raise
                if inspect.isawaitable(res):
                    pending.append((ti, s, res))
                else:
                    out[s] = res
            per.append(out)
        if pending:
            results = await asyncio.gather(*(p[2] for p in pending), return_exceptions=True)
            first_exc = None
            for (ti, s, _), res in zip(pending, results):
                if isinstance(res, BaseException):
                    first_exc = first_exc or res
                    continue
                per[ti][s] = res
            if first_exc is not None:
                if isinstance(first_exc, StageError):
                    raise first_exc
                raise StageError(f"{type(first_exc).__name__}: {first_exc}") from None
        for out in per:
            for o in out.values():
                for k in usage:
                    usage[k] += (o.usage or {}).get(k, 0)
        return per, usage

    async def score(self, record: Record) -> bool:
        """Score every trajectory of `record` in place; True when all of them pass."""
        if not record.trajectories:
            raise StageError("record has no trajectories to verify (run rollout first)", field="trajectories")
        ctx = EnvContext(record, self.opts, self.cache)
        try:
            per, usage = await self._outcomes(record, ctx)
        finally:
            ctx.close()
        all_pass = True
        for traj, out in zip(record.trajectories, per):
            ok = apply(record, traj, out, self.plan)
            self.counts["trajectories"] += 1
            self.counts["passed"] += ok
            all_pass = ok and all_pass
        add_provenance(record, "verify", strategy=",".join(self.plan.strategies),
                       model=self._models.get(self.llm_roles[0]) if self.llm_roles else None,
                       recipe_hash=self.opts.recipe_hash, usage=usage)
        return all_pass
