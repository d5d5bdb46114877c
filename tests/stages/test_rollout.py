"""rollout: agent x user simulator x environment, against a real loopback HTTP server (scripted
replies) and the bundled sqlite domains."""
import asyncio
import json

import pytest

from tests.conftest import requires_embedded, BIN, jsonl, run_cmd
from toolkit import domains
from toolkit.envs import Environment, ToolResult, register_backend
from toolkit.llm import Meter
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record
from toolkit.episodes import text as episodes
from toolkit.stages import rollout


def tasks(domain="airline"):
    return [Record.model_validate(r) for r in domains.load_tasks(domain)]


def build(url, **kw):
    cfg = {"n": 1, "agent_kind": "llm", "max_turns": 8, "base_url": url, "model": "scripted",
           "tool_protocol": "native", "max_retries": 0, "concurrency": 8}
    cfg.update(kw)
    return rollout.build(cfg, Meter())


def is_user_sim(req):
    return "playing the role of a customer" in (req["messages"][0].get("content") or "")


def script_ok(req):
    if is_user_sim(req):
        return "Thank you, that is all. ###STOP###"
    if not any(m["role"] == "tool" for m in req["messages"]):
        return {"tool_calls": [{"name": "query_customer", "arguments": {"limit": 1}}]}
    return "I looked up your profile."


@pytest.mark.parametrize("domain", ["airline", "clinic"])
def test_replay_reaches_every_target_state(domain):
    fn = rollout.build({"n": 1, "agent_kind": "replay"}, Meter())
    for rec in tasks(domain):
        out = asyncio.run(fn(rec))
        t = out.trajectories[-1]
        gt = rec.task.ground_truth
        assert t.termination == "replay_done", (rec.id, t.error)
        assert [s.name for s in t.steps] == [a.name for a in gt.actions]
        if gt.target_state_ref:
            assert t.final_state_hash == gt.target_state_ref, rec.id


def test_llm_episode_runs_tools_and_records_hashes():
    rec = tasks()[0]
    with ScriptedServer(script_ok) as srv:
        out = asyncio.run(build(srv.base_url, n=2)(rec))
    assert [t.id for t in out.trajectories] == [f"{rec.id}-t0", f"{rec.id}-t1"]
    t = out.trajectories[0]
    assert t.termination == "user_stop"
    roles = [m.role for m in t.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert t.messages[1].content == rec.task.instruction  # --first-message auto
    assert t.steps[0].name == "query_customer" and t.steps[0].ok and t.steps[0].state_hash.startswith("sha256:")
    assert json.loads(t.messages[3].content)["rows"]  # a real query result from SQLite
    assert t.usage.requests == 3 and t.usage.prompt_tokens > 0
    assert out.provenance[-1].command == "rollout"


def test_simulated_first_message_and_stop_tokens():
    def script(req):
        if is_user_sim(req):
            said = sum(1 for m in req["messages"] if m["role"] == "assistant")
            return "I want to cancel my booking." if said == 0 else "###TRANSFER###"
        return "Sure, let me help."
    with ScriptedServer(script) as srv:
        out = asyncio.run(build(srv.base_url, first_message="simulate")(tasks()[0]))
    t = out.trajectories[0]
    assert t.messages[1].content == "Hi! How can I help you today?" and t.messages[1].role == "assistant"
    assert t.messages[2].content == "I want to cancel my booking."
    assert t.termination == "transfer"
    with ScriptedServer(lambda r: "###OUT-OF-SCOPE###" if is_user_sim(r) else "ok") as srv:
        assert asyncio.run(build(srv.base_url)(tasks()[0])).trajectories[0].termination == "out_of_scope"


def test_limits_max_turns_and_max_errors():
    always_tool = lambda r: "fine" if is_user_sim(r) else {"tool_calls": [{"name": "query_customer", "arguments": {}}]}
    with ScriptedServer(always_tool) as srv:
        t = asyncio.run(build(srv.base_url, max_turns=3)(tasks()[0])).trajectories[0]
    assert t.termination == "max_turns" and len(t.steps) == 3
    bad_tool = lambda r: "fine" if is_user_sim(r) else {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]}
    with ScriptedServer(bad_tool) as srv:
        t = asyncio.run(build(srv.base_url, max_tool_errors=2)(tasks()[0])).trajectories[0]
    assert t.termination == "max_errors" and all(s.error_code == "UNKNOWN_TOOL" for s in t.steps)


def test_crash_in_one_episode_does_not_take_down_the_batch(tmp_path):
    with ScriptedServer([{"status": 500}]) as srv:
        p = run_cmd([str(BIN / "rollout"), "--base-url", srv.base_url, "--max-retries", "0", "-n", "2"],
                    stdin=jsonl([r.dump() for r in tasks()[:3]]))
    assert p.returncode == 0, p.stderr
    outs = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(outs) == 3
    for o in outs:
        assert [t["termination"] for t in o["trajectories"]] == ["error", "error"]
        assert "500" in o["trajectories"][0]["error"]


def test_distractor_tools_come_from_other_domains():
    rec = tasks("airline")[0]
    with ScriptedServer(script_ok) as srv:
        t = asyncio.run(build(srv.base_url, distractor_tools=3)(rec)).trajectories[0]
    from toolkit.envs import load_env
    own = {x["function"]["name"] for x in load_env(rec.env).tools("agent")}
    offered = [x.function["name"] for x in t.tools]
    assert len(offered) == len(own) + 3 and len(set(offered) - own) == 3


class DualControlDouble(Environment):
    """Test double: a phone whose airplane mode only the USER can switch off (tau2-telecom shape)."""
    backend = "test-dual"

    def __init__(self, ref):
        self.state = {"phone": [{"airplane_mode": True}]}

    def tools(self, side="agent"):
        name = "check_status" if side == "agent" else "toggle_airplane_mode"
        return [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}]

    def reset(self, state=None):
        self.state = {"phone": [{"airplane_mode": True}]}

    def call(self, name, args, side="agent"):
        if name == "toggle_airplane_mode":
            self.state["phone"][0]["airplane_mode"] = not self.state["phone"][0]["airplane_mode"]
        return ToolResult.success(self.state["phone"][0])

    def snapshot(self):
        return json.loads(json.dumps(self.state))


register_backend("test-dual", DualControlDouble)


def test_user_side_tools_in_dual_control():
    def script(req):
        if is_user_sim(req):
            if not any(m["role"] == "tool" for m in req["messages"]):
                return {"tool_calls": [{"name": "toggle_airplane_mode", "arguments": {}}]}
            return "Done, it's off now. ###STOP###"
        return "Please switch off airplane mode."
    rec = Record.model_validate({"id": "dual-1", "env": {"backend": "test-dual"},
                                 "task": {"instruction": "My phone has no signal.",
                                          "user_scenario": {"instructions": "follow the agent's advice"}}})
    with ScriptedServer(script) as srv:
        t = asyncio.run(build(srv.base_url)(rec)).trajectories[0]
    assert t.termination == "user_stop"
    assert [(s.name, s.side) for s in t.steps] == [("toggle_airplane_mode", "user")]
    assert t.initial_state_hash != t.final_state_hash
    # the user's own call is in the transcript (name="user", tau2 convention) but not in the agent's view
    um = [m for m in t.messages if m.role == "assistant" and m.name == "user"]
    assert um and um[0].tool_calls[0].function.name == "toggle_airplane_mode"
    agent_reqs = [r for r in srv.requests if not is_user_sim(r)]
    assert all(m.get("name") != "user" for r in agent_reqs for m in r["messages"])


def test_resume_and_shard_work_for_rollout(tmp_path):
    out = tmp_path / "o.jsonl"
    inp = tmp_path / "i.jsonl"
    inp.write_text(jsonl([r.dump() for r in tasks()]))
    p = run_cmd([str(BIN / "rollout"), "--agent", "replay", "-i", str(inp), "-o", str(out), "--limit", "2"])
    assert p.returncode == 0
    p = run_cmd([str(BIN / "rollout"), "--agent", "replay", "-i", str(inp), "-o", str(out), "--resume"])
    ids = [json.loads(l)["id"] for l in out.read_text().splitlines()]
    assert sorted(ids) == sorted(r.id for r in tasks()) and len(ids) == len(set(ids))



@pytest.mark.embedded
@requires_embedded
def test_embedded_rollout_pipes_into_verify():
    import subprocess, os, sys
    from tests.conftest import ROOT
    env = dict(os.environ, PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    p = subprocess.run(f"{BIN}/toolkit tasks clinic | head -n 1 | {BIN}/rollout -n 2 --max-turns 1 --max-tokens 24 "
                       f"| {BIN}/verify --strategy state_diff", shell=True, capture_output=True, text=True,
                       env=env, timeout=900)
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout.splitlines()[0])
    assert len(rec["trajectories"]) == 2
    assert all(t["reward"] in (0.0, 1.0) for t in rec["trajectories"])
    assert all(t["agent_model"] == "embedded" or t["agent_model"] for t in rec["trajectories"])


def test_user_simulator_gets_the_scenario_parameters_knowledge_bounds_and_turn_budget():
    """EigenData App. 3.1 UserSimulatorAgent: the scenario's selected parameters (behavioral pattern,
    urgency, emotional state), "Knowledge Boundaries: I don't have that handy", and the inputs
    "Current Turn / Max Turns"; the user-model SFT rows (§5) carry the same system prompt."""
    from toolkit.train import export as X

    rec = tasks()[0]
    rec.task.user_scenario.extra.update(behavioral_pattern="impatient", urgency_level="critical",
                                        emotional_state="frustrated")
    text = episodes.scenario_text(rec)
    for line in ("Behaviour pattern: impatient", "Urgency: critical", "Emotional state: frustrated"):
        assert line in text
    seen = []

    def script(req):
        if is_user_sim(req):
            seen.append(req["messages"])
            return "Hurry, cancel it!" if len(seen) == 1 else "###STOP###"
        if not any(m["role"] == "tool" for m in req["messages"]):
            return {"tool_calls": [{"name": "query_customer", "arguments": {"limit": 1}}]}
        return "I found your profile."

    with ScriptedServer(script) as srv:
        out = asyncio.run(build(srv.base_url, first_message="simulate", max_turns=12)(rec))
    t = out.trajectories[0]
    system = seen[0][0]["content"]
    assert "Emotional state: frustrated" in system and "I don't have that handy" in system
    assert "cut after 12 agent turns" in system
    # the second simulator call sees the agent's reply after its tool call (turn 1) and text (turn 2)
    assert seen[1][-1] == {"role": "user", "content": "[agent turn 2 of 12] I found your profile."}
    assert seen[0][1]["content"] == episodes.GREETING  # the opening greeting is no agent turn
    assert t.extra["user_max_turns"] == 12
    row = X.record_rows(out, role="user", filter="all")[0]
    assert row["messages"][0]["content"] == system
    assert {"role": "user", "content": "[agent turn 2 of 12] I found your profile."} in row["messages"]


def test_constrained_agent_calls_recorded_and_only_the_agent_request_constrained():
    """agent_constrain_tool_calls: the agent's requests carry a grammar naming exactly the offered
    tools, the user simulator's do not, and the trajectory says decoding was constrained."""
    import re

    def script(req):
        if is_user_sim(req):
            return "Thank you, that is all. ###STOP###"
        if not any("<tool_response" in (m.get("content") or "") for m in req["messages"][1:]):
            return '<tool_call>\n{"name": "query_customer", "arguments": {"limit": 1}}\n</tool_call>'
        return "I looked up your profile."

    rec = tasks()[0]
    with ScriptedServer(script) as srv:
        out = asyncio.run(build(srv.base_url, tool_protocol="auto", agent_constrain_tool_calls="grammar")(rec))
        bodies = list(srv.requests)
    t = out.trajectories[0]
    assert t.termination == "user_stop" and t.steps[0].name == "query_customer" and t.steps[0].ok
    assert t.extra["constrained_tool_calls"] == "grammar"
    agent = [b for b in bodies if not is_user_sim(b)]
    assert agent and all("grammar" in b for b in agent)
    assert not any("grammar" in b for b in bodies if is_user_sim(b))
    offered = {tl.function["name"] for tl in t.tools}
    names = set(re.findall(r'^tc-json-\d+-name ::= "\\"([^"\\]+)\\""', agent[0]["grammar"], re.MULTILINE))
    assert names == offered and "query_customer" in names
