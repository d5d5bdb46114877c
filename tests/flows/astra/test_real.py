"""ASTRA pipeline A on REAL backends: `toolkit tools import sqlite:airline` / `tau2:retail` → gen-plan astra →
gen-task astra → rollout. The plans and tasks keep the real env reference, so the rollout's tool results
come from the real database (checked against a fresh env answering the same calls), never from the
emulator (a simulator prompt fails the test)."""

import json

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.envs import load_env
from toolkit.llm.testserver import ScriptedServer


def _invoke(cmd, args, stdin, srv=None, recipe=None):
    extra = ["--base-url", srv.base_url, "--model", "scripted"] if srv else []
    if recipe:
        extra += ["--recipe", str(recipe)]
    r = CliRunner().invoke(cmd, [*args, *extra], input=stdin)
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def _tool_results(rec):
    """(name, arguments, content) of every tool call of the first trajectory, in order."""
    msgs = rec["trajectories"][0]["messages"]
    calls = {c["id"]: c["function"] for m in msgs if m.get("tool_calls") for c in m["tool_calls"]}
    return [(calls[m["tool_call_id"]]["name"], json.loads(calls[m["tool_call_id"]]["arguments"]), m["content"])
            for m in msgs if m["role"] == "tool"]


def _pipeline(tmp_path, spec, pair, query, agent_calls):
    """Run import → gen-plan → gen-task → rollout with a scripted LLM; `agent_calls(k, messages)` gives the
    agent's k-th call (name, args) or None for the final answer."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("gen-plan:\n  chain_pairs: 1\n  walks: 4\ngen-task:\n  augment: []\n")

    def reply(req):
        msgs = req["messages"]
        text = msgs[-1]["content"] or ""
        if req.get("tools"):
            k = sum(1 for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
            call = agent_calls(k, msgs)
            return {"tool_calls": [{"name": call[0], "arguments": call[1]}]} if call else "Here is what I found."
        if "Jointly synthesize" in text:
            return json.dumps({"pairs": [pair]})
        if "<ToolInvocationChain>" in text:
            chain = json.loads(text.rsplit("<ToolInvocationChain>", 1)[1].split("</ToolInvocationChain>")[0])
            return json.dumps(query if chain == pair["chain"] else {"valid": False, "query": "", "arguments": []})
        raise AssertionError("unscripted prompt (the emulator must not be asked): " + text[:200])

    server = _invoke(cli.toolkit_group, ["tools", "import", spec], "")
    with ScriptedServer(reply) as srv:
        plans = _invoke(cli.gen_plan, ["--strategy", "astra", "-n", "1", "--seed", "3", "--out-dir",
                                       str(tmp_path / "graphs")], server, srv, recipe)
        tasks = _invoke(cli.gen_task, ["--strategy", "astra"], plans, srv, recipe)
        rolled = _invoke(cli.rollout, ["--max-turns", "6"], tasks, srv)
    plans = [json.loads(x) for x in plans.splitlines()]
    tasks = [json.loads(x) for x in tasks.splitlines()]
    return plans, tasks, [json.loads(x) for x in rolled.splitlines()]


def _same_as_real(env_ref, results):
    env = load_env(env_ref)
    env.reset()
    try:
        for name, args, content in results:
            assert json.loads(content) == json.loads(env.call(name, args).to_content()), name
    finally:
        env.close()


def test_sqlite_airline_chain_rolls_out_on_the_real_database(tmp_path):
    pair = {"task": "Look up reservation 1003 and the status of its flight.",
            "chain": ["query_reservation", "query_flight"]}
    query = {"valid": True, "query": "What is the status of the flight of my reservation 1003?",
             "arguments": [{"tool": "query_reservation", "args": {"reservation_id": 1003}},
                           {"tool": "query_flight", "args": {"flight_id": "$1.flight_id"}}]}

    def agent(k, msgs):
        if k == 0:
            return "query_reservation", {"reservation_id": 1003}
        if k == 1:  # the flight id comes from the real row the first call returned
            row = json.loads(msgs[-1]["content"])["rows"][0]
            return "query_flight", {"flight_id": row["flight_id"]}
        return None

    plans, tasks, out = _pipeline(tmp_path, "sqlite:airline", pair, query, agent)
    assert [p["plan"]["tool_chain"] for p in plans] == [["query_reservation", "query_flight"]]
    assert (plans[0]["env"]["backend"], plans[0]["env"]["id"]) == ("sqlite", "airline")
    assert [t["task"]["instruction"] for t in tasks] == [query["query"]]
    assert tasks[0]["env"]["backend"] == "sqlite"
    (rec,) = out
    results = _tool_results(rec)
    assert [(n, a) for n, a, _ in results] == [("query_reservation", {"reservation_id": 1003}),
                                               ("query_flight", {"flight_id": "HAT201-2024-05-18"})]
    assert json.loads(results[1][2])["rows"][0]["flight_number"] == "HAT201"  # a real row of the bundled db
    _same_as_real({"backend": "sqlite", "id": "airline"}, results)
    assert rec["trajectories"][0]["termination"] == "agent_stop"


@pytest.mark.tau2
def test_tau2_retail_chain_rolls_out_on_the_tau2_env(tmp_path):
    from toolkit.envs.tau2 import tau2_available

    if not tau2_available():
        pytest.skip("tau2 not installed")
    env = load_env({"backend": "tau2", "id": "retail"})
    env.reset()
    order_id = next(iter(env._agent_db().orders))  # a real order of the τ² retail database
    env.close()
    pair = {"task": "Show an order and its customer's details.", "chain": ["get_order_details", "get_user_details"]}
    query = {"valid": True, "query": f"Show me order {order_id} and the details of the customer who placed it.",
             "arguments": [{"tool": "get_order_details", "args": {"order_id": order_id}},
                           {"tool": "get_user_details", "args": {"user_id": "$1.user_id"}}]}

    def agent(k, msgs):
        if k == 0:
            return "get_order_details", {"order_id": order_id}
        if k == 1:
            return "get_user_details", {"user_id": json.loads(msgs[-1]["content"])["user_id"]}
        return None

    plans, tasks, out = _pipeline(tmp_path, "tau2:retail", pair, query, agent)
    assert (plans[0]["env"]["backend"], plans[0]["env"]["id"]) == ("tau2", "retail")
    assert tasks[0]["env"]["backend"] == "tau2" and order_id in tasks[0]["task"]["instruction"]
    results = _tool_results(out[0])
    assert [n for n, _, _ in results] == ["get_order_details", "get_user_details"]
    user = json.loads(results[1][2])
    assert order_id in user["orders"]  # the real τ² database: the customer's orders list this order
    _same_as_real({"backend": "tau2", "id": "retail"}, results)
    assert out[0]["trajectories"][0]["termination"] == "agent_stop"
