"""The python environment backend: generated tool code runs only inside the sandbox."""

from __future__ import annotations

import asyncio
import json

import pytest

from toolkit.envs import load_env
from toolkit.envs.base import backends
from toolkit.envs.python import PythonEnvError, PythonEnvironment, validate_arguments

TOOLS = [
    {"type": "function", "function": {
        "name": "increment", "description": "Add `by` to a named counter.",
        "parameters": {"type": "object",
                       "properties": {"name": {"type": "string"}, "by": {"type": "integer"}},
                       "required": ["name"]}}},
    {"type": "function", "function": {
        "name": "get", "description": "Read a key of the kv store.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                       "required": ["key"]}}},
    {"type": "function", "function": {
        "name": "put", "description": "Write a key of the kv store (values are strings).",
        "parameters": {"type": "object",
                       "properties": {"key": {"type": "string"}, "value": {"type": "string"},
                                      "mode": {"type": "string", "enum": ["set", "append"]}},
                       "required": ["key", "value"]}}},
    {"name": "spin", "description": "Never returns.",  # bare (non-wrapped) schema is accepted
     "parameters": {"type": "object", "properties": {}}},
    {"name": "withdraw", "parameters": {"type": "object",
                                         "properties": {"amount": {"type": "number"}},
                                         "required": ["amount"]}},
]

SOURCE = '''
class InsufficientFunds(Exception):
    hint = "check the balance first"

class PolicyViolation(Exception):
    violated_rule = "R1"

def increment(state, name, by=1):
    counters = dict(state.get("counters", {}))
    counters[name] = counters.get(name, 0) + by
    return {"name": name, "value": counters[name]}, {**state, "counters": counters}

def get(state, key):
    return state["kv"][key], state

def put(state, key, value, mode="set"):
    if key.startswith("sys."):
        raise PolicyViolation("keys under sys. are read-only")
    kv = state.setdefault("kv", {})
    kv[key] = kv.get(key, "") + value if mode == "append" else value
    return "ok"          # bare result: the in-place mutation of `state` is kept

def spin(state):
    while True:
        pass

def withdraw(state, amount):
    if amount > state.get("balance", 0):
        raise InsufficientFunds(f"balance {state.get('balance', 0)} < {amount}")
    return state["balance"] - amount, {**state, "balance": state["balance"] - amount}
'''

STATE = {"counters": {"a": 1}, "kv": {"greeting": "hi"}, "balance": 10}


@pytest.fixture
def env():
    return load_env({"backend": "python",
                     "config": {"tools": TOOLS, "source": SOURCE, "policy": "Be nice.",
                                "limits": {"wall_seconds": 1, "cpu_seconds": 1}},
                     "state": STATE})


def test_registered_and_loaded(env):
    assert "python" in backends()
    assert isinstance(env, PythonEnvironment) and env.backend == "python"
    assert env.policy() == "Be nice."
    names = [t["function"]["name"] for t in env.tools()]
    assert names == ["increment", "get", "put", "spin", "withdraw"]
    assert all(t["type"] == "function" for t in env.tools())
    assert env.tools("user") == []
    assert env.snapshot() == STATE


def test_call_updates_state(env):
    h0 = env.state_hash()
    r = env.call("increment", {"name": "a", "by": 4})
    assert r.ok and r.content == {"name": "a", "value": 5}
    r = env.call("increment", {"name": "b"})
    assert r.ok and r.content["value"] == 1
    assert env.snapshot()["counters"] == {"a": 5, "b": 1}
    r = env.call("put", {"key": "greeting", "value": "!", "mode": "append"})
    assert r.ok and r.content == "ok"
    assert env.call("get", {"key": "greeting"}).content == "hi!"
    assert env.state_hash() != h0
    env.reset()
    assert env.snapshot() == STATE and env.state_hash() == h0
    env.reset({"kv": {}})
    assert env.snapshot() == {"kv": {}}


def test_errors_are_structured(env):
    before = env.snapshot()
    r = env.call("nope", {})
    assert not r.ok and r.error["code"] == "UNKNOWN_TOOL" and "increment" in r.error["hint"]
    r = env.call("increment", {"by": 2})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "name" in r.error["message"]
    r = env.call("increment", {"name": "a", "by": "two"})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "integer" in r.error["message"]
    r = env.call("increment", {"name": "a", "bogus": 1})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "bogus" in r.error["message"]
    r = env.call("put", {"key": "k", "value": "v", "mode": "weird"})
    assert r.error["code"] == "INVALID_ARGUMENTS"
    r = env.call("get", {"key": "missing"})  # KeyError inside the tool
    assert r.error["code"] == "TOOL_ERROR" and r.error["message"].startswith("KeyError")
    r = env.call("withdraw", {"amount": 100})  # user-defined exception -> its class name
    assert r.error["code"] == "InsufficientFunds"
    assert r.error["message"] == "balance 10 < 100" and r.error["hint"] == "check the balance first"
    r = env.call("put", {"key": "sys.x", "value": "v"})
    assert r.error["code"] == "POLICY_VIOLATION" and r.error["violated_rule"] == "R1"
    assert r.is_policy_violation
    assert json.loads(r.to_content())["error"]["code"] == "POLICY_VIOLATION"
    assert env.snapshot() == before  # failed calls never change the state
    assert env.call("withdraw", {"amount": 4}).content == 6


def test_infinite_loop_tool_times_out_and_env_keeps_working(env):
    before = env.snapshot()
    r = env.call("spin", {})
    assert not r.ok and r.error["code"] == "TIMEOUT"
    assert "did not finish" in r.error["message"]
    assert env.snapshot() == before
    assert env.call("increment", {"name": "a"}).content["value"] == 2


def test_tool_code_is_sandboxed():
    src = ("import os, socket\n"
           "def probe(state):\n"
           "    out = {'env': 'OPENAI_API_KEY' in os.environ}\n"
           "    try:\n        open('/tmp/pwned_by_tool', 'w').write('x'); out['write'] = True\n"
           "    except OSError:\n        out['write'] = False\n"
           "    try:\n        socket.create_connection(('127.0.0.1', 22), timeout=1); out['net'] = True\n"
           "    except OSError:\n        out['net'] = False\n"
           "    return out, state\n")
    env = PythonEnvironment(tools=[{"name": "probe", "parameters": {"type": "object"}}], source=src)
    r = env.call("probe", {})
    assert r.ok and r.content == {"env": False, "write": False, "net": False}


def test_async_call(env):
    r = asyncio.run(env.acall("increment", {"name": "z", "by": 3}))
    assert r.ok and r.content["value"] == 3


def test_load_from_directory_and_json_file(tmp_path):
    d = tmp_path / "counter_env"
    d.mkdir()
    (d / "tools.json").write_text(json.dumps(TOOLS[:2]))
    (d / "tools.py").write_text(SOURCE)
    (d / "policy.md").write_text("# Policy\nCount carefully.")
    (d / "state.json").write_text(json.dumps({"counters": {}}))
    env = load_env({"backend": "python", "path": str(d)})
    assert env.policy().startswith("# Policy")
    assert env.call("increment", {"name": "x", "by": 2}).content == {"name": "x", "value": 2}
    # explicit state overrides state.json
    env2 = load_env({"backend": "python", "path": str(d), "state": {"counters": {"x": 40}}})
    assert env2.call("increment", {"name": "x", "by": 2}).content["value"] == 42
    f = tmp_path / "env.json"
    f.write_text(json.dumps({"tools": TOOLS[:1], "source": SOURCE, "policy": "p",
                             "state": {"counters": {}}}))
    env3 = load_env({"backend": "python", "path": str(f)})
    assert env3.call("increment", {"name": "q"}).content == {"name": "q", "value": 1}


def test_bad_definitions_rejected_at_load():
    with pytest.raises(PythonEnvError):
        PythonEnvironment(tools=TOOLS, source="def broken(:\n")
    with pytest.raises(PythonEnvError):
        load_env({"backend": "python", "config": {"tools": TOOLS}})
    with pytest.raises(PythonEnvError):
        PythonEnvironment(tools=[{"name": "not valid"}], source="")
    env = PythonEnvironment(tools=[{"name": "ghost", "parameters": {"type": "object"}}],
                            source="x = 1\n")
    assert env.call("ghost", {}).error["code"] == "UNKNOWN_TOOL"


def test_validate_arguments():
    schema = TOOLS[0]["function"]["parameters"]
    assert validate_arguments(schema, {"name": "a"}) is None
    assert validate_arguments(schema, {"name": "a", "by": 2.0}) is None
    assert "missing" in validate_arguments(schema, {})
    assert "integer" in validate_arguments(schema, {"name": "a", "by": True})
    assert "object" in validate_arguments(schema, ["a"])
    assert validate_arguments({"type": "object", "properties": {"a": {}},
                               "additionalProperties": True}, {"b": 1}) is None


def test_error_values_are_failed_steps():
    """error_values: a returned {"error": ...} (BFCL's style) is a failed step, the state unchanged;
    without it, the same return is a success."""
    src = ("def withdraw(state, amount):\n"
           "    if amount > state['balance']:\n"
           "        return {'error': 'insufficient funds'}\n"
           "    state['balance'] -= amount\n"
           "    return {'balance': state['balance']}\n")
    tools = [{"type": "function", "function": {"name": "withdraw", "description": "Withdraw money.",
                                               "parameters": {"type": "object",
                                                              "properties": {"amount": {"type": "integer"}},
                                                              "required": ["amount"]}}}]
    ref = {"backend": "python", "config": {"tools": tools, "source": src, "error_values": True},
           "state": {"balance": 10}}
    with load_env(ref) as env:
        env.reset()
        r = env.call("withdraw", {"amount": 50})
        assert not r.ok and r.error["code"] == "TOOL_ERROR" and r.error["message"] == "insufficient funds"
        assert env.snapshot() == {"balance": 10}
        assert env.call("withdraw", {"amount": 4}).ok and env.snapshot() == {"balance": 6}
    plain = dict(ref, config=dict(ref["config"], error_values=False))
    with load_env(plain) as env:
        env.reset()
        r = env.call("withdraw", {"amount": 50})
        assert r.ok and r.content == {"error": "insufficient funds"}


def test_validate_types_false_checks_names_only():
    src = "def close(state, ticket_id):\n    state['closed'] = ticket_id\n    return 'closed'\n"
    tools = [{"type": "function", "function": {"name": "close", "description": "Close a ticket.", "parameters": {
        "type": "object", "properties": {"ticket_id": {"type": "integer"}}, "required": ["ticket_id"]}}}]
    ref = {"backend": "python", "config": {"tools": tools, "source": src}, "state": {}}
    with load_env(ref) as env:
        env.reset()
        assert env.call("close", {"ticket_id": "t1"}).error["code"] == "INVALID_ARGUMENTS"
    ref["config"]["validate_types"] = False
    with load_env(ref) as env:
        env.reset()
        assert env.call("close", {"ticket_id": "t1"}).ok and env.snapshot() == {"closed": "t1"}
        assert env.call("close", {}).error["code"] == "INVALID_ARGUMENTS"  # names are still checked
        assert env.call("close", {"ticket_id": 1, "x": 2}).error["code"] == "INVALID_ARGUMENTS"
