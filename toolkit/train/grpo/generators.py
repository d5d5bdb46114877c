"""Generation backends for GRPO: ids in, sampled completion ids out (HF generate, TRL's vLLM
server / colocate through TRL's VLLMGeneration, a scripted one for tests and replays)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from toolkit.train.grpo.options import GRPOOptions
from toolkit.train.prefix import SHARED_PREFIX_MIN, cache_kw, common_prefix, prefix_cache

# ----------------------------------------------------------------------------------------------
# generation backends: ids in -> sampled completion ids out

class Completion(list):
    """Completion ids with the sampler's log-prob of each id (`logps`), for the IS correction."""

    def __init__(self, ids, logps=None):
        super().__init__(ids)
        self.logps = list(logps) if logps is not None else None


class HFGenerator:
    """transformers `generate` on the training model. Concurrent episodes' requests are batched
    (left-padded) into one `generate` call when they arrive together."""

    def __init__(self, model, tok, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 record_logps: bool = False, autocast=None, shared_prefix: bool = True):
        self.model, self.tok = model, tok
        self.shared_prefix = shared_prefix  # forward the batch's common prompt prefix once
        # a dtype (bf16) for the forward passes of fp32 weights, as training's mixed precision does
        # (on a CPU with AMX about 2x faster prefill); None = the weights' own dtype
        self.autocast = autocast
        self.record_logps = record_logps  # keep the sampler's log-prob of each id (async: behaviour policy)
        self.temperature, self.top_p = temperature, top_p
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.flushing = False
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0
        import torch

        self.gen = torch.Generator().manual_seed(seed)

    async def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((ids, max_new_tokens, fut))
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        try:
            while True:  # let every runnable episode reach its generate() call
                n = len(self.pending)
                for _ in range(3):
                    await asyncio.sleep(0)
                if len(self.pending) == n:
                    break
            batch, self.pending = self.pending, []
            try:
                outs = self._run([b[0] for b in batch], max(b[1] for b in batch))
            except Exception as e:  # noqa: BLE001  # pragma: no cover - surfaced to every waiting episode
                for *_, f in batch:
                    f.set_exception(e)
                return
            for (ids, mx, f), o in zip(batch, outs):
                f.set_result(o if len(o) <= mx else o[:mx])
        finally:
            self.flushing = False
            if self.pending:
                self.flushing = True
                asyncio.get_running_loop().create_task(self._flush())

    def _run(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        import torch

        t0 = time.time()
        pad = self.tok.pad_token_id
        eos = self.tok.eos_token_id
        # the prompts' common prefix (system prompt, tools ...): forwarded once, its KV cache repeated
        # per row; layout [prefix][left padding][row's rest], positions counted over the real tokens
        P = common_prefix(prompts) - 1 if self.shared_prefix and len(prompts) > 1 else 0
        P = P if P >= SHARED_PREFIX_MIN else 0
        S = max(len(p) for p in prompts) - P
        L = P + S
        input_ids = torch.tensor([p[:P] + [pad] * (L - len(p)) + p[P:] for p in prompts])
        attn = torch.tensor([[1] * P + [0] * (L - len(p)) + [1] * (len(p) - P) for p in prompts])
        was_training = self.model.training
        self.model.eval()
        # torch's global RNG drives sampling; fork it so generation is seeded and training's RNG is not consumed
        dev = self.model.device.type
        amp = (torch.autocast(dev, dtype=self.autocast) if self.autocast is not None
               else contextlib.nullcontext())
        with torch.no_grad(), torch.random.fork_rng(devices=[]), amp:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=self.gen)))
            kw = {}
            if P:
                kw = {cache_kw(self.model): prefix_cache(self.model, input_ids[:1, :P].to(self.model.device),
                                                         len(prompts))}
            out = self.model.generate(input_ids=input_ids.to(self.model.device), attention_mask=attn.to(self.model.device),
                                      do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0,
                                      max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad,
                                      output_logits=self.record_logps, return_dict_in_generate=True, **kw)
        if was_training:
            self.model.train()
        seqs = out.sequences
        lps = None
        if self.record_logps and out.logits:  # log-softmax(logits / T) at the sampled id (exact for top_p = 1)
            logits = torch.stack(out.logits, 1).float() / self.temperature
            lps = torch.log_softmax(logits, -1).gather(2, seqs[:, L:, None].to(logits.device))[..., 0].tolist()
        res = []
        for i, row in enumerate(seqs[:, L:].tolist()):
            if eos in row:
                row = row[: row.index(eos) + 1]
            res.append(Completion(row, lps[i][: len(row)]) if lps is not None else row)
            self.generated_tokens += len(row)
        self.seconds += time.time() - t0
        self.calls += 1
        return res

    def sync_weights(self) -> None:  # same model object: nothing to do
        pass


class TRLVLLMGenerator:
    """Generation through TRL's `VLLMGeneration` (built by GRPOTrainer from `use_vllm`, `vllm_mode`):
    server mode sends each batch of concurrent turns from this rank to `trl vllm-serve` as token ids;
    colocate mode calls the in-process `vllm.LLM`. Completions come back as token ids with their
    log-probs (kept for the importance-sampling correction). Weight sync is the trainer's
    (`VLLMGeneration.sync_weights` before each rollout round). Colocate mode runs on vLLM's CPU build
    (tests/train/test_grpo_vllm.py); server mode needs CUDA for TRL's NCCL weight sync."""

    def __init__(self, vllm_generation, opts: GRPOOptions):
        self.vg, self.opts = vllm_generation, opts
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.flushing = False
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0

    generate = HFGenerator.generate
    _flush = HFGenerator._flush

    def _run(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        t0 = time.time()
        o = self.opts
        if self.vg.mode == "server":
            out = self.vg.vllm_client.generate(prompts=prompts, n=1, temperature=o.temperature, top_p=o.top_p,
                                              max_tokens=max_new, logprobs=0)
            ids = [list(c) for c in out["completion_ids"]]
            lps = [[lp[0] for lp in seq] for seq in out.get("logprobs") or [[] for _ in ids]]
        else:
            from vllm import SamplingParams

            sp = SamplingParams(n=1, temperature=o.temperature, top_p=o.top_p, max_tokens=max_new, logprobs=0)
            res = self.vg.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=sp, use_tqdm=False)
            ids, lps = [], []
            for r in res:
                c = r.outputs[0]
                ids.append(list(c.token_ids))
                lps.append([d[t].logprob for d, t in zip(c.logprobs or [], c.token_ids)])
        out_c = [Completion(i, lp if len(lp) == len(i) else None) for i, lp in zip(ids, lps)]
        self.generated_tokens += sum(len(r) for r in out_c)
        self.seconds += time.time() - t0
        self.calls += 1
        return out_c

    def sync_weights(self) -> None:  # the trainer syncs (collectively, before each round)
        pass


class ScriptedGenerator:
    """Returns pre-written completions (tests, and to replay a fixed policy): texts are tokenized
    once and returned as ids, in order, per episode key."""

    def __init__(self, tok, scripts: dict[str, list[str]] | list[str]):
        self.tok = tok
        self.scripts = scripts
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0

    async def generate(self, ids: list[int], max_new_tokens: int, key: str = "") -> list[int]:
        seq = self.scripts if isinstance(self.scripts, list) else self.scripts[key]
        i = self._i = getattr(self, "_i", {})
        k = i.get(key, 0)
        i[key] = k + 1
        text = seq[min(k, len(seq) - 1)]
        out = self.tok(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
        self.generated_tokens += len(out)
        self.calls += 1
        return out

    def sync_weights(self) -> None:
        pass
