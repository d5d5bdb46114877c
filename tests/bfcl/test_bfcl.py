"""BFCL multi-turn: tasks → rollout --agent replay → verify --strategy bfcl, and the python
environment's final states against bfcl-eval's own executor."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.conftest import jsonl, run_cmd

pytest.importorskip("bfcl_eval")


def _records(category="multi_turn_base", limit=None):
    from toolkit.bfcl import task_records

    return task_records(category, limit=limit)


def _pipeline(records: list[dict], timeout=900) -> list[dict]:
    r = run_cmd(["rollout", "--agent", "replay"], stdin=jsonl(records), timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    v = run_cmd(["verify", "--strategy", "bfcl"], stdin=r.stdout, timeout=timeout)
    assert v.returncode in (0, 1), v.stderr[-2000:]
    return [json.loads(ln) for ln in v.stdout.splitlines()]


def _passed(rec: dict) -> bool:
    return rec["trajectories"][0]["reward"] == 1.0


def _truncated(rec: dict) -> dict:
    """The same task whose replay skips the last call of every turn (the checker still gets the
    full ground truth from extra.bfcl)."""
    rec = json.loads(json.dumps(rec))
    gt = rec["task"]["ground_truth"]
    gt["turns"] = [t[:-1] for t in gt["turns"]]
    gt["actions"] = [a for t in gt["turns"] for a in t]
    return rec


def test_tasks_command_and_record_shape():
    r = run_cmd(["toolkit", "tasks", "bfcl:multi_turn_miss_func", "--limit", "2"])
    assert r.returncode == 0, r.stderr
    recs = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == ["multi_turn_miss_func_0", "multi_turn_miss_func_1"]
    first = recs[0]
    # BFCL's entry 0: 5 turns, the 4th (index 3) is the held-out-function turn for `sort`
    assert len(first["task"]["user_turns"]) == 5 and first["task"]["held_out_tools"] == {"3": ["sort"]}
    assert first["task"]["user_turns"][3][0]["content"].startswith("I have updated some more functions")
    assert first["task"]["ground_truth"]["turns"][3] == [{"name": "sort", "arguments": {"file_name": "final_report.pdf"}}]
    tools = {t["function"]["name"]: t["function"] for t in first["env"]["config"]["tools"]}
    assert tools["cd"]["parameters"]["type"] == "object"  # BFCL's "dict" mapped as BFCL maps it
    bad = run_cmd(["toolkit", "tasks", "bfcl:nope"])
    assert bad.returncode == 2 and "multi_turn_base" in bad.stderr


def test_replay_passes_and_truncated_fails_subset():
    recs = _records(limit=12)
    out = _pipeline(recs + [_truncated(r) | {"id": r["id"] + "-cut"} for r in recs])
    full = [r for r in out if not r["id"].endswith("-cut")]
    cut = [r for r in out if r["id"].endswith("-cut")]
    assert len(full) == len(cut) == 12
    assert all(_passed(r) for r in full)
    assert not any(_passed(r) for r in cut)
    t = full[0]["trajectories"][0]
    # one user message per BFCL turn, the episode ends when the script does
    assert sum(m["role"] == "user" for m in t["messages"]) == len(recs[0]["task"]["user_turns"])
    assert t["termination"] == "user_stop"


@pytest.mark.slow
@pytest.mark.heavy
def test_replay_all_multi_turn_base():
    recs = _records()
    assert len(recs) == 200
    full = _pipeline(recs)
    n_pass = sum(_passed(r) for r in full)
    assert n_pass >= 199, [r["id"] for r in full if not _passed(r)]
    cut = _pipeline([_truncated(r) for r in recs])
    n_fail = sum(not _passed(r) for r in cut)
    assert n_fail >= 180, n_fail  # ≥ 90% fail without the last call of every turn


def _bfcl_final_state(rec: dict) -> dict:
    """bfcl-eval's own executor on the raw ground-truth strings, turn by turn."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as U

    from toolkit.bfcl.sandbox_src import bfcl_dump

    b = rec["extra"]["bfcl"]
    cfg = rec["env"]["state"]["bfcl"]
    model = f"toolkit_test_{uuid.uuid4().hex}"
    inst = {}
    try:
        for turn in b["ground_truth"]:
            _, inst = U.execute_multi_turn_func_call(turn, cfg["initial_config"], b["involved_classes"], model,
                                                     b["id"], long_context=cfg["long_context"], is_evaL_run=True)
        if not inst:  # no call at all: the instances as initialized
            _, inst = U.execute_multi_turn_func_call([], cfg["initial_config"], b["involved_classes"], model,
                                                     b["id"], long_context=cfg["long_context"], is_evaL_run=True)
        return bfcl_dump(inst)
    finally:
        for k in [k for k in vars(U) if k.startswith(re.sub(r"[-./:]", "_", model))]:
            del vars(U)[k]


def _toolkit_final_state(rec: dict) -> dict:
    from toolkit.envs import load_env

    with load_env(rec["env"]) as env:
        env.reset()
        for a in rec["task"]["ground_truth"]["actions"]:
            env.call(a["name"], a["arguments"])
        st = env.snapshot()
    st.pop("bfcl", None)
    return st


def _compare(recs):
    same = [r["id"] for r in recs if _toolkit_final_state(r) == _bfcl_final_state(r)]
    return same


def test_final_states_equal_bfcl_executor_subset():
    recs = _records(limit=8)
    assert len(_compare(recs)) == 8


@pytest.mark.slow
@pytest.mark.heavy
def test_final_states_equal_bfcl_executor_all():
    recs = _records()
    same = _compare(recs)
    assert len(same) >= 199, sorted({r["id"] for r in recs} - set(same))


def test_served_model_path_with_scripted_server():
    """rollout with an LLM agent (the loopback scripted OpenAI-compatible server answering BFCL's
    ground truth turn by turn, one call per step) | verify --strategy bfcl; a model that skips a
    call fails."""
    from click.testing import CliRunner

    from toolkit import cli
    from toolkit.llm.testserver import ScriptedServer

    recs = _records("multi_turn_miss_func", limit=2)
    gts = {r["task"]["user_turns"][0][0]["content"]: r["task"]["ground_truth"]["turns"] for r in recs}
    offered: list[set] = []

    def reply(req):
        msgs = req["messages"]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        gt = gts[msgs[users[0]]["content"]]
        turn = len(users) - 1
        done = sum(1 for m in msgs[users[-1]:] if m["role"] == "assistant" and m.get("tool_calls"))
        offered.append({t["function"]["name"] for t in req["tools"]})
        if turn == 2 and gt is gts[recs[1]["task"]["user_turns"][0][0]["content"]]:
            done += 1  # the second task's model skips the first call of turn 2 (its cd)
        if done < len(gt[turn]):
            a = gt[turn][done]
            return {"tool_calls": [{"name": a["name"], "arguments": a["arguments"]}]}
        return "Done."

    with ScriptedServer(reply) as srv:
        r = CliRunner().invoke(cli.rollout, ["--base-url", srv.base_url, "--model", "scripted", "--max-turns", "60"],
                               input=jsonl(recs))
        assert r.exit_code == 0, r.output
        v = CliRunner().invoke(cli.verify, ["--strategy", "bfcl"], input=r.stdout)
    out = {json.loads(x)["id"]: json.loads(x) for x in v.stdout.splitlines()}
    assert out["multi_turn_miss_func_0"]["trajectories"][0]["reward"] == 1.0
    assert out["multi_turn_miss_func_1"]["trajectories"][0]["reward"] == 0.0
    assert any("sort" not in o for o in offered) and any("sort" in o for o in offered)  # held back, then offered
