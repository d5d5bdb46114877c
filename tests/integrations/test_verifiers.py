"""`toolkit env export --format verifiers`: the package pip-installs, loads through verifiers'
own `load_environment(resolve_env_config(...))`, and an episode through verifiers' null harness
and subprocess runtime (a scripted model on loopback replaying the reference actions as tool
calls) scores 1.0, a do-nothing episode right after it on the same task 0.0 — on an airline task
and a hotel task (a path-based environment the package carries in envs/).

The null harness runs its chat program with `uv` (PEP 723 script; its packages come from PyPI the
first time, then from uv's cache): the test needs `uv` on PATH."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import pytest

vf = pytest.importorskip("verifiers.v1", reason="needs verifiers (extra `integrations`)")

from tests.conftest import BIN, ROOT, run_cmd  # noqa: E402
from tests.integrations.fixtures import HOTEL_TASKS, ScriptedAgent, airline_tasks, records  # noqa: E402
from toolkit.llm.testserver import ScriptedServer  # noqa: E402

NAME = "toolkit-it-tasks"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    d = tmp_path_factory.mktemp("vf")
    tasks = d / "tasks.jsonl"
    airline = airline_tasks(d).read_text().splitlines()
    hotel = HOTEL_TASKS.read_text().replace('"../hotel"', json.dumps(str(HOTEL_TASKS.parent.parent / "hotel")))
    tasks.write_text("\n".join(airline[:1]) + "\n" + hotel.splitlines()[2] + "\n")  # airline-task-001, hotel-book-003
    out = d / "pkg"
    r = run_cmd(["toolkit", "env", "export", "--format", "verifiers", "--tasks", str(tasks), "--out", str(out),
                 "--name", NAME])
    assert r.returncode == 0, r.stderr
    site = d / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(site), str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sys.path.insert(0, str(site))
    try:
        yield out, site, records(tasks)
    finally:
        sys.path.remove(str(site))
        for m in [m for m in sys.modules if m == "toolkit_it_tasks" or m.startswith("toolkit_it_tasks.")]:
            del sys.modules[m]


def test_package_layout(package):
    out, site, recs = package
    mod = site / "toolkit_it_tasks"
    assert (mod / "__init__.py").is_file() and (mod / "tasks.jsonl").is_file()
    lines = [json.loads(x) for x in (mod / "tasks.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == ["airline-task-001", "hotel-book-003"]
    # the hotel domain travels with the package, its path relative to tasks.jsonl
    hotel_path = lines[1]["env"]["path"]
    assert not os.path.isabs(hotel_path) and (mod / hotel_path / "schema.sql").is_file()
    assert {k: lines[0]["env"][k] for k in ("backend", "id", "state_ref")} == {
        "backend": "sqlite", "id": "airline", "state_ref": recs[0].env.state_ref}
    assert "path" not in lines[0]["env"]


def test_loads_through_verifiers(package):
    env = vf.load_environment(vf.resolve_env_config(_config()))
    tasks = list(env.taskset)
    assert [t.data.id for t in tasks] == ["airline-task-001", "hotel-book-003"]
    for t, rec in zip(tasks, package[2]):
        assert t.data.prompt == rec.task.instruction and t.data.prompt_text.strip()
        assert "policy" in (t.data.system_prompt or "").lower()


def _config() -> dict:
    return {"taskset": {"id": NAME}, "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}


@pytest.mark.skipif(shutil.which("uv") is None and not os.path.exists(os.path.join(BIN, "uv"))
                    and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "uv")),
                    reason="verifiers' null harness runs its chat program with uv (extra `integrations`)")
def test_oracle_then_nothing_through_the_null_harness(package, monkeypatch):
    _, _, recs = package
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the tool server runs `python -m toolkit.integrations.verifiers`
    env = vf.load_environment(vf.resolve_env_config(_config()))
    tasks = {t.data.id: t for t in env.taskset}

    async def episodes(server: ScriptedServer, agent: ScriptedAgent) -> dict[str, list]:
        ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=server.base_url,
                                                                           api_key_var="TOOLKIT_IT_KEY"))
        async def pair(tid: str, task) -> list:  # the oracle episode, then nothing, on one task
            agent.modes[tid] = "oracle"
            first = await env.run_episode(task, ctx)
            agent.modes[tid] = "nothing"
            return [first, await env.run_episode(task, ctx)]

        async with env.serving():  # the two tasks' pairs at once (each rollout starts two processes)
            pairs = await asyncio.gather(*(pair(tid, task) for tid, task in tasks.items()))
        return dict(zip(tasks, pairs))

    agent = ScriptedAgent(recs)
    with ScriptedServer(agent) as srv:
        got = asyncio.run(asyncio.wait_for(episodes(srv, agent), timeout=600))
    for tid, (oracle_ep, nothing_ep) in got.items():
        assert oracle_ep.ok and not oracle_ep.errors, (tid, oracle_ep.errors)
        (t1,), (t2,) = oracle_ep.traces, nothing_ep.traces
        assert t1.reward == 1.0, (tid, t1.rewards, t1.state.calls, t1.errors)
        assert [c["name"] for c in t1.state.calls] == [a.name for a in next(
            r for r in recs if r.id == tid).task.ground_truth.actions]
        assert all(c["ok"] for c in t1.state.calls)
        assert t2.reward == 0.0 and t2.state.calls == [], (tid, t2.rewards)
    assert set(agent.seen) == set(tasks)
