"""One module per command's logic: `build(cfg, meter)` returns the per-record function the IO layer
runs (or `main(cfg)` for commands that are not record streams)."""


def make_meter():
    """The shared LLM usage meter for one command run."""
    from toolkit.llm import Meter

    return Meter()
