"""recipes/cluster: the Slurm array body run for every shard in a loop (no Slurm, `--agent replay`),
merged, equals the unsharded run; the sbatch script itself runs with a stand-in vLLM server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import BIN, ROOT

CLUSTER = ROOT / "recipes" / "cluster"
N = 3


def _env(**kw) -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}:{os.path.dirname(sys.executable)}:{e.get('PATH', '')}"
    e["PYTHONPATH"] = str(ROOT)
    e.update({k: str(v) for k, v in kw.items()})
    return e


def _run(args, env, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False, **kw)


def _normalized(text: str) -> list[dict]:
    """Records with provenance times blanked: the only field that differs between two runs."""
    out = []
    for line in text.splitlines():
        rec = json.loads(line)
        for p in rec.get("provenance") or []:
            p["time"] = "T"
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cluster")
    text = "".join(_run(["toolkit", "tasks", dom], _env()).stdout for dom in ("airline", "clinic"))
    p = d / "tasks.jsonl"
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def unsharded(tasks) -> str:
    ro = _run(["rollout", "--agent", "replay", "-i", str(tasks)], _env())
    assert ro.returncode == 0, ro.stderr
    ve = _run(["verify", "--strategy", "state_diff"], _env(), input=ro.stdout)
    assert ve.returncode == 0, ve.stderr
    return ve.stdout


def _merge(tasks: Path, out: Path) -> str:
    m = _run([sys.executable, str(CLUSTER / "merge.py"), "--input", str(tasks), "--parts", str(out),
              "--nshards", str(N), "--rejects-out", str(out / "rejects.jsonl")], _env())
    assert m.returncode == 0, m.stderr
    return m.stdout


def test_body_for_every_shard_merges_to_the_unsharded_run(tasks, unsharded, tmp_path):
    out = tmp_path / "out"
    for i in range(N):
        r = _run(["bash", str(CLUSTER / "shard_body.sh")],
                 _env(SHARD=i, NSHARDS=N, INPUT=tasks, OUT_DIR=out))
        assert r.returncode == 0, r.stderr
    sizes = [len((out / f"part-{i}.jsonl").read_text().splitlines()) for i in range(N)]
    assert sum(sizes) == 12 and sum(1 for s in sizes if s) >= 2, sizes  # really split
    merged = _merge(tasks, out)
    assert _normalized(merged) == _normalized(unsharded)
    assert [json.loads(x)["id"] for x in merged.splitlines()] == [json.loads(x)["id"] for x in tasks.read_text().splitlines()]


def test_merge_names_a_missing_part(tasks, tmp_path):
    out = tmp_path / "out"
    r = _run(["bash", str(CLUSTER / "shard_body.sh")], _env(SHARD=0, NSHARDS=N, INPUT=tasks, OUT_DIR=out))
    assert r.returncode == 0, r.stderr
    m = _run([sys.executable, str(CLUSTER / "merge.py"), "--input", str(tasks), "--parts", str(out),
              "--nshards", str(N)], _env())
    assert m.returncode == 1 and "missing part(s) [1, 2]" in m.stderr


FAKE_VLLM = """#!/usr/bin/env bash
# stand-in for `vllm serve MODEL --host H --port P ...`: answers GET /v1/models after a short delay
[ "$1" = serve ] || exit 2
port=""; while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done
mkdir -p "$FAKE_ROOT/v1" && echo '{"data": []}' > "$FAKE_ROOT/v1/models"
sleep 1
exec python3 -m http.server "$port" --bind 127.0.0.1 --directory "$FAKE_ROOT"
"""


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_sbatch_script_with_a_standin_server(tasks, unsharded, tmp_path):
    fake = tmp_path / "vllm"
    fake.write_text(FAKE_VLLM)
    fake.chmod(0o755)
    # one array task (shard 1 of 3; the loop over every shard is the test above): its part holds
    # exactly the unsharded run's records of that shard
    from toolkit.io import shard_of

    out = tmp_path / "out"
    r = _run(["bash", str(CLUSTER / "slurm_array.sbatch")],
             _env(SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_COUNT=N, MODEL="m", INPUT=tasks, OUT_DIR=out,
                  PORT=_free_port(), VLLM=fake, FAKE_ROOT=tmp_path / "www", HERE=CLUSTER,
                  ROLLOUT_ARGS="--agent replay"),
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "vLLM ready on port" in r.stderr
    want = [x for x in _normalized(unsharded) if shard_of(x["id"], N) == 1]
    assert want and _normalized((out / "part-1.jsonl").read_text()) == want
    # a server that dies before it is ready fails the task with a clear message
    dead = tmp_path / "dead"
    dead.write_text("#!/usr/bin/env bash\nexit 3\n")
    dead.chmod(0o755)
    r = _run(["bash", str(CLUSTER / "slurm_array.sbatch")],
             _env(SLURM_ARRAY_TASK_ID=0, MODEL="m", INPUT=tasks, OUT_DIR=out, PORT=_free_port(), VLLM=dead,
                  HERE=CLUSTER), cwd=tmp_path)
    assert r.returncode == 1 and "vLLM exited before it was ready" in r.stderr
