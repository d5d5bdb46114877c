"""The LLM environment simulator (toolkit.roles.env_simulator.simulate_call) through ask_structured,
against the loopback scripted server: a malformed reply is retried, the usage counts every request,
and after the last malformed reply the call fails with SIMULATOR_ERROR naming the last problem."""

import asyncio
import json

from toolkit.llm import LLMClient, LLMConfig
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.env_simulator import simulate_call

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "W1"}'}}


def simulate(replies, attempts=3):
    with ScriptedServer(replies) as srv:
        client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", backoff_base=0.01, backoff_max=0.05,
                                     timeout=10))

        async def go():
            try:
                return await simulate_call(client, policy="", tools=TOOLS, history=[], tool_call=CALL,
                                           attempts=attempts)
            finally:
                await client.aclose()

        return asyncio.run(go())


def test_malformed_reply_is_retried_then_observation():
    res, usage = simulate(["no json here", json.dumps({"success": True, "observation": {"status": "shipped"}})])
    assert res.ok and res.content == {"status": "shipped"}
    assert usage["requests"] == 2


def test_tool_error_reply():
    res, usage = simulate([json.dumps({"success": False, "observation": "order W1 not found"})])
    assert not res.ok and res.error["code"] == "TOOL_ERROR" and res.error["message"] == "order W1 not found"
    assert usage["requests"] == 1


def test_every_reply_malformed_gives_simulator_error():
    res, usage = simulate(["no json here", '{"observation": 1}', '{"success": "maybe"}'])
    assert not res.ok and res.error["code"] == "SIMULATOR_ERROR"
    assert res.error["message"] == 'the simulator\'s reply was malformed after 3 attempts: "success" is not a boolean'
    assert usage["requests"] == 3


def test_unknown_tool_spends_no_request():
    bad = dict(CALL, function={"name": "teleport", "arguments": "{}"})
    with ScriptedServer([]) as srv:
        client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", timeout=10))

        async def go():
            try:
                return await simulate_call(client, policy="", tools=TOOLS, history=[], tool_call=bad)
            finally:
                await client.aclose()

        res, usage = asyncio.run(go())
    assert res.error["code"] == "UNKNOWN_TOOL" and usage["requests"] == 0
