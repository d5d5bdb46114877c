"""The python environment's tool source for a BFCL entry (sandbox_src.py + one stub per tool)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def _base() -> str:
    return Path(__file__).with_name("sandbox_src.py").read_text(encoding="utf-8")


def env_source(names: list[str]) -> str:
    stubs = [f"\n\ndef {n}(state, **kwargs):\n    return _bfcl_run(state, {n!r}, kwargs)\n"
             for n in names if n.isidentifier() and not n.startswith("_")]
    return _base() + "".join(stubs)
