"""Fidelity to the EigenData (v1) and AReaL-SEA (v3) texts of arXiv 2601.22607: each test quotes the
sentence it checks and computes its expectation by hand from it."""

import asyncio
import json

import pytest
from click.testing import CliRunner

from tests.flows.eigendata.test_plan_reflect import batch_record
from tests.flows.eigendata.test_verifier import ALWAYS_PASS, fenced
from tests.flows.eigendata.util import run_strategy
from toolkit import cli
from toolkit.domains import load_tasks
from toolkit.flows.eigendata import make_verifier as MV
from toolkit.flows.eigendata import options as O
from toolkit.flows.eigendata import metrics as M
from toolkit.flows.eigendata import orchestration as OJ
from toolkit.flows.eigendata import verifier_template as VT
from toolkit.flows.eigendata.repair import choose_mode
from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.judge import improve_items, parse
from toolkit.schema import Record

# ------------------------------------------------------------------------------------------------
# AReaL-SEA prompts 3/4/6: "<eval_rules_improve>: identify 0-5 items in the existing evaluation rules
# to relax ... or say that the evaluation rules are of high quality"


def sea_reply(improve):
    return json.dumps({"thought": "t", "eval_report": "TASK QUALITY VERDICT: ACCEPT", "task_quality_verdict": "ACCEPT",
                       "trajectory_verdict": "SUCCESS", "attribution": None, "eval_rules_improve": improve})


def test_eval_rules_improve_is_a_list_of_items():
    j = parse("sea", sea_reply("1. Relax the exact-wording rule\n2. Allow refunds to any card on file"))
    assert j.scores["eval_rules_improve"] == ["Relax the exact-wording rule", "Allow refunds to any card on file"]
    assert parse("sea", sea_reply("The evaluation rules are of high quality.")).scores["eval_rules_improve"] == []
    assert parse("sea", sea_reply(["- relax A", "the rules are already of high quality"])).scores[
        "eval_rules_improve"] == ["relax A"]
    assert improve_items(None) == [] and improve_items("") == []
    with pytest.raises(ValueError, match="at most 5"):  # "0-5 items"
        improve_items("\n".join(f"item {i}" for i in range(6)))


def _sea_records(improve, failed=False, n=2):
    recs = []
    for i in range(n):
        r = batch_record(i, ok=not failed, ps="S")
        r["verdicts"] = [{"stage": "verify", "kind": "llm", "name": "judge", "passed": not failed,
                          "attribution": "task" if failed else None,
                          "reasons": ["TASK QUALITY VERDICT: " + ("REJECT: vague" if failed else "ACCEPT")],
                          "scores": {"eval_rules_improve": improve}}]
        r["plan"].update(synthesis_plan="old plan", evaluation_rules="old rules [ACCEPT]/[REJECT]")
        recs.append(r)
    return recs


def _reflect(strategy, recs, replies, *extra):
    with ScriptedServer(replies) as srv:
        r = CliRunner().invoke(cli.reflect, ["--strategy", strategy, "--base-url", srv.base_url, "--model", "s", *extra],
                               input="".join(json.dumps(x) + "\n" for x in recs))
        return r, list(srv.requests)


def test_sea_reflect_gets_items_not_characters():
    # a record written before the fix: the judge stored the improvements as ONE string
    r, reqs = _reflect("sea", _sea_records("Relax the exact-wording rule\nAllow any card on file"),
                       ["<eval_rules>1. Wording may vary. [ACCEPT]/[REJECT]</eval_rules>"])
    assert r.exit_code == 0, r.output
    sent = reqs[0]["messages"][0]["content"]
    assert "- Relax the exact-wording rule\n- Allow any card on file" in sent
    assert "- R\n- e\n" not in sent
    p = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    # no failure, yet prompt 6 ran on the passing evaluations' items; the synthesis plan is untouched
    assert p.evaluation_rules.startswith("1. Wording may vary") and p.synthesis_plan == "old plan"
    assert p.prompt_version == "2"


def test_sea_high_quality_rules_are_not_rewritten():
    r, reqs = _reflect("sea", _sea_records("The evaluation rules are of high quality."), ["<eval_rules>X</eval_rules>"])
    assert r.exit_code == 0 and reqs == []
    p = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert p.evaluation_rules == "old rules [ACCEPT]/[REJECT]" and p.prompt_version == "1"


# ------------------------------------------------------------------------------------------------
# EigenData §4.2 Modify: TRAJECTORY mode repairs "trajectory failures"; a judge reply with no verdict
# is no trajectory failure


def _verdict(**kw):
    return dict({"stage": "verify", "kind": "llm", "name": "judge", "passed": False, "trajectory_id": "t0"}, **kw)


def test_malformed_judge_output_is_a_judge_failure_not_trajectory_repair():
    rec = Record.model_validate({"id": "m1", "verdicts": [_verdict(reasons=["malformed judge output"],
                                                                   scores={"malformed": True})]})
    with pytest.raises(StageError, match="judge failure"):
        choose_mode(rec)
    rec.verdicts.append(rec.verdicts[0].model_copy(update={"scores": {}, "attribution": "trajectory",
                                                             "reasons": ["CRITICAL data_fabrication"]}))
    mode, fails = choose_mode(rec)
    assert mode == "TRAJECTORY" and len(fails) == 1 and not fails[0].scores.get("malformed")


# ------------------------------------------------------------------------------------------------
# EigenData §4.1 Judge: "(a) executability ... (b) tool correctness ... (c) trajectory coherence ...
# (d) difficulty & coverage (novelty, compositionality, and long-tail edge cases)"


def _artifact(i, calls, ok=True, ratings=None, termination="user_stop"):
    steps = [{"tool_call_id": f"c{k}", "name": n, "side": "agent", "ok": o} for k, (n, o) in enumerate(calls)]
    verdicts = [{"stage": "validate-task", "kind": "llm", "name": "task_feasibility", "passed": ok}]
    if ratings:
        verdicts.append({"stage": "verify", "kind": "llm", "name": "judge", "passed": True, "trajectory_id": f"a{i}-t",
                         "scores": {"ratings": ratings, "goal_progress": "Complete"}})
    return Record.model_validate({"id": f"a{i}", "plan": {"id": "P", "prompt_set": "P", "prompt_version": "1"},
                                  "trajectories": [{"id": f"a{i}-t", "messages": [], "steps": steps,
                                                    "termination": termination}],
                                  "verdicts": verdicts})


def test_orchestration_judge_scores_by_hand():
    good = {"conversation_quality": "Good", "intent_alignment": "Acceptable", "function_correctness": "Good"}
    a = _artifact(0, [("get_user", True), ("update_res", False), ("update_res", True)], ratings=good)
    b = _artifact(1, [("get_user", True)], ok=False, termination="max_turns")
    j = OJ.judge_batch([a, b])
    sa, sb = (x["scores"] for x in j["artifacts"])
    # a: executable; 2 of 3 calls accepted x function_correctness Good (1) = 0.6667; coherence mean of
    # Good 1, Acceptable 0.5, goal Complete 1 = 0.8333; 2 distinct functions / 3 = 0.6667, unique set
    # (novelty 1) → 0.8333
    assert sa == {"executability": 1.0, "tool_correctness": 0.6667, "trajectory_coherence": 0.8333,
                  "difficulty_coverage": 0.8333}
    # b: infeasible; 1/1 calls ok; no judge ratings → ended at max_turns = 0; 1 function / 3, unique → 0.6667
    assert sb == {"executability": 0.0, "tool_correctness": 1.0, "trajectory_coherence": 0.0,
                  "difficulty_coverage": 0.6667}
    assert j["means"] == {"executability": 0.5, "tool_correctness": 0.8333, "trajectory_coherence": 0.4167,
                          "difficulty_coverage": 0.75}
    assert j["low"] == ["executability", "tool_correctness", "trajectory_coherence"]
    assert any("1 of 3 calls refused" in c for c in j["artifacts"][0]["critiques"])


def test_a_set_without_failures_still_evolves_on_the_judges_scores(tmp_path):
    """§4.3: "the Judge Agent produces structured critiques and multi-axis scores. The Prompt
    Engineer then revises each agent's prompt" — also "adjusting style controls": a batch with no
    failure whose tasks all need the same single function has low difficulty & coverage."""
    recs = [json.loads(_artifact(i, [("get_user", True)]).model_dump_json()) for i in range(4)]
    # difficulty_coverage per artifact: (1/3 + 1/4) / 2 = 0.2917 < 0.4
    rev = "<revision>" + json.dumps({"changes": [{"role": "user_intent", "operation": "add_constraint",
                                                  "addresses": "judge_low_difficulty_coverage",
                                                  "text": "Each task needs at least three different functions."}]}) + "</revision>"
    r, reqs = _reflect("eigendata", recs, [rev])
    assert r.exit_code == 0, r.output
    assert len(reqs) == 1 and "judge_low_difficulty_coverage" in reqs[0]["messages"][0]["content"]
    p = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert p.prompt_version == "2" and p.extra["pilot"]["stop"] is False
    assert p.extra["pilot"]["judge"]["means"]["difficulty_coverage"] == 0.2917
    assert p.extra["pilot"]["judge"]["low"] == ["difficulty_coverage"]
    # the same batch with a lower target: nothing to fix, no LLM request, the set stops
    recipe = tmp_path / "r.yaml"
    recipe.write_text("reflect:\n  judge_targets: {difficulty_coverage: 0.2}\n")
    r, reqs = _reflect("eigendata", recs, [rev], "--recipe", str(recipe))
    assert r.exit_code == 0, r.output
    assert reqs == [] and Record.model_validate_json(r.stdout.splitlines()[0]).plan.extra["pilot"]["stop"] is True


# ------------------------------------------------------------------------------------------------
# EigenData Phase 3 drift: "increasing repair iterations"


def test_repair_rounds_come_from_the_repaired_records():
    first = [Record.model_validate(batch_record(i, ok=True)) for i in range(3)]
    rep = [Record.model_validate(dict(batch_record(0, ok=True), id=f"task-env-1-ps0-0-rep{k}",
                                      extra={"repair_round": k, "repair_root": "task-env-1-ps0-0"},
                                      verdicts=[{"stage": "verify", "kind": "llm", "name": "judge",
                                                 "passed": k == 2}])) for k in (1, 2)]
    m = M.batch_metrics(first + rep)
    # 3 tasks: one needed 2 rounds, two none → 2/3; the one repaired task's last round passed
    assert m["repair_rounds"] == 0.6667 and m["repaired"] == 1 and m["repair_success"] == 1.0
    assert m["infeasibility"] == 0.0 and m["counts"]["validated"] == 3  # first pass only
    assert M.batch_metrics(first)["repair_rounds"] == 0.0


# ------------------------------------------------------------------------------------------------
# EigenData §5: "only a full match could be evaluated as success" → binary reward


PARTIAL = ("def evaluate_submission(reference, eval):\n"
           "    return {'overall_pass': False, 'reward': 0.67, 'component_scores': {'state': 1.0, 'key_functions': 0.5}}\n")


def _code_record(source):
    return Record.model_validate({"id": "c1", "task": {"instruction": "x"}, "verifier": {"spec": "code", "source": source},
                                  "trajectories": [{"id": "t0", "messages": [{"role": "user", "content": "hi"},
                                                                              {"role": "assistant", "content": "ok"}]}]})


@pytest.mark.parametrize("mode,want", [(None, 0.0), ("binary", 0.0), ("verifier", 0.67)])
def test_code_reward_is_binary_by_default(mode, want):
    from toolkit.stages import verify

    cfg = {"strategy": ["code"]}
    if mode:
        cfg["code_reward"] = mode
    out = asyncio.run(verify.build(cfg, None)(_code_record(PARTIAL)))
    assert out.trajectories[0].reward == want and out.verdicts[0].score == want
    assert out.verdicts[0].scores["reward"] == 0.67 and not out.verdicts[0].passed


# ------------------------------------------------------------------------------------------------
# App. 3.1 VerificationFunction Part 3 (policy compliance) where the environment never refuses


def test_policy_part_not_applicable_without_policy_codes():
    spec = VT.spec_from_reference({"t": []}, {"t": [{"id": 1}]}, [], [], policy_codes=False)
    assert spec["policy_check"] == "not_applicable"
    from toolkit.sandbox import run_function

    ev = {"initial_state": {"t": []}, "final_state": {"t": [{"id": 1}]},
          "tool_calls": [{"name": "x", "ok": False, "result": '{"error": {"code": "POLICY_VIOLATION"}}'}]}
    res = run_function(VT.render(spec), "evaluate_submission", [{}, ev], None, None, "auto").value
    assert "policy" not in res["component_scores"] and res["checks_policy"][0].startswith("not applicable")
    # with policy codes the same refusal fails Part 3 (the reference had none)
    spec = VT.spec_from_reference({"t": []}, {"t": [{"id": 1}]}, [], [], policy_codes=True)
    res = run_function(VT.render(spec), "evaluate_submission", [{}, ev], None, None, "auto").value
    assert res["component_scores"]["policy"] == 0.0 and not res["overall_pass"]


def test_policy_codes_by_backend():
    from toolkit.envs import load_env

    env = load_env({"backend": "sqlite", "id": "airline"})
    assert MV.policy_codes(env) is True
    env.close()

    class Tau2Like:
        backend = "tau2"

    assert MV.policy_codes(Tau2Like()) is False


def test_tau2_task_verifier_skips_policy_part():
    pytest.importorskip("tau2")
    from toolkit.envs import load_env

    env = load_env({"backend": "tau2", "id": "airline"})
    try:
        assert MV.policy_codes(env) is False
        calls = [{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}]
        cases, _, _ = MV.self_test_cases(env, calls, [])
    finally:
        env.close()
    pv = next(c for c in cases if c["name"] == "policy_violation")
    assert "skipped" in pv and "never refuses" in pv["skipped"]


# ------------------------------------------------------------------------------------------------
# the verifier self-test (the toolkit's; FLOWS §1.9: "nothing checks that the verifier passes the
# reference and fails perturbations") must not pass when nothing was tested


def test_self_test_does_not_pass_on_a_reference_without_calls():
    from toolkit.envs import load_env

    env = load_env({"backend": "sqlite", "id": "airline"})
    cases, _, _ = MV.self_test_cases(env, [], [])
    env.close()
    st = MV.self_test(ALWAYS_PASS, {}, cases, O.MakeVerifierOptions())
    assert not st["passed"] and st["n_negative"] == 0 and "cannot be tested" in st["error"]


def test_self_test_of_a_lookup_task_rejects_always_pass():
    from toolkit.envs import load_env

    env = load_env({"backend": "sqlite", "id": "airline"})
    calls = [{"name": "query_reservation", "arguments": {"reservation_id": 1003}}]
    cases, ref_eval, executed = MV.self_test_cases(env, calls, ["query_reservation"])
    env.close()
    assert not executed[0]["state_changed"]
    st = MV.self_test(ALWAYS_PASS, {}, cases, O.MakeVerifierOptions())
    assert not st["passed"]
    assert {r["case"] for r in st["cases"] if "skipped" not in r and not r["ok"]} == {
        "wrong_id", "missing_key_call", "policy_violation", "no_calls"}
    spec = VT.spec_from_reference(ref_eval["initial_state"], ref_eval["final_state"], executed, ["query_reservation"])
    assert spec["key_calls"] == [{"name": "query_reservation", "critical": {"reservation_id": 1003}, "semantic": {}}]
    assert MV.self_test(VT.render(spec), {}, cases, O.MakeVerifierOptions())["passed"]


# ------------------------------------------------------------------------------------------------
# make-verifier's LLM → template fallback is visible


def test_template_fallback_is_counted_and_marked(capsys):
    with ScriptedServer([fenced(ALWAYS_PASS)]) as srv:
        out = run_strategy("make-verifier", {"base_url": srv.base_url, "verifier_attempts": 2},
                           load_tasks("airline")[0], "eigendata")
    st = out.verifier.self_test
    assert st["generator"] == "template" and st["passed"]
    assert st["fallback"]["from"] == "llm" and st["fallback"]["to"] == "template" and st["fallback"]["sources_tried"] == 2
    assert out.verdicts[-1].scores["fallback"] == st["fallback"]
    assert out.provenance[-1].strategy == "eigendata+template-fallback"
    assert "falling back to the template verifier" in capsys.readouterr().err
    # the LLM verifier that passes: no fallback anywhere
    out = run_strategy("make-verifier", {"verifier_source": "template"}, load_tasks("airline")[0], "eigendata")
    assert out.verifier.self_test["fallback"] is None and out.provenance[-1].strategy == "eigendata"


# ------------------------------------------------------------------------------------------------
# AReaL-SEA prompt 1: "Create Necessary Instances (optional, only if env tools exist)" — the
# toolkit's synthesis agent has read-only tools, so the plan must not ask for that step


def test_sea_plan_prompt_does_not_ask_for_instances_the_agent_cannot_create():
    from tests.flows.eigendata.test_plan_reflect import SEA_PLAN
    from tests.flows.eigendata.util import env_record

    with ScriptedServer([SEA_PLAN.format("A")]) as srv:
        run_strategy("gen-plan", {"base_url": srv.base_url, "n": 1}, env_record(), "sea")
        prompt = srv.requests[0]["messages"][0]["content"]
    assert "There is NO \"Create Necessary Instances\" step" in prompt and "read-only" in prompt
    assert "use Python's `random` package" not in prompt
