"""The commands over the engines: one module per command's logic (`build(opts, meter)` returns the
command's StageParts, toolkit.stages.base; `main(opts)` for commands that are not record streams)
and a stage object (`FnStage`: toolkit.io.Stage's process / finish / close / counts) that
`RecordStream.run_stage` and `toolkit.pipeline.Pipeline` run. The engines live below:
toolkit.episodes (rollout's episodes) and toolkit.scorers (verify's scoring).

This package module stays light: flows import `toolkit.stages.registry` at start-up."""

from __future__ import annotations


def make_meter():
    """The shared LLM usage meter for one command run."""
    from toolkit.llm import Meter

    return Meter()
