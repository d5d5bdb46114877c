"""make-verifier --strategy astra --out-dir / recipe key out_dir: generated QA environments written in the
python backend's directory layout (env.path), and `rollout --agent replay | verify --strategy f1` from it."""

import json

import pytest
from click.testing import CliRunner
from tests.flows.astra.test_qa import scripted, validated_record

from toolkit import cli
from toolkit.envs import load_env
from toolkit.llm.testserver import ScriptedServer


def _make(args):
    reply, _ = scripted()
    with ScriptedServer(reply) as srv:
        r = CliRunner().invoke(cli.make_verifier, ["--strategy", "astra", *args, "--base-url", srv.base_url,
                                                   "--model", "scripted"], input=json.dumps(validated_record()) + "\n")
    assert r.exit_code == 0, (r.output, r.exception)
    (rec,) = [json.loads(x) for x in r.stdout.splitlines()]
    return rec


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    d = tmp_path_factory.mktemp("envs")
    return _make([]), _make(["--out-dir", str(d)]), d


def test_directory_layout(both):
    inline, rec, d = both
    env = rec["env"]
    assert env["backend"] == "python" and env["id"] == inline["env"]["id"] == "astra-qa-qa1"
    assert env["path"] == str(d / "astra-qa-qa1") and not env.get("config")
    p = d / "astra-qa-qa1"
    assert sorted(x.name for x in p.iterdir()) == ["config.json", "policy.md", "state.json", "tools.json", "tools.py"]
    cfg = inline["env"]["config"]
    assert json.loads((p / "tools.json").read_text()) == cfg["tools"]
    assert (p / "tools.py").read_text() == cfg["source"]
    assert (p / "policy.md").read_text() == cfg["policy"]
    assert json.loads((p / "config.json").read_text()) == {"limits": cfg["limits"]}
    assert json.loads((p / "state.json").read_text()) == {}
    # the rest of the record (ground truth, verifier, verdicts) is the same in both forms
    assert rec["task"] == inline["task"] and rec["verifier"] == inline["verifier"]


def test_directory_env_loads_and_answers_like_the_inline_one(both):
    inline, rec, _ = both
    a, b = load_env(inline["env"]), load_env(rec["env"])
    try:
        a.reset()
        b.reset()
        assert b.tools() == a.tools() and len(b.tools()) == 1  # the two lookups were merged into one tool
        for act in rec["task"]["ground_truth"]["actions"]:
            name, args = act["name"], act["arguments"]
            assert b.call(name, args).to_content() == a.call(name, args).to_content()
        assert "14" in b.call(rec["task"]["ground_truth"]["actions"][1]["name"], {"city": "Berlin"}).to_content()
    finally:
        a.close()
        b.close()


def test_replay_and_f1_from_the_directory_form(both, tmp_path):
    _, rec, _ = both
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay"], input=json.dumps(rec) + "\n")
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.verify, ["--strategy", "f1"], input=r.stdout)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    (f1,) = [v for v in out["verdicts"] if v["name"] == "f1"]
    assert f1["passed"] and f1["score"] == pytest.approx(1.0)
    tool_msgs = [m for m in out["trajectories"][0]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 2 and '"temperature_c": 18' in tool_msgs[0]["content"]


def test_recipe_key_and_missing_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("make-verifier:\n  out_dir: envs\n")
    rec = _make(["--recipe", str(recipe)])
    assert rec["env"]["path"] == "envs/astra-qa-qa1" and (tmp_path / "envs/astra-qa-qa1/tools.py").is_file()
    # a moved/deleted directory is a clear reject naming env.path, not a crash
    (tmp_path / "envs/astra-qa-qa1/tools.py").unlink()
    (tmp_path / "envs/astra-qa-qa1/tools.json").unlink()
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay"], input=json.dumps(rec) + "\n")
    assert r.exit_code == 1 and "env.path" in r.stderr
