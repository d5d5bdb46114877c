"""The sandbox worker program: the request loop that runs inside the namespaces.

The host ships this file's source (with `confine.py`) to a fresh `python -I` process, which
execs it (see `pool._worker_program`): standard library only, no `toolkit` imports except the
relative one of `confine`. The worker confines itself (`confine.py`), then serves requests: each
call forks a child that drops privileges, applies rlimits, seccomp and the audit hook, and runs
the untrusted code (`_w_execute`, also used by the docker backend) with a wall timeout; afterwards
the worker kills every process the call left behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import sys
import time
from typing import Any

from .confine import (
    _CLONE_NEWIPC,
    _MNT_DETACH,
    _MS_NODEV,
    _MS_NOSUID,
    _PR_SET_CHILD_SUBREAPER,
    _SECCOMP_DENY,
    _SECCOMP_TEXT,
    _WORKDIR,
    Confinement,
    _w_audit_hook,
    _w_check,
    _w_drop_privileges,
    _w_enter_namespaces,
    _w_libc,
    _w_mount,
    _w_seccomp,
    _w_set_rlimits,
)

_FRAME = struct.Struct(">I")
_OUT_CAP = 1 << 20  # captured stdout / stderr bytes per call
_RES_CAP = 64 << 20  # result JSON bytes per call
_SANDBOX_FILE = "<sandbox>"

_PRELOAD = (
    "abc", "argparse", "array", "base64", "bisect", "calendar", "collections", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib",
    "heapq", "io", "itertools", "json", "math", "operator", "random", "re", "statistics",
    "string", "textwrap", "traceback", "types", "typing", "uuid", "unicodedata",
    "zoneinfo", "tempfile", "pathlib", "linecache", "gc", "resource", "socket", "subprocess",
    "threading", "signal", "sysconfig", "shutil", "glob", "fnmatch", "struct", "pprint",
)


def _w_write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _w_write_frame(fd: int, data: bytes) -> None:
    _w_write_all(fd, _FRAME.pack(len(data)) + data)


def _w_read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _w_read_frame(fd: int) -> bytes | None:
    head = _w_read_exact(fd, _FRAME.size)
    if head is None:
        return None
    return _w_read_exact(fd, _FRAME.unpack(head)[0])


def _w_format_exc(exc: BaseException, max_frames: int = 8) -> tuple[str, str]:
    """("Type", "Type: msg\\nTraceback ... (sandboxed frames only)")."""
    import traceback

    etype = type(exc).__name__
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = "<unprintable>"
    head = f"{etype}: {msg}" if msg else etype
    try:
        frames = traceback.extract_tb(exc.__traceback__)
        mine = [f for f in frames if f.filename == _SANDBOX_FILE] or list(frames)[-3:]
        lines = []
        for f in mine[-max_frames:]:
            lines.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}')
            if f.line:
                lines.append(f"    {f.line.strip()}")
        if lines:
            head += "\nTraceback (most recent call last):\n" + "\n".join(lines)
    except Exception:  # noqa: BLE001
        pass
    return etype, head


def _w_execute(req: dict) -> bytes:
    """Run one request in the current process; returns the result as JSON bytes.

    Result: {"ok": bool, "value": ..., "error": str|None, "error_type": str|None}.
    """
    import builtins
    import gc
    import json
    import linecache
    import sys
    import types

    kind = req.get("kind", "function")
    src = req.get("source") or ""
    modname = "__main__" if kind == "code" else "sandbox_module"
    mod = types.ModuleType(modname)
    mod.__file__ = _SANDBOX_FILE
    mod.__builtins__ = builtins
    sys.modules[modname] = mod
    linecache.cache[_SANDBOX_FILE] = (len(src), None, src.splitlines(True), _SANDBOX_FILE)

    def err(etype: str, text: str, **extra: Any) -> bytes:
        return json.dumps({"ok": False, "value": extra.get("value"), "error": text,
                           "error_type": etype}).encode()

    try:
        code = compile(src, _SANDBOX_FILE, "exec")
        if kind == "code":
            try:
                exec(code, mod.__dict__)  # noqa: S102
                exit_code: Any = 0
            except SystemExit as e:
                exit_code = e.code
                if exit_code is None:
                    exit_code = 0
                elif not isinstance(exit_code, int):
                    print(exit_code, file=sys.stderr)
                    exit_code = 1
            if exit_code == 0:
                return json.dumps({"ok": True, "value": 0}).encode()
            return err("SystemExit", f"SystemExit: {exit_code}", value=exit_code)
        exec(code, mod.__dict__)  # noqa: S102
        fname = req.get("func") or ""
        fn = mod.__dict__.get(fname)
        if fn is None or not callable(fn):
            return err("NameError", f"NameError: the source defines no function {fname!r}")
        value = fn(*(req.get("args") or []), **(req.get("kwargs") or {}))
        try:
            return json.dumps({"ok": True, "value": value}, ensure_ascii=False).encode("utf-8",
                                                                                       "surrogatepass")
        except (TypeError, ValueError, OverflowError, RecursionError) as e:
            return err("TypeError", f"TypeError: the return value of {fname}() is not "
                                    f"JSON-serializable: {e}")
    except MemoryError as e:
        e.__traceback__ = None
        del e
        gc.collect()
        mb = (req.get("limits") or {}).get("memory_mb")
        return err("MemoryError", f"MemoryError: memory limit exceeded ({mb} MB address space)")
    except SystemExit as e:
        return err("SystemExit", f"SystemExit: {e.code}")
    except BaseException as e:  # noqa: BLE001
        etype, text = _w_format_exc(e)
        if kind == "code":
            try:
                import traceback

                tb = e.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename != _SANDBOX_FILE:
                    tb = tb.tb_next
                traceback.print_exception(type(e), e, tb or e.__traceback__, file=sys.stderr)
            except Exception:  # noqa: BLE001
                pass
            return err(etype, text, value=1)
        return err(etype, text)


def _w_child(server: "_WServer", req: dict, work: str, fds: tuple[int, int, int, int]) -> None:
    """The forked call child: never returns."""
    import io
    import resource

    cfg = server.cfg
    rc = 70
    try:
        if cfg.memcg_fd is not None and not server._cg_write("cgroup.procs", "0"):
            raise OSError("could not join the per-call memory cgroup")
        os.setsid()
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        os.closerange(4, min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20))
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGXCPU, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if server.ns:  # a fresh IPC namespace per call: SysV/POSIX IPC objects die with the call
            _w_check(server.libc.unshare(_CLONE_NEWIPC), "unshare(CLONE_NEWIPC)")
        _w_drop_privileges(cfg, server.cap_last, server.libc)
        if os.geteuid() == 0 and not cfg.userns:
            raise PermissionError("refusing to run untrusted code as root (the uid drop did not happen)")
        if server.libc is not None:
            _w_seccomp(server.libc)
        os.chdir(work)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work,
                           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                           "PYTHONIOENCODING": "utf-8"})
        sys.argv = [_SANDBOX_FILE]
        sys.dont_write_bytecode = True
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False),
                                                     encoding="utf-8", errors="replace")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                                       encoding="utf-8", errors="backslashreplace")
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                                       encoding="utf-8", errors="backslashreplace",
                                                       line_buffering=True)
        import random
        import tempfile

        random.seed()
        tempfile.tempdir = None
        lim = req.get("limits") or {}
        _w_set_rlimits(lim)
        if cfg.audit_hook and req.get("audit_hook", True):
            sys.addaudithook(_w_audit_hook(work, bool(lim.get("network")),
                                           strict=cfg.mode != "namespaces"))
        raw = _w_execute(req)
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # noqa: BLE001
                pass
        _w_write_all(3, raw)
        rc = 0
    except BaseException as e:  # noqa: BLE001 - setup failure
        try:
            etype, text = _w_format_exc(e)
            _w_write_all(3, json.dumps({"ok": False, "error": "SandboxError: " + text,
                                        "error_type": etype}).encode())
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(rc)


class _WServer:
    """The request loop inside a worker."""

    def __init__(self, cfg: Confinement, info: dict, pin: int, pout: int, libc) -> None:
        self.cfg = cfg
        self.info = info
        self.pin = pin
        self.pout = pout
        self.libc = libc
        self.ns = cfg.mode == "namespaces"
        try:
            with open("/proc/sys/kernel/cap_last_cap") as f:
                self.cap_last = int(f.read())
        except (OSError, ValueError):
            self.cap_last = 40
        self.calls = 0
        if cfg.memcg_fd is not None and not self._cg_join_works():
            os.close(cfg.memcg_fd)
            cfg.memcg_fd = None
            info["memory"] = ("per process: RLIMIT_AS (a memory cgroup was created but a call "
                              "could not join it)")
        if not self.ns:
            import tempfile

            # refuse before creating anything: a refusal leaves no /tmp/toolkit-sandbox-* behind
            if os.geteuid() == 0 and cfg.uid is None:
                raise PermissionError("refusing to run untrusted code as root (no uid to drop to)")
            if os.geteuid() == 0 and not self._uid_can_read_python(cfg.uid):
                raise PermissionError(
                    f"refusing to run untrusted code as root: the unprivileged uid {cfg.uid} cannot "
                    f"read the Python installation ({os.path.dirname(os.__file__)}); install Python "
                    "where other users can read it, or use --sandbox-isolation namespaces|docker")
            self.base = tempfile.mkdtemp(prefix="toolkit-sandbox-")
            os.chmod(self.base, 0o711)
            info["workdir_base"] = self.base  # removed by the host if we get killed
            if libc is not None:
                libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    @staticmethod
    def _uid_can_read_python(uid: int) -> bool:
        import sysconfig

        paths = {os.path.dirname(os.__file__), sysconfig.get_paths().get("purelib", "")}
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                for p in paths:
                    if p:
                        os.listdir(p)
                os._exit(0)
            except BaseException:  # noqa: BLE001
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    # -- per-call memory cgroup (when the host could create one)
    def _cg_join_works(self) -> bool:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if self._cg_write("cgroup.procs", "0") else 1)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0

    def _cg_write(self, name: str, value: str) -> bool:
        fd = self.cfg.memcg_fd
        if fd is None:
            return False
        try:
            f = os.open(name, os.O_WRONLY, dir_fd=fd)
            try:
                os.write(f, value.encode())
            finally:
                os.close(f)
            return True
        except OSError:
            return False

    def _cg_oom_kills(self) -> int:
        fd = self.cfg.memcg_fd
        if fd is None:
            return 0
        name = "memory.events" if self.cfg.memcg.get("v") == "v2" else "memory.oom_control"
        try:
            f = os.open(name, os.O_RDONLY, dir_fd=fd)
            try:
                text = os.read(f, 4096).decode()
            finally:
                os.close(f)
            for line in text.splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def cg_limit(self, lim: dict) -> None:
        if self.cfg.memcg_fd is None:
            return
        mem = str(int(lim.get("memory_mb", 512)) << 20)
        if self.cfg.memcg.get("v") == "v2":
            self._cg_write("memory.max", mem)
            self._cg_write("memory.swap.max", "0")
        else:
            self._cg_write("memory.limit_in_bytes", mem)
            self._cg_write("memory.memsw.limit_in_bytes", mem)

    # -- per-call work dir
    def make_workdir(self, lim: dict) -> str:
        uid = self.cfg.uid
        size = max(32, int(lim.get("file_size_mb", 16)) * 4)
        if self.ns:
            opts = f"size={size}m,nr_inodes=16384,mode=700"
            if uid is not None and not self.cfg.userns:
                opts += f",uid={uid},gid={uid}"
            _w_mount(self.libc, "tmpfs", _WORKDIR, "tmpfs", _MS_NOSUID | _MS_NODEV, opts)
            return _WORKDIR
        self.calls += 1
        d = os.path.join(self.base, f"call-{self.calls}")
        os.mkdir(d, 0o700)
        if uid is not None and os.geteuid() == 0:
            os.chown(d, uid, uid)
        return d

    def drop_workdir(self, work: str) -> None:
        if self.ns:
            self.libc.umount2(work.encode(), _MNT_DETACH)
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)

    # -- kill everything a call left behind
    def kill_all(self) -> None:
        if self.ns and os.getpid() == 1:
            for _ in range(100):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    while True:
                        os.waitpid(-1, 0)
                except ChildProcessError:
                    pass
                try:
                    os.kill(-1, 0)
                except ProcessLookupError:
                    return
            return
        # plain mode: we are a child subreaper, so every orphan is re-parented to us
        for _ in range(1000):
            kids = self._children()
            if not kids:
                break
            for k in kids:
                try:
                    os.kill(k, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for k in kids:
                try:
                    os.waitpid(k, 0)
                except ChildProcessError:
                    pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass

    @staticmethod
    def _children() -> list[int]:
        out: list[int] = []
        try:
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
        except OSError:
            pass
        return out

    def handle(self, req: dict) -> tuple[dict, bytes]:
        lim = req.get("limits") or {}
        wall = float(lim.get("wall_seconds", 10))
        work = self.make_workdir(lim)
        stdin_data = (req.get("stdin") or "").encode("utf-8", "surrogateescape")
        try:
            sfd = os.memfd_create("sandbox-stdin")
        except (AttributeError, OSError):
            import tempfile

            sfd = os.dup(tempfile.TemporaryFile().fileno())
        _w_write_all(sfd, stdin_data)
        os.lseek(sfd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        self.cg_limit(lim)
        ooms = self._cg_oom_kills()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _w_child(self, req, work, (sfd, out_w, err_w, res_w))
        for fd in (sfd, out_w, err_w, res_w):
            os.close(fd)
        bufs = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
        caps = {out_r: _OUT_CAP, err_r: _OUT_CAP, res_r: _RES_CAP}
        over: set[int] = set()
        for fd in bufs:
            os.set_blocking(fd, False)
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        poller = select.poll()
        for fd in bufs:
            poller.register(fd, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        open_fds = set(bufs)
        killed = None
        deadline = t0 + wall

        def drain(fd: int) -> bool:
            """Read what is available; False at EOF."""
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    return True
                except OSError:
                    return False
                if not chunk:
                    return False
                b = bufs[fd]
                room = caps[fd] - len(b)
                if room > 0:
                    b += chunk[:room]
                if len(chunk) > room:
                    over.add(fd)

        exited = False
        while not exited:
            left = deadline - time.monotonic()
            if left <= 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed = "wall_timeout"
                break
            tmo = left if pidfd is not None else min(left, 0.005)
            for fd, _ev in poller.poll(max(1, int(tmo * 1000))):
                if fd == pidfd:
                    exited = True
                elif fd in open_fds and not drain(fd):
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if pidfd is None and not exited:
                try:
                    exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
                except ChildProcessError:
                    exited = True
        _, status, ru = os.wait4(pid, 0)
        t1 = time.monotonic()
        self.kill_all()
        for fd in bufs:
            os.set_blocking(fd, False)
            drain(fd)
            os.close(fd)
        if pidfd is not None:
            os.close(pidfd)
        self.drop_workdir(work)
        hdr = {
            "status": status,
            "killed": killed,
            "duration_s": t1 - t0,
            "cpu_s": ru.ru_utime + ru.ru_stime,
            "maxrss_kb": ru.ru_maxrss,
            "stdout": bytes(bufs[out_r]).decode("utf-8", "replace"),
            "stderr": bytes(bufs[err_r]).decode("utf-8", "replace"),
            "truncated": [n for n, fd in (("stdout", out_r), ("stderr", err_r), ("result", res_r))
                          if fd in over],
            "oom_killed": self._cg_oom_kills() > ooms,
        }
        return hdr, bytes(bufs[res_r])

    def exit(self, code: int) -> None:
        if not self.ns:
            import shutil

            self.kill_all()
            shutil.rmtree(self.base, ignore_errors=True)
        os._exit(code)

    def serve(self) -> None:
        while True:
            data = _w_read_frame(self.pin)
            if data is None:
                self.exit(0)
            req = json.loads(data)
            op = req.get("op", "run")
            if op == "ping":
                _w_write_frame(self.pout, json.dumps({"pong": True, "pid": os.getpid()}).encode())
                _w_write_frame(self.pout, b"")
                continue
            try:
                hdr, raw = self.handle(req)
            except Exception as e:  # noqa: BLE001 - report, then let the host replace us
                hdr, raw = {"fatal": f"{type(e).__name__}: {e}"}, b""
                _w_write_frame(self.pout, json.dumps(hdr).encode())
                _w_write_frame(self.pout, raw)
                self.exit(3)
            _w_write_frame(self.pout, json.dumps(hdr).encode())
            _w_write_frame(self.pout, raw)


def _w_main(argv: list[str]) -> None:
    cfg = Confinement.from_json(argv[0])
    pin, pout = os.dup(0), os.dup(1)
    nul = os.open(os.devnull, os.O_RDWR)
    os.dup2(nul, 0)
    os.dup2(nul, 1)
    if not cfg.debug:
        os.dup2(nul, 2)
    os.close(nul)
    import importlib

    for m in list(_PRELOAD) + list(cfg.preload):
        try:
            importlib.import_module(m)
        except Exception:  # noqa: BLE001
            pass
    info: dict = {"mode": "none"}
    libc = None
    memcg = cfg.memcg
    cfg.memcg_fd = None
    if memcg.get("dir"):
        try:  # kept open across pivot_root: the per-call memory cgroup
            cfg.memcg_fd = os.open(memcg["dir"], os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            cfg.memcg_fd = None
    info["memory"] = (
        f"per call: a memory cgroup ({memcg.get('v')}) capped at memory_mb for all of the call's "
        "processes and its tmpfs pages, plus RLIMIT_AS per process" if cfg.memcg_fd is not None
        else "per process: RLIMIT_AS (no writable memory cgroup here, so a call's processes each get "
             "memory_mb)")
    try:
        try:
            libc = _w_libc()
        except OSError:
            libc = None
        if cfg.mode == "namespaces":
            if libc is None or not sys.platform.startswith("linux"):
                raise OSError("namespaces need Linux and ctypes")
            _w_enter_namespaces(cfg, info, pin, pout)
            cfg.userns = info.get("user_ns", False)
        else:
            info["network"] = ("host network (limits.network=True)" if cfg.network else
                               "NOT isolated by the kernel: only the audit hook blocks socket use")
            info["filesystem"] = ("NOT isolated by the kernel: per-call temp dir as cwd; the audit "
                                  "hook blocks Python-level writes outside it"
                                  + ("; runs as an unprivileged uid" if os.geteuid() == 0 else ""))
            info["processes"] = "shared pid namespace; leftover processes killed via child subreaper"
        server = _WServer(cfg, info, pin, pout, libc)
    except BaseException as e:  # noqa: BLE001
        _w_write_frame(pout, json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}",
                                         "isolation": info}).encode())
        os._exit(1)
    info["privileges"] = (
        f"call children run as uid {cfg.uid} (unprivileged), empty capability bounding set, "
        "no_new_privs" if os.geteuid() == 0 and cfg.uid is not None and not cfg.userns
        else "call children run as namespace-root with all capabilities dropped, no_new_privs"
        if cfg.userns else f"call children keep uid {os.geteuid()}"
        + (" with all capabilities dropped (securebits locked), no_new_privs"
           if os.geteuid() == 0 and libc is not None else ""))
    import platform

    info["seccomp"] = (_SECCOMP_TEXT
                       if libc is not None and platform.machine() in _SECCOMP_DENY
                       else f"not installed (no filter for {platform.machine()})")
    import gc

    gc.collect()
    gc.freeze()
    _w_write_frame(pout, json.dumps({"ready": True, "isolation": info, "pid": os.getpid()}).encode())
    server.serve()
