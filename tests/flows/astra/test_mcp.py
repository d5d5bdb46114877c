"""ASTRA pipeline A on a live MCP server: `toolkit tools import mcp:git` → gen-plan astra → gen-task
astra → rollout (real calls on mcp-server-git over a template repository) → verify state_diff (the
chain's literal arguments are the reference actions, replayed against a fresh server)."""

import json

import pytest
from click.testing import CliRunner

from tests.envs.mcp.test_env import (  # noqa: F401
    FULL,
    _servers_with_marker,
    marker,
    repo,
    servers_file,
)
from toolkit import cli
from toolkit.llm.testserver import ScriptedServer

pytest.importorskip("mcp_server_git")


def _invoke(cmd, args, stdin, srv=None, recipe=None):
    extra = ["--base-url", srv.base_url, "--model", "scripted"] if srv else []
    if recipe:
        extra += ["--recipe", str(recipe)]
    r = CliRunner().invoke(cmd, [*args, *extra], input=stdin)
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def test_git_chain_rolls_out_on_the_live_server_and_verifies_by_state(tmp_path, repo, servers_file, marker,  # noqa: F811
                                                                      monkeypatch):
    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers_file))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("gen-plan:\n  chain_pairs: 1\n  walks: 6\n  walk_min_len: 3\n  walk_max_len: 3\n"
                      "gen-task:\n  augment: []\n")
    chain = [n for n, _ in FULL]
    pair = {"task": "Look at the repository, stage b.txt and commit it.", "chain": chain}
    query = {"valid": True, "query": "In the repository at '.', check the status, stage the file b.txt and "
                                     "commit it with the message 'add b'.",
             "arguments": [{"tool": n, "args": a} for n, a in FULL]}

    def reply(req):
        msgs = req["messages"]
        text = msgs[-1]["content"] or ""
        if req.get("tools"):
            k = sum(1 for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
            if k < len(FULL):
                name, args = FULL[k]
                return {"tool_calls": [{"name": name, "arguments": args}]}
            return "Committed."
        if "Jointly synthesize" in text:
            return json.dumps({"pairs": [pair]})
        if "<ToolInvocationChain>" in text:
            got = json.loads(text.rsplit("<ToolInvocationChain>", 1)[1].split("</ToolInvocationChain>")[0])
            return json.dumps(query if got == chain else {"valid": False, "query": "", "arguments": []})
        raise AssertionError("unscripted prompt (the emulator must not be asked): " + text[:200])

    server = _invoke(cli.toolkit_group, ["tools", "import", "mcp:git", "--workdir", str(repo)], "")
    assert json.loads(server)["env"]["backend"] == "mcp"
    with ScriptedServer(reply) as srv:
        plans = _invoke(cli.gen_plan, ["--strategy", "astra", "-n", "1", "--seed", "3"], server, srv, recipe)
        tasks = _invoke(cli.gen_task, ["--strategy", "astra"], plans, srv, recipe)
        rolled = _invoke(cli.rollout, ["--max-turns", "6"], tasks, srv)
    t = json.loads(tasks.splitlines()[0])
    assert t["env"]["backend"] == "mcp" and t["env"]["config"]["workdir"] == str(repo.resolve())
    assert [a["name"] for a in t["task"]["ground_truth"]["actions"]] == chain
    verified = _invoke(cli.verify, ["--strategy", "state_diff"], rolled)
    rec = json.loads(verified.splitlines()[0])
    traj = rec["trajectories"][0]
    assert [s["name"] for s in traj["steps"]] == chain and all(s["ok"] for s in traj["steps"])
    assert traj["reward"] == 1.0
    assert _servers_with_marker(marker) == []
