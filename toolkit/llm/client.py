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
transport (`toolkit.llm.transport`), https and proxied endpoints over httpx's default one. See
docs/performance.md for the measurements behind both.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import threading
import time
from typing import Any

from toolkit.io.summary import llm_wait_begin, llm_wait_end

from .base import (
    EMBEDDED,
    EMBEDDED_MAX_CONCURRENCY,
    VLLM_INPROCESS,
    ChatResult,
    LLMConfig,
    LLMError,
    Meter,
)
from .cache import cache_key, open_cache
from .constrain import (
    drop_strict_nulls,
    json_reply_instruction,
    protocol_for,
    request_extras,
    strict_tools,
    unoffered_note,
    unwrap_json_reply,
)
from .context import ContextOverflow, estimate_tokens, fit_request, parse_context_error
from .embedded import embedded_model_name
from .toolcalls import (
    looks_like_tool_call,
    new_call_id,
    parse_tool_calls,
    repair_json,
    to_hermes_messages,
)
from .transport import (
    _ENDPOINTS,
    _ENDPOINTS_LOCK,
    _encode_body,
    _Endpoint,
    _endpoint,
    _error_message,
    _estimate_tokens,
    _http,
    _json_payload,
    _normalize_native,
    _post_takes_content,
    _retry_after,
)
from .vllm_inproc import _VLLMInProcess
from toolkit.llm.embedded import EmbeddedServerError, ensure_embedded_server
from toolkit.io import log
from toolkit.llm.context import _text_of
from toolkit.formats.tools import compact_tool
from toolkit.io import note_fallback

__all__ = ["LLMClient", "close_all_clients", "get_client"]

# Arguments `chat.completions.create` takes as keywords; anything else goes into extra_body
# (e.g. vLLM's top_k, repetition_penalty, chat_template_kwargs).
_SDK_PARAMS = {"temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stop",
               "response_format", "tool_choice", "parallel_tool_calls", "presence_penalty",
               "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "user", "n",
               "reasoning_effort", "metadata", "service_tier", "store"}
_NOT_SAMPLING = {"timeout", "sample_index"}

# What each endpoint told us about its context: {base_url: {"ctx": int | None, "tokenize": str | None}}
_CTX_INFO: dict[str, dict] = {}
_CTX_LOCK = threading.Lock()
_CTX_PENDING: dict[tuple, asyncio.Task] = {}  # (event loop id, endpoint): the metadata request in flight
_NO_TOKENIZER = "none"


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
        protocol_for(config.constrain_tool_calls, config.tool_protocol)  # ValueError on a contradiction

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
        p = protocol_for(self.config.constrain_tool_calls, self.config.tool_protocol)
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
            def start() -> str:
                with self._ready_lock:
                    if self._base_url is None:
                        self._base_url = ensure_embedded_server(slot=self.config.embedded_slot)
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
            wire_protocol += "+minimal" if self.config.compact_tools == "minimal" else "+compact"
        constrained = self.config.constrain_tool_calls if tools and self.config.constrain_tool_calls != "off" else None
        if constrained:
            wire_protocol += "+constrained:" + constrained

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
        if sample_index:  # another sample of the same prompt is another request: seed + k (seed 0 if unset)
            send["seed"] = int(send.get("seed") or 0) + int(sample_index)
        if protocol == "hermes":
            send.pop("tool_choice", None)
            send.pop("parallel_tool_calls", None)

        t0 = time.monotonic()
        if self._vllm is not None:
            res = await self._chat_vllm(messages, tools, send, model)
        else:
            res = await self._chat_http(messages, tools, send, model, protocol, timeout)
        res.constrained = constrained
        res.latency_s = time.monotonic() - t0
        pt, ct = int(res.usage.get("prompt_tokens", 0)), int(res.usage.get("completion_tokens", 0))
        res.cost = pt / 1000.0 * cfg.price_prompt_per_1k + ct / 1000.0 * cfg.price_completion_per_1k
        self.meter.record(res)
        if self._cache is not None and key is not None:
            self._cache.put(key, res.to_dict(), model=model)
        return res

    # -- context window
    def _ctx_key(self) -> str:
        return f"{self._base_url}|{self._model}"

    async def context_window(self) -> int | None:
        """The serving model's context size in tokens (None: unknown); see toolkit.llm.context."""
        if self.config.context_tokens:
            return int(self.config.context_tokens)
        if self._vllm is not None:
            return None
        if self._embedded:
            try:
                return int(os.environ.get("TOOLKIT_EMBEDDED_N_CTX", "8192"))
            except ValueError:
                return 8192
        await self._ensure_ready()
        key = self._ctx_key()
        loop = asyncio.get_running_loop()
        pending_key = (id(loop), key)
        with _CTX_LOCK:
            info = _CTX_INFO.get(key)
            if info is not None and "ctx" in info:
                return info["ctx"]
            task = _CTX_PENDING.get(pending_key)
            if task is None or task.get_loop() is not loop:
                # one metadata request per endpoint, however many chats start at once
                task = _CTX_PENDING[pending_key] = loop.create_task(self._ask_context())
        ctx = await asyncio.shield(task)
        with _CTX_LOCK:
            _CTX_INFO.setdefault(key, {})["ctx"] = ctx
            _CTX_PENDING.pop(pending_key, None)
        return ctx

    def _learn_context(self, ctx: int) -> None:
        with _CTX_LOCK:
            _CTX_INFO.setdefault(self._ctx_key(), {})["ctx"] = int(ctx)

    def _root_url(self) -> str:
        base = self._base_url or ""
        return base.removesuffix("/v1")

    async def _get_json(self, url: str, body: dict | None = None) -> Any:
        httpx = _http()
        client, _sem = self._transport().get()
        opts = {"timeout": min(self.config.timeout, 15)}
        if body is None:
            raw = await client.get(url, cast_to=httpx.Response, options=opts)
        else:
            raw = await client.post(url, cast_to=httpx.Response, body=body, options=opts)
        return json.loads(raw.content)

    async def _ask_context(self) -> int | None:
        """Server metadata: vLLM's /v1/models max_model_len, llama-server's /props n_ctx; None (and
        one stderr line) when the server says neither."""
        import openai

        errors = (openai.OpenAIError, ValueError, TypeError, AttributeError, KeyError)
        tried = []
        try:
            data = await self._get_json(f"{self._base_url}/models")
            for m in data.get("data") or []:
                if isinstance(m, dict) and (m.get("id") == self._model or len(data["data"]) == 1):
                    for k in ("max_model_len", "context_length", "context_window", "n_ctx"):
                        if isinstance(m.get(k), int) and m[k] > 0:
                            return int(m[k])
        except errors as exc:  # metadata is optional: the next source, then unknown
            tried.append(f"/models: {type(exc).__name__}")
        try:
            data = await self._get_json(f"{self._root_url()}/props")
            dgs = data.get("default_generation_settings") or {}
            for v in (dgs.get("n_ctx"), data.get("n_ctx")):
                if isinstance(v, int) and v > 0:
                    return int(v)
        except errors as exc:
            tried.append(f"/props: {type(exc).__name__}")
        log(f"LLM endpoint {self.endpoint}: context size unknown (no max_model_len in /models, no /props n_ctx"
            + (f"; {', '.join(tried)}" if tried else "") + "): prompts are sent unfitted until a context-length "
            "error names it; set context_tokens (--context-tokens) to fit them beforehand")
        return None

    async def count_tokens(self, messages: list[dict], tools: Any = None) -> tuple[int, str]:
        """(prompt tokens, how they were counted): the server's tokenizer when it has one
        (vLLM /tokenize, llama-server /tokenize, llama-cpp-python /extras/tokenize/count), else a
        conservative estimate. `messages`/`tools` as sent on the wire."""
        if self._vllm is not None or (self._base_url is None and not self._embedded):
            return estimate_tokens(messages, tools), "estimate"
        await self._ensure_ready()
        key = self._ctx_key()
        with _CTX_LOCK:
            kind = (_CTX_INFO.get(key) or {}).get("tokenize")
        import openai

        root = self._root_url()
        text = None
        order = [kind] if kind else (["llama-cpp-python"] if self._embedded else
                                     ["vllm", "llama-server", "llama-cpp-python"])
        for k in order:
            if k == _NO_TOKENIZER:
                break
            try:
                if k == "vllm":
                    body: dict[str, Any] = {"model": self._model, "messages": messages, "add_generation_prompt": True}
                    if tools:
                        body["tools"] = list(tools)
                    data = await self._get_json(f"{root}/tokenize", body)
                    n = data.get("count") if isinstance(data.get("count"), int) else len(data["tokens"])
                else:
                    if text is None:
                        text, _ = _text_of(messages, tools)
                    if k == "llama-server":
                        data = await self._get_json(f"{root}/tokenize", {"content": text})
                        n = len(data["tokens"])
                    else:
                        data = await self._get_json(f"{root}/extras/tokenize/count", {"input": text})
                        n = int(data["count"])
                    n += 8 * len(messages)
                if not isinstance(n, int):
                    raise TypeError("no count")
            except (openai.OpenAIError, ValueError, TypeError, KeyError, AttributeError):
                continue  # this server has no such tokenizer endpoint: try the next, then estimate
            with _CTX_LOCK:
                _CTX_INFO.setdefault(key, {})["tokenize"] = k
            return int(n), f"tokenizer ({k})"
        with _CTX_LOCK:
            _CTX_INFO.setdefault(key, {})["tokenize"] = _NO_TOKENIZER
        return estimate_tokens(messages, tools), "estimate"

    async def prompt_budget(self, max_tokens: int | None = None) -> int | None:
        """Prompt tokens a request may use (context - max_tokens); None when the context is unknown."""
        ctx = await self.context_window()
        if ctx is None:
            return None
        return ctx - int(max_tokens if max_tokens is not None else self.config.max_tokens or 0)

    def _render(self, protocol: str) -> Any:
        default_compact = self.config.compact_tools if self.config.compact_tools is not None else self._embedded

        def render(msgs: list[dict], tls: Any, compact: bool) -> tuple[list[dict], Any]:
            if protocol == "hermes":
                # "minimal" is the smallest rendering: fitting (compact=True) never grows it
                mode = default_compact if default_compact == "minimal" else (compact or default_compact)
                wm = to_hermes_messages(msgs, tls, fewshot=self.fewshot, compact=mode)
                if tls and self.config.constrain_tool_calls == "json_schema":
                    wm = json_reply_instruction(wm)
                return wm, None
            if compact and tls:
                tls = [{"type": "function", "function": compact_tool(t)} for t in tls]
            return _normalize_native(msgs), tls

        return render

    async def _fit(self, messages, tools, send, protocol, ctx: int | None):
        """(wire messages, wire tools, notes): the request fitted to the context (when known)."""
        render = self._render(protocol)
        if ctx is None:
            wm, wt = render(messages, tools, False)
            return wm, wt, []
        fitted = await fit_request(messages, tools, max_tokens=send.get("max_tokens"), context_tokens=ctx,
                                   render=render, count=self.count_tokens, endpoint=self.endpoint)
        if fitted.notes:
            for note in fitted.notes:  # counted by kind ("tools compacted", "max_tokens lowered" ...)
                kind = re.match(r"[A-Za-z_ ]*[A-Za-z]", note)
                note_fallback("context: " + (kind.group(0) if kind else note))
            if fitted.max_tokens is not None:
                send["max_tokens"] = fitted.max_tokens
        wm, wt = render(fitted.messages, fitted.tools, fitted.compact)
        return wm, wt, fitted.notes

    async def _chat_http(self, messages, tools, send, model, protocol, timeout) -> ChatResult:
        ctx = await self.context_window()
        learned = False
        while True:
            try:
                return await self._chat_http_once(messages, tools, dict(send), model, protocol, timeout, ctx)
            except LLMError as exc:
                is_ctx, n = parse_context_error(exc.status, str(exc))
                if not is_ctx or learned:
                    raise
                if n is None or (ctx is not None and n >= ctx):
                    raise ContextOverflow(f"{exc} (the server's context is exceeded; set context_tokens to "
                                          f"its size so prompts are fitted before sending)",
                                          endpoint=self.endpoint) from exc
                # the server named its context: remember it, fit the request, send it once more
                self._learn_context(n)
                ctx, learned = n, True

    async def _chat_http_once(self, messages, tools, send, model, protocol, timeout, ctx) -> ChatResult:
        wire_messages, wire_tools, notes = await self._fit(messages, tools, send, protocol, ctx)
        res = await self._chat_http_send(wire_messages, wire_tools, send, model, protocol, timeout, tools)
        if notes:
            res.context = notes
        return res

    async def _chat_http_send(self, wire_messages, wire_tools, send, model, protocol, timeout, tools) -> ChatResult:
        cfg = self.config
        # The request goes through the SDK's generic `post` with the body already built (and, where
        # the SDK takes raw content, already JSON-encoded, the tool schemas' encoding reused from
        # `ToolSchemas`), and the response comes back as the raw httpx.Response: the typed
        # `chat.completions.create` path spent ~0.5 ms per call on its recursive TypedDict
        # transform and on constructing the pydantic response model, which capped rollout
        # throughput. Status errors, timeouts and connection errors are raised by the SDK exactly
        # as for `create` (it is the same request machinery).
        body: dict[str, Any] = {"model": model, "messages": wire_messages}
        body.update(send)
        mode = cfg.constrain_tool_calls
        if mode == "strict" and wire_tools:
            wire_tools = strict_tools(wire_tools)
        elif protocol == "hermes":
            body.update(request_extras(mode, tools, embedded=self._embedded))
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
            wait = llm_wait_begin()
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
            except openai.APITimeoutError:
                status, message, retryable = "timeout", f"no response within {timeout}s", True
            except openai.APIConnectionError as exc:
                cause = exc.__cause__ or exc
                status, message, retryable = "connection error", f"{type(cause).__name__}: {cause}", True
            except openai.OpenAIError as exc:  # response validation and other SDK errors
                status, message, retryable = type(exc).__name__, str(exc)[:500], False
            finally:
                llm_wait_end(wait)
            if not retryable:
                raise LLMError(f"LLM request to {self.endpoint} failed: HTTP {status}: {message}",
                               endpoint=self.endpoint, status=status, attempts=attempts)
            if attempt >= cfg.max_retries:
                break
            self.meter.record_retry()
            if status in ("timeout", "connection error"):  # slow ones are said; 429/5xx storms are counted only
                log(f"LLM request to {self.endpoint}: {status} ({message[:120]}); retry {attempt + 1}/{cfg.max_retries}")
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
                if self.config.constrain_tool_calls == "strict" and None in args.values():
                    raw = json.dumps(drop_strict_nulls(name, args, tools), ensure_ascii=False)
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
        if tools and self.config.constrain_tool_calls == "json_schema":
            content = unwrap_json_reply(content)
        if tools and (protocol == "hermes" or (
                self.config.tool_protocol == "auto" and not calls and looks_like_tool_call(content))):
            content, parsed, err = parse_tool_calls(content)
            calls.extend(parsed)
            text_calls = bool(parsed)
            if err:
                errors.append(err)
        note = unoffered_note(self.config.constrain_tool_calls, calls, tools)
        if note:
            errors.append(note)
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
        extras = request_extras(self.config.constrain_tool_calls, tools, embedded=False)
        if "structured_outputs" in extras:
            send = {**send, "structured_outputs": extras["structured_outputs"]}
        elif "response_format" in extras:
            send = {**send, "structured_outputs": {"json": extras["response_format"]["json_schema"]["schema"]}}
        try:
            text, pt, ct, finish = await self._vllm.generate(wire, tools, send)
        except Exception as exc:
            raise LLMError(f"in-process vLLM failed: {type(exc).__name__}: {exc}",
                           endpoint=VLLM_INPROCESS, status="error", attempts=1) from exc
        if tools and self.config.constrain_tool_calls == "json_schema":
            text = unwrap_json_reply(text)
        content, calls, err = parse_tool_calls(text) if tools else (text, [], None)
        note = unoffered_note(self.config.constrain_tool_calls, calls, tools)
        if note:
            err = "; ".join(x for x in (err, note) if x)
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
