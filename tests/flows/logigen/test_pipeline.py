"""The whole LOGIGEN synthesis recipe from a domain brief: the Architect (scripted replies on the
loopback server, taken from tests/flows/logigen/test_architect.py) compiles a domain none of the task code has
seen, then gen-task (symbolic; the LLM writes the user views) | validate-task | rollout (oracle) |
verify → SFT rows and the yield table with the LLM requests of both LLM stages."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.conftest import run_cmd
from tests.flows.logigen.test_architect import ANALYZE, BRIEF, GOOD_TRIGGERS, PASS, POLICY, TABLES
from tests.flows.logigen.test_tasks import view_reply

from toolkit.llm.testserver import ScriptedServer

ROOT = Path(__file__).resolve().parents[3]


def test_synth_recipe_from_a_brief(tmp_path):
    architect = iter([ANALYZE, PASS, POLICY, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS])

    def reply(req):
        if "You write the user's side" in (req["messages"][0].get("content") or ""):
            return view_reply(req)  # the task's own facts, so the view passes the completeness check
        return next(architect)

    brief = tmp_path / "briefs.jsonl"
    brief.write_text(json.dumps(BRIEF) + "\n")
    out = tmp_path / "run"
    with ScriptedServer(reply) as srv:
        env = {"OUT": str(out), "TOOLKIT_BASE_URL": srv.base_url, "TOOLKIT_MODEL": "scripted",
               "TOOLKIT_MAX_RETRIES": "0", "ROLLOUT_ARGS": "--agent replay -n 1", "TOOLKIT_PYTHON": sys.executable,
               "PATH": f"{ROOT / 'bin'}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
        r = run_cmd(["bash", str(ROOT / "recipes" / "logigen_synth.sh"), str(brief), "6"], env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    domains = [json.loads(x) for x in (out / "domains.jsonl").read_text().splitlines()]
    assert len(domains) == 1 and Path(domains[0]["env"]["path"]).is_dir()
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == 6 and all(t["parent_id"] == "parking-1" for t in tasks)
    assert {t["task"]["extra"]["user_view"]["source"] for t in tasks} == {"llm"}
    assert sum(t["task"]["complexity"]["violation_first"] for t in tasks) >= 2  # 30% of 6, rounded up
    assert len((out / "sft.jsonl").read_text().splitlines()) == 6
    # the rollout replays the reference (--agent replay), so passing verify alone proves little:
    # every task needed a state change (DIFF(initial, target) > 0) that the trajectory reached (DIFF 0) ...
    verified = [json.loads(x) for x in (out / "verified.jsonl").read_text().splitlines()]
    sd = [v for r in verified for v in r["verdicts"] if v["name"] == "state_diff"]
    assert len(sd) == 6 and all(v["scores"]["delta0"] > 0 and v["scores"]["diff"] == 0 and v["passed"] for v in sd)
    # ... and the same verify step rejects a trajectory that stops one write short
    cut = json.loads(json.dumps(verified[0]))
    t = cut["trajectories"][0]
    last = max(i for i, m in enumerate(t["messages"]) if m["role"] == "assistant" and m.get("tool_calls"))
    ids = {c["id"] for c in t["messages"][last]["tool_calls"]}
    t["messages"] = [m for i, m in enumerate(t["messages"]) if i != last and m.get("tool_call_id") not in ids]
    t.update(steps=[], reward=None, scores={})
    cut["verdicts"] = []
    r2 = run_cmd(["verify", "--recipe", str(ROOT / "recipes" / "logigen.yaml"), "--filter", "all"],
                 json.dumps(cut) + "\n", env=env)
    [v] = [v for v in json.loads(r2.stdout)["verdicts"] if v["name"] == "state_diff"]
    assert not v["passed"] and v["scores"]["diff"] > 0, r2.stderr[-2000:]
    table = {row["stage"]: row for row in json.loads((out / "yield.json").read_text())}
    assert list(table) == ["gen-plan", "gen-task", "validate-task", "rollout", "verify", "total"]
    assert table["gen-plan"]["llm_requests"] == 8 and table["gen-task"]["llm_requests"] == 6
    assert table["total"]["out"] == 6 and table["total"]["tokens"] > 0


def test_demo_main_job_files_and_table(tmp_path):
    """recipes/demo.sh (the main job of `bin/setup demo`) with the agent on a loopback scripted
    server instead of the embedded model (the 135M model is run by `bin/setup demo` itself): tasks
    at depth, validated, the quality report, oracle-verified SFT rows, a short rollout whose calls
    are counted as valid or not, and the yield table; every file named on screen."""
    from toolkit.llm.testserver import ScriptedServer

    out = tmp_path / "demo"
    # one valid call (a real tool, well-formed), then an unknown tool: 1 of 2 calls valid
    replies = [{"tool_calls": [{"name": "query_flight", "arguments": {"limit": 2}}]},
               {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]}]
    with ScriptedServer(replies) as srv:
        env = {"OUT": str(out), "DEMO_TASKS": "24", "DEMO_ROLLOUTS": "1", "DEMO_TURNS": "2",
               "DEMO_ARGS": f"--agent-base-url {srv.base_url} --agent-model scripted --user-base-url {srv.base_url} "
                            f"--user-model scripted --constrain-tool-calls off",
               "TOOLKIT_MAX_RETRIES": "0", "TOOLKIT_PYTHON": sys.executable,
               "PATH": f"{ROOT / 'bin'}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
        r = run_cmd(["bash", str(ROOT / "recipes" / "demo.sh")], env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    tasks = [json.loads(x) for x in (out / "validated.jsonl").read_text().splitlines()]
    assert len(tasks) == 24
    sft = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    assert len(sft) == 24 and all(row["messages"] and row["tools"] for row in sft)  # SFT-ready: every task
    q = json.loads((out / "quality.json").read_text())["total"]
    assert q["tasks"] == 24 and q["leak_rate"] == 0 and q["share_writes_ge3"] >= 0.5
    table = {row["stage"]: row for row in json.loads((out / "yield.json").read_text())}
    assert {"gen-task", "validate-task", "rollout (oracle)", "verify (oracle)", "rollout (135M)",
            "verify (135M)", "total"} <= set(table)
    assert "embedded 135M model: 1 trajectories, 2 tool calls, 1 valid" in r.stderr, r.stderr[-2000:]
    for name in ("tasks.jsonl", "validated.jsonl", "quality.json", "oracle.jsonl", "sft.jsonl", "embedded.jsonl",
                 "yield.txt"):
        assert f"  {name}" in r.stderr  # said on screen what each file is
    assert (out / "yield.txt").read_text().splitlines()[0].startswith("stage")
