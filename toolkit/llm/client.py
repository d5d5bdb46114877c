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
import threading
import time
from typing import Any


from .base import EMBEDDED, EMBEDDED_MAX_CONCURRENCY, VLLM_INPROCESS, ChatResult, LLMConfig, LLMError, Meter
from .cache import cache_key, open_cache
from .transport import (
    _ENDPOINTS,
    _ENDPOINTS_LOCK,
    _encode_body,
    _endpoint,
    _Endpoint,
    _error_message,
    _estimate_tokens,
    _http,
    _json_payload,
    _normalize_native,
    _post_takes_content,
    _retry_after,
)
from .vllm_inproc import _VLLMInProcess
from .embedded import embedded_model_name
from .toolcalls import looks_like_tool_call, new_call_id, parse_tool_calls, repair_json, to_hermes_messages

__all__ = ["LLMClient", "get_client", "close_all_clients"]

# Arguments `chat.completions.create` takes as keywords; anything else goes into extra_body
# (e.g. vLLM's top_k, repetition_penalty, chat_template_kwargs).
_SDK_PARAMS = {"temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stop",
               "response_format", "tool_choice", "parallel_tool_calls", "presence_penalty",
               "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "user", "n",
               "reasoning_effort", "metadata", "service_tier", "store"}
_NOT_SAMPLING = {"timeout", "sample_index"}


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
