"""Commands driven as users drive them: real subprocess pipelines (bin/ shims) and click's CliRunner."""
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib

import pytest
from click.testing import CliRunner

from tests.conftest import requires_embedded, BIN, ROOT, jsonl, make_record, run_cmd
from toolkit.cli import COMMANDS, simulate_env
from toolkit.llm.testserver import ScriptedServer

ALL = ["gen-plan", "gen-task", "validate-task", "rollout", "verify", "repair", "reflect", "simulate-env",
       "make-verifier", "sft", "grpo", "eval-tau2"]


def pending_record(i: int) -> dict:
    r = make_record(i)
    r["trajectories"][0]["messages"] = r["trajectories"][0]["messages"][:3]  # ends with the tool call
    r["env"] = {"backend": "simulated", "config": {"policy": "Airline policy.", "tools": [
        {"type": "function", "function": {"name": "update_reservations", "parameters": {
            "type": "object", "properties": {"reservation_id": {"type": "string"}, "cabin": {"type": "string"}},
            "required": ["reservation_id"]}}}]}}
    return r


SIM_OK = json.dumps({"success": True, "observation": {"reservation_id": "R1", "cabin": "economy"}})


def test_all_twelve_commands_have_help():
    assert sorted(COMMANDS) == sorted(ALL)
    for name in ALL:
        p = run_cmd([str(BIN / name), "--help"])
        assert p.returncode == 0, (name, p.stderr)
        assert "Reads" in p.stdout and "Example" in p.stdout, name
    p = run_cmd([str(BIN / "toolkit"), "--help"])
    assert p.returncode == 0 and "doctor" in p.stdout


def test_unknown_strategy_is_a_usage_error_naming_the_registered_ones():
    p = run_cmd([str(BIN / "gen-task"), "--strategy", "no-such-flow"], stdin="")
    assert p.returncode == 2 and "no-such-flow" in p.stderr


def test_usage_error_exit_2():
    p = run_cmd([str(BIN / "simulate-env"), "--shard", "5/4"], stdin="")
    assert p.returncode == 2 and "shard" in p.stderr
    p = run_cmd([str(BIN / "simulate-env"), "--no-such-flag"])
    assert p.returncode == 2


def test_simulate_env_answers_pending_call_via_http_server():
    with ScriptedServer([SIM_OK]) as srv:
        p = run_cmd([str(BIN / "simulate-env"), "--base-url", srv.base_url, "--model", "m"],
                    stdin=jsonl([pending_record(1)]))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    last = out["trajectories"][0]["messages"][-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "call_1"
    assert json.loads(last["content"]) == {"cabin": "economy", "reservation_id": "R1"}
    assert out["trajectories"][0]["steps"][-1]["ok"] is True
    assert out["provenance"][-1]["command"] == "simulate-env"
    # stdout is JSONL only; the summary is on stderr
    assert all(json.loads(l) for l in p.stdout.splitlines())
    assert "simulate-env: read 1, written 1, rejected 0" in p.stderr


def test_bad_line_rejected_good_line_flows(tmp_path):
    rej = tmp_path / "r.jsonl"
    with ScriptedServer([SIM_OK]) as srv:
        p = run_cmd([str(BIN / "simulate-env"), "--base-url", srv.base_url, "--rejects", str(rej)],
                    stdin="{bad\n" + json.dumps(pending_record(2)) + "\n")
    assert p.returncode == 1
    assert [json.loads(l)["id"] for l in p.stdout.splitlines()] == ["rec-0000002"]
    rows = [json.loads(l) for l in rej.read_text().splitlines()]
    assert rows[0]["line"] == 1 and rows[0]["raw"] == "{bad"
    assert "line 1" in p.stderr


def _whole_lines(path) -> list[bytes]:
    """The complete lines of a (maybe torn) .jsonl or .jsonl.gz as a reader sees them now."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = zlib.decompressobj(31).decompress(data)  # as far as it goes (a torn member has no end)
    return data.split(b"\n")[:-1]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_sigkill_then_resume_gives_each_id_once(tmp_path, suffix):
    n = 200
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl([pending_record(i) for i in range(n)]))
    out = tmp_path / f"out{suffix}"
    env = dict(os.environ, PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    with ScriptedServer([SIM_OK], delay=0.02) as srv:
        args = [str(BIN / "simulate-env"), "--base-url", srv.base_url, "-i", str(inp), "-o", str(out),
                "--concurrency", "2"]
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while time.time() < deadline:  # kill once some (not all) lines are written
            if out.exists() and len(_whole_lines(out)) >= 6:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        partial = len(_whole_lines(out))
        assert 0 < partial < n
        if suffix.endswith(".gz"):  # the kill left a gzip member without its end
            with pytest.raises(EOFError):
                gzip.decompress(out.read_bytes())
        p = subprocess.run(args + ["--resume"], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "Traceback" not in p.stderr and f"resumed-skip {partial}" in p.stderr
    if suffix.endswith(".gz"):
        assert subprocess.run(["gzip", "-t", str(out)]).returncode == 0  # readable to the end
        text = gzip.decompress(out.read_bytes()).decode()
    else:
        text = out.read_text()
    ids = [json.loads(l)["id"] for l in text.splitlines()]
    assert sorted(ids) == sorted(f"rec-{i:07d}" for i in range(n))
    assert len(ids) == len(set(ids))


def test_shards_cover_input_once_via_cli(tmp_path):
    recs = [pending_record(i) for i in range(40)]
    got = []
    with ScriptedServer([SIM_OK]) as srv:
        for i in range(4):
            p = run_cmd([str(BIN / "simulate-env"), "--base-url", srv.base_url, "--shard", f"{i}/4"], stdin=jsonl(recs))
            assert p.returncode == 0, p.stderr
            got += [json.loads(l)["id"] for l in p.stdout.splitlines()]
    assert sorted(got) == sorted(r["id"] for r in recs)


def test_closed_pipe_ends_quietly():
    recs = [pending_record(i) for i in range(300)]
    with ScriptedServer([SIM_OK]) as srv:
        env = dict(os.environ, PATH=f"{BIN}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
        p = subprocess.run(f"{BIN}/simulate-env --base-url {srv.base_url} | head -n 1", shell=True,
                           input=jsonl(recs), capture_output=True, text=True, env=env, timeout=60)
    assert len(p.stdout.splitlines()) == 1
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_python_m_toolkit_cli_runs_a_command():
    """`python -m toolkit.cli <command>` (the form `accelerate launch -m toolkit.cli sft` uses) runs it."""
    p = run_cmd([sys.executable, "-m", "toolkit.cli", "verify", "--print-config", "--lambda-err", "0.25"])
    assert p.returncode == 0, p.stderr
    assert "lambda_err: 0.25" in p.stdout.splitlines()
    p = run_cmd([sys.executable, "-m", "toolkit.cli", "verify", "--no-such-flag"])
    assert p.returncode == 2 and "--no-such-flag" in p.stderr


def test_config_layers(tmp_path, monkeypatch):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("defaults:\n  model: from-defaults\n  temperature: 0.3\nsimulate-env:\n  model: from-recipe\n  fault_rate: 0.2\n")
    r = CliRunner().invoke(simulate_env, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 0, r.output
    assert "model: from-recipe" in r.output and "temperature: 0.3" in r.output and "fault_rate: 0.2" in r.output
    r = CliRunner().invoke(simulate_env, ["--recipe", str(recipe), "--print-config"], env={"TOOLKIT_MODEL": "from-env"})
    assert "model: from-env" in r.output
    r = CliRunner().invoke(simulate_env, ["--recipe", str(recipe), "--print-config", "--model", "from-flag"],
                           env={"TOOLKIT_MODEL": "from-env"})
    assert "model: from-flag" in r.output and "concurrency: 8" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  api_key: sk-123\n")
    r = CliRunner().invoke(simulate_env, ["--recipe", str(bad), "--print-config"])
    assert r.exit_code == 2 and "secrets" in r.output



@pytest.mark.embedded
@requires_embedded
def test_embedded_default_and_cache(tmp_path):
    cache = tmp_path / "c.sqlite"
    env = {"OPENAI_API_KEY": "", "NO_PROXY": "*"}
    args = [str(BIN / "simulate-env"), "--cache", str(cache), "--max-tokens", "48"]
    p1 = run_cmd(args, stdin=jsonl([pending_record(7)]), env=env, timeout=600)
    assert p1.returncode == 0, p1.stderr
    msg = json.loads(p1.stdout)["trajectories"][0]["messages"][-1]
    assert msg["role"] == "tool" and msg["content"]
    p2 = run_cmd(args, stdin=jsonl([pending_record(7)]), env=env, timeout=600)
    assert p2.returncode == 0
    t1, t2 = (json.loads(p.stdout)["trajectories"][0] for p in (p1, p2))
    assert t2["messages"] == t1["messages"]  # the cached answer, byte for byte
    # the first run may retry a malformed reply (each retry is a new request, each one cached); the
    # second run replays every one of them from the cache and sends nothing
    n = t1["usage"]["requests"]
    assert n >= 1 and t1["usage"].get("cache_hits", 0) == 0
    assert t2["usage"]["requests"] == 0 and t2["usage"]["cache_hits"] == n
    assert "llm requests 0 " in p2.stderr, p2.stderr


def test_verify_help_names_every_registered_scorer():
    """`verify --help` lists what `--strategy` accepts, from the registry (grounding and bfcl included)."""
    from toolkit import registry

    p = run_cmd([str(BIN / "verify"), "--help"])
    assert p.returncode == 0, p.stderr
    names = registry.names("scorers")
    assert {"state_diff", "actions", "f1", "grounding", "bfcl"} <= set(names)
    scorers = p.stdout.split("Scorers (--strategy):", 1)[1]
    for n in names:
        assert re.search(rf"^\s+{re.escape(n)}\s", scorers, re.M), n


def test_lazy_table_entries_exist_and_help_loads_none_of_them():
    """A command's implementation is loaded through toolkit.cli.lazy when it runs: every entry of the
    table names a real module / attribute, and `--help` of every streaming command imports none of
    the run-time modules (the stages, the config merge, the trainers)."""
    from toolkit.cli import lazy

    for key in lazy.IMPLEMENTATIONS:
        assert lazy.load(key) is not None, key
    code = (
        "import sys, click\n"
        "from toolkit.cli import lazy\n"
        "from toolkit.cli.commands import COMMANDS\n"
        "for name, cmd in COMMANDS.items():\n"
        "    try:\n"
        "        cmd.main(['--help'], prog_name=name, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "mods = {v.partition(':')[0] for v in lazy.IMPLEMENTATIONS.values()}\n"
        "print(sorted(m for m in mods if m in sys.modules))\n")
    r = run_cmd([sys.executable, "-c", code])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-2000:]
