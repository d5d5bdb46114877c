"""Sandbox limits come from the operator, never from a record (issue 17, hole 2).

A record's env.config.limits may only narrow the operator's limits (--sandbox-limits, recipe
`sandbox_limits`, TOOLKIT_SANDBOX_LIMITS): anything wider or invalid gets the operator's value,
the clamp is noted in the record's provenance (`sandbox_clamped`), and network is never granted
by data. Every check runs the tool code in the real sandbox and reads the limits it got there.
"""

from __future__ import annotations

import http.server
import json
import math
import threading

import pytest
from tests.conftest import run_cmd

from toolkit import sandbox as sb
from toolkit.envs.python import PythonEnvironment
from toolkit.sandbox import SandboxLimits

PROBE_TOOLS = [
    {"name": "rlimits", "parameters": {"type": "object", "properties": {}}},
    {"name": "fetch", "parameters": {"type": "object", "properties": {"url": {"type": "string"}},
                                     "required": ["url"]}},
    {"name": "nap", "parameters": {"type": "object", "properties": {"s": {"type": "number"}},
                                   "required": ["s"]}},
]
PROBE_SRC = '''
import resource, time

def rlimits(state):
    return {"as_mb": resource.getrlimit(resource.RLIMIT_AS)[0] >> 20,
            "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
            "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
            "fsize_mb": resource.getrlimit(resource.RLIMIT_FSIZE)[0] >> 20}

def fetch(state, url):
    import urllib.request
    try:
        return urllib.request.urlopen(url, timeout=3).read().decode()
    except Exception as e:
        return "refused: " + type(e).__name__

def nap(state, s):
    time.sleep(s)
    return "woke"
'''


@pytest.fixture
def operator():
    """Set the operator's limits for one test, then back to the defaults."""
    yield sb.set_operator_limits
    sb.set_operator_limits(None)


@pytest.fixture
def loopback():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"SECRET-FROM-THE-HOST"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()


def _env(limits) -> PythonEnvironment:
    return PythonEnvironment.from_ref({"backend": "python", "config": {
        "tools": PROBE_TOOLS, "source": PROBE_SRC, "limits": limits}, "state": {}})


def test_record_asking_for_more_gets_the_operators_limits(operator):
    operator({"memory_mb": 300, "max_processes": 16, "cpu_seconds": 3, "wall_seconds": 4, "file_size_mb": 8})
    env = _env({"memory_mb": 100_000, "max_processes": 100_000, "cpu_seconds": 3600, "wall_seconds": 1e9,
                "file_size_mb": 4096, "network": True})
    assert env.limits == SandboxLimits(cpu_seconds=3, wall_seconds=4, memory_mb=300, file_size_mb=8,
                                       max_processes=16, network=False)
    assert len(env.limit_notes) == 6 and any("network" in n for n in env.limit_notes)
    r = env.call("rlimits", {})
    assert r.ok, r.error
    assert r.content == {"as_mb": 300, "nproc": 16, "cpu": 3, "fsize_mb": 8}  # what the code really got
    # wall_seconds 1e9 used to end in OverflowError; now the operator's 4 s apply
    r = env.call("nap", {"s": 30})
    assert not r.ok and r.error["code"] == "TIMEOUT", r


def test_record_may_narrow(operator):
    operator({"memory_mb": 400})
    env = _env({"memory_mb": 256, "max_processes": 8, "cpu_seconds": 2, "network": False})
    assert env.limit_notes == []
    r = env.call("rlimits", {})
    assert r.ok and r.content["as_mb"] == 256 and r.content["nproc"] == 8 and r.content["cpu"] == 2


def test_network_is_never_granted_by_data(operator, loopback):
    env = _env({"network": True})
    assert env.limits.network is False and "network" in env.limit_notes[0]
    r = env.call("fetch", {"url": loopback})
    assert r.ok and r.content.startswith("refused"), r
    # the operator can allow it (and then a record can still turn it off)
    operator({"network": True})
    r = _env({}).call("fetch", {"url": loopback})
    assert r.ok and r.content == "SECRET-FROM-THE-HOST", r
    assert _env({"network": False}).limits.network is False


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, 0, "lots", None, [1], True, 1e400, 10 ** 30])
def test_invalid_record_values_get_the_operators_and_never_crash(operator, bad):
    operator({"wall_seconds": 3})
    env = _env({"wall_seconds": bad, "memory_mb": bad, "bogus": 1})
    assert env.limits.wall_seconds == 3 and env.limits.memory_mb == 512
    assert len(env.limit_notes) == 3
    assert env.call("nap", {"s": 0}).ok
    assert _env("not a mapping").limits == sb.operator_limits()


def test_operator_limits_are_validated():
    for bad in ('{"memory_mb": -5}', '{"wall_seconds": 1e9}', '{"cpu_seconds": NaN}', '{"network": "yes"}',
                '{"ram": 5}', "[1]", "{not json"):
        with pytest.raises(ValueError):
            sb.parse_limits(bad)
    assert sb.parse_limits('{"memory_mb": 1024}').memory_mb == 1024
    assert sb.parse_limits({"wall_seconds": 20}).wall_seconds == 20.0
    with pytest.raises(ValueError, match="wall_seconds"):  # nor can code pass a crashing value
        sb.check_limits(SandboxLimits(wall_seconds=math.inf))


def test_env_var_sets_the_operator_limits(monkeypatch):
    monkeypatch.setenv("TOOLKIT_SANDBOX_LIMITS", '{"memory_mb": 200, "max_processes": 4}')
    lim = sb.operator_limits()
    assert lim.memory_mb == 200 and lim.max_processes == 4 and lim.wall_seconds == SandboxLimits().wall_seconds
    env = _env({"memory_mb": 300})
    assert env.limits.memory_mb == 200


def _verify_line(limits: dict, backend: str = "auto") -> str:
    tools = [{"name": "put", "parameters": {"type": "object", "properties": {
        "key": {"type": "string"}, "value": {"type": "string"}}, "required": ["key", "value"]}}]
    src = "def put(state, key, value):\n    return 'ok', {**state, key: value}\n"
    call = {"id": "c0", "type": "function", "function": {"name": "put", "arguments": '{"key": "a", "value": "1"}'}}
    rec = {"id": "lim-1", "env": {"backend": "python", "config": {
               "tools": tools, "source": src, "limits": limits, "sandbox": backend}, "state": {}},
           "task": {"instruction": "Set a to 1.", "ground_truth": {
               "actions": [{"name": "put", "arguments": {"key": "a", "value": "1"}}]}},
           "trajectories": [{"id": "lim-1-t0", "messages": [
               {"role": "user", "content": "Set a to 1."},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c0", "content": "ok"},
               {"role": "assistant", "content": "Done."}]}]}
    return json.dumps(rec) + "\n"


def test_cli_clamp_is_recorded_in_provenance():
    line = _verify_line({"network": True, "memory_mb": 100_000, "wall_seconds": 1e9, "max_processes": 64},
                        backend="process")
    p = run_cmd(["verify", "--strategy", "state_diff", "--sandbox-limits", '{"memory_mb": 256}'], stdin=line)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["verdicts"][0]["passed"] is True
    notes = out["provenance"][-1]["sandbox_clamped"]
    assert any(n.startswith("network:") for n in notes), notes
    assert any(n.startswith("memory_mb:") and "256" in n for n in notes), notes
    assert any(n.startswith("wall_seconds:") for n in notes) and any(n.startswith("max_processes:") for n in notes)
    assert any(n.startswith("sandbox:") for n in notes), notes  # data cannot pick the backend either
    assert "not granted" in p.stderr
    # a record within the operator's limits has nothing to note
    p = run_cmd(["verify", "--strategy", "state_diff"], stdin=_verify_line({"memory_mb": 128}),
                env={"TOOLKIT_SANDBOX_LIMITS": '{"memory_mb": 256}'})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["provenance"][-1].get("sandbox_clamped") is None


def test_cli_bad_operator_limits_are_a_usage_error():
    line = _verify_line({})
    p = run_cmd(["verify", "--sandbox-limits", '{"wall_seconds": 1e9}'], stdin=line)
    assert p.returncode == 2 and "sandbox_limits" in p.stderr and p.stdout == ""
    p = run_cmd(["verify"], stdin=line, env={"TOOLKIT_SANDBOX_LIMITS": '{"memory_mb": "lots"}'})
    assert p.returncode == 2 and "memory_mb" in p.stderr and p.stdout == ""
