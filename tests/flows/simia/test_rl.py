"""Simia-RL: gen-task --strategy simia → rollout on env.backend=simulated (tool feedback + simulated
human + [TERMINATE]) → verify --strategy judge --judge-rubric simia (0/1 reward)."""

import asyncio
import json

from click.testing import CliRunner
from tests.flows.simia.fixtures import POLICY, SEED

from toolkit import cli
from toolkit.llm import Meter
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.judge import parse
from toolkit.schema import Record
from toolkit.stages import rollout


def rl_task():
    r = CliRunner().invoke(cli.gen_task, ["--strategy", "simia"], input=json.dumps(SEED) + "\n")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_gen_task_makes_a_simulated_env_task():
    t = rl_task()
    assert t["id"] == "seed-1-rl" and t["parent_id"] == "seed-1" and t["env"]["backend"] == "simulated"
    c = t["env"]["config"]
    assert c["human"] is True and c["policy"] == POLICY and c["reference_trajectory_id"] == "seed-1-t0"
    assert [x["function"]["name"] for x in c["tools"]] == ["get_reservation", "cancel_reservation"]
    assert c["reference"].startswith("HUMAN: Please cancel reservation R1") and "OBSERVATION:" in c["reference"]
    assert t["task"]["instruction"] == "Please cancel reservation R1, my plans changed."


def script(req):
    sys_prompt = req["messages"][0].get("content") or ""
    last = req["messages"][-1].get("content") or ""
    if sys_prompt.startswith("You simulate tool execution"):  # environment feedback (tool output or error)
        assert "Reference conversation examples" in last and '"name": "get_reservation"' in last
        return json.dumps({"success": True, "observation": {"reservation_id": "R1", "status": "confirmed"}})
    if "simulate the human's next message" in sys_prompt:  # the simulated human (Fig 13)
        assert "HUMAN: Please cancel reservation R1" in sys_prompt  # the reference conversation
        return "[TERMINATE]"
    if not any(m["role"] == "tool" for m in req["messages"]):  # the agent under training
        return {"tool_calls": [{"name": "get_reservation", "arguments": {"reservation_id": "R1"}}]}
    return "Your reservation R1 is confirmed; shall I cancel it?"


def test_rollout_against_the_simulator_ends_on_terminate():
    task = Record.model_validate(rl_task())
    with ScriptedServer(script) as srv:
        fn = rollout.build({"n": 1, "agent_kind": "llm", "max_turns": 6, "base_url": srv.base_url,
                            "model": "scripted", "tool_protocol": "native", "max_retries": 0}, Meter())
        out = asyncio.run(fn(task))
    t = out.trajectories[0]
    assert t.termination == "user_stop", t.error
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert json.loads(t.messages[3].content) == {"reservation_id": "R1", "status": "confirmed"}
    assert t.steps[0].name == "get_reservation" and t.steps[0].ok
    assert t.messages[-1].content == "[TERMINATE]"


def test_unknown_tool_is_refused_without_a_simulator_call():
    task = Record.model_validate(rl_task())

    def agent_unknown(req):
        sys_prompt = req["messages"][0].get("content") or ""
        if sys_prompt.startswith("You simulate tool execution"):
            raise AssertionError("the simulator must not be asked about an unknown tool")
        if "simulate the human's next message" in sys_prompt:
            return "[TERMINATE]"
        if not any(m["role"] == "tool" for m in req["messages"]):
            return {"tool_calls": [{"name": "delete_database", "arguments": {}}]}
        return "Sorry."
    with ScriptedServer(agent_unknown) as srv:
        fn = rollout.build({"n": 1, "agent_kind": "llm", "max_turns": 6, "base_url": srv.base_url,
                            "model": "scripted", "tool_protocol": "native", "max_retries": 0}, Meter())
        t = asyncio.run(fn(task)).trajectories[0]
    assert not t.steps[0].ok and "error" in json.loads(t.messages[3].content)


def test_judge_simia_reward_0_1_and_fig14_format():
    """The reward is the judge's verdict on THIS trajectory: the scripted judge reads the conversation
    verify sends and rewards asking for confirmation before cancelling (the policy), in each of the
    three reply formats; the same record with the agent cancelling unasked gets 0."""
    task = Record.model_validate(rl_task())
    with ScriptedServer(script) as srv:
        fn = rollout.build({"n": 1, "agent_kind": "llm", "max_turns": 6, "base_url": srv.base_url,
                            "model": "scripted", "tool_protocol": "native", "max_retries": 0}, Meter())
        rec = asyncio.run(fn(task))
    asked = json.dumps(rec.dump()) + "\n"
    unasked = rec.model_copy(deep=True)
    unasked.trajectories[0].messages[4].content = "Done: I cancelled reservation R1 for you."
    unasked = json.dumps(unasked.dump()) + "\n"

    def judge(fmt):
        def reply(req):
            text = req["messages"][-1]["content"]
            assert POLICY[:40] in text and '"status": "confirmed"' in text  # policy + the real tool output
            ok = "shall I cancel it?" in text and "I cancelled reservation R1" not in text
            if fmt == "fig14":
                return json.dumps({"reasoning": "checked the confirmation", "reward": int(ok)})
            return json.dumps({"reasoning": "x", "evidence": "y", "task_success": ok, "confidence": 0.8})
        return reply

    for fmt in ("fig14", "appendix_d"):
        for line, reward in ((asked, 1.0), (unasked, 0.0)):
            with ScriptedServer(judge(fmt)) as srv:
                r = CliRunner().invoke(cli.verify, ["--strategy", "judge", "--judge-rubric", "simia",
                                                    "--base-url", srv.base_url, "--model", "judge"], input=line)
                assert srv.chat_count == 1
            assert r.exit_code in (0, 1), r.output
            out = json.loads(r.stdout)
            assert out["trajectories"][0]["reward"] == reward, (fmt, r.output)
            (v,) = [x for x in out["verdicts"] if x["name"] == "judge"]
            assert v["passed"] is (reward == 1.0) and v["kind"] == "llm"


def test_fig14_reward_parser_is_strict():
    assert parse("simia", '{"reasoning": "ok", "reward": 1}').score == 1.0
    for bad in ('{"reasoning": "ok", "reward": 2}', '{"reasoning": "ok", "reward": "1"}',
                '{"reasoning": "ok", "reward": true}', '{"reasoning": "ok"}'):
        try:
            parse("simia", bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")


def _split_servers():
    """(agent+user server, simulator server): the simulator's prompts must reach only the second."""
    def main(req):
        sys_prompt = req["messages"][0].get("content") or ""
        assert not sys_prompt.startswith("You simulate tool execution"), "tool feedback went to the user endpoint"
        return script(req)

    def simulator(req):
        sys_prompt = req["messages"][0].get("content") or ""
        assert sys_prompt.startswith("You simulate tool execution"), sys_prompt[:80]
        return script(req)
    return ScriptedServer(main), ScriptedServer(simulator)


def test_rollout_uses_the_simulator_endpoint_given_to_gen_task():
    with _split_servers()[0] as main, _split_servers()[1] as sim:
        r = CliRunner().invoke(cli.gen_task, ["--strategy", "simia", "--recipe", "/dev/null"],
                               input=json.dumps(SEED) + "\n",
                               env={"TOOLKIT_SIMULATOR_BASE_URL": sim.base_url, "TOOLKIT_SIMULATOR_MODEL": "simm"})
        assert r.exit_code == 0, r.output
        task = Record.model_validate(json.loads(r.stdout))
        assert task.env.config["base_url"] == sim.base_url
        fn = rollout.build({"n": 1, "agent_kind": "llm", "max_turns": 6, "base_url": main.base_url,
                            "model": "scripted", "tool_protocol": "native", "max_retries": 0}, Meter())
        t = asyncio.run(fn(task)).trajectories[0]
        assert t.termination == "user_stop", t.error
        assert sim.chat_count == 1 and sim.requests[0]["model"] == "simm"
        assert main.chat_count == 3  # agent call, agent reply, simulated human


def test_rollout_env_role_options_override_the_records_simulator():
    task = Record.model_validate(rl_task())
    with _split_servers()[0] as main, _split_servers()[1] as sim:
        fn = rollout.build({"n": 1, "agent_kind": "llm", "max_turns": 6, "base_url": main.base_url,
                            "model": "scripted", "tool_protocol": "native", "max_retries": 0,
                            "env_base_url": sim.base_url, "env_model": "envm"}, Meter())
        t = asyncio.run(fn(task)).trajectories[0]
        assert t.termination == "user_stop", t.error
        assert sim.chat_count == 1 and sim.requests[0]["model"] == "envm"


def test_rollout_cli_has_env_role_options():
    r = CliRunner().invoke(cli.rollout, ["--help"])
    assert "--env-base-url" in r.output and "--env-model" in r.output
