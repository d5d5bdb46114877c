"""ask_structured: retries change the request itself (seed and temperature) and say what changed;
reasoning models' <think> blocks never reach a parser. Against the loopback scripted server."""

import asyncio

from toolkit.llm import LLMClient, LLMConfig
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.reply import extract_json_object, strip_think
from toolkit.roles.structured import (
    ask_structured,
    parse_json_object,
    parse_tagged_json,
    tagged_text,
)

MSGS = [{"role": "user", "content": "Reply with a JSON object with key a."}]


def ask(srv, parse, **kw):
    async def go():
        client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", timeout=10))
        try:
            return await ask_structured(client, MSGS, parse, role="planner", **kw)
        finally:
            await client.aclose()
    return asyncio.run(go())


def test_second_attempt_sends_a_different_request_and_logs_the_change(capsys):
    with ScriptedServer(["not json at all", '{"a": 1}']) as srv:
        got = ask(srv, lambda t: parse_json_object(t, ("a",)))
        assert got.value == {"a": 1} and got.attempts == 2
        first, second = srv.requests[0], srv.requests[1]
        assert first["messages"] == second["messages"]
        assert first.get("seed") in (None, 0) and second["seed"] == 1
        assert first["temperature"] == 0.0 and second["temperature"] == 0.3
    err = capsys.readouterr().err
    assert "planner: attempt 2/3 after a malformed reply" in err
    assert "seed 1" in err and "temperature 0 -> 0.3" in err


def test_retries_keep_a_high_temperature_and_step_the_configured_seed():
    with ScriptedServer(["x", "y", '{"a": 2}']) as srv:
        async def go():
            client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", timeout=10, seed=40, temperature=1.0))
            try:
                return await ask_structured(client, MSGS, lambda t: parse_json_object(t, ("a",)))
            finally:
                await client.aclose()
        asyncio.run(go())
        assert [r["seed"] for r in srv.requests] == [40, 41, 42]
        assert [r["temperature"] for r in srv.requests] == [1.0, 1.0, 1.0]


def test_think_blocks_are_stripped_before_every_structured_parse():
    reply = '<think>The user wants {"a": "wrong"} maybe; <plan>no</plan></think>\n{"a": 3}'
    with ScriptedServer([reply]) as srv:
        got = ask(srv, lambda t: parse_json_object(t, ("a",)))
    assert got.value == {"a": 3} and got.attempts == 1
    # the parsers used outside ask_structured too
    assert extract_json_object(reply) == {"a": 3}
    assert tagged_text("<think>draft <plan>[1]</plan></think><plan>[2]</plan>", "plan") == "[2]"
    assert parse_tagged_json("<think>hmm</think>\n<intent>{\"x\": 1}</intent>", "intent") == {"x": 1}
    # a reply that starts inside a think block opened by the chat template, and one cut while thinking
    assert strip_think('reasoning about {"a": 0}</think>{"a": 4}') == '{"a": 4}'
    assert strip_think('{"a": 5}\n<think>and then') == '{"a": 5}'
    assert strip_think("no tags") == "no tags"
