"""The Simia recipe end to end (subprocess per step) against a scripted LLM: seeds from the bundled
airline domain, two simulated trajectories (one faithful to the real database, one not), the yield table."""

import json

from click.testing import CliRunner

from toolkit.envs import load_env
from toolkit.flows.simia import recipe
from toolkit.flows.simia.yieldtable import render
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
    rows = {(a, b): c for a, b, c in (tuple(x.values()) for x in json.loads((tmp_path / "yield.json").read_text()))}
    assert rows[("seeds", "read")] == 1 and rows[("seeds", "kept (pre-filter passed)")] == 1
    assert rows[("simulate", "trajectories generated")] == 3
    assert rows[("rules", "trajectories kept")] == 2 and rows[("rules", "dropped: unknown_tool")] == 1
    assert rows[("grounding", "trajectories grounded")] == 2
    assert rows[("grounding", "mean share (per trajectory)")] == 0.5
    assert rows[("grounding", "fully grounded (share 1.0)")] == 1
    assert "dropped: unknown_tool" in r.output and "mean share" in r.output


def test_render_aligns():
    assert render([("a", "bb", 1), ("ccc", "d", 22)]).splitlines() == [
        "step  item  count", "----  ----  -----", "a     bb    1", "ccc   d     22"]
