"""gen-task --strategy eigendata: RandomPool → UserIntent against the bundled sqlite airline
domain, with hand-written replies in the paper's format (App. 3.1) and malformed ones."""

import json

import pytest

from tests.flows.eigendata.util import env_record, run_strategy
from toolkit.flows.eigendata.random_pool import parse_pool, select
from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.structured import Malformed

PROFILES = [
    {"role": "business traveller", "experience": "frequent", "background": "consultant", "priorities": ["speed"]},
    {"role": "student", "experience": "novice", "background": "first trip", "priorities": ["cost savings"]},
    {"role": "retiree", "experience": "occasional", "background": "visits family", "priorities": ["comfort"]},
]
FACTORS = {"testing_objectives": ["sequential_decision_making", "multi_constraint_verification", "deception_detection"],
           "deception_tactics": ["false_status_claims"],
           "operational_complexity": ["sequential_conditional", "multi_entity_coordination"],
           "policy_focuses": ["passenger_limit", "one_certificate_per_reservation"],
           "behavioral_patterns": ["persistent_negotiator", "confused_customer"],
           "complexity_levels": ["simple", "moderate", "complex"], "urgency_levels": ["low", "high"],
           "emotional_states": ["neutral", "anxious"]}
# the paper's layout: profiles, then the factor lists, then the seed, all inside user_profiles
POOL = json.dumps({"random_factors": {"user_profiles": PROFILES + [FACTORS, {"seed": 42}]}})

INTENT = {
    "context": "Sofia Kim, a silver member, booked SFO-SEA yesterday.",
    "purpose": "deception_detection: she claims to be gold",
    "reason_for_call": "I want to cancel reservation 1003 and get a full refund, I'm a gold member.",
    "known_info": "user id sofia_kim_7290; reservation 1003; claims gold membership (false)",
    "task_instructions": "Insist on being gold; accept the cancellation when the agent explains the rules.",
    "rubrics": ["The agent checks the membership with query_customer", "The agent cancels 1003"],
    "must_have_functions": ["query_customer", "query_reservation", "update_reservation"],
    "expected_actions": [{"name": "update_reservation", "arguments": {"reservation_id": 1003, "status": "cancelled"}}],
    "selected_parameters": {"testing_objectives": ["deception_detection"], "complexity_level": "moderate"},
}


def intent(**over):
    return "<intent>\n" + json.dumps(dict(INTENT, **over)) + "\n</intent>"


def test_parse_pool_paper_layout_and_counts():
    pool = parse_pool(POOL)
    assert len(pool["user_profiles"]) == 3 and pool["seed"] == 42
    assert pool["deception_tactics"] == ["false_status_claims"]
    bad = json.loads(POOL)
    bad["random_factors"]["user_profiles"][3]["testing_objectives"] = ["a", "b"]  # 2 < 3
    with pytest.raises(Malformed, match="testing_objectives.*3-5"):
        parse_pool(json.dumps(bad))
    bad = json.loads(POOL)
    bad["random_factors"]["user_profiles"][3]["urgency_levels"] = ["soon"]
    with pytest.raises(Malformed, match="urgency_levels"):
        parse_pool(json.dumps(bad))
    bad = json.loads(POOL)
    bad["random_factors"]["user_profiles"][0]["experience"] = "guru"
    with pytest.raises(Malformed, match="experience"):
        parse_pool(json.dumps(bad))
    with pytest.raises(Malformed):
        parse_pool('{"random_factors": {"user_profiles": [')


def test_select_is_deterministic_and_from_the_pool():
    pool = parse_pool(POOL)
    a, b = select(pool, "env-1", 0), select(pool, "env-1", 0)
    assert a == b
    assert set(a["testing_objectives"]) <= set(FACTORS["testing_objectives"])
    assert 1 <= len(a["testing_objectives"]) <= 2 and len(a["deception_tactics"]) == 1
    assert a["complexity_level"] in FACTORS["complexity_levels"]
    # different k → (almost surely) a different draw over 8 scenarios
    assert len({json.dumps(select(pool, "env-1", k), sort_keys=True) for k in range(8)}) > 1


def test_gen_task_maps_intent_into_the_task():
    with ScriptedServer([POOL, intent()]) as srv:
        out = run_strategy("gen-task", {"base_url": srv.base_url}, env_record(), "eigendata")
        assert srv.chat_count == 2
        prompt = srv.requests[1]["messages"][1]["content"]
    assert "query_reservation" in prompt  # the env's real tools are in the UserIntent prompt
    assert len(out) == 1
    r = out[0]
    assert r.id == "env-1-ed0" and r.parent_id == "env-1" and r.flow == "eigendata"
    t = r.task
    assert t.instruction == INTENT["reason_for_call"]
    assert t.user_scenario.persona == INTENT["context"] and t.user_scenario.known_info == INTENT["known_info"]
    assert t.user_scenario.instructions == INTENT["task_instructions"]
    assert t.ground_truth.must_have_functions == ["query_customer", "query_reservation", "update_reservation"]
    assert t.ground_truth.rubrics == INTENT["rubrics"]
    assert [a.name for a in t.ground_truth.actions] == ["update_reservation"]
    assert t.extra["purpose"] == INTENT["purpose"]
    sel = t.extra["selected_parameters"]
    assert t.extra["primary_objective"] == sel["testing_objectives"][0]
    assert t.difficulty == sel["complexity_level"] == t.complexity["level"]
    assert t.extra["random_factors"]["seed"] == 42
    assert r.provenance[-1].command == "gen-task" and r.provenance[-1].strategy == "eigendata"


def test_gen_task_n_scenarios_share_one_pool():
    with ScriptedServer([POOL, intent(), intent()]) as srv:
        out = run_strategy("gen-task", {"base_url": srv.base_url, "n": 2}, env_record(), "eigendata")
        assert srv.chat_count == 3
    assert [r.id for r in out] == ["env-1-ed0", "env-1-ed1"]


def test_malformed_intents_are_retried():
    replies = [
        "not json at all",  # pool: bad JSON → retried
        POOL,
        intent(must_have_functions=["query_customer", "teleport_passenger"]),  # unknown function
        "<intent>{\"context\": \"x\"",  # truncated
        intent(),
    ]
    with ScriptedServer(replies) as srv:
        out = run_strategy("gen-task", {"base_url": srv.base_url}, env_record(), "eigendata")
        assert srv.chat_count == 5
    assert out[0].task.extra["attempts"] == {"random_pool": 2, "user_intent": 3}


def test_single_call_task_and_missing_tag_reject_with_reasons():
    replies = [POOL, intent(must_have_functions=["query_customer"], expected_actions=[]),
               json.dumps(INTENT),  # no <intent> tag
               intent(rubrics=[])]
    with ScriptedServer(replies) as srv:
        with pytest.raises(StageError) as e:
            run_strategy("gen-task", {"base_url": srv.base_url, "attempts": 3}, env_record(), "eigendata")
    msg = str(e.value)
    assert "2+ sequential function calls" in msg and "no <intent> block" in msg and "'rubrics' is empty" in msg


def test_pool_never_valid_rejects():
    with ScriptedServer(["{}", "[1]", '{"random_factors": 3}']) as srv:
        with pytest.raises(StageError) as e:
            run_strategy("gen-task", {"base_url": srv.base_url}, env_record(), "eigendata")
    assert e.value.field == "task.extra.random_factors" and "3 attempt" in str(e.value)


# ---------------------------------------------------------------------------------------------- SEA

SEA_TASK = {"user_instruction": "Cancel my reservation 1003 please, I booked it yesterday.",
            "task_spec": {"persona": "Sofia Kim", "reason_for_call": "cancel 1003", "known_info": "user sofia_kim_7290",
                          "instructions": "confirm with yes"},
            "expected": {"actions": [{"name": "query_reservation", "arguments": {"reservation_id": 1003}},
                                     {"name": "update_reservation", "arguments": {"reservation_id": 1003, "status": "cancelled"}}],
                         "final_answer": None, "nl_assertions": ["1003 is cancelled"]}}


def sea_task(**over):
    return "<thought>write it</thought><synthetic_task>" + json.dumps(dict(SEA_TASK, **over)) + "</synthetic_task>"


def test_gen_task_sea_explores_read_only_then_writes_the_task():
    replies = [
        sea_task(),  # no exploration yet → refused ("explore the environment first")
        '<thought>look</thought><function>{"name": "query_reservation", "arguments": {"reservation_id": 1003}}</function>',
        {"tool_calls": [{"name": "update_reservation", "arguments": {"reservation_id": 1003, "status": "cancelled"}}]},
        sea_task(expected={"actions": [{"name": "teleport", "arguments": {}}]}),  # unknown function
        sea_task(),
    ]
    with ScriptedServer(replies) as srv:
        out = run_strategy("gen-task", {"base_url": srv.base_url, "attempts": 3}, env_record(), "sea")
        assert srv.chat_count == 5
        prompt = srv.requests[0]["messages"][0]["content"]
    # the agent's tools are read-only, and its prompt says so (no "create necessary instances")
    assert "you cannot create instances" in prompt
    t = out[0].task
    assert out[0].id == "env-1-sea0" and t.instruction == SEA_TASK["user_instruction"]
    assert [a.name for a in t.ground_truth.actions] == ["query_reservation", "update_reservation"]
    assert t.ground_truth.must_have_functions == ["query_reservation", "update_reservation"]
    ex = t.extra["exploration"]
    assert ex[0]["function"] == "query_reservation" and ex[0]["source"] == "env"
    assert ex[1]["state_changed"] and ex[1]["write_undone"]  # exploration never changes the state
    assert t.extra["attempts"] == 3


def test_gen_task_sea_never_valid_rejects():
    with ScriptedServer(["<synthetic_task>{", "nothing", "<synthetic_task>{}</synthetic_task>"]) as srv:
        with pytest.raises(StageError, match="task_synthesis"):
            run_strategy("gen-task", {"base_url": srv.base_url}, env_record(), "sea")
