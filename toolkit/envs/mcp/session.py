"""One live MCP server session driven from synchronous code.

`McpSession` owns a background thread with its own asyncio loop; the official `mcp` SDK client
(`stdio_client` / `streamable_http_client` + `ClientSession`) runs inside one task there, so its
cancel scopes are entered and left in the same task. `call()` / `list_tools()` block the caller;
`acall()` awaits from another loop. The process started is the confining launcher
(`toolkit.sandbox.commands`), whose pid is the process group; `close()` SIGKILLs that group, which
takes the launcher's pid namespace (the server and everything it started) with it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import signal
import threading
import weakref
from pathlib import Path
from typing import Any

_LIVE: "weakref.WeakSet[McpSession]" = weakref.WeakSet()


@atexit.register
def _kill_all() -> None:
    """At interpreter exit: no server outlives the toolkit process."""
    for s in list(_LIVE):
        s._kill_group()


class McpUnavailable(RuntimeError):
    """The server could not be started or initialized."""


def _dump(model: Any) -> dict:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class McpSession:
    def __init__(self, entry: Any, cwd: str, env: dict[str, str], errlog: str, status_file: str | None,
                 argv: list[str]) -> None:
        """argv: the whole command line (the launcher's, `ConfinedCommands.argv`) for a stdio entry."""
        self.entry = entry
        self.cwd = cwd
        self.env = env
        self.errlog_path = errlog
        self.status_file = status_file
        self.argv = argv
        self.pid: int | None = None
        self.server_info: dict = {}
        self.instructions: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{entry.id}", daemon=True)
        self._queue: asyncio.Queue | None = None
        self._main: concurrent.futures.Future | None = None
        self._closed = False
        self.status: dict = {}

    # -- lifecycle
    def start(self) -> list[dict]:
        """Start the server, initialize, list its tools (every page); returns the raw tools."""
        self._thread.start()
        _LIVE.add(self)
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            return ready.result(timeout=self.entry.startup_seconds)
        except concurrent.futures.TimeoutError:
            self.close()
            raise McpUnavailable(f"mcp server {self.entry.id!r} did not answer initialize + tools/list within "
                                 f"{self.entry.startup_seconds:g}s{self._stderr_tail()}") from None
        except McpUnavailable:
            self.close()
            raise
        except BaseException as e:
            self.close()
            raise McpUnavailable(f"mcp server {self.entry.id!r} failed to start: {_exc_text(e)}"
                                 f"{self._stderr_tail()}") from None

    def _stderr_tail(self) -> str:
        try:
            tail = Path(self.errlog_path).read_text(encoding="utf-8", errors="replace")[-600:].strip()
        except OSError:
            return ""
        return f"; its stderr: {tail}" if tail else ""

    async def _serve(self, ready: concurrent.futures.Future) -> None:
        from mcp import ClientSession

        self._queue = asyncio.Queue()
        try:
            with open(self.errlog_path, "a", encoding="utf-8") as errlog:
                async with self._transport(errlog) as streams:
                    read, write = streams[0], streams[1]
                    async with ClientSession(read, write) as s:
                        init = await s.initialize()
                        d = _dump(init)
                        self.server_info = d.get("serverInfo") or {}
                        self.instructions = d.get("instructions")
                        tools: list[dict] = []
                        cursor = None
                        for _ in range(1000):
                            from mcp import types

                            res = await s.list_tools(params=types.PaginatedRequestParams(cursor=cursor)
                                                     if cursor else None)
                            tools += [_dump(t) for t in res.tools]
                            cursor = getattr(res, "next_cursor", None)
                            if not cursor:
                                break
                        self._read_status()
                        ready.set_result(tools)
                        while True:
                            item = await self._queue.get()
                            if item is None:
                                break
                            name, args, fut, timeout = item
                            try:
                                r = await asyncio.wait_for(s.call_tool(name, args), timeout)
                                fut.set_result(_dump(r))
                            except BaseException as e:  # handed to the caller
                                if not fut.done():
                                    fut.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
                                if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt)):
                                    raise
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            else:
                self._fail_pending(e)
            if not isinstance(e, Exception):
                raise

    def _read_status(self) -> None:
        """The launcher's status file: the server's pid (= its process group) and its isolation."""
        self.status = {}
        if not self.status_file:
            return
        try:
            self.status = json.loads(Path(self.status_file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(self.status.get("pgid"), int) and self.status.get("pgid") == self.status.get("pid"):
            self.pid = self.status["pid"]

    def _fail_pending(self, e: BaseException) -> None:
        q = self._queue
        while q is not None and not q.empty():
            item = q.get_nowait()
            if item is not None and not item[2].done():
                item[2].set_exception(McpUnavailable(f"mcp server session ended: {_exc_text(e)}"))

    def _transport(self, errlog: Any):
        e = self.entry
        if e.url:
            from mcp.client.streamable_http import streamable_http_client

            if e.headers:
                from mcp.shared._httpx_utils import create_mcp_http_client

                return streamable_http_client(e.url, http_client=create_mcp_http_client(headers=dict(e.headers)))
            return streamable_http_client(e.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=self.argv[0], args=list(self.argv[1:]), env=self.env, cwd=self.cwd)
        return stdio_client(params, errlog=errlog)

    # -- calls
    def call(self, name: str, args: dict, timeout: float) -> dict:
        fut = self._submit(name, args, timeout)
        return fut.result(timeout=timeout + 5)

    async def acall(self, name: str, args: dict, timeout: float) -> dict:
        return await asyncio.wait_for(asyncio.wrap_future(self._submit(name, args, timeout)), timeout + 5)

    def _submit(self, name: str, args: dict, timeout: float) -> concurrent.futures.Future:
        if self._closed or self._main is None or self._main.done():
            raise McpUnavailable(f"mcp server {self.entry.id!r} is not running{self._stderr_tail()}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (name, args, fut, timeout))
        return fut

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # the episode is over and its state lives in the workdir: no grace period for the server
        # (the SDK would close stdin and wait up to 2 s), then the session unwinds at once
        self._kill_group()
        if self._thread.is_alive():
            if self._queue is not None:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
            if self._main is not None:
                try:
                    self._main.result(timeout=10)
                except BaseException:  # noqa: BLE001 - the session is going away either way
                    self._main.cancel()
        self._kill_group()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def _kill_group(self) -> None:
        """SIGKILL the launcher's process group (started in a new session: pgid = pid); the pid
        namespace under it dies with it."""
        if self.pid is None:
            self._read_status()
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _exc_text(e: BaseException) -> str:
    if hasattr(e, "exceptions") and isinstance(e.exceptions, (list, tuple)):  # an exception group
        return "; ".join(_exc_text(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"
