"""LLM access for every role in the toolkit: one async client over `openai.AsyncOpenAI`.

    from toolkit.llm import LLMConfig, get_client
    client = get_client(LLMConfig(base_url="http://localhost:8000/v1", model="Qwen/Qwen3-8B"))
    result = await client.chat(messages, tools=tools)
    result.message        # OpenAI assistant message dict (content, tool_calls)
    result.provenance()   # tokens, cost, cached, latency for the record

See docs/llm.md for backends (OpenAI-compatible endpoint, embedded llama.cpp, in-process vLLM),
the request cache and cost accounting.
"""

import importlib
from typing import TYPE_CHECKING, Any

# The names below resolve on first use (PEP 562): `from toolkit.llm import LLMError` loads
# base.py, not the client and its transport, so a command that only catches LLM errors (gen-task
# --strategy logigen without an LLM) does not pay for them at start-up.
_LAZY = {"EMBEDDED": "base", "VLLM_INPROCESS": "base", "ChatResult": "base", "LLMConfig": "base",
         "LLMError": "base", "Meter": "base", "llm_config": "base",
         "LLMClient": "client", "close_all_clients": "client", "get_client": "client",
         "parse_tool_calls": "toolcalls", "render_tools_hermes": "toolcalls", "repair_json": "toolcalls",
         "to_hermes_messages": "toolcalls"}

__all__ = ["LLMConfig", "llm_config", "ChatResult", "Meter", "LLMClient", "LLMError", "get_client",
           "close_all_clients", "EMBEDDED", "VLLM_INPROCESS", "parse_tool_calls",
           "render_tools_hermes", "repair_json", "to_hermes_messages"]

if TYPE_CHECKING:
    from .base import EMBEDDED, VLLM_INPROCESS, ChatResult, LLMConfig, LLMError, Meter, llm_config  # noqa: F401
    from .client import LLMClient, close_all_clients, get_client  # noqa: F401
    from .toolcalls import parse_tool_calls, render_tools_hermes, repair_json, to_hermes_messages  # noqa: F401


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'toolkit.llm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"toolkit.llm.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
