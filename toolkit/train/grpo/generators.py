"""Generation backends for GRPO: ids in, sampled completion ids out (HF generate, llama.cpp on a
GGUF of the policy's weights, TRL's vLLM server / colocate through TRL's VLLMGeneration, a scripted
one for tests and replays)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from toolkit.llm.gguf_export import ExportError, check_template, find_template, write_gguf
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


class LlamaCppGenerator:
    """llama.cpp (llama-cpp-python, in this process) sampling from an F16 GGUF of the policy's
    CURRENT weights: `load_weights(model, version)` writes the live state dict through
    `toolkit.llm.gguf_export.write_gguf` (the template GGUF's metadata, the checkpoint's tensors) and
    reloads the model, once per optimizer step (the trainer calls it before each rollout round, so
    generation stays on-policy). On a CPU this replaces HF `generate` (no KV cache kept between an
    episode's turns, a Python loop per token): measured in docs/learn.md.

    Requests are served one at a time by one worker thread (llama.cpp decodes with every core and
    releases the GIL, so the event loop keeps serving the user simulator and the environment).
    llama.cpp's prompt cache keeps the longest common prefix with the previous request (the tool
    schemas, a group's task); each call draws a fresh sampler seed from this generator's seeded RNG,
    so the G episodes of a group sample independently. Runs are reproducible only up to float
    rounding: a request's logits depend on how much of its prompt the previous request left in the
    cache (one batch vs. several), and a sampled token can flip where two are nearly tied.
    Sampling is plain: temperature T, top_p, no top-k / min-p / repetition penalty (llama.cpp's
    defaults are turned off). The sampler runs the F16 weights while training scores with fp32 (or
    its autocast): the mismatch is the same kind as vLLM's; no per-token sampler log-probs are kept."""

    def __init__(self, tok, model_path: str, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 n_ctx: int = 8192, threads: int | None = None, workdir: str | None = None):
        try:
            import llama_cpp  # noqa: F401  (the embedded extra)
        except ImportError:  # pragma: no cover - checked by check_generation first
            raise ExportError("generation llamacpp needs llama-cpp-python (the embedded extra)") from None
        self.tok = tok
        self.template = find_template(model_path)
        self.temperature, self.top_p, self.n_ctx = temperature, top_p, n_ctx
        self.threads = threads or int(os.environ.get("TOOLKIT_EMBEDDED_THREADS") or os.cpu_count() or 1)
        self.dir = tempfile.mkdtemp(prefix="toolkit-grpo-gguf-", dir=workdir)
        self.rng = random.Random(seed)
        self.llm = None
        self.version: object = None
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-llamacpp")
        self.generated_tokens = 0
        self.seconds = 0.0
        self.calls = 0
        self.loads = 0
        self.load_seconds = 0.0

    def load_weights(self, model, version: object) -> None:
        """Export `model`'s weights and load them, unless `version` is the one loaded."""
        if self.llm is not None and version == self.version:
            return
        import llama_cpp

        t0 = time.time()
        cfg = model.config.to_dict()
        check_template(self.template, cfg)
        sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        path = os.path.join(self.dir, "policy.gguf")
        with self.lock:
            self.llm = None  # free the old model before the new one maps its file
            write_gguf(sd, cfg, self.template, path, "f16", what="the policy")
            self.llm = llama_cpp.Llama(model_path=path, n_ctx=self.n_ctx, n_threads=self.threads,
                                       n_threads_batch=self.threads, logits_all=False, verbose=False)
        self.version = version
        self.loads += 1
        self.load_seconds += time.time() - t0

    async def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        if self.llm is None:
            raise RuntimeError("LlamaCppGenerator: no weights loaded (load_weights before generating)")
        seed = self.rng.randrange(2**31 - 1)  # drawn in request order, on the event loop
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._run, list(ids), max_new_tokens, seed)

    def _run(self, ids: list[int], max_new: int, seed: int) -> list[int]:
        t0 = time.time()
        eos = self.tok.eos_token_id
        out: list[int] = []
        with self.lock:
            llm = self.llm
            if len(ids) + max_new > self.n_ctx:
                max_new = max(0, self.n_ctx - len(ids))
            llm.set_seed(seed)
            if max_new:
                for t in llm.generate(ids, top_k=0, top_p=self.top_p, min_p=0.0, typical_p=1.0, temp=self.temperature,
                                      repeat_penalty=1.0, reset=True):
                    out.append(int(t))
                    if t == eos or len(out) >= max_new:
                        break
        self.generated_tokens += len(out)
        self.seconds += time.time() - t0
        self.calls += 1
        return out

    def sync_weights(self) -> None:  # load_weights, called by the trainer with the live model
        pass

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.llm = None
        shutil.rmtree(self.dir, ignore_errors=True)


def reloadable_cpu_weights() -> None:
    """vLLM's CPU build, colocated: keep every linear layer's weight where TRL's weight sync
    writes it. After loading, vLLM's CPU build packs a linear layer's weight for oneDNN (or an
    AMX kernel), computes from the packed copy and replaces `layer.weight` by an empty tensor
    without its `weight_loader`, on CPUs with those kernels (AVX-512 BF16 / AMX; not on others):
    the first `VLLMGeneration.sync_weights` then fails ("'Parameter' object has no attribute
    'weight_loader'"), and an embedding kept beside a packed copy would be sampled stale.
    Patched here, in the training process, before TRL builds the engine: plain
    `torch.nn.functional.linear` on the layer's own weight, which the sync updates in place.
    Slower per token on those CPUs; a GPU run (CUDA) never takes this path."""
    import torch
    from vllm.model_executor.layers import utils as vllm_layer_utils

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:  # noqa: ARG001 - vLLM's signature
        layer.cpu_linear = torch.nn.functional.linear

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch


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
