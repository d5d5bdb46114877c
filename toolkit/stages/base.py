"""The stage protocol of the commands (toolkit.io.Stage: process / finish / close / counts) and the
one `--filter`.

A command's `build(opts, meter)` returns `StageParts`: the per-record function and, beside it, what
the stage needs at the end (a batch `finish`, a `close`, live `counts`, the engine object as
`state`) — never attributes hung on a closure. `FnStage` is the stage object over them that
`RecordStream.run_stage` and `toolkit.pipeline.Pipeline` run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit.io import note_drop
from toolkit.options import Filter, model_for
from toolkit.schema import Record
from toolkit.stages import make_meter


@dataclass
class StageParts:
    """What a command's build returns. Calling it calls `process` (`await parts(record)` for an
    async stage), so library callers use it as the per-record function.

    process  record -> record | [records] | None (sync or async); raise StageError to reject
    sync     its plain-function twin when the stage is synchronous (RecordStream's synchronous path:
             no asyncio task per record), else None
    finish   () -> records made from the whole input (batch stages: reflect), or None
    close    () -> awaitable | None: release clients (called once, after finish), or None
    counts   stage-specific totals for the summary (verify: trajectories, passed), kept up to date
    state    the engine object behind it (verify: its Verifier; rollout: its EpisodeRunner)
    """

    process: Callable[[Record], Any]
    sync: Callable[[Record], Any] | None = None
    finish: Callable[[], Any] | None = None
    close: Callable[[], Any] | None = None
    counts: dict = field(default_factory=dict)
    state: Any = None

    def __call__(self, record: Record) -> Any:
        return self.process(record)

    @classmethod
    def of(cls, built: Any) -> "StageParts":
        """A build result as StageParts (a bare per-record function has no other parts)."""
        return built if isinstance(built, StageParts) else cls(process=built)


def keep(command: str, filt: Filter, passed: bool | None, failing: str | None = None) -> bool:
    """`--filter` (one implementation for every command): `all` keeps everything; `passed` keeps a
    record whose verdicts of this command pass; `failed` keeps one whose verdicts fail. passed:
    the record's outcome (None: it has no verdict of this command); failing: the name of its first
    failing verdict. A record not kept is counted as a drop with the reason."""
    if filt == "all":
        return True
    kept = bool(passed) if filt == "passed" else passed is False
    if not kept:
        note_drop(f"{command} {failing}: failed" if failing else f"{command}: no verdict" if passed is None
                  else f"{command}: passed (--filter failed)")
    return kept


class FnStage:
    """A toolkit.io.Stage over a command's StageParts, built from typed options.

    `Verify(VerifyOptions(strategy=["state_diff"]))`, `Verify(strategy=["state_diff"])` (keyword
    arguments are options), or `Verify(opts, filter="passed")` (a copy of opts with changes)."""

    command: str = ""

    def __init__(self, opts: Any = None, /, meter: Any = None, **changes: Any):
        model = self.options_model() if opts is None or changes else self.model_for(opts)
        if opts is None:
            opts = model.model_validate(changes)
        else:
            if not isinstance(opts, model):
                opts = model.model_validate(opts.model_dump() if hasattr(opts, "model_dump") else dict(opts))
            if changes:
                opts = model.model_validate({**opts.model_dump(exclude_unset=True), **changes})
        self.opts = opts
        self.meter = meter if meter is not None else make_meter()
        self._parts: StageParts | None = None

    @classmethod
    def options_model(cls) -> type:
        return model_for(cls.command)

    def model_for(self, opts: Any) -> type:
        """The model `opts` is validated against (StrategyStage may keep the CLI's narrower one)."""
        return self.options_model()

    def build(self) -> StageParts:  # pragma: no cover - subclasses
        raise NotImplementedError

    @property
    def parts(self) -> StageParts:
        if self._parts is None:
            self._parts = StageParts.of(self.build())
        return self._parts

    @property
    def process(self) -> Any:
        """The per-record function itself (sync or async), so runners can tell which: the plain
        twin when the stage has one."""
        return self.parts.sync or self.parts.process

    @property
    def finish(self) -> Any:
        """The batch step (reflect), or None: not a batch stage."""
        return self.parts.finish

    def close(self) -> Any:
        closer = self._parts.close if self._parts is not None else None
        return closer() if closer is not None else None

    @property
    def counts(self) -> dict:
        return dict(self._parts.counts) if self._parts is not None else {}
