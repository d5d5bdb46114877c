"""Pure reward functions: expected values are computed by hand in the comments (not from the code)."""

import random

import pytest

from toolkit.scoring.state import diff as base_diff
from toolkit.scoring.rewards import (
    TargetIndex,
    action_matches,
    binary_success,
    contains_answer,
    dense_rewards,
    f1_reward,
    grpo_advantages,
    match_actions,
    proximity,
    state_diff,
    state_diff_detail,
    ta_grpo_advantages,
)

EPS = 1e-6  # tolerance for the ε in P_t = 1 − min(D, Δ0)/(Δ0 + ε)

# ---------------------------------------------------------------------------------------------
# a small hand-made episode
#
# target: accounts {1: ann 100, 2: bob 50}, log [{event: "x"}]
# s0:     accounts {1: ann 100, 2: bob 80}, log []
#   DIFF(s0, target): accounts: bob80 only in s0 (1) + bob50 only in target (1); log: x only in target (1)
#   Δ0 = 3, P0 = 1 − 3/3 = 0
# step 1: set bob to 50 (updated_at changes, but it is excluded)  → DIFF = 1 (log)      P1 = 2/3, r1 = 2/3
# step 2: POLICY_VIOLATION (state unchanged)                       → DIFF = 1           P2 = 2/3, r2 = −λ
# step 3: log event "y" (wrong)                                    → DIFF = 2 (y, x)    P3 = 1/3, r3 = −1/3
# step 4: fix the event to "x"                                     → DIFF = 0           P4 = 1,   r4 = 2/3

TARGET = {"accounts": [{"id": 1, "owner": "ann", "balance": 100, "updated_at": "t0"},
                       {"id": 2, "owner": "bob", "balance": 50, "updated_at": "t0"}],
          "log": [{"event": "x"}]}
S0 = {"accounts": [{"id": 1, "owner": "ann", "balance": 100, "updated_at": "t0"},
                   {"id": 2, "owner": "bob", "balance": 80, "updated_at": "t0"}],
      "log": []}
S1 = {"accounts": [{"id": 1, "owner": "ann", "balance": 100, "updated_at": "t0"},
                   {"id": 2, "owner": "bob", "balance": 50, "updated_at": "t1"}],
      "log": []}
S3 = {"accounts": S1["accounts"], "log": [{"event": "y"}]}
S4 = {"accounts": S1["accounts"], "log": [{"event": "x"}]}


TS = ["updated_at"]  # declared technical column (only declared columns are excluded)


def test_diff_hand_made_states():
    assert state_diff(S0, TARGET, TS) == 3
    assert state_diff(S1, TARGET, TS) == 1  # updated_at differs but is declared technical
    assert state_diff(S3, TARGET, TS) == 2
    assert state_diff(S4, TARGET, TS) == 0
    det = state_diff_detail(S0, TARGET, TS)
    assert det["tables"] == {"accounts": {"only_a": 1, "only_b": 1}, "log": {"only_a": 0, "only_b": 1}}
    # with updated_at compared (nothing declared: the default), S1 has one more differing row pair
    assert state_diff(S1, TARGET) == 3
    idx = TargetIndex(TARGET, exclude_keys=TS)
    assert [idx.diff(s) for s in (S0, S1, S3, S4)] == [3, 1, 2, 0]
    assert idx.diff_detail(S3)["tables"] == {"log": {"only_a": 1, "only_b": 1}}


def test_binary_success_and_proximity():
    assert binary_success(0) == 1 and binary_success(2) == 0
    assert proximity(3, 3) == pytest.approx(0.0, abs=EPS)
    assert proximity(1, 3) == pytest.approx(2 / 3, abs=EPS)
    assert proximity(0, 3) == pytest.approx(1.0, abs=EPS)
    # moving further away than the start is clipped at Δ0: P = 0, not negative
    assert proximity(7, 3) == pytest.approx(0.0, abs=EPS)
    # Δ0 = 0: min(D, 0) = 0 so P = 1 whatever the state
    assert proximity(0, 0) == 1.0 and proximity(5, 0) == 1.0


def test_dense_rewards_with_policy_violation():
    diffs = [1, 1, 2, 0]
    viol = [False, True, False, False]
    out = dense_rewards(diffs, 3, viol, lambda_err=0.1)
    assert out["p0"] == pytest.approx(0.0, abs=EPS)
    assert out["proximity"] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1.0], abs=EPS)
    assert out["dense"] == pytest.approx([2 / 3, -0.1, -1 / 3, 2 / 3], abs=EPS)
    # the increments of the non-violating steps telescope: their sum is P4 − P0 minus the
    # (zero) progress of the violating step: 2/3 − 1/3 + 2/3 = 1
    assert sum(r for r, v in zip(out["dense"], viol) if not v) == pytest.approx(1.0, abs=EPS)


def test_dense_rewards_delta0_zero():
    out = dense_rewards([0, 2, 2], 0, [False, False, True], lambda_err=0.5)
    assert out["p0"] == 1.0
    assert out["proximity"] == [1.0, 1.0, 1.0]
    assert out["dense"] == [0.0, 0.0, -0.5]


def test_diff_multiset_exclusions_and_canonical_values():
    # duplicated rows count twice
    assert state_diff({"t": [{"a": 1}, {"a": 1}]}, {"t": [{"a": 1}]}) == 1
    assert TargetIndex({"t": [{"a": 1}]}).diff({"t": [{"a": 1}, {"a": 1}]}) == 1
    assert TargetIndex({"t": [{"a": 1}, {"a": 1}]}).diff({"t": [{"a": 1}, {"a": 2}]}) == 2
    # a table missing on one side: all its rows differ
    assert state_diff({"t": [{"a": 1}], "u": [{"b": 1}, {"b": 2}]}, {"t": [{"a": 1}]}) == 2
    assert TargetIndex({"t": [{"a": 1}]}).diff({"t": [{"a": 1}], "u": [{"b": 1}, {"b": 2}]}) == 2
    assert TargetIndex({"t": [{"a": 1}], "u": [{"b": 1}]}).diff({"t": [{"a": 1}]}) == 1
    # floats: 0.1 + 0.2 equals 0.3 and 2.0 equals 2 after canonicalization
    a = {"t": [{"id": 1, "x": 0.1 + 0.2, "y": 2.0}]}
    b = {"t": [{"id": 1, "x": 0.3, "y": 2}]}
    assert state_diff(a, b) == 0 and TargetIndex(b).diff(a) == 0 and base_diff(a, b)["total"] == 0
    # a float within 1e-9 of an integer is that integer; booleans are 0/1 (SQLite has no bool type)
    e = {"t": [{"id": 1, "v": 2.0000000001, "ok": True}]}
    f = {"t": [{"id": 1, "v": 2, "ok": 1}]}
    assert state_diff(e, f) == 0 and TargetIndex(f).diff(e) == 0
    # row order never matters
    c = {"t": [{"id": 2, "x": "b"}, {"id": 1, "x": "a"}]}
    d = {"t": [{"id": 1, "x": "a"}, {"id": 2, "x": "b"}]}
    assert state_diff(c, d) == 0 and TargetIndex(d).diff(c) == 0
    # configurable exclusions
    assert state_diff({"t": [{"id": 1, "v": 1}]}, {"t": [{"id": 9, "v": 1}]}, exclude_keys=["id"]) == 0
    assert TargetIndex({"t": [{"id": 9, "v": 1}]}, exclude_keys=["id"]).diff({"t": [{"id": 1, "v": 1}]}) == 0
    # nested values and ragged rows fall back to canonical JSON keys
    n1 = {"t": [{"id": 1, "tags": ["a", "b"]}, {"id": 2}]}
    n2 = {"t": [{"id": 1, "tags": ["a", "b"]}, {"id": 2, "extra": None}]}
    assert state_diff(n1, n2) == 2 and TargetIndex(n2).diff(n1) == 2


def test_fast_diff_matches_reference_on_random_states():
    rng = random.Random(7)

    def rand_state():
        st = {}
        for t in range(rng.randint(1, 4)):
            rows = []
            for i in range(rng.randint(0, 12)):
                rows.append({"id": rng.randint(1, 6), "s": rng.choice(["a", "b", "c"]),
                             "f": rng.choice([0.5, 1.0, 1, 0.1 + 0.2, 0.3, None]),
                             "created_at": rng.choice(["x", "y"])})
            st[f"t{t}"] = rows
        return st

    for _ in range(600):
        a, b = rand_state(), rand_state()
        if rng.random() < 0.6:  # near-identical states: a few edited rows, same order
            a = {k: [dict(r) for r in v] for k, v in b.items()}
            stamp = rng.random() < 0.5  # every timestamp differs (excluded key)
            for rows in a.values():
                for r in rows:
                    if rng.random() < 0.15:
                        r["s"] = "z"
                    if rng.random() < 0.1:
                        r["f"] = 0.1 + 0.2 if r["f"] == 0.3 else r["f"]
                    if stamp:
                        r["created_at"] = "later"
                if rows and rng.random() < 0.3:  # an appended or a dropped row
                    if rng.random() < 0.5:
                        rows.append(dict(rows[0], id=99))
                    else:
                        rows.pop()
                if rows and rng.random() < 0.05:  # a ragged row (an extra column)
                    rows[-1]["extra"] = 1
        ex = ["created_at"]
        ref = state_diff(a, b, ex)
        assert TargetIndex(b, ex).diff(a) == ref
        assert TargetIndex(b, ex).diff_detail(a)["total"] == ref
        assert base_diff(a, b, ex)["total"] == ref


def test_grpo_and_ta_grpo_advantages():
    # rewards [1, 0]: mean 0.5, population std 0.5 → A = [+1, −1]
    assert grpo_advantages([1.0, 0.0]) == pytest.approx([1.0, -1.0])
    assert grpo_advantages([1.0, 1.0]) == [0.0, 0.0]
    # TA-GRPO adds only the negative dense rewards
    adv = ta_grpo_advantages([1.0, 0.0], [[0.5, -0.1], [0.2, -0.3]])
    assert adv[0] == pytest.approx([1.0, 0.9]) and adv[1] == pytest.approx([-1.0, -1.3])


# ---------------------------------------------------------------------------------------------
# tau2 action matching


def test_action_matching_tau2_rules():
    exp = {"name": "update", "arguments": {"rid": 1, "cabin": "economy"}, "compare_args": None}
    # exact call
    assert action_matches(exp["name"], exp["arguments"], None, "update", {"rid": 1, "cabin": "economy"})
    # a different value
    assert not action_matches(exp["name"], exp["arguments"], None, "update", {"rid": 1, "cabin": "business"})
    # compare_args None compares the *call's* keys: an extra argument in the call fails ...
    assert not action_matches("update", exp["arguments"], None, "update", {"rid": 1, "cabin": "economy", "x": 0})
    # ... and a call omitting an expected argument still matches (tau2's rule)
    assert action_matches("update", exp["arguments"], None, "update", {"rid": 1})
    # compare_args: only those keys count
    assert action_matches("update", exp["arguments"], ["rid"], "update", {"rid": 1, "cabin": "business"})
    assert not action_matches("update", exp["arguments"], ["rid"], "update", {"rid": 2, "cabin": "economy"})
    # empty compare_args: the name is enough
    assert action_matches("update", exp["arguments"], [], "update", {"rid": 99})
    # a different name never matches
    assert not action_matches("update", exp["arguments"], None, "cancel", {"rid": 1, "cabin": "economy"})


def test_match_actions_any_order_extra_calls_ignored():
    expected = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": 2}, "compare_args": ["y"]}]
    calls = [("noise", {}), ("b", {"y": 2, "z": 3}), ("a", {"x": 1})]
    res = match_actions(expected, calls)
    assert res.reward == 1.0 and res.matched == [True, True] and res.matched_by == [2, 1]
    res = match_actions(expected, [("a", {"x": 2}), ("b", {"y": 2})])
    assert res.reward == 0.0 and res.matched == [False, True]


def test_action_matching_agrees_with_tau2():
    tasks = pytest.importorskip("tau2.data_model.tasks")
    msg = pytest.importorskip("tau2.data_model.message")
    cases = [
        ({"rid": 1, "cabin": "economy"}, None, {"rid": 1, "cabin": "economy"}),
        ({"rid": 1, "cabin": "economy"}, None, {"rid": 1}),
        ({"rid": 1, "cabin": "economy"}, None, {"rid": 1, "cabin": "economy", "x": 0}),
        ({"rid": 1, "cabin": "economy"}, ["rid"], {"rid": 1, "cabin": "business"}),
        ({"rid": 1, "cabin": "economy"}, ["cabin"], {"rid": 1, "cabin": "business"}),
        ({"rid": 1}, [], {}),
        ({"rid": 1}, None, {}),
        ({"rid": [1, 2]}, None, {"rid": [1, 2]}),
    ]
    for args, cmp, call_args in cases:
        act = tasks.Action(action_id="a0", name="f", arguments=args, compare_args=cmp)
        tc = msg.ToolCall(id="c0", name="f", arguments=call_args)
        assert action_matches("f", args, cmp, "f", call_args) == act.compare_with_tool_call(tc), (args, cmp, call_args)


# ---------------------------------------------------------------------------------------------
# ASTRA F1


def test_f1_hand_computed():
    # n = 3, n̂ = 2, c = 4: r = 2/3, p = 2/4 = 0.5, F1 = 2·(1/2)·(2/3) / (1/2 + 2/3) = (2/3)/(7/6) = 4/7
    out = f1_reward(3, 2, 4)
    assert out["recall"] == pytest.approx(2 / 3)
    assert out["precision"] == pytest.approx(0.5)
    assert out["f1"] == pytest.approx(4 / 7)
    # all solved with exactly one call each: r = p = 1
    assert f1_reward(2, 2, 2)["f1"] == pytest.approx(1.0)
    # all solved with 6 calls for 2 sub-tasks: r = 1, p = 1/3, F1 = 2·(1/3)/(4/3) = 1/2
    assert f1_reward(2, 2, 6)["f1"] == pytest.approx(0.5)
    # nothing solved / no calls: F1 = 0 (p + r = 0)
    assert f1_reward(3, 0, 0)["f1"] == 0.0
    with pytest.raises(ValueError):
        f1_reward(0, 0, 1)


def test_contains_answer():
    assert contains_answer('{"temp": 21, "city": "Paris"}', "paris")
    assert contains_answer("It costs 42 dollars", 42.0)
    assert not contains_answer("nothing here", "Paris")
    assert not contains_answer(None, "x")
