"""pass^k and pass@k (toolkit.tau2.summary) against values worked out by hand."""

from __future__ import annotations

import pytest

from toolkit.tau2.summary import is_success, pass_at_k, pass_hat_k


def test_pass_hat_k_hand_values():
    # 2 successes in 4 trials: of the C(4,2)=6 pairs only the one pair of successes passes.
    assert pass_hat_k(2, 4, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(3, 4, 4) == 0.0
    assert pass_hat_k(3, 4, 1) == pytest.approx(3 / 4)


def test_pass_at_k_hand_values():
    # 1 - C(2,2)/C(4,2): only the pair of two failures misses.
    assert pass_at_k(2, 4, 2) == pytest.approx(5 / 6)
    assert pass_at_k(0, 4, 2) == 0.0
    assert pass_at_k(1, 4, 4) == 1.0


@pytest.mark.parametrize("args", [(1, 4, 0), (1, 2, 3), (5, 4, 2), (-1, 4, 2)])
def test_out_of_range_is_an_error(args):
    with pytest.raises(ValueError):
        pass_hat_k(*args)
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_success_is_reward_one():
    assert is_success(1.0) and is_success(1)
    assert not is_success(0.99) and not is_success(None) and not is_success(0.0)
