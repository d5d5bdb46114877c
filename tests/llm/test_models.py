"""Named models: `toolkit models materialize smollm2-135m-instruct` (the packaged Q4_1 GGUF as an
fp32 HF checkpoint) against llama.cpp's own logits, the Hermes tool-call format through its
tokenizer, and the one resolver sft / grpo / serve use."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import requires_embedded, requires_train, run_cmd
from toolkit.llm import models as M


def test_resolve_model_paths_names_and_unknown(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    assert M.resolve_model(str(d)) == str(d)  # an existing path is kept
    assert M.resolve_model("org/some-hub-model") == "org/some-hub-model"  # unknown: unchanged
    assert M.resolve_model(None) is None
    assert M.known_model("SmolLM2-135M-Instruct") is not None  # case-insensitive


def test_model_identity_records_the_real_model(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    assert M.model_identity(str(d), "http://127.0.0.1:1/v1") == str(d.resolve())
    assert M.model_identity("Qwen/Qwen3-8B", "http://x/v1") == "Qwen/Qwen3-8B"


def test_gguf_sha256_is_the_file_hash(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path / "home"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 5000)
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert M.gguf_sha256(str(f)) == want
    assert M.gguf_sha256(str(f)) == want  # from the cache file
    assert want in (tmp_path / "home" / "sha256_cache.json").read_text()


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


needs_gguf = pytest.mark.skipif(not _have("gguf"), reason="the gguf package is not installed (extra models)")


@pytest.fixture(scope="module")
def smollm2():
    """The materialized checkpoint (written once under $TOOLKIT_HOME, reused across runs)."""
    return M.materialize("smollm2-135m-instruct")


def _llama(path: str):
    """llama.cpp in process, with the extra buffer types off (as the embedded server: AMX kernels
    crash where the kernel grants no AMX state)."""
    import llama_cpp.llama_cpp as C

    orig = C.llama_model_default_params

    def params():
        p = orig()
        if any(f[0] == "use_extra_bufts" for f in getattr(type(p), "_fields_", [])):
            p.use_extra_bufts = False
        return p

    C.llama_model_default_params = params
    try:
        from llama_cpp import Llama

        return Llama(model_path=path, n_ctx=512, logits_all=True, verbose=False, n_threads=2)
    finally:
        C.llama_model_default_params = orig


@pytest.mark.slow
@requires_train
@requires_embedded
@needs_gguf
def test_materialized_logits_match_llama_cpp(smollm2):
    """Same tokens, same model: llama.cpp computes on Q4_1 weights with Q8 activations, the
    checkpoint holds the dequantized weights in fp32. Measured on this prompt (43 positions):
    top-1 agreement 43/43, per-position Pearson r >= 0.998. Bounds: top-1 >= 90%, r >= 0.99."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.llm.embedded import embedded_model_path

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3? Answer with one number."}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].float().numpy()
    ll = _llama(embedded_model_path())
    try:
        lt = ll.tokenize(text.encode(), add_bos=False, special=True)
        assert lt == ids  # the GGUF's tokenizer and the saved one agree
        ll.eval(lt)
        lc = np.array(ll.scores[: len(lt)])
    finally:
        ll.close()
    agree = float((hf.argmax(-1) == lc.argmax(-1)).mean())
    corr = [float(np.corrcoef(hf[i], lc[i])[0, 1]) for i in range(len(ids))]
    assert agree >= 0.9, agree
    assert min(corr) >= 0.99, min(corr)
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "5" in tok.decode(out[0][len(ids):])


@pytest.mark.slow
@requires_train
@needs_gguf
def test_materialize_is_idempotent_and_cli_prints_the_dir_last(smollm2):
    with open(os.path.join(smollm2, M.MARKER)) as f:
        marker = json.load(f)
    assert marker["source_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(marker["source_sha256"]) == 64
    with open(os.path.join(smollm2, "config.json")) as f:
        cfg = json.load(f)
    assert "quantization_config" not in cfg
    t0, wall0 = time.monotonic(), time.time()
    r = run_cmd(["toolkit", "models", "materialize", "smollm2-135m-instruct"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == smollm2
    assert time.monotonic() - t0 < 60  # found, not rewritten (a rewrite takes ~40 s + load)
    assert os.path.getmtime(os.path.join(smollm2, M.MARKER)) < wall0


@pytest.mark.slow
@requires_train
@needs_gguf
def test_hermes_tool_calls_round_trip_through_its_tokenizer(smollm2):
    """A conversation with a tool call rendered by the toolkit's Hermes template, tokenized by
    SmolLM2's tokenizer and decoded, parses back to the same call; assistant masks cover it."""
    from transformers import AutoTokenizer

    from toolkit.formats.hermes import CHAT_TEMPLATE
    from toolkit.llm.toolcalls import parse_tool_calls

    tok = AutoTokenizer.from_pretrained(smollm2)
    tok.chat_template = CHAT_TEMPLATE
    args = {"reservation_id": 1002, "note": "Ça va — 10% off, \"quoted\""}
    tools = [{"type": "function", "function": {"name": "query_reservation", "description": "Look up a reservation",
                                                "parameters": {"type": "object", "properties": {
                                                    "reservation_id": {"type": "integer"}, "note": {"type": "string"}}}}}]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Find 1002."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "query_reservation", "arguments": args}}]}]
    out = tok.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained.startswith("<tool_call>") and trained.endswith("<|im_end|>")
    _, calls, _ = parse_tool_calls(trained.replace("<|im_end|>", ""))
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("query_reservation", args)]
    # the whole rendering survives encode → decode byte for byte
    rendered = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert tok.decode(tok(rendered, add_special_tokens=False)["input_ids"]) == rendered
