"""Dense reward penalties for invalid calls and target rebuilding with an expected violation
(LOGIGEN items in verify state_diff / toolkit.scoring.rewards). Expected values by hand in comments."""

from __future__ import annotations

import asyncio
import json

import pytest

from toolkit.io import StageError
from toolkit.schema import Record
from toolkit.stages.verify import build
from toolkit.scoring import rewards as R

EPS = 1e-6

MINI = {
    "name": "mini",
    "policy": "- [no_negative] Balances never go below zero.",
    "schema": (
        "CREATE TABLE account ( -- bank accounts\n"
        "  account_id TEXT PRIMARY KEY,\n  owner TEXT NOT NULL,\n  balance INTEGER NOT NULL\n);\n"
        "CREATE TRIGGER account_no_negative BEFORE UPDATE OF balance ON account\n"
        "WHEN NEW.balance < 0\nBEGIN\n"
        "  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_negative: balances cannot go below zero');\nEND;\n"),
    "seed": {"account": [{"account_id": "A1", "owner": "ann", "balance": 100},
                         {"account_id": "A2", "owner": "bob", "balance": 80}]},
}


@pytest.fixture
def env(tmp_path):
    p = tmp_path / "mini.json"
    p.write_text(json.dumps(MINI))
    return {"backend": "sqlite", "path": str(p)}


def msgs(calls):
    out = [{"role": "user", "content": "fix bob"}]
    for i, (name, args) in enumerate(calls):
        raw = args if isinstance(args, str) else json.dumps(args)
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": raw}}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": "{}"})
    return out


def run(cfg, rec):
    return asyncio.run(build(cfg, None)(rec))


def rec(env, calls, gt):
    return Record.model_validate({"id": "r", "env": env, "task": {"ground_truth": gt},
                                  "trajectories": [{"id": "t", "messages": msgs(calls)}]})


def test_penalized_codes():
    assert R.penalized("POLICY_VIOLATION") and R.penalized("POLICY_VIOLATION", False)
    assert R.penalized("UNKNOWN_TOOL") and R.penalized("INVALID_ARGUMENTS")
    assert not R.penalized("UNKNOWN_TOOL", False) and not R.penalized("INVALID_ARGUMENTS", False)
    assert not R.penalized("NOT_FOUND") and not R.penalized(None)


# target: bob 50 → Δ0 = 2 (one row out, one in). Calls:
#  1 delete_account (no such tool)     UNKNOWN_TOOL       DIFF 2  P 0   r = −λ (on) / 0 (off)
#  2 update_account balance "x"         INVALID_ARGUMENTS  DIFF 2  P 0   r = −λ (on) / 0 (off)
#  3 update_account balance −1          POLICY_VIOLATION   DIFF 2  P 0   r = −λ always
#  4 update_account balance 50          ok                 DIFF 0  P 1   r = 1
CALLS = [("delete_account", {"account_id": "A2"}),
         ("update_account", {"account_id": "A2", "balance": "x"}),
         ("update_account", {"account_id": "A2", "balance": -1}),
         ("update_account", {"account_id": "A2", "balance": 50})]
TARGET = {"account": [{"account_id": "A1", "owner": "ann", "balance": 100},
                      {"account_id": "A2", "owner": "bob", "balance": 50}]}


def test_invalid_calls_penalized_by_default(env):
    t = run({"strategy": ["state_diff"], "lambda_err": 0.5}, rec(env, CALLS, {"target_state": TARGET})).trajectories[0]
    sd = t.scores["state_diff"]
    assert sd["dense"] == pytest.approx([-0.5, -0.5, -0.5, 1.0], abs=EPS)
    assert sd["violations"] == 3 and sd["penalize_invalid_calls"] is True and t.reward == 1.0
    assert [s.error_code for s in t.steps] == ["UNKNOWN_TOOL", "INVALID_ARGUMENTS", "POLICY_VIOLATION", None]


def test_invalid_call_penalty_can_be_switched_off(env):
    cfg = {"strategy": ["state_diff"], "lambda_err": 0.5, "penalize_invalid_calls": "false"}
    t = run(cfg, rec(env, CALLS, {"target_state": TARGET})).trajectories[0]
    assert t.scores["state_diff"]["dense"] == pytest.approx([0.0, 0.0, -0.5, 1.0], abs=EPS)
    assert t.scores["state_diff"]["violations"] == 1


def test_unrecoverable_arguments_penalized(env):
    # a step whose call cannot be recovered (rollout logged INVALID_ARGUMENTS for unparseable JSON)
    d = rec(env, CALLS[3:], {"target_state": TARGET}).model_dump()
    d["trajectories"][0]["steps"] = [
        {"tool_call_id": "lost", "name": "update_account", "ok": False, "error_code": "INVALID_ARGUMENTS"},
        {"tool_call_id": "c0", "name": "update_account", "ok": True}]
    r = Record.model_validate(d)
    t = run({"strategy": ["state_diff"], "lambda_err": 0.2}, r).trajectories[0]
    assert t.scores["state_diff"]["dense"] == pytest.approx([-0.2, 1.0], abs=EPS)
    t = run({"strategy": ["state_diff"], "lambda_err": 0.2, "penalize_invalid_calls": False},
            Record.model_validate(r.model_dump())).trajectories[0]
    assert t.scores["state_diff"]["dense"] == pytest.approx([0.0, 1.0], abs=EPS)


def test_target_rebuilt_from_actions_with_expected_violation(env):
    from toolkit.scoring.state import state_hash

    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": -1},
                       "expect_error": "POLICY_VIOLATION"},
                      {"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}}],
          "target_state_ref": state_hash(TARGET)}
    out = run({"strategy": ["state_diff"]}, rec(env, CALLS[2:], gt))
    assert out.trajectories[0].reward == 1.0
    # without expect_error the failing reference action is fatal, naming it
    bad = json.loads(json.dumps(gt))
    del bad["actions"][0]["expect_error"]
    with pytest.raises(StageError) as e:
        run({"strategy": ["state_diff"]}, rec(env, CALLS[2:], bad))
    assert e.value.field == "task.ground_truth.actions.0" and "POLICY_VIOLATION" in str(e.value)
    # an expected error that does not happen is fatal too
    wrong = json.loads(json.dumps(gt))
    wrong["actions"][1]["expect_error"] = "POLICY_VIOLATION"
    with pytest.raises(StageError) as e:
        run({"strategy": ["state_diff"]}, rec(env, CALLS[2:], wrong))
    assert e.value.field == "task.ground_truth.actions.1" and "got success" in str(e.value)


def test_replay_agent_replays_expected_violation(env):
    from toolkit.stages.rollout import build as rollout_build

    gt = {"actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": -1},
                       "expect_error": "POLICY_VIOLATION"},
                      {"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}}]}
    r = Record.model_validate({"id": "r", "env": env, "task": {"ground_truth": gt}})
    r = asyncio.run(rollout_build({"agent_kind": "replay"}, None)(r))
    out = run({"strategy": ["state_diff"], "lambda_err": 0.1}, r)
    t = out.trajectories[0]
    assert t.reward == 1.0 and [s.error_code for s in t.steps] == ["POLICY_VIOLATION", None]
    assert t.scores["state_diff"]["dense"] == pytest.approx([-0.1, 1.0], abs=EPS)
