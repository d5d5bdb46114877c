"""The LLM client's value types: `LLMConfig` (one per role), `ChatResult`, the `Meter` of tokens and
cost, `LLMError`, and the backend names."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from toolkit.llm.embedded import slot_for_role



EMBEDDED = "embedded"
VLLM_INPROCESS = "vllm-inprocess"
EMBEDDED_MAX_CONCURRENCY = 1  # llama.cpp's server runs one completion at a time

class LLMError(RuntimeError):
    """A chat request failed for good (non-retryable status, or retries exhausted)."""

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | str | None = None,
                 attempts: int = 0):
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts


class LLMConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), defer_build=True)  # built on first use

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
    compact_tools: bool | str | None = None  # small-context tool rendering in hermes prompts (True/"compact", "minimal"); None -> embedded only
    hermes_fewshot: bool | None = None  # example tool-call exchange in hermes prompts; None -> embedded only
    context_tokens: int | None = None  # the model's context; None -> asked of the server (toolkit.llm.context)
    constrain_tool_calls: str = "off"  # off | grammar | json_schema | strict (toolkit.llm.constrain)
    embedded_slot: str | None = None  # embedded server slot (TOOLKIT_EMBEDDED_SLOTS=role: the role's own server)


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
    context: list[str] | None = None  # what was done to fit the context (toolkit.llm.context)
    constrained: str | None = None  # the constrain_tool_calls mode this call was decoded under

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
                "latency_s": round(self.latency_s, 4), "finish_reason": self.finish_reason,
                **({"context": list(self.context)} if self.context else {}),
                **({"constrained": self.constrained} if self.constrained else {})}


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
# The client


def llm_config(opts: Any, role: str | None = None):
    """Build an LLMConfig for a role ("agent", "user", "judge", "env" ...) from a command's typed
    options (toolkit.options) or, for library callers, a mapping of the same keys.

    Role-prefixed keys (agent_model, agent_base_url, agent_temperature ...) override the plain
    ones (model, base_url, temperature ...).
    """
    if isinstance(opts, Mapping):
        value = opts.get
    else:
        extra = getattr(opts, "__pydantic_extra__", None) or {}

        def value(key: str) -> Any:
            return getattr(opts, key, None) if key not in extra else extra[key]
    fields = LLMConfig.model_fields
    vals: dict[str, Any] = {}
    for name in fields:
        if value(name) is not None:
            vals[name] = value(name)
        if role and value(f"{role}_{name}") is not None:
            vals[name] = value(f"{role}_{name}")
    if "embedded_slot" not in vals:
        vals["embedded_slot"] = slot_for_role(role)
    return LLMConfig(**vals)
