"""The mcp backend on a live mcp-server-git over a template repository (made here with git)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import jsonl, run_cmd

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_git")

GIT_SERVER = shutil.which("mcp-server-git", path=os.path.dirname(sys.executable)) or shutil.which("mcp-server-git")
STATE = "git status --porcelain; git log --format=%T"  # content-based: tree hashes, no timestamps
IDENT = {"GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@example.com",
         "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@example.com"}


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENT}).stdout


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "template"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "a.txt").write_text("hello\n")
    _git(r, "add", "a.txt")
    _git(r, "commit", "-qm", "init")
    (r / "b.txt").write_text("new file\n")  # untracked: the task adds and commits it
    return r


@pytest.fixture
def marker():
    return f"i23-{uuid.uuid4().hex}"


@pytest.fixture
def servers_file(tmp_path, marker):
    assert GIT_SERVER, "mcp-server-git is installed with the mcp extra"
    roots = [str(tmp_path)]  # where the records' workdirs may lie (the operator's)
    doc = {"mcpServers": {
        "git": {"command": GIT_SERVER, "args": ["--repository", "{workdir}"],
                "env": {**IDENT, "TOOLKIT_TEST_MARKER": marker}, "state_command": STATE,
                "limits": {"cpu_seconds": 60, "wall_seconds": 30}, "workdir_roots": roots},
        "git-files": {"command": GIT_SERVER, "args": ["--repository", "{workdir}"],
                      "env": {**IDENT, "TOOLKIT_TEST_MARKER": marker}, "state_excludes": [".git"],
                      "workdir_roots": roots}}}
    p = tmp_path / "servers.json"
    p.write_text(json.dumps(doc))
    return p


def _servers_with_marker(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        if f"TOOLKIT_TEST_MARKER={marker}".encode() in env.split(b"\0"):
            out.append(int(d))
    return out


def _task(repo: Path, calls: list[tuple[str, dict]], rid: str = "git-1", server: str = "git") -> dict:
    return {"id": rid, "env": {"backend": "mcp", "id": server, "config": {"workdir": str(repo)}},
            "task": {"instruction": "Commit the new file b.txt.",
                     "ground_truth": {"actions": [{"name": n, "arguments": a} for n, a in calls]}}}


FULL = [("git_status", {"repo_path": "."}), ("git_add", {"repo_path": ".", "files": ["b.txt"]}),
        ("git_commit", {"repo_path": ".", "message": "add b"})]


def _expected_final(repo: Path, tmp_path: Path) -> list[str]:
    """The state after status → add → commit, computed with git by hand in another copy."""
    c = tmp_path / "by-hand"
    shutil.copytree(repo, c)
    _git(c, "add", "b.txt")
    _git(c, "commit", "-qm", "whatever message")
    out = subprocess.run(["sh", "-c", STATE], check=True, cwd=c, capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def test_library_episode_state_and_cleanup(repo, servers_file, marker, tmp_path, monkeypatch):
    from toolkit.envs import load_env

    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers_file))
    env = load_env(_task(repo, [])["env"])
    try:
        env.reset()
        names = {t["function"]["name"] for t in env.tools()}
        assert {"git_status", "git_add", "git_commit"} <= names
        assert env.tool_meta()["git_status"]["annotations"]["readOnlyHint"] is True
        pid = env.server_pid  # the confining launcher's (its process group); the server runs under it
        assert pid and pid in _servers_with_marker(marker)
        if os.environ.get("TOOLKIT_SANDBOX_ISOLATION") != "none-unsafe":  # (conftest: a host without namespaces)
            assert env.confinement["pid_ns"] and env.confinement["net_ns"] and env.confinement["user_ns"]
        s0 = env.snapshot()
        assert s0 == {"state": [{"line": "?? b.txt"}, {"line": _git(repo, "log", "--format=%T").strip()}]}
        h0 = env.state_hash()
        assert env.call("git_add", {"repo_path": ".", "files": ["b.txt"]}).ok
        h1 = env.state_hash()
        bad = env.call("git_add", {"repo_path": ".", "files": ["missing.txt"]})
        assert not bad.ok and bad.error["code"] == "TOOL_ERROR" and "missing.txt" in bad.error["message"]
        assert env.call("git_commit", {"repo_path": ".", "message": "add b"}).ok
        assert len({h0, h1, env.state_hash()}) == 3
        assert [r["line"] for r in env.snapshot()["state"]] == _expected_final(repo, tmp_path)
        assert "?? b.txt" in _git(repo, "status", "--porcelain")  # the template itself is untouched
        env.reset()  # a new episode: a new server in a new copy, the old one is gone
        assert env.server_pid != pid and not Path(f"/proc/{pid}").exists()
        assert env.snapshot() == s0
    finally:
        env.close()
    time.sleep(0.2)
    assert _servers_with_marker(marker) == []


def test_content_hash_state_with_excludes(repo, servers_file, monkeypatch):
    from toolkit.envs import load_env

    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers_file))
    with load_env(_task(repo, [], server="git-files")["env"]) as env:
        env.reset()
        import hashlib

        want = sorted([{"path": "a.txt", "sha256": hashlib.sha256(b"hello\n").hexdigest()},
                       {"path": "b.txt", "sha256": hashlib.sha256(b"new file\n").hexdigest()}],
                      key=lambda r: r["path"])
        assert env.snapshot() == {"files": want}  # .git/ excluded
        h0 = env.state_hash()
        assert env.call("git_add", {"repo_path": ".", "files": ["b.txt"]}).ok
        assert env.state_hash() == h0  # only .git changed, and it is excluded


def test_replay_verify_twice_same_state_skip_commit_fails(repo, servers_file, marker, tmp_path):
    env = {"TOOLKIT_MCP_SERVERS": str(servers_file)}
    r = run_cmd(["rollout", "--agent", "replay", "-n", "2"], stdin=jsonl([_task(repo, FULL)]), env=env, timeout=240)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    t1, t2 = rec["trajectories"]
    for t in (t1, t2):
        assert [s["name"] for s in t["steps"]] == ["git_status", "git_add", "git_commit"]
        assert all(s["ok"] for s in t["steps"])
        hashes = [t["initial_state_hash"]] + [s["state_hash"] for s in t["steps"]]
        assert hashes[0] == hashes[1] != hashes[2] != hashes[3]  # status reads, add and commit change it
    assert t1["final_state_hash"] == t2["final_state_hash"]  # replayed twice: the same final state
    # the state after the commit equals the one computed by hand with git
    from toolkit.scoring.state import state_hash

    lines = _expected_final(repo, tmp_path)
    assert t1["final_state_hash"] == state_hash({"state": [{"line": ln} for ln in lines]})

    # a trajectory that skips the commit, scored against the full task
    r2 = run_cmd(["rollout", "--agent", "replay"], stdin=jsonl([_task(repo, FULL[:2], rid="git-2")]), env=env,
                 timeout=240)
    assert r2.returncode == 0, r2.stderr
    skip = json.loads(r2.stdout)["trajectories"][0]
    rec["trajectories"].append({**skip, "id": "git-1-t2"})
    v = run_cmd(["verify", "--strategy", "state_diff", "--mcp-servers", str(servers_file)], stdin=jsonl([rec]),
                timeout=240)
    assert v.returncode == 0, v.stderr
    out = json.loads(v.stdout)
    rewards = {t["id"]: t["reward"] for t in out["trajectories"]}
    assert rewards == {"git-1-t0": 1.0, "git-1-t1": 1.0, "git-1-t2": 0.0}
    time.sleep(0.2)
    assert _servers_with_marker(marker) == []  # no server process outlived its episode


def test_record_cannot_carry_a_command(repo, servers_file, monkeypatch):
    from toolkit.envs import load_env
    from toolkit.envs.mcp import McpConfigError

    monkeypatch.setenv("TOOLKIT_MCP_SERVERS", str(servers_file))
    for ref in ({"backend": "mcp", "id": "git", "command": "sh", "args": ["-c", "echo pwned"]},
                {"backend": "mcp", "id": "git", "config": {"workdir": str(repo), "command": "sh"}},
                {"backend": "mcp", "id": "git", "config": {"mcpServers": {"x": {"command": "sh"}}}}):
        with pytest.raises(McpConfigError, match="cannot define an MCP server"):
            load_env(ref)
    with pytest.raises(McpConfigError, match="not registered by the operator"):
        load_env({"backend": "mcp", "id": "nope"})
    bad = _task(repo, FULL)
    bad["env"]["config"]["command"] = "sh"  # (a top-level env.command is refused by the schema already)
    r = run_cmd(["rollout", "--agent", "replay"], stdin=jsonl([bad]),
                env={"TOOLKIT_MCP_SERVERS": str(servers_file)}, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert "cannot define an MCP server" in r.stderr


def test_servers_file_errors(tmp_path):
    from toolkit.envs.mcp import McpConfigError, load_servers

    with pytest.raises(McpConfigError, match="mcpServers"):
        load_servers({"servers": {}})
    with pytest.raises(McpConfigError, match=r"mcpServers\.x: unknown key\(s\) comand"):
        load_servers({"mcpServers": {"x": {"comand": "a"}}})
    with pytest.raises(McpConfigError, match="exactly one of"):
        load_servers({"mcpServers": {"x": {"args": []}}})
    assert load_servers('{"mcpServers": {"h": {"url": "http://127.0.0.1:1/mcp"}}}')["h"].transport == "http"


def test_sanitize_names():
    from toolkit.envs.mcp import sanitize_names

    import hashlib

    got = sanitize_names(["files.read", "files/read", "ok_name", "x" * 70])
    # the one rule of `tools import` (toolkit.formats.tools.sanitize_name): over 64 characters keeps
    # 55 + "_" + 8 hex of the original's sha1; a collision gets "_2"
    long = "x" * 55 + "_" + hashlib.sha1(("x" * 70).encode()).hexdigest()[:8]
    assert got == {"files.read": "files_read", "files/read": "files_read_2", "ok_name": "ok_name", "x" * 70: long}
    assert len(long) == 64


def test_tools_import_live(repo, servers_file):
    r = run_cmd(["toolkit", "tools", "import", "mcp:git", "--mcp-servers", str(servers_file),
                 "--workdir", str(repo)], timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout.splitlines()[0])
    assert rec["env"] == {"backend": "mcp", "id": "git", "config": {"workdir": str(repo.resolve())}}
    names = {t["function"]["name"] for t in rec["extra"]["astra"]["tools"]}
    assert {"git_status", "git_add", "git_commit"} <= names
    assert rec["extra"]["astra"]["annotations"]["git_reset"]["destructiveHint"] is True


HTTP_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("notes")
NOTES = []


@app.tool(name="notes.add", description="Add a note to the shared list.")
def add(text: str) -> str:
    NOTES.append(text)
    return "added %d" % len(NOTES)


@app.tool(description="Always fails.")
def broken() -> str:
    raise ValueError("broken on purpose")


app.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
'''


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server_by_url(tmp_path):
    """A server the operator runs, reached by URL: live tools/list (a dotted name sanitized, the
    original used for the call), tools/call, isError → a failed step, stateless without a state command."""
    import socket

    from toolkit.envs import load_env
    from toolkit.envs.mcp import set_servers

    script = tmp_path / "notes_server.py"
    script.write_text(HTTP_SERVER)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail(f"the test server did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
                time.sleep(0.2)
        set_servers({"mcpServers": {"notes": {"url": f"http://127.0.0.1:{port}/mcp"}}})
        with load_env({"backend": "mcp", "id": "notes"}) as env:
            env.reset()
            names = {t["function"]["name"] for t in env.tools()}
            assert names == {"notes_add", "broken"}
            assert env.tool_meta()["notes_add"]["name"] == "notes.add"
            r = env.call("notes_add", {"text": "hi"})
            assert r.ok and r.content == {"result": "added 1"}  # structuredContent wins over the text block
            bad = env.call("broken", {})
            assert not bad.ok and bad.error["code"] == "TOOL_ERROR" and "broken" in bad.error["message"]
            assert env.snapshot() == {}
    finally:
        set_servers(None)
        proc.terminate()
        proc.wait(timeout=10)


def test_server_dies_with_a_killed_toolkit_process(repo, servers_file, marker):
    """SIGKILL of the process holding the episode (no cleanup code runs) still ends the server."""
    code = ("import sys, time\nfrom toolkit.envs import load_env\n"
            f"env = load_env({{'backend': 'mcp', 'id': 'git', 'config': {{'workdir': {str(repo)!r}}}}})\n"
            "env.reset()\nprint(env.server_pid, flush=True)\ntime.sleep(120)\n")
    env = {**os.environ, "TOOLKIT_MCP_SERVERS": str(servers_file), "PYTHONPATH": str(Path(__file__).parents[3])}
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, env=env)
    try:
        pid = int(p.stdout.readline())
        assert pid in _servers_with_marker(marker)
        episode_dir = Path(os.readlink(f"/proc/{pid}/cwd")).parent
    finally:
        p.kill()
        p.wait()
    deadline = time.time() + 10
    while (_servers_with_marker(marker) or episode_dir.exists()) and time.time() < deadline:
        time.sleep(0.1)
    assert _servers_with_marker(marker) == []
    assert not episode_dir.exists()  # the launcher removed it when its parent died
