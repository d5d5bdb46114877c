"""The MCP server launcher (standard library only, run as a file): confine, then exec the server.

    python launch.py CONFIG_JSON COMMAND [ARGS...]

CONFIG_JSON: {"limits": {cpu_seconds, memory_mb, file_size_mb, network}, "status": PATH}.
Applies the operator's resource limits (RLIMIT_CPU for the server's whole life, RLIMIT_AS,
RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps), enters a fresh network namespace when the limits
say network: false (a user namespace too when not root), writes what it could do to the status
file ({"network": "isolated" | "unavailable: <why>" | "allowed", "limits": ...}), then execs
COMMAND in the current directory (the episode's copy of the workdir) with the environment it got.
The caller started it in a new session, so the whole process group is killed at episode end; the
server also gets SIGKILL when the toolkit process dies (PR_SET_PDEATHSIG).
"""

import ctypes
import json
import math
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1


def _setl(res, soft, hard):
    try:
        resource.setrlimit(res, (soft, hard))
    except (ValueError, OSError):
        try:
            resource.setrlimit(res, (soft, soft))
        except (ValueError, OSError):
            pass


def _limits(lim):
    done = {}
    if lim.get("cpu_seconds"):
        cpu = max(1, int(math.ceil(float(lim["cpu_seconds"]))))
        _setl(resource.RLIMIT_CPU, cpu, cpu + 1)
        done["cpu_seconds"] = cpu
    if lim.get("memory_mb"):
        mem = int(lim["memory_mb"]) << 20
        _setl(resource.RLIMIT_AS, mem, mem)
        done["memory_mb"] = int(lim["memory_mb"])
    if lim.get("file_size_mb"):
        fsz = int(lim["file_size_mb"]) << 20
        _setl(resource.RLIMIT_FSIZE, fsz, fsz)
        done["file_size_mb"] = int(lim["file_size_mb"])
    _setl(resource.RLIMIT_CORE, 0, 0)
    _setl(resource.RLIMIT_NOFILE, 1024, 1024)
    return done


def _no_network():
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNET) != 0:
            return "unavailable: unshare(CLONE_NEWNET): " + os.strerror(ctypes.get_errno())
        return "isolated"
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return "unavailable: unshare(CLONE_NEWUSER|CLONE_NEWNET): " + os.strerror(ctypes.get_errno())
    try:  # keep the same ids inside the user namespace
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError as e:
        return f"isolated (id maps not written: {e})"
    return "isolated"


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: launch.py CONFIG_JSON COMMAND [ARGS...]\n")
        return 2
    cfg = json.loads(argv[1])
    try:  # die with the toolkit process (the thread that started us), even when it is SIGKILLed
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent is already gone
        return 1
    lim = cfg.get("limits") or {}
    status = {"pid": os.getpid(), "pgid": os.getpgid(0),
              "network": "allowed" if lim.get("network") else _no_network()}
    status["limits"] = _limits(lim)
    if cfg.get("status"):
        with open(cfg["status"], "w") as f:
            json.dump(status, f)
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as e:
        sys.stderr.write(f"toolkit mcp launcher: cannot run {argv[2]!r}: {e}\n")
        return 127
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main(sys.argv))
