"""The Simia recipe end to end (subprocess per step) against a scripted LLM: seeds from the bundled
airline domain, two simulated trajectories (one faithful to the real database, one not), the yield table."""

import json

from click.testing import CliRunner

from toolkit.envs import load_env
from toolkit.flows.simia import recipe
from toolkit.llm.testserver import ScriptedServer

GRADE = json.dumps({"completeness": "PASS", "logic": "PASS", "format": "PASS", "reason": "fine"})


def synth(obs):
    return ("HUMAN: What is the status of reservation 1003?\nFUNCTION_CALL:\n"
            '{"name": "query_reservation", "arguments": {"reservation_id": 1003}}\n'
            f"OBSERVATION: {obs}\nASSISTANT: It is confirmed.\n")


def test_recipe_prints_the_yield_table(tmp_path):
    env = load_env({"backend": "sqlite", "id": "airline"})
    env.reset()
    real = env.call("query_reservation", {"reservation_id": 1003}).to_content()
    env.close()

    def reply(req):
        p = req["messages"][-1]["content"]
        if "You are curating seed trajectories" in p:
            return GRADE
        assert "generates multi-turn conversation data" in p
        if req["temperature"] < 0.8:  # pass 0: faithful; pass 1: made up; pass 2: an unknown tool
            return synth(real)
        if req["temperature"] < 0.9:
            return synth('{"count": 1, "rows": [{"status": "made up"}]}')
        return synth(real).replace("query_reservation", "teleport")

    with ScriptedServer(reply) as srv:
        r = CliRunner().invoke(recipe.main, ["-n", "3", "--limit", "1", "--out-dir", str(tmp_path),
                                             "--base-url", srv.base_url, "--model", "scripted"])
    assert r.exit_code == 0, (r.output, r.exception)
    table = {r["stage"]: r for r in json.loads((tmp_path / "yield.json").read_text())}
    assert list(table) == ["seeds (replay)", "validate-task", "simulate-env", "repair", "verify", "total"]
    assert table["validate-task"]["in"] == 1 and table["validate-task"]["notes"]["kept (pre-filter passed)"] == 1
    assert table["simulate-env"]["notes"]["trajectories"] == 3
    rules = table["repair"]["notes"]
    assert rules["trajectories kept"] == 2 and rules["dropped: unknown_tool"] == 1
    ground = table["verify"]["notes"]
    assert ground["trajectories grounded"] == 2
    assert ground["mean share (per trajectory)"] == 0.5
    assert ground["fully grounded (share 1.0)"] == 1
    assert table["verify"]["pass"] == 0.5  # the grounding verdicts: one of the two trajectories is grounded
    assert "dropped: unknown_tool: 1" in r.output and "mean share" in r.output
