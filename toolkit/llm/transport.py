"""The HTTP side of the LLM client: a lean HTTP/1.1 keep-alive transport for plain-http endpoints
(`_H11Conn`, under the SDK's httpx client), one AsyncOpenAI + semaphore per (endpoint, event loop),
retry-after / error parsing and request-body encoding (`ToolSchemas` encoded once per process).
docs/performance.md has the measurements behind it."""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import threading
import time
import weakref
from typing import Any

from pydantic import BaseModel

from .base import LLMError


# ----------------------------------------------------------------------------------------------
# Plain-HTTP transport: HTTP/1.1 keep-alive over asyncio protocols
#
# httpx's default transport (httpcore over anyio) costs ~1.5 ms of CPU per request at hundreds
# of concurrent requests: every request queued or released makes the pool scan all of its
# connections, and each scan asks every idle connection whether its socket is readable
# (anyio typed-attribute lookups and a poll() per connection). Measured at 256 concurrent
# requests that was over half of the client's CPU, capping rollout throughput well below the
# server-bound rate. For plain-http endpoints (vLLM, llama.cpp, loopback test servers) the SDK's
# httpx client is therefore given this transport: one asyncio.Protocol per connection, a LIFO
# stack of idle keep-alive connections per host, one write per request and one wake-up per
# response. https endpoints (and proxied ones) keep httpx's default transport.


class _H11Conn(asyncio.Protocol):
    """One HTTP/1.1 connection; the reader waits until `need` bytes are buffered (or EOF)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.need = 0
        self.waiter: asyncio.Future | None = None
        self.paused = False
        self.drain_waiter: asyncio.Future | None = None
        self.idle_since = 0.0

    # asyncio callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        w = self.waiter
        if w is not None and len(self.buf) >= self.need and not w.done():
            w.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        d = self.drain_waiter
        if d is not None and not d.done():
            d.set_result(None)

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    # helpers for the transport
    @property
    def usable(self) -> bool:
        t = self.transport
        return not self.eof and t is not None and not t.is_closing() and not self.buf

    def close(self) -> None:
        self.eof = True
        if self.transport is not None:
            self.transport.close()

    async def wait(self, need: int, timeout: float | None) -> None:
        """Until at least `need` bytes are buffered or the peer closed."""
        if len(self.buf) >= need or self.eof:
            return
        loop = asyncio.get_running_loop()
        self.need = need
        w = self.waiter = loop.create_future()
        h = loop.call_later(timeout, _expire, w) if timeout is not None else None
        try:
            await w
        finally:
            self.waiter = None
            if h is not None:
                h.cancel()

    async def drain(self, timeout: float | None) -> None:
        if not self.paused or self.eof:
            return
        loop = asyncio.get_running_loop()
        d = self.drain_waiter = loop.create_future()
        h = loop.call_later(timeout, _expire, d) if timeout is not None else None
        try:
            await d
        finally:
            self.drain_waiter = None
            if h is not None:
                h.cancel()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class _StaleConnection(Exception):
    """A reused keep-alive connection closed before any response byte arrived."""


_HTTP: Any = None


def _http() -> Any:
    """The HTTP package the installed openai SDK is built on: `httpx` (openai 1.x/2.x) or its
    renamed fork `httpx2` (openai 3.x). Transports and response types must come from that one."""
    global _HTTP
    if _HTTP is None:
        import importlib

        import openai

        name = "httpx"
        for klass in openai.DefaultAsyncHttpxClient.__mro__[1:]:
            top = klass.__module__.split(".")[0]
            if top in ("httpx", "httpx2"):
                name = top
                break
        _HTTP = importlib.import_module(name)
    return _HTTP


def _sdk_major() -> int:
    import openai

    try:
        return int(str(openai.__version__).split(".")[0])
    except ValueError:  # pragma: no cover
        return 0


def _make_h11_transport_class():
    httpx = _http()

    class H11Transport(httpx.AsyncBaseTransport):
        KEEPALIVE_EXPIRY = 5.0  # seconds an idle connection is kept (httpx's default)

        def __init__(self, max_keepalive: int = 256) -> None:
            self.max_keepalive = max(1, int(max_keepalive))
            self._idle: dict[tuple, list[_H11Conn]] = {}
            self._all: "weakref.WeakSet[_H11Conn]" = weakref.WeakSet()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            url = request.url
            key = (url.host, url.port or 80)
            to = request.extensions.get("timeout") or {}
            body = await request.aread()
            head = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), url.raw_path)]
            for k, v in request.headers.raw:
                lk = k.lower()
                if lk != b"content-length" and lk != b"transfer-encoding":
                    head.append(k + b": " + v)
            if body or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
                head.append(b"Content-Length: %d" % len(body))
            data = b"\r\n".join(head) + b"\r\n\r\n" + body
            for attempt in range(2):
                conn = self._acquire(key)
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(request, key, to.get("connect"))
                try:
                    conn.transport.write(data)
                    if conn.paused:
                        try:
                            await conn.drain(to.get("write"))
                        except TimeoutError:
                            raise httpx.WriteTimeout("timed out writing the request", request=request) from None
                    status, reason, headers, content, keep = await self._read_response(
                        conn, request, to.get("read"), reused)
                except _StaleConnection:
                    conn.close()
                    if attempt == 0:
                        continue
                    raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                    request=request) from None
                except BaseException:
                    conn.close()
                    raise
                if keep:
                    self._release(key, conn)
                else:
                    conn.close()
                return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content),
                                      request=request,
                                      extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})
            raise AssertionError("unreachable")  # pragma: no cover

        def _acquire(self, key: tuple) -> _H11Conn | None:
            stack = self._idle.get(key)
            if not stack:
                return None
            now = time.monotonic()
            while stack:
                c = stack.pop()
                if c.usable and now - c.idle_since < self.KEEPALIVE_EXPIRY:
                    return c
                c.close()
            return None

        def _release(self, key: tuple, conn: _H11Conn) -> None:
            stack = self._idle.setdefault(key, [])
            if len(stack) >= self.max_keepalive:
                conn.close()
                return
            conn.idle_since = time.monotonic()
            stack.append(conn)

        async def _connect(self, request, key: tuple, timeout: float | None) -> _H11Conn:
            loop = asyncio.get_running_loop()
            try:
                _tr, conn = await asyncio.wait_for(loop.create_connection(_H11Conn, key[0], key[1]), timeout)
            except (asyncio.TimeoutError, TimeoutError):
                raise httpx.ConnectTimeout(f"timed out connecting to {key[0]}:{key[1]}", request=request) from None
            except OSError as exc:
                raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}", request=request) from exc
            self._all.add(conn)
            return conn

        async def _read_response(self, conn: _H11Conn, request, timeout: float | None, reused: bool):
            buf = conn.buf
            pos = 0
            while True:  # the status line and headers (skipping 1xx interim responses)
                try:
                    while True:
                        i = buf.find(b"\r\n\r\n", pos)
                        if i >= 0:
                            break
                        if conn.eof:
                            if not buf and reused:
                                raise _StaleConnection()
                            raise httpx.RemoteProtocolError(
                                "Server disconnected without sending a response." if not buf else
                                "Server disconnected inside the response headers.", request=request)
                        await conn.wait(len(buf) + 1, timeout)
                except TimeoutError:
                    raise httpx.ReadTimeout("timed out waiting for the response", request=request) from None
                lines = bytes(buf[pos:i]).split(b"\r\n")
                pos = i + 4
                try:
                    version, status_s, *rest = lines[0].split(b" ", 2)
                    status = int(status_s)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}",
                                                    request=request) from None
                reason = rest[0] if rest else b""
                headers = []
                length = None
                chunked = False
                keep = version == b"HTTP/1.1"
                for line in lines[1:]:
                    k, sep, v = line.partition(b":")
                    if not sep:
                        continue
                    k = k.strip()
                    v = v.strip()
                    headers.append((k, v))
                    lk = k.lower()
                    if lk == b"content-length":
                        length = int(v)
                    elif lk == b"transfer-encoding":
                        chunked = b"chunked" in v.lower()
                    elif lk == b"connection":
                        lv = v.lower()
                        if b"close" in lv:
                            keep = False
                        elif b"keep-alive" in lv:
                            keep = True
                if 100 <= status < 200 and status != 101:
                    continue
                break
            try:
                if request.method == "HEAD" or status in (204, 304) or status < 200:
                    content = b""
                elif chunked:
                    parts = []
                    while True:
                        j = buf.find(b"\r\n", pos)
                        while j < 0:
                            self._need_more(conn, request)
                            await conn.wait(len(buf) + 1, timeout)
                            j = buf.find(b"\r\n", pos)
                        size = int(bytes(buf[pos:j]).split(b";")[0].strip() or b"0", 16)
                        pos = j + 2
                        if size == 0:
                            while True:  # trailers, up to the empty line
                                j = buf.find(b"\r\n", pos)
                                while j < 0:
                                    self._need_more(conn, request)
                                    await conn.wait(len(buf) + 1, timeout)
                                    j = buf.find(b"\r\n", pos)
                                empty = j == pos
                                pos = j + 2
                                if empty:
                                    break
                            break
                        while len(buf) < pos + size + 2:
                            self._need_more(conn, request)
                            await conn.wait(pos + size + 2, timeout)
                        parts.append(bytes(buf[pos:pos + size]))
                        pos += size + 2
                    content = b"".join(parts)
                elif length is not None:
                    while len(buf) < pos + length:
                        self._need_more(conn, request)
                        await conn.wait(pos + length, timeout)
                    content = bytes(buf[pos:pos + length])
                    pos += length
                else:  # no framing: the body runs until the server closes
                    keep = False
                    while not conn.eof:
                        await conn.wait(len(buf) + 1, timeout)
                    content = bytes(buf[pos:])
                    pos = len(buf)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out reading the response body", request=request) from None
            except ValueError as exc:
                raise httpx.RemoteProtocolError(f"malformed response framing: {exc}", request=request) from None
            del buf[:pos]
            if buf:  # bytes beyond this response: do not reuse the connection
                keep = False
            return status, reason, headers, content, keep

        @staticmethod
        def _need_more(conn: _H11Conn, request) -> None:
            if conn.eof:
                raise httpx.RemoteProtocolError("Server disconnected inside the response body.",
                                                request=request)

        async def aclose(self) -> None:
            for c in list(self._all):
                c.close()
            self._idle.clear()

    return H11Transport


_H11_TRANSPORT_CLASS = None


def _h11_transport(max_keepalive: int):
    global _H11_TRANSPORT_CLASS
    if _H11_TRANSPORT_CLASS is None:
        _H11_TRANSPORT_CLASS = _make_h11_transport_class()
    return _H11_TRANSPORT_CLASS(max_keepalive)


def _use_h11_transport(base_url: str) -> bool:
    """Plain http, not routed through an environment proxy, not disabled by TOOLKIT_HTTP_TRANSPORT."""
    if os.environ.get("TOOLKIT_HTTP_TRANSPORT", "").lower() in ("httpx", "httpcore", "default"):
        return False
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    proxies = getproxies()
    if proxies.get("http") or proxies.get("all"):
        try:
            return bool(proxy_bypass(parts.hostname))
        except Exception:  # pragma: no cover
            return False
    return True


# ----------------------------------------------------------------------------------------------
# Per-endpoint transport: one AsyncOpenAI + one semaphore per (endpoint, event loop)


class _Endpoint:
    def __init__(self, base_url: str, api_key: str, concurrency: int):
        self.base_url = base_url
        self.api_key = api_key
        self.concurrency = max(1, int(concurrency))
        self._per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._chat_url: Any = None

    # httpcore's pool scans every connection for every waiting request (O(conns x waiting)); at
    # hundreds of concurrent requests that scan dominated the CPU (measured: 4x below the
    # server-bound rate at 256 concurrent episodes). Sharding the connections over several
    # AsyncOpenAI clients of at most SHARD_CONNS connections each keeps every scan small.
    SHARD_CONNS = 16

    def get(self):
        import openai

        httpx = _http()

        loop = asyncio.get_running_loop()
        with self._lock:
            st = self._per_loop.get(loop)
            if st is None:
                if _use_h11_transport(self.base_url):
                    clients = [openai.AsyncOpenAI(
                        base_url=self.base_url, api_key=self.api_key, max_retries=0,
                        http_client=openai.DefaultAsyncHttpxClient(
                            transport=_h11_transport(self.concurrency)))]
                else:
                    n = max(1, -(-self.concurrency // self.SHARD_CONNS))
                    per = min(self.concurrency, self.SHARD_CONNS)
                    clients = [openai.AsyncOpenAI(
                        base_url=self.base_url, api_key=self.api_key, max_retries=0,
                        http_client=openai.DefaultAsyncHttpxClient(limits=httpx.Limits(
                            max_connections=per, max_keepalive_connections=per)))
                        for _ in range(n)]
                st = [clients, asyncio.Semaphore(self.concurrency), 0]
                self._per_loop[loop] = st
            st[2] = (st[2] + 1) % len(st[0])
            return st[0][st[2]], st[1]

    def chat_url(self, client) -> Any:
        """The chat-completions URL as the SDK builds it from the base URL, resolved once: passed
        to `post` as an absolute httpx.URL it is not re-parsed per request (re-parsing and
        re-validating the host was ~9% of a request's client CPU)."""
        url = self._chat_url
        if url is None:
            try:
                url = client._prepare_url("/chat/completions")
                url = url if getattr(url, "is_absolute_url", False) else "/chat/completions"
                if not isinstance(url, str) and _sdk_major() >= 3:
                    url = str(url)  # openai 3.x treats options.url as a str (`.startswith`)
            except Exception:  # pragma: no cover - an SDK without _prepare_url
                url = "/chat/completions"
            self._chat_url = url
        return url

    async def aclose(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        with self._lock:
            st = self._per_loop.pop(loop, None)
        if st is not None:
            for c in st[0]:
                await c.close()


# one transport per (endpoint, key, concurrency): clients asking for the same limit share its pool and
# semaphore; a client configured with another limit gets its own (it never inherits the limit of
# whichever client reached the endpoint first: a server's port is reused once another one closed)
_ENDPOINTS: dict[tuple[str, str, int], _Endpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()


def _endpoint(base_url: str, api_key: str, concurrency: int) -> _Endpoint:
    with _ENDPOINTS_LOCK:
        key = (base_url, api_key, max(1, int(concurrency)))
        ep = _ENDPOINTS.get(key)
        if ep is None:
            ep = _ENDPOINTS[key] = _Endpoint(base_url, api_key, concurrency)
        return ep


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    raw = headers.get("retry-after-ms")
    if raw:
        try:
            return max(0.0, float(raw) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        try:
            dt = email.utils.parsedate_to_datetime(raw)
            return max(0.0, dt.timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _error_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    return str(exc)[:500]


def _normalize_native(messages: list[dict]) -> list[dict]:
    """Copy messages, making tool-call arguments JSON strings as the API requires."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                tc = dict(tc)
                fn = dict(tc.get("function") or {})
                if not isinstance(fn.get("arguments", ""), str):
                    fn["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)
                tc["function"] = fn
                tc.setdefault("type", "function")
                calls.append(tc)
            m["tool_calls"] = calls
        out.append(m)
    return out


def _json_default(o: Any) -> Any:
    import datetime as _dt

    if isinstance(o, (_dt.datetime, _dt.date)):
        return o.isoformat()
    if isinstance(o, BaseModel):
        return o.model_dump(mode="json", exclude_unset=True, by_alias=True)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _dumps(obj: Any) -> bytes:
    # the SDK's own encoding (openai._utils._json.openapi_dumps)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                      default=_json_default).encode()


class ToolSchemas(list):
    """A list of tool schemas whose JSON encoding the client computes once and reuses.

    The airline domain's 11 tool schemas are ~35 KB of JSON (~0.25 ms to encode); sent with every
    agent turn, re-encoding them was a measurable share of a rollout's CPU. Build one for a
    tool set that will not change (e.g. `rollout` interns one per distinct tool set) and do not
    mutate it or its schemas afterwards: the cached encoding would go stale. A plain list works
    everywhere a ToolSchemas does (it is encoded per request).
    """

    __slots__ = ("_json",)

    def json_bytes(self) -> bytes:
        try:
            return self._json
        except AttributeError:
            self._json = _dumps(list(self))
            return self._json


def _encode_body(body: dict, tools: Any) -> bytes:
    if isinstance(tools, ToolSchemas) and body.get("tools") is tools:
        rest = _dumps({k: v for k, v in body.items() if k != "tools"})
        return rest[:-1] + (b',"tools":' if len(rest) > 2 else b'"tools":') + tools.json_bytes() + b"}"
    return _dumps(body)


_POST_CONTENT: bool | None = None


def _post_takes_content() -> bool:
    """Whether this openai SDK's `post` takes pre-encoded `content` (newer SDKs); older ones get
    the body as a dict and encode it themselves."""
    global _POST_CONTENT
    if _POST_CONTENT is None:
        import inspect

        import openai

        try:
            _POST_CONTENT = "content" in inspect.signature(openai.AsyncOpenAI.post).parameters
        except (TypeError, ValueError):  # pragma: no cover
            _POST_CONTENT = False
    return _POST_CONTENT


def _json_payload(raw: Any, endpoint: str) -> dict:
    try:
        data = json.loads(raw.content)
    except ValueError as exc:
        raise LLMError(f"LLM response from {endpoint} is not JSON: {exc}", endpoint=endpoint,
                       status="invalid response") from exc
    if not isinstance(data, dict):
        raise LLMError(f"LLM response from {endpoint} has no choices", endpoint=endpoint,
                       status="invalid response")
    return data


def _estimate_tokens(text: str) -> int:
    return (len(text) + 3) // 4
