"""GRPO advantage math on hand-computed examples (toolkit.train.advantages; no torch needed)."""

import math

import pytest

from toolkit.train import advantages as A


def approx(xs):
    return pytest.approx(xs, abs=1e-9)


def test_group_advantage_hand_computed():
    # R = [1, 0, 1, 0]: mean 0.5, population std 0.5 -> (R - 0.5)/0.5
    assert A.group_advantages([1, 0, 1, 0]) == approx([1, -1, 1, -1])
    # R = [1, 0, 0, 0]: mean .25, std sqrt(.1875) = .4330127
    s = math.sqrt(0.1875)
    assert A.group_advantages([1, 0, 0, 0]) == approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s])
    assert A.group_advantages([1, 0, 0, 0], scale=False) == approx([0.75, -0.25, -0.25, -0.25])
    assert A.group_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]


def test_ta_grpo_token_by_token():
    adv = A.group_advantages([1, 0, 1, 0])  # A_i = [1, -1, 1, -1]
    # trajectory 0: three agent turns with dense r_t = 0.5, -0.1, 0.5 -> penalties only on turn 1
    t0 = A.turn_advantages(adv[0], [0.5, -0.1, 0.5])
    assert t0 == approx([1.0, 0.9, 1.0])
    # tokens: turn 0 (2 tokens), tool result (2 masked), turn 1 (1 token), user (1 masked), turn 2 (2)
    tok = A.token_advantages(t0, [0, 0, -1, -1, 1, -1, 2, 2])
    assert tok == approx([1.0, 1.0, 0.0, 0.0, 0.9, 0.0, 1.0, 1.0])
    # trajectory 1 (failed): r_t = -0.1 (policy violation), 0 -> A_1t = [-1.1, -1]
    t1 = A.turn_advantages(adv[1], [-0.1, 0.0])
    assert A.token_advantages(t1, [0, 0, 0, -1, 1]) == approx([-1.1, -1.1, -1.1, 0.0, -1.0])
    # an all-equal group still trains through negative r_t (never filtered in TA-GRPO)
    eq = A.group_advantages([0, 0])
    assert A.turn_advantages(eq[0], [-0.1, 0.2]) == approx([-0.1, 0.0])


def test_turn_dense_rewards_sum_calls_per_turn():
    # calls in turns 0, 0, 2; turn 1 had no call; a None reward (unverified call) counts 0
    assert A.turn_dense_rewards([0.25, -0.1, None], [0, 0, 2], 3) == approx([0.15, 0.0, 0.0])


def test_dynamic_filter_drops_all_equal_groups():
    gs = [A.Group("all-pass", [1, 1, 1, 1]), A.Group("all-fail", [0, 0, 0, 0]),
          A.Group("mixed", [1, 0, 0, 0]), A.Group("f1-equal", [0.5, 0.5, 0.5, 0.5])]
    kept, dropped = A.dynamic_filter(gs)
    assert [g.key for g in kept] == ["mixed"]
    assert [g.key for g in dropped] == ["all-pass", "all-fail", "f1-equal"]
    # a threshold delta: std([1,0,0,0]) = .433 > .4 kept, not > .5
    assert [g.key for g in A.dynamic_filter(gs, 0.4)[0]] == ["mixed"]
    assert A.dynamic_filter(gs, 0.5)[0] == []


def test_adaptive_batching_keeps_batch_full_from_buffer():
    b = A.AdaptiveBatcher(n=2, delta=0.0)
    v = lambda k: A.Group(k, [1, 0])
    z = lambda k: A.Group(k, [1, 1])
    batch, st = b.offer([v("a"), z("b")])
    assert batch is None and [g.key for g in b.buffer] == ["a"] and st["invalid"] == 1
    batch, st = b.offer([v("c"), v("d"), v("e")])
    # buffer first, then new valid; leftover d stays, e overflows (|buffer| < n)
    assert [g.key for g in batch] == ["a", "c"]
    assert [g.key for g in b.buffer] == ["d"] and st["from_buffer"] == 1 and st["overflow"] == 1
    batch, st = b.offer([z("f")])
    assert batch is None and [g.key for g in b.buffer] == ["d"]
    batch, st = b.offer([v("g")])
    assert [g.key for g in batch] == ["d", "g"] and b.buffer == [] and len(batch) == b.n


def test_token_weights_per_loss_type():
    lens = [2, 3]
    assert A.token_weights(lens, "grpo") == [approx([0.25, 0.25]), approx([1 / 6] * 3)]
    assert A.token_weights(lens, "dapo") == [approx([0.2, 0.2]), approx([0.2] * 3)]
    # EigenData: token-level within a group, mean over groups
    assert A.token_weights(lens, "group_token", group_of=[0, 0]) == [approx([0.2] * 2), approx([0.2] * 3)]
    assert A.token_weights(lens, "group_token", group_of=[0, 1]) == [approx([0.25] * 2), approx([1 / 6] * 3)]
    assert A.token_weights(lens, "dr_grpo", max_tokens=4) == [approx([1 / 8] * 2), approx([1 / 8] * 3)]
    # LOGIGEN: 1/G over trajectories, each turn's ratio term is its token mean
    w = A.token_weights(lens, "turn", group_of=[0, 0], token_turns=[[0, 1], [0, 0, 1]])
    assert w == [approx([0.5, 0.5]), approx([0.25, 0.25, 0.5])]
    with pytest.raises(ValueError):
        A.token_weights(lens, "nope")
