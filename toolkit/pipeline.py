"""Chain stages in one process from Python — the in-process twin of a shell pipe of commands.

    from toolkit.pipeline import Pipeline, GenTask, ValidateTask, Rollout, Verify

    out = Pipeline([GenTask(strategy="logigen", n=2), ValidateTask(strategy="logigen"),
                    Rollout(agent_kind="replay"), Verify(strategy=["state_diff"])]).run(records)

Each stage is a toolkit.io.Stage built from its command's typed options (toolkit.options). The
chain runs stage by stage like the pipe does (every record through stage 1 in input order, then
what stage 1's finish() returns, then stage 2 ...), with the same per-record semantics as
`RecordStream`: a list fans out, None drops, an exception rejects that record (counted per stage,
logged to stderr) and the run goes on. The records equal what `cmd1 | cmd2 | ...` writes (the
provenance times aside); nothing is serialized between stages.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable

from toolkit import aio
from toolkit.io import Stage, StageError, log
from toolkit.schema import Record
from toolkit.stages.rollout import Rollout
from toolkit.stages.simulate_env import SimulateEnv
from toolkit.stages.strategies import GenPlan, GenTask, MakeVerifier, Reflect, Repair, ValidateTask
from toolkit.stages.verify import Verify

__all__ = ["Pipeline", "StageReport", "GenPlan", "GenTask", "ValidateTask", "Rollout", "Verify", "Repair",
           "Reflect", "MakeVerifier", "SimulateEnv"]


@dataclass
class StageReport:
    """Per-stage totals of one Pipeline run (the CLI's summary line, in-process)."""

    name: str
    read: int = 0
    written: int = 0
    dropped: int = 0
    rejected: int = 0
    reject_reasons: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)


async def _maybe(v: Any) -> Any:
    return (await v) if inspect.isawaitable(v) else v


class Pipeline:
    def __init__(self, stages: list[Stage], concurrency: int = 8):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages = list(stages)
        self.concurrency = max(1, int(concurrency))
        self.reports: list[StageReport] = []

    def run(self, records: Iterable[Record | dict]) -> list[Record]:
        """Run every stage over the records; the last stage's output."""
        return aio.run(self.arun(records))

    async def arun(self, records: Iterable[Record | dict]) -> list[Record]:
        recs = [r if isinstance(r, Record) else Record.model_validate(r) for r in records]
        self.reports = [StageReport(getattr(s, "command", type(s).__name__)) for s in self.stages]
        try:
            for stage, rep in zip(self.stages, self.reports):
                recs = await self._one(stage, rep, recs)
        finally:
            for stage in self.stages:
                await _maybe(stage.close())
        return recs

    async def _one(self, stage: Stage, rep: StageReport, records: list[Record]) -> list[Record]:
        proc = stage.process
        sem = asyncio.Semaphore(self.concurrency)

        async def call(rec: Record) -> Any:
            if inspect.iscoroutinefunction(proc):
                async with sem:
                    return await proc(rec)
            return await _maybe(proc(rec))

        out: list[Record] = []
        window = self.concurrency * 2
        for start in range(0, len(records), window):  # input order kept, like RecordStream
            chunk = records[start:start + window]
            if inspect.iscoroutinefunction(proc):
                results = await asyncio.gather(*(call(r) for r in chunk), return_exceptions=True)
            else:  # synchronous stages run strictly in order
                results = []
                for r in chunk:
                    try:
                        results.append(await call(r))
                    except Exception as e:  # noqa: BLE001 - a record's failure is a reject
                        results.append(e)
            for rec, res in zip(chunk, results):
                rep.read += 1
                if isinstance(res, BaseException):
                    if not isinstance(res, Exception):
                        raise res
                    msg = str(res) if isinstance(res, StageError) else f"{type(res).__name__}: {res}"
                    rep.rejected += 1
                    rep.reject_reasons.append(f"{rec.id}: {msg}")
                    log(f"{rep.name}: rejected (id {rec.id}): {msg}")
                    continue
                if res is None:
                    rep.dropped += 1
                    continue
                for r in (res if isinstance(res, list) else [res]):
                    out.append(r)
        fin = getattr(stage, "finish", None)
        if fin is not None:
            out.extend(await _maybe(fin()) or [])
        rep.written = len(out)
        rep.counts = dict(getattr(stage, "counts", None) or {})
        return out
