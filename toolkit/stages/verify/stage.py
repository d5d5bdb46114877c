"""The verify stage: `build` (the per-record function), `apply` (verdicts, scores and reward of one
trajectory) and the `Verify` stage object."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from toolkit import registry
from toolkit.io import StageError, add_provenance
from toolkit.options import VerifyOptions
from toolkit.schema import Record, Trajectory, Verdict
from toolkit.stages import FnStage
from toolkit.stages.verify.calls import trajectory_calls
from toolkit.stages.verify.core import Options, Outcome, Scoring, _jsonable
from toolkit.stages.verify.replay import EnvContext, TargetCache


def _verdict_kind(name: str) -> str:
    return registry.get("scorers", name).meta.get("verdict_kind") or "rule"


def apply(record: Record, traj: Trajectory, outcomes: dict[str, Outcome], opts: Options) -> bool:
    """Write verdicts, scores and reward of one trajectory; returns whether it passes."""
    run = [s for s in opts.strategies if s in outcomes]
    record.verdicts = [v for v in record.verdicts
                       if not (v.stage == "verify" and v.trajectory_id == traj.id and v.name in run)]
    for s in run:
        o = outcomes[s]
        sc = _jsonable(o.scores)
        record.verdicts.append(Verdict(stage="verify", kind=opts.verdict_kinds.get(s) or _verdict_kind(s), name=s,
                                       passed=o.passed, score=o.score, scores=sc, reasons=o.reasons, attribution=o.attribution,
                                       trajectory_id=traj.id))
        traj.scores[s] = dict(sc)  # (nested lists are shared with the verdict; both are only serialized)
    primary = opts.required[0] if opts.required else opts.strategies[0]
    traj.reward = outcomes[primary].score
    passed = all(outcomes[s].passed for s in opts.required)
    traj.scores["verify"] = {"passed": passed, "required": list(opts.required), "reward_from": primary}
    return passed


def build(cfg: dict | VerifyOptions, meter: Any):
    """The per-record verify function from the typed options (or a merged config dict)."""
    opts = Options.from_config(cfg)
    if not isinstance(cfg, dict):
        cfg = cfg.cfg()  # role-prefixed LLM keys (judge_model ...) for llm_config
    cache = TargetCache()
    counts = {"trajectories": 0, "passed": 0}  # verified trajectories, for --min-pass-rate
    scorers = {s: registry.get("scorers", s) for s in opts.strategies}
    opts.verdict_kinds = {s: e.meta.get("verdict_kind") or "rule" for s, e in scorers.items()}
    clients: dict[str, Any] = {}
    llm_models: dict[str, str] = {}

    def llm(role: str) -> Any:
        if role not in clients:
            from toolkit.llm import llm_config
            from toolkit.llm import get_client

            lcfg = llm_config(cfg, role=role)
            llm_models[role] = lcfg.model or "embedded"
            clients[role] = get_client(lcfg, meter)
        return clients[role]

    llm_roles = [e.meta["llm_role"] for e in scorers.values() if e.meta.get("llm_role")]
    for role in llm_roles:
        llm(role)

    async def fn(record: Record) -> Record | None:
        if not record.trajectories:
            raise StageError("record has no trajectories to verify (run rollout first)", field="trajectories")
        ctx = EnvContext(record, opts, cache)
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
        try:
            per: list[dict[str, Outcome]] = []
            pending: list[tuple[int, str, Any]] = []
            for ti, traj in enumerate(record.trajectories):
                sc = Scoring(record, traj, trajectory_calls(traj), ctx, opts, cfg, llm)
                out: dict[str, Outcome] = {}
                for s in opts.strategies:
                    try:
                        res = scorers[s].obj(sc)
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
        finally:
            ctx.close()
        all_pass = True
        for traj, out in zip(record.trajectories, per):
            ok = apply(record, traj, out, opts)
            counts["trajectories"] += 1
            counts["passed"] += ok
            all_pass = ok and all_pass
        add_provenance(record, "verify", strategy=",".join(opts.strategies),
                       model=llm_models.get(llm_roles[0]) if llm_roles else None,
                       recipe_hash=opts.recipe_hash, usage=usage)
        if opts.filter == "passed" and not all_pass:
            from toolkit.io import note_drop

            for v in record.verdicts:
                if v.stage == "verify" and not v.passed:
                    note_drop(f"verify {v.name}: failed")
                    break
            return None
        if opts.filter == "failed" and all_pass:
            return None
        return record

    fn.cache = cache  # type: ignore[attr-defined]
    fn.counts = counts  # type: ignore[attr-defined]
    fn.options = opts  # type: ignore[attr-defined]
    return fn


class Verify(FnStage):
    """verify as a stage object: `Verify(VerifyOptions(...))`; counts = {trajectories, passed}."""

    command = "verify"

    def build(self) -> Any:
        return build(self.opts, self.meter)
