"""Run an operator's command confined: the launcher of MCP servers and their state commands
(standard library only, run as a file by `toolkit.sandbox.commands`; it loads `confine.py` from
its own directory, the code the python sandbox's workers run).

    python -I -S launcher.py CONFIG_JSON COMMAND [ARGS...]

CONFIG_JSON (a `confine.Confinement`, built by `commands.ConfinedCommands.argv`): "isolation" ("namespaces" | "none-unsafe"),
"limits" (SandboxLimits as a dict), "parent" (the pid that must be our parent), "cwd", "binds"
and "symlinks" (the read-only host directories), "rw_binds" (the episode's workdir), "tmp_mb",
"map_uid"/"map_gid" (root host: the unprivileged host ids of the namespace's uid 0), "status" (a
file for what was done, or the error), "cleanup" (a directory to remove if our parent dies).

"namespaces" (the default; the only confinement there is):

    parent (the toolkit) ── outer: unshare(user, mount, pid, net, ipc, uts), writes the status,
                              waits; dies with the parent (PR_SET_PDEATHSIG), then removes
                              `cleanup` and takes pid 1 with it
                            └─ pid 1 of the new pid namespace: opens the bind sources, becomes
                               the namespace's uid 0 (= map_uid), builds the read-only root,
                               drops every capability, no_new_privs, seccomp; dies with the outer
                               └─ COMMAND: the operator's rlimits, exec'd in cwd

When pid 1 exits (COMMAND ended, or the outer died), the kernel kills every process left in the
pid namespace: `setsid`, double forks and daemons included. Anything that cannot be done (no user
namespaces, a mount refused) is an error (status {"error": ...}, exit 71): never a downgrade.

"none-unsafe" (the operator's explicit opt-out): the operator's rlimits, the command in the outer's
process group, which dies (and removes `cleanup`) with the parent; no namespace.
"""

import ctypes  # noqa: F401  (everything confine.py imports, imported before the uid changes:
import errno  # noqa: F401   the Python installation may not be readable by the namespace's uid)
import importlib.util
import json
import math  # noqa: F401
import os
import platform  # noqa: F401
import resource
import select  # noqa: F401
import shutil  # (parent_died runs in a signal handler)
import signal
import socket  # noqa: F401
import sys
import time

EX_CONFINE = 71  # could not confine: nothing was run


def _confine():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_toolkit_confine", os.path.join(here, "confine.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses looks its module up
    spec.loader.exec_module(mod)
    return mod


def _write_status(fd, status):
    if fd is None:
        return
    data = json.dumps(status).encode()
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    while data:
        data = data[os.write(fd, data):]


def _fail(status_fd, msg):
    _write_status(status_fd, {"error": msg})
    sys.stderr.write(f"toolkit sandbox: {msg}\n")
    sys.stderr.flush()
    return EX_CONFINE


def _rlimits(C, lim, nofile=1024):
    C._w_set_rlimits(lim)
    try:  # servers hold more files open than a sandboxed function
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    except (ValueError, OSError):
        pass


def _exec(argv, cwd):
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):  # Python's own handling
        signal.signal(sig, signal.SIG_DFL)
    if cwd:
        os.chdir(cwd)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"toolkit sandbox: cannot run {argv[0]!r}: {e}\n")
        sys.stderr.flush()
    os._exit(127)


def _unsafe(C, cfg, argv):
    """isolation none-unsafe: the operator's rlimits; the command is our child, in our process group;
    if our parent dies we remove `cleanup` and kill the group (not what left it: no pid namespace)."""
    libc = C._w_libc()

    def parent_died(signum, frame):
        if cfg.cleanup:
            shutil.rmtree(cfg.cleanup, ignore_errors=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    signal.signal(signal.SIGTERM, parent_died)
    libc.prctl(C._PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if cfg.parent is not None and os.getppid() != cfg.parent:
        return 1
    status = {"pid": os.getpid(), "pgid": os.getpgid(0), "isolation": "none-unsafe",
              "confinement": {"mode": "none", "network": "host network (NOT isolated)",
                              "filesystem": "host filesystem (NOT isolated)",
                              "processes": "host pid namespace: its process group is killed at the end"}}
    if cfg.status:
        fd = os.open(cfg.status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        _write_status(fd, status)
        os.close(fd)
    pid = os.fork()
    if pid == 0:
        libc.prctl(C._PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        lim = dict(cfg.limits)
        lim["max_processes"] = 4096  # RLIMIT_NPROC counts every process of the (host) uid
        _rlimits(C, lim)
        _exec(argv, cfg.cwd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st) & 0xFF


def _outer(C, cfg, inner, info, info_r, go_w, status_fd):
    """The process outside: report what pid 1 did, let it start COMMAND, mirror its exit."""
    chunks = []
    while True:
        b = os.read(info_r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(info_r)
    try:
        msg = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        msg = {}
    if not msg.get("ready"):
        try:
            os.kill(inner, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(inner, 0)
        return _fail(status_fd, msg.get("error") or "the confined process died before it was ready")
    _write_status(status_fd, {"pid": os.getpid(), "pgid": os.getpgid(0), "isolation": "namespaces",
                              "confinement": {**info, **(msg.get("info") or {})}})
    if status_fd is not None:
        os.close(status_fd)
    os.close(go_w)  # pid 1 may start COMMAND
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            _, st = os.waitpid(inner, 0)
            break
        except ChildProcessError:
            return 1
    return os.waitstatus_to_exitcode(st) & 0xFF


def _pid1(C, cfg, argv, info_w, go_r):
    """pid 1 of the new pid namespace: confine, start COMMAND, reap, exit with COMMAND's status."""
    libc = C._w_libc()
    info = {}
    try:
        # a mount namespace of our own: the root we pivot into is not the outer's
        C._w_check(libc.unshare(C._CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # bind sources opened (in that namespace) while our fsuid is still the caller's (a root
        # host: host root, who can look up a 0700 episode directory); the namespace's uid 0 may not
        fds = {}
        for p in cfg.binds + cfg.rw_binds:
            try:
                fds[p] = os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                if p in cfg.rw_binds:
                    raise
        if cfg.map_uid is not None:  # become the namespace's uid 0 = the host's map_uid
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
            C._w_die_with_parent()  # a uid change clears PR_SET_PDEATHSIG
        C._w_init_namespaces(cfg, info, libc, fds)
        for fd in fds.values():
            os.close(fd)
        try:
            with open("/proc/sys/kernel/cap_last_cap") as f:
                cap_last = int(f.read())
        except (OSError, ValueError):
            cap_last = 40
        info["privileges"] = C._w_drop_privileges(C.Confinement(userns=True), cap_last, libc)
        libc.prctl(C._PR_SET_DUMPABLE, 0, 0, 0, 0)
        info["seccomp"] = C._w_seccomp(libc)
        info["processes"] = ("private pid namespace: pid 1 is the launcher, the command's parent; "
                             "when it exits or its parent dies, the kernel kills every process left")
        lim = cfg.limits
        info["rlimits"] = (f"RLIMIT_CPU {lim.get('cpu_seconds')} s (the command's whole life), "
                           f"RLIMIT_AS {lim.get('memory_mb')} MB, RLIMIT_FSIZE {lim.get('file_size_mb')} MB, "
                           f"RLIMIT_NPROC {lim.get('max_processes')}, RLIMIT_NOFILE 1024, no core dumps")
    except BaseException as e:  # noqa: BLE001
        os.write(info_w, json.dumps({"ready": False, "error": f"cannot confine: {type(e).__name__}: {e}",
                                     "info": info}).encode())
        os._exit(EX_CONFINE)
    os.write(info_w, json.dumps({"ready": True, "info": info}).encode())
    os.close(info_w)
    while os.read(go_r, 1):  # until the outer has written the status (EOF)
        pass
    os.close(go_r)
    pid = os.fork()
    if pid == 0:
        try:
            _rlimits(C, cfg.limits)
            os.closerange(3, 1 << 16)
        except BaseException as e:  # noqa: BLE001
            sys.stderr.write(f"toolkit sandbox: {type(e).__name__}: {e}\n")
            os._exit(EX_CONFINE)
        _exec(argv, cfg.cwd)
    code = 1
    while True:  # reap everything (orphans are re-parented to us) until COMMAND ends
        try:
            wpid, st = os.wait()
        except ChildProcessError:
            break
        if wpid == pid:
            code = os.waitstatus_to_exitcode(st) & 0xFF
            break
    os._exit(code)  # the kernel kills what is left in the namespace


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: launcher.py CONFIG_JSON COMMAND [ARGS...]\n")
        return 2
    C = _confine()
    cfg = C.Confinement.from_json(argv[1])
    if cfg.isolation == "none-unsafe":
        return _unsafe(C, cfg, argv[2:])
    status_fd = None
    if cfg.status:
        status_fd = os.open(cfg.status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    inner = None

    def parent_died(signum, frame):  # the toolkit died (SIGKILL included): leave nothing behind
        if inner:
            try:
                os.kill(inner, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # the namespace's processes die with its pid 1, not at once: a file one of them writes
            # after the removal has walked past would keep the directory (seen on a loaded box),
            # so reap pid 1 first (bounded: the directory goes regardless)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(inner, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.02)
        if cfg.cleanup:
            for _ in range(3):
                shutil.rmtree(cfg.cleanup, ignore_errors=True)
                if not os.path.exists(cfg.cleanup):
                    break
        os._exit(1)

    signal.signal(signal.SIGTERM, parent_died)
    libc = C._w_libc()
    libc.prctl(C._PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if cfg.parent is not None and os.getppid() != cfg.parent:
        return 1
    if os.geteuid() == 0 and cfg.map_uid is None:
        return _fail(status_fd, "refusing to run an operator command as host root: no uid to map to")
    info = {}
    try:
        C._w_unshare(cfg, info)
    except OSError as e:
        return _fail(status_fd, f"cannot confine: {e} (user namespaces unavailable?)")
    info_r, info_w = os.pipe()
    go_r, go_w = os.pipe()
    inner = C._w_fork()
    if inner:
        os.close(info_w)
        os.close(go_r)
        return _outer(C, cfg, inner, info, info_r, go_w, status_fd)
    os.close(info_r)
    os.close(go_w)
    if status_fd is not None:
        os.close(status_fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _pid1(C, cfg, argv[2:], info_w, go_r)
    return 1  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main(sys.argv))
