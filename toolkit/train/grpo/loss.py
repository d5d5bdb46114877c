"""Sequence advantages: per-policy-token advantages of every episode of a batch of groups (the loss
itself is `trainer.surrogate` with the weights of `batch.global_rows`)."""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.train import advantages as ADV
from toolkit.train.grpo.episodes import Episode
from toolkit.train.grpo.options import GRPOOptions


def sequence_advantages(groups: Sequence[ADV.Group], opts: GRPOOptions) -> list[tuple[Episode, list[float], int]]:
    """(episode, per-policy-token advantages, group index) for every episode of the batch."""
    out = []
    for gi, g in enumerate(groups):
        adv = ADV.group_advantages(g.rewards, scale=opts.scale_rewards)
        for a, ep in zip(adv, g.items):
            turns = [t for t, m in zip(ep.turn_of, ep.mask) if m]
            if opts.advantage == "ta_grpo":
                per_turn = ADV.turn_advantages(a, ep.turn_rewards or [0.0] * len(ep.calls_per_turn))
                tok_adv = ADV.token_advantages(per_turn, turns)
            else:
                tok_adv = [a] * len(turns)
            out.append((ep, tok_adv, gi))
    return out
