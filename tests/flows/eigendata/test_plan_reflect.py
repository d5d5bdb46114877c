"""gen-plan and reflect --strategy eigendata | sea, the batch `finish` hook through the CLI, the
metrics / pilot criteria / drift core (exact), and the pilot loop's stop signal."""

import json

import pytest
from click.testing import CliRunner

from tests.flows.eigendata.util import env_record, run_strategy
from toolkit import cli
from toolkit.flows.eigendata import metrics as M
from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record


def pset(summary, roles=None, focus="cancellations"):
    return "<prompt_set>" + json.dumps({"focus": focus, "summary": summary,
                                        "guidance": roles or {"user_intent": ["use reservations that exist"]},
                                        "evaluation_rules": "The task is feasible. Output [ACCEPT] or [REJECT]."}) + "</prompt_set>"


def test_gen_plan_eigendata_sequential_and_diverse():
    replies = [pset("cancellation tasks for silver members"),
               pset("Cancellation tasks for  silver members"),  # duplicate of set 0 → retried
               pset("x", roles={"caterer": ["?"]}),  # unknown role → retried
               pset("baggage additions with payment splits", focus="baggage")]
    with ScriptedServer(replies) as srv:
        out = run_strategy("gen-plan", {"base_url": srv.base_url, "n": 2}, env_record(), "eigendata")
        second_prompt = srv.requests[1]["messages"][0]["content"]
    assert "set 0: cancellation tasks for silver members" in second_prompt  # conditioned on earlier sets
    assert [r.id for r in out] == ["env-1-ps0", "env-1-ps1"]
    p = out[1].plan
    assert p.prompt_set == "env-1-ps1" and p.prompt_version == "1" and p.synthesis_plan == "baggage"
    assert p.extra["guidance"] == {"user_intent": ["use reservations that exist"]}
    assert p.extra["previous_summaries"] == ["cancellation tasks for silver members"]


SEA_PLAN = ("<synthesis_plan>Category: refunds. Step 1 Information Gathering: read users. Step 2 Task Synthesis: "
            "write a refund task. {}</synthesis_plan><evaluation_rules>1. Feasible. Output [ACCEPT] or [REJECT]."
            "</evaluation_rules>")


def test_gen_plan_sea_pairs_and_malformed():
    replies = ["<synthesis_plan>just do stuff</synthesis_plan><evaluation_rules>[ACCEPT]/[REJECT]</evaluation_rules>",
               SEA_PLAN.format("A"), "<synthesis_plan>Information Gathering ... Task Synthesis", SEA_PLAN.format("A"),
               SEA_PLAN.format("B")]
    with ScriptedServer(replies) as srv:
        out = run_strategy("gen-plan", {"base_url": srv.base_url, "n": 2}, env_record(), "sea")
        assert "plan 0: Category: refunds" in srv.requests[2]["messages"][0]["content"]
    assert len(out) == 2 and out[1].plan.synthesis_plan.endswith("B") and "[ACCEPT]" in out[1].plan.evaluation_rules
    assert out[0].plan.extra["summary_report"].startswith("Target:")
    with ScriptedServer(["nothing"]) as srv:
        with pytest.raises(StageError, match="no <synthesis_plan> block"):
            run_strategy("gen-plan", {"base_url": srv.base_url, "n": 1}, env_record(), "sea")


def batch_record(i, ok, category="missing_resource", ps="env-1-ps0", version="1"):
    v = {"stage": "validate-task", "kind": "llm", "name": "task_feasibility", "passed": ok,
         "attribution": None if ok else "task", "reasons": [] if ok else [f"{category}: reservation {9000 + i} missing"],
         "scores": {"failure_categories": [] if ok else [category]}}
    m = {"stage": "validate-task", "kind": "rule", "name": "task_mechanics", "passed": True}
    return {"id": f"task-{ps}-{i}", "flow": "eigendata", "env": {"backend": "sqlite", "id": "airline"},
            "plan": {"id": ps, "prompt_set": ps, "prompt_version": version,
                     "extra": {"guidance": {"user_intent": ["be natural"]}}},
            "verdicts": [v, m]}


def revision(addresses="missing_resource", role="user_intent", op="add_constraint"):
    return "<revision>" + json.dumps({"changes": [{"role": role, "operation": op, "addresses": addresses,
                                                   "text": "Only use reservation ids that appear in the state summary."}],
                                      "rationale": "missing resources"}) + "</revision>"


def run_reflect(strategy, records, replies, **cfg):
    with ScriptedServer(replies) as srv:
        args = ["--strategy", strategy, "--base-url", srv.base_url, "--model", "scripted"]
        for k, v in cfg.items():
            args += [f"--{k}", str(v)]
        r = CliRunner().invoke(cli.reflect, args, input="".join(json.dumps(x) + "\n" for x in records))
        return r, srv.chat_count


def test_reflect_one_category_gives_new_version_addressing_it():
    recs = [batch_record(i, ok=False) for i in range(5)]
    replies = [revision(addresses="contradictory_constraints"),  # not observed → retried
               revision(op="rewrite_everything"),  # wrong enum → retried
               revision()]
    r, n = run_reflect("eigendata", recs, replies)
    assert r.exit_code == 0, r.output
    assert n == 3
    out = [Record.model_validate_json(x) for x in r.stdout.splitlines()]
    assert len(out) == 1  # one plan record per (prompt set, version); inputs are not echoed
    p = out[0].plan
    assert out[0].id == "env-1-ps0-v2" and p.prompt_version == "2"
    assert p.extra["guidance"]["user_intent"] == ["be natural", "Only use reservation ids that appear in the state summary."]
    ref = p.extra["reflections"][-1]
    assert ref["from_version"] == "1" and ref["to_version"] == "2"
    assert ref["changes"][0]["addresses"] == "missing_resource"
    assert ref["evidence"]["categories"] == {"missing_resource": 5} and len(ref["evidence"]["examples"]["missing_resource"]) == 3
    assert p.extra["pilot"]["stop"] is False and p.extra["pilot"]["metrics"]["infeasibility"] == 1.0


def test_pilot_stops_when_criteria_hold():
    """Iteration 1 fails (reflect asks the LLM, new version); iteration 2 meets the criteria:
    no LLM call, version kept, stop=True — the loop in recipes/eigendata_pilot.sh ends there."""
    it1 = [batch_record(i, ok=i == 0) for i in range(5)]
    r, n = run_reflect("eigendata", it1, [revision()])
    p1 = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert n == 1 and p1.extra["pilot"]["stop"] is False and p1.prompt_version == "2"
    it2 = [batch_record(i, ok=i != 0, version="2") for i in range(10)]
    r, n = run_reflect("eigendata", it2, ["unused"])
    p2 = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert n == 0 and p2.extra["pilot"]["stop"] is True and p2.prompt_version == "2"
    assert p2.extra["pilot"]["criteria"]["checks"] == {"infeasibility": True, "tool_validity": True}


def test_reflect_groups_by_prompt_set_and_never_valid_keeps_version():
    recs = [batch_record(i, ok=False, ps="A") for i in range(2)] + [batch_record(i, ok=False, ps="B") for i in range(2)]
    r, _ = run_reflect("eigendata", recs, ["{bad", "<revision>{}</revision>", "no"] + [revision()])
    out = {Record.model_validate_json(x).plan.prompt_set: Record.model_validate_json(x).plan for x in r.stdout.splitlines()}
    assert set(out) == {"A", "B"}
    assert out["A"].prompt_version == "1" and "error" in out["A"].extra["reflections"][-1]  # 3 malformed → kept
    assert out["B"].prompt_version == "2"


def test_reflect_sea_improves_plan_and_rules():
    recs = []
    for i in range(3):
        rec = batch_record(i, ok=False, ps="P")
        rec["verdicts"] = [{"stage": "validate-task", "kind": "llm", "name": "task_quality", "passed": False,
                            "attribution": "task", "reasons": ["TASK QUALITY VERDICT: REJECT - the refund amount is unspecified"],
                            "scores": {"eval_rules_improve": ["do not require exact wording"]}}]
        rec["plan"]["synthesis_plan"] = "old plan"
        rec["plan"]["evaluation_rules"] = "old rules [ACCEPT]/[REJECT]"
        recs.append(rec)
    replies = ["<synthesis_plan>new plan: state the refund amount</synthesis_plan>",
               "<eval_rules>1. Wording may vary. Output [ACCEPT] or [REJECT].</eval_rules>"]
    with ScriptedServer(replies) as srv:
        r = CliRunner().invoke(cli.reflect, ["--strategy", "sea", "--base-url", srv.base_url, "--model", "s"],
                               input="".join(json.dumps(x) + "\n" for x in recs))
        assert "refund amount is unspecified" in srv.requests[0]["messages"][0]["content"]
        assert "do not require exact wording" in srv.requests[1]["messages"][0]["content"]
    p = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert p.synthesis_plan.startswith("new plan") and p.evaluation_rules.startswith("1. Wording") and p.prompt_version == "2"
    assert [c["field"] for c in p.extra["reflections"][-1]["changes"]] == ["synthesis_plan", "evaluation_rules"]


def test_metrics_and_drift_exact():
    recs = [Record.model_validate(batch_record(i, ok=i < 3)) for i in range(4)]
    m = M.batch_metrics(recs)
    assert m["infeasibility"] == 0.25 and m["tool_validity"] == 1.0 and m["quality"] is None
    assert m["categories"] == {"missing_resource": 1}
    assert M.pilot_criteria(m)["met"] is False  # 0.25 > 0.2
    assert M.pilot_criteria(m, {"max_infeasibility": 0.3})["met"] is True
    base = {"infeasibility": 0.1, "tool_validity": 0.95, "quality": 0.8, "repair_rounds": 0.2, "categories": {"a": 1}}
    cur = {"infeasibility": 0.3, "tool_validity": 0.9, "quality": 0.6, "repair_rounds": 0.8, "categories": {"a": 2, "b": 1}}
    d = M.drift(cur, base)
    assert d["drift"] and len(d["signals"]) == 3 and d["new_categories"] == ["b"]  # validity -0.05 is within 0.1
    assert not M.drift(base, base)["drift"]
    s = M.sample(recs, 0.5)
    assert s == M.sample(recs, 0.5) and set(r.id for r in s) <= set(r.id for r in recs)


def test_reflect_sea_malformed_improvements_are_retried():
    rec = batch_record(0, ok=False, ps="P")
    rec["verdicts"] = [{"stage": "validate-task", "kind": "llm", "name": "task_quality", "passed": False,
                        "attribution": "task", "reasons": ["REJECT: vague"], "scores": {"eval_rules_improve": ["relax X"]}}]
    rec["plan"]["synthesis_plan"] = "old plan"
    replies = ["Here is a better plan: ...", "<synthesis_plan>unterminated", "<synthesis_plan>better plan</synthesis_plan>",
               "<eval_rules></eval_rules>", "<eval_rules>1. X relaxed. [ACCEPT]/[REJECT]</eval_rules>"]
    with ScriptedServer(replies) as srv:
        r = CliRunner().invoke(cli.reflect, ["--strategy", "sea", "--base-url", srv.base_url, "--model", "s"],
                               input=json.dumps(rec) + "\n")
        assert srv.chat_count == 5
    p = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert p.synthesis_plan == "better plan" and p.evaluation_rules.startswith("1. X relaxed")


def test_reflect_records_without_plan():
    rec = batch_record(0, ok=True)
    del rec["plan"]
    r, n = run_reflect("eigendata", [rec], ["unused"])
    assert r.exit_code == 0 and n == 0
    out = Record.model_validate_json(r.stdout.splitlines()[0])
    assert out.id == "no-plan-v1" and out.plan.extra["pilot"]["stop"] is True
