"""The cluster scripts under a real Slurm: munged + slurmctld + slurmd started by the fixture on this
machine (tests/cluster/slurm.py), jobs submitted with sbatch exactly as on a cluster, in their CPU
form (no GPU, no vLLM).

- slurm_array: recipes/cluster/submit.sh (array of shard_body tasks + merge job afterok) merges to
  the unsharded `rollout --agent replay | verify` record for record.
- sft: sft-multinode.sbatch with the FSDP CPU accelerate config (2 ranks under srun) writes a full
  checkpoint that from_pretrained loads.
- grpo: grpo-vllm.sbatch with in-trainer generation runs to completion on the tiny model.

Needs root and Debian's slurm-wlm + munge (`apt-get install slurm-wlm munge`, ~20 s); skipped with
the reason otherwise. Runtime (2 shared CPU cores, measured): cluster start 3-13 s; slurm_array ~20 s;
sft 60-100 s; grpo 50-85 s."""

from __future__ import annotations

import json
import os
import socket

import pytest

from tests.cluster.slurm import LocalSlurm, available
from tests.conftest import ROOT, jsonl, requires_train
from tests.test_cluster import _env, _normalized, tasks, unsharded  # noqa: F401 - fixtures

CLUSTER = ROOT / "recipes" / "cluster"
CPU_FORM = ["--gres=none", "--mem=0"]

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    s = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _senv(slurm: LocalSlurm, **kw) -> dict:
    e = _env(**kw)
    e["SLURM_CONF"] = str(slurm.conf)
    e["OMP_NUM_THREADS"] = "1"
    return e


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _job_log(where, job_id: str) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((where / "logs").glob(f"*{job_id}*")))


def test_slurm_array_submit_merges_to_the_unsharded_run(slurm, tasks, unsharded, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    r = slurm.run(["bash", str(CLUSTER / "submit.sh")], cwd=tmp_path,
                  env=_senv(slurm, MODEL="none", INPUT=tasks, OUT_DIR=out, NSHARDS=3, VLLM="none",
                            ROLLOUT_ARGS="--agent replay", SBATCH_ARGS=" ".join(CPU_FORM + ["--cpus-per-task=1"])))
    assert r.returncode == 0, r.stderr
    merge_id = r.stdout.strip()
    array_id = r.stderr.split("array job ")[1].split()[0]
    states = slurm.wait_job(merge_id, timeout=600)
    arr = slurm.job_state(array_id)
    assert states == {merge_id: "COMPLETED"}, (states, arr, slurm.logs(), _job_log(tmp_path, array_id))
    assert len(arr) == 3 and set(arr.values()) == {"COMPLETED"}, arr  # three array tasks ran
    sizes = [len((out / f"part-{i}.jsonl").read_text().splitlines()) for i in range(3)]
    assert sum(sizes) == 12 and sum(1 for s in sizes if s) >= 2, sizes  # really split
    merged = (out / "merged.jsonl").read_text()
    assert _normalized(merged) == _normalized(unsharded)  # record for record, input order


@pytest.fixture(scope="module")
def train_inputs(verified_airline, tmp_path_factory):
    d = tmp_path_factory.mktemp("slurmtrain")
    data = d / "verified.jsonl"
    data.write_text(jsonl([r.model_dump(mode="json", by_alias=True) for r in verified_airline]))
    recipe = d / "sft.yaml"
    recipe.write_text("sft:\n  save_steps: 2\n  learning_rate: 0.001\n  logging_steps: 1\n"
                      "  per_device_train_batch_size: 1\n  report_to: none\n")
    return data, recipe


@requires_train
def test_slurm_sft_multinode_cpu_form_writes_a_loadable_model(slurm, tiny_model, train_inputs, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data, recipe = train_inputs
    (tmp_path / "logs").mkdir()
    out = tmp_path / "ckpt"
    r = slurm.run(["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=2", *CPU_FORM,
                   str(CLUSTER / "sft-multinode.sbatch"), tiny_model, str(data), str(recipe)], cwd=tmp_path,
                  env=_senv(slurm, OUT=out, HERE=CLUSTER, ACCELERATE_CONFIG=CLUSTER / "accelerate-fsdp-cpu.yaml",
                            PROCS_PER_NODE=2, MASTER_PORT=_free_port(), SFT_ARGS="--max-steps 2 --limit 4"))
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    states = slurm.wait_job(job, timeout=900)
    assert states == {job: "COMPLETED"}, (states, _job_log(tmp_path, job), slurm.logs())
    run = json.loads((out / "run.json").read_text())
    assert run["result"]["sharding"] == "fsdp-cpu" and run["result"]["processes"] == 2 and run["result"]["steps"] == 2
    model, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("Hello", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]


@requires_train
def test_slurm_grpo_cpu_form_runs_to_completion(slurm, tiny_model, tmp_path):
    from tests.train.test_grpo import ticket_tasks

    recs = ticket_tasks(tmp_path)
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(jsonl([r.model_dump(mode="json", by_alias=True) for r in recs]))
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text("grpo:\n  max_new_tokens: 8\n  max_turns: 2\n  tool_schema: compact\n  system_prompt: drop\n"
                      "  use_cpu: true\n  learning_rate: 0.001\n")
    (tmp_path / "logs").mkdir()
    out = tmp_path / "ckpt"
    r = slurm.run(["sbatch", "--parsable", "--cpus-per-task=2", *CPU_FORM, str(CLUSTER / "grpo-vllm.sbatch"),
                   tiny_model, str(tasks_file), str(recipe), "grpo"], cwd=tmp_path,
                  env=_senv(slurm, OUT=out, HERE=CLUSTER, GENERATION="transformers", NUM_PROCESSES=1,
                            ACCELERATE_CONFIG=CLUSTER / "accelerate-cpu.yaml",
                            GRPO_ARGS="--max-steps 1 --group-size 2 --tasks-per-step 1"))
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    states = slurm.wait_job(job, timeout=900)
    assert states == {job: "COMPLETED"}, (states, _job_log(tmp_path, job), slurm.logs())
    assert (out / "model.safetensors").exists() and (out / "metrics.jsonl").exists()
    assert os.path.getsize(out / "rollouts.jsonl") > 0
    assert "generation" not in (out / "recipe.yaml").read_text()  # CPU form: the recipe's own setting
