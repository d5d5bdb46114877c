"""`toolkit stats` and the CI gates (`--baseline/--max-drop`, `verify --min-pass-rate`), with the
commands of docs/ci-data-regression.md run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from tests.conftest import BIN, ROOT

from toolkit.cli import toolkit_group
from toolkit.stats import StatsError, check_regressions, compute, parse_max_drop


def _traj(tid: str, reward: float, passed: bool, tool_ok: list[bool], termination: str = "agent_done") -> dict:
    msgs = [{"role": "user", "content": "hi"}]
    for i, ok in enumerate(tool_ok):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"{tid}c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"{tid}c{i}",
                     "content": "{}" if ok else json.dumps({"error": {"code": "X"}})})
    msgs.append({"role": "assistant", "content": "done"})
    return {"id": tid, "messages": msgs, "reward": reward, "termination": termination,
            "scores": {"verify": {"passed": passed}}}


def _rec(rid: str, flow: str, trajs: list[dict], tokens: tuple[int, int] = (0, 0), cost: float = 0.0) -> dict:
    verdicts = [{"stage": "verify", "kind": "state_diff", "name": "state_diff", "passed": t["scores"]["verify"]["passed"],
                 "trajectory_id": t["id"]} for t in trajs]
    prov = [{"command": "rollout", "version": "x", "time": "t", "prompt_tokens": tokens[0],
             "completion_tokens": tokens[1], "cost": cost}]
    return {"id": rid, "flow": flow, "trajectories": trajs, "verdicts": verdicts, "provenance": prov}


@pytest.fixture
def dataset(tmp_path):
    # 3 records, 4 trajectories: rewards 1, 0.5, 0, 1 → mean 0.625, share at 1.0 = 0.5;
    # passed 2 of 4 → pass_rate 0.5; logigen 1/2, astra 1/2;
    # tool calls 2+1+0+3 = 6, errors 1+0+0+1 = 2 → rate 1/3; turns 3, 2, 1, 4 → mean 2.5
    recs = [_rec("a", "logigen", [_traj("a0", 1.0, True, [True, False]), _traj("a1", 0.5, False, [True])],
                 (100, 20), 0.01),
            _rec("b", "astra", [_traj("b0", 0.0, False, [], "max_turns")], (50, 5), 0.002),
            _rec("c", "astra", [_traj("c0", 1.0, True, [True, False, True])])]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs) + "not json\n")
    rj = tmp_path / "rejects.jsonl"
    rj.write_text("".join(json.dumps(x) + "\n" for x in [
        {"line": 3, "id": "x", "field": "task.ground_truth", "error": "missing target 12", "command": "verify"},
        {"line": 9, "id": "y", "field": "task.ground_truth", "error": "missing target 13", "command": "verify"},
        {"line": 2, "id": None, "field": None, "error": "bad JSON", "command": "rollout"}]))
    return p, rj


def test_stats_hand_computed(dataset):
    p, rj = dataset
    s = compute([str(p)], [str(rj)])
    t = s["total"]
    assert t["records"] == 3 and t["trajectories"] == 4 and t["bad_lines"] == 1
    assert t["flows"] == {"astra": 2, "logigen": 1}
    assert t["pass_rate"] == 0.5 and t["verified_trajectories"] == 4
    assert t["pass_rate_by_verdict"] == {"verify/state_diff": {"n": 4, "passed": 2, "pass_rate": 0.5}}
    assert t["pass_rate_by_flow"]["logigen"]["pass_rate"] == 0.5 and t["pass_rate_by_flow"]["astra"]["pass_rate"] == 0.5
    assert t["reward"]["mean"] == pytest.approx(0.625) and t["reward"]["share_1"] == 0.5
    assert t["reward"]["histogram_0_1"] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert t["tool_calls"] == 6 and t["tool_errors"] == 2 and t["tool_error_rate"] == pytest.approx(1 / 3)
    assert t["turns"]["mean"] == 2.5 and t["turns"]["max"] == 4
    assert t["terminations"] == {"agent_done": 3, "max_turns": 1}
    assert t["tokens"] == {"prompt": 150, "completion": 25, "total": 175} and t["cost"] == pytest.approx(0.012)
    assert s["rejects"]["total"] == 3
    assert s["rejects"]["by_reason"] == {"verify:task.ground_truth": 2, "rollout:-": 1}
    assert s["rejects"]["top_messages"][0] == {"message": "missing target N", "count": 2}
    assert s["metrics"]["pass_rate/verify/state_diff"] == 0.5 and s["metrics"]["reject_count"] == 3


def test_regression_gate_logic():
    base = {"metrics": {"pass_rate": 0.9, "tool_error_rate": 0.1}}
    assert check_regressions({"metrics": {"pass_rate": 0.9, "tool_error_rate": 0.1}}, base,
                             {"pass_rate": 0.0, "tool_error_rate": 0.0}) == []
    assert check_regressions({"metrics": {"pass_rate": 0.86}}, base, {"pass_rate": 0.05}) == []
    assert len(check_regressions({"metrics": {"pass_rate": 0.84}}, base, {"pass_rate": 0.05})) == 1
    # lower is better: a rise of the error rate is the regression
    assert len(check_regressions({"metrics": {"pass_rate": 0.9, "tool_error_rate": 0.2}}, base,
                                 {"tool_error_rate": 0.05})) == 1
    with pytest.raises(StatsError):
        check_regressions({"metrics": {}}, base, {"nope": 0.1})
    with pytest.raises(StatsError):
        parse_max_drop(["pass_rate"])


def test_cli_stats_baseline_equal_and_dropped(dataset, tmp_path):
    p, rj = dataset
    r = CliRunner().invoke(toolkit_group, ["stats", str(p), "--rejects", str(rj)])
    assert r.exit_code == 0, r.output
    base = tmp_path / "base.json"
    stdout = r.stdout if hasattr(r, "stdout") else r.output
    line = [ln for ln in stdout.splitlines() if ln.startswith("{")][0]
    base.write_text(line)
    assert json.loads(line)["total"]["records"] == 3
    # an equal run passes
    r = CliRunner().invoke(toolkit_group, ["stats", str(p), "--baseline", str(base), "--max-drop", "pass_rate=0"])
    assert r.exit_code == 0, r.output
    # a run whose pass rate dropped by more than the limit fails
    worse = tmp_path / "worse.jsonl"
    recs = [json.loads(ln) for ln in p.read_text().splitlines() if ln.startswith("{")]
    recs[2]["trajectories"][0]["scores"]["verify"]["passed"] = False  # 2/4 -> 1/4
    worse.write_text("".join(json.dumps(x) + "\n" for x in recs))
    r = CliRunner().invoke(toolkit_group, ["stats", str(worse), "--baseline", str(base), "--max-drop", "pass_rate=0.1"])
    assert r.exit_code == 1
    assert "regression: pass_rate: 0.5 -> 0.25" in r.output
    # within the limit: exit 0
    r = CliRunner().invoke(toolkit_group, ["stats", str(worse), "--baseline", str(base), "--max-drop", "pass_rate=0.3"])
    assert r.exit_code == 0
    # usage errors: exit 2
    assert CliRunner().invoke(toolkit_group, ["stats", str(p), "--max-drop", "pass_rate=0.1"]).exit_code == 2
    assert CliRunner().invoke(toolkit_group, ["stats", str(tmp_path / "missing.jsonl")]).exit_code == 2


def test_markdown_and_chart(dataset, tmp_path):
    p, _rj = dataset
    md, png = tmp_path / "s.md", tmp_path / "s.png"
    r = CliRunner().invoke(toolkit_group, ["stats", str(p), "--markdown", str(md), "--chart", str(png)])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    assert "| pass rate | 0.500 |" in text and "| termination max_turns | 1 |" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "matplotlib is not installed" in r.output
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bash(script: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{os.path.dirname(sys.executable)}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_ci_doc_commands(tmp_path):
    doc = (ROOT / "docs" / "ci-data-regression.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", doc, re.DOTALL)
    assert len(blocks) == 2
    setup, job = blocks
    r = _bash(setup, tmp_path)
    assert r.returncode == 0, r.stderr
    base = json.loads((tmp_path / "ci" / "baseline-stats.json").read_text())
    assert base["metrics"]["pass_rate"] == 1.0 and base["total"]["records"] == 6
    r = _bash(job, tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "stats.json").read_text())["regressions"] == []
    assert "| pass rate | 1.000 |" in (tmp_path / "stats.md").read_text()
    # one task loses a reference action: the replayed trajectory no longer reaches the target
    sample = tmp_path / "ci" / "sample.jsonl"
    recs = [json.loads(ln) for ln in sample.read_text().splitlines()]
    victim = next(r for r in recs if len([a for a in r["task"]["ground_truth"]["actions"]
                                          if not a["name"].startswith("query_")]) >= 1)
    acts = victim["task"]["ground_truth"]["actions"]
    victim["task"]["ground_truth"]["actions"] = [a for a in acts if a["name"].startswith("query_")]
    sample.write_text("".join(json.dumps(x) + "\n" for x in recs))
    r = _bash(job, tmp_path)
    assert r.returncode == 1, r.stderr
    assert "regression: pass_rate: 1 -> 0.833333" in r.stderr


def test_verify_min_pass_rate():
    from tests.conftest import run_cmd

    tasks = run_cmd(["toolkit", "tasks", "airline"]).stdout
    recs = [json.loads(ln) for ln in tasks.splitlines()]
    recs[0]["task"]["ground_truth"]["actions"] = []  # its replay does nothing: fails state_diff
    rolled = run_cmd(["rollout", "--agent", "replay"], stdin="".join(json.dumps(x) + "\n" for x in recs))
    assert rolled.returncode == 0, rolled.stderr
    ok = run_cmd(["verify", "--min-pass-rate", "0.8"], stdin=rolled.stdout)  # 5/6 = 0.833
    assert ok.returncode == 0, ok.stderr
    bad = run_cmd(["verify", "--min-pass-rate", "0.9"], stdin=rolled.stdout)
    assert bad.returncode == 1 and "below --min-pass-rate 0.9" in bad.stderr
    assert len(bad.stdout.splitlines()) == 6  # the records are still written
