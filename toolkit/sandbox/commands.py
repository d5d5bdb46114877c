"""Operator commands run confined (MCP servers and their state commands): the host side of
`launcher.py`, which applies the same namespaces, read-only root, privilege drop, rlimits and
seccomp filter (`confine.py`) as the python sandbox's workers (docs/sandbox.md, "Operator commands").

`ConfinedCommands(workdir, limits)` is one episode's confinement: every command started through
`argv(...)` (the server, each state command) sees the host read-only (the system directories, the
Python installation, the command's own prefix and the operator's `read_paths`), writes only the
episode's workdir and a private /tmp, has no network (unless the operator's limits say
`network: true`), runs as the namespace's uid 0 = an unprivileged host uid (root host) with no
capability, and lives in a pid namespace of its own that the kernel empties when the command ends
or the toolkit dies. Isolation follows `--sandbox-isolation`: "none-unsafe" (the explicit opt-out)
runs the command with the rlimits only; "namespaces" and "docker" confine it in namespaces (the
docker backend runs generated Python only), and fail closed where the kernel refuses.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from toolkit.sandbox.confine import Confinement
from toolkit.sandbox.isolation import _default_isolation, _note_used, normalize_isolation
from toolkit.sandbox.pool import _compute_binds, _next_uid
from toolkit.sandbox.result import SandboxUnavailable

LAUNCHER = str(Path(__file__).with_name("launcher.py"))
EX_CONFINE = 71  # the launcher's exit status when it could not confine (nothing ran)
OPT_OUT = ("opt out explicitly with --sandbox-isolation none-unsafe (recipe key sandbox_isolation, "
           "TOOLKIT_SANDBOX_ISOLATION=none-unsafe)")


def command_isolation(name: str | None = None) -> str:
    """The isolation operator commands run under: "namespaces" unless "none-unsafe" was chosen."""
    iso = normalize_isolation(name) if name else _default_isolation()
    return "none-unsafe" if iso == "none-unsafe" else "namespaces"


def _prefix(path: str) -> str | None:
    """The installation directory of an executable: /x/bin/prog -> /x, /x/prog -> /x; never "/"."""
    d = os.path.dirname(path)
    if os.path.basename(d) in ("bin", "sbin"):
        d = os.path.dirname(d)
    return d if d and d != "/" else None


def command_paths(command: str, search_path: str | None) -> list[str]:
    """The directories a command needs visible: its own prefix (as named and after symlinks) and
    its interpreter's (a `#!` line)."""
    exe = shutil.which(command, path=search_path) if os.sep not in command else command
    if not exe:
        return []
    out: list[str] = []
    for p in (os.path.abspath(exe), os.path.realpath(exe)):
        d = _prefix(p)
        if d:
            out.append(d)
    try:
        with open(exe, "rb") as f:
            head = f.read(256)
    except OSError:
        head = b""
    if head.startswith(b"#!"):
        parts = head[2:].split(b"\n", 1)[0].split()
        if parts and parts[0].startswith(b"/"):
            interp = os.fsdecode(parts[0])
            for p in (interp, os.path.realpath(interp)):
                d = _prefix(p)
                if d:
                    out.append(d)
    return out


class ConfinedCommands:
    """One episode's confinement (see the module docstring): the same uid, workdir and limits for
    every command started through `argv`."""

    def __init__(self, workdir: str, limits: dict, *, read_paths: Sequence[str] = (),
                 isolation: str | None = None) -> None:
        self.isolation = command_isolation(isolation)
        self.workdir = os.path.realpath(workdir)
        self.limits = dict(limits)
        self.read_paths = [os.path.realpath(p) for p in read_paths]
        # a root host maps the namespace's uid 0 to an unprivileged uid of this episode's own
        self.uid = _next_uid() if self.isolation == "namespaces" and os.geteuid() == 0 else None

    def prepare(self) -> None:
        """Give the workdir to the namespace's uid (root host: chown -R, never following a link)."""
        if self.uid is None:
            return
        os.lchown(self.workdir, self.uid, self.uid)
        for root, dirs, files in os.walk(self.workdir):
            for n in dirs + files:
                os.lchown(os.path.join(root, n), self.uid, self.uid)

    def argv(self, command: Sequence[str], *, search_path: str | None = None, status: str | None = None,
             cleanup: str | None = None, cwd: str | None = None) -> list[str]:
        """The argv that runs `command` confined (cwd: `cwd` or the workdir). `status`: a file the
        launcher writes ({"pid", "pgid", "isolation", "confinement"} or {"error"}); `cleanup`: a
        directory it removes if the toolkit dies first."""
        cfg = Confinement(isolation=self.isolation, limits=self.limits, parent=os.getpid(),
                          cwd=cwd or self.workdir, status=status, cleanup=cleanup)
        if self.isolation == "namespaces":
            binds, links = _compute_binds(self._read_paths(command[0], search_path))
            cfg.binds = [b for b in binds if not _under(self.workdir, b)]
            cfg.symlinks = [list(x) for x in links]
            cfg.rw_binds = [self.workdir]
            cfg.tmp_mb = max(64, 4 * int(self.limits.get("file_size_mb") or 16))
            cfg.network = bool(self.limits.get("network"))
            if self.uid is not None:
                cfg.map_uid = cfg.map_gid = self.uid
        return [sys.executable, "-I", "-S", LAUNCHER, cfg.to_json(), *command]  # -S: stdlib only, no .pth

    def _read_paths(self, command: str, search_path: str | None) -> list[str]:
        return self.read_paths + command_paths(command, search_path)

    def note_used(self) -> None:
        """`provenance[-1].sandbox_isolation` of the records this process writes says it."""
        _note_used(f"mcp:{self.isolation}")

    @staticmethod
    def failure(status: dict | None, what: str) -> SandboxUnavailable | None:
        """The fail-closed error when the launcher could not confine `what` (status {"error"})."""
        if not status or not status.get("error"):
            return None
        return SandboxUnavailable(f"{what}: {status['error']}. Operator commands (MCP servers, state commands) "
                                  f"are not run unconfined: give the host user namespaces, or {OPT_OUT}")


def _under(parent: str, p: str) -> bool:
    return p == parent or p.startswith(parent.rstrip("/") + "/")


def read_status(path: str | None) -> dict:
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


__all__ = ["EX_CONFINE", "LAUNCHER", "ConfinedCommands", "command_isolation", "command_paths", "read_status"]
