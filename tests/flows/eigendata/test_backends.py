"""The flow is backend-neutral: the same strategies on a python environment (ASTRA-style tools
run in the sandbox)."""

import json

from tests.flows.eigendata.util import run_strategy
from toolkit.llm.testserver import ScriptedServer

SOURCE = '''
class PolicyViolation(Exception):
    code = "POLICY_VIOLATION"

def get_account(state, account_id):
    for a in state["accounts"]:
        if a["account_id"] == account_id:
            return a
    raise KeyError(f"no account {account_id}")

def transfer(state, from_id, to_id, amount):
    src = get_account(state, from_id)
    dst = get_account(state, to_id)
    if amount > src["balance"]:
        raise PolicyViolation("insufficient balance")
    src["balance"] -= amount
    dst["balance"] += amount
    return {"ok": True}
'''
TOOLS = [
    {"type": "function", "function": {"name": "get_account", "description": "Read an account.",
                                      "parameters": {"type": "object", "properties": {"account_id": {"type": "string"}},
                                                     "required": ["account_id"]}}},
    {"type": "function", "function": {"name": "transfer", "description": "Move money between accounts.",
                                      "parameters": {"type": "object", "properties": {
                                          "from_id": {"type": "string"}, "to_id": {"type": "string"},
                                          "amount": {"type": "number"}}, "required": ["from_id", "to_id", "amount"]}}},
]
ENV = {"backend": "python", "config": {"tools": TOOLS, "source": SOURCE, "policy": "No overdrafts."},
       "state": {"accounts": [{"account_id": "A1", "balance": 100}, {"account_id": "B2", "balance": 5}]}}
TASK = {"id": "bank-1", "flow": "eigendata", "env": ENV, "task": {
    "instruction": "Move 30 from A1 to B2.",
    "user_scenario": {"known_info": "accounts A1 and B2"},
    "ground_truth": {"must_have_functions": ["get_account", "transfer"],
                     "actions": [{"name": "get_account", "arguments": {"account_id": "A1"}},
                                 {"name": "transfer", "arguments": {"from_id": "A1", "to_id": "B2", "amount": 30}}]}}}


def test_make_verifier_on_python_env():
    out = run_strategy("make-verifier", {"verifier_source": "template"}, TASK, "eigendata")
    st = out.verifier.self_test
    assert st["passed"], st
    got = {c["case"]: c.get("got") for c in st["cases"]}
    assert got == {"reference": "pass", "wrong_id": "fail", "wrong_amount": "fail", "missing_key_call": "fail",
                   "policy_violation": "fail", "unchanged_state": "fail", "no_calls": "fail"}


def test_validate_task_on_python_env_executes_for_real():
    def script(req):
        if not any(m["role"] == "tool" for m in req["messages"]):
            return {"tool_calls": [{"name": "get_account", "arguments": {"account_id": "A1"}}]}
        bal = json.loads(next(m for m in req["messages"] if m["role"] == "tool")["content"])["balance"]
        status = "FEASIBLE" if bal >= 30 else "INFEASIBLE"
        return json.dumps({"validation_status": status, "solution_plan": {"primary_path": [{"step": 1, "function": "transfer"}]}}
                          if status == "FEASIBLE" else {"validation_status": status, "failure_reasons": [
                              {"category": "contradictory_constraints", "description": "balance too low"}]})

    with ScriptedServer(script) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url}, TASK, "eigendata")
    fz = next(v for v in out.verdicts if v.name == "task_feasibility")
    assert fz.passed and json.loads(fz.scores["tool_calls"][0]["result"])["balance"] == 100
    assert next(v for v in out.verdicts if v.name == "task_mechanics").passed
