"""`toolkit env serve --format openenv`, driven through OpenEnv's own client (`GenericEnvClient`
over /ws): on every airline and hotel task an oracle episode (the reference actions as
call_tool steps, then `done`) ends with reward 1.0, and a do-nothing episode right after it on the
same task with reward 0.0; every other step rewards 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

openenv = pytest.importorskip("openenv", reason="needs openenv-core (extra `integrations`)")

from tests.conftest import BIN, ROOT  # noqa: E402
from tests.integrations.fixtures import HOTEL_TASKS, airline_tasks, final_message, oracle, records  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("openenv")
    tasks = d / "tasks.jsonl"
    tasks.write_text(airline_tasks(d).read_text() + HOTEL_TASKS.read_text().replace('"../hotel"', json.dumps(
        str(HOTEL_TASKS.parent.parent / "hotel"))))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "env", "serve", "--format", "openenv", "--tasks",
                             str(tasks), "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, proc.stderr.read() if proc.poll() is not None else "")
        yield url, records(tasks)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_health(served):
    url, _ = served
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        assert json.load(r)["status"] == "healthy"


def test_oracle_then_nothing_on_every_task(served):
    url, recs = served
    assert len(recs) == 9
    with openenv.GenericEnvClient(base_url=url).sync() as env:
        for rec in recs:
            obs = env.reset(task_id=rec.id)
            assert obs.done is False and obs.observation["task_id"] == rec.id
            assert obs.observation["messages"][1] == {"role": "user", "content": rec.task.instruction}
            listed = env.step({"type": "list_tools"})
            names = [t["name"] for t in listed.observation["tools"]]
            assert listed.reward == 0.0 and "done" in names
            assert {n for n, _ in oracle(rec)} <= set(names)
            rewards = []
            for name, args in oracle(rec):
                r = env.step({"type": "call_tool", "tool_name": name, "arguments": args})
                assert r.done is False and r.observation["error"] is None, r.observation
                assert "error" not in json.loads(r.observation["result"]), r.observation["result"]
                rewards.append(r.reward)
            end = env.step({"type": "call_tool", "tool_name": "done", "arguments": {"message": final_message(rec)}})
            assert (end.done, end.reward) == (True, 1.0), (rec.id, end.observation)
            assert rewards == [0.0] * len(rewards) and sum(rewards) + end.reward == 1.0
            assert end.observation["result"]["passed"] is True

            env.reset(task_id=rec.id)  # the same task again: a fresh environment
            nothing = env.step({"type": "call_tool", "tool_name": "done", "arguments": {}})
            assert (nothing.done, nothing.reward) == (True, 0.0), rec.id


def test_errors_are_answers_not_crashes(served):
    url, recs = served
    rec = next(r for r in recs if r.id == "hotel-cancel-001")
    with openenv.GenericEnvClient(base_url=url).sync() as env:
        with pytest.raises(Exception, match="task_id"):
            env.reset(task_id="no-such-task")
        env.reset(task_id=rec.id)
        r = env.step({"type": "call_tool", "tool_name": "update_booking",
                      "arguments": {"booking_id": "BK-2043", "status": "checked_out"}})
        assert r.reward == 0.0 and json.loads(r.observation["result"])["error"]["code"] == "POLICY_VIOLATION"
        r = env.step({"type": "call_tool", "tool_name": "no_such_tool", "arguments": {}})
        assert json.loads(r.observation["result"])["error"]["code"] == "UNKNOWN_TOOL"
        st = env.state()
        assert (st["task_id"], st["calls"], st["step_count"]) == (rec.id, 2, 2)
        end = env.step({"type": "call_tool", "tool_name": "done", "arguments": {}})
        assert (end.done, end.reward) == (True, 0.0)
        after = env.step({"type": "call_tool", "tool_name": "update_booking",
                          "arguments": {"booking_id": "BK-2043", "status": "cancelled"}})
        assert after.done is True and "over" in after.observation["error"]["message"]
