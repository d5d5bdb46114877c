"""One module per command's logic: `build(opts, meter)` returns the per-record function the IO layer
runs (or `main(cfg)` for commands that are not record streams), and a stage object (`FnStage`:
toolkit.io.Stage's process / finish / close / counts) that `RecordStream.run_stage` and
`toolkit.pipeline.Pipeline` run."""

from __future__ import annotations

from typing import Any


def make_meter():
    """The shared LLM usage meter for one command run."""
    from toolkit.llm import Meter

    return Meter()


class FnStage:
    """A toolkit.io.Stage over a command's per-record function, built from typed options.

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
        self._fn: Any = None

    @classmethod
    def options_model(cls) -> type:
        from toolkit.options import model_for

        return model_for(cls.command)

    def model_for(self, opts: Any) -> type:
        """The model `opts` is validated against (StrategyStage may keep the CLI's narrower one)."""
        return self.options_model()

    def build(self) -> Any:  # pragma: no cover - subclasses
        raise NotImplementedError

    @property
    def fn(self) -> Any:
        if self._fn is None:
            self._fn = self.build()
        return self._fn

    @property
    def process(self) -> Any:
        """The built per-record function itself (sync or async), so runners can tell which."""
        return self.fn

    @property
    def finish(self) -> Any:
        """The built function's batch step (reflect), or None: not a batch stage."""
        return getattr(self.fn, "finish", None)

    def close(self) -> Any:
        closer = getattr(self._fn, "aclose", None) if self._fn is not None else None
        return closer() if closer is not None else None

    @property
    def counts(self) -> dict:
        return dict(getattr(self._fn, "counts", None) or {})
