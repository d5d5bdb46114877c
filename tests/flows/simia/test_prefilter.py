"""validate-task --strategy simia: the Simia seed pre-filter (rule checks, then the LLM grade)."""

import json

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.llm.testserver import ScriptedServer

TOOLS = [{"type": "function", "function": {
    "name": "get_reservation", "description": "Look up a reservation",
    "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                   "required": ["reservation_id"]}}}]


def call(cid, args='{"reservation_id": "R1"}', name="get_reservation"):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]}


def seed(sid, messages, tools=TOOLS):
    return {"id": sid, "flow": "simia", "trajectories": [{"id": f"{sid}-t0", "messages": messages, "tools": tools}]}


SYS = {"role": "system", "content": "You are an airline agent. Always look reservations up."}
ASK = {"role": "user", "content": "What's the status of R1?"}
OBS = {"role": "tool", "tool_call_id": "c1", "content": '{"status": "confirmed"}'}
END = {"role": "assistant", "content": "R1 is confirmed."}

COMPLETE = seed("complete", [SYS, ASK, call("c1"), OBS, END])
MISSING_RESULT = seed("missing-result", [SYS, ASK, call("c1"), END])
BROKEN_JSON = seed("broken-json", [SYS, ASK, {"role": "assistant", "content":
                   '<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R1"\n</tool_call>'},
                   {"role": "user", "content": "<tool_response>{\"status\": \"confirmed\"}</tool_response>"}, END])
NEVER_FINISHES = seed("never-finishes", [SYS, ASK, call("c1"), OBS])
DOUBLE_USER = seed("double-user", [SYS, ASK, ASK, call("c1"), OBS, END])
UNLISTED = seed("unlisted", [SYS, ASK, call("c1", name="delete_everything"), OBS, END])
SHAREGPT_BROKEN = {"id": "sharegpt-broken", "extra": {"tools": TOOLS, "conversations": [
    {"from": "human", "value": "status of R1?"},
    {"from": "function_call", "value": '{"name": "get_reservation", "arguments": {"reservation_id": "R1}'},
    {"from": "observation", "value": "confirmed"},
    {"from": "gpt", "value": "Confirmed."}]}}

GRADE_OK = json.dumps({"completeness": "PASS", "logic": "PASS", "format": "PASS", "reason": "consistent"})
GRADE_LOGIC_FAIL = json.dumps({"completeness": "PASS", "logic": "FAIL", "format": "PASS",
                               "reason": "answer contradicts the observation"})


def run(records, replies, *args):
    with ScriptedServer(replies) as srv:
        r = CliRunner().invoke(cli.validate_task, ["--strategy", "simia", "--base-url", srv.base_url,
                                                   "--model", "scripted", *args],
                               input="".join(json.dumps(x) + "\n" for x in records))
        return r, srv.chat_count


def verdicts(line):
    rec = json.loads(line)
    return {v["name"]: v for v in rec["verdicts"]}


def test_complete_seed_passes_with_three_scores():
    r, calls = run([COMPLETE], [GRADE_OK])
    assert r.exit_code == 0, r.output
    v = verdicts(r.stdout.splitlines()[0])
    assert all(v[c]["passed"] and v[c]["kind"] == "rule" for c in
               ("roles_alternate", "tool_call_parses", "tool_is_listed", "tool_result_present", "task_finishes"))
    s = v["seed_prefilter"]
    assert s["passed"] and s["kind"] == "llm" and s["stage"] == "validate-task"
    assert (s["scores"]["completeness"], s["scores"]["logic"], s["scores"]["format"]) == (1.0, 1.0, 1.0)
    assert calls == 1


@pytest.mark.parametrize("rec,check", [
    (MISSING_RESULT, "tool_result_present"),
    (BROKEN_JSON, "tool_call_parses"),
    (NEVER_FINISHES, "task_finishes"),
    (UNLISTED, "tool_is_listed"),
    (DOUBLE_USER, "roles_alternate"),
    (SHAREGPT_BROKEN, "tool_call_parses"),
])
def test_bad_seed_fails_the_named_check_without_asking_the_llm(rec, check):
    r, calls = run([rec], [GRADE_OK])
    assert r.exit_code == 0, r.output
    v = verdicts(r.stdout.splitlines()[0])
    failed = sorted(n for n, x in v.items() if x["kind"] == "rule" and not x["passed"])
    assert failed == [check], (failed, v)
    assert not v["seed_prefilter"]["passed"]
    assert v["seed_prefilter"]["scores"]["logic"] is None
    assert any(reason.startswith(check) for reason in v["seed_prefilter"]["reasons"])
    assert calls == 0


def test_broken_json_seed_has_completeness_but_not_format():
    r, _ = run([BROKEN_JSON], [GRADE_OK])
    s = verdicts(r.stdout.splitlines()[0])["seed_prefilter"]["scores"]
    assert s["format"] == 0.0


def test_missing_result_scores_completeness_zero_format_one():
    r, _ = run([MISSING_RESULT], [GRADE_OK])
    s = verdicts(r.stdout.splitlines()[0])["seed_prefilter"]["scores"]
    assert (s["completeness"], s["format"]) == (0.0, 1.0)


def test_llm_logic_fail_fails_the_seed_and_filter_passed_drops_it():
    r, _ = run([COMPLETE], [GRADE_LOGIC_FAIL])
    s = verdicts(r.stdout.splitlines()[0])["seed_prefilter"]
    assert not s["passed"] and s["scores"]["logic"] == 0.0 and "contradicts" in " ".join(s["reasons"])
    r, _ = run([COMPLETE, MISSING_RESULT], [GRADE_OK], "--filter", "passed")
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["complete"]


def test_malformed_grades_are_retried_then_a_failed_verdict():
    bad = ['{"completeness": "PASS", "logic": "MAYBE", "format": "PASS"}', "not json", '{"logic": "PASS"}']
    r, calls = run([COMPLETE], bad)
    assert r.exit_code == 0 and calls == 3
    s = verdicts(r.stdout.splitlines()[0])["seed_prefilter"]
    assert not s["passed"] and s["scores"].get("malformed") is True
    r, calls = run([COMPLETE], ["```json\nnope", GRADE_OK])  # a truncated reply, then a good one
    assert verdicts(r.stdout.splitlines()[0])["seed_prefilter"]["passed"] and calls == 2


def test_rule_only_prefilter_makes_no_llm_call(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("validate-task:\n  prefilter_llm: false\n")
    r, calls = run([COMPLETE, MISSING_RESULT], [GRADE_LOGIC_FAIL], "--recipe", str(recipe))
    assert r.exit_code == 0 and calls == 0
    got = {json.loads(x)["id"]: verdicts(x)["seed_prefilter"] for x in r.stdout.splitlines()}
    assert got["complete"]["passed"] and got["complete"]["scores"]["logic"] is None
    assert not got["missing-result"]["passed"]


# APIGen-MT ships each seed's tool list as a JSON *string* of bare function dicts
APIGEN_TOOLS = json.dumps([{"name": "get_reservation", "description": "Look up a reservation",
                            "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                                           "required": ["reservation_id"]}}])
APIGEN_SEED = {"id": "apigen-1", "extra": {"tools": APIGEN_TOOLS, "conversations": [
    {"from": "human", "value": "status of R1?"},
    {"from": "function_call", "value": '{"name": "get_reservation", "arguments": {"reservation_id": "R1"}}'},
    {"from": "observation", "value": "{\"status\": \"confirmed\"}"},
    {"from": "gpt", "value": "R1 is confirmed."}]}}


def test_apigen_seed_with_tools_as_a_json_string_is_checked_not_crashed():
    r, _n = run([APIGEN_SEED], [GRADE_OK])
    assert r.exit_code == 0, r.output
    v = verdicts(r.stdout.splitlines()[0])
    assert v["tool_is_listed"]["passed"] and v["tool_call_parses"]["passed"]


def test_simulate_env_reads_a_json_string_tool_list():
    reply = ("HUMAN: status of R1?\nFUNCTION_CALL: {\"name\": \"get_reservation\", \"arguments\": "
             "{\"reservation_id\": \"R1\"}}\nOBSERVATION: {\"status\": \"confirmed\"}\nASSISTANT: Confirmed.")
    with ScriptedServer([reply]) as srv:
        r = CliRunner().invoke(cli.simulate_env, ["--mode", "trajectory", "--base-url", srv.base_url, "--model", "m"],
                               input=json.dumps(APIGEN_SEED) + "\n")
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)["trajectories"][0]
    assert [x["function"]["name"] for x in t["tools"]] == ["get_reservation"]


@pytest.mark.parametrize("tools, why", [("[{not json", "extra.tools is a string but not JSON"),
                                        ("42", "must be a list of tools"),
                                        ('[{"description": "no name"}]', "extra.tools[0] has no name")])
def test_bad_extra_tools_are_rejected_naming_the_field(tools, why):
    bad = dict(APIGEN_SEED, extra=dict(APIGEN_SEED["extra"], tools=tools))
    r, n = run([bad], [GRADE_OK])
    assert r.exit_code == 1 and n == 0
    assert why in r.stderr and "Traceback" not in r.stderr
