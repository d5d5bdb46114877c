"""Sandbox for untrusted code (LLM-generated verifiers and generated tool code).

Backends
--------
``process`` (the default, also what ``auto`` means unless ``set_default_backend`` / the
``TOOLKIT_SANDBOX`` env var says otherwise): a pool of warm *zygote* workers. Each worker is a
Python process started once with an empty environment; on Linux, when the kernel lets us, it
enters fresh mount, pid, network, ipc and uts namespaces (plus a user namespace when not root),
``pivot_root``\\s into a read-only tmpfs that holds only read-only binds of the system and Python
directories, and then serves requests. Each request forks a child that

* gets a fresh, size-limited tmpfs mounted at ``/sandbox`` as its working directory,
* drops to an unprivileged uid unique to the worker (root host) or drops every capability
  (user-namespace mode), sets ``no_new_privs``,
* applies RLIMIT_CPU / RLIMIT_AS / RLIMIT_FSIZE / RLIMIT_NPROC (+ NOFILE, CORE),
* gets a cleared environment (PATH, HOME, TMPDIR, LANG only),
* installs an audit hook (network and writes outside the work dir) as a last layer,
* executes the code and returns a JSON result over a pipe.

The worker enforces the wall timeout and, after every call, kills every process the call left
behind (``kill(-1)`` from pid 1 of the private pid namespace). When namespaces are unavailable the
pool refuses (``SandboxUnavailable``) unless isolation "none-unsafe" was chosen explicitly.

``docker``: runs each call in a throw-away container through the ``docker`` SDK (optional extra).
If the SDK is missing or no engine is reachable, ``SandboxUnavailable`` is raised.

Public API: ``SandboxLimits``, ``SandboxResult``, ``run_function``, ``run_code``,
``isolation_report``, ``SandboxPool``, ``SandboxError``, ``SandboxUnavailable``,
``set_default_backend``, ``default_pool``.

This file is also the worker program: the host runs ``python -I -c <this source>
--sandbox-worker <config>``, so everything above the host section only uses the standard library.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxError",
    "SandboxUnavailable",
    "SandboxPool",
    "run_function",
    "run_code",
    "isolation_report",
    "default_pool",
    "set_default_backend",
    "set_default_isolation",
    "set_operator_limits",
    "operator_limits",
    "clamp_limits",
    "parse_limits",
    "check_limits",
    "normalize_isolation",
    "used_isolation",
    "ISOLATIONS",
    "docker_status",
]


@dataclass
class SandboxLimits:
    cpu_seconds: float = 5
    wall_seconds: float = 10
    memory_mb: int = 512
    file_size_mb: int = 16
    max_processes: int = 32
    network: bool = False


@dataclass
class SandboxResult:
    ok: bool
    value: Any = None
    # e.g. "TimeoutError: wall time 10s exceeded", "MemoryError: ...", or "Type: msg" + short traceback
    error: str | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    killed: str | None = None  # "wall_timeout" | "cpu_limit" | "memory" | signal name
    error_type: str | None = None  # exception class name when the code raised
    isolation: str | None = None  # "namespaces" | "docker" | "none-unsafe": what the code ran under


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code running in it)."""


class SandboxUnavailable(SandboxError):
    """The requested sandbox backend cannot be used on this machine."""


# ==============================================================================================
# Worker side. Runs inside the zygote (and, for _w_execute & friends, inside docker containers).
# Standard library only.

_FRAME = struct.Struct(">I")
_OUT_CAP = 1 << 20  # captured stdout / stderr bytes per call
_RES_CAP = 64 << 20  # result JSON bytes per call
_WORKDIR = "/sandbox"
_SANDBOX_FILE = "<sandbox>"

# linux constants
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOATIME = 1024
_MS_NODIRATIME = 2048
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_RELATIME = 1 << 21
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

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


def _w_libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _w_check(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _w_mount(libc, src: str | None, tgt: str, fstype: str | None, flags: int,
             data: str | None = None) -> None:
    import ctypes

    ret = libc.mount(src.encode() if src else None, tgt.encode(),
                     fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                     data.encode() if data else None)
    _w_check(ret, f"mount({src!r}, {tgt!r}, {fstype!r})")


def _w_statvfs_flags(path: str) -> int:
    """Mount flags that must be preserved (they may be locked) when remounting a bind."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
                   (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME),
                   (getattr(os, "ST_RELATIME", 4096), _MS_RELATIME)):
        if f & st:
            out |= ms
    return out


def _w_build_root(cfg: dict, info: dict, libc) -> None:
    """In the new mount namespace: build a read-only root and pivot into it."""
    _w_mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    binds = [p for p in cfg.get("binds", []) if os.path.isdir(p)]
    cands = ["/mnt", "/media", "/srv", "/opt", "/boot", "/tmp", "/var/tmp"]
    nr = None
    for c in cands:
        if os.path.isdir(c) and not os.path.islink(c) and not any(
                b == c or b.startswith(c + "/") for b in binds):
            nr = c
            break
    if nr is None:
        raise OSError("no directory available to build the sandbox root on")
    _w_mount(libc, "tmpfs", nr, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4m,nr_inodes=8192,mode=755")
    for p in binds:
        dst = nr + p
        os.makedirs(dst, exist_ok=True)
        _w_mount(libc, p, dst, None, _MS_BIND)
        _w_mount(libc, None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                 | _w_statvfs_flags(p))
    for path, target in cfg.get("symlinks", []):
        dst = nr + path
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.lexists(dst):
            os.symlink(target, dst)
    # minimal /dev
    os.makedirs(nr + "/dev", exist_ok=True)
    _w_mount(libc, "tmpfs", nr + "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=755")
    devs = []
    for name in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists("/dev/" + name):
            fd = os.open(nr + "/dev/" + name, os.O_CREAT | os.O_WRONLY, 0o666)
            os.close(fd)
            _w_mount(libc, "/dev/" + name, nr + "/dev/" + name, None, _MS_BIND)
            devs.append(name)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, nr + "/dev/" + name)
    os.makedirs(nr + "/dev/shm", exist_ok=True)
    _w_mount(libc, None, nr + "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    # /proc for the private pid namespace
    os.makedirs(nr + "/proc", exist_ok=True)
    try:
        _w_mount(libc, "proc", nr + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        info["proc"] = "private /proc (shows only the sandbox pid namespace)"
    except OSError as e:
        info["proc"] = f"not mounted ({e})"
    for d in ("/tmp", _WORKDIR, "/root", "/home"):
        os.makedirs(nr + d, mode=0o755, exist_ok=True)
    # pivot_root(".", ".") then detach the old root
    import platform

    os.chdir(nr)
    nr_syscall = _SYS_PIVOT_ROOT.get(platform.machine())
    pivoted = False
    if nr_syscall is not None:
        if libc.syscall(nr_syscall, b".", b".") == 0:
            _w_check(libc.umount2(b".", _MNT_DETACH), "umount2(old root)")
            pivoted = True
    if not pivoted:
        os.chroot(".")
    os.chdir("/")
    _w_mount(libc, None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    info["filesystem"] = (
        f"{'pivot_root' if pivoted else 'chroot'} into a read-only tmpfs root; visible read-only: "
        f"{', '.join(binds)}; /dev: {', '.join(devs)}; writable: a fresh per-call tmpfs at "
        f"{_WORKDIR} (cwd, HOME, TMPDIR); /tmp and everything else read-only")
    info["root_binds"] = binds


def _w_enter_namespaces(cfg: dict, info: dict, pin: int, pout: int) -> None:
    """unshare + fork; returns in the inner process (pid 1 of the new pid namespace)."""
    import errno

    libc = _w_libc()
    userns = os.geteuid() != 0
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    if not cfg.get("network"):
        flags |= _CLONE_NEWNET
    if userns:
        flags |= _CLONE_NEWUSER
    if cfg.get("_test_fail_unshare"):
        raise PermissionError(errno.EPERM, "unshare: Operation not permitted (simulated)")
    uid, gid = os.geteuid(), os.getegid()
    _w_check(libc.unshare(flags), "unshare")
    if userns:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    info.update({"user_ns": userns, "mount_ns": True, "pid_ns": True, "ipc_ns": True,
                 "uts_ns": True, "net_ns": not cfg.get("network")})
    pid = os.fork()
    if pid:  # outer: just mirror the inner's exit
        os.close(pin)
        os.close(pout)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        libc.sethostname(b"sandbox", 7)
    except Exception:  # noqa: BLE001
        pass
    _w_build_root(cfg, info, libc)
    if not cfg.get("network"):
        import socket

        try:
            ifs = [n for _, n in socket.if_nameindex()]
        except OSError:
            ifs = []
        info["network"] = (f"none: private network namespace (interfaces: {', '.join(ifs) or '-'}, "
                           f"all down; no route to any address, loopback included)")
    else:
        info["network"] = "host network (limits.network=True)"
    info["processes"] = ("private pid namespace; the worker is pid 1 and kills every process a "
                         "call leaves behind")
    info["mode"] = "namespaces"


def _w_drop_privileges(cfg: dict, cap_last: int, libc) -> str:
    """Irreversibly drop privileges in the call child. Returns a description."""
    import ctypes

    uid = cfg.get("uid")
    if os.geteuid() == 0 and uid is not None and not cfg.get("userns"):
        if libc is not None:
            for cap in range(cap_last + 1):
                libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        desc = f"uid/gid {uid} (unprivileged, no capabilities, empty bounding set)"
    elif os.geteuid() == 0 and libc is not None:  # uid 0 inside a user namespace
        libc.prctl(_PR_SET_SECUREBITS, 0xEF, 0, 0, 0)  # NOROOT|NO_SETUID_FIXUP|... all locked
        for cap in range(cap_last + 1):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

        class _Hdr(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class _Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        hdr = _Hdr(0x20080522, 0)
        data = (_Data * 2)()
        _w_check(libc.capset(ctypes.byref(hdr), ctypes.byref(data)), "capset")
        desc = "namespace uid 0 with every capability dropped (securebits locked)"
    else:
        desc = f"uid {os.geteuid()} (unchanged: not root, no user namespace)"
    if libc is not None:
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        desc += ", no_new_privs"
    return desc


def _w_set_rlimits(lim: dict) -> None:
    import math
    import resource

    cpu = max(1, int(math.ceil(float(lim.get("cpu_seconds", 5)))))
    mem = int(lim.get("memory_mb", 512)) << 20
    fsz = int(lim.get("file_size_mb", 16)) << 20
    nproc = max(1, int(lim.get("max_processes", 32)))

    def setl(res: int, soft: int, hard: int) -> None:
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            resource.setrlimit(res, (soft, soft))

    setl(resource.RLIMIT_CORE, 0, 0)
    setl(resource.RLIMIT_NOFILE, 256, 256)
    setl(resource.RLIMIT_NPROC, nproc, nproc)
    setl(resource.RLIMIT_FSIZE, fsz, fsz)
    setl(resource.RLIMIT_AS, mem, mem)
    if hasattr(resource, "RLIMIT_MSGQUEUE"):  # POSIX message queues: bytes per uid
        setl(resource.RLIMIT_MSGQUEUE, 1 << 16, 1 << 16)
    setl(resource.RLIMIT_CPU, cpu, cpu + 1)


# seccomp: syscalls that create memory no rlimit counts (memfd, SysV shm / message queues) are
# refused with EPERM; so are new user namespaces (in one, a process has every capability again:
# it could configure its own network stack, mount filesystems, reach kernel code that needs
# CAP_SYS_ADMIN): unshare/clone with CLONE_NEWUSER and setns get EPERM, clone3 (whose flags sit in
# memory seccomp cannot read) gets ENOSYS so that libc falls back to clone. On x86_64 the x32 ABI
# and any foreign architecture (int 0x80) are refused too.
_SECCOMP_DENY = {"x86_64": (0xC000003E, (319, 447, 29, 68)),   # memfd_create, memfd_secret, shmget, msgget
                 "aarch64": (0xC00000B7, (279, 447, 194, 186))}
# (unshare, clone, clone3, setns) per architecture
_SECCOMP_NS = {"x86_64": (272, 56, 435, 308), "aarch64": (97, 220, 435, 268)}
_SECCOMP_TEXT = ("memfd_create, memfd_secret, shmget, msgget, setns and unshare/clone with CLONE_NEWUSER "
                 "refused (EPERM), clone3 refused (ENOSYS: libc falls back to clone); foreign ABIs refused")
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def _w_seccomp_prog(arch: str) -> list[tuple[int, int, int, int]] | None:
    """The BPF program (code, jt, jf, k) of the deny filter for `arch`, or None."""
    spec, ns = _SECCOMP_DENY.get(arch), _SECCOMP_NS.get(arch)
    if spec is None or ns is None:
        return None
    audit_arch, nrs = spec
    nr_unshare, nr_clone, nr_clone3, nr_setns = ns
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # RET_ALLOW, RET_ERRNO|errno
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ/JGE/JSET|K, RET|K
    # assembled with symbolic jump targets: ("L", name) marks a label, jumps name labels
    src: list = [(ld, None, None, 4), (jeq, None, "DENY", audit_arch), (ld, None, None, 0)]
    if arch == "x86_64":
        src.append((jge, "DENY", None, 0x40000000))  # the x32 ABI
    for nr in tuple(nrs) + (nr_setns,):
        src.append((jeq, "DENY", None, nr))
    src += [(jeq, "NOSYS", None, nr_clone3), (jeq, "FLAGS", None, nr_unshare), (jeq, "FLAGS", None, nr_clone),
            (ret, None, None, allow),
            ("L", "FLAGS"), (ld, None, None, 16),  # args[0], low 32 bits (flags of unshare / clone)
            (jset, "DENY", None, 0x10000000), (ret, None, None, allow),  # CLONE_NEWUSER
            ("L", "NOSYS"), (ret, None, None, enosys),
            ("L", "DENY"), (ret, None, None, eperm)]
    labels: dict[str, int] = {}
    prog: list = []
    for ins in src:
        if ins[0] == "L":
            labels[ins[1]] = len(prog)
        else:
            prog.append(ins)
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = 0 if jt is None else labels[jt] - i - 1
        jf = 0 if jf is None else labels[jf] - i - 1
        out.append((code, jt, jf, k))
    return out


def _w_seccomp(libc) -> str:
    """Install the deny filter in the current process (needs no_new_privs). Returns a description."""
    import ctypes
    import platform

    arch = platform.machine()
    prog = _w_seccomp_prog(arch)
    if prog is None or libc is None:
        return f"not installed (no filter for {arch})"

    class _Filt(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint32)]

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filt))]

    arr = (_Filt * len(prog))(*[_Filt(*x) for x in prog])
    fprog = _Prog(len(prog), ctypes.cast(arr, ctypes.POINTER(_Filt)))
    _w_check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")
    return _SECCOMP_TEXT


def _w_audit_hook(work: str, network: bool, strict: bool):
    """Last-layer audit hook: blocks network and writes outside `work` (and, when `strict`,
    process spawning and ctypes, which could bypass the hook)."""
    workp = os.path.realpath(work)
    realpath = os.path.realpath
    fsdecode = os.fsdecode
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    allowed = ("/dev/null",)
    path_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                   "os.chmod", "os.chown", "os.truncate", "os.utime", "os.mkfifo", "os.mknod",
                   "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree"}
    net_events = {"socket.connect", "socket.sendto", "socket.sendmsg", "socket.bind",
                  "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"}
    spawn_prefixes = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                      "os.fork", "os.forkpty", "pty.spawn", "ctypes.", "os.startfile")

    def inside(p: Any) -> bool:
        if isinstance(p, int):
            return True
        try:
            rp = realpath(fsdecode(p))
        except Exception:  # noqa: BLE001
            return False
        return rp == workp or rp.startswith(workp + "/") or rp in allowed

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None:
                return
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & wflags)
            if write and not inside(path):
                raise PermissionError(f"sandbox: writing outside the work dir is not allowed: {path}")
        elif event in path_events:
            for a in args[:2]:
                if isinstance(a, (str, bytes, os.PathLike)) and not inside(a):
                    raise PermissionError(f"sandbox: {event} outside the work dir is not allowed: {a}")
        elif event == "sqlite3.connect":  # sqlite opens its files in C: no "open" event
            db = args[0] if args else None
            if isinstance(db, (bytes, os.PathLike)):
                db = fsdecode(db)
            if isinstance(db, str) and db not in ("", ":memory:"):
                path, _, query = db.partition("?")
                if path.startswith("file:"):
                    path = path[5:]
                    if path.startswith("//"):
                        path = "/" + path[2:].partition("/")[2]
                    if path in ("", ":memory:") or "mode=memory" in query or "mode=ro" in query:
                        return
                if not inside(path):
                    raise PermissionError(f"sandbox: sqlite3.connect outside the work dir is not allowed: {db}")
        elif event in net_events:
            if not network:
                if event == "socket.bind" and args and len(args) > 1 and isinstance(args[1], str):
                    if inside(args[1]):  # AF_UNIX socket in the work dir
                        return
                raise PermissionError(f"sandbox: network access is disabled ({event})")
        elif strict and event.startswith(spawn_prefixes):
            raise PermissionError(f"sandbox: {event} is not allowed without kernel isolation")

    return hook


def _w_child(server: "_WServer", req: dict, work: str, fds: tuple[int, int, int, int]) -> None:
    """The forked call child: never returns."""
    import io
    import resource

    cfg = server.cfg
    rc = 70
    try:
        if cfg.get("_memcg_fd") is not None and not server._cg_write("cgroup.procs", "0"):
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
        if os.geteuid() == 0 and not cfg.get("userns"):
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
        if cfg.get("audit_hook", True) and req.get("audit_hook", True):
            sys.addaudithook(_w_audit_hook(work, bool(lim.get("network")),
                                           strict=cfg.get("mode") != "namespaces"))
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

    def __init__(self, cfg: dict, info: dict, pin: int, pout: int, libc) -> None:
        self.cfg = cfg
        self.info = info
        self.pin = pin
        self.pout = pout
        self.libc = libc
        self.ns = cfg.get("mode") == "namespaces"
        try:
            with open("/proc/sys/kernel/cap_last_cap") as f:
                self.cap_last = int(f.read())
        except (OSError, ValueError):
            self.cap_last = 40
        self.calls = 0
        if cfg.get("_memcg_fd") is not None and not self._cg_join_works():
            os.close(cfg["_memcg_fd"])
            cfg["_memcg_fd"] = None
            info["memory"] = ("per process: RLIMIT_AS (a memory cgroup was created but a call "
                              "could not join it)")
        if not self.ns:
            import tempfile

            # refuse before creating anything: a refusal leaves no /tmp/toolkit-sandbox-* behind
            if os.geteuid() == 0 and cfg.get("uid") is None:
                raise PermissionError("refusing to run untrusted code as root (no uid to drop to)")
            if os.geteuid() == 0 and not self._uid_can_read_python(cfg["uid"]):
                raise PermissionError(
                    f"refusing to run untrusted code as root: the unprivileged uid {cfg['uid']} cannot "
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
        fd = self.cfg.get("_memcg_fd")
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
        fd = self.cfg.get("_memcg_fd")
        if fd is None:
            return 0
        name = "memory.events" if (self.cfg.get("memcg") or {}).get("v") == "v2" else "memory.oom_control"
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
        if self.cfg.get("_memcg_fd") is None:
            return
        mem = str(int(lim.get("memory_mb", 512)) << 20)
        if (self.cfg.get("memcg") or {}).get("v") == "v2":
            self._cg_write("memory.max", mem)
            self._cg_write("memory.swap.max", "0")
        else:
            self._cg_write("memory.limit_in_bytes", mem)
            self._cg_write("memory.memsw.limit_in_bytes", mem)

    # -- per-call work dir
    def make_workdir(self, lim: dict) -> str:
        uid = self.cfg.get("uid")
        size = max(32, int(lim.get("file_size_mb", 16)) * 4)
        if self.ns:
            opts = f"size={size}m,nr_inodes=16384,mode=700"
            if uid is not None and not self.cfg.get("userns"):
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
    cfg = json.loads(argv[0])
    pin, pout = os.dup(0), os.dup(1)
    nul = os.open(os.devnull, os.O_RDWR)
    os.dup2(nul, 0)
    os.dup2(nul, 1)
    if not cfg.get("debug"):
        os.dup2(nul, 2)
    os.close(nul)
    import importlib

    for m in list(_PRELOAD) + list(cfg.get("preload") or []):
        try:
            importlib.import_module(m)
        except Exception:  # noqa: BLE001
            pass
    info: dict = {"mode": "none"}
    libc = None
    memcg = cfg.get("memcg") or {}
    cfg["_memcg_fd"] = None
    if memcg.get("dir"):
        try:  # kept open across pivot_root: the per-call memory cgroup
            cfg["_memcg_fd"] = os.open(memcg["dir"], os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            cfg["_memcg_fd"] = None
    info["memory"] = (
        f"per call: a memory cgroup ({memcg.get('v')}) capped at memory_mb for all of the call's "
        "processes and its tmpfs pages, plus RLIMIT_AS per process" if cfg["_memcg_fd"] is not None
        else "per process: RLIMIT_AS (no writable memory cgroup here, so a call's processes each get "
             "memory_mb)")
    try:
        try:
            libc = _w_libc()
        except OSError:
            libc = None
        if cfg.get("mode") == "namespaces":
            if libc is None or not sys.platform.startswith("linux"):
                raise OSError("namespaces need Linux and ctypes")
            _w_enter_namespaces(cfg, info, pin, pout)
            cfg["userns"] = info.get("user_ns", False)
        else:
            info["network"] = ("host network (limits.network=True)" if cfg.get("network") else
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
        f"call children run as uid {cfg['uid']} (unprivileged), empty capability bounding set, "
        "no_new_privs" if os.geteuid() == 0 and cfg.get("uid") is not None and not cfg.get("userns")
        else "call children run as namespace-root with all capabilities dropped, no_new_privs"
        if cfg.get("userns") else f"call children keep uid {os.geteuid()}"
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


# ==============================================================================================
# Host side

_SOURCE: str | None = None
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


def _worker_source() -> str:
    global _SOURCE
    if _SOURCE is None:
        try:
            with open(os.path.abspath(__file__), encoding="utf-8") as f:
                _SOURCE = f.read()
        except OSError:
            import inspect

            _SOURCE = inspect.getsource(sys.modules[__name__])
    return _SOURCE


_MEMCG_PARENT: tuple | None = None


def _memcg_parent() -> tuple[str, str] | None:
    """A memory cgroup directory we may create children in: (dir, "v1"|"v2"), or None."""
    global _MEMCG_PARENT
    if _MEMCG_PARENT is not None:
        return _MEMCG_PARENT or None
    found: tuple = ()
    if os.environ.get("TOOLKIT_SANDBOX_CGROUP", "1") != "0" and sys.platform.startswith("linux"):
        try:
            with open("/proc/self/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
            if "memory" in ctrls.split(","):
                d = "/sys/fs/cgroup/memory" + path.rstrip("/")
                if os.path.isfile(os.path.join(d, "memory.limit_in_bytes")) and os.access(d, os.W_OK):
                    found = (d, "v1")
                    break
            elif hid == "0" and ctrls == "":
                d = "/sys/fs/cgroup" + path.rstrip("/")
                try:
                    with open(os.path.join(d, "cgroup.subtree_control")) as f:
                        ok = "memory" in f.read().split()
                except OSError:
                    ok = False
                if ok and os.access(d, os.W_OK):
                    found = (d, "v2")
    _MEMCG_PARENT = found
    return found or None


def _make_memcg(name: str) -> dict | None:
    parent = _memcg_parent()
    if parent is None:
        return None
    d = os.path.join(parent[0], name)
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    except OSError:
        return None
    return {"dir": d, "v": parent[1]}


def _remove_memcg(memcg: dict | None) -> None:
    if memcg and memcg.get("dir") and os.path.basename(memcg["dir"]).startswith("toolkit-sandbox-"):
        for _ in range(50):
            try:
                os.rmdir(memcg["dir"])
                return
            except FileNotFoundError:
                return
            except OSError:  # still has a dying process in it
                time.sleep(0.02)


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
    def __init__(self, cfg: dict, start_timeout: float) -> None:
        self.cfg = cfg
        self.network = bool(cfg.get("network"))
        self.lock = threading.Lock()
        # the worker program (this file) arrives as the first frame on stdin
        argv = [sys.executable, "-I", "-X", "utf8", "-c", _BOOTSTRAP, "--sandbox-worker",
                json.dumps(cfg)]
        debug = bool(cfg.get("debug"))
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=None if debug else subprocess.DEVNULL,
                                         env=_clean_env(), cwd="/", close_fds=True,
                                         start_new_session=True, bufsize=0)
        except OSError as e:
            _remove_memcg(cfg.get("memcg"))
            raise SandboxError(f"cannot start a sandbox worker ({sys.executable}): {e}") from e
        self.rfd = self.proc.stdout.fileno()
        self.wfd = self.proc.stdin.fileno()
        try:
            _w_write_frame(self.wfd, _worker_source().encode("utf-8"))
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
        _remove_memcg(self.cfg.get("memcg"))
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


ISOLATIONS = ("namespaces", "docker", "none-unsafe")


def normalize_isolation(name: str | None) -> str:
    """"namespaces" | "docker" | "none-unsafe" ("auto" and "" mean "namespaces": never a silent
    downgrade). "none" is refused: running generated code unisolated must be spelled out."""
    n = (name or "namespaces").strip().lower()
    if n in ("auto", "namespaces", "ns", "process"):
        return "namespaces"
    if n in ("docker", "none-unsafe"):
        return n
    if n in ("none", "off", "no"):
        raise ValueError(f"sandbox isolation {name!r}: to run generated code WITHOUT kernel isolation "
                         "say so explicitly with 'none-unsafe'")
    raise ValueError(f"unknown sandbox isolation {name!r}; use {'|'.join(ISOLATIONS)}")


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
        self._extra_cfg: dict = {}

    # -- workers
    def _cfg(self, mode: str, network: bool) -> dict:
        binds, links = _compute_binds(self.ro_paths)
        uid = _next_uid() if os.geteuid() == 0 else None
        cfg = {"mode": mode, "network": network, "binds": binds, "symlinks": links, "uid": uid,
               "preload": self.preload, "audit_hook": self.audit_hook, "debug": self.debug,
               "memcg": _make_memcg(f"toolkit-sandbox-{os.getpid()}-{uid or _next_uid()}")}
        cfg.update(self._extra_cfg)
        return cfg

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


# ----------------------------------------------------------------------------------------------
# default pool, backend selection

_DEFAULT_POOL: SandboxPool | None = None
_DEFAULT_LOCK = threading.Lock()
_DEFAULT_BACKEND = os.environ.get("TOOLKIT_SANDBOX", "process") or "process"


_DEFAULT_ISOLATION: str | None = None  # set_default_isolation(); else $TOOLKIT_SANDBOX_ISOLATION
_USED: set[str] = set()


def _default_isolation() -> str:
    return normalize_isolation(_DEFAULT_ISOLATION or os.environ.get("TOOLKIT_SANDBOX_ISOLATION")
                               or "namespaces")


def set_default_isolation(name: str | None) -> str:
    """The isolation generated code runs under (`--sandbox-isolation`, recipe `sandbox_isolation`):
    "namespaces" (default), "docker" (the docker backend) or "none-unsafe" (explicit opt-out)."""
    global _DEFAULT_ISOLATION
    _DEFAULT_ISOLATION = normalize_isolation(name) if name else None
    return _default_isolation()


# ----------------------------------------------------------------------------------------------
# operator limits: the ceiling for everything a record asks for

# the largest value any limit may take (a day, 1 TiB, 4096 processes): larger values are refused
# here rather than overflowing a timeout or an rlimit in the worker
LIMIT_MAX = {"cpu_seconds": 86400.0, "wall_seconds": 86400.0, "memory_mb": 1 << 20,
             "file_size_mb": 1 << 20, "max_processes": 4096}
_INT_LIMITS = ("memory_mb", "file_size_mb", "max_processes")
_OPERATOR_LIMITS: SandboxLimits | None = None  # set_operator_limits(); else $TOOLKIT_SANDBOX_LIMITS


def _limit_value(key: str, v: Any) -> float | int:
    """A valid value of a numeric limit, or ValueError saying why not."""
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{key}: expected a number, got {v!r}")
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{key}: expected a positive finite number, got {v!r}")
    if v > LIMIT_MAX[key]:
        raise ValueError(f"{key}: {v!r} is above the maximum {LIMIT_MAX[key]}")
    return max(1, int(v)) if key in _INT_LIMITS else float(v)


def check_limits(limits: SandboxLimits) -> SandboxLimits:
    """`limits` with every value valid (ValueError naming the field otherwise)."""
    out = SandboxLimits()
    for k in LIMIT_MAX:
        setattr(out, k, _limit_value(k, getattr(limits, k)))
    if not isinstance(limits.network, bool):
        raise ValueError(f"network: expected true or false, got {limits.network!r}")
    out.network = limits.network
    return out


def parse_limits(value: Any, base: SandboxLimits | None = None) -> SandboxLimits:
    """Operator limits from a mapping or a JSON object string (`--sandbox-limits`, recipe key
    `sandbox_limits`, env TOOLKIT_SANDBOX_LIMITS): keys of SandboxLimits; unset keys keep `base`
    (default: the built-in defaults). Strict: ValueError on anything invalid."""
    out = SandboxLimits(**asdict(base)) if base is not None else SandboxLimits()
    if value is None or value == "":
        return out
    if isinstance(value, SandboxLimits):
        return check_limits(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"sandbox limits: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"sandbox limits: expected an object like {{\"memory_mb\": 512}}, got {value!r}")
    for k, v in value.items():
        if k == "network":
            if not isinstance(v, bool):
                raise ValueError(f"sandbox limits: network: expected true or false, got {v!r}")
            out.network = v
        elif k in LIMIT_MAX:
            try:
                setattr(out, k, _limit_value(k, v))
            except ValueError as e:
                raise ValueError(f"sandbox limits: {e}") from None
        else:
            raise ValueError(f"sandbox limits: unknown key {k!r} (known: {', '.join(list(LIMIT_MAX) + ['network'])})")
    return out


def operator_limits() -> SandboxLimits:
    """The operator's limits: `set_operator_limits(...)`, else $TOOLKIT_SANDBOX_LIMITS (JSON), else
    the SandboxLimits defaults. Generated code gets these unless a record narrows them."""
    if _OPERATOR_LIMITS is not None:
        return SandboxLimits(**asdict(_OPERATOR_LIMITS))
    try:
        return parse_limits(os.environ.get("TOOLKIT_SANDBOX_LIMITS"))
    except ValueError as e:
        raise SandboxError(f"TOOLKIT_SANDBOX_LIMITS: {e}") from None


def set_operator_limits(value: Any) -> SandboxLimits:
    """Set the operator's limits (`--sandbox-limits`, recipe `sandbox_limits`); None resets to the
    environment / defaults. ValueError on an invalid value."""
    global _OPERATOR_LIMITS
    _OPERATOR_LIMITS = None if value is None else parse_limits(value)
    return operator_limits()


def clamp_limits(requested: Any, operator: SandboxLimits | None = None) -> tuple[SandboxLimits, list[str]]:
    """What data (a record's env config) asked for, held to the operator's limits: a record may
    only narrow them. Returns (the limits to use, one note per value that was not granted as
    asked). Never raises on bad data: an invalid value keeps the operator's."""
    op = operator if operator is not None else operator_limits()
    out = SandboxLimits(**asdict(op))
    notes: list[str] = []
    if requested is None:
        return out, notes
    if isinstance(requested, SandboxLimits):
        requested = asdict(requested)
    if not isinstance(requested, dict):
        return out, [f"limits: expected an object, got {type(requested).__name__}; the operator's limits apply"]
    for k, v in requested.items():
        if k == "network":
            if v is True and not op.network:
                notes.append("network: a record cannot turn network access on (only the operator can); off")
            elif v is False:
                out.network = False
            elif v is not True:
                notes.append(f"network: {_short_repr(v)} is not true/false; the operator's {op.network} applies")
        elif k in LIMIT_MAX:
            opv = getattr(op, k)
            try:
                val = _limit_value(k, v)
            except ValueError:
                notes.append(f"{k}: {_short_repr(v)} is not a valid value; the operator's {opv:g} applies")
                continue
            if val > opv:
                notes.append(f"{k}: {_short_repr(v)} is above the operator's limit; clamped to {opv:g}")
            else:
                setattr(out, k, val)
        else:
            notes.append(f"{_short_repr(k)}: not a sandbox limit; ignored")
    return out, notes


def _short_repr(v: Any, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


def _note_used(isolation: str) -> None:
    _USED.add(isolation)


def used_isolation() -> str | None:
    """The isolation(s) generated code actually ran under in this process ("" joined), or None."""
    return ",".join(sorted(_USED)) or None


def default_pool() -> SandboxPool:
    """The module-level pool (created lazily, shut down at exit; re-created after fork or when the
    default isolation changes)."""
    global _DEFAULT_POOL
    want = _default_isolation()
    if want == "docker":
        want = "namespaces"
    with _DEFAULT_LOCK:
        if (_DEFAULT_POOL is None or _DEFAULT_POOL._pid != os.getpid() or _DEFAULT_POOL._closed
                or _DEFAULT_POOL.isolation != want):
            old = _DEFAULT_POOL
            _DEFAULT_POOL = SandboxPool(isolation=want)
            atexit.register(_DEFAULT_POOL.shutdown)
            if old is not None and old._pid == os.getpid() and not old._closed:
                old.shutdown()
        return _DEFAULT_POOL


def set_default_backend(name: str) -> None:
    """What backend="auto" resolves to ("process" or "docker"); e.g. from `--sandbox docker`."""
    global _DEFAULT_BACKEND
    if name not in ("process", "docker", "auto"):
        raise ValueError(f"unknown sandbox backend {name!r}; use process|docker")
    _DEFAULT_BACKEND = "process" if name == "auto" else name


def _resolve_backend(backend: str) -> str:
    b = (backend or "auto").lower()
    if b == "auto":
        b = _DEFAULT_BACKEND if _DEFAULT_BACKEND in ("process", "docker") else "process"
        if _default_isolation() == "docker":
            b = "docker"
    if b not in ("process", "docker"):
        raise ValueError(f"unknown sandbox backend {backend!r}; use auto|process|docker")
    return b


def run_function(source: str, func: str, args: list | None = None, kwargs: dict | None = None,
                 limits: SandboxLimits | None = None, backend: str = "auto") -> SandboxResult:
    """exec `source` in a fresh module, call func(*args, **kwargs) and return its JSON value."""
    limits = check_limits(limits or operator_limits())
    req = {"kind": "function", "source": source, "func": func, "args": list(args or []),
           "kwargs": dict(kwargs or {})}
    _check_json(req)
    if _resolve_backend(backend) == "docker":
        return _docker_run(req, limits)
    return default_pool()._run(req, limits)


def run_code(source: str, stdin: str = "", limits: SandboxLimits | None = None,
             backend: str = "auto") -> SandboxResult:
    """Run a script; value is the exit code (0 on success); stdout/stderr captured."""
    limits = check_limits(limits or operator_limits())
    req = {"kind": "code", "source": source, "stdin": stdin or ""}
    if _resolve_backend(backend) == "docker":
        return _docker_run(req, limits)
    return default_pool()._run(req, limits)


def isolation_report(probe: bool = True) -> dict:
    """What isolation is actually active (with a live probe), plus the docker backend status."""
    try:
        rep = default_pool().isolation_report(probe=probe)
    except SandboxError as e:
        rep = {"backend": "process", "error": str(e)}
    rep["docker"] = docker_status()
    rep["default_backend"] = _DEFAULT_BACKEND
    try:
        rep["default_isolation"] = _default_isolation()
    except ValueError as e:
        rep["default_isolation"] = f"invalid: {e}"
    return rep


# ----------------------------------------------------------------------------------------------
# docker backend (optional: pip install docker)

_DOCKER_IMAGE_ENV = "TOOLKIT_SANDBOX_DOCKER_IMAGE"
_DOCKER_MARK = "\x00TOOLKIT-SANDBOX-RESULT\x00"


def _docker_client():
    try:
        import docker  # type: ignore
    except ImportError as e:
        raise SandboxUnavailable(
            "docker sandbox unavailable: the 'docker' Python package is not installed "
            f"({e}); `pip install docker` and run a Docker engine, or use --sandbox process") from e
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as e:  # noqa: BLE001
        raise SandboxUnavailable(
            "docker sandbox unavailable: no Docker engine is reachable "
            f"({type(e).__name__}: {str(e)[:200]}); use --sandbox process") from e
    return client


def docker_status() -> str:
    try:
        _docker_client()
        return "available"
    except SandboxUnavailable as e:
        return "unavailable: " + str(e).split("unavailable: ", 1)[-1]


def _docker_runner_source() -> str:
    import inspect

    parts = ["import json, os, sys, time\nfrom typing import Any\n",
             f"_SANDBOX_FILE = {_SANDBOX_FILE!r}\n",
             inspect.getsource(_w_format_exc), inspect.getsource(_w_execute),
             r'''
def _main():
    import base64, tempfile
    req = json.loads(base64.b64decode("".join(sys.argv[1:])))
    real_out = os.dup(1)
    out = tempfile.TemporaryFile(); err = tempfile.TemporaryFile(); inp = tempfile.TemporaryFile()
    inp.write((req.get("stdin") or "").encode()); inp.flush(); inp.seek(0)
    os.dup2(inp.fileno(), 0); os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
    import io
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  line_buffering=True)
    t0 = time.monotonic()
    raw = _w_execute(req)
    dt = time.monotonic() - t0
    for s in (sys.stdout, sys.stderr):
        try: s.flush()
        except Exception: pass
    def rd(f):
        f.seek(0); return f.read(1 << 20).decode("utf-8", "replace")
    doc = {"result": raw.decode("utf-8", "surrogatepass"), "stdout": rd(out), "stderr": rd(err),
           "duration_s": dt}
    os.write(real_out, (''' + repr(_DOCKER_MARK) + r''' + json.dumps(doc)).encode())
_main()
'''.replace("_w_execute(req)", "_w_execute(req)")]
    return "\n".join(parts)


def _docker_run(req: dict, limits: SandboxLimits) -> SandboxResult:  # pragma: no cover - needs engine
    import base64

    client = _docker_client()
    from docker.types import Ulimit  # type: ignore

    req = dict(req)
    req["limits"] = asdict(limits)
    blob = base64.b64encode(json.dumps(req).encode()).decode()
    chunks = [blob[i:i + 100_000] for i in range(0, len(blob), 100_000)] or [""]
    image = os.environ.get(_DOCKER_IMAGE_ENV) or f"python:{sys.version_info[0]}.{sys.version_info[1]}-slim"
    cpu = max(1, int(-(-float(limits.cpu_seconds) // 1)))
    fsz = int(limits.file_size_mb) << 20
    t0 = time.monotonic()
    container = client.containers.run(
        image, ["python", "-I", "-c", _docker_runner_source(), *chunks], detach=True,
        network_disabled=not limits.network, network_mode=None if limits.network else "none",
        mem_limit=f"{int(limits.memory_mb)}m", memswap_limit=f"{int(limits.memory_mb)}m",
        pids_limit=int(limits.max_processes), read_only=True,
        tmpfs={_WORKDIR: f"size={max(32, limits.file_size_mb * 4)}m,mode=1777", "/tmp": "size=16m"},
        working_dir=_WORKDIR, user="65534:65534", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], environment={"HOME": _WORKDIR, "TMPDIR": _WORKDIR},
        ulimits=[Ulimit(name="cpu", soft=cpu, hard=cpu + 1), Ulimit(name="fsize", soft=fsz, hard=fsz),
                 Ulimit(name="core", soft=0, hard=0)],
    )
    killed = None
    status_code = None
    try:
        try:
            status_code = container.wait(timeout=float(limits.wall_seconds) + 2.0).get("StatusCode")
        except Exception:  # noqa: BLE001 - requests ReadTimeout / ConnectionError
            killed = "wall_timeout"
            try:
                container.kill()
            except Exception:  # noqa: BLE001
                pass
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001
            pass
    dt = time.monotonic() - t0
    if killed:
        return SandboxResult(ok=False, killed=killed, duration_s=dt, error_type="TimeoutError",
                             isolation="docker",
                             error=f"TimeoutError: wall time {_fmt_s(limits.wall_seconds)}s exceeded")
    if _DOCKER_MARK not in logs:
        sig = {137: "SIGKILL", 152: "SIGXCPU", 153: "SIGXFSZ"}.get(status_code or 0)
        return SandboxResult(ok=False, stderr=logs[-20000:], duration_s=dt,
                             killed="cpu_limit" if sig == "SIGXCPU" else
                             ("memory" if sig == "SIGKILL" else sig),
                             error=f"SandboxError: container exited with status {status_code} "
                                   "without a result", error_type="SandboxError")
    doc = json.loads(logs.split(_DOCKER_MARK, 1)[1])
    hdr = {"status": 0, "killed": None, "duration_s": doc.get("duration_s", dt),
           "stdout": doc.get("stdout", ""), "stderr": doc.get("stderr", "")}
    res = _classify(hdr, doc.get("result", "").encode("utf-8", "surrogatepass"), limits)
    res.isolation = "docker"
    _note_used("docker")
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sandbox-worker"]:
        _w_main(sys.argv[2:])
    else:
        print(json.dumps(isolation_report(), indent=2))
