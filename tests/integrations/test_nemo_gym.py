"""`toolkit env export --format nemo-gym`: one row per task, each valid as NeMo Gym's own
`nemo_gym.base_resources_server.BaseRunRequest` (Responses-API tools), offering every tool the
task's reference actions use."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cmd
from tests.integrations.fixtures import HOTEL_TASKS, airline_tasks, oracle, records


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("nemo")
    tasks = d / "tasks.jsonl"
    tasks.write_text(airline_tasks(d).read_text() + HOTEL_TASKS.read_text().replace(
        '"../hotel"', json.dumps(str(HOTEL_TASKS.parent.parent / "hotel"))))
    out = d / "rows.jsonl"
    r = run_cmd(["toolkit", "env", "export", "--format", "nemo-gym", "--tasks", str(tasks), "--out", str(out)])
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # the rows go to --out; stdout carries nothing else
    return records(tasks), [json.loads(x) for x in out.read_text().splitlines()]


def test_one_row_per_task_offering_the_reference_tools(exported):
    recs, rows = exported
    assert len(rows) == len(recs) == 9
    for rec, row in zip(recs, rows):
        assert row["id"] == row["task_id"] == rec.id
        params = row["responses_create_params"]
        assert params["input"][0]["role"] == "system" and "policy" in params["input"][0]["content"].lower()
        assert params["input"][1] == {"role": "user", "content": rec.task.instruction}
        for t in params["tools"]:  # the Responses-API shape, not chat-completions' {"function": {...}}
            assert set(t) == {"type", "name", "description", "parameters", "strict"} and t["type"] == "function"
            assert t["strict"] is False and t["parameters"]["type"] == "object"
        assert {n for n, _ in oracle(rec)} <= {t["name"] for t in params["tools"]}
        assert row["toolkit_task"]["task"]["ground_truth"]["actions"]
        assert "trajectories" not in row["toolkit_task"]


def test_rows_validate_as_nemo_gym_run_requests(exported):
    base = pytest.importorskip("nemo_gym.base_resources_server", reason="needs nemo-gym (extra `integrations`)")
    _, rows = exported
    for row in rows:
        req = base.BaseRunRequest.model_validate(row)
        tools = req.responses_create_params.tools
        assert [t["name"] if isinstance(t, dict) else t.name for t in tools] == [
            t["name"] for t in row["responses_create_params"]["tools"]]


def test_agent_ref_and_rejects(tmp_path):
    good = HOTEL_TASKS.read_text().replace('"../hotel"', json.dumps(str(HOTEL_TASKS.parent.parent / "hotel")))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(good + '{"id": "broken"}\n')
    out, rej = tmp_path / "rows.jsonl", tmp_path / "rej.jsonl"
    r = run_cmd(["toolkit", "env", "export", "--format", "nemo-gym", "--tasks", str(tasks), "--out", str(out),
                 "--agent-ref", "simple_agent", "--rejects", str(rej)])
    assert r.returncode == 1, r.stderr  # a rejected line: the others exported, exit 1
    assert "line 4 (id broken)" in r.stderr and "field env" in r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in rows] == [rec.id for rec in records(HOTEL_TASKS)]
    assert all(x["agent_ref"] == {"type": "responses_api_agents", "name": "simple_agent"} for x in rows)
    assert json.loads(rej.read_text())["line"] == 4
    r = run_cmd(["toolkit", "env", "export", "--format", "nemo-gym", "--tasks", str(tmp_path / "missing.jsonl"),
                 "--out", str(out)])
    assert r.returncode == 2 and "not found" in r.stderr
    r = run_cmd(["toolkit", "env", "export", "--format", "nemo-gym", "--tasks", str(tasks), "--out", str(out),
                 "--strategy", "no_such_scorer"])
    assert r.returncode == 2 and "no_such_scorer" in r.stderr and "state_diff" in r.stderr
