"""simulate-env --mode trajectory: one LLM call per simulated trajectory, -n passes with a temperature spread."""

import json

import pytest
from click.testing import CliRunner
from tests.flows.simia.fixtures import GOOD, POLICY, SEED, SHAREGPT, SYSTEM_TURN, UNESCAPED_QUOTES

from toolkit import cli
from toolkit.flows.simia.simulate import temperatures
from toolkit.options import SimulateEnvOptions
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record


def run(replies, *args, records=(SEED,)):
    with ScriptedServer(replies) as srv:
        r = CliRunner().invoke(cli.simulate_env, ["--mode", "trajectory", "--base-url", srv.base_url,
                                                  "--model", "scripted", *args],
                               input="".join(json.dumps(x) + "\n" for x in records))
        return r, list(srv.requests)


def test_n_passes_one_call_each_with_ids_parent_and_spread():
    by_temp = {0.7: GOOD, 0.85: SHAREGPT, 1.0: SYSTEM_TURN}  # passes run concurrently: key on the pass
    r, reqs = run(lambda req: by_temp[req["temperature"]], "-n", "3", "--temperature", "1.0")
    assert r.exit_code == 0, r.output
    recs = [Record.model_validate(json.loads(x)) for x in r.stdout.splitlines()]
    assert [x.id for x in recs] == ["seed-1-sim0", "seed-1-sim1", "seed-1-sim2"]
    assert all(x.parent_id == "seed-1" and x.flow == "simia" and "simulated" in x.tags for x in recs)
    assert len(reqs) == 3  # one call per trajectory
    assert sorted(q["temperature"] for q in reqs) == [0.7, 0.85, 1.0]
    t = recs[0].trajectories[0]
    assert t.id == "seed-1-sim0-t0" and t.termination == "simulated" and t.error is None
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert t.messages[0].content == POLICY  # the seed's system prompt, kept separately
    assert t.messages[2].tool_calls[0].function.name == "get_reservation"
    assert t.messages[3].tool_call_id == t.messages[2].tool_calls[0].id
    assert {x.function["name"] for x in t.tools} == {"get_reservation", "cancel_reservation"}
    assert t.extra["simia"]["raw"] == GOOD and t.extra["simia"]["prompt"] == "simia/synth_apigen.v1"
    assert recs[0].task.instruction.startswith("Hi, can you cancel reservation R9")
    # the JSON (ShareGPT) variant parses too
    assert [m.role for m in recs[1].trajectories[0].messages] == ["system", "user", "assistant", "tool", "assistant"]
    # the SYSTEM turn is kept by the strict parse (the rules drop it)
    assert [m.role for m in recs[2].trajectories[0].messages][:2] == ["system", "system"]


def test_prompt_has_tools_policy_format_and_exactly_one_exemplar():
    r, reqs = run([GOOD], "-n", "2")
    assert r.exit_code == 0
    prompts = [q["messages"][-1]["content"] for q in reqs]
    assert prompts[0] == prompts[1]
    p = prompts[0]
    assert p.count("HUMAN: Please cancel reservation R1, my plans changed.") == 1  # the one seed
    assert p.count('"name": "cancel_reservation"') >= 2  # tool list + exemplar call
    assert POLICY in p and "Do NOT generate any SYSTEM messages" in p and "FUNCTION_CALL:" in p
    assert {q.get("temperature") for q in reqs} == {0.7, 1.0}  # default top 1.0, spread 0.3


def test_officebench_family_and_explicit_temperatures(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("simulate-env:\n  prompt_family: officebench\n  temperatures: [0.2, 0.9]\n")
    r, reqs = run([GOOD], "-n", "3", "--recipe", str(recipe))
    assert r.exit_code == 0, r.output
    assert [q["temperature"] for q in reqs] == [0.2, 0.9, 0.2] or sorted(q["temperature"] for q in reqs) == [0.2, 0.2, 0.9]
    p = reqs[0]["messages"][-1]["content"]
    assert "expands the task to use multiple apps" in p and "GPT: Reservation R1 is cancelled." in p
    assert json.loads(r.stdout.splitlines()[0])["trajectories"][0]["extra"]["simia"]["prompt"] == \
        "simia/synth_officebench.v1"


def test_malformed_reply_keeps_raw_and_names_the_problem():
    r, _ = run([UNESCAPED_QUOTES])
    t = json.loads(r.stdout.splitlines()[0])["trajectories"][0]
    assert t["messages"] == [] and "unparseable_call" in t["error"] and "repair --strategy rules" in t["error"]
    assert t["extra"]["simia"]["raw"] == UNESCAPED_QUOTES


def test_seed_without_tools_or_broken_is_rejected(tmp_path):
    rej = tmp_path / "rej.jsonl"
    no_tools = json.loads(json.dumps(SEED))
    no_tools["id"] = "no-tools"
    no_tools["trajectories"][0]["tools"] = []
    r, reqs = run([GOOD], "--rejects", str(rej), records=(no_tools,))
    assert r.exit_code == 1 and reqs == []
    assert "lists no tools" in json.loads(rej.read_text())["error"]


def test_call_mode_is_still_the_default():
    r = CliRunner().invoke(cli.simulate_env, ["--help"])
    assert "--mode [call|trajectory]" in r.output and "default: call" in r.output


@pytest.mark.parametrize("cfg,n,want", [({}, 1, [1.0]), ({"temperature": 0.5}, 2, [0.2, 0.5]),
                                        ({"temperature_spread": 0}, 3, [1.0, 1.0, 1.0]),
                                        ({"temperatures": "0.1,0.3"}, 3, [0.1, 0.3, 0.1])])
def test_temperature_spread(cfg, n, want):
    assert temperatures(SimulateEnvOptions.typed(cfg), n) == want


def test_a_failed_pass_keeps_the_others(tmp_path):
    def reply(req):
        return {"status": 500} if req["temperature"] < 0.8 else GOOD
    rej = tmp_path / "rej.jsonl"
    r, _ = run(reply, "-n", "2", "--max-retries", "0", "--rejects", str(rej))
    recs = {json.loads(x)["id"]: json.loads(x) for x in r.stdout.splitlines()}
    t0 = recs["seed-1-sim0"]["trajectories"][0]
    assert t0["termination"] == "error" and t0["extra"]["simia"]["llm_error"] and "LLM error" in t0["error"]
    assert recs["seed-1-sim1"]["trajectories"][0]["error"] is None
    r2 = CliRunner().invoke(cli.repair, ["--strategy", "rules", "--rejects", str(rej)], input=r.stdout)
    assert [json.loads(x)["id"] for x in r2.stdout.splitlines()] == ["seed-1-sim1"]
    assert json.loads(rej.read_text().splitlines()[-1])["error"].startswith("llm_error:")
    r, _ = run(lambda req: {"status": 500}, "-n", "2", "--max-retries", "0", "--rejects", str(tmp_path / "r2.jsonl"))
    assert r.exit_code == 1 and "every simulation pass failed" in (tmp_path / "r2.jsonl").read_text()


def test_reply_cut_at_max_tokens_warns_and_repair_labels_it_truncated():
    # a whole trajectory cut mid-way: the text ends on a call with no observation (it would have
    # been dropped as unanswered/unfinished, hiding that max_tokens was the cause)
    cut = GOOD[: GOOD.index("OBSERVATION")]
    r, _reqs = run([{"content": cut, "finish_reason": "length"}])
    assert r.exit_code == 0, r.output
    assert "warning: simulated trajectories cut at max_tokens" in r.stderr
    assert "warnings 1" in r.stderr  # counted in the summary line
    rec = json.loads(r.stdout.splitlines()[0])
    assert rec["trajectories"][0]["extra"]["simia"]["finish_reason"] == "length"
    out = CliRunner().invoke(cli.repair, ["--strategy", "rules"], input=json.dumps(rec) + "\n")
    assert "truncated" in out.stderr, out.stderr
    assert "unfinished" not in out.stderr and "unanswered" not in out.stderr


def test_simia_recipe_budget_holds_a_whole_trajectory():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[3] / "recipes" / "simia.yaml"
    r = CliRunner().invoke(cli.simulate_env, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 0, r.output
    import yaml

    assert yaml.safe_load(r.stdout)["max_tokens"] >= 2048
