"""From gathered groups to one rank's training rows: the global selection (filtering / ASTRA filling),
the global loss weights, the split of the rows across ranks and their tensors.

Everything here runs on the GATHERED groups of every rank, in task order, so every rank takes the
same decision and the same normalizers: a rank never skips a step (the old per-rank loop hung when
one rank's batch was filtered empty) and a run on N processes computes the same loss as one
process over the same global batch (each rank's weights are multiplied by N because DDP averages
gradients over ranks).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from toolkit.train import advantages as ADV
from toolkit.train.grpo.loss import sequence_advantages
from toolkit.train.grpo.options import GRPOOptions

# test-only hook (documented in docs/training.md): the rank whose index this names treats every
# group it rolled out as filtered, to exercise the cross-rank decision (a rank with nothing to train).
FORCE_FILTER_ENV = "GRPO_TEST_FILTER_RANK"


def forced_filter_rank() -> int | None:
    v = os.environ.get(FORCE_FILTER_ENV)
    return int(v) if v not in (None, "") else None


@dataclass
class Selection:
    """The decision for one optimizer step (identical on every rank)."""
    batch: list[ADV.Group]
    groups_seen: list[ADV.Group]
    rounds: int = 0
    from_buffer: int = 0
    overflow: int = 0
    bound_hit: bool = False          # max_fill_rounds reached before the batch was complete
    forced_filtered: int = 0         # groups dropped by the test hook
    invalid: int = 0                 # groups with Std(R) <= delta (under dynamic / adaptive)
    stats: dict = field(default_factory=dict)


class Selector:
    """Feed it the gathered groups of each rollout round; it says when the step's batch is ready.

    none      the round's groups (a round whose groups are all dropped by the test hook rolls again)
    dynamic   EigenData: the round's groups with Std(R) > delta; a round where every group is
              filtered does not make a step: another round is rolled out (bounded by max_fill_rounds)
    adaptive  ASTRA: buffer + valid groups until n = tasks_per_step valid groups exist (bounded by
              max_fill_rounds; when the bound hits, the valid groups gathered so far are trained)
    """

    def __init__(self, opts: GRPOOptions, batcher: ADV.AdaptiveBatcher | None):
        self.o, self.batcher = opts, batcher

    def start(self) -> Selection:
        return Selection(batch=[], groups_seen=[])

    def offer(self, sel: Selection, groups: Sequence[ADV.Group], forced: Sequence[bool]) -> bool:
        """True when the step's batch is decided."""
        o = self.o
        sel.rounds += 1
        sel.groups_seen += list(groups)
        sel.forced_filtered += sum(1 for f in forced if f)
        usable = [g for g, f in zip(groups, forced) if not f]
        if o.filter == "none":
            sel.batch = usable
        elif o.filter == "dynamic":
            kept, dropped = ADV.dynamic_filter(usable, o.delta)
            sel.invalid += len(dropped)
            sel.batch = kept
        else:
            batch, st = self.batcher.offer(usable)
            sel.invalid += st["invalid"]
            sel.from_buffer += st["from_buffer"]
            sel.overflow += st["overflow"]
            if batch is not None:
                sel.batch = batch
                return True
            if sel.rounds >= o.max_fill_rounds:
                sel.bound_hit = True
                sel.batch = self.batcher.flush()
                return True
            return False
        if sel.batch:
            return True
        if sel.rounds >= o.max_fill_rounds:
            sel.bound_hit = True
            return True
        return False


# ----------------------------------------------------------------------------------------------
# rows and weights


@dataclass
class Row:
    ids: list[int]
    policy: list[int]           # 1 on sampled tokens, per position of ids
    adv: list[float]            # per position of ids (0 off-policy)
    weight: list[float]         # global loss weight per position of ids
    sampling_logps: list[float] | None = None  # behaviour policy log-prob per position (NaN off-policy)
    turns: list[int] | None = None  # agent turn of each position (-1 = context)


def global_rows(batch: Sequence[ADV.Group], opts: GRPOOptions) -> list[Row]:
    """Every trainable sequence of the global batch with its token advantages and the GLOBAL
    normalization weight of each policy token (ADV.token_weights over the whole batch)."""
    items = [it for it in sequence_advantages(batch, opts) if it[0].policy_tokens > 0]
    if not items:
        return []
    seq_lens = [ep.policy_tokens for ep, _, _ in items]
    turns = [[t for t, m in zip(ep.turn_of, ep.mask) if m] for ep, _, _ in items]
    weights = ADV.token_weights(seq_lens, opts.loss_type, group_of=[g for _, _, g in items], token_turns=turns,
                                max_tokens=opts.max_total_tokens)
    rows = []
    for (ep, tok_adv, _), w in zip(items, weights):
        adv = [0.0] * len(ep.ids)
        wt = [0.0] * len(ep.ids)
        k = 0
        for p, m in enumerate(ep.mask):
            if m:
                adv[p], wt[p] = tok_adv[k], w[k]
                k += 1
        slp = getattr(ep, "sampling_logps", None)
        rows.append(Row(list(ep.ids), list(ep.mask), adv, wt, list(slp) if slp else None, list(ep.turn_of)))
    return rows


def rank_rows(rows: Sequence[Row], rank: int, world: int, multiple: int = 1) -> tuple[list[Row], int]:
    """Rows of this rank (round robin over the global order) padded with zero-weight rows to the same
    count on every rank, a multiple of `multiple` (the gradient-accumulation slices) and >= multiple.
    Returns (rows, number of padding rows). Zero-weight rows make every rank run the same forward and
    backward passes, so the collectives stay in step even when the global batch is empty."""
    mine = [r for i, r in enumerate(rows) if i % world == rank]
    per_rank = math.ceil(len(rows) / world) if rows else 0
    target = max(multiple, math.ceil(per_rank / multiple) * multiple)
    pad = target - len(mine)
    filler = rows[0].ids[:2] if rows else None
    for _ in range(pad):
        ids = list(filler) if filler else [0, 0]
        mine.append(Row(ids, [0] * len(ids), [0.0] * len(ids), [0.0] * len(ids), None))
    return mine, pad


def rows_to_tensors(rows: Sequence[Row], pad_id: int, scale: float, device=None) -> dict:
    """Right-padded tensors. Per-position tensors have length L-1 and are aligned with the
    log-prob of ids[:, 1:] (position k predicts token k+1)."""
    import torch

    L = max(len(r.ids) for r in rows)
    n = len(rows)
    ids = torch.full((n, L), pad_id, dtype=torch.long)
    att = torch.zeros((n, L), dtype=torch.long)
    adv = torch.zeros((n, L - 1))
    w = torch.zeros((n, L - 1))
    pm = torch.zeros((n, L - 1))
    slp = torch.full((n, L - 1), float("nan"))
    turn = torch.full((n, L - 1), -1, dtype=torch.long)
    has_slp = False
    for i, r in enumerate(rows):
        m = len(r.ids)
        ids[i, :m] = torch.tensor(r.ids)
        att[i, :m] = 1
        if m > 1:
            adv[i, : m - 1] = torch.tensor(r.adv[1:])
            w[i, : m - 1] = torch.tensor(r.weight[1:]) * scale
            pm[i, : m - 1] = torch.tensor(r.policy[1:], dtype=torch.float)
            if r.turns:
                turn[i, : m - 1] = torch.tensor(r.turns[1:])
            if r.sampling_logps:
                has_slp = True
                slp[i, : m - 1] = torch.tensor(r.sampling_logps[1:], dtype=torch.float)
    out = {"input_ids": ids, "attention_mask": att, "advantages": adv, "loss_weight": w, "policy_mask": pm,
           "turn_index": turn}
    if has_slp:
        out["sampling_per_token_logps"] = slp
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    return out
