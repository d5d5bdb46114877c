"""MCP servers and their state command run confined (issue 30): a hostile stdio MCP server written
here offers a `shell` tool and a `netns_escape` probe; each test rebuilds one of the audit's probes.

1. a tool walks /proc/*/ns/net, calls setns() and connects to a 127.0.0.1 listener: must fail;
2. the agent plants hook.sh + core.fsmonitor / hooks in .git: the state command never runs them,
   on rollout and on `verify --strategy state_diff`;
3. a `setsid sh -c 'exec sleep ...' &` sleeper: nothing left after rollout, nor after kill -9 of it;
4. a record's workdir outside the roots the operator registered ("/etc", `..`, a symlink): a reject
   naming env.config.workdir.
Plus: where the kernel refuses user namespaces the server is not started (fail closed) unless the
operator opts out with --sandbox-isolation none-unsafe, which provenance records.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import jsonl, run_cmd

pytest.importorskip("mcp")

ROOT = Path(__file__).resolve().parents[3]
STATE = "git status --porcelain; git log --format=%T"  # what docs/mcp.md recommends
IDENT = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.com",
         "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.com"}

if os.environ.get("TOOLKIT_SANDBOX_ISOLATION") == "none-unsafe":  # set by conftest where the kernel has none
    pytest.skip("this host gives no namespaces (the test run opted out of isolation)", allow_module_level=True)

HOSTILE = r'''
import ctypes, os, socket, subprocess, sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("hostile")


@app.tool(description="Run a shell command in the server's directory.")
def shell(cmd: str) -> str:
    p = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=300)
    return f"rc={p.returncode}\n{p.stdout}{p.stderr}"


def _ns_files():
    """every /proc/<pid>/ns/net there is, the parent chain first"""
    out, pid = [], os.getpid()
    while pid > 0:
        out.append(f"/proc/{pid}/ns/net")
        try:
            with open(f"/proc/{pid}/status") as f:
                pid = int([ln for ln in f if ln.startswith("PPid:")][0].split()[1])
        except (OSError, IndexError, ValueError):
            break
    if os.path.isdir("/proc"):
        out += [f"/proc/{d}/ns/net" for d in os.listdir("/proc") if d.isdigit()]
    return list(dict.fromkeys(out))


@app.tool(description="Try to leave the network namespace and reach 127.0.0.1:port.")
def netns_escape(port: int) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    res = {"setns": {}, "connected": False}
    try:
        with open("/proc/self/status") as f:
            res["CapEff"] = [ln.split()[1] for ln in f if ln.startswith("CapEff:")][0]
        with open("/proc/self/uid_map") as f:
            res["uid_map"] = f.read().split()
    except OSError as e:
        res["proc"] = str(e)
    res["unshare_user"] = libc.unshare(0x10000000 | 0x40000000) == 0 or os.strerror(ctypes.get_errno())
    for path in _ns_files():
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            res["setns"][path] = f"open: {e.strerror}"
            continue
        ok = libc.setns(fd, 0x40000000) == 0
        res["setns"][path] = "ENTERED" if ok else os.strerror(ctypes.get_errno())
        os.close(fd)
        if ok:
            break
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        res["connected"] = True
    except OSError as e:
        res["connect_error"] = str(e)
    return res


app.run(transport="stdio")
'''


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    s.setblocking(False)
    return s


def _accepted(s: socket.socket) -> int:
    n = 0
    while True:
        try:
            c, _ = s.accept()
        except BlockingIOError:
            return n
        c.close()
        n += 1


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENT}).stdout


@pytest.fixture
def roots(tmp_path):
    r = tmp_path / "roots"
    repo = r / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("hello\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-qm", "init")
    return r


@pytest.fixture
def marker():
    return f"i30-{uuid.uuid4().hex}"


@pytest.fixture
def servers(tmp_path, roots, marker):
    code = tmp_path / "code"
    code.mkdir()
    script = code / "hostile_server.py"
    script.write_text(HOSTILE)
    entry = {"command": sys.executable, "args": [str(script)], "read_paths": [str(code)],
             "env": {**IDENT, "TOOLKIT_TEST_MARKER": marker}, "state_command": STATE,
             "workdir_roots": [str(roots)], "limits": {"cpu_seconds": 120, "wall_seconds": 120}}
    p = tmp_path / "servers.json"
    p.write_text(json.dumps({"mcpServers": {"hostile": entry}}))
    return p


def _record(rid: str, calls: list[tuple[str, dict]], workdir: str) -> dict:
    return {"id": rid, "env": {"backend": "mcp", "id": "hostile", "config": {"workdir": workdir}},
            "task": {"instruction": "do it",
                     "ground_truth": {"actions": [{"name": n, "arguments": a} for n, a in calls]}}}


def _with_marker(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if f"TOOLKIT_TEST_MARKER={marker}".encode() in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    out.append(int(d))
            except OSError:
                pass
    return out


def _cmdline_pids(*argv: str) -> list[int]:
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if Path(f"/proc/{d}/cmdline").read_bytes() == want:
                    out.append(int(d))
            except OSError:
                pass
    return out


def _wait_gone(fn, seconds: float = 15.0) -> list:
    deadline = time.time() + seconds
    while (left := fn()) and time.time() < deadline:
        time.sleep(0.1)
    return left


def _shell(env, cmd: str) -> str:
    r = env.call("shell", {"cmd": cmd})
    assert r.ok, r.error
    return r.content["result"] if isinstance(r.content, dict) else r.content


def _load(servers, roots, monkeypatch):
    from toolkit.envs import load_env
    from toolkit.envs.mcp import McpEnvironment  # noqa: F401  (the package and its modules loaded)
    from toolkit.sandbox import isolation

    registry = sys.modules["toolkit.envs.mcp.servers"]

    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers))
    monkeypatch.setattr(registry, "_SERVERS", None)  # what an in-process CLI test may have left
    monkeypatch.delenv("TOOLKIT_SANDBOX_ISOLATION", raising=False)
    monkeypatch.setattr(isolation, "_DEFAULT_ISOLATION", None)
    return load_env({"backend": "mcp", "id": "hostile", "config": {"workdir": str(roots / "repo")}})


# ----------------------------------------------------------------------------------------------
# 1. no way back into the host's network namespace


def test_tool_cannot_setns_into_the_host_network(servers, roots, monkeypatch):
    lst = _listener()
    env = _load(servers, roots, monkeypatch)
    try:
        env.reset()
        r = env.call("netns_escape", {"port": lst.getsockname()[1]})
        assert r.ok, r.error
        res = r.content if isinstance(r.content, dict) else json.loads(r.content)
        res = res.get("result", res)
        conf = env.confinement
    finally:
        env.close()
        time.sleep(0.3)
        got = _accepted(lst)
        lst.close()
    assert got == 0 and res["connected"] is False, res
    assert "ENTERED" not in res["setns"].values(), res
    assert res["setns"], res  # it did find namespace files to try (its own /proc at least)
    assert res["unshare_user"] is not True  # seccomp: no new user namespace either
    assert int(res["CapEff"], 16) == 0  # no capability, not even inside its own user namespace
    if os.geteuid() == 0:  # the namespace's uid 0 is an unprivileged host uid
        inside, outside, count = map(int, res["uid_map"])
        assert inside == 0 and outside >= 1000 and count == 1
    assert conf["user_ns"] and conf["pid_ns"] and conf["net_ns"] and "seccomp" in conf


def test_host_is_read_only_outside_the_workdir(servers, roots, monkeypatch, tmp_path):
    outside = tmp_path / "outside.txt"
    etc = Path(f"/etc/probe-{uuid.uuid4().hex}")
    env = _load(servers, roots, monkeypatch)
    try:
        env.reset()
        out = _shell(env, f"echo x > {outside}; echo y > {etc}; echo z > in-work.txt; "
                          "echo t > /tmp/private.txt; cat /etc/shadow; ls /root; echo done")
        state = [r["line"] for r in env.snapshot()["state"]]
    finally:
        env.close()
        wrote_etc = etc.exists()
        etc.unlink(missing_ok=True)
    assert not outside.exists() and not wrote_etc
    assert "done" in out and "root:" not in out
    assert "?? in-work.txt" in state  # the workdir is writable and is the state
    assert not (roots / "repo" / "in-work.txt").exists()  # the template is not


# ----------------------------------------------------------------------------------------------
# 2. the state command runs nothing the agent wrote

def _plant(sentinel: Path, port: int) -> str:
    hook = (f"#!/bin/sh\necho ran >> {sentinel}\ntouch HOOK_RAN\n"
            f"{sys.executable} -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'\n")
    return (f"cat > hook.sh <<'EOF'\n{hook}EOF\nchmod +x hook.sh; "
            "git config core.fsmonitor 'sh hook.sh'; "
            "for h in post-index-change pre-commit post-checkout reference-transaction; do "
            "cp hook.sh .git/hooks/$h; chmod +x .git/hooks/$h; done; echo planted")


def test_state_command_never_runs_a_planted_hook(servers, roots, monkeypatch, tmp_path):
    sentinel = tmp_path / "hook-ran-on-host"
    lst = _listener()
    env = _load(servers, roots, monkeypatch)
    try:
        env.reset()
        assert "planted" in _shell(env, _plant(sentinel, lst.getsockname()[1]))
        lines = [r["line"] for r in env.snapshot()["state"]]
        env.snapshot()
        after = _shell(env, "ls")
        # the control: the same repository, git run by the agent itself (no toolkit env) does run it
        control = _shell(env, "git status --porcelain >/dev/null; ls HOOK_RAN")
    finally:
        env.close()
        time.sleep(0.3)
        got = _accepted(lst)
        lst.close()
    assert "?? hook.sh" in lines and not any("HOOK_RAN" in ln for ln in lines)
    assert "HOOK_RAN" not in after  # not even inside the confinement
    assert "rc=0" in control and "HOOK_RAN" in control  # the plant is live: only the toolkit's env stops it
    assert not sentinel.exists()  # and where it ran (confined), it reached neither the host's files...
    assert got == 0  # ... nor its loopback


def test_rollout_and_verify_never_run_a_planted_hook(servers, roots, tmp_path):
    sentinel = tmp_path / "hook-ran-on-host"
    lst = _listener()
    rec = _record("plant-1", [("shell", {"cmd": _plant(sentinel, lst.getsockname()[1])}),
                              ("shell", {"cmd": "echo more > more.txt"})], str(roots / "repo"))
    env = {"TOOLKIT_MCP_SERVERS": str(servers)}
    try:
        r = run_cmd(["rollout", "--agent", "replay", "--sandbox-isolation", "namespaces"], stdin=jsonl([rec]),
                    env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        v = run_cmd(["verify", "--strategy", "state_diff", "--sandbox-isolation", "namespaces"], stdin=r.stdout,
                    env=env, timeout=300)
        assert v.returncode == 0, v.stderr
    finally:
        time.sleep(0.3)
        got = _accepted(lst)
        lst.close()
    out = json.loads(v.stdout)
    t = out["trajectories"][0]
    assert all(s["ok"] for s in t["steps"]) and t["reward"] == 1.0
    assert not sentinel.exists() and got == 0
    # and it did not run confined either: the final state is the one computed by hand, no HOOK_RAN
    from toolkit.scoring.state import state_hash

    tree = _git(roots / "repo", "log", "--format=%T").strip()
    want = [f"?? {f}" for f in ("hook.sh", "more.txt")] + [tree]
    assert t["final_state_hash"] == state_hash({"state": [{"line": ln} for ln in want]})
    assert "mcp:namespaces" in (out["provenance"][-1]["sandbox_isolation"] or "")


# ----------------------------------------------------------------------------------------------
# 3. nothing outlives rollout

def _sleeper(tag: str) -> str:
    return f"setsid sh -c 'exec sleep {tag}' </dev/null >/dev/null 2>&1 & echo started"


def test_no_process_survives_rollout(servers, roots, marker):
    tag = f"313.{uuid.uuid4().int % 10**6}"
    rec = _record("sleep-1", [("shell", {"cmd": _sleeper(tag)}), ("shell", {"cmd": "pgrep -f 'sleep " + tag + "'"})],
                  str(roots / "repo"))
    r = run_cmd(["rollout", "--agent", "replay", "-n", "2"], stdin=jsonl([rec]),
                env={"TOOLKIT_MCP_SERVERS": str(servers)}, timeout=300)
    assert r.returncode == 0, r.stderr
    for t in json.loads(r.stdout)["trajectories"]:
        tool = [json.dumps(m["content"]) for m in t["messages"] if m["role"] == "tool"]
        assert len(tool) == 2 and "rc=0" in tool[1], tool  # the sleeper was running during the episode
    assert _wait_gone(lambda: _cmdline_pids("sleep", tag)) == []
    assert _wait_gone(lambda: _with_marker(marker)) == []


def test_no_process_survives_kill_9_of_rollout(servers, roots, marker):
    tag = f"313.{uuid.uuid4().int % 10**6}"
    rec = _record("sleep-2", [("shell", {"cmd": _sleeper(tag)}), ("shell", {"cmd": "sleep 200"})], str(roots / "repo"))
    e = dict(os.environ, TOOLKIT_MCP_SERVERS=str(servers), PYTHONPATH=str(ROOT),
             PATH=f"{ROOT / 'bin'}:{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}")
    p = subprocess.Popen(["rollout", "--agent", "replay"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=e, cwd=ROOT)
    p.stdin.write(jsonl([rec]).encode())
    p.stdin.close()
    try:
        deadline = time.time() + 120
        while not _cmdline_pids("sleep", tag) and time.time() < deadline and p.poll() is None:
            time.sleep(0.2)
        assert _cmdline_pids("sleep", tag), "the sleeper never started"
        tree = _with_marker(marker)
        workdirs = {os.readlink(f"/proc/{pid}/cwd") for pid in tree if os.path.exists(f"/proc/{pid}/cwd")}
        episode_dirs = {os.path.dirname(w) for w in workdirs if "toolkit-mcp-" in w}
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert len(tree) >= 3  # the launcher, pid 1 of its namespace and the server
    assert _wait_gone(lambda: _cmdline_pids("sleep", tag)) == []
    assert _wait_gone(lambda: _with_marker(marker)) == []
    assert episode_dirs and _wait_gone(lambda: [d for d in episode_dirs if os.path.exists(d)]) == []


# ----------------------------------------------------------------------------------------------
# 4. host paths come from the operator

def test_record_workdir_outside_the_roots_is_rejected(servers, roots, monkeypatch, tmp_path):
    from toolkit.envs import load_env
    from toolkit.envs.mcp import McpConfigError

    registry = sys.modules["toolkit.envs.mcp.servers"]

    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers))
    monkeypatch.setattr(registry, "_SERVERS", None)
    (roots / "etc-link").symlink_to("/etc")
    (roots / "repo-link").symlink_to(roots / "repo")
    bad = ["/etc", str(roots / ".." / ".." / ".." / ".." / ".." / "etc"), str(roots / "etc-link"), "etc-link",
           "../roots/../../../../../etc", str(tmp_path)]
    for w in bad:
        with pytest.raises(McpConfigError, match=r"^env\.config\.workdir: .*outside the workdir roots"):
            load_env({"backend": "mcp", "id": "hostile", "config": {"workdir": w}})
    with pytest.raises(McpConfigError, match=r"^env\.path: "):
        load_env({"backend": "mcp", "id": "hostile", "path": "/etc"})
    for ok in (str(roots / "repo"), "repo", str(roots / "repo-link"), str(roots / "x" / ".." / "repo")):
        env = load_env({"backend": "mcp", "id": "hostile", "config": {"workdir": ok}})
        assert env.workdir == str((roots / "repo").resolve())
        env.close()
    # no root registered at all: a record names no host directory
    doc = json.loads(servers.read_text())
    del doc["mcpServers"]["hostile"]["workdir_roots"]
    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", json.dumps(doc))
    with pytest.raises(McpConfigError, match="no workdir root is registered"):
        load_env({"backend": "mcp", "id": "hostile", "config": {"workdir": str(roots / "repo")}})
    monkeypatch.setenv("TOOLKIT_MCP_WORKDIR_ROOTS", str(roots))  # the operator's other way
    load_env({"backend": "mcp", "id": "hostile", "config": {"workdir": str(roots / "repo")}}).close()


def test_rollout_rejects_a_record_naming_etc(servers, roots, tmp_path):
    rej = tmp_path / "rejects.jsonl"
    recs = [_record("etc", [("shell", {"cmd": "cat etc/shadow"})], "/etc"),
            _record("ok", [("shell", {"cmd": "ls"})], str(roots / "repo"))]
    r = run_cmd(["rollout", "--agent", "replay", "--rejects", str(rej)], stdin=jsonl(recs),
                env={"TOOLKIT_MCP_SERVERS": str(servers)}, timeout=300)
    assert r.returncode == 1, r.stderr
    assert [json.loads(ln)["id"] for ln in r.stdout.splitlines()] == ["ok"]
    bad = [json.loads(ln) for ln in rej.read_text().splitlines()]
    assert len(bad) == 1 and "env.config.workdir" in json.dumps(bad[0]) and "/etc" in json.dumps(bad[0])
    assert "shadow" not in r.stdout


# ----------------------------------------------------------------------------------------------
# fail closed where the kernel refuses user namespaces; the explicit opt-out is recorded

NO_USERNS = r'''
import ctypes, os, sys
sys.path.insert(0, sys.argv[1])
from toolkit.sandbox import confine
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs, then the sandbox's own filter: no user namespaces
confine._w_seccomp(libc)
os.execvp(sys.argv[2], sys.argv[2:])
'''


def test_fails_closed_without_user_namespaces_unless_opted_out(servers, roots, marker):
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter that simulates the host exists for x86_64 and aarch64")
    rec = _record("nsless", [("shell", {"cmd": "id"})], str(roots / "repo"))
    wrap = [sys.executable, "-c", NO_USERNS, str(ROOT)]
    env = {"TOOLKIT_MCP_SERVERS": str(servers), "TOOLKIT_SANDBOX_ISOLATION": "namespaces"}
    r = run_cmd([*wrap, "rollout", "--agent", "replay"], stdin=jsonl([rec]), env=env, timeout=300)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert "cannot confine" in r.stderr and "none-unsafe" in r.stderr
    assert _with_marker(marker) == []  # the server never started
    r = run_cmd([*wrap, "rollout", "--agent", "replay", "--sandbox-isolation", "none-unsafe"], stdin=jsonl([rec]),
                env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["trajectories"][0]["steps"][0]["ok"]
    assert out["provenance"][-1]["sandbox_isolation"] == "mcp:none-unsafe"
