"""The process backend (host side): a pool of warm sandbox workers (`SandboxPool`), each a fresh
`python -I` process that runs the worker program (`worker.py` + `confine.py`, shipped as source)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from toolkit.sandbox.confine import Confinement
from toolkit.sandbox.isolation import (
    _default_isolation,
    _note_used,
    normalize_isolation,
)
from toolkit.sandbox.limits import SandboxLimits, check_limits, operator_limits
from toolkit.sandbox.memcg import _make_memcg, _remove_memcg
from toolkit.sandbox.result import SandboxError, SandboxResult, SandboxUnavailable
from toolkit.sandbox.worker import _FRAME, _RES_CAP, _w_write_frame

_UID_BASE = 1_500_000_000
_uid_counter = 0
_uid_lock = threading.Lock()


_BOOTSTRAP = (
    "import os\n"
    "def _rd(n):\n"
    "    b = b''\n"
    "    while len(b) < n:\n"
    "        c = os.read(0, n - len(b))\n"
    "        if not c:\n"
    "            raise SystemExit(1)\n"
    "        b += c\n"
    "    return b\n"
    "exec(compile(_rd(int.from_bytes(_rd(4), 'big')), '<sandbox-worker>', 'exec'))\n"
)


# The worker program: these modules of this package (standard library only), in this order
# (`worker` imports `confine`), exec'd as the submodules of a package made in the worker process.
_WORKER_MODULES = ("confine", "worker")
_WORKER_PACKAGE = "_toolkit_sandbox_worker"
_LOADER = (
    "import sys, types\n"
    f"_pkg = types.ModuleType({_WORKER_PACKAGE!r})\n"
    "_pkg.__path__ = []\n"
    "sys.modules[_pkg.__name__] = _pkg\n"
    "def _load(name, src):\n"
    "    m = types.ModuleType(_pkg.__name__ + '.' + name)\n"
    "    m.__package__ = _pkg.__name__\n"
    "    m.__file__ = '<sandbox-worker:' + name + '.py>'\n"
    "    sys.modules[m.__name__] = m\n"
    "    setattr(_pkg, name, m)\n"
    "    exec(compile(src, m.__file__, 'exec'), m.__dict__)\n"
    "    return m\n"
)
_PROGRAM: str | None = None


def _module_source(name: str) -> str:
    try:
        return Path(__file__).with_name(f"{name}.py").read_text(encoding="utf-8")
    except OSError:
        import importlib
        import inspect

        return inspect.getsource(importlib.import_module(f"{__package__}.{name}"))


def _worker_program() -> str:
    """The source the bootstrap execs in a new worker: loads `_WORKER_MODULES`, runs `_w_main`."""
    global _PROGRAM
    if _PROGRAM is None:
        parts = [_LOADER]
        for name in _WORKER_MODULES:
            parts.append(f"_mod = _load({name!r}, {_module_source(name)!r})\n")
        parts.append("if sys.argv[1:2] == ['--sandbox-worker']:\n    _mod._w_main(sys.argv[2:])\n")
        _PROGRAM = "".join(parts)
    return _PROGRAM


def _next_uid() -> int:
    global _uid_counter
    with _uid_lock:
        _uid_counter += 1
        return _UID_BASE + (os.getpid() % 100_000) * 256 + (_uid_counter % 256)


def _clean_env() -> dict:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def _compute_binds(extra: tuple | list = ()) -> tuple[list[str], list[list[str]]]:
    std = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]
    binds: list[str] = []
    links: list[list[str]] = []
    for p in std:
        if os.path.islink(p):
            links.append([p, os.readlink(p)])
        elif os.path.isdir(p):
            binds.append(p)
    exe_prefix = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, exe_prefix,
              *extra):
        for q in {os.path.abspath(p), os.path.realpath(p)}:
            if os.path.isdir(q) and q != "/":
                binds.append(q)
    uniq = sorted(set(binds))
    out = [b for b in uniq if not any(b != o and b.startswith(o.rstrip("/") + "/") for o in uniq)]
    return out, links


class _Worker:
    def __init__(self, cfg: Confinement, start_timeout: float) -> None:
        self.cfg = cfg
        self.network = cfg.network
        self.lock = threading.Lock()
        # the worker program (`_worker_program`) arrives as the first frame on stdin
        argv = [sys.executable, "-I", "-X", "utf8", "-c", _BOOTSTRAP, "--sandbox-worker",
                cfg.to_json()]
        debug = cfg.debug
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=None if debug else subprocess.DEVNULL,
                                         env=_clean_env(), cwd="/", close_fds=True,
                                         start_new_session=True, bufsize=0)
        except OSError as e:
            _remove_memcg(cfg.memcg)
            raise SandboxError(f"cannot start a sandbox worker ({sys.executable}): {e}") from e
        self.rfd = self.proc.stdout.fileno()
        self.wfd = self.proc.stdin.fileno()
        try:
            _w_write_frame(self.wfd, _worker_program().encode("utf-8"))
            msg = json.loads(self._read_frame(time.monotonic() + start_timeout))
        except Exception as e:
            self.kill()
            raise SandboxError(f"sandbox worker failed to start: {type(e).__name__}: {e}") from e
        if not msg.get("ready"):
            self.isolation = msg.get("isolation") or {}  # kill() removes its workdir_base, if any
            self.kill()
            raise SandboxError(msg.get("error") or "sandbox worker failed to start")
        self.isolation: dict = msg.get("isolation") or {}
        self.inner_pid = msg.get("pid")
        self.started = time.time()

    # -- framing
    def _read_exact(self, n: int, deadline: float) -> bytes:
        buf = bytearray()
        poller = select.poll()
        poller.register(self.rfd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("sandbox worker did not answer in time")
            if not poller.poll(max(1, int(left * 1000))):
                continue
            chunk = os.read(self.rfd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("sandbox worker exited")
            buf += chunk
        return bytes(buf)

    def _read_frame(self, deadline: float) -> bytes:
        (n,) = _FRAME.unpack(self._read_exact(_FRAME.size, deadline))
        return self._read_exact(n, deadline) if n else b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, req: dict, timeout: float) -> tuple[dict, bytes]:
        data = json.dumps(req, ensure_ascii=False).encode("utf-8", "surrogatepass")
        deadline = time.monotonic() + timeout
        with self.lock:
            _w_write_frame(self.wfd, data)
            hdr = json.loads(self._read_frame(deadline))
            raw = self._read_frame(deadline)
        return hdr, raw

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _remove_memcg(self.cfg.memcg)
        base = self.isolation.get("workdir_base") if hasattr(self, "isolation") else None
        if base and os.path.basename(base).startswith("toolkit-sandbox-"):
            import shutil

            shutil.rmtree(base, ignore_errors=True)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _fmt_s(x: float) -> str:
    return f"{x:g}"


def _classify(hdr: dict, raw: bytes, limits: SandboxLimits) -> SandboxResult:
    if "fatal" in hdr:
        return SandboxResult(ok=False, error=f"SandboxError: worker failed: {hdr['fatal']}")
    res = SandboxResult(ok=False, stdout=hdr.get("stdout", ""), stderr=hdr.get("stderr", ""),
                        duration_s=float(hdr.get("duration_s", 0.0)))
    if hdr.get("truncated"):
        for what in hdr["truncated"]:
            if what == "stdout":
                res.stdout += "\n[... stdout truncated by the sandbox ...]"
            elif what == "stderr":
                res.stderr += "\n[... stderr truncated by the sandbox ...]"
    status = int(hdr.get("status", 0))
    payload = None
    if raw and "result" not in (hdr.get("truncated") or []):
        try:
            payload = json.loads(raw)
        except (ValueError, RecursionError) as e:
            payload = {"ok": False, "error": f"SandboxError: could not decode the result: {e}",
                       "error_type": "SandboxError"}
    elif "result" in (hdr.get("truncated") or []):
        payload = {"ok": False, "error": f"SandboxError: the result exceeds {_RES_CAP >> 20} MB",
                   "error_type": "SandboxError"}
    cpu_soft = max(1, int(-(-float(limits.cpu_seconds) // 1)))
    if hdr.get("killed") == "wall_timeout":
        res.killed = "wall_timeout"
        res.error_type = "TimeoutError"
        res.error = f"TimeoutError: wall time {_fmt_s(limits.wall_seconds)}s exceeded"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"SIG{sig}"
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and hdr.get("cpu_s", 0) >= cpu_soft - 0.05):
            res.killed = "cpu_limit"
            res.error_type = "TimeoutError"
            res.error = f"TimeoutError: CPU time limit {_fmt_s(limits.cpu_seconds)}s exceeded"
        elif sig == signal.SIGXFSZ:
            res.killed = name
            res.error_type = "OSError"
            res.error = f"OSError: file size limit {limits.file_size_mb} MB exceeded ({name})"
        elif hdr.get("oom_killed") or (
                sig in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS) and "MemoryError" in res.stderr):
            res.killed = "memory"
            res.error_type = "MemoryError"
            res.error = f"MemoryError: memory limit exceeded ({limits.memory_mb} MB); killed by {name}"
        else:
            res.killed = name
            res.error = f"SandboxError: the sandboxed process was killed by {name}"
            res.error_type = "SandboxError"
    elif payload is None:
        code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status
        res.error = (f"SandboxError: the sandboxed process exited with code {code} without "
                     "reporting a result")
        res.error_type = "SandboxError"
        res.value = code
    else:
        res.ok = bool(payload.get("ok"))
        res.value = payload.get("value")
        res.error = payload.get("error")
        res.error_type = payload.get("error_type")
        if res.error_type == "MemoryError":
            res.killed = "memory"
    return res


class SandboxPool:
    """A pool of warm sandbox workers (thread-safe).

    size: max number of concurrent workers (each runs one call at a time).
    isolation: "namespaces" (the default; raises SandboxUnavailable when the kernel does not let
               us build them: the pool never degrades on its own) or "none-unsafe" (explicit opt-out:
               rlimits + seccomp + uid drop + audit hook only, NOT a security boundary; still never
               runs code as root). "auto" means "namespaces". Default: $TOOLKIT_SANDBOX_ISOLATION
               or the module default (`set_default_isolation`).
    preload: extra modules imported once in each worker (e.g. ["numpy"]).
    audit_hook: install the Python audit hook layer in call children.
    ro_paths: extra host directories made visible (read-only) inside the sandbox.
    """

    def __init__(self, size: int | None = None, isolation: str | None = None,
                 preload: list[str] | tuple = (), audit_hook: bool = True,
                 ro_paths: list[str] | tuple = (), start_timeout: float = 30.0,
                 debug: bool = False) -> None:
        isolation = normalize_isolation(isolation or _default_isolation())
        if isolation == "docker":
            raise ValueError("SandboxPool runs the process backend; isolation 'docker' is served by "
                             "run_function/run_code(backend='docker')")
        self.size = int(size or max(2, min(8, os.cpu_count() or 2)))
        self.isolation = isolation
        self.preload = list(preload)
        self.audit_hook = audit_hook
        self.ro_paths = list(ro_paths)
        self.start_timeout = start_timeout
        self.debug = debug
        self._cond = threading.Condition()
        self._idle: dict[bool, list[_Worker]] = {False: [], True: []}
        self._count = 0
        self._closed = False
        self._mode: str = "none" if isolation == "none-unsafe" else "namespaces"
        self.fallback_reason: str | None = None
        self._last_isolation: dict | None = None
        self._pid = os.getpid()
        self._test_confinement: dict[str, Any] = {}  # tests: Confinement fields every worker gets

    # -- workers
    def _cfg(self, mode: str, network: bool) -> Confinement:
        binds, links = _compute_binds(self.ro_paths)
        uid = _next_uid() if os.geteuid() == 0 else None
        memcg = _make_memcg(f"toolkit-sandbox-{os.getpid()}-{uid or _next_uid()}")
        cfg = Confinement(mode=mode, network=network, binds=binds, symlinks=[list(x) for x in links],
                          uid=uid, preload=list(self.preload), audit_hook=self.audit_hook,
                          debug=self.debug, memcg=memcg or {})
        return replace(cfg, **self._test_confinement)

    def _spawn(self, network: bool) -> _Worker:
        if self._mode == "namespaces":
            err: SandboxError | None = None
            for _ in range(2):  # one retry for a transient failure; never a silent downgrade
                try:
                    w = _Worker(self._cfg("namespaces", network), self.start_timeout)
                    self._last_isolation = w.isolation
                    return w
                except SandboxError as e:
                    err = e
            raise SandboxUnavailable(
                f"namespace isolation is unavailable here: {err}. Generated code is not run without "
                "isolation: use --sandbox-isolation docker (a Docker engine), or opt out explicitly "
                "with --sandbox-isolation none-unsafe (TOOLKIT_SANDBOX_ISOLATION=none-unsafe)") from err
        try:
            w = _Worker(self._cfg("none", network), self.start_timeout)
        except SandboxError as e:
            raise SandboxUnavailable(f"sandbox (isolation none-unsafe) cannot start: {e}") from e
        self._last_isolation = w.isolation
        return w

    def _acquire(self, network: bool) -> _Worker:
        victim = None
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is shut down")
                idle = self._idle[network]
                while idle:
                    w = idle.pop()
                    if w.alive():
                        return w
                    self._count -= 1
                    w.kill()
                if self._count < self.size:
                    self._count += 1
                    break
                other = self._idle[not network]
                if other:
                    victim = other.pop()  # replace an idle worker of the other network kind
                    break
                self._cond.wait()
        if victim is not None:
            victim.close()
        try:
            return self._spawn(network)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, w: _Worker, healthy: bool) -> None:
        with self._cond:
            if healthy and not self._closed and w.alive():
                self._idle[w.network].append(w)
                self._cond.notify()
                return
            self._count -= 1
            self._cond.notify()
        w.kill()

    def warm(self, n: int | None = None, network: bool = False) -> int:
        """Start up to n workers now (in parallel); returns how many are idle for `network`."""
        n = min(self.size, n or self.size)
        got = []
        threads = []
        lock = threading.Lock()

        def one() -> None:
            w = self._acquire(network)
            with lock:
                got.append(w)

        with self._cond:
            have = len(self._idle[network])
        for _ in range(max(0, n - have)):
            t = threading.Thread(target=one, daemon=True)
            t.start()
            threads.append(t)
            if self._mode is None:  # let the first one settle the isolation mode
                t.join()
        for t in threads:
            t.join()
        for w in got:
            self._release(w, True)
        with self._cond:
            return len(self._idle[network])

    # -- calls
    def _run(self, req: dict, limits: SandboxLimits) -> SandboxResult:
        limits = check_limits(limits)
        req = dict(req)
        req["limits"] = asdict(limits)
        w = self._acquire(bool(limits.network))
        healthy = False
        try:
            hdr, raw = w.request(req, timeout=float(limits.wall_seconds) + 15.0)
            healthy = "fatal" not in hdr
        except TimeoutError:
            return SandboxResult(ok=False, killed="wall_timeout", error_type="TimeoutError",
                                 isolation=self.isolation,
                                 error=f"TimeoutError: wall time {_fmt_s(limits.wall_seconds)}s "
                                       "exceeded (worker unresponsive; replaced)")
        except (EOFError, OSError, ValueError) as e:
            return SandboxResult(ok=False, error_type="SandboxError", isolation=self.isolation,
                                 error=f"SandboxError: sandbox worker failed: {type(e).__name__}: {e}")
        finally:
            self._release(w, healthy)
        res = _classify(hdr, raw, limits)
        res.isolation = self.isolation
        _note_used(self.isolation)
        return res

    def run_function(self, source: str, func: str, args: list | None = None,
                     kwargs: dict | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
        req = {"kind": "function", "source": source, "func": func, "args": list(args or []),
               "kwargs": dict(kwargs or {})}
        _check_json(req)
        return self._run(req, limits or operator_limits())

    def run_code(self, source: str, stdin: str = "", limits: SandboxLimits | None = None
                 ) -> SandboxResult:
        return self._run({"kind": "code", "source": source, "stdin": stdin or ""},
                         limits or operator_limits())

    # -- reporting
    def isolation_report(self, probe: bool = True) -> dict:
        w = self._acquire(False)
        self._release(w, True)
        iso = dict(w.isolation)
        mode = iso.get("mode", "none")
        rep: dict = {
            "backend": "process",
            "mode": mode,
            "network": iso.get("network"),
            "filesystem": iso.get("filesystem"),
            "processes": iso.get("processes"),
            "privileges": iso.get("privileges"),
            "namespaces": [k[:-3] for k in ("user_ns", "mount_ns", "pid_ns", "net_ns", "ipc_ns",
                                            "uts_ns") if iso.get(k)],
            "proc": iso.get("proc"),
            "rlimits": ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_NOFILE",
                        "RLIMIT_CORE"],
            "wall_timeout": "enforced by the worker (SIGKILL of the call and all its processes)",
            "environment": "cleared: only PATH, HOME, TMPDIR, LANG, PYTHON* defaults",
            "audit_hook": (("on (network, writes outside the work dir"
                            + (", process spawning, ctypes" if mode != "namespaces" else "")
                            + "); a last layer, not a security boundary by itself")
                           if self.audit_hook else "off"),
            "pool": {"size": self.size, "warm_workers": sum(len(v) for v in self._idle.values())},
        }
        rep["isolation"] = self.isolation
        rep["memory"] = iso.get("memory")
        rep["seccomp"] = iso.get("seccomp")
        rep["ipc"] = ("a fresh IPC namespace per call (SysV/POSIX IPC objects die with the call)"
                      if mode == "namespaces" else "host IPC namespace (shared)")
        if mode != "namespaces":
            rep["degraded"] = ("isolation 'none-unsafe' requested explicitly: rlimits + seccomp + uid "
                               "drop + audit hook only, no kernel network/filesystem isolation")
        if probe:
            # evidence, not claims: hostile operations attempted with the audit hook OFF, so what
            # is reported is what the kernel-level layers alone do
            req = {"kind": "function", "source": _PROBE_SOURCE, "func": "probe", "args": [],
                   "kwargs": {}, "audit_hook": False}
            r = self._run(req, SandboxLimits(wall_seconds=10))
            rep["probe_kernel_only"] = r.value if r.ok else {"error": r.error}
        return rep

    # -- lifecycle
    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            ws = self._idle[False] + self._idle[True]
            self._idle = {False: [], True: []}
            self._count -= len(ws)
            self._cond.notify_all()
        for w in ws:
            w.close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


# probe run inside the sandbox by isolation_report(): evidence, not claims
_PROBE_SOURCE = r'''
import os, socket
def _try(f):
    try:
        r = f()
        return "ALLOWED" + (f" ({r})" if r is not None else "")
    except BaseException as e:
        return f"blocked: {type(e).__name__}: {e}"
def _connect(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((host, 80))
    finally:
        s.close()
def _write(path):
    with open(path, "w") as f:
        f.write("x")
    os.remove(path)
def probe():
    return {
        "uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
        "env_keys": sorted(os.environ),
        "connect_127.0.0.1:80": _try(lambda: _connect("127.0.0.1")),
        "connect_1.1.1.1:80": _try(lambda: _connect("1.1.1.1")),
        "write_/tmp": _try(lambda: _write("/tmp/.sandbox_probe")),
        "write_/": _try(lambda: _write("/.sandbox_probe")),
        "write_cwd": _try(lambda: _write("probe.txt")),
        "visible_pids": len([p for p in os.listdir("/proc") if p.isdigit()]) if os.path.isdir("/proc") else None,
    }
'''


def _check_json(req: dict) -> None:
    try:
        json.dumps(req)
    except (TypeError, ValueError) as e:
        raise TypeError(f"sandbox args/kwargs must be JSON-serializable: {e}") from e
