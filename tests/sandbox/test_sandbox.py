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
from toolkit.sandbox import SandboxLimits, SandboxPool, SandboxUnavailable, confine
from toolkit.sandbox import docker as sb_docker
from toolkit.sandbox import pool as sb_pool

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
    return {w.cfg.uid for ws in p._idle.values() for w in ws if w.cfg.uid is not None}


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


# shared memory / IPC: fresh per call, and no memory outside memory_mb

MEMFD = ("import os\ndef f(n, mb):\n    fds = []\n    try:\n        for i in range(n):\n"
         "            fd = os.memfd_create('x%d' % i)\n            os.write(fd, b'x' * (mb << 20))\n"
         "            fds.append(fd)\n    except OSError as e:\n"
         "        return type(e).__name__ + ': ' + str(e)\n"
         "    return sum(os.fstat(fd).st_size for fd in fds) >> 20\n")
SYSV = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def f(what, op):\n"
        "    call = {'shm': lambda fl: libc.shmget(0x7331, 4096 if fl else 0, fl | 0o666),\n"
        "            'sem': lambda fl: libc.semget(0x7331, 1 if fl else 0, fl | 0o666),\n"
        "            'msg': lambda fl: libc.msgget(0x7331, fl | 0o666)}[what]\n"
        "    r = call(0o1000 if op == 'create' else 0)\n"
        "    return [r, ctypes.get_errno()]\n")


def test_memfd_memory_cannot_escape_the_memory_cap(pool):
    """The audit's probe: 8 memfds held 120 MB under a 64 MB cap (RLIMIT_AS does not see them)."""
    cap = SandboxLimits(memory_mb=64, wall_seconds=10)
    r = pool.run_function(MEMFD, "f", args=[8, 15], limits=cap)
    assert r.ok and r.value.startswith("PermissionError"), r  # refused, nothing held
    shm = ("import mmap\ndef f():\n    m = mmap.mmap(-1, 120 << 20, flags=mmap.MAP_SHARED)\n"
           "    m.write(b'x' * (120 << 20))\n    return 'HELD'\n")
    r = pool.run_function(shm, "f", limits=cap)  # shared anonymous memory: counted by RLIMIT_AS
    assert not r.ok and r.value is None, r


def test_sysv_ipc_is_fresh_per_call_and_shm_is_refused(kpool):
    pool = kpool
    fresh = SandboxLimits(wall_seconds=5)
    # SysV shared memory segments and message queues hold memory outside any rlimit: refused
    assert pool.run_function(SYSV, "f", args=["shm", "create"], limits=fresh).value == [-1, errno.EPERM]
    assert pool.run_function(SYSV, "f", args=["msg", "create"], limits=fresh).value == [-1, errno.EPERM]
    # what IPC may be created (semaphores) lives in the call's own IPC namespace
    for _ in range(2):
        assert pool.run_function(SYSV, "f", args=["sem", "create"], limits=fresh).value[0] >= 0
        r = pool.run_function(SYSV, "f", args=["sem", "get"], limits=fresh)
        assert r.value == [-1, errno.ENOENT], r  # the previous call's semaphore is gone
    r = pool.run_function("def f():\n    return open('/proc/sysvipc/sem').read().count('\\n')", "f",
                          limits=fresh)
    assert r.ok and r.value == 1, r  # header only


def test_dev_shm_is_not_writable_by_the_kernel(kpool):
    code = ("import os\ndef f():\n    try:\n        fd = os.open('/dev/shm/x', os.O_CREAT | os.O_RDWR)\n"
            "        os.write(fd, b'x' * (100 << 20))\n        return 'WRITTEN'\n"
            "    except OSError as e:\n        return e.errno\n")
    r = kpool.run_function(code, "f", limits=SandboxLimits(memory_mb=64))
    assert r.ok and r.value in (errno.EROFS, errno.EACCES), r
    r = kpool.run_function(MEMFD, "f", args=[8, 15], limits=SandboxLimits(memory_mb=64))
    assert r.ok and r.value.startswith("PermissionError"), r  # seccomp, not the audit hook


USERNS = ("import ctypes, errno, os, struct, subprocess, threading\n"
          "libc = ctypes.CDLL(None, use_errno=True)\n"
          "libc.syscall.restype = ctypes.c_long\n"
          "NR = {'x86_64': (56, 435), 'aarch64': (220, 435)}[os.uname().machine]\n"
          "def res(r):\n"
          "    if r == 0 and os.getpid() != PID:\n"
          "        os._exit(0)  # a child that should never have been created\n"
          "    return [int(r), ctypes.get_errno() if r < 0 else 0]\n"
          "def f():\n"
          "    global PID\n"
          "    PID = os.getpid()\n"
          "    out = {}\n"
          "    out['unshare_user'] = res(libc.unshare(0x10000000))\n"
          "    out['unshare_user_net'] = res(libc.unshare(0x10000000 | 0x40000000))\n"
          "    out['clone_user'] = res(libc.syscall(NR[0], 0x10000000 | 17, 0, 0, 0, 0))\n"
          "    args = ctypes.create_string_buffer(struct.pack('<11Q', 0x10000000, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0))\n"
          "    out['clone3'] = res(libc.syscall(NR[1], args, 88))\n"
          "    fd = os.open('/proc/self/ns/uts', os.O_RDONLY)\n"
          "    out['setns'] = res(libc.setns(fd, 0))\n"
          "    with open('/proc/self/status') as s:\n"
          "        out['capeff'] = [l.split()[1] for l in s if l.startswith('CapEff')][0]\n"
          "    pid = os.fork()\n"
          "    if pid == 0:\n"
          "        os._exit(7)\n"
          "    out['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
          "    box = []\n"
          "    t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()\n"
          "    out['thread'] = box\n"
          "    out['spawn'] = subprocess.run(['/bin/sh', '-c', 'exit 3']).returncode\n"
          "    return out\n")


def _check_userns_refused(r: sb.SandboxResult) -> None:
    assert r.ok, r.error
    v = r.value
    assert v["unshare_user"] == [-1, errno.EPERM], v
    assert v["unshare_user_net"] == [-1, errno.EPERM], v
    assert v["clone_user"] == [-1, errno.EPERM], v
    assert v["clone3"] == [-1, errno.ENOSYS], v
    assert v["setns"] == [-1, errno.EPERM], v
    assert int(v["capeff"], 16) == 0, v  # no capability came back
    assert v["fork"] == 7 and v["thread"] == [1] and v["spawn"] == 3, v  # clone without it works


def test_new_user_namespaces_are_refused(kpool):
    """A nested user namespace would give the call every capability again (issue 17, hole 3)."""
    _check_userns_refused(kpool.run_function(USERNS, "f", limits=SandboxLimits(wall_seconds=10)))


def test_new_user_namespaces_are_refused_in_none_unsafe():
    p = SandboxPool(size=1, isolation="none-unsafe", audit_hook=False)  # the hook would refuse ctypes
    try:
        try:
            r = p.run_function(USERNS, "f", limits=SandboxLimits(wall_seconds=10))
        except SandboxUnavailable as e:
            pytest.skip(f"none-unsafe cannot run here (it refuses root): {e}")
        _check_userns_refused(r)
    finally:
        p.shutdown()


def test_worker_program_is_standard_library_only():
    """The worker program is shipped as source to a `python -I` process in the namespaces, where
    `toolkit` is not importable: its modules import the standard library and each other only."""
    import ast

    assert set(sb_pool._WORKER_MODULES) == {"confine", "worker"}
    for name in sb_pool._WORKER_MODULES:
        for node in ast.walk(ast.parse(sb_pool._module_source(name))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module in sb_pool._WORKER_MODULES, (name, node.module)
                continue
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module]
            else:
                continue
            for m in mods:
                assert m.split(".")[0] in sys.stdlib_module_names, (name, m)
    compile(sb_pool._worker_program(), "<sandbox-worker>", "exec")


def test_seccomp_program_jumps_stay_inside_the_program():
    for arch in confine._SECCOMP_DENY:
        prog = confine._w_seccomp_prog(arch)
        assert prog[-1] == (0x06, 0, 0, 0x00050000 | errno.EPERM)
        for i, (code, jt, jf, _k) in enumerate(prog):
            if code & 0x07 == 0x05:  # BPF_JMP
                assert i + 1 + max(jt, jf) < len(prog)


def test_memory_cap_is_per_call_where_a_memory_cgroup_is_available(pool):
    """tmpfs pages of the work dir and the memory of every process of a call count against
    memory_mb (RLIMIT_AS alone sees neither)."""
    rep = pool.isolation_report(probe=False)
    if not (rep.get("memory") or "").startswith("per call"):
        pytest.skip(f"no writable memory cgroup here: {rep.get('memory')}")
    fill = ("import os\ndef f(n, mb):\n    for i in range(n):\n"
            "        with open('f%d' % i, 'wb') as fh:\n            fh.write(b'x' * (mb << 20))\n"
            "    return sum(os.path.getsize('f%d' % i) for i in range(n)) >> 20\n")
    r = pool.run_function(fill, "f", args=[4, 30], limits=SandboxLimits(memory_mb=64, file_size_mb=32))
    assert not r.ok and r.killed == "memory" and "MemoryError" in r.error, r
    assert pool.run_function(fill, "f", args=[1, 20],
                             limits=SandboxLimits(memory_mb=64, file_size_mb=32)).value == 20
    forks = ("import os, time\ndef f(n, mb):\n    kids = []\n    for i in range(n):\n"
             "        pid = os.fork()\n        if pid == 0:\n            b = bytearray(mb << 20)\n"
             "            for j in range(0, len(b), 4096):\n                b[j] = 1\n"
             "            time.sleep(1)\n            os._exit(0)\n        kids.append(pid)\n"
             "    return [os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids]\n")
    r = pool.run_function(forks, "f", args=[4, 40], limits=SandboxLimits(memory_mb=100, wall_seconds=10))
    # 4 x 40 MB cannot all live under one 100 MB cap: some are killed (or the call itself is)
    assert (not r.ok and r.killed == "memory") or -signal.SIGKILL in r.value, r
    assert pool.run_function("def f():\n    return 7", "f").value == 7  # the pool is fine after


def test_result_records_the_isolation(pool):
    r = pool.run_function("def f():\n    return 1", "f")
    assert r.isolation == pool.isolation in ("namespaces", "none-unsafe")
    assert sb.used_isolation() is not None and "namespaces" in sb.used_isolation()


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


def test_fails_closed_when_namespaces_are_unavailable(monkeypatch):
    """No silent downgrade: without namespaces the default ("auto" included) refuses to run."""
    monkeypatch.delenv("TOOLKIT_SANDBOX_ISOLATION", raising=False)
    for iso in (None, "auto", "namespaces"):
        p = SandboxPool(size=1, isolation=iso)
        assert p.isolation == "namespaces"
        p._test_confinement = {"test_fail_unshare": True}  # simulate: unshare(2) -> EPERM
        with pytest.raises(SandboxUnavailable, match="none-unsafe") as ei:
            p.run_function("def f():\n    return 1", "f")
        assert "namespace isolation is unavailable" in str(ei.value)
        assert "--sandbox-isolation docker" in str(ei.value)
        p.shutdown()
    for bad in ("none", "off"):  # running unisolated must be spelled out
        with pytest.raises(ValueError, match="none-unsafe"):
            SandboxPool(size=1, isolation=bad)
    with pytest.raises(ValueError, match="unknown sandbox isolation"):
        sb.normalize_isolation("chroot")


def _unsafe_pool() -> SandboxPool:
    return SandboxPool(size=1, isolation="none-unsafe")


def test_none_unsafe_never_runs_untrusted_code_as_root():
    if os.geteuid() == 0:
        # the uid drop cannot happen (simulated: no uid to drop to) -> refuse, never run as root
        p = _unsafe_pool()
        p._test_confinement = {"uid": None}
        with pytest.raises(SandboxUnavailable, match="refusing to run untrusted code as root"):
            p.run_function("import os\ndef f():\n    return os.geteuid()", "f")
        p.shutdown()
    p = _unsafe_pool()
    try:
        r = p.run_function("import os\ndef f():\n    return [os.getuid(), os.geteuid()]", "f")
    except SandboxUnavailable as e:  # root host whose Python the unprivileged uid cannot read
        assert os.geteuid() == 0 and "refusing to run untrusted code as root" in str(e)
        return
    finally:
        p.shutdown()
    assert r.ok, r.error
    assert 0 not in r.value and r.isolation == "none-unsafe"


LEFTOVERS = """
import ctypes, json, os, sys
def leftovers():
    return sorted(n for n in os.listdir("/tmp") if n.startswith("toolkit-sandbox-"))
if sys.argv[1] == "private":
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x20000) != 0:  # a private mount namespace with its own empty /tmp
        print(json.dumps({"skip": "unshare(CLONE_NEWNS): errno %d" % ctypes.get_errno()})); sys.exit(0)
    libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None)  # MS_REC | MS_PRIVATE
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) != 0:
        print(json.dumps({"skip": "mount tmpfs /tmp: errno %d" % ctypes.get_errno()})); sys.exit(0)
before = leftovers()
from toolkit.sandbox import SandboxPool, SandboxUnavailable
refused = []
for iso, extra in (("none-unsafe", {"uid": None}), ("none-unsafe", {}),
                   ("namespaces", {"test_fail_unshare": True})):
    p = SandboxPool(size=1, isolation=iso)
    p._test_confinement = extra
    try:
        p.run_function("def f():\\n    return 1", "f")
    except SandboxUnavailable as e:
        refused.append(str(e)[:80])
    finally:
        p.shutdown()
print(json.dumps({"refused": refused, "new": sorted(set(leftovers()) - set(before))}))
"""


def test_refusals_leave_no_workdir_behind():
    """A refusal (none-unsafe as root, namespaces unavailable) creates no /tmp/toolkit-sandbox-*
    (issue 17). Run with a private, empty /tmp so other processes' workers cannot interfere."""
    if os.geteuid() != 0:
        pytest.skip("the none-unsafe refusal happens on a root host only")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # A private empty /tmp keeps other processes' workers out of the count, but it would also hide
    # the interpreter or the checkout when they live under /tmp (a CI clone there): then count the
    # new toolkit-sandbox-* entries instead (the suite runs serially).
    here = [os.path.realpath(p) for p in (sys.prefix, sys.executable, os.path.dirname(sb.__file__))]
    mode = "diff" if any(p == "/tmp" or p.startswith("/tmp/") for p in here) else "private"
    p = subprocess.run([sys.executable, "-c", LEFTOVERS, mode], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = __import__("json").loads(p.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    assert len(out["refused"]) >= 2, out  # uid None and the simulated unshare failure at least
    assert out["new"] == [], out


def test_none_unsafe_explicit_opt_out_is_reported_and_limited(tmp_path):
    p = _unsafe_pool()
    try:
        try:
            rep = p.isolation_report()
        except SandboxUnavailable as e:
            pytest.skip(f"none-unsafe cannot run here (it refuses root): {e}")
        assert rep["mode"] == "none" and rep["isolation"] == "none-unsafe"
        assert "none-unsafe" in rep["degraded"] and "NOT isolated" in rep["filesystem"]
        r = p.run_function("def f():\n    return 5", "f")
        assert r.ok and r.value == 5 and r.isolation == "none-unsafe"
        target = str(tmp_path / "evil.txt")
        assert p.run_function(WRITE, "f", args=[target]).value.startswith("PermissionError")
        assert not os.path.exists(target)
        db = str(tmp_path / "evil.db")
        r = p.run_function(SQLITE, "f", args=[db])
        assert r.value.startswith("PermissionError") and not os.path.exists(db)
        assert p.run_function(CONNECT, "f", args=["127.0.0.1", 9]).value[0] == "PermissionError"
        assert p.run_function(MEMFD, "f", args=[8, 15]).value.startswith("PermissionError")
        r = p.run_function("def f():\n    while True:\n        pass", "f",
                           limits=SandboxLimits(cpu_seconds=1))
        assert r.killed == "cpu_limit"
    finally:
        p.shutdown()


SQLITE = ("import sqlite3\ndef f(path):\n    try:\n        c = sqlite3.connect(path)\n"
          "        c.execute('create table t(a)')\n        c.commit()\n        return 'WRITTEN'\n"
          "    except Exception as e:\n        return type(e).__name__ + ': ' + str(e)\n")


def test_audit_hook_refuses_sqlite_files_outside_the_work_dir(tmp_path):
    """sqlite opens its files in C (no "open" audit event): the hook checks sqlite3.connect."""
    work = tmp_path / "work"
    work.mkdir()
    prog = (
        "import sys, sqlite3, os\n"
        f"sys.path.insert(0, {str(sb.__file__.rsplit('/toolkit/', 1)[0])!r})\n"
        "from toolkit.sandbox.confine import _w_audit_hook\n"
        f"os.chdir({str(work)!r})\n"
        f"sys.addaudithook(_w_audit_hook({str(work)!r}, False, False))\n"
        "out = []\n"
        f"for db in [{str(tmp_path / 'x.db')!r}, 'file:{tmp_path}/y.db?mode=rwc', 'inside.db', ':memory:',"
        " 'file::memory:']:\n"
        "    try:\n"
        "        c = sqlite3.connect(db, uri=db.startswith('file:'))\n"
        "        c.execute('create table t(a)'); c.commit(); c.close(); out.append('ok')\n"
        "    except PermissionError:\n"
        "        out.append('refused')\n"
        "print(','.join(out))\n")
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "refused,refused,ok,ok,ok"
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "y.db").exists()
    assert (work / "inside.db").exists()


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
    p = subprocess.run([sys.executable, "-I", "-c", sb_docker._docker_runner_source(), blob],
                       capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout.split(sb_docker._DOCKER_MARK, 1)[1])
    assert json.loads(doc["result"]) == {"ok": True, "value": 42}
    assert doc["stdout"] == "out\n"


# ---------------------------------------------------------------------------------------------
# the CLI setting: --sandbox-isolation / recipe `sandbox_isolation`, recorded in provenance


def test_cli_sandbox_isolation_is_applied_and_recorded(tmp_path):
    import json

    from tests.conftest import run_cmd
    from tests.stages.test_verify import CALLS, MINI_DOMAIN, PASSING, call_msgs

    dom = tmp_path / "mini.json"
    dom.write_text(json.dumps(MINI_DOMAIN))
    rec = {"id": "sbx-1", "env": {"backend": "sqlite", "path": str(dom)},
           "task": {"instruction": "Fix bob's account.", "ground_truth": {
               "actions": [{"name": "update_account", "arguments": {"account_id": "A2", "balance": 50}}]}},
           "verifier": {"spec": "code", "source": PASSING},
           "trajectories": [{"id": "sbx-1-t0", "messages": call_msgs(CALLS[2:3])}]}
    line = json.dumps(rec) + "\n"
    p = run_cmd(["verify", "--strategy", "code", "--sandbox-isolation", "namespaces"], stdin=line,
                env={"TOOLKIT_SANDBOX_ISOLATION": ""})
    if "namespace isolation is unavailable" in p.stderr:
        pytest.skip("kernel namespaces unavailable here")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["verdicts"][0]["passed"] is True
    assert out["provenance"][-1]["sandbox_isolation"] == "namespaces"
    # the opt-out must be spelled out; "none" is not a choice
    p = run_cmd(["verify", "--strategy", "code", "--sandbox-isolation", "none"], stdin=line)
    assert p.returncode == 2 and "none-unsafe" in p.stderr
    # a recipe / env value that is not allowed is a usage error, not a silent downgrade
    p = run_cmd(["verify", "--strategy", "code"], stdin=line, env={"TOOLKIT_SANDBOX_ISOLATION": "none"})
    assert p.returncode == 2 and p.stdout == "" and "none-unsafe" in p.stderr, (p.returncode, p.stderr)
