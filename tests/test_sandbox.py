"""The untrusted-code sandbox: every isolation claim is checked by running hostile code."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from toolkit import sandbox as sb
from toolkit.sandbox import SandboxLimits, SandboxPool, SandboxUnavailable

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=5)


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(size=2)
    p.warm(2)
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def kpool():
    """Audit hook OFF: whatever is blocked here is blocked by the kernel-level layers alone."""
    p = SandboxPool(size=1, audit_hook=False)
    if p.isolation_report(probe=False)["mode"] != "namespaces":
        p.shutdown()
        pytest.skip("kernel namespaces unavailable here (see isolation_report()['degraded'])")
    yield p
    p.shutdown()


def _worker_uids(p: SandboxPool) -> set[int]:
    return {w.cfg["uid"] for ws in p._idle.values() for w in ws if w.cfg.get("uid") is not None}


def _host_procs_with_uid(uids: set[int]) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) in uids:
                            out.append(int(d))
                        break
        except OSError:
            pass
    return out


# ---------------------------------------------------------------------------------------------
# normal path


def test_function_returns_value(pool):
    r = pool.run_function("def f(a, b, c=0):\n    return {'sum': a + b + c, 'l': [a, b]}", "f",
                          args=[1, 2], kwargs={"c": 3})
    assert r.ok, r.error
    assert r.value == {"sum": 6, "l": [1, 2]}
    assert r.killed is None and r.error is None
    assert r.duration_s < 1.0


def test_module_level_api_and_default_pool():
    r = sb.run_function("import math\ndef f(x):\n    return math.sqrt(x)", "f", args=[16.0])
    assert r.ok and r.value == 4.0
    r = sb.run_code("import sys\nname = input()\nprint('hello', name)\nprint('warn', file=sys.stderr)",
                    stdin="world\n")
    assert r.ok and r.value == 0
    assert r.stdout == "hello world\n"
    assert r.stderr == "warn\n"


def test_exception_reported_with_type_message_and_traceback(pool):
    src = "def helper(x):\n    raise ValueError('bad input: ' + x)\n\ndef f():\n    return helper('zz')\n"
    r = pool.run_function(src, "f")
    assert not r.ok
    assert r.error_type == "ValueError"
    assert r.error.startswith("ValueError: bad input: zz")
    assert 'File "<sandbox>", line 2, in helper' in r.error
    assert r.killed is None


def test_script_errors_and_exit_codes(pool):
    r = pool.run_code("print('before')\n1/0\n")
    assert not r.ok and r.error.startswith("ZeroDivisionError") and r.value == 1
    assert r.stdout == "before\n" and "ZeroDivisionError" in r.stderr
    assert "_w_execute" not in r.stderr  # sandbox internals are not shown
    r = pool.run_code("import sys\nsys.exit(3)")
    assert not r.ok and r.value == 3
    r = pool.run_code("raise SystemExit(0)")
    assert r.ok and r.value == 0


def test_missing_function_and_non_json_return(pool):
    r = pool.run_function("x = 1", "nope")
    assert not r.ok and r.error_type == "NameError" and "nope" in r.error
    r = pool.run_function("def f():\n    return {1, 2}", "f")
    assert not r.ok and "not JSON-serializable" in r.error
    with pytest.raises(TypeError):
        pool.run_function("def f(x): return x", "f", args=[object()])


# ---------------------------------------------------------------------------------------------
# limits


def test_infinite_loop_killed_by_cpu_limit(pool):
    t0 = time.monotonic()
    r = pool.run_function("def f():\n    while True:\n        pass", "f",
                          limits=SandboxLimits(cpu_seconds=1, wall_seconds=10))
    assert not r.ok and r.killed == "cpu_limit"
    assert r.error == "TimeoutError: CPU time limit 1s exceeded"
    assert time.monotonic() - t0 < 4


def test_infinite_loop_killed_by_wall_timeout(pool):
    t0 = time.monotonic()
    r = pool.run_function("def f():\n    while True:\n        pass", "f",
                          limits=SandboxLimits(cpu_seconds=30, wall_seconds=1))
    assert not r.ok and r.killed == "wall_timeout"
    assert r.error == "TimeoutError: wall time 1s exceeded"
    r = pool.run_function("import time\ndef f():\n    time.sleep(60)", "f",
                          limits=SandboxLimits(wall_seconds=0.5))
    assert r.killed == "wall_timeout"
    assert time.monotonic() - t0 < 4


def test_memory_bomb_killed(pool):
    r = pool.run_function("def f():\n    a = []\n    while True:\n        a.append(' ' * 10**6)", "f",
                          limits=SandboxLimits(memory_mb=200, wall_seconds=10))
    assert not r.ok and r.killed == "memory" and r.error.startswith("MemoryError")
    r = pool.run_function("def f():\n    return len(bytearray(8 * 1024**3))", "f")
    assert not r.ok and r.killed == "memory"


def test_file_size_limit(pool):
    r = pool.run_function("def f():\n    open('big.bin', 'wb').write(b'x' * (3 << 20))", "f",
                          limits=SandboxLimits(file_size_mb=1))
    assert not r.ok and r.killed == "SIGXFSZ"


def test_fork_bomb_contained_and_cleaned_up(pool):
    src = ("import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
           "        except OSError:\n            pass\n")
    r = pool.run_function(src, "f", limits=SandboxLimits(cpu_seconds=2, wall_seconds=2,
                                                         max_processes=16))
    assert not r.ok and r.killed in ("wall_timeout", "cpu_limit")
    # every process of the call was killed: none runs under the workers' sandbox uids
    uids = _worker_uids(pool)
    if uids:
        time.sleep(0.1)
        assert _host_procs_with_uid(uids) == []
    assert pool.run_function("def f():\n    return 'alive'", "f").value == "alive"


def test_background_processes_do_not_survive_the_call(pool):
    src = ("import subprocess\ndef f():\n"
           "    p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n    return p.pid\n")
    r = pool.run_function(src, "f")
    if pool._mode != "namespaces":  # degraded mode: the audit hook refuses to spawn at all
        assert not r.ok and r.error_type == "PermissionError"
        return
    assert r.ok, r.error
    uids = _worker_uids(pool)
    if uids:
        assert _host_procs_with_uid(uids) == []


def test_pool_survives_killed_child_and_killed_worker(pool):
    r = pool.run_function("import os, signal\ndef f():\n    os.kill(os.getpid(), signal.SIGKILL)", "f")
    assert not r.ok and r.killed == "SIGKILL"
    assert pool.run_function("def f():\n    return 1", "f").value == 1
    # kill a whole worker from the outside: the pool replaces it
    for ws in pool._idle.values():
        for w in ws:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()
    for _ in range(3):
        assert pool.run_function("def f():\n    return 2", "f").value == 2


def test_concurrent_calls_use_the_pool(pool):
    pool.warm(2)
    src = "import time\ndef f(i):\n    time.sleep(0.5)\n    return i"
    out: dict[int, object] = {}

    def go(i: int) -> None:
        out[i] = pool.run_function(src, "f", args=[i]).value

    t0 = time.monotonic()
    ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {0: 0, 1: 1, 2: 2, 3: 3}
    assert time.monotonic() - t0 < 1.7  # 2 workers in parallel, not 4 x 0.5 s serially


def test_output_is_captured_and_capped(pool):
    r = pool.run_code("print('x' * (3 << 20))")
    assert r.ok and len(r.stdout) < (2 << 20) and "truncated" in r.stdout


# ---------------------------------------------------------------------------------------------
# isolation: network


@pytest.fixture
def host_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv.getsockname()[1]
    srv.close()


CONNECT = ("import socket\ndef f(host, port):\n    s = socket.socket()\n    s.settimeout(2)\n"
           "    try:\n        s.connect((host, port))\n        return 'CONNECTED'\n"
           "    except OSError as e:\n        return [type(e).__name__, getattr(e, 'errno', None)]\n")


def test_socket_connect_fails(pool, host_server):
    # reachable from the host ...
    socket.create_connection(("127.0.0.1", host_server), timeout=2).close()
    # ... but not from the sandbox
    for host, port in (("127.0.0.1", host_server), ("1.1.1.1", 80), ("8.8.8.8", 53)):
        r = pool.run_function(CONNECT, "f", args=[host, port])
        assert r.ok and r.value != "CONNECTED", (host, r.value)


def test_network_blocked_by_kernel_without_audit_hook(kpool, host_server):
    for host, port in (("127.0.0.1", host_server), ("1.1.1.1", 80)):
        r = kpool.run_function(CONNECT, "f", args=[host, port])
        assert r.ok and r.value == ["OSError", errno.ENETUNREACH], r.value
    # a fresh interpreter spawned inside (no audit hook at all) cannot connect either
    src = ("import subprocess, sys\ndef f(port):\n    return subprocess.run([sys.executable, '-c', "
           "f'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'], "
           "capture_output=True, text=True).stderr.strip().splitlines()[-1]")
    r = kpool.run_function(src, "f", args=[host_server])
    assert r.ok and "Network is unreachable" in r.value


def test_network_opt_in(host_server):
    with SandboxPool(size=1) as p:
        r = p.run_function(CONNECT, "f", args=["127.0.0.1", host_server],
                           limits=SandboxLimits(network=True))
        assert r.ok and r.value == "CONNECTED"


# ---------------------------------------------------------------------------------------------
# isolation: filesystem


WRITE = ("import os\ndef f(path):\n    try:\n        with open(path, 'w') as fh:\n"
         "            fh.write('pwned')\n        return 'WRITTEN'\n"
         "    except OSError as e:\n        return type(e).__name__ + ': ' + str(e)\n")


def _outside_targets(tmp_path) -> list[str]:
    return [str(tmp_path / "evil.txt"), "/tmp/toolkit_sandbox_evil.txt", "/work/evil.txt",
            "/work/main/evil.txt", "/etc/evil.conf", "/root/evil", "/dev/shm/evil",
            "/evil.txt"]


def test_writing_outside_the_work_dir_fails(pool, tmp_path):
    for target in _outside_targets(tmp_path):
        r = pool.run_function(WRITE, "f", args=[target])
        assert r.ok and r.value != "WRITTEN", (target, r.value)
        assert not os.path.exists(target), target
    r = pool.run_function(WRITE + "\ndef g():\n    return f('inside.txt'), os.getcwd()", "g")
    assert r.ok and r.value[0] == "WRITTEN"


def test_filesystem_read_only_by_kernel_without_audit_hook(kpool, tmp_path):
    for target in _outside_targets(tmp_path):
        r = kpool.run_function(WRITE, "f", args=[target])
        assert r.ok and r.value != "WRITTEN", (target, r.value)
        assert not os.path.exists(target), target
    # the repo (and its .env files) is not even visible; the work dir is a fresh tmpfs each call
    r = kpool.run_function("import os\ndef f():\n    open('leftover', 'w').write('x')\n"
                           "    return [os.path.exists('/work/main/toolkit'), os.getcwd()]", "f")
    assert r.value == [False, "/sandbox"]
    r = kpool.run_function("import os\ndef f():\n    return os.listdir('.')", "f")
    assert r.value == []
    # privileges are dropped: cannot remount the root read-write
    src = ("import subprocess\ndef f():\n    p = subprocess.run(['mount', '-o', 'remount,rw', '/'], "
           "capture_output=True, text=True)\n    return p.returncode")
    r = kpool.run_function(src, "f")
    assert r.ok and r.value != 0
    r = kpool.run_function("import os\ndef f():\n    return os.getuid()", "f")
    assert r.value != 0 or "user" in kpool.isolation_report(probe=False)["namespaces"]


# ---------------------------------------------------------------------------------------------
# isolation: environment, processes


def test_caller_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-secret-123")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_secret")
    with SandboxPool(size=1) as p:  # a pool started while the secrets are set
        r = p.run_function("import os\ndef f():\n    return dict(os.environ)", "f")
        assert r.ok
        assert "OPENAI_API_KEY" not in r.value and "HF_TOKEN" not in r.value
        assert set(r.value) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE",
                                "PYTHONIOENCODING"}
        # not reachable through /proc either (own process, the worker, spawned children)
        src = ("import os, subprocess, glob\ndef f():\n    blobs = []\n"
               "    for p in glob.glob('/proc/*/environ'):\n        try:\n"
               "            blobs.append(open(p, 'rb').read().decode('latin-1'))\n"
               "        except OSError:\n            pass\n"
               "    try:\n"
               "        blobs.append(subprocess.run(['env'], capture_output=True, text=True).stdout)\n"
               "    except PermissionError:\n        pass\n"
               "    return '\\n'.join(blobs)")
        r = p.run_function(src, "f")
        assert r.ok and "sk-fake-secret-123" not in r.value and "hf_fake_secret" not in r.value


def test_processes_outside_the_sandbox_are_invisible(kpool):
    r = kpool.run_function("import os\ndef f():\n    return sorted(int(p) for p in os.listdir('/proc') "
                           "if p.isdigit())", "f")
    assert r.ok and len(r.value) <= 3 and 1 in r.value  # the worker (pid 1) and the call itself


# ---------------------------------------------------------------------------------------------
# reporting, degradation, docker


def test_isolation_report_matches_probe():
    rep = sb.isolation_report()
    assert rep["backend"] == "process"
    assert rep["docker"].startswith(("unavailable", "available"))
    probe = rep["probe_kernel_only"]
    assert "OPENAI_API_KEY" not in probe["env_keys"]
    if rep["mode"] == "namespaces":
        assert {"mount", "pid", "net"} <= set(rep["namespaces"])
        assert probe["connect_127.0.0.1:80"].startswith("blocked")
        assert probe["connect_1.1.1.1:80"].startswith("blocked")
        assert probe["write_/tmp"].startswith("blocked")
        assert probe["write_cwd"] == "ALLOWED"
    else:
        assert "degraded" in rep and "NOT isolated" in rep["network"]


def test_degrades_with_a_clear_report_when_namespaces_are_unavailable(tmp_path):
    p = SandboxPool(size=1, isolation="auto")
    p._extra_cfg = {"_test_fail_unshare": True}  # simulate: unshare(2) -> EPERM
    try:
        rep = p.isolation_report()
        assert rep["mode"] == "none" and rep["namespaces"] == []
        assert "unshare" in rep["degraded"] and "NOT isolated" in rep["filesystem"]
        assert p.run_function("def f():\n    return 5", "f").value == 5
        # the audit hook still stops the obvious escapes, and the limits still apply
        target = str(tmp_path / "evil.txt")
        assert p.run_function(WRITE, "f", args=[target]).value.startswith("PermissionError")
        assert not os.path.exists(target)
        assert p.run_function(CONNECT, "f", args=["127.0.0.1", 9]).value[0] == "PermissionError"
        r = p.run_function("def f():\n    while True:\n        pass", "f",
                           limits=SandboxLimits(cpu_seconds=1))
        assert r.killed == "cpu_limit"
    finally:
        p.shutdown()
    strict = SandboxPool(size=1, isolation="namespaces")
    strict._extra_cfg = {"_test_fail_unshare": True}
    with pytest.raises(SandboxUnavailable, match="namespace isolation is unavailable"):
        strict.run_function("def f():\n    return 1", "f")
    strict.shutdown()


def test_docker_backend_gives_clear_unavailable_error():
    try:
        status = sb.docker_status()
    except Exception as e:  # pragma: no cover
        pytest.fail(f"docker_status raised {e!r}")
    if status == "available":  # pragma: no cover - only where an engine runs
        pytest.skip("a Docker engine is reachable here")
    with pytest.raises(SandboxUnavailable) as ei:
        sb.run_function("def f():\n    return 1", "f", backend="docker")
    assert "docker" in str(ei.value) and "--sandbox process" in str(ei.value)
    with pytest.raises(SandboxUnavailable):
        sb.run_code("print(1)", backend="docker")
    with pytest.raises(ValueError):
        sb.run_function("def f(): pass", "f", backend="nope")


def test_docker_runner_program_is_valid(tmp_path):
    """The program the docker backend ships into containers, run here with plain python."""
    import base64
    import json

    req = {"kind": "function", "source": "def f(x):\n    print('out')\n    return x * 2", "func": "f",
           "args": [21], "kwargs": {}, "limits": {}}
    blob = base64.b64encode(json.dumps(req).encode()).decode()
    p = subprocess.run([sys.executable, "-I", "-c", sb._docker_runner_source(), blob],
                       capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout.split(sb._DOCKER_MARK, 1)[1])
    assert json.loads(doc["result"]) == {"ok": True, "value": 42}
    assert doc["stdout"] == "out\n"
