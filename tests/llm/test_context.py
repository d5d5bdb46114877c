"""Prompts fitted to the model's context (toolkit.llm.context) against the loopback scripted server
reporting a small context: tools compacted, max_tokens lowered, history truncated with a notice,
a context learned from the server's 400, and a reasoned rejection when nothing fits."""

import asyncio
import json

import pytest

from toolkit.llm import LLMClient, LLMConfig
from toolkit.llm.context import ContextOverflow, estimate_tokens, parse_context_error
from toolkit.llm.testserver import ScriptedServer


def big_tools(n=20, desc_words=120):
    """n tools with long descriptions and several parameters: ~1.4k characters each in full."""
    out = []
    for i in range(n):
        out.append({"type": "function", "function": {
            "name": f"tool_{i}", "description": "Look something up. " + " ".join(["detail"] * desc_words),
            "parameters": {"type": "object", "properties": {
                f"p{j}": {"type": "string", "description": "a parameter " + "x" * 40} for j in range(4)},
                "required": ["p0"]}}})
    return out


def client_for(srv, **kw):
    base = {"base_url": srv.base_url, "model": "m", "timeout": 10, "backoff_base": 0.01, "backoff_max": 0.02,
            "max_retries": 1}
    base.update(kw)
    return LLMClient(LLMConfig(**base))


def chat(client, *a, **kw):
    async def go():
        try:
            return await client.chat(*a, **kw)
        finally:
            await client.aclose()
    return asyncio.run(go())


def test_parse_context_error_messages():
    vllm = ("This model's maximum context length is 8192 tokens. However, you requested 16845 tokens "
            "(16333 in the messages, 512 in the completion).")
    assert parse_context_error(400, vllm) == (True, 8192)
    assert parse_context_error(400, "Requested tokens (16333) exceed context window of 8192") == (True, 8192)
    assert parse_context_error(500, vllm) == (False, None)
    assert parse_context_error(400, "invalid tool_choice") == (False, None)


def test_small_request_is_sent_unchanged_and_without_counting():
    with ScriptedServer(["ok"], context_tokens=4096) as srv:
        res = chat(client_for(srv), [{"role": "user", "content": "hi"}], max_tokens=100)
        assert res.content == "ok" and res.context is None
        assert srv.tokenize_count == 0  # the estimate alone showed it fits
        assert srv.requests[0]["max_tokens"] == 100


def test_tools_are_compacted_when_the_full_schemas_do_not_fit():
    tools = big_tools()
    full = len(json.dumps(tools))
    assert full > 25000  # ~6.5k server tokens: over a 4096 context
    with ScriptedServer(["ok"], context_tokens=4096) as srv:
        res = chat(client_for(srv), [{"role": "user", "content": "use a tool"}], tools=tools, max_tokens=256)
        assert res.content == "ok"
        sent = srv.requests[0]["tools"]
        assert len(sent) == 20 and len(json.dumps(sent)) < full / 3
        assert sent[0]["function"]["description"] == "Look something up."  # first sentence only
        assert srv.context_errors == 0
        assert res.context and res.context[0].startswith("tools compacted")
        assert res.provenance()["context"] == res.context


def test_max_tokens_is_lowered_to_what_the_context_leaves():
    prompt = "word " * 2400  # 12000 bytes = 3000 server tokens (+4)
    with ScriptedServer(["ok"], context_tokens=4096) as srv:
        res = chat(client_for(srv), [{"role": "user", "content": prompt}], max_tokens=2048)
        sent = srv.requests[0]["max_tokens"]
        need = srv.count_prompt(srv.requests[0])
        assert sent < 2048 and need + sent <= 4096 and sent >= 512  # the floor: a quarter of 2048
        assert any(n.startswith("max_tokens lowered 2048") for n in res.context)


def test_fallback_kinds_are_counted_without_their_numbers():
    from toolkit.io.summary import _ACTIVE, Summary

    s = Summary(command="t")
    _ACTIVE.append(s)
    try:
        with ScriptedServer(["ok"], context_tokens=4096) as srv:
            for n in (2400, 2500):  # two prompts, two different lowered budgets
                chat(client_for(srv), [{"role": "user", "content": "word " * n}], max_tokens=2048)
    finally:
        _ACTIVE.remove(s)
    assert s.fallback_reasons == {"context: max_tokens lowered": 2}


def test_history_is_truncated_with_a_recorded_notice():
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "TASK: book a flight"}]
    for i in range(40):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": i})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i} " + "r" * 400})
    msgs.append({"role": "user", "content": "LAST: and now?"})
    with ScriptedServer(["ok"], context_tokens=2048) as srv:
        res = chat(client_for(srv), msgs, max_tokens=256)
        sent = srv.requests[0]["messages"]
        assert srv.context_errors == 0 and srv.count_prompt(srv.requests[0]) + 256 <= 2048
        assert sent[0]["role"] == "system" and "left out to fit the model's 2048-token context" in sent[0]["content"]
        assert sent[1]["content"] == "TASK: book a flight" and sent[-1]["content"] == "LAST: and now?"
        assert len(sent) < len(msgs)
        # every kept tool result still follows its call
        ids = [tc["id"] for m in sent for tc in (m.get("tool_calls") or [])]
        assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids
        # the most recent exchanges are the ones kept
        assert sent[-2]["content"].startswith("result 39 ")
        assert any(n.startswith("history truncated") for n in res.context)


def test_one_message_that_cannot_fit_is_rejected_with_the_counts_and_never_sent():
    with ScriptedServer(["ok"], context_tokens=1024) as srv:
        with pytest.raises(ContextOverflow) as ei:
            chat(client_for(srv), [{"role": "user", "content": "x " * 4000}], max_tokens=256)
        msg = str(ei.value)
        assert "does not fit the model's context" in msg and "> 1024" in msg
        assert ei.value.status == "context"
        assert srv.chat_count == 0


def test_context_learned_from_the_servers_400_then_fitted_and_resent():
    tools = big_tools()
    with ScriptedServer(["ok"], context_tokens=4096, advertise_context=False) as srv:
        res = chat(client_for(srv), [{"role": "user", "content": "use a tool"}], tools=tools, max_tokens=256)
        assert res.content == "ok"
        assert srv.context_errors == 1 and srv.chat_count == 2  # one 400, then the fitted request
        assert len(json.dumps(srv.requests[1]["tools"])) < len(json.dumps(srv.requests[0]["tools"]))


def test_operator_context_option_and_the_estimate_without_a_tokenizer():
    # the server does not advertise its context and has no /tokenize: context_tokens says it
    prompt = "word " * 2000  # 10000 bytes: 2500 server tokens, ~3.3k estimated
    with ScriptedServer(["ok"], context_tokens=4096, advertise_context=False, tokenize=False) as srv:
        res = chat(client_for(srv, context_tokens=4096), [{"role": "user", "content": prompt}], max_tokens=1024)
        assert srv.context_errors == 0 and srv.tokenize_count == 0
        est = estimate_tokens([{"role": "user", "content": prompt}])
        assert srv.requests[0]["max_tokens"] == 4096 - est  # the conservative estimate decided
        assert res.context


def test_fallbacks_are_counted_in_the_summary_and_the_records_provenance():
    from toolkit.io import add_provenance, begin_record_notes
    from toolkit.io.summary import _ACTIVE, Summary
    from toolkit.schema import Record

    s = Summary(command="t")
    _ACTIVE.append(s)
    try:
        begin_record_notes()
        with ScriptedServer(["ok"], context_tokens=4096) as srv:
            chat(client_for(srv), [{"role": "user", "content": "t"}], tools=big_tools(), max_tokens=256)
        rec = add_provenance(Record(id="r1"), "t")
    finally:
        _ACTIVE.remove(s)
    assert s.fallback_reasons == {"context: tools compacted": 1}
    assert "fallbacks 1 (context: tools compacted: 1)" in s.line()
    assert s.as_dict()["fallback_reasons"] == {"context: tools compacted": 1}
    assert rec.provenance[-1].fallbacks == ["context: tools compacted"]


def test_concurrent_chats_ask_the_server_for_its_context_once():
    with ScriptedServer(["ok"], delay=0.05, context_tokens=4096) as srv:
        client = client_for(srv, concurrency=64)

        async def go():
            try:
                return await asyncio.gather(*[client.chat([{"role": "user", "content": str(i)}]) for i in range(64)])
            finally:
                await client.aclose()

        asyncio.run(go())
        assert srv.chat_count == 64
        assert srv.request_count - srv.chat_count == 1  # one GET /models (it names max_model_len: no /props)
