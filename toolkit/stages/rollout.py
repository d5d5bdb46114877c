"""rollout: agent x user simulator x environment episodes, `n` per record.

The command over the episode engine (toolkit.episodes: agents, user simulators, prompts, the
episode loop, distractors): typed `RolloutOptions` → `EpisodeRunner` → the record stream. This
module adds what makes it a command: the input checks, an environment that cannot be built as a
reject (not n empty trajectories), and the provenance with the summed usage.
"""

from __future__ import annotations

from typing import Any

from toolkit.episodes.runner import ENV_FAIL, EpisodeRunner
from toolkit.io import StageError, add_provenance
from toolkit.options import RolloutOptions
from toolkit.schema import Record, Usage
from toolkit.stages.base import FnStage, StageParts


def build(opts: RolloutOptions | dict, meter: Any) -> StageParts:
    """The per-record rollout function from the typed options (or, for library callers, a mapping
    of the same keys)."""
    runner = EpisodeRunner(opts, meter)
    kind = runner.kind

    async def fn(record: Record) -> Record:
        if record.env is None:
            raise StageError("record has no env: rollout needs an environment reference", field="env")
        if kind == "replay" and not (record.task and record.task.ground_truth):
            raise StageError("--agent replay needs task.ground_truth (actions may be empty for refusal tasks)",
                             field="task.ground_truth")
        trajs = await runner.episodes(record)
        if trajs and all(t.termination == "error" and (t.error or "").startswith(ENV_FAIL) for t in trajs):
            # an environment that cannot be built is a reject (exit 1), not n empty trajectories
            where = "env.path" if getattr(record.env, "path", None) else "env"
            hint = (" (a relative env.path is resolved against the --input file's directory, then the "
                    "current directory)") if where == "env.path" else ""
            raise StageError(trajs[0].error + hint, field=where)
        record.trajectories.extend(trajs)
        total = Usage()
        for t in trajs:
            for f_ in ("prompt_tokens", "completion_tokens", "requests", "cache_hits"):
                setattr(total, f_, getattr(total, f_) + getattr(t.usage, f_))
            total.cost += t.usage.cost
        add_provenance(record, "rollout", strategy=kind,
                       model=None if kind == "replay" else runner.agent_name(),
                       recipe_hash=runner.opts.recipe_hash, usage=total.model_dump())
        return record

    return StageParts(process=fn, state=runner)


class Rollout(FnStage):
    """rollout as a stage object: `Rollout(RolloutOptions(agent_kind="replay", n=2))`."""

    command = "rollout"

    def build(self) -> StageParts:
        return build(self.opts, self.meter)
