"""What a sandbox worker applies to itself and to each call child (worker side, standard library
only: shipped with `worker.py`, see its docstring).

Namespaces and a read-only root (`_w_unshare`, `_w_fork`, `_w_enter_namespaces`, `_w_build_root`),
the privilege drop of a call child (`_w_drop_privileges`), its rlimits (`_w_set_rlimits`), the
seccomp deny filter (`_w_seccomp_prog`, `_w_seccomp`) and the Python audit hook, a last layer
(`_w_audit_hook`). `launcher.py` (operator commands: MCP servers and their state command) uses
the same pieces.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field, fields
from typing import Any

_WORKDIR = "/sandbox"


@dataclass
class Confinement:
    """What a sandbox worker (`pool._Worker`) or the launcher (`commands.ConfinedCommands`) is told
    to apply: built on the host from the operator's settings (never from a record), sent as JSON
    on the command line, read back once (`from_json`, strict: an unknown key is an error, so a
    misspelled setting fails closed instead of being ignored)."""

    # worker: "namespaces" (the confinement) | "none" (the operator's none-unsafe opt-out)
    mode: str = "none"
    # launcher: "namespaces" | "none-unsafe"
    isolation: str = "namespaces"
    network: bool = False  # the operator's limits.network: keep the host network
    binds: list[str] = field(default_factory=list)  # host directories visible read-only
    symlinks: list[list[str]] = field(default_factory=list)  # [path, target] made in the root
    rw_binds: list[str] = field(default_factory=list)  # launcher: the episode's workdir, read-write
    tmp_mb: int = 0  # launcher: a private tmpfs of this size at /tmp (0: none)
    uid: int | None = None  # worker on a root host: the unprivileged uid of call children
    map_uid: int | None = None  # launcher on a root host: the host uid of the namespace's uid 0
    map_gid: int | None = None  # ... and gid (None: map_uid)
    userns: bool = False  # set by the worker once it is in a user namespace
    preload: list[str] = field(default_factory=list)  # modules a worker imports before confining
    audit_hook: bool = True  # the Python audit hook in call children
    debug: bool = False  # a worker keeps stderr
    memcg: dict = field(default_factory=dict)  # {"dir", "v"}: the per-call memory cgroup, if any
    limits: dict = field(default_factory=dict)  # launcher: the operator's SandboxLimits as a dict
    parent: int | None = None  # launcher: the pid that must be its parent
    cwd: str | None = None  # launcher: the command's cwd
    status: str | None = None  # launcher: the file it writes what it did (or the error) to
    cleanup: str | None = None  # launcher: a directory removed if the parent dies
    test_fail_unshare: bool = False  # tests: unshare(2) fails as with EPERM
    memcg_fd: int | None = None  # worker-side: the cgroup directory, opened before pivot_root

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Confinement":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"confinement: unknown key(s) {', '.join(unknown)}")
        return cls(**data)

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


def _w_build_root(cfg: Confinement, info: dict, libc, src_fds: dict | None = None) -> None:
    """In the new mount namespace: build a read-only root and pivot into it.

    cfg: "binds" (host directories, read-only), "symlinks"; optionally "rw_binds" (host directories
    bound read-write, nosuid, nodev: an MCP episode's workdir) and "tmp_mb" (a private writable tmpfs
    of that size at /tmp). src_fds: {host path: an O_PATH fd opened earlier} for sources the
    current credentials can no longer look up (the launcher opens them before it changes uid)."""
    _w_mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    src_fds = src_fds or {}

    def src(p: str) -> str:
        return f"/proc/self/fd/{src_fds[p]}" if p in src_fds else p

    binds = [p for p in cfg.binds if p in src_fds or os.path.isdir(p)]
    rw_binds = [p for p in cfg.rw_binds if p in src_fds or os.path.isdir(p)]
    if len(rw_binds) != len(cfg.rw_binds):
        raise OSError(f"a read-write directory is missing: {cfg.rw_binds}")
    cands = ["/mnt", "/media", "/srv", "/opt", "/boot", "/tmp", "/var/tmp"]
    nr = None
    for c in cands:
        if os.path.isdir(c) and not os.path.islink(c) and not any(
                b == c or b.startswith(c + "/") for b in binds + rw_binds):
            nr = c
            break
    if nr is None:
        raise OSError("no directory available to build the sandbox root on")
    _w_mount(libc, "tmpfs", nr, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4m,nr_inodes=8192,mode=755")
    if cfg.tmp_mb:  # first: binds that live under /tmp are mounted on top of it
        os.makedirs(nr + "/tmp", exist_ok=True)
        _w_mount(libc, "tmpfs", nr + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV,
                 f"size={int(cfg.tmp_mb)}m,nr_inodes=65536,mode=1777")
    for p in binds:
        dst = nr + p
        os.makedirs(dst, exist_ok=True)
        _w_mount(libc, src(p), dst, None, _MS_BIND)
        _w_mount(libc, None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                 | _w_statvfs_flags(dst))
    for p in rw_binds:
        dst = nr + p
        os.makedirs(dst, exist_ok=True)
        _w_mount(libc, src(p), dst, None, _MS_BIND)
        _w_mount(libc, None, dst, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV
                 | (_w_statvfs_flags(dst) & ~_MS_RDONLY))
    for path, target in cfg.symlinks:
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
    if rw_binds or cfg.tmp_mb:
        writable = ", ".join(rw_binds + ([f"a private {int(cfg.tmp_mb)} MB tmpfs at /tmp"]
                                         if cfg.tmp_mb else []))
        info["filesystem"] = (
            f"{'pivot_root' if pivoted else 'chroot'} into a read-only tmpfs root; visible read-only: "
            f"{', '.join(binds)}; /dev: {', '.join(devs)}; writable (nosuid, nodev): {writable}; "
            "everything else read-only or absent")
    else:
        info["filesystem"] = (
            f"{'pivot_root' if pivoted else 'chroot'} into a read-only tmpfs root; visible read-only: "
            f"{', '.join(binds)}; /dev: {', '.join(devs)}; writable: a fresh per-call tmpfs at "
            f"{_WORKDIR} (cwd, HOME, TMPDIR); /tmp and everything else read-only")
    info["root_binds"] = binds


def _w_unshare(cfg: Confinement, info: dict) -> None:
    """unshare(2) the mount, pid, ipc, uts (and, unless cfg.network, network) namespaces, plus a
    user namespace when not root or when cfg.map_uid is set: a root host then maps the
    namespace's uid/gid 0 to that unprivileged host uid/gid (cfg.map_gid, default the same), so
    nothing inside holds a capability in the initial namespace or a host file's owner. No fork:
    the caller's next child (`_w_fork`) is pid 1 of the new pid namespace."""
    import errno

    libc = _w_libc()
    map_uid = cfg.map_uid
    userns = map_uid is not None or os.geteuid() != 0
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    if not cfg.network:
        flags |= _CLONE_NEWNET
    if userns:
        flags |= _CLONE_NEWUSER
    if cfg.test_fail_unshare:
        raise PermissionError(errno.EPERM, "unshare: Operation not permitted (simulated)")
    if map_uid is not None:
        uid, gid = int(map_uid), int(map_uid if cfg.map_gid is None else cfg.map_gid)
    else:
        uid, gid = os.geteuid(), os.getegid()
    if userns and os.geteuid() == 0:
        os.setgroups([])  # root's supplementary groups would keep their host rights inside
        # mapping another uid takes CAP_SETUID in the parent namespace, which we lose by entering
        # the new one: a helper left behind in it writes the maps
        _w_unshare_mapped_by_helper(libc, flags, uid, gid)
    else:
        _w_check(libc.unshare(flags), "unshare")
        if userns:
            _w_write_id_maps("self", uid, gid)
    info.update({"user_ns": userns, "mount_ns": True, "pid_ns": True, "ipc_ns": True,
                 "uts_ns": True, "net_ns": not cfg.network})
    if userns:
        info["user_map"] = f"namespace uid/gid 0 = host uid {uid} / gid {gid}"


def _w_write_id_maps(pid: str, uid: int, gid: int) -> None:
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def _w_unshare_mapped_by_helper(libc, flags: int, uid: int, gid: int) -> None:
    """unshare(flags) (with CLONE_NEWUSER) while a child still in the parent namespace writes our
    uid/gid maps: 0 -> uid/gid."""
    import ctypes
    import errno

    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(res_r)
        try:
            if os.read(go_r, 1) == b"1":
                _w_write_id_maps(str(me), uid, gid)
                os.write(res_w, b"ok")
        except BaseException as e:  # noqa: BLE001
            os.write(res_w, f"{type(e).__name__}: {e}".encode()[:500])
        os._exit(0)
    os.close(go_r)
    os.close(res_w)
    ret = libc.unshare(flags)
    err = ctypes.get_errno()
    os.write(go_w, b"1" if ret == 0 else b"0")
    os.close(go_w)
    res = os.read(res_r, 1000)
    os.close(res_r)
    os.waitpid(pid, 0)
    if ret != 0:
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if res != b"ok":
        raise OSError(errno.EPERM, f"writing the uid/gid maps: {res.decode(errors='replace') or 'no answer'}")


_PARENT_FD: list[int] = []  # the child's end of the pipe that closes when the parent dies


def _w_die_with_parent() -> None:
    """SIGKILL when the parent dies (PR_SET_PDEATHSIG; set again after every uid/gid change, which
    clears it), and exit now if the parent is already gone (its end of the `_w_fork` pipe closed)."""
    import select

    _w_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if _PARENT_FD:
        p = select.poll()
        p.register(_PARENT_FD[0], select.POLLIN | select.POLLHUP)
        if p.poll(0):
            os._exit(1)


def _w_fork() -> int:
    """fork after `_w_unshare`; returns the child's pid in the parent, 0 in the child (pid 1 of the
    new pid namespace), which dies with its parent (`_w_die_with_parent`)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(r)  # w stays open as long as the parent lives
        return pid
    os.close(w)
    _PARENT_FD[:] = [r]
    _w_die_with_parent()
    return 0


def _w_init_namespaces(cfg: Confinement, info: dict, libc, src_fds: dict | None = None) -> None:
    """In pid 1 of the new namespaces: hostname, the read-only root (`_w_build_root`), and what the
    network and process isolation are (`info`)."""
    try:
        libc.sethostname(b"sandbox", 7)
    except Exception:  # noqa: BLE001
        pass
    _w_build_root(cfg, info, libc, src_fds)
    if not cfg.network:
        import socket

        try:
            ifs = [n for _, n in socket.if_nameindex()]
        except OSError:
            ifs = []
        info["network"] = (f"none: private network namespace (interfaces: {', '.join(ifs) or '-'}, "
                           f"all down; no route to any address, loopback included)")
    else:
        info["network"] = "host network (limits.network=True)"
    info["mode"] = "namespaces"


def _w_enter_namespaces(cfg: Confinement, info: dict, pin: int, pout: int) -> None:
    """unshare + fork; returns in the inner process (pid 1 of the new pid namespace)."""
    _w_unshare(cfg, info)
    pid = _w_fork()
    if pid:  # outer: just mirror the inner's exit
        os.close(pin)
        os.close(pout)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    _w_init_namespaces(cfg, info, _w_libc())
    info["processes"] = ("private pid namespace; the worker is pid 1 and kills every process a "
                         "call leaves behind")


def _w_drop_privileges(cfg: Confinement, cap_last: int, libc) -> str:
    """Irreversibly drop privileges in the call child. Returns a description."""
    import ctypes

    uid = cfg.uid
    if os.geteuid() == 0 and uid is not None and not cfg.userns:
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
