"""The eigendata recipe (recipes/eigendata.sh, `just eigendata ENV N`) end to end against a
scripted universe of all roles (its yield table per iteration and repair round); drift monitoring."""

import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import BIN, ROOT
from tests.flows.eigendata.test_gen_task import POOL, intent
from tests.flows.eigendata.test_plan_reflect import batch_record, pset, revision
from toolkit.flows.eigendata import drift as D
from toolkit.llm.testserver import ScriptedServer

DIMS = ("conversation_quality", "function_correctness", "policy_compliance", "intent_alignment", "data_consistency")


def make_universe():
    """Every role of the flow, told apart by its prompt. The judge fails the first trajectory that
    writes without asking for confirmation (policy_violation); the ModifyAgent repairs it by adding
    the confirmation turn; reflect addresses the observed category."""
    state = {"failed_once": False}

    def reply(req):
        t = "\n".join(str(m.get("content") or "") for m in req["messages"])
        tool_results = [m for m in req["messages"] if m["role"] == "tool"]
        if "Write prompt set" in t:
            return pset("cancellations with deception", roles={"user_intent": ["use existing reservations"]})
        if "`random_pool` agent" in t:
            return POOL
        if "Selected scenario parameters" in t:
            return intent()
        if "TaskValidationAgent" in t:
            if not tool_results:
                return {"tool_calls": [{"name": "query_reservation", "arguments": {"reservation_id": 1003}}]}
            return json.dumps({"validation_status": "FEASIBLE", "confidence": "high",
                               "solution_plan": {"primary_path": [{"step": 1, "function": "query_reservation"}]}})
        if "TrajectoryValidationAgent" in t:
            ok = "Shall I cancel" in t or state["failed_once"]
            if not ok:
                state["failed_once"] = True
                return json.dumps({"validation_summary": {d: {"rating": "Poor" if d == "policy_compliance" else "Good"}
                                                          for d in DIMS},
                                   "critical_issues": [{"category": "policy_violation", "turn_number": 3,
                                                        "description": "cancelled without an explicit yes"}],
                                   "validation_result": "FAIL", "attribution": "trajectory"})
            return json.dumps({"validation_summary": {d: {"rating": "Good"} for d in DIMS}, "critical_issues": [],
                               "validation_result": "PASS"})
        if "ModifyAgent" in t:
            prim = re.search(r"primary testing objective \(([^)]*)\)", t).group(1)
            cx = re.search(r"complexity level \(([^)]*)\)", t).group(1)
            return json.dumps({"repair_mode": "TRAJECTORY", "original_failure": {"category": "policy_violation",
                                                                                   "description": "no confirmation"},
                               "repairs_applied": [{"target_field": "turn 3", "original_value": "-",
                                                    "repaired_value": "ask for a yes", "rationale": "policy"}],
                               "preserved_elements": {"testing_objectives": [prim], "complexity_level": cx},
                               "repaired_trajectory": [
                                   {"role": "user", "content": "Please cancel reservation 1003."},
                                   {"role": "assistant", "function": {"name": "query_reservation",
                                                                      "arguments": {"reservation_id": 1003}}},
                                   {"role": "assistant", "content": "Shall I cancel reservation 1003?"},
                                   {"role": "user", "content": "yes"},
                                   {"role": "assistant", "function": {"name": "update_reservation", "arguments": {
                                       "reservation_id": 1003, "status": "cancelled"}}},
                                   {"role": "assistant", "content": "Done."}]})
        if "VerificationFunctionAgent" in t:  # always-pass: rejected by the self-test → template fallback
            return "```python\ndef evaluate_submission(reference, eval):\n    return {'overall_pass': True, 'reward': 1.0}\n```"
        if "Revise the worker prompts" in t:
            return revision(addresses="policy_violation", role="user_intent")
        if req.get("tools") and "query_reservation" in json.dumps(req["tools"]):  # the agent
            if len(tool_results) == 0:
                return {"tool_calls": [{"name": "query_reservation", "arguments": {"reservation_id": 1003}}]}
            if len(tool_results) == 1:
                return {"tool_calls": [{"name": "update_reservation",
                                        "arguments": {"reservation_id": 1003, "status": "cancelled"}}]}
            return "Your reservation 1003 is cancelled."
        last = req["messages"][-1].get("content") or ""  # the user simulator
        return "Thanks! ###STOP###" if "cancelled" in last else "Hi, please cancel reservation 1003 (sofia_kim_7290)."

    return reply


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("jq") is None, reason="the recipe needs jq")
def test_recipe_end_to_end_repairs_reflects_and_stops(tmp_path):
    out = tmp_path / "run"
    with ScriptedServer(make_universe()) as srv:
        env = dict(os.environ, OUT=str(out), TOOLKIT_BASE_URL=srv.base_url, TOOLKIT_MODEL="scripted", K="1",
                   PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}", PYTHONPATH=str(ROOT))
        r = subprocess.run(["bash", "recipes/eigendata.sh", "airline", "1", "3"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    err = r.stderr
    assert "| group | stage | in | out | yield | rejected | filtered | fallbacks | pass |" in err
    assert "| 1 | verify | 1 | 1 | 1.0 | 0 | 0 | 0 | 0.0 |" in err  # the first trajectory fails the judge
    assert "| 1.r1 | verify | 1 | 1 | 1.0 | 0 | 0 | 0 | 1.0 |" in err  # the repaired one passes
    table = json.loads((out / "yield.json").read_text())
    assert [r["stage"] for r in table if r["group"] == "1.r1"] == ["validate-task", "rollout", "verify", "repair"]
    assert table[0]["group"] == "plan" and table[0]["stage"] == "gen-plan"
    assert "pilot criteria met after iteration 2" in err  # reflect's revision, then the criteria hold
    plan2 = json.loads((out / "plans.it2.in.jsonl").read_text().splitlines()[0])["plan"]
    assert plan2["prompt_version"] == "2"
    assert plan2["extra"]["reflections"][-1]["changes"][0]["addresses"] == "policy_violation"
    data = [json.loads(x) for x in (out / "dataset.jsonl").read_text().splitlines()]
    assert len(data) == 2
    rep = data[0]
    assert rep["id"].endswith("-rep1") and rep["extra"]["repair_round"] == 1 and rep["parent_id"]
    assert rep["verifier"]["self_test"]["generator"] == "template" and rep["verifier"]["self_test"]["passed"]
    # the LLM verifier (always-pass) failed its self-test: the template fallback is visible, never silent
    fb = rep["verifier"]["self_test"]["fallback"]
    assert fb["from"] == "llm" and fb["to"] == "template" and fb["sources_tried"] == 3
    assert "falling back to the template verifier" in err
    assert [p["strategy"] for p in rep["provenance"] if p["command"] == "make-verifier"] == ["eigendata+template-fallback"]
    # the repaired trajectory's tool results are the environment's
    from toolkit.envs import load_env

    env_ = load_env({"backend": "sqlite", "id": "airline"})
    tools = [m for m in rep["trajectories"][0]["messages"] if m["role"] == "tool"]
    assert tools[0]["content"] == env_.call("query_reservation", {"reservation_id": 1003}).to_content()
    assert tools[1]["content"] == env_.call("update_reservation", {"reservation_id": 1003, "status": "cancelled"}).to_content()
    # drift audit each iteration: baseline = iteration 1's batch, iteration 2 improved → no drift
    markers = [json.loads(x) for x in (out / "drift.jsonl").read_text().splitlines()]
    assert [m["tags"] for m in markers] == [["no-drift"], ["no-drift"]]
    base = json.loads((out / "drift.baseline.json").read_text())
    # first-pass quality 0/1; the one task took one repair round and its repair passed
    assert base["quality"] == 0.0 and base["repair_rounds"] == 1.0 and base["repair_success"] == 1.0
    # reflect saw the repaired record too
    seen = [json.loads(x)["id"] for x in (out / "it1" / "reflect.in.jsonl").read_text().splitlines()]
    assert len(seen) == 2 and sum(i.endswith("-rep1") for i in seen) == 1
    assert not (out / "DRIFT.jsonl").exists()
    # reflect wrote the evolved prompt into $OUT/prompts and the next iteration's plan pins it
    assert (out / "prompts" / "eigendata" / "user_intent.v2.txt").is_file()
    assert plan2["extra"]["prompt_versions"] == {"user_intent": 2}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("jq") is None, reason="the recipe needs jq")
def test_recipe_stops_on_drift_with_exit_code_and_marker(tmp_path):
    """A pilot baseline with perfect quality; iteration 1's judge fails the trajectory → quality
    1.0 → 0.0 is drift: the loop stops after iteration 1 with exit 3 and the marker record."""
    out = tmp_path / "run"
    base = tmp_path / "pilot.json"
    base.write_text(json.dumps({"records": 10, "infeasibility": 0.0, "tool_validity": 1.0, "quality": 1.0,
                                "repair_rounds": 0.0, "categories": {}}))
    with ScriptedServer(make_universe()) as srv:
        env = dict(os.environ, OUT=str(out), TOOLKIT_BASE_URL=srv.base_url, TOOLKIT_MODEL="scripted",
                   DRIFT_BASELINE=str(base), AUDIT_RATE="1",
                   PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}", PYTHONPATH=str(ROOT))
        r = subprocess.run(["bash", "recipes/eigendata.sh", "airline", "1", "3"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "drift at iteration 1" in r.stderr and "| 1 | verify | 1 | 1 | 1.0 | 0 | 0 | 0 | 0.0 |" in r.stderr
    marker = json.loads((out / "DRIFT.jsonl").read_text())
    assert marker["tags"] == ["drift"] and marker["id"].startswith("drift-")
    # first-pass quality drops, and the repair effort rises: the one task needed one repair round
    # (EigenData Phase 3 drift: "increasing repair iterations"), seen now that drift reads repairs
    assert marker["extra"]["drift"]["signals"] == ["quality 1.0 → 0.0 (degraded realism / success)",
                                                   "repair rounds 0.0 → 1.0"]
    assert marker["extra"]["audited"] == marker["extra"]["batch"] == 2  # the task and its repair
    assert not (out / "it1" / "reflect.jsonl").exists() and not (out / "it2").exists()  # stopped before reflect
    # without K the recipe's gen-plan.n (2 prompt sets) applies: the scripted planner repeats its
    # set, so set 1 is refused as a duplicate of set 0 (the script never asked for just one)
    gp = next(json.loads(x) for x in (out / "stages.jsonl").read_text().splitlines() if '"gen-plan"' in x)
    assert gp["llm"]["requests"] == 3  # set 0, then set 1 twice (attempts: 2)
    assert "prompt set 1" in (out / "gen-plan.rejects.jsonl").read_text()


def _drift(args, records, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(r) + "\n" for r in records)))
    code = D.main(args)
    return code, capsys.readouterr()


def test_drift_marker_and_exit_code(tmp_path, monkeypatch, capsys):
    base = tmp_path / "base.json"
    good = [batch_record(i, ok=True) for i in range(10)]
    code, _ = _drift(["--write-baseline", str(base)], good, monkeypatch, capsys)
    assert code == 0 and json.loads(base.read_text())["infeasibility"] == 0.0
    code, cap = _drift(["--baseline", str(base)], good, monkeypatch, capsys)
    assert code == 0 and json.loads(cap.out)["tags"] == ["no-drift"]
    bad = [batch_record(i, ok=i % 2 == 0) for i in range(10)]
    code, cap = _drift(["--baseline", str(base)], bad, monkeypatch, capsys)
    marker = json.loads(cap.out)
    assert code == 1 and marker["tags"] == ["drift"] and marker["id"].startswith("drift-")
    assert marker["extra"]["drift"]["signals"] == ["infeasibility 0.0 → 0.5"]
    assert marker["extra"]["drift"]["new_categories"] == ["missing_resource"]
    code, _ = _drift(["--baseline", str(base), "--threshold", "infeasibility_up=0.9"], bad, monkeypatch, capsys)
    assert code == 0
    code, _ = _drift([], bad, monkeypatch, capsys)
    assert code == 2


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("jq") is None, reason="the recipe needs jq")
def test_recipe_phase3_keeps_the_prompts_frozen_and_audits(tmp_path):
    """EigenData §4.4 Phase 3: "scale to large batches using the optimized prompts ... The system
    continuously samples instances for auditing": given the pilot's plans, no gen-plan and no
    reflect run; each batch is audited for drift."""
    env0 = dict(os.environ, TOOLKIT_MODEL="scripted", PHASE="3",
                PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}", PYTHONPATH=str(ROOT))
    r = subprocess.run(["bash", "recipes/eigendata.sh", "airline", "1", "1"], cwd=ROOT, env=dict(env0, OUT=str(tmp_path / "x")),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "PHASE=3 needs PLANS" in r.stderr
    plans = tmp_path / "pilot_plans.jsonl"
    plans.write_text(json.dumps({"id": "airline-ps0", "env": {"backend": "sqlite", "id": "airline"},
                                 "plan": {"id": "airline-ps0", "prompt_set": "airline-ps0", "prompt_version": "4"}}) + "\n")
    out = tmp_path / "run"
    with ScriptedServer(make_universe()) as srv:
        r = subprocess.run(["bash", "recipes/eigendata.sh", "airline", "1", "2"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(env0, OUT=str(out), TOOLKIT_BASE_URL=srv.base_url, PLANS=str(plans), DRIFT_EXIT="3"),
                           timeout=600, check=False)
    assert r.returncode in (0, 3), r.stderr[-3000:]
    stages = {json.loads(x)["command"] for x in (out / "stages.jsonl").read_text().splitlines()}
    assert "gen-plan" not in stages and "reflect" not in stages and "gen-task" in stages
    assert (out / "plans.it2.in.jsonl").read_text() == plans.read_text()  # frozen prompt set (version 4)
    assert (out / "drift.jsonl").read_text().strip()  # batch 1 audited (its own baseline)
