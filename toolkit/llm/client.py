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
from .embedded import EMBEDDED_MODEL_NAME
from .toolcalls import looks_like_tool_call, new_call_id, parse_tool_calls, repair_json, to_hermes_messages

__all__ = ["LLMConfig", "ChatResult", "Meter", "LLMClient", "LLMError", "get_client",
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
# Per-endpoint transport: one AsyncOpenAI + one semaphore per (endpoint, event loop)


class _Endpoint:
    def __init__(self, base_url: str, api_key: str, concurrency: int):
        self.base_url = base_url
        self.api_key = api_key
        self.concurrency = max(1, int(concurrency))
        self._per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # httpcore's pool scans every connection for every waiting request (O(conns x waiting)); at
    # hundreds of concurrent requests that scan dominated the CPU (measured: 4x below the
    # server-bound rate at 256 concurrent episodes). Sharding the connections over several
    # AsyncOpenAI clients of at most SHARD_CONNS connections each keeps every scan small.
    SHARD_CONNS = 16

    def get(self):
        import httpx
        import openai

        loop = asyncio.get_running_loop()
        with self._lock:
            st = self._per_loop.get(loop)
            if st is None:
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
        self._model: str | None = config.model or (EMBEDDED_MODEL_NAME if self._embedded else None)
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
        tools = list(tools) if tools else None
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
        # messages and tools travel in extra_body: the SDK merges it into the JSON body as is,
        # skipping its recursive per-field transform (deep copies + TypedDict walks), which cost
        # ~3 ms per call with a dozen tool schemas and capped rollout throughput.
        kwargs: dict[str, Any] = {"model": model, "messages": []}
        extra_body: dict[str, Any] = {"messages": wire_messages}
        for k, v in send.items():
            if k in _SDK_PARAMS:
                kwargs[k] = v
            else:
                extra_body[k] = v
        if wire_tools:
            extra_body["tools"] = wire_tools
        kwargs["extra_body"] = extra_body

        import openai

        transport = self._transport()
        status: int | str | None = None
        message = ""
        attempts = 0
        for attempt in range(cfg.max_retries + 1):
            attempts = attempt + 1
            retry_after = None
            client, sem = transport.get()
            try:
                async with sem:
                    resp = await client.chat.completions.create(**kwargs, timeout=timeout)
                return self._result_from_response(resp, model, protocol, tools)
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

    def _result_from_response(self, resp: Any, model: str, protocol: str,
                              tools: list[dict] | None) -> ChatResult:
        if not getattr(resp, "choices", None):
            raise LLMError(f"LLM response from {self.endpoint} has no choices",
                           endpoint=self.endpoint, status="invalid response")
        choice = resp.choices[0]
        msg = choice.message
        content = msg.content
        finish = choice.finish_reason
        errors: list[str] = []
        calls: list[dict] = []
        for tc in msg.tool_calls or []:
            fn = getattr(tc, "function", None)
            if fn is None:
                continue
            raw = fn.arguments or "{}"
            try:
                args = json.loads(raw)
                if not isinstance(args, dict):
                    raise ValueError("arguments are not a JSON object")
            except ValueError:
                try:
                    args = repair_json(raw)
                    if not isinstance(args, dict):
                        raise ValueError(f"arguments of {fn.name!r} are not a JSON object")
                except ValueError as exc:
                    errors.append(f"native tool call {fn.name!r}: {exc}")
                    continue
                raw = json.dumps(args, ensure_ascii=False)
            calls.append({"id": tc.id or new_call_id(), "type": "function",
                          "function": {"name": fn.name, "arguments": raw}})
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
        usage = getattr(resp, "usage", None)
        if usage is not None and usage.prompt_tokens is not None:
            u = {"prompt_tokens": int(usage.prompt_tokens or 0),
                 "completion_tokens": int(usage.completion_tokens or 0)}
        else:
            u = {"prompt_tokens": 0, "completion_tokens": _estimate_tokens(msg.content or "")}
        return ChatResult(message=message, usage=u, cost=0.0, cached=False,
                          model=getattr(resp, "model", None) or model, latency_s=0.0,
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
