"""verify --strategy judge with judge_rubric eigendata (EigenData TrajectoryValidationAgent: five
dimensions, critical issues, the decision rule applied mechanically, four-way attribution) and
the SEA rubric's extended attribution; scripted replies in the paper's format + malformed ones."""

import asyncio
import copy
import json

import pytest

from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.judge import parse
from toolkit.roles.reply import MalformedJudgeOutput
from toolkit.schema import Record

DIMS = ("conversation_quality", "function_correctness", "policy_compliance", "intent_alignment", "data_consistency")


def reply(ratings=None, critical=(), result="PASS", attribution=None, **extra):
    ratings = ratings or {}
    vs = {d: {"rating": ratings.get(d, "Good"), "assessment": "ok"} for d in DIMS}
    vs["function_correctness"].update(total_calls=2, valid_calls=2)
    vs["intent_alignment"]["goal_progress"] = "Complete" if result == "PASS" else "Partial"
    obj = {"validation_summary": vs, "critical_issues": list(critical), "non_critical_observations": ["asked twice"],
           "validation_result": result, "failure_reason": None if result == "PASS" else "see issues",
           "attribution": attribution}
    obj.update(extra)
    return json.dumps(obj)


def test_decision_rule_is_mechanical():
    j = parse("eigendata", reply())
    assert j.passed and j.attribution is None and j.scores["n_poor"] == 0
    # one critical issue fails even if the model says PASS (the override is noted)
    j = parse("eigendata", reply(critical=[{"category": "Data Fabrication", "turn_number": 3, "description": "made up a fare"}]))
    assert not j.passed and j.scores["critical"] == ["data_fabrication"] and j.attribution == "trajectory"
    assert any("overridden by the decision rule" in r for r in j.reasons)
    # two Poor → FAIL (paper); one Poor → FAIL (toolkit default, PASS needs all Good/Acceptable)
    assert not parse("eigendata", reply({"policy_compliance": "Poor", "data_consistency": "Poor"}, result="FAIL")).passed
    assert not parse("eigendata", reply({"policy_compliance": "Poor"})).passed
    assert parse("eigendata", reply({"policy_compliance": "Acceptable"})).passed
    # the model saying FAIL with nothing wrong is overridden to PASS
    j = parse("eigendata", reply(result="FAIL"))
    assert j.passed and any("overridden" in r for r in j.reasons)


def test_attribution_values():
    for a in ("task", "trajectory", "user_simulator", "infrastructure"):
        j = parse("eigendata", reply({"intent_alignment": "Poor"}, result="FAIL", attribution=a))
        assert j.attribution == a
    with pytest.raises(MalformedJudgeOutput, match="attribution"):
        parse("eigendata", reply(result="FAIL", attribution="the weather"))


@pytest.mark.parametrize("bad,match", [
    ('{"validation_summary": {}, "validation_result": "PASS"}', "misses dimension"),
    (reply({"policy_compliance": "Excellent"}), "rating must be one of"),
    (reply(result="MAYBE"), "validation_result"),
    (reply(critical=[{"category": "rudeness", "description": "x"}]), "critical issue category"),
    ('{"validation_summary": ', "invalid JSON"),
    ("PASS", "no JSON object"),
])
def test_malformed(bad, match):
    with pytest.raises(MalformedJudgeOutput, match=match):
        parse("eigendata", bad)


def _record(n=1, termination=None):
    msgs = [{"role": "system", "content": "policy"}, {"role": "user", "content": "cancel 1003"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "query_reservation", "arguments": "{\"reservation_id\": 1003}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"count\": 1}"},
            {"role": "assistant", "content": "Done."}]
    trajs = [{"id": f"t{i}", "messages": copy.deepcopy(msgs), "termination": termination,
              "error": "LLMError: 500" if termination == "error" else None} for i in range(n)]
    return Record.model_validate({"id": "j1", "task": {"instruction": "cancel 1003",
                                                       "ground_truth": {"rubrics": ["cancel only after a yes"]}},
                                  "trajectories": trajs})


def _verify(cfg, rec):
    from toolkit.stages import verify

    async def go():
        fn = verify.build(dict({"model": "scripted", "max_retries": 0, "strategy": ["judge"]}, **cfg), None)
        try:
            return await fn(rec)
        finally:
            from toolkit.llm.client import close_all_clients

            await close_all_clients()

    return asyncio.run(go())


def test_verify_judge_eigendata_end_to_end():
    bad_then_good = ["I think it passed", reply({"intent_alignment": "Poor", "policy_compliance": "Poor"},
                                                 result="FAIL", attribution="user_simulator")]
    with ScriptedServer([reply()] + bad_then_good) as srv:
        out = _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, _record(2))
        prompt = srv.requests[0]["messages"][1]["content"]
    assert "cancel only after a yes" in prompt and "TrajectoryValidationAgent" in prompt
    vs = sorted(out.verdicts, key=lambda v: v.trajectory_id)
    assert [(v.passed, v.attribution) for v in vs] == [(True, None), (False, "user_simulator")]
    assert vs[1].scores["attempts"] == 2 and vs[1].scores["ratings"]["policy_compliance"] == "Poor"


def test_crashed_episode_is_infrastructure_and_malformed_is_failed_not_crash():
    with ScriptedServer([reply({"intent_alignment": "Poor"}, result="FAIL", attribution="trajectory")]) as srv:
        out = _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, _record(1, termination="error"))
    assert out.verdicts[0].attribution == "infrastructure"
    with ScriptedServer(["nope", "{", reply(result="WHAT")]) as srv:
        out = _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, _record(1))
    v = out.verdicts[0]
    assert not v.passed and v.reasons[0] == "malformed judge output" and v.attribution is None


def test_sea_rubric_takes_user_simulator_attribution():
    sea = json.dumps({"thought": "user left", "eval_report": "TASK QUALITY VERDICT: ACCEPT; TRAJECTORY VERDICT: FAILED",
                      "task_quality_verdict": "ACCEPT", "trajectory_verdict": "FAILED", "attribution": "user_simulator"})
    with ScriptedServer([sea]) as srv:
        out = _verify({"base_url": srv.base_url, "judge_rubric": "sea"}, _record(1))
        assert "user_simulator" in srv.requests[0]["messages"][1]["content"]  # the v2 prompt offers it
    assert out.verdicts[0].attribution == "user_simulator"
