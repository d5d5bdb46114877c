"""`sft` beyond one process: FSDP (CPU, gloo, 2 processes under `accelerate launch`) saves one
full checkpoint that `from_pretrained` loads and that equals the 2-process DDP run's weights;
`--merge-lora` writes a plain merged model; DeepSpeed ZeRO-3 where deepspeed can run.

Runtime (2 shared CPU cores): fsdp ~2.5 min (an FSDP run and the DDP reference, 2 steps each),
zero3 ~1.5 min (+ ~3 min the first time: DeepSpeed JIT-builds its CPU comm op; + the DDP
reference when run alone), merge_lora ~1 min."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import BIN, ROOT, jsonl, requires_train, run_cmd

pytestmark = requires_train
FSDP_CPU = ROOT / "recipes" / "cluster" / "accelerate-fsdp-cpu.yaml"
ZERO3_CPU = ROOT / "recipes" / "cluster" / "accelerate-zero3-cpu.yaml"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}:{os.path.dirname(sys.executable)}:{e.get('PATH', '')}"
    e["PYTHONPATH"] = str(ROOT)
    e["OMP_NUM_THREADS"] = "1"
    return e


@pytest.fixture(scope="module")
def sft_data(verified_airline, tmp_path_factory):
    d = tmp_path_factory.mktemp("sftdist")
    data = d / "verified.jsonl"
    data.write_text(jsonl([r.model_dump(mode="json", by_alias=True) for r in verified_airline]))
    recipe = d / "r.yaml"
    recipe.write_text("sft:\n  save_steps: 2\n  learning_rate: 0.001\n  logging_steps: 1\n"
                      "  per_device_train_batch_size: 1\n  report_to: none\n  seed: 0\n")
    return data, recipe


def _launch(launch_args: list[str], model: str, out, data, recipe, extra=()) -> subprocess.CompletedProcess:
    cmd = [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", *launch_args,
           "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", str(_free_port()),
           "-m", "toolkit.cli", "sft", "--model", model, "--output-dir", str(out), "--recipe", str(recipe),
           "-i", str(data), "--filter", "passed", "--max-steps", "2", "--limit", "4", *extra]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def ddp_reference(tiny_model, sft_data, tmp_path_factory):
    """The same 2-process run with plain data parallelism (DDP over gloo: torchrun's launcher via
    --multi_gpu; `--cpu --num_processes 2` without a config would start 2 unrelated runs)."""
    data, recipe = sft_data
    out = tmp_path_factory.mktemp("ddp") / "ddp"
    p = _launch(["--multi_gpu"], tiny_model, out, data, recipe)
    assert p.returncode == 0, p.stderr[-4000:]
    res = json.loads((out / "run.json").read_text())["result"]
    assert res["sharding"] is None and res["processes"] == 2
    return out


def _same_as_ddp(out, ddp_out, tiny_model) -> None:
    """`out` loads with from_pretrained (no missing / unexpected keys), holds full tensors equal to
    the DDP run's, moved from the initial weights, and generates."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, ddp = _state(out), _state(ddp_out)
    init = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    m_sd, d_sd, i_sd = model.state_dict(), ddp.state_dict(), init.state_dict()
    assert set(m_sd) == set(i_sd)
    changed = 0
    for k, v in i_sd.items():
        assert m_sd[k].shape == v.shape, k  # full tensors, not one rank's shard
        assert torch.allclose(m_sd[k], d_sd[k], atol=1e-5, rtol=1e-4), k
        changed += not torch.equal(m_sd[k], v)
    assert changed >= len(i_sd) // 2  # two steps of AdamW moved the weights
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("Hello", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] == ids.shape[1] + 4 or gen[0, -1].item() == tok.eos_token_id
    losses = [[json.loads(x)["loss"] for x in (o / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
              for o in (out, ddp_out)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-4)


def _state(path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model


def test_fsdp_cpu_sft_saves_a_full_checkpoint_equal_to_ddp(tiny_model, sft_data, ddp_reference, tmp_path):
    data, recipe = sft_data
    out = tmp_path / "fsdp"
    p = _launch(["--config_file", str(FSDP_CPU)], tiny_model, out, data, recipe)
    assert p.returncode == 0, p.stderr[-4000:]
    run = json.loads((out / "run.json").read_text())
    assert run["result"]["sharding"] == "fsdp-cpu" and run["result"]["processes"] == 2
    # the intermediate checkpoint is FSDP's sharded state (for resume) — no loadable weights there
    ck = out / "checkpoint-2"
    assert (ck / "pytorch_model_fsdp_0").is_dir() and not (ck / "model.safetensors").exists()
    _same_as_ddp(out, ddp_reference, tiny_model)


def test_merge_lora_writes_a_plain_model_equal_to_base_plus_adapter(tiny_model, sft_data, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data, recipe = sft_data
    out = tmp_path / "lora"
    p = run_cmd(["sft", "--model", tiny_model, "--output-dir", str(out), "--recipe", str(recipe), "-i", str(data),
                 "--filter", "passed", "--max-steps", "3", "--limit", "4", "--lora", "--merge-lora",
                 "--learning-rate", "0.01"], env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    merged_dir = out / "merged"
    assert (out / "adapter_config.json").exists() and (merged_dir / "model.safetensors").exists()
    assert not (merged_dir / "adapter_config.json").exists()
    merged = _state(merged_dir)  # a plain transformers checkpoint: no missing / unexpected (lora_*) keys
    assert not any("lora" in k for k in merged.state_dict())
    # independent path: the base model with the adapter applied on the fly (not merged)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = PeftModel.from_pretrained(base, str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(merged_dir))
    ids = tok("Cancel reservation 1003 please", return_tensors="pt").input_ids
    with torch.no_grad():
        want = peft_model(ids).logits
        got = merged.eval()(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-4)  # the adapter was trained and is in the merged weights
    assert any(not torch.equal(merged.state_dict()[k], v) for k, v in base_sd.items())
    gen = merged.generate(ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids.shape[1]


def test_merge_lora_without_lora_is_a_usage_error(tiny_model, sft_data, tmp_path):
    data, _ = sft_data
    p = run_cmd(["sft", "--model", tiny_model, "--output-dir", str(tmp_path / "x"), "-i", str(data),
                 "--filter", "passed", "--merge-lora", "--limit", "1"], timeout=300)
    assert p.returncode == 2 and "--merge-lora needs LoRA" in p.stderr


def _deepspeed_missing() -> str | None:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: cannot run here
        return f"deepspeed not installed or not importable ({type(e).__name__}): pip install -e '.[deepspeed]'"
    return None


@pytest.mark.skipif(_deepspeed_missing() is not None, reason=str(_deepspeed_missing()))
def test_zero3_cpu_sft_saves_a_full_checkpoint_equal_to_ddp(tiny_model, sft_data, ddp_reference, tmp_path,
                                                           monkeypatch):
    data, recipe = sft_data
    out = tmp_path / "zero3"
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))  # no GPU here
    p = _launch(["--config_file", str(ZERO3_CPU)], tiny_model, out, data, recipe)
    assert p.returncode == 0, p.stderr[-4000:]
    assert json.loads((out / "run.json").read_text())["result"]["sharding"] == "deepspeed"
    assert (out / "checkpoint-2" / "global_step2").is_dir()  # DeepSpeed's partitioned state, for resume
    _same_as_ddp(out, ddp_reference, tiny_model)
