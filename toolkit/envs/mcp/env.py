"""The mcp backend: a live MCP server as an environment (one server process per episode).

Env ref (a record's `env` field)::

    {"backend": "mcp", "id": "git",                 # a server the OPERATOR registered (servers.py)
     "config": {"workdir": "template-repo/",        # copied fresh for every episode (the server's cwd)
                "exclude_keys": [...], "policy": "..."}}

A record cannot carry a command (`McpConfigError`), and its workdir must lie under a root the
operator registered (`servers.resolve_workdir`). Per episode (`reset()`): a fresh copy of the
workdir in a private temp directory, the server started there confined
(`toolkit.sandbox.commands.ConfinedCommands`: user, pid, mount and network namespaces, read-only
host, the operator's rlimits, seccomp) with the official `mcp` client over stdio; `tools()` come
from the live `tools/list` (names sanitized to OpenAI's `^[a-zA-Z0-9_-]{1,64}$`, the original
kept for `tools/call`; annotations kept: `tool_meta()`); `call()` is `tools/call` (`isError` → a
failed step, code TOOL_ERROR); `close()` / the next `reset()` ends the session and kills the
launcher's process group and pid namespace.

State (`snapshot()`): the output of the server entry's `state_command`, run in the same
confinement as the server (and with git's hooks, fsmonitor and other repository-named programs
turned off: `state_command_env`), one row per non-empty line (`{"state": [{"line": ...}]}`), or
else the content of the workdir: `{"files": [{"path", "sha256"}]}` without the entry's
`state_excludes` (glob patterns on the relative path; a pattern matching a directory excludes
everything under it). So `state_diff` works on real servers. A URL (streamable HTTP) server is
the operator's process with no workdir the toolkit owns: it is stateless (`{}`) unless the entry
gives a `state_command`, which then runs on the host (it may need the network to reach the
server; the agent cannot write its workdir).
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from toolkit.envs.base import Environment, ToolResult
from toolkit.envs.mcp.servers import (
    McpConfigError,
    ServerEntry,
    check_record_ref,
    resolve_workdir,
    server,
)
from toolkit.envs.mcp.session import McpSession, McpUnavailable
from toolkit.sandbox.commands import ConfinedCommands, read_status

from toolkit.formats.tools import NAME_RE, sanitize_names  # noqa: F401  (the same rule as tools import)
from toolkit.io import log
from toolkit.sandbox import operator_limits, parse_limits
_LOGGED: set[str] = set()
# what the server process may see of the toolkit's environment (plus the entry's own env)
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM", "SYSTEMROOT")
# Set by the toolkit for the state command, over the operator's env: git reads no system or global
# config, runs no hook, no fsmonitor, no pager, no signature check, takes no optional lock, and
# trusts the episode's directory. (Command-line config, the highest scope: the repository's own
# .git/config, which the agent may have written, cannot turn these back on.)
_GIT_STATE_CONFIG = (("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"), ("safe.directory", "*"),
                     ("core.pager", "cat"), ("log.showSignature", "false"), ("core.sshCommand", "false"),
                     ("core.askPass", "false"), ("core.editor", "false"), ("core.untrackedCache", "false"))
STATE_COMMAND_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_OPTIONAL_LOCKS": "0",
                     "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat", "GIT_ATTR_NOSYSTEM": "1",
                     "GIT_NO_REPLACE_OBJECTS": "1"}


def state_command_env(env: dict[str, str]) -> dict[str, str]:
    """`env` (the server's) with `STATE_COMMAND_ENV` and the git config above appended after any
    GIT_CONFIG_* entries of the operator's (later entries win)."""
    out = {k: v for k, v in env.items() if k not in ("GIT_EXTERNAL_DIFF", "GIT_SSH_COMMAND", "GIT_ASKPASS")}
    out.update(STATE_COMMAND_ENV)
    try:
        n = max(0, int(out.get("GIT_CONFIG_COUNT") or 0))
    except ValueError:
        n = 0
    for i, (k, v) in enumerate(_GIT_STATE_CONFIG, start=n):
        out[f"GIT_CONFIG_KEY_{i}"] = k
        out[f"GIT_CONFIG_VALUE_{i}"] = v
    out["GIT_CONFIG_COUNT"] = str(n + len(_GIT_STATE_CONFIG))
    return out


def _log_once(msg: str) -> None:
    if msg not in _LOGGED:
        _LOGGED.add(msg)
        log(msg)


def _result_content(res: dict) -> Any:
    """A tools/call result as the tool message's content: the text of text blocks, the
    structured content when there is one, other blocks as they came."""
    if res.get("structuredContent") is not None:
        return res["structuredContent"]
    blocks = res.get("content") or []
    if blocks and all(b.get("type") == "text" for b in blocks):
        return "\n".join(b.get("text") or "" for b in blocks)
    return blocks


class McpEnvironment(Environment):
    backend = "mcp"
    poolable = False  # a pooled env would keep its server alive past the episode
    blocking_reset = True  # reset() starts a server: rollout runs it in a thread

    def __init__(self, entry: ServerEntry, workdir: str | None = None, policy: str = "",
                 exclude_keys: list[str] | None = None) -> None:
        self.entry = entry
        self.workdir = str(Path(workdir).resolve()) if workdir else None
        if self.workdir and not Path(self.workdir).is_dir():
            raise McpConfigError(f"env.config.workdir {workdir!r} is not a directory")
        if entry.transport == "stdio" and not self.workdir:
            self._empty = tempfile.mkdtemp(prefix="toolkit-mcp-empty-")
        else:
            self._empty = None
        self._policy = policy or entry.description
        self.exclude_keys = tuple(exclude_keys or ())
        self._lock = threading.RLock()
        self._session: McpSession | None = None
        self._episode_dir: str | None = None
        self._tools: list[dict] | None = None
        self._meta: dict[str, dict] = {}
        self.limits = self._limits()
        self.episodes = 0
        self._jail: ConfinedCommands | None = None
        self.confinement: dict = {}  # what the launcher did (isolation_report-like), after reset()

    @classmethod
    def from_ref(cls, ref: Any) -> McpEnvironment:
        if hasattr(ref, "model_dump"):
            ref = ref.model_dump(exclude_none=True)
        ref = dict(ref or {})
        check_record_ref(ref)
        entry = server(ref.get("id"))
        config = ref.get("config") or {}
        if ref.get("state"):
            raise McpConfigError("env.state: an mcp environment's initial state is its workdir "
                                 "(env.config.workdir), not an inline state")
        field = "env.config.workdir" if config.get("workdir") is not None else "env.path"
        workdir = config.get("workdir") if config.get("workdir") is not None else ref.get("path")
        if workdir is not None:  # a host path: only under a root the operator registered
            workdir = resolve_workdir(entry, workdir, field)
        return cls(entry, workdir=workdir, policy=str(config.get("policy") or ""),
                   exclude_keys=[str(k) for k in config.get("exclude_keys") or []])

    # -- limits
    def _limits(self) -> dict:
        """The operator's sandbox limits with the server entry's own (also the operator's) on top."""
        lim = operator_limits()
        if self.entry.limits:
            lim = parse_limits(self.entry.limits, base=lim)
        return asdict(lim)

    # -- episode lifecycle
    def _start(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            self._stop()
            tmp = tempfile.mkdtemp(prefix="toolkit-mcp-")
            work = os.path.join(tmp, "work")
            if self.workdir:
                shutil.copytree(self.workdir, work, symlinks=True)
            else:
                os.makedirs(work)
            self._episode_dir = tmp
            e = self.entry
            subst = (lambda s: s.replace("{workdir}", work))
            self._jail = None if e.transport == "http" else ConfinedCommands(work, self.limits,
                                                                             read_paths=e.read_paths)
            env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
            home = "/tmp" if self._jail is not None and self._jail.isolation == "namespaces" else tmp
            env.update({"HOME": home, "TMPDIR": home})  # confined: its private /tmp
            env.update({k: subst(v) for k, v in e.env.items()})
            self._env_vars = env
            self._work = work
            if self._jail is None:  # a URL server: the operator runs it, the toolkit starts nothing
                sess = McpSession(e, cwd=work, env=env, errlog=os.path.join(tmp, "server.stderr"),
                                  status_file=None, argv=[])
                raw = sess.start()
            else:
                self._jail.prepare()
                status = os.path.join(tmp, "launch.json")
                argv = self._jail.argv([e.command, *(subst(a) for a in e.args)], search_path=env.get("PATH"),
                                       status=status, cleanup=tmp)
                sess = McpSession(e, cwd=work, env=env, errlog=os.path.join(tmp, "server.stderr"),
                                  status_file=status, argv=argv)
                try:
                    raw = sess.start()
                except McpUnavailable:
                    err = self._jail.failure(read_status(status), f"mcp server {e.id!r}")
                    self._stop()
                    if err is not None:
                        raise err from None
                    raise
                self._jail.note_used()
                self.confinement = sess.status.get("confinement") or {}
            self._session = sess
            self.episodes += 1
            self._set_tools(raw)

    def _set_tools(self, raw: list[dict]) -> None:
        names = sanitize_names([t.get("name") or "" for t in raw])
        tools, meta = [], {}
        for t in raw:
            orig = t.get("name") or ""
            name = names[orig]
            params = t.get("inputSchema") or {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": {
                "name": name, "description": t.get("description") or t.get("title") or "",
                "parameters": params}})
            meta[name] = {"name": orig, "annotations": t.get("annotations") or {},
                          **({"outputSchema": t["outputSchema"]} if t.get("outputSchema") else {}),
                          **({"title": t["title"]} if t.get("title") else {})}
            if name != orig:
                _log_once(f"mcp env {self.entry.id}: tool {orig!r} is offered as {name!r}")
        self._tools, self._meta = tools, meta

    def _stop(self) -> None:
        with self._lock:
            s, self._session = self._session, None
            if s is not None:
                s.close()
            d, self._episode_dir = self._episode_dir, None
            if d:
                shutil.rmtree(d, ignore_errors=True)

    @property
    def server_pid(self) -> int | None:
        return self._session.pid if self._session is not None else None

    def reset(self, state: dict | None = None) -> None:
        if state:
            raise McpConfigError("an mcp environment cannot be reset to a given state; its initial state is "
                                 "the workdir")
        with self._lock:
            self._stop()
            self._start()

    def close(self) -> None:
        self._stop()
        if self._empty:
            shutil.rmtree(self._empty, ignore_errors=True)

    def __del__(self) -> None:  # a forgotten env still kills its server
        try:
            self._stop()
        except Exception:  # pragma: no cover
            pass

    # -- protocol
    def tools(self, side: str = "agent") -> list[dict]:
        if side == "user":
            return []
        self._start()
        return json.loads(json.dumps(self._tools))

    def tool_meta(self) -> dict[str, dict]:
        """{offered name: {"name": the server's name, "annotations": {...}, "outputSchema"?}}."""
        self._start()
        return json.loads(json.dumps(self._meta))

    def policy(self) -> str:
        self._start()
        return self._policy or (self._session.instructions if self._session else "") or ""

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        self._start()
        meta = self._meta.get(name)
        if side != "agent" or meta is None:
            return ToolResult.fail("UNKNOWN_TOOL", f"unknown tool {name!r}",
                                   hint="available tools: " + ", ".join(sorted(self._meta)))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                return ToolResult.fail("INVALID_ARGUMENTS", f"arguments are not valid JSON: {e}")
        timeout = float(self.entry.call_seconds or self.limits.get("wall_seconds") or 30)
        try:
            res = self._session.call(meta["name"], dict(args or {}), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            return self._dead(name, "TIMEOUT", f"tool {name!r} did not answer within {timeout:g}s")
        except McpUnavailable as e:
            return self._dead(name, "SANDBOX_ERROR", str(e))
        except Exception as e:  # a protocol error (e.g. invalid params) is a tool error
            return ToolResult.fail("TOOL_ERROR", f"{name}: {type(e).__name__}: {e}"[:2000])
        return self._result(res)

    async def acall(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        return await asyncio.to_thread(self.call, name, args, side)

    def _dead(self, name: str, code: str, msg: str) -> ToolResult:
        return ToolResult.fail(code, msg, hint="the server may have been stopped; the state may have changed")

    @staticmethod
    def _result(res: dict) -> ToolResult:
        content = _result_content(res)
        if res.get("isError"):
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            return ToolResult.fail("TOOL_ERROR", text[:4000])
        return ToolResult.success(content)

    # -- state
    def snapshot(self) -> dict:
        self._start()
        e = self.entry
        if e.state_command:
            return {"state": [{"line": ln} for ln in self._run_state_command() if ln.strip()]}
        if e.transport == "http":
            return {}
        return {"files": self._file_rows()}

    def _run_state_command(self) -> list[str]:
        """The operator's state command, confined like the server (a stdio server's episode), against
        the episode's workdir, with `state_command_env`."""
        e = self.entry
        work = self._work
        cmd = e.state_command
        argv = ["/bin/sh", "-c", cmd.replace("{workdir}", work)] if isinstance(cmd, str) else \
            [a.replace("{workdir}", work) for a in cmd]
        env = state_command_env(self._env_vars)
        status = None
        if self._jail is not None and self._jail.isolation == "namespaces":  # (none-unsafe: as it comes)
            status = os.path.join(self._episode_dir, "state.json")
            argv = self._jail.argv(argv, search_path=env.get("PATH"), status=status)
        try:
            p = subprocess.run(argv, check=False, cwd=work, env=env, capture_output=True, text=True,
                               timeout=float(self.limits.get("wall_seconds") or 30), start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(f"mcp env {e.id}: state_command failed: {err}") from None
        if status is not None:
            failed = self._jail.failure(read_status(status), f"mcp env {e.id}: state_command")
            if failed is not None:
                raise failed
        lines = p.stdout.splitlines()
        if p.returncode != 0:
            lines.append(f"<state_command exit {p.returncode}: {p.stderr.strip()[:200]}>")
        return lines

    def _excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        for pat in self.entry.state_excludes:
            pat = pat.rstrip("/")
            for i in range(1, len(parts) + 1):
                if fnmatch.fnmatchcase("/".join(parts[:i]), pat):
                    return True
        return False

    def _file_rows(self) -> list[dict]:
        """{path, sha256} of the workdir's files, read without following a link (the agent may
        have swapped any part of it for one) and without blocking (a FIFO, a device: "special")."""
        rows = []
        for dirpath, dirnames, filenames, dfd in os.fwalk(self._work):
            reld = os.path.relpath(dirpath, self._work)
            dirnames[:] = sorted(d for d in dirnames
                                 if not self._excluded(os.path.normpath(os.path.join(reld, d))))
            for f in sorted(filenames):
                rel = os.path.normpath(os.path.join(reld, f))
                if not self._excluded(rel):
                    rows.append({"path": rel, "sha256": _digest(f, dfd)})
        return rows


def _digest(name: str, dir_fd: int) -> str:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except OSError as err:
        return f"unreadable: {err.strerror}"
    if stat.S_ISLNK(st.st_mode):
        try:
            return "symlink:" + os.readlink(name, dir_fd=dir_fd)
        except OSError as err:
            return f"unreadable: {err.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"special:{stat.filemode(st.st_mode)[0]}"
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as err:
        return f"unreadable: {err.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            return "special:?"
        h = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            h.update(chunk)
        return h.hexdigest()
    except OSError as err:
        return f"unreadable: {err.strerror}"
    finally:
        os.close(fd)
