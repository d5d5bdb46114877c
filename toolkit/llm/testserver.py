"""A real OpenAI-compatible HTTP server on loopback with scripted replies (tests, benchmarks).

Pure asyncio streams, HTTP/1.1 with keep-alive, running its own event loop in a daemon thread:

    with ScriptedServer(["hello", {"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}],
                        delay=0.05, failures=[429, 500]) as srv:
        cfg = LLMConfig(base_url=srv.base_url, model="scripted")
        ...
        assert srv.chat_count == 4 and srv.max_in_flight <= 8

Replies
-------
`replies` is a list cycled in order (one item per successful chat request) or a callable
`f(request_json) -> reply`.  A reply is
- a string: the assistant content;
- a dict with any of `content`, `tool_calls` (items either `{"name", "arguments"}` with
  arguments as dict or JSON string, or the full OpenAI shape), `finish_reason`, `usage`
  (`{"prompt_tokens", "completion_tokens"}`), `delay` (seconds, overrides the server delay),
  `status` (return this HTTP error instead), `retry_after` (header for an error status).

Failures
--------
`failures=[429, 500]` makes the first two requests to /chat/completions fail with those statuses
(then the scripted replies start); `fail_first=N, fail_status=S` is shorthand for `[S] * N`.
`"timeout"` as a failure sleeps `hang` seconds before answering 200 (to exercise client
timeouts); `"drop"` closes the connection without answering.  `retry_after` adds a Retry-After
header to every injected failure.

Counters: `request_count` (all HTTP requests), `chat_count` (chat completions received, failed
or not), `in_flight`, `max_in_flight`, `requests` (the JSON bodies received, in arrival order),
`request_headers` (their headers, lower-cased names).

`context_tokens=N` makes it behave like a server with an N-token context: `/v1/models` reports
`max_model_len` N, `POST /tokenize` (vLLM's shape: `{"model", "messages"[, "tools"]}` or
`{"prompt"}`) answers `{"count", "max_model_len"}`, and a chat request whose prompt (counted the
same way: UTF-8 bytes / 4, plus 4 per message) plus `max_tokens` exceeds N gets vLLM's HTTP 400
"This model's maximum context length is N tokens ..." (counter `context_errors`).
`tokenize=False` leaves `/tokenize` out (404), for the estimate path; `advertise_context=False`
keeps `max_model_len` out of `/v1/models` (the client then learns the size from the 400).

`"stream": true` in a request gets the same reply as Server-Sent Events (OpenAI's
`chat.completion.chunk` shape: one delta with the role, content and tool calls, one with the
finish reason, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`).

`reuse_tools=True` parses an identical `tools` array (byte for byte, as every agent turn of a
rollout sends) once and shares the parsed list between request dicts (treat it as read-only);
the rest of each body is parsed as usual. Benchmarks use it: a 35 KB tools array was most of the
server's per-request CPU.

`keep_requests` bounds what `requests`/`request_headers` retain: True (default) keeps every body,
an int N keeps the last N, False/0 keeps none. Benchmarks pass False: retaining hundreds of
thousands of parsed bodies costs memory and, through the garbage collector's full collections
over an ever larger heap, made each request's JSON parsing ~6x slower (measured 850 vs 141 us
for a 40 KB body), so a long run slowed the server down.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import threading
import time
import uuid
from typing import Any, Callable

__all__ = ["ScriptedServer"]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            408: "Request Timeout", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


def _approx_tokens(text: str) -> int:
    return max(1, len(text.split())) if text else 0


_SSE = "__sse__"  # marker in the extra headers: send the completion as Server-Sent Events


def _streamed(result: Any, stream: str | None) -> Any:
    """Mark a successful completion of a streaming request for SSE (errors stay JSON)."""
    if stream and result is not None and result[0] == 200:
        return result[0], result[1], {**result[2], _SSE: stream}
    return result


def _sse_body(completion: dict, usage: bool) -> bytes:
    """A chat completion as OpenAI's streamed chunks, whole (the reply is known up front)."""
    choice = completion["choices"][0]
    msg = choice["message"]
    delta: dict = {"role": "assistant", "content": msg.get("content")}
    if msg.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(msg["tool_calls"])]
    head = {k: completion[k] for k in ("id", "created", "model")}
    chunks = [{**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    if usage:
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


class ScriptedServer:
    def __init__(self, replies: list[Any] | Callable[[dict], Any] | None = None, *,
                 delay: float = 0.0, failures: list[int | str] | None = None,
                 fail_first: int = 0, fail_status: int = 429, retry_after: float | None = None,
                 hang: float = 30.0, host: str = "127.0.0.1", port: int = 0,
                 model: str = "scripted-model", keep_requests: bool | int = True,
                 reuse_tools: bool = False, context_tokens: int | None = None, tokenize: bool = True,
                 advertise_context: bool = True):
        self._replies = replies if replies is not None else ["OK"]
        self._cycle = None if callable(self._replies) else itertools.cycle(list(self._replies) or ["OK"])
        self.delay = delay
        self._failures: list[int | str] = list(failures or []) + [fail_status] * fail_first
        self.retry_after = retry_after
        self.hang = hang
        self.host = host
        self.port = port
        self.model = model
        self.request_count = 0
        self.chat_count = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.keep_requests = keep_requests
        self.reuse_tools = reuse_tools
        self.context_tokens = context_tokens
        self.tokenize = tokenize
        self.advertise_context = advertise_context
        self.context_errors = 0
        self.tokenize_count = 0
        self._tools_seen: list[tuple[bytes, list]] = []  # (b'"tools":[...]' as sent, parsed)
        if keep_requests is True:
            self.requests: list[dict] = []
            self.request_headers: list[dict] = []
        else:
            n = max(0, int(keep_requests))
            self.requests = collections.deque(maxlen=n)  # type: ignore[assignment]
            self.request_headers = collections.deque(maxlen=n)  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "ScriptedServer":
        if self._thread is not None:
            return self
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        err: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._server = self._loop.run_until_complete(asyncio.start_server(
                    self._handle, self.host, self.port, backlog=2048, limit=2 ** 24))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # pragma: no cover - reported to the caller
                err.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="ScriptedServer", daemon=True)
        self._thread.start()
        ready.wait(10)
        if err:
            raise err[0]
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.sleep(0)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        except Exception:  # pragma: no cover
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
        self._loop = None
        self._thread = None

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def reset_counts(self) -> None:
        with self._lock:
            self.request_count = self.chat_count = self.max_in_flight = 0
            self.requests.clear()
            self.request_headers.clear()

    # ------------------------------------------------------------------ HTTP plumbing
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._conns.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, target, _version = lines[0].split(" ", 2)
                except ValueError:
                    return
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = b""
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            await reader.readline()
                            break
                        chunks.append(await reader.readexactly(size))
                        await reader.readline()
                    body = b"".join(chunks)
                elif "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                keep = headers.get("connection", "").lower() != "close"
                result = await self._dispatch(method, target.split("?", 1)[0], body, headers)
                if result is None:  # "drop"
                    return
                status, payload, extra = result
                sse = extra.pop(_SSE, None)
                data = _sse_body(payload, sse == "usage") if sse else json.dumps(payload).encode()
                hdrs = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
                        "Content-Type: " + ("text/event-stream" if sse else "application/json"),
                        f"Content-Length: {len(data)}",
                        "Connection: " + ("keep-alive" if keep else "close")]
                hdrs += [f"{k}: {v}" for k, v in extra.items()]
                writer.write(("\r\n".join(hdrs) + "\r\n\r\n").encode() + data)
                await writer.drain()
                if not keep:
                    return
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            self._conns.discard(task)
            try:
                writer.close()
            except Exception:  # pragma: no cover
                pass

    async def _dispatch(self, method: str, path: str, body: bytes, headers: dict | None = None):
        with self._lock:
            self.request_count += 1
        if method == "GET" and path.rstrip("/").endswith("/models"):
            entry = {"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}
            if self.context_tokens and self.advertise_context:
                entry["max_model_len"] = self.context_tokens
            return 200, {"object": "list", "data": [entry]}, {}
        if method == "POST" and path.rstrip("/") == "/tokenize" and self.tokenize:
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                return 400, {"error": {"message": "invalid JSON body", "type": "invalid_request_error"}}, {}
            with self._lock:
                self.tokenize_count += 1
            n = self.count_prompt(req) if "messages" in req else self.count_text(str(req.get("prompt") or ""))
            return 200, {"count": n, "max_model_len": self.context_tokens or 0, "tokens": []}, {}
        if method == "GET" and path.rstrip("/") in ("/health", "/v1/health"):
            return 200, {"status": "ok"}, {}
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            return 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}}, {}
        try:
            req = self._parse(body) if self.reuse_tools else json.loads(body or b"{}")
        except ValueError:
            return 400, {"error": {"message": "invalid JSON body", "type": "invalid_request_error"}}, {}
        with self._lock:
            self.chat_count += 1
            if self.keep_requests:
                self.requests.append(req)
                self.request_headers.append(dict(headers or {}))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            failure = self._failures.pop(0) if self._failures else None
        if self.context_tokens and failure is None:
            need = self.count_prompt(req)
            completion = int(req.get("max_tokens") or 0)
            if need + completion > self.context_tokens:
                with self._lock:
                    self.context_errors += 1
                    self.in_flight -= 1
                return 400, {"error": {"message": (
                    f"This model's maximum context length is {self.context_tokens} tokens. However, you "
                    f"requested {need + completion} tokens ({need} in the messages, {completion} in the "
                    f"completion). Please reduce the length of the messages or completion."),
                    "type": "BadRequestError", "code": 400}}, {}
        stream = "usage" if (req.get("stream_options") or {}).get("include_usage") else "1" if req.get("stream") else None
        try:
            if failure is None:
                # The reply is built before the delay and the parsed request dropped: hundreds of
                # parsed bodies kept alive across the delay were promoted to the GC's oldest
                # generation, and its full collections tripled the cost of parsing a body.
                prepared = self._prepare(req)
                del req
                if asyncio.iscoroutine(prepared):
                    prepared = await prepared
                return _streamed(await self._respond(*prepared), stream)
            return _streamed(await self._chat(req, failure), stream)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _parse(self, body: bytes) -> Any:
        if len(body) < 4096:
            return json.loads(body or b"{}")
        for seg, tools in self._tools_seen:
            i = body.find(seg)
            if i < 0:
                continue
            try:
                req = json.loads(body[:i] + b'"tools":null' + body[i + len(seg):])
            except ValueError:
                break
            # the substituted key was the top-level one iff the top-level value is now null
            if isinstance(req, dict) and "tools" in req and req["tools"] is None:
                req["tools"] = tools
                return req
            break
        req = json.loads(body)
        self._learn_tools(body, req)
        return req

    def _learn_tools(self, body: bytes, req: Any) -> None:
        tools = req.get("tools") if isinstance(req, dict) else None
        if not isinstance(tools, list) or not tools or len(self._tools_seen) >= 16:
            return
        text = body.decode("utf-8")
        dec = json.JSONDecoder()
        k = text.find('"tools"')
        while k >= 0:
            j = k + 7
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            if j < len(text) and text[j] == ":":
                j += 1
                while j < len(text) and text[j] in " \t\r\n":
                    j += 1
                try:
                    val, end = dec.raw_decode(text, j)
                except ValueError:
                    val, end = None, j
                if val == tools:
                    self._tools_seen.append((text[k:end].encode("utf-8"), tools))
                    return
            k = text.find('"tools"', k + 7)

    def _error(self, status: int, retry_after: float | None):
        extra = {}
        if retry_after is not None:
            extra["Retry-After"] = str(retry_after)
        return status, {"error": {"message": f"injected failure {status}", "type": "server_error"
                                  if status >= 500 else "rate_limit_error", "code": status}}, extra

    async def _chat(self, req: dict, failure: int | str | None):
        if failure == "drop":
            await asyncio.sleep(self.delay)
            return None
        if failure == "timeout":
            await asyncio.sleep(self.hang)
            failure = None
        if isinstance(failure, int):
            await asyncio.sleep(self.delay)
            return self._error(failure, self.retry_after)
        prepared = self._prepare(req)
        if asyncio.iscoroutine(prepared):
            prepared = await prepared
        return await self._respond(*prepared)

    def _prepare(self, req: dict):
        """(reply, model, prompt tokens): everything a response needs from the request."""
        reply = self._replies(req) if callable(self._replies) else next(self._cycle)
        model = req.get("model") or self.model
        if asyncio.iscoroutine(reply):
            async def later(coro):
                return await coro, model, self._prompt_tokens(req)
            return later(reply)
        return reply, model, self._prompt_tokens(req)

    @staticmethod
    def count_text(text: str) -> int:
        """The scripted tokenizer: UTF-8 bytes / 4, rounded up."""
        return -(-len(text.encode("utf-8")) // 4)

    def count_prompt(self, req: dict) -> int:
        """Prompt tokens of a chat request as this server counts them (its context check, /tokenize)."""
        n = 0
        for m in req.get("messages") or []:
            n += 4 + self.count_text(str(m.get("content") or ""))
            if m.get("tool_calls"):
                n += self.count_text(json.dumps(m["tool_calls"]))
        if req.get("tools"):
            n += self.count_text(json.dumps(req["tools"]))
        return n

    @staticmethod
    def _prompt_tokens(req: dict) -> int:
        return _approx_tokens(" ".join(str(m.get("content") or "") for m in req.get("messages", [])))

    async def _respond(self, reply: Any, model: str, prompt_tokens: int):
        if isinstance(reply, str) or reply is None:
            reply = {"content": reply}
        reply = dict(reply)
        await asyncio.sleep(reply.get("delay", self.delay))
        if reply.get("status"):
            return self._error(int(reply["status"]), reply.get("retry_after", self.retry_after))
        content = reply.get("content")
        tool_calls = []
        for tc in reply.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments", {})
            if not isinstance(args, str):
                args = json.dumps(args)
            tool_calls.append({"id": tc.get("id") or "call_" + uuid.uuid4().hex[:12],
                               "type": "function",
                               "function": {"name": fn.get("name"), "arguments": args}})
        message: dict = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        usage = dict(reply.get("usage") or {})
        usage.setdefault("prompt_tokens", prompt_tokens)
        usage.setdefault("completion_tokens",
                         _approx_tokens(content or "") + 8 * len(tool_calls))
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        finish = reply.get("finish_reason") or ("tool_calls" if tool_calls else "stop")
        return 200, {
            "id": "chatcmpl-" + uuid.uuid4().hex[:16], "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": usage,
        }, {}
