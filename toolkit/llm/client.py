"""One async LLM client, used by every LLM role in the toolkit.

Backends (chosen by `LLMConfig.base_url`):
- any OpenAI-compatible endpoint (`vllm serve`, OpenAI, llama.cpp server, ...) through
  `openai.AsyncOpenAI` -- the production path;
- `None` (or "embedded"): the embedded llama.cpp server with SmolLM2-135M-Instruct, started or
  reused on loopback (see `toolkit.llm.embedded`), so every command runs offline on a CPU;
- "vllm-inprocess": vLLM's offline `LLM` engine in this process, micro-batching concurrent
  requests (GPU machines; a clear LLMError when vllm is not installed).

Around every request: a per-endpoint concurrency semaphore, retries with exponential backoff and
full jitter on 429/5xx/timeouts/connection errors (honouring Retry-After; the SDK's own retries
are disabled), an optional SQLite request cache, token/cost accounting (`Meter`, and
`ChatResult.provenance()` for records) and tool-call parsing for native `tool_calls` as well as
text protocols (`toolkit.llm.toolcalls`).

Requests go through the SDK (`AsyncOpenAI.post` with a pre-encoded body, raw response parsed
here); for plain-http endpoints the SDK's httpx client runs over a lean HTTP/1.1 keep-alive
transport (`_H11Conn`), https and proxied endpoints over httpx's default one. See
docs/performance.md for the measurements behind both.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib.util
import json
import os
import random
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from .cache import cache_key, open_cache
from .embedded import embedded_model_name
from .toolcalls import looks_like_tool_call, new_call_id, parse_tool_calls, repair_json, to_hermes_messages

__all__ = ["LLMConfig", "ChatResult", "Meter", "LLMClient", "LLMError", "ToolSchemas", "get_client",
           "close_all_clients", "EMBEDDED", "VLLM_INPROCESS"]

EMBEDDED = "embedded"
VLLM_INPROCESS = "vllm-inprocess"
EMBEDDED_MAX_CONCURRENCY = 1  # llama.cpp's server runs one completion at a time

# Arguments `chat.completions.create` takes as keywords; anything else goes into extra_body
# (e.g. vLLM's top_k, repetition_penalty, chat_template_kwargs).
_SDK_PARAMS = {"temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stop",
               "response_format", "tool_choice", "parallel_tool_calls", "presence_penalty",
               "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "user", "n",
               "reasoning_effort", "metadata", "service_tier", "store"}
_NOT_SAMPLING = {"timeout", "sample_index"}


class LLMError(RuntimeError):
    """A chat request failed for good (non-retryable status, or retries exhausted)."""

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | str | None = None,
                 attempts: int = 0):
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts


class LLMConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model: str | None = None          # None -> the embedded default model (or the server's first model)
    base_url: str | None = None       # None -> embedded server; "vllm-inprocess" -> in-process vLLM
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this env var; "EMPTY" when unset
    concurrency: int = 8
    temperature: float = 0.0
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int = 512
    timeout: float = 120
    max_retries: int = 5
    cache: str | None = None          # SQLite cache file
    tool_protocol: str = "auto"       # auto | native | hermes
    price_prompt_per_1k: float = 0.0
    price_completion_per_1k: float = 0.0
    backoff_base: float = 0.5         # seconds; delay for attempt k is U(0, min(max, base * 2**k))
    backoff_max: float = 30.0
    compact_tools: bool | None = None  # small-context tool rendering in hermes prompts; None -> embedded only
    hermes_fewshot: bool | None = None  # example tool-call exchange in hermes prompts; None -> embedded only


@dataclass
class ChatResult:
    message: dict
    usage: dict
    cost: float
    cached: bool
    model: str
    latency_s: float
    finish_reason: str | None
    parse_error: str | None = None

    @property
    def content(self) -> str | None:
        return self.message.get("content")

    @property
    def tool_calls(self) -> list[dict]:
        return self.message.get("tool_calls") or []

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ChatResult":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})

    def provenance(self) -> dict:
        """What a record keeps about this call."""
        return {"model": self.model, "prompt_tokens": int(self.usage.get("prompt_tokens", 0)),
                "completion_tokens": int(self.usage.get("completion_tokens", 0)),
                "cost": round(self.cost, 8), "cached": self.cached,
                "latency_s": round(self.latency_s, 4), "finish_reason": self.finish_reason}


class Meter:
    """Running totals over many calls; safe to share between threads and tasks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0          # completed requests that reached a backend
        self.cache_hits = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost = 0.0
        self.errors = 0            # calls that ended in LLMError
        self.retries = 0           # retried attempts
        self.latency_s = 0.0       # summed backend latency

    def record(self, result: ChatResult) -> None:
        with self._lock:
            if result.cached:
                self.cache_hits += 1
                return
            self.requests += 1
            self.prompt_tokens += int(result.usage.get("prompt_tokens", 0))
            self.completion_tokens += int(result.usage.get("completion_tokens", 0))
            self.cost += result.cost
            self.latency_s += result.latency_s

    def record_error(self) -> None:
        with self._lock:
            self.errors += 1

    def record_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"requests": self.requests, "cache_hits": self.cache_hits,
                    "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                    "total_tokens": self.prompt_tokens + self.completion_tokens,
                    "cost": round(self.cost, 8), "errors": self.errors, "retries": self.retries,
                    "latency_s": round(self.latency_s, 4)}


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


_ENDPOINTS: dict[tuple[str, str], _Endpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()


def _endpoint(base_url: str, api_key: str, concurrency: int) -> _Endpoint:
    with _ENDPOINTS_LOCK:
        ep = _ENDPOINTS.get((base_url, api_key))
        if ep is None:
            ep = _ENDPOINTS[(base_url, api_key)] = _Endpoint(base_url, api_key, concurrency)
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


# ----------------------------------------------------------------------------------------------
# In-process vLLM (GPU batch jobs)


class _VLLMInProcess:
    """vLLM's offline engine with micro-batching: concurrent chat() calls arriving within a few
    milliseconds are sent to `LLM.chat` together."""

    _engines: dict[str, Any] = {}
    _engines_lock = threading.Lock()

    def __init__(self, config: LLMConfig):
        if importlib.util.find_spec("vllm") is None:
            raise LLMError(
                "base_url='vllm-inprocess' needs the vllm package, which is not installed "
                "(pip install vllm, on a machine with a CUDA GPU). Alternatively run "
                "`vllm serve MODEL` and pass --base-url http://HOST:8000/v1.",
                endpoint=VLLM_INPROCESS)
        if not config.model:
            raise LLMError("base_url='vllm-inprocess' needs --model (a HF model id or path)",
                           endpoint=VLLM_INPROCESS)
        self.model = config.model
        self.max_batch = max(1, config.concurrency)
        self._queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue]" = weakref.WeakKeyDictionary()
        self._workers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task]" = weakref.WeakKeyDictionary()

    def _engine(self):
        with self._engines_lock:
            eng = self._engines.get(self.model)
            if eng is None:
                from vllm import LLM  # type: ignore

                eng = self._engines[self.model] = LLM(model=self.model)
            return eng

    def _run_batch(self, items: list[tuple]) -> list[Any]:
        from vllm import SamplingParams  # type: ignore

        eng = self._engine()
        # LLM.chat takes one tools list per call: group by tools.
        groups: dict[str, list[int]] = {}
        for i, (msgs, tools, params) in enumerate(items):
            groups.setdefault(json.dumps(tools, sort_keys=True, default=str), []).append(i)
        results: list[Any] = [None] * len(items)
        for key, idx in groups.items():
            sps = []
            for i in idx:
                p = items[i][2]
                kw = {"temperature": p.get("temperature", 0.0), "max_tokens": p.get("max_tokens", 512)}
                for k in ("top_p", "seed", "stop", "top_k", "presence_penalty", "frequency_penalty",
                          "repetition_penalty"):
                    if p.get(k) is not None:
                        kw[k] = p[k]
                sps.append(SamplingParams(**kw))
            tools = items[idx[0]][1]
            try:
                outs = eng.chat([items[i][0] for i in idx], sps, use_tqdm=False,
                                **({"tools": tools} if tools else {}))
                for i, o in zip(idx, outs):
                    results[i] = o
            except Exception as exc:  # pragma: no cover - surfaced per request
                for i in idx:
                    results[i] = exc
        return results

    async def _worker(self, q: asyncio.Queue) -> None:
        while True:
            first = await q.get()
            batch = [first]
            await asyncio.sleep(0.005)
            while not q.empty() and len(batch) < self.max_batch:
                batch.append(q.get_nowait())
            try:
                outs = await asyncio.to_thread(self._run_batch, [b[0] for b in batch])
            except Exception as exc:
                outs = [exc] * len(batch)
            for (_, fut), out in zip(batch, outs):
                if not fut.done():
                    if isinstance(out, Exception):
                        fut.set_exception(out)
                    else:
                        fut.set_result(out)

    async def generate(self, messages: list[dict], tools: list[dict] | None, params: dict):
        loop = asyncio.get_running_loop()
        q = self._queues.get(loop)
        if q is None:
            q = self._queues[loop] = asyncio.Queue()
            self._workers[loop] = loop.create_task(self._worker(q))
        fut = loop.create_future()
        await q.put(((messages, tools, params), fut))
        out = await fut
        comp = out.outputs[0]
        return (comp.text, len(out.prompt_token_ids or []), len(comp.token_ids or []),
                comp.finish_reason)


# ----------------------------------------------------------------------------------------------
# The client


class LLMClient:
    def __init__(self, config: LLMConfig, meter: Meter | None = None):
        self.config = config
        self.meter = meter if meter is not None else Meter()
        self._cache = open_cache(config.cache) if config.cache else None
        base = config.base_url
        if base in ("", EMBEDDED):
            base = None
        self._embedded = base is None
        self._vllm = _VLLMInProcess(config) if base == VLLM_INPROCESS else None
        self._base_url: str | None = None if (self._embedded or self._vllm) else base.rstrip("/")
        # The embedded model's name is known without starting the server, so fully cached
        # reruns never start it.
        self._model: str | None = config.model or (embedded_model_name() if self._embedded else None)
        self._ready_lock = threading.Lock()
        if config.tool_protocol not in ("auto", "native", "hermes"):
            raise ValueError(f"tool_protocol must be auto, native or hermes, not {config.tool_protocol!r}")

    # -- identity
    @property
    def endpoint(self) -> str:
        if self._vllm is not None:
            return VLLM_INPROCESS
        if self._embedded:
            return f"embedded ({self._base_url or 'not started'})"
        return self._base_url or "?"

    @property
    def protocol(self) -> str:
        """The tool protocol actually used: native or hermes."""
        p = self.config.tool_protocol
        if p != "auto":
            return p
        return "hermes" if (self._embedded or self._vllm is not None) else "native"

    @property
    def fewshot(self) -> bool:
        if self.config.hermes_fewshot is not None:
            return self.config.hermes_fewshot
        return self._embedded

    def _api_key(self) -> str:
        return os.environ.get(self.config.api_key_env) or "EMPTY"

    def _transport(self) -> _Endpoint:
        conc = self.config.concurrency
        if self._embedded:
            conc = min(conc, EMBEDDED_MAX_CONCURRENCY)
        return _endpoint(self._base_url, self._api_key(), conc)

    async def _ensure_ready(self) -> None:
        if self._vllm is not None:
            return
        if self._embedded and self._base_url is None:
            from .embedded import EmbeddedServerError, ensure_embedded_server

            def start() -> str:
                with self._ready_lock:
                    if self._base_url is None:
                        self._base_url = ensure_embedded_server()
                    return self._base_url

            try:
                await asyncio.to_thread(start)
            except EmbeddedServerError as exc:
                raise LLMError(f"embedded backend unavailable: {exc}", endpoint=EMBEDDED) from exc
        if self._model is None:
            # A remote server with no --model: use the first model it serves (vLLM serves one).
            client, _sem = self._transport().get()
            try:
                models = await client.models.list(timeout=min(self.config.timeout, 30))
                ids = [m.id for m in models.data]
            except Exception as exc:
                raise LLMError(f"no --model given and listing models at {self.endpoint} failed: "
                               f"{_error_message(exc)}", endpoint=self.endpoint) from exc
            if not ids:
                raise LLMError(f"no --model given and {self.endpoint} lists no models",
                               endpoint=self.endpoint)
            self._model = ids[0]

    # -- params
    def _params(self, overrides: dict) -> dict:
        cfg = self.config
        params: dict[str, Any] = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        if cfg.top_p is not None:
            params["top_p"] = cfg.top_p
        if cfg.seed is not None:
            params["seed"] = cfg.seed
        for k, v in overrides.items():
            if k in _NOT_SAMPLING:
                continue
            params[k] = v
        return {k: v for k, v in params.items() if v is not None}

    # -- main entry point
    async def chat(self, messages: list[dict], tools: list[dict] | None = None,
                   **overrides: Any) -> ChatResult:
        """One chat completion.  `overrides`: temperature, top_p, seed, max_tokens, stop,
        response_format, tool_choice, any backend extra (sent in the body), `timeout`, and
        `sample_index=k` (a cache-key component; with a seed, seed+k is sent) for sampling K
        distinct trajectories from the same prompt."""
        try:
            return await self._chat(messages, tools, overrides)
        except LLMError:
            self.meter.record_error()
            raise

    async def _chat(self, messages: list[dict], tools: list[dict] | None,
                    overrides: dict) -> ChatResult:
        cfg = self.config
        sample_index = int(overrides.get("sample_index") or 0)  # None and 0 share cache entries
        timeout = overrides.get("timeout", cfg.timeout)
        params = self._params(overrides)
        if tools and not isinstance(tools, list):  # a ToolSchemas stays itself
            tools = list(tools)
        tools = tools or None
        if self._model is None:
            await self._ensure_ready()
        model = self._model or "?"
        protocol = self.protocol
        wire_protocol = protocol + ("+fewshot" if protocol == "hermes" and self.fewshot else "")
        if protocol == "hermes" and (self.config.compact_tools if self.config.compact_tools is not None else self._embedded):
            wire_protocol += "+compact"

        key = None
        if self._cache is not None:
            key = cache_key({"model": model, "messages": messages, "tools": tools,
                             "protocol": wire_protocol, "params": params, "sample_index": sample_index})
            hit = self._cache.get(key)
            if hit is not None:
                res = ChatResult.from_dict(hit)
                res.cached, res.cost, res.latency_s = True, 0.0, 0.0
                self.meter.record(res)
                return res

        await self._ensure_ready()
        send = dict(params)
        if sample_index and "seed" in send:
            send["seed"] = int(send["seed"]) + int(sample_index)
        if protocol == "hermes":
            send.pop("tool_choice", None)
            send.pop("parallel_tool_calls", None)

        t0 = time.monotonic()
        if self._vllm is not None:
            res = await self._chat_vllm(messages, tools, send, model)
        else:
            res = await self._chat_http(messages, tools, send, model, protocol, timeout)
        res.latency_s = time.monotonic() - t0
        pt, ct = int(res.usage.get("prompt_tokens", 0)), int(res.usage.get("completion_tokens", 0))
        res.cost = pt / 1000.0 * cfg.price_prompt_per_1k + ct / 1000.0 * cfg.price_completion_per_1k
        self.meter.record(res)
        if self._cache is not None and key is not None:
            self._cache.put(key, res.to_dict(), model=model)
        return res

    async def _chat_http(self, messages, tools, send, model, protocol, timeout) -> ChatResult:
        cfg = self.config
        if protocol == "hermes":
            compact = self.config.compact_tools if self.config.compact_tools is not None else self._embedded
            wire_messages = to_hermes_messages(messages, tools, fewshot=self.fewshot, compact=compact)
            wire_tools = None
        else:
            wire_messages = _normalize_native(messages)
            wire_tools = tools
        # The request goes through the SDK's generic `post` with the body already built (and, where
        # the SDK takes raw content, already JSON-encoded, the tool schemas' encoding reused from
        # `ToolSchemas`), and the response comes back as the raw httpx.Response: the typed
        # `chat.completions.create` path spent ~0.5 ms per call on its recursive TypedDict
        # transform and on constructing the pydantic response model, which capped rollout
        # throughput. Status errors, timeouts and connection errors are raised by the SDK exactly
        # as for `create` (it is the same request machinery).
        body: dict[str, Any] = {"model": model, "messages": wire_messages}
        body.update(send)
        if wire_tools:
            body["tools"] = wire_tools
        post_kwargs: dict[str, Any]
        fast = _post_takes_content()
        if fast:
            post_kwargs = {"content": _encode_body(body, wire_tools)}
        else:  # older SDKs: the SDK encodes the dict
            post_kwargs = {"body": body}

        import openai

        httpx = _http()
        transport = self._transport()
        status: int | str | None = None
        message = ""
        attempts = 0
        for attempt in range(cfg.max_retries + 1):
            attempts = attempt + 1
            retry_after = None
            client, sem = transport.get()
            try:
                url = transport.chat_url(client) if fast else "/chat/completions"
                async with sem:
                    raw = await client.post(url, cast_to=httpx.Response,
                                            options={"timeout": timeout}, **post_kwargs)
                return self._result_from_payload(_json_payload(raw, self.endpoint), model, protocol, tools)
            except openai.APIStatusError as exc:
                status = exc.status_code
                message = _error_message(exc)
                retry_after = _retry_after(getattr(exc.response, "headers", None))
                retryable = status in (408, 409, 429) or status >= 500
            except openai.APITimeoutError as exc:
                status, message, retryable = "timeout", f"no response within {timeout}s", True
            except openai.APIConnectionError as exc:
                cause = exc.__cause__ or exc
                status, message, retryable = "connection error", f"{type(cause).__name__}: {cause}", True
            except openai.OpenAIError as exc:  # response validation and other SDK errors
                status, message, retryable = type(exc).__name__, str(exc)[:500], False
            if not retryable:
                raise LLMError(f"LLM request to {self.endpoint} failed: HTTP {status}: {message}",
                               endpoint=self.endpoint, status=status, attempts=attempts)
            if attempt >= cfg.max_retries:
                break
            self.meter.record_retry()
            delay = random.uniform(0.0, min(cfg.backoff_max, cfg.backoff_base * (2 ** attempt)))
            if retry_after is not None:
                delay = max(delay, min(retry_after, max(cfg.backoff_max, 60.0)))
            await asyncio.sleep(delay)
        raise LLMError(f"LLM request to {self.endpoint} failed after {attempts} attempts; "
                       f"last status: {status}: {message}",
                       endpoint=self.endpoint, status=status, attempts=attempts)

    def _result_from_payload(self, data: dict, model: str, protocol: str,
                             tools: list[dict] | None) -> ChatResult:
        """A chat.completion JSON object -> ChatResult (native tool calls checked/repaired, text
        tool calls parsed for hermes / auto)."""
        choices = data.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise LLMError(f"LLM response from {self.endpoint} has no choices",
                           endpoint=self.endpoint, status="invalid response")
        choice = choices[0]
        msg = choice.get("message")
        if not isinstance(msg, dict):
            msg = {}
        content = msg.get("content")
        finish = choice.get("finish_reason")
        errors: list[str] = []
        calls: list[dict] = []
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                continue
            name = fn.get("name")
            raw = fn.get("arguments") or "{}"
            if not isinstance(raw, str):
                raw = json.dumps(raw, ensure_ascii=False)
            try:
                args = json.loads(raw)
                if not isinstance(args, dict):
                    raise ValueError("arguments are not a JSON object")
            except ValueError:
                try:
                    args = repair_json(raw)
                    if not isinstance(args, dict):
                        raise ValueError(f"arguments of {name!r} are not a JSON object")
                except ValueError as exc:
                    errors.append(f"native tool call {name!r}: {exc}")
                    continue
                raw = json.dumps(args, ensure_ascii=False)
            calls.append({"id": tc.get("id") or new_call_id(), "type": "function",
                          "function": {"name": name, "arguments": raw}})
        text_calls = False
        if tools and (protocol == "hermes" or (
                self.config.tool_protocol == "auto" and not calls and looks_like_tool_call(content))):
            content, parsed, err = parse_tool_calls(content)
            calls.extend(parsed)
            text_calls = bool(parsed)
            if err:
                errors.append(err)
        if text_calls and finish in (None, "stop"):
            finish = "tool_calls"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        usage = data.get("usage")
        if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
            u = {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                 "completion_tokens": int(usage.get("completion_tokens") or 0)}
        else:
            u = {"prompt_tokens": 0, "completion_tokens": _estimate_tokens(msg.get("content") or "")}
        return ChatResult(message=message, usage=u, cost=0.0, cached=False,
                          model=data.get("model") or model, latency_s=0.0,
                          finish_reason=finish, parse_error="; ".join(errors) or None)

    async def _chat_vllm(self, messages, tools, send, model) -> ChatResult:
        wire = _normalize_native(messages)
        try:
            text, pt, ct, finish = await self._vllm.generate(wire, tools, send)
        except Exception as exc:
            raise LLMError(f"in-process vLLM failed: {type(exc).__name__}: {exc}",
                           endpoint=VLLM_INPROCESS, status="error", attempts=1) from exc
        content, calls, err = parse_tool_calls(text) if tools else (text, [], None)
        if calls and finish in (None, "stop"):
            finish = "tool_calls"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return ChatResult(message=message, usage={"prompt_tokens": pt, "completion_tokens": ct},
                          cost=0.0, cached=False, model=model, latency_s=0.0,
                          finish_reason=finish, parse_error=err)

    async def aclose(self) -> None:
        """Close this client's connections in the running event loop (they reopen on next use)."""
        if self._vllm is None and self._base_url is not None:
            await self._transport().aclose()


_CLIENTS: dict[tuple, LLMClient] = {}
_CLIENTS_LOCK = threading.Lock()


def get_client(config: LLMConfig, meter: Meter | None = None) -> LLMClient:
    """The process-wide client for this configuration (and meter).  Clients for the same
    endpoint share one connection pool and one concurrency semaphore per event loop."""
    key = (config.model_dump_json(), id(meter) if meter is not None else None)
    with _CLIENTS_LOCK:
        c = _CLIENTS.get(key)
        if c is None or (meter is not None and c.meter is not meter):
            c = _CLIENTS[key] = LLMClient(config, meter)
        return c


async def close_all_clients() -> None:
    """Close every endpoint's connections in the running event loop."""
    with _ENDPOINTS_LOCK:
        eps = list(_ENDPOINTS.values())
    for ep in eps:
        await ep.aclose()
