"""make-verifier --strategy eigendata: perturbations (exact), the sandbox self-test (a correct
hand-written verifier passes, always-pass and state-blind verifiers are rejected), the LLM writer
with malformed replies and regeneration, and agreement with verify --strategy state_diff."""

import asyncio

import pytest

from tests.flows.eigendata.util import run_strategy
from toolkit.domains import load_tasks
from toolkit.envs import load_env
from toolkit.flows.eigendata import common as C
from toolkit.flows.eigendata import make_verifier as MV
from toolkit.flows.eigendata import options as O
from toolkit.flows.eigendata.perturb import POLICY_ERROR, bump_id, perturbations
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record

CALLS = [
    {"name": "query_reservation", "arguments": {"reservation_id": 1003}, "state_changed": False},
    {"name": "update_reservation", "arguments": {"reservation_id": 1003, "status": "cancelled"}, "state_changed": True},
    {"name": "insert_payment", "arguments": {"payment_id": "gift_card_7791", "amount": 100}, "state_changed": True},
]


def test_bump_id():
    assert [bump_id(x) for x in (9, 1003, "gift_card_7791", "ABC", "Z9", "az", "__")] == \
        [10, 1004, "gift_card_7792", "ABD", "Z0", "aa", "__X"]


def test_perturbations_exact():
    ps = {p.name: p for p in perturbations(CALLS)}
    assert list(ps) == ["wrong_id", "wrong_amount", "missing_key_call", "policy_violation", "unchanged_state",
                        "no_calls"]
    assert ps["no_calls"].calls == []
    assert ps["wrong_id"].calls[1]["arguments"] == {"reservation_id": 1004, "status": "cancelled"}
    assert ps["wrong_id"].calls[0]["arguments"] == {"reservation_id": 1003}  # reads untouched
    assert ps["wrong_amount"].calls[2]["arguments"] == {"payment_id": "gift_card_7791", "amount": 101}
    assert [c["name"] for c in ps["missing_key_call"].calls] == ["query_reservation", "update_reservation"]
    pv = ps["policy_violation"].calls
    assert len(pv) == 4 and pv[3]["name"] == "update_reservation" and pv[3]["injected_result"] == POLICY_ERROR
    assert ps["unchanged_state"].unchanged_state and ps["unchanged_state"].calls == [
        dict(c, arguments=c["arguments"]) for c in CALLS]
    # key calls restricted to must_have_functions
    ps = {p.name: p for p in perturbations(CALLS, must_have=["insert_payment"])}
    assert ps["wrong_id"].calls[2]["arguments"]["payment_id"] == "gift_card_7792"
    assert [c["name"] for c in ps["missing_key_call"].calls] == ["query_reservation", "update_reservation"]
    # the input is never mutated
    assert CALLS[1]["arguments"]["reservation_id"] == 1003
    # a read-only reference (a lookup task): its outcome is observable only through its calls
    # (App. 3.1 Part 2 "function calls"), so the lookup is the key call: wrong id, dropped, none at all
    ps = {p.name: p for p in perturbations(CALLS[:1])}
    assert {n for n, p in ps.items() if p.applicable} == {"wrong_id", "missing_key_call", "policy_violation", "no_calls"}
    assert ps["wrong_id"].calls[0]["arguments"] == {"reservation_id": 1004}
    assert ps["missing_key_call"].calls == []
    # a reference with no call: nothing to perturb
    assert not any(p.applicable for p in perturbations([]))
    # an environment that never refuses with POLICY_VIOLATION (τ²): no injected refusal to test
    ps = {p.name: p for p in perturbations(CALLS, policy_codes=False)}
    assert not ps["policy_violation"].applicable and "never refuses" in ps["policy_violation"].why


CORRECT = '''
def evaluate_submission(reference, eval):
    init = {r["reservation_id"]: r for r in eval["initial_state"]["reservation"]}
    fin = {r["reservation_id"]: r for r in eval["final_state"]["reservation"]}
    state_ok = (init[1003]["status"] == "active" and fin[1003]["status"] == "cancelled"
                and all(fin[k] == v for k, v in init.items() if k != 1003))
    calls_ok = any(c["name"] == "update_reservation" and c["ok"] and c["arguments"].get("reservation_id") == 1003
                   for c in eval["tool_calls"])
    policy_ok = not any("POLICY_VIOLATION" in (c.get("result") or "") for c in eval["tool_calls"])
    ok = state_ok and calls_ok and policy_ok
    return {"overall_pass": ok, "reward": 1.0 if ok else 0.0,
            "component_scores": {"state": float(state_ok), "key_functions": float(calls_ok), "policy": float(policy_ok)}}
'''
ALWAYS_PASS = "def evaluate_submission(reference, eval):\n    return {'overall_pass': True, 'reward': 1.0, 'component_scores': {}}\n"
STATE_BLIND = '''
def evaluate_submission(reference, eval):
    ok = any(c["name"] == "update_reservation" and c["ok"] and c["arguments"].get("reservation_id") == 1003
             for c in eval["tool_calls"]) and not any("POLICY_VIOLATION" in (c.get("result") or "") for c in eval["tool_calls"])
    return {"overall_pass": ok, "reward": float(ok), "component_scores": {}}
'''


@pytest.fixture(scope="module")
def task1_cases():
    rec = Record.model_validate(load_tasks("airline")[0])
    env = load_env(rec.env)
    calls, _ = MV.reference_calls(rec)
    cases, ref_eval, executed = MV.self_test_cases(env, calls, [])
    env.close()
    return rec, cases, ref_eval, executed


def test_self_test_accepts_correct_and_rejects_bad_verifiers(task1_cases):
    rec, cases, _, _ = task1_cases
    ref = rec.task.ground_truth.model_dump(mode="json")
    st = MV.self_test(CORRECT, ref, cases, O.MakeVerifierOptions())
    assert st["passed"] and st["n_ok"] == st["n_cases"] == 6  # reference + 5 applicable perturbations
    st = MV.self_test(ALWAYS_PASS, ref, cases, O.MakeVerifierOptions())
    assert not st["passed"] and {r["case"] for r in st["cases"] if not r.get("ok") and "skipped" not in r} == {
        "wrong_id", "missing_key_call", "policy_violation", "unchanged_state", "no_calls"}
    st = MV.self_test(STATE_BLIND, ref, cases, O.MakeVerifierOptions())
    assert not st["passed"] and [r["case"] for r in st["cases"] if "skipped" not in r and not r["ok"]] == ["unchanged_state"]
    st = MV.self_test("def evaluate_submission(reference, eval):\n    raise RuntimeError('boom')\n", ref, cases, O.MakeVerifierOptions())
    assert not st["passed"] and st["cases"][0]["got"] == "error" and "boom" in st["cases"][0]["error"]


def test_perturbed_evals_are_real_executions(task1_cases):
    _, cases, ref_eval, executed = task1_cases
    env = load_env({"backend": "sqlite", "id": "airline"})
    wrong = next(c for c in cases if c["name"] == "wrong_id")["eval"]
    assert wrong["tool_calls"][0]["arguments"]["reservation_id"] == 1004
    assert wrong["tool_calls"][0]["result"] == env.call("update_reservation", {"reservation_id": 1004, "status": "cancelled"}).to_content()
    assert executed[0]["state_changed"] and ref_eval["final_state"] != ref_eval["initial_state"]
    un = next(c for c in cases if c["name"] == "unchanged_state")["eval"]
    assert un["final_state"] == un["initial_state"] and un["tool_calls"] == ref_eval["tool_calls"]


def fenced(src):
    return "Here it is:\n```python\n" + src + "\n```"


def test_llm_writer_regenerates_after_failed_self_test():
    replies = ["I would check the state.", fenced(ALWAYS_PASS), fenced("def evaluate_submission(reference):\n    pass"),
               fenced(CORRECT)]
    with ScriptedServer(replies) as srv:
        out = run_strategy("make-verifier", {"base_url": srv.base_url}, load_tasks("airline")[0], "eigendata")
        assert srv.chat_count == 4
        assert "failed its self-test" in srv.requests[2]["messages"][0]["content"]  # feedback reached the LLM
    st = out.verifier.self_test
    assert st["generator"] == "llm" and st["passed"] and out.verifier.source.strip() == CORRECT.strip()
    assert [h.get("passed") for h in st["history"]] == [False, True]
    v = out.verdicts[-1]
    assert v.stage == "make-verifier" and v.passed and v.kind == "verifier"


def test_llm_failures_fall_back_to_template_or_fail():
    with ScriptedServer([fenced(ALWAYS_PASS)]) as srv:
        out = run_strategy("make-verifier", {"base_url": srv.base_url, "verifier_attempts": 2},
                           load_tasks("airline")[0], "eigendata")
    assert out.verifier.self_test["generator"] == "template" and out.verdicts[-1].passed
    with ScriptedServer([fenced(ALWAYS_PASS), "```python\ndef evaluate_submission(reference, eval):\n"]) as srv:
        out = run_strategy("make-verifier", {"base_url": srv.base_url, "verifier_attempts": 1,
                                             "verifier_fallback": "none"}, load_tasks("airline")[0], "eigendata")
    v = out.verdicts[-1]
    assert not v.passed and v.attribution == "task" and "no verifier passed its self-test" in v.reasons[0]
    assert out.verifier.source.strip() == ALWAYS_PASS.strip()  # kept for inspection, marked failed


def _traj(env, calls, tid):
    items = [{"role": "user", "content": "please"}] + [
        {"tool_call": {"name": c["name"], "arguments": c["arguments"]}, "side": c.get("side", "agent")} for c in calls] + [
        {"role": "assistant", "content": "done"}]
    env.reset()
    t = C.calls_to_trajectory(env, items, tid, system="policy")
    env.reset()
    return t


def agreement_with_state_diff(out: Record, rid: str) -> list[str]:
    """Replay the reference and its wrong_id / wrong_amount / missing_key_call perturbations, verify
    each with state_diff and the record's code verifier, and assert both agree where the task
    changes the state (only the reference passes the verifier in every case). Returns the
    trajectory ids checked."""
    from toolkit.stages import verify

    env = load_env(out.env)
    calls, _ = MV.reference_calls(out)
    _, executed = MV.build_eval(env, calls, "x")
    trajs = [_traj(env, calls, "reference")]
    for p in perturbations(executed, []):
        if p.applicable and p.name in ("wrong_id", "wrong_amount", "missing_key_call"):
            trajs.append(_traj(env, p.calls, p.name))
    env.close()
    rec = out.model_copy(deep=True)
    rec.trajectories = trajs
    rec.verdicts = []

    async def go():
        return await verify.build({"strategy": ["state_diff", "code"]}, None)(rec)

    res = asyncio.run(go())
    for t in res.trajectories:
        sd = next(v for v in res.verdicts if v.trajectory_id == t.id and v.name == "state_diff")
        code = next(v for v in res.verdicts if v.trajectory_id == t.id and v.name == "code")
        if sd.scores["delta0"] > 0:  # a task that changes the state: both judge the same outcome
            assert sd.passed == code.passed, (rid, t.id, sd.reasons, code.reasons)
        # a lookup task (no state change): state_diff passes anything; the verifier still checks
        # the key function calls (App. 3.1 Part 2), so only the reference passes it
        assert code.passed == (t.id == "reference"), (rid, t.id, code.reasons)
    return [t.id for t in res.trajectories]


@pytest.mark.parametrize("domain", ["airline", "clinic"])
def test_template_verifiers_agree_with_state_diff(domain):
    checked = 0
    for raw in load_tasks(domain):
        out = run_strategy("make-verifier", {"verifier_source": "template"}, raw, "eigendata")
        assert out.verdicts[-1].passed, out.verdicts[-1].reasons
        ids = agreement_with_state_diff(out, raw["id"])
        checked += len(ids)
    assert checked >= 12
