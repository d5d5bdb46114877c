"""GRPO advantage math, pure Python (no torch): group advantages, zero-variance filtering, ASTRA's
adaptive batch filling, TA-GRPO per-turn advantages and their expansion to tokens.

The four papers side by side (their RL sections; docs/training.md cites them):
- EigenData [E]: Â(τ_g) = (R_g − μ_G) / σ_G for every token of τ_g; groups whose G rewards are all
  equal are dropped (dynamic filtering; refill NS → `DynamicFilter` does not refill).
- ASTRA [A]: a group is *valid* when Std(R) > δ; `AdaptiveBatcher` concatenates a carry-over
  buffer with each new rollout batch, trains on the first n valid groups and keeps the rest
  (|buffer| < n always), and asks for more rollouts until n valid groups exist.
- LOGIGEN [L] TA-GRPO: A_it = A_i + min(r_t, 0), applied to every policy token of agent turn t;
  a group with equal R still trains through its negative r_t, so it is never filtered.
- Simia [M]: standard GRPO.

Units: a *group* is the G trajectories of one task. ASTRA's n is counted in groups here (the group
is the unit its Std(R) filter keeps or drops).

σ is the population standard deviation (as `toolkit.scoring.rewards.grpo_advantages`, which this
module uses so there is one definition); a group with σ = 0 has advantage 0 for every member.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolkit.scoring.rewards import grpo_advantages


def group_std(rewards: Sequence[float]) -> float:
    n = len(rewards)
    if n == 0:
        return 0.0
    mu = sum(rewards) / n
    return math.sqrt(sum((r - mu) ** 2 for r in rewards) / n)


def group_advantages(rewards: Sequence[float], scale: bool = True) -> list[float]:
    """(R − μ)/σ (scale=True, GRPO) or R − μ (scale=False, Dr. GRPO)."""
    if scale:
        return grpo_advantages(rewards)
    mu = sum(rewards) / len(rewards) if rewards else 0.0
    return [r - mu for r in rewards]


def turn_advantages(a_i: float, turn_rewards: Sequence[float]) -> list[float]:
    """TA-GRPO for one trajectory: A_it = A_i + min(r_t, 0) for each agent turn t."""
    return [a_i + (r if r < 0 else 0.0) for r in turn_rewards]


def token_advantages(turn_adv: Sequence[float], token_turns: Sequence[int]) -> list[float]:
    """Expand per-turn advantages to tokens: token_turns[k] is the agent turn (0-based) of policy
    token k, or −1 for a masked (non-policy) token, which gets 0."""
    return [turn_adv[t] if t >= 0 else 0.0 for t in token_turns]


def turn_dense_rewards(step_rewards: Sequence[float | None], step_turns: Sequence[int], n_turns: int) -> list[float]:
    """r_t per agent turn from verify's per-call dense rewards (steps[i].reward): the sum over the
    turn's tool calls (a turn without calls has r_t = 0; one call per turn is the papers' case)."""
    out = [0.0] * n_turns
    for r, t in zip(step_rewards, step_turns):
        if r is not None and 0 <= t < n_turns:
            out[t] += float(r)
    return out


@dataclass
class Group:
    """One task's G rollouts. `items` are whatever the trainer attaches (episodes)."""
    key: Any
    rewards: list[float]
    items: list[Any] = field(default_factory=list)

    @property
    def std(self) -> float:
        return group_std(self.rewards)


def dynamic_filter(groups: Sequence[Group], delta: float = 0.0) -> tuple[list[Group], list[Group]]:
    """EigenData dynamic filtering / ASTRA validity: keep groups with Std(R) > δ.
    Returns (kept, dropped). δ = 0 drops exactly the all-equal groups."""
    kept, dropped = [], []
    for g in groups:
        (kept if g.std > delta else dropped).append(g)
    return kept, dropped


class AdaptiveBatcher:
    """ASTRA adaptive batch filling (Fig. 5). Target n valid groups per training batch.

    `offer(new_groups)` → (batch or None, stats). The buffer (valid groups left over from earlier
    rollouts, oldest first) is concatenated with the new batch's valid groups; with ≥ n valid the
    first n are the batch and the rest go back to the buffer; otherwise everything valid waits in
    the buffer and the caller rolls out again. |buffer| < n is kept: valid groups beyond n − 1
    left over are discarded (counted in stats["overflow"]).
    """

    def __init__(self, n: int, delta: float = 0.0):
        if n < 1:
            raise ValueError("batch size n must be >= 1")
        self.n = n
        self.delta = delta
        self.buffer: list[Group] = []

    def offer(self, new_groups: Sequence[Group]) -> tuple[list[Group] | None, dict]:
        valid, invalid = dynamic_filter(new_groups, self.delta)
        pool = self.buffer + valid
        stats = {"offered": len(new_groups), "valid": len(valid), "invalid": len(invalid),
                 "from_buffer": 0, "overflow": 0}
        if len(pool) < self.n:
            self.buffer = pool
            stats["buffer"] = len(self.buffer)
            return None, stats
        batch, rest = pool[: self.n], pool[self.n:]
        stats["from_buffer"] = min(len(self.buffer), self.n)
        if len(rest) > self.n - 1:
            stats["overflow"] = len(rest) - (self.n - 1)
            rest = rest[: self.n - 1]
        self.buffer = rest
        stats["buffer"] = len(self.buffer)
        return batch, stats

    def flush(self) -> list[Group]:
        """The valid groups waiting in the buffer, taken out (the trainer's bound on fill rounds hit:
        train on fewer than n rather than roll out forever)."""
        out, self.buffer = self.buffer, []
        return out


# ----------------------------------------------------------------------------------------------
# loss aggregation weights (pure: per-token weights that multiply the per-token surrogate)


LOSS_TYPES = ("grpo", "bnpo", "dapo", "group_token", "dr_grpo", "turn")


def token_weights(seq_lens: Sequence[int], loss_type: str, group_of: Sequence[int] | None = None,
                  token_turns: Sequence[Sequence[int]] | None = None, max_tokens: int | None = None) -> list[list[float]]:
    """Weight w_k of each policy token so that loss = −Σ w_k · surrogate_k reproduces each paper's
    normalization. seq_lens[i] = number of policy tokens of sequence i.

    grpo         (1/B) Σ_i (1/|o_i|) Σ_k            (per-sequence mean, then mean; DeepSeek GRPO)
    dapo, bnpo   1/Σ_i|o_i| Σ_i Σ_k                 (batch-level token mean; ASTRA eq. 32, DAPO)
    group_token  (1/#groups) Σ_g 1/Σ_{i∈g}|o_i| Σ   (EigenData eq. 1: token-level per group, then E_q)
    dr_grpo      1/(B · max_tokens) Σ_i Σ_k         (Dr. GRPO constant normalizer)
    turn         (1/G) Σ_i Σ_t (1/|y_it|) Σ_{k∈t}   (LOGIGEN eq. 5: turn-level ratio terms, 1/G per
                 group, then mean over groups; the ratio term of a turn is its token mean)
    """
    B = len(seq_lens)
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}")
    if B == 0:
        return []
    if loss_type == "grpo":
        return [[1.0 / (B * n)] * n if n else [] for n in seq_lens]
    if loss_type in ("dapo", "bnpo"):
        tot = sum(seq_lens)
        return [[1.0 / tot] * n if tot else [0.0] * n for n in seq_lens]
    groups = list(group_of) if group_of is not None else [0] * B
    n_groups = len(set(groups))
    if loss_type == "group_token":
        per_group: dict[int, int] = {}
        for g, n in zip(groups, seq_lens):
            per_group[g] = per_group.get(g, 0) + n
        return [[1.0 / (n_groups * per_group[g])] * n if per_group[g] else [] for g, n in zip(groups, seq_lens)]
    if loss_type == "dr_grpo":
        m = max_tokens or max(seq_lens)
        return [[1.0 / (B * m)] * n for n in seq_lens]
    # turn
    if token_turns is None:
        raise ValueError("loss_type 'turn' needs token_turns")
    size: dict[int, int] = {}
    for g in groups:
        size[g] = size.get(g, 0) + 1
    out = []
    for g, turns in zip(groups, token_turns):
        counts: dict[int, int] = {}
        for t in turns:
            counts[t] = counts.get(t, 0) + 1
        out.append([1.0 / (n_groups * size[g] * counts[t]) for t in turns])
    return out
