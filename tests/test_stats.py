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
from tests.conftest import BIN, ROOT, run_cmd

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


def _clean(p, tmp_path):
    """The dataset without its bad line (a bad line makes `toolkit stats` exit 1)."""
    c = tmp_path / "clean.jsonl"
    c.write_text("".join(ln + "\n" for ln in p.read_text().splitlines() if ln.startswith("{")))
    return c


def test_cli_stats_baseline_equal_and_dropped(dataset, tmp_path):
    p, rj = dataset
    r = CliRunner().invoke(toolkit_group, ["stats", str(p), "--rejects", str(rj)])
    assert r.exit_code == 1, r.output  # the "not json" line: counted, named, exit 1
    assert "rejected d.jsonl line 4" in r.output.replace(str(p), "d.jsonl") and "Traceback" not in r.output
    p = _clean(p, tmp_path)
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
    p = _clean(dataset[0], tmp_path)
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


# ---------------------------------------------------------------------------------------------
# bad input: the streaming commands' reader (issue 30, item 6)

BAD = ROOT / "tests" / "data" / "bad_input"


def test_stats_on_the_bad_input_corpus_counts_and_names_every_bad_line(tmp_path):
    expected = json.loads((BAD / "expected.json").read_text())
    reject = {int(n): e for n, e in expected["lines"].items() if e["expect"] == "reject"}
    accept = [n for n, e in expected["lines"].items() if e["expect"] == "accept"]
    out_rejects = tmp_path / "rejects.jsonl"
    p = run_cmd(["toolkit", "stats", str(BAD / "corpus.jsonl"), "--write-rejects", str(out_rejects)])
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "Error:" not in p.stderr.replace("UnicodeDecodeError", "")
    s = json.loads(p.stdout)
    assert s["total"]["records"] == len(accept) == 3
    assert s["total"]["bad_lines"] == s["bad_lines"] == len(reject)
    assert sum(s["total"]["bad_line_reasons"].values()) == len(reject)
    for n in reject:  # every bad line named with its file and number
        assert f"corpus.jsonl line {n}" in p.stderr, n
    # the three lines that crashed it: 1,500 deep, invalid UTF-8, a 5,000-digit integer
    kinds = {e["kind"]: n for n, e in reject.items()}
    lines = {n: ln for ln in p.stderr.splitlines() for n in reject if f"corpus.jsonl line {n}:" in ln
             or f"corpus.jsonl line {n} " in ln}
    assert "nesting too deep" in lines[kinds["deep_nesting"]]
    assert "not UTF-8" in lines[kinds["invalid_utf8"]]
    assert "integer of 5000 digits" in lines[kinds["huge_int"]]
    assert "duplicate key 'id'" in lines[kinds["duplicate_key"]]
    # --write-rejects: the rejects format every command writes, with line numbers and fields
    rows = [json.loads(x) for x in out_rejects.read_text().splitlines()]
    assert sorted(r["line"] for r in rows) == sorted(reject)
    assert all(r["command"] == "stats" and r["source"].endswith("corpus.jsonl") for r in rows)
    for r in rows:
        if "field" in reject[r["line"]]:
            assert r["field"] == reject[r["line"]]["field"], r
    # and `toolkit stats --rejects` summarises that file like any command's
    s2 = json.loads(run_cmd(["toolkit", "stats", str(BAD / "corpus.jsonl"), "--rejects", str(out_rejects)]).stdout)
    assert s2["rejects"]["total"] == len(reject) and s2["rejects"]["unreadable"] == 0


def test_stats_reads_a_cut_gz_like_every_command(tmp_path):
    gz = BAD / "truncated.jsonl.gz"
    p = run_cmd(["toolkit", "stats", str(gz)])
    assert p.returncode == 1 and "Traceback" not in p.stderr
    s = json.loads(p.stdout)
    r = run_cmd(["verify", "--strategy", "state_diff", "-i", str(gz)])
    kept = len(r.stdout.splitlines())
    assert s["total"]["records"] == kept == 2  # the records before the cut, as verify keeps them
    assert s["total"]["bad_lines"] == 1 and "input cut after line 2" in p.stderr
    # stdin works the same; a missing input is still a usage error
    expected = json.loads((BAD / "expected.json").read_text())
    n_good = next(int(n) for n, e in expected["lines"].items() if e["kind"] == "good")
    line = (BAD / "corpus.jsonl").read_bytes().split(b"\r\n")[n_good - 1].decode()
    q = run_cmd(["toolkit", "stats", "-"], stdin=line + "\n" + line + "\n")
    assert q.returncode == 1 and json.loads(q.stdout)["datasets"]["stdin"]["records"] == 1  # a duplicate id
    assert "stdin line 2 (id " in q.stderr and "duplicate id" in q.stderr
    assert run_cmd(["toolkit", "stats", str(tmp_path / "missing.jsonl.gz")]).returncode == 2


def test_stats_quality_and_rejects_files_never_crash(tmp_path):
    q = run_cmd(["toolkit", "stats", "--quality", str(BAD / "corpus.jsonl")])
    assert q.returncode == 1 and "Traceback" not in q.stderr
    assert json.loads(q.stdout)["total"]["tasks"] == 3
    rj = tmp_path / "rejects.jsonl"
    rj.write_bytes(b'{"line": 1, "command": "verify", "field": "id", "error": "bad"}\n'
                   + b"[" * 1500 + b"]" * 1500 + b"\n\xff\xfe\n" + b'{"a": 1, "a": 2}\n' + b"42\n")
    good = BAD / "corpus.jsonl"
    p = run_cmd(["toolkit", "stats", str(good), "--rejects", str(rj)])
    assert p.returncode == 1 and "Traceback" not in p.stderr
    s = json.loads(p.stdout)
    assert s["rejects"]["total"] == 5 and s["rejects"]["unreadable"] == 4
    assert s["rejects"]["by_reason"]["verify:id"] == 1
    for n in (2, 3, 4, 5):
        assert f"rejects.jsonl line {n}: not a reject" in p.stderr


def test_stats_gate_still_works_on_a_dataset_with_bad_lines(tmp_path):
    # the baseline of a run with bad lines compares as before; bad_lines itself can be gated
    base = tmp_path / "base.json"
    p = run_cmd(["toolkit", "stats", str(BAD / "corpus.jsonl")])
    base.write_text(p.stdout)
    assert json.loads(p.stdout)["metrics"]["bad_lines"] == json.loads(p.stdout)["total"]["bad_lines"] > 0
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"".join(x + b"\n" for i, x in enumerate((BAD / "corpus.jsonl").read_bytes().split(b"\r\n"), 1)
                               if json.loads((BAD / "expected.json").read_text())["lines"].get(str(i), {})
                               .get("expect") == "accept"))
    r = run_cmd(["toolkit", "stats", str(clean), "--baseline", str(base), "--max-drop", "records=0",
                 "--max-drop", "bad_lines=0"])
    assert r.returncode == 0, r.stderr  # fewer bad lines is no regression
    r = run_cmd(["toolkit", "stats", str(BAD / "corpus.jsonl"), "--baseline", str(tmp_path / "clean-base.json")])
    assert r.returncode == 2
