"""ASTRA A3: gen-task --strategy astra (chain-conditioned + server-only tasks, augmentations)."""

import json
from pathlib import Path

from click.testing import CliRunner

from toolkit import cli
from toolkit.flows.astra.tasks import same_language, script_of
from toolkit.llm.testserver import ScriptedServer

DATA = Path(__file__).resolve().parents[2] / "data" / "astra"

PLAN = {"id": "server-notes-chain0", "parent_id": "server-notes", "flow": "astra",
        "env": {"backend": "simulated", "config": {"tools": []}},
        "plan": {"tool_chain": ["search_notes", "tag_note"], "synthesis_plan": "Find my Groceries note and tag it urgent.",
                 "extra": {"query": "Find my Groceries note and tag it urgent."}}}


def test_script_detection():
    assert script_of("Find my note") == "LATIN"
    assert script_of("帮我查一下北京的天气") == "CJK"
    assert script_of("Покажи заметки") == "CYRILLIC"
    assert same_language("Tag note N-7 urgent", "Please tag the note N-7 as urgent, thanks!")
    assert not same_language("Tag note N-7 urgent", "请把笔记 N-7 标记为紧急")


def reply_for(axis_replies):
    seen = []

    def reply(req):
        text = req["messages"][-1]["content"]
        if "Axis: " not in text:  # server-only tasks
            seen.append("server")
            return json.dumps({"tasks": ["Create a note titled Trip with body 'pack socks'.",
                                         "Search my notes for 'invoice'."]})
        axis = text.split("Axis: ")[1].split(" ")[0]
        seen.append(axis)
        rs = axis_replies[axis]
        return rs.pop(0) if len(rs) > 1 else rs[0]

    return reply, seen


def test_chain_conditioned_with_augmentations():
    replies = {"diversity": [json.dumps({"task": "Could you find the note called Groceries and mark it urgent?"})],
               "complexity": ['{"task": ', json.dumps({"task": "Find my Groceries note, tag it urgent, and if it "
                                                                "mentions milk also tag it dairy."})],
               "persona": [json.dumps({"task": "请找到 Groceries 笔记并标记为紧急"})]}  # language changed
    reply, seen = reply_for(replies)
    with ScriptedServer(reply) as srv:
        r = CliRunner().invoke(cli.gen_task, ["--strategy", "astra", "--base-url", srv.base_url, "--model", "m"],
                               input=json.dumps(PLAN) + "\n")
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(o["id"], o["parent_id"], o["task"]["extra"]["augmentation"]) for o in out] == [
        ("server-notes-chain0-t0", "server-notes-chain0", "none"),
        ("server-notes-chain0-t0-diversity", "server-notes-chain0-t0", "diversity"),
        ("server-notes-chain0-t0-complexity", "server-notes-chain0-t0", "complexity")]
    assert out[0]["task"]["instruction"] == "Find my Groceries note and tag it urgent."
    assert all(o["task"]["ground_truth"]["must_have_functions"] == ["search_notes", "tag_note"] for o in out)
    assert all(o["plan"]["tool_chain"] == ["search_notes", "tag_note"] for o in out)
    assert "persona augmentation dropped: language changed (CJK vs LATIN)" in r.stderr
    assert seen.count("complexity") == 2  # the truncated reply was retried


def test_server_only_tasks_and_axis_choice(tmp_path):
    server = CliRunner().invoke(cli.toolkit_group, ["tools", "import", str(DATA / "notes.mcp.json")]).stdout
    recipe = tmp_path / "r.yaml"
    recipe.write_text("gen-task:\n  augment: [persona]\n")
    reply, seen = reply_for({"persona": [json.dumps({"task": "hey, make a note Trip w/ 'pack socks' pls"})]})
    with ScriptedServer(reply) as srv:
        r = CliRunner().invoke(cli.gen_task, ["--strategy", "astra", "-n", "2", "--recipe", str(recipe),
                                              "--base-url", srv.base_url, "--model", "m"], input=server)
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["id"] for o in out] == ["server-notes-t0", "server-notes-t0-persona", "server-notes-t1",
                                      "server-notes-t1-persona"]
    assert out[0]["task"]["extra"]["origin"] == "server" and out[0]["task"]["ground_truth"] is None
    assert seen == ["server", "persona", "persona"]
