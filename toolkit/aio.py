"""`run(coro)`: `asyncio.run` for the toolkit's synchronous entry points (the stream's stage loop,
`Pipeline.run`, the GRPO trainer's rollouts, the integrations' `score`, the simulated backend).

The result is handed out through a closure instead of being the main task's result. On exit,
`asyncio.run` puts the SIGINT handler back, and `signal.signal` turns the handler it replaces (a
partial holding the main task) into an enum member or, failing that, builds a ValueError message
from its repr that it then discards: the repr of the task, and so of its result (CPython 3.11; the
same code in later versions). For a list of records that is a full repr of each, ~0.1-1 s per call,
paid by every caller that runs a coroutine returning records (bench: the rule synthesis of 100 tasks
paid ~0.7 CPU-s of it)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro): its result and its exception, without asyncio formatting the result.
    Like asyncio.run, a RuntimeError inside a running event loop (`coro` is left to the caller)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("toolkit.aio.run() cannot be called from a running event loop")
    box: list = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]
