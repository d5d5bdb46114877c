"""toolkit.aio.run: asyncio.run's result and exceptions, without the repr of the result that
asyncio.run pays when it restores the SIGINT handler (a list of records: a full repr of each)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from toolkit import aio


class Loud:
    """A result whose repr is counted."""

    calls = 0

    def __repr__(self) -> str:
        Loud.calls += 1
        return "Loud()"


async def make() -> Loud:
    await asyncio.sleep(0)
    return Loud()


def test_result_is_returned_and_never_formatted():
    Loud.calls = 0
    out = aio.run(make())
    assert isinstance(out, Loud) and Loud.calls == 0
    # the control: plain asyncio.run in the main thread formats it (CPython 3.11: twice)
    assert threading.current_thread() is threading.main_thread()
    asyncio.run(make())
    if Loud.calls == 0:
        pytest.skip("this Python's asyncio.run does not format the result: nothing to avoid")
    assert Loud.calls > 0


def test_exceptions_and_none_pass_through():
    async def boom() -> None:
        raise KeyError("x")

    async def nothing() -> None:
        return None

    with pytest.raises(KeyError, match="x"):
        aio.run(boom())
    assert aio.run(nothing()) is None


def test_a_running_loop_is_refused_like_asyncio_run():
    async def outer() -> None:
        coro = make()
        try:
            with pytest.raises(RuntimeError):
                aio.run(coro)
        finally:
            coro.close()

    asyncio.run(outer())
