"""repair --strategy eigendata: mode from the verdicts, ≤3 rounds with parent_id lineage,
preservation checked mechanically, repaired trajectories re-executed against the environment."""

import copy
import json

import pytest

from tests.flows.eigendata.util import run_strategy
from toolkit.domains import load_tasks
from toolkit.envs import load_env
from toolkit.flows.eigendata.repair import choose_mode
from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record


def base(verdicts, trajectories=(), **extra):
    r = copy.deepcopy(load_tasks("airline")[0])
    r["flow"] = "eigendata"
    r["task"]["ground_truth"]["must_have_functions"] = ["query_customer", "query_reservation", "update_reservation",
                                                         "query_payment", "insert_payment"]
    r["task"]["complexity"] = {"level": "moderate"}
    r["task"]["extra"] = {"primary_objective": "deception_detection",
                          "selected_parameters": {"testing_objectives": ["deception_detection"],
                                                  "behavioral_pattern": "persistent_negotiator",
                                                  "complexity_level": "moderate"}}
    r["verdicts"] = verdicts
    r["trajectories"] = list(trajectories)
    r["extra"] = extra
    return r


TASK_FAIL = {"stage": "validate-task", "kind": "llm", "name": "task_feasibility", "passed": False,
             "reasons": ["missing_resource: reservation 9999 does not exist"], "attribution": "task",
             "scores": {"failure_categories": ["missing_resource"]}}


def verify_fail(attr, tid="t0"):
    return {"stage": "verify", "kind": "llm", "name": "judge", "passed": False, "reasons": ["made up a refund"],
            "attribution": attr, "trajectory_id": tid, "scores": {"critical": ["data_fabrication"]}}


TRAJ = {"id": "t0", "messages": [
    {"role": "system", "content": "airline policy"}, {"role": "user", "content": "cancel 1003 please"},
    {"role": "assistant", "content": "Done, you get 500 USD back."}]}


def repair_reply(mode, **kw):
    obj = {"repair_mode": mode, "original_failure": {"category": "missing_resource", "description": "no 9999"},
           "repairs_applied": [{"target_field": "known_info", "original_value": "9999", "repaired_value": "1003",
                                "rationale": "use an existing reservation"}],
           "preserved_elements": {"testing_objectives": ["deception_detection"], "complexity_level": "moderate"}}
    obj.update(kw)
    return json.dumps(obj)


SCENARIO = {"known_info": "user id sofia_kim_7290; reservation 1003",
            "must_have_functions": ["query_customer", "query_reservation", "update_reservation", "insert_payment"]}


def test_choose_mode():
    def rec(vs):
        return Record.model_validate(base(vs, [TRAJ]))
    assert choose_mode(rec([TASK_FAIL, verify_fail("trajectory")]))[0] == "TASK"
    assert choose_mode(rec([verify_fail("task")]))[0] == "COMBINED"
    assert choose_mode(rec([verify_fail("trajectory")]))[0] == "TRAJECTORY"
    assert choose_mode(rec([verify_fail(None)]))[0] == "TRAJECTORY"
    assert choose_mode(rec([dict(TASK_FAIL, passed=True)]))[0] is None
    with pytest.raises(StageError, match="re-run the rollout"):
        choose_mode(rec([verify_fail("user_simulator")]))


def test_task_repair_new_record_with_lineage():
    with ScriptedServer([repair_reply("TASK", repaired_scenario=SCENARIO)]) as srv:
        out = run_strategy("repair", {"base_url": srv.base_url}, base([TASK_FAIL]), "eigendata")
        assert "TASK mode, round 1 of 3" in srv.requests[0]["messages"][0]["content"]
    assert out.id == "airline-task-001-rep1" and out.parent_id == "airline-task-001"
    assert out.extra["repair_round"] == 1 and out.extra["repair_mode"] == "TASK"
    assert out.task.user_scenario.known_info == SCENARIO["known_info"]
    assert out.task.ground_truth.must_have_functions == SCENARIO["must_have_functions"]
    assert out.verdicts == [] and out.extra["repair_history"][0]["failures"][0]["name"] == "task_feasibility"
    # round 2 from round 1's output: same root, new round
    r2 = out.model_dump(mode="json", by_alias=True)
    r2["verdicts"] = [TASK_FAIL]
    with ScriptedServer([repair_reply("TASK", repaired_scenario=SCENARIO)]) as srv:
        out2 = run_strategy("repair", {"base_url": srv.base_url}, r2, "eigendata")
    assert out2.id == "airline-task-001-rep2" and out2.parent_id == out.id and out2.extra["repair_round"] == 2


def test_preservation_violations_are_retried():
    replies = [
        repair_reply("TASK", repaired_scenario=dict(SCENARIO, must_have_functions=["query_customer", "update_reservation"])),
        repair_reply("TASK", repaired_scenario=SCENARIO, preserved_elements={"testing_objectives": ["deception_detection"],
                                                                            "complexity_level": "simple"}),
        repair_reply("TASK", repaired_scenario=SCENARIO, preserved_elements={"testing_objectives": ["edge_case_navigation"],
                                                                            "complexity_level": "moderate"}),
    ]
    with ScriptedServer(replies) as srv:
        with pytest.raises(StageError) as e:
            run_strategy("repair", {"base_url": srv.base_url}, base([TASK_FAIL]), "eigendata")
    s = str(e.value)
    assert "40% of must_have_functions kept" in s and "complexity level must stay 'moderate'" in s
    assert "primary testing objective 'deception_detection'" in s
    # wrong enum / wrong mode / bad JSON, then valid
    replies = ['{"repair_mode": "FIX"}', repair_reply("TRAJECTORY"), "{oops", repair_reply("TASK", repaired_scenario=SCENARIO)]
    with ScriptedServer(replies) as srv:
        out = run_strategy("repair", {"base_url": srv.base_url, "attempts": 4}, base([TASK_FAIL]), "eigendata")
    assert out.extra["repair_mode"] == "TASK"


def test_trajectory_repair_reexecutes_tool_calls():
    repaired = [
        {"role": "user", "content": "cancel 1003 please"},
        {"role": "assistant", "function": {"name": "query_reservation", "arguments": {"reservation_id": 1003}}},
        {"role": "tool", "content": "{\"refund\": 500}"},  # fabricated result: must be dropped
        {"role": "assistant", "content": "It was booked yesterday, so it can be cancelled. Shall I?"},
        {"role": "user", "content": "yes"},
        {"role": "assistant", "function": {"name": "update_reservation",
                                           "arguments": {"reservation_id": 1003, "status": "cancelled"}}},
        {"role": "assistant", "content": "Cancelled."},
    ]
    with ScriptedServer([repair_reply("TRAJECTORY", repaired_trajectory=repaired)]) as srv:
        out = run_strategy("repair", {"base_url": srv.base_url}, base([verify_fail("trajectory")], [TRAJ]), "eigendata")
    t = out.trajectories[0]
    assert t.id == "t0-rep1" and out.extra["dropped_tool_results"] == 1
    assert t.messages[0].role == "system" and t.messages[0].content == "airline policy"
    tool_msgs = [m for m in t.messages if m.role == "tool"]
    assert len(tool_msgs) == 2 and all("500" not in (m.content or "") for m in tool_msgs)
    env = load_env({"backend": "sqlite", "id": "airline"})  # the same calls, in order, on a fresh env
    assert tool_msgs[0].content == env.call("query_reservation", {"reservation_id": 1003}).to_content()
    assert tool_msgs[1].content == env.call("update_reservation", {"reservation_id": 1003, "status": "cancelled"}).to_content()
    assert t.final_state_hash == env.state_hash() and [s.ok for s in t.steps] == [True, True]


def test_combined_mode_and_unknown_function_in_trajectory():
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "function": {"name": "cancel_everything", "arguments": {}}}]
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "function": {"name": "query_customer",
                                                                                   "arguments": {"user_id": "sofia_kim_7290"}}}]
    replies = [repair_reply("COMBINED", repaired_scenario=SCENARIO, repaired_trajectory=bad),
               repair_reply("COMBINED", repaired_scenario=SCENARIO, repaired_trajectory=good)]
    with ScriptedServer(replies) as srv:
        out = run_strategy("repair", {"base_url": srv.base_url}, base([verify_fail("task")], [TRAJ]), "eigendata")
    assert out.extra["repair_mode"] == "COMBINED" and out.task.user_scenario.known_info == SCENARIO["known_info"]
    assert out.trajectories[0].steps[0].name == "query_customer"


def test_round_limit_and_discard():
    with ScriptedServer([repair_reply("TASK", repaired_scenario=SCENARIO)]) as srv:
        with pytest.raises(StageError, match="after 3 repair round"):
            run_strategy("repair", {"base_url": srv.base_url}, base([TASK_FAIL], repair_round=3), "eigendata")
        assert srv.chat_count == 0
        with pytest.raises(StageError, match="after 1 repair round"):
            run_strategy("repair", {"base_url": srv.base_url, "max_rounds": 1}, base([TASK_FAIL], repair_round=1),
                         "eigendata")
    discard = json.dumps({"discard": True, "reason": "no resource can satisfy the scenario"})
    with ScriptedServer([discard]) as srv:
        with pytest.raises(StageError, match="discarded in round 3: no resource"):
            run_strategy("repair", {"base_url": srv.base_url}, base([TASK_FAIL], repair_round=2), "eigendata")
    with ScriptedServer([discard, discard, discard]) as srv:  # discard is not allowed in round 1
        with pytest.raises(StageError, match="only allowed in round 3"):
            run_strategy("repair", {"base_url": srv.base_url}, base([TASK_FAIL]), "eigendata")


def test_nothing_to_repair_passes_through():
    rec = base([dict(TASK_FAIL, passed=True, attribution=None)])
    with ScriptedServer(["unused"]) as srv:
        out = run_strategy("repair", {"base_url": srv.base_url}, rec, "eigendata")
        assert srv.chat_count == 0
    assert out.id == "airline-task-001" and out.parent_id is None
