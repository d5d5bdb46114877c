"""toolkit.integrations.core: the task file reader, one episode against a fresh environment, and
the verify reward every integration reports (no peer framework needed)."""

from __future__ import annotations

import json
import os

import pytest

from tests.integrations.fixtures import HOTEL_TASKS, PYTHON_TASKS, airline_tasks, final_message, oracle, records
from toolkit.integrations.core import Episode, Scorer, TaskFileError, group_toolsets, read_tasks


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return records(airline_tasks(tmp_path_factory.mktemp("airline"))) + records(HOTEL_TASKS) + records(PYTHON_TASKS)


def test_oracle_scores_one_and_nothing_zero_on_every_task(tasks):
    scorer = Scorer()
    assert [r.env.backend for r in tasks] == ["sqlite"] * 9 + ["python"] * 2
    for rec in tasks:
        with Episode(rec) as ep:
            assert ep.prompt[1]["content"] == rec.task.instruction
            assert ep.env.policy().strip()[:40] in ep.prompt[0]["content"]
            for name, args in oracle(rec):
                c = ep.call(name, args)
                assert c.ok, (rec.id, name, c.content)
            s = scorer.score(rec, ep.calls, prompt=ep.prompt, final_text=final_message(rec))
            assert (s.reward, s.passed) == (1.0, True), (rec.id, s.scores)
        with Episode(rec) as ep:  # right after, the same task: a fresh environment, nothing done
            assert ep.calls == []
            s = scorer.score(rec, ep.calls, prompt=ep.prompt, final_text="Sorry.")
            assert (s.reward, s.passed) == (0.0, False), rec.id


def test_episodes_do_not_share_state(tasks):
    rec = next(r for r in tasks if r.id == "hotel-cancel-001")
    with Episode(rec) as a, Episode(rec) as b:
        assert a.call("update_booking", {"booking_id": "BK-2043", "status": "cancelled"}).ok
        got = json.loads(b.call("query_booking", {"booking_id": "BK-2043"}).content)
        assert "booked" in json.dumps(got) and "cancelled" not in json.dumps(got)
        # the same cancellation a second time breaks the policy in `a` only
        again = a.call("update_booking", {"booking_id": "BK-2043", "status": "cancelled"})
        assert not again.ok and again.error_code == "POLICY_VIOLATION"


def test_bad_calls_are_structured_errors_and_score_zero(tasks):
    rec = next(r for r in tasks if r.id == "hotel-book-003")
    scorer = Scorer()
    with Episode(rec) as ep:
        unknown = ep.call("delete_everything", {})
        assert (unknown.ok, unknown.error_code) == (False, "UNKNOWN_TOOL")
        assert "insert_booking" in json.loads(unknown.content)["error"]["hint"]
        bad = ep.call("insert_booking", ["not", "an", "object"])
        assert (bad.ok, bad.error_code) == (False, "INVALID_ARGUMENTS")
        # a booking the policy refuses (room 201 is under maintenance): the state is unchanged
        refused = ep.call("insert_booking", {"booking_id": "BK-2052", "guest_id": "G-023", "room_no": "201",
                                             "check_in": "2025-09-25", "check_out": "2025-09-27", "num_guests": 2})
        assert (refused.ok, refused.error_code) == (False, "POLICY_VIOLATION")
        assert scorer.score(rec, ep.calls).reward == 0.0
        # the wrong room: a real write, still not the target state
        assert ep.call("insert_booking", {"booking_id": "BK-2051", "guest_id": "G-023", "room_no": "102",
                                          "check_in": "2025-09-25", "check_out": "2025-09-27", "num_guests": 2}).ok
        assert scorer.score(rec, ep.calls).reward == 0.0
        assert len(ep.calls) == 4 and [c.id for c in ep.calls] == ["call_0", "call_1", "call_2", "call_3"]


def test_toolsets_group_tasks_by_environment(tasks):
    sets = group_toolsets(tasks)
    assert [ts.name for ts in sets] == ["airline", "hotel", "pantry", "orders_desk"]
    assert [len(ts.records) for ts in sets] == [6, 3, 1, 1]
    hotel = {t["function"]["name"] for t in sets[1].tools}
    assert {"insert_booking", "update_booking", "query_booking"} <= hotel
    assert "insert_room" not in hotel  # hidden by the domain's tools.yaml
    for ts in sets:
        for r in ts.records:
            assert {n for n, _ in oracle(r)} <= {t["function"]["name"] for t in ts.tools}


def test_read_tasks_rejects_bad_lines_with_line_and_field(tmp_path, capsys):
    good = HOTEL_TASKS.read_text().splitlines()
    no_env = json.loads(good[0]) | {"id": "no-env"}
    no_env.pop("env")
    no_truth = json.loads(good[1]) | {"id": "no-truth"}
    no_truth["task"] = {"instruction": "hello"}
    simulated = json.loads(good[2]) | {"id": "simulated", "env": {"backend": "simulated"}}
    (tmp_path / "sub").mkdir()
    src = tmp_path / "sub" / "tasks.jsonl"  # env.path "../hotel" → tmp_path/hotel
    src.write_text("\n".join([good[0], "{not json", json.dumps(no_env), good[1], json.dumps(no_truth),
                              json.dumps(simulated), good[0]]) + "\n")
    (tmp_path / "hotel").symlink_to(HOTEL_TASKS.parent.parent / "hotel")
    rej = tmp_path / "rejects.jsonl"
    got = read_tasks(str(src), rejects=str(rej))
    assert [r.id for r in got] == ["hotel-cancel-001", "hotel-checkin-002"] and got.rejected == 5
    rows = [json.loads(x) for x in rej.read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rows] == [
        (2, None), (3, "env"), (5, "task.ground_truth"), (6, "env.backend"), (7, "id")]
    err = capsys.readouterr().err
    assert "line 3 (id no-env)" in err and "duplicate id" in err
    # the relative env.path was resolved against the task file's directory
    assert got[0].env.path == str(tmp_path / "hotel")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{not json\n")
    with pytest.raises(TaskFileError, match="no usable task"):
        read_tasks(str(empty))


def test_mcp_server_episode_is_confined_and_verified(tmp_path, monkeypatch):
    """A live MCP server (mcp-server-git, the operator's servers file) as an exported task: each
    Episode starts its own confined server in a fresh copy of the workdir, the oracle's calls
    score 1.0 and nothing 0.0, and the server's process is gone when the episode closes."""
    pytest.importorskip("mcp_server_git")
    from tests.envs.mcp import test_env as M

    repo = tmp_path / "template"
    repo.mkdir()
    M._git(repo, "init", "-q")
    (repo / "a.txt").write_text("hello\n")
    M._git(repo, "add", "a.txt")
    M._git(repo, "commit", "-qm", "init")
    (repo / "b.txt").write_text("new file\n")
    marker = f"i35-{tmp_path.name}"
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"git": {
        "command": M.GIT_SERVER, "args": ["--repository", "{workdir}"], "env": {**M.IDENT, "TOOLKIT_TEST_MARKER": marker},
        "state_command": M.STATE, "limits": {"cpu_seconds": 60, "wall_seconds": 30},
        "workdir_roots": [str(tmp_path)]}}}))
    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers))
    src = tmp_path / "tasks.jsonl"
    src.write_text(json.dumps(M._task(repo, M.FULL)) + "\n")
    (rec,) = read_tasks(str(src))
    scorer = Scorer()
    with Episode(rec) as ep:
        # server_pid is the confining launcher's; the server itself runs under it
        assert ep.env.server_pid in M._servers_with_marker(marker)
        for name, args in oracle(rec):
            assert ep.call(name, args).ok, name
        assert scorer.score(rec, ep.calls, prompt=ep.prompt).reward == 1.0
        pid = ep.env.server_pid
    assert not os.path.exists(f"/proc/{pid}") and M._servers_with_marker(marker) == []
    with Episode(rec) as ep:
        assert scorer.score(rec, ep.calls, prompt=ep.prompt).reward == 0.0
    assert "?? b.txt" in M._git(repo, "status", "--porcelain")  # the template is untouched
