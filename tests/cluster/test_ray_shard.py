"""toolkit.cluster.ray_shard / `toolkit ray-shard`: a command sharded over a local Ray cluster (2
worker CPUs, bound to 127.0.0.1) writes record for record what one process writes.

Runtime (2 shared CPU cores): ~40-60 s, most of it starting Ray twice (the fixture's cluster and
the CLI test's own)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import ROOT
from tests.test_cluster import _env, _normalized, _run

ray = pytest.importorskip("ray", reason="ray not installed: pip install -e '.[cluster]' to run the Ray tests")

from toolkit.cluster import ray_shard as R


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", _node_ip_address="127.0.0.1")
    try:
        assert ray.cluster_resources().get("CPU") == 2
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def task_lines(tmp_path_factory) -> tuple[list[bytes], str]:
    text = "".join(_run(["toolkit", "tasks", dom], _env()).stdout for dom in ("airline", "clinic"))
    p = tmp_path_factory.mktemp("ray") / "tasks.jsonl"
    p.write_text(text)
    return [ln.encode() + b"\n" for ln in text.splitlines()], str(p)


def _single(cmd: list[str], path: str) -> subprocess.CompletedProcess:
    with open(path) as f:
        return subprocess.run(cmd, stdin=f, env=_env(), capture_output=True, text=True, timeout=300, check=False)


def test_split_is_contiguous_and_balanced():
    assert R.split([b"x"] * 7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert R.split([b"x"] * 2, 3) == [(0, 1), (1, 2), (2, 2)]


def test_ray_sharded_pipeline_equals_one_process(ray_cluster, task_lines, tmp_path):
    lines, path = task_lines
    assert len(lines) == 12
    cmd = ["bash", "-c", "rollout --agent replay | verify --strategy state_diff"]
    one = _single(cmd, path)
    assert one.returncode == 0, one.stderr
    res = R.run_sharded(cmd, lines, 3, env={k: v for k, v in _env().items() if k in ("PATH", "PYTHONPATH")})
    assert res.exit_code == 0 and res.shard_codes == [0, 0, 0]
    got, want = _normalized(res.output.decode()), _normalized(one.stdout)
    assert len(want) == 12 and got == want  # record for record, in input order
    assert [r["id"] for r in got] == [json.loads(x)["id"] for x in lines]


def test_ray_shard_resume_and_rejects(ray_cluster, task_lines, tmp_path):
    lines, _ = task_lines
    bad = lines[:6] + [b'{"id": "broken", "task": \n'] + lines[6:]  # input line 7 is not JSON
    env = {k: v for k, v in _env().items() if k in ("PATH", "PYTHONPATH")}
    cmd = ["rollout", "--agent", "replay"]
    parts = tmp_path / "parts"
    res = R.run_sharded(cmd, bad, 4, parts_dir=str(parts), rejects=True, env=env)
    assert res.exit_code == 1 and sorted(res.shard_codes) == [0, 0, 0, 1]  # the slice with the bad line
    rej = [json.loads(x) for x in res.rejects.decode().splitlines()]
    assert len(rej) == 1 and rej[0]["line"] == 7  # slice-local line number shifted to the input's
    # a rerun after losing one part redoes only that slice, same merged output
    (parts / "part-2.jsonl").unlink()
    again = R.run_sharded(cmd, bad, 4, parts_dir=str(parts), rejects=True, env=env)
    assert again.skipped == [0, 1, 3]
    assert _normalized(again.output.decode()) == _normalized(res.output.decode())
    assert len(_normalized(res.output.decode())) == 12
    # the parts dir belongs to that run: another shard count is refused, not merged
    from toolkit.io import UsageError

    with pytest.raises(UsageError, match="nshards differ"):
        R.run_sharded(cmd, bad, 3, parts_dir=str(parts), env=env)


def test_ray_shard_failing_slice_names_it(ray_cluster, tmp_path):
    with pytest.raises(R.ShardError, match=r"shard 1 \(input lines 3-4\): exit 2"):
        R.run_sharded(["bash", "-c", 'grep -q boom && exit 2; cat'], [b"a", b"b", b"boom", b"c"], 2)


def test_ray_shard_cli_local_cluster(task_lines, tmp_path):
    _, path = task_lines
    if ray.is_initialized():
        ray.shutdown()
    one = _single(["rollout", "--agent", "replay"], path)
    out = tmp_path / "merged.jsonl"
    p = subprocess.run(["toolkit", "ray-shard", "-n", "3", "--num-cpus", "2", "-i", path, "-o", str(out), "--",
                        "rollout", "--agent", "replay"], env=_env(), capture_output=True, text=True, timeout=300,
                       check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _normalized(out.read_text()) == _normalized(one.stdout)
    assert "3 shards (exit codes [0, 0, 0])" in p.stderr
    p = subprocess.run(["toolkit", "ray-shard", "-n", "2"], env=_env(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2  # no command: usage error
