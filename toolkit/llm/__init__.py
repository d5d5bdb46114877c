"""LLM access for every role in the toolkit: one async client over `openai.AsyncOpenAI`.

    from toolkit.llm import LLMConfig, get_client
    client = get_client(LLMConfig(base_url="http://localhost:8000/v1", model="Qwen/Qwen3-8B"))
    result = await client.chat(messages, tools=tools)
    result.message        # OpenAI assistant message dict (content, tool_calls)
    result.provenance()   # tokens, cost, cached, latency for the record

See docs/llm.md for backends (OpenAI-compatible endpoint, embedded llama.cpp, in-process vLLM),
the request cache and cost accounting.
"""

from .base import EMBEDDED, VLLM_INPROCESS, ChatResult, LLMConfig, LLMError, Meter, llm_config
from .client import LLMClient, close_all_clients, get_client
from .toolcalls import parse_tool_calls, render_tools_hermes, repair_json, to_hermes_messages

__all__ = ["LLMConfig", "llm_config", "ChatResult", "Meter", "LLMClient", "LLMError", "get_client",
           "close_all_clients", "EMBEDDED", "VLLM_INPROCESS", "parse_tool_calls",
           "render_tools_hermes", "repair_json", "to_hermes_messages"]
