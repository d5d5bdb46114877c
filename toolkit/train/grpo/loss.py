"""Sequence advantages and the clipped policy-gradient loss (per-variant normalization, optional k3 KL)."""

from __future__ import annotations

from typing import Sequence

from toolkit.train import advantages as ADV
from toolkit.train.grpo.episodes import Episode
from toolkit.train.grpo.options import GRPOOptions

# ----------------------------------------------------------------------------------------------
# loss


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


def policy_loss(model, ref_model, items, opts: GRPOOptions, backward, old_logps: dict | None = None) -> dict:
    """Accumulate gradients of the clipped surrogate over `items` (episode, token advantages, group).
    Returns summed statistics. `backward(loss)` is accelerator.backward."""
    import torch
    from trl.trainer.utils import selective_log_softmax

    seq_lens = [ep.policy_tokens for ep, _, _ in items]
    turns = [[t for t, m in zip(ep.turn_of, ep.mask) if m] for ep, _, _ in items]
    weights = ADV.token_weights(seq_lens, opts.loss_type, group_of=[g for _, _, g in items], token_turns=turns,
                                max_tokens=opts.max_total_tokens)
    device = next(model.parameters()).device
    stats = {"loss": 0.0, "kl": 0.0, "clipped": 0, "tokens": 0}
    mb = max(1, int(opts.micro_batch))
    for s in range(0, len(items), mb):
        chunk = list(range(s, min(s + mb, len(items))))
        L = max(len(items[i][0].ids) for i in chunk)
        pad = 0
        ids = torch.tensor([items[i][0].ids + [pad] * (L - len(items[i][0].ids)) for i in chunk], device=device)
        att = torch.tensor([[1] * len(items[i][0].ids) + [0] * (L - len(items[i][0].ids)) for i in chunk], device=device)
        pmask = torch.zeros(len(chunk), L - 1, device=device)
        adv = torch.zeros(len(chunk), L - 1, device=device)
        w = torch.zeros(len(chunk), L - 1, device=device)
        for r, i in enumerate(chunk):
            ep, tok_adv, _ = items[i]
            pos = [p - 1 for p, m in enumerate(ep.mask) if m and p > 0]
            if pos:
                idx = torch.tensor(pos, device=device)
                pmask[r, idx] = 1.0
                adv[r, idx] = torch.tensor(tok_adv[-len(pos):], device=device, dtype=adv.dtype)
                w[r, idx] = torch.tensor(weights[i][-len(pos):], device=device, dtype=w.dtype)
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1, :]
        logps = selective_log_softmax(logits, ids[:, 1:], temperature=opts.temperature)
        if old_logps is not None:  # sampling-time log-probs (num_iterations > 1), padded to this chunk
            old = torch.zeros_like(logps)
            for r, i in enumerate(chunk):
                old[r, : old_logps[i].shape[0]] = old_logps[i].to(device)
        else:
            old = logps.detach()
        ratio = torch.exp(logps - old)
        s1 = ratio * adv
        s2 = torch.clamp(ratio, 1 - opts.epsilon, 1 + opts.eps_high) * adv
        per_tok = -torch.min(s1, s2)
        if opts.beta and ref_model is not None:
            with torch.no_grad():
                rl = ref_model(input_ids=ids, attention_mask=att).logits[:, :-1, :]
                ref = selective_log_softmax(rl, ids[:, 1:], temperature=opts.temperature)
            kl = torch.exp(ref - logps) - (ref - logps) - 1
            per_tok = per_tok + opts.beta * kl
            stats["kl"] += float((kl.detach() * pmask).sum())
        loss = (per_tok * w * pmask).sum()
        backward(loss)
        stats["loss"] += float(loss.detach())
        stats["clipped"] += int((((ratio < 1 - opts.epsilon) | (ratio > 1 + opts.eps_high)).float() * pmask).sum())
        stats["tokens"] += int(pmask.sum())
    return stats


def compute_old_logps(model, items, opts: GRPOOptions) -> dict:
    import torch
    from trl.trainer.utils import selective_log_softmax

    out = {}
    device = next(model.parameters()).device
    with torch.no_grad():
        for i, (ep, _, _) in enumerate(items):
            ids = torch.tensor([ep.ids], device=device)
            logits = model(input_ids=ids).logits[:, :-1, :]
            out[i] = selective_log_softmax(logits, ids[:, 1:], temperature=opts.temperature)[0]
    return out
