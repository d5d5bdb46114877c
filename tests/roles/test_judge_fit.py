"""The trajectory judge's prompt fits the judge model's context: the airline domain's tools (35.7k
characters as JSON) and a long history against an 8192-token context (the embedded model's), on
the loopback scripted server that enforces it like vLLM (HTTP 400 past it)."""

import asyncio
import json

from toolkit.envs import load_env
from toolkit.llm import LLMClient, LLMConfig
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.judge import build_prompt, judge_trajectory
from toolkit.schema import EnvRef

VERDICT = json.dumps({
    "validation_summary": {d: {"rating": "Good"} for d in (
        "conversation_quality", "function_correctness", "policy_compliance", "intent_alignment", "data_consistency")},
    "critical_issues": [], "validation_result": "PASS"})


def airline():
    env = load_env(EnvRef(backend="sqlite", id="airline"))
    return env.tools("agent"), env.policy()


def long_history(turns=30):
    msgs = [{"role": "user", "content": "I want to change my reservation ABC123 to business class."}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                     "function": {"name": "get_reservation_details", "arguments": json.dumps({"reservation_id": "ABC123"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": json.dumps({"reservation_id": "ABC123",
                     "flights": [{"flight_number": f"HAT{i:03d}", "date": "2024-05-01"}] * 3, "cabin": "economy"})})
    msgs.append({"role": "assistant", "content": "Your reservation is now in business class."})
    return msgs


def test_airline_judge_prompt_is_over_8k_tokens_in_full():
    tools, policy = airline()
    assert len(json.dumps(tools)) > 35000
    _pid, full = build_prompt("eigendata", policy=policy, task="t", messages=long_history(), tools=tools)
    assert ScriptedServer.count_text(full) > 8192  # what reached the server as a 400 before


def test_judge_reaches_the_model_within_an_8192_context():
    tools, policy = airline()

    async def go(srv):
        client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", max_tokens=512, timeout=10, max_retries=0))
        try:
            return await judge_trajectory(client, "eigendata", policy=policy, task="change cabin",
                                          messages=long_history(), tools=tools, evaluation_rules="be strict")
        finally:
            await client.aclose()

    with ScriptedServer([VERDICT], context_tokens=8192) as srv:
        j = asyncio.run(go(srv))
        assert srv.context_errors == 0 and srv.chat_count == 1
        assert not j.malformed and j.passed
        assert j.scores["prompt_fit"]["level"] >= 1
        sent = srv.requests[0]
        assert srv.count_prompt(sent) + sent["max_tokens"] <= 8192
        prompt = sent["messages"][-1]["content"]
        assert "get_reservation_details" in prompt  # the tools are still named


def test_judge_prompt_unchanged_when_it_fits():
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    _pid, full = build_prompt("eigendata", policy="p", task="t", messages=long_history(1), tools=tools)

    async def go(srv):
        client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", timeout=10))
        try:
            return await judge_trajectory(client, "eigendata", policy="p", task="t", messages=long_history(1), tools=tools)
        finally:
            await client.aclose()

    with ScriptedServer([VERDICT], context_tokens=8192) as srv:
        j = asyncio.run(go(srv))
        assert "prompt_fit" not in j.scores
        assert srv.requests[0]["messages"][-1]["content"] == full
