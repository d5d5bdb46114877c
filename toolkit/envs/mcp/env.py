"""The mcp backend: a live MCP server as an environment (one server process per episode).

Env ref (a record's `env` field)::

    {"backend": "mcp", "id": "git",                 # a server the OPERATOR registered (servers.py)
     "config": {"workdir": "template-repo/",        # copied fresh for every episode (the server's cwd)
                "exclude_keys": [...], "policy": "..."}}

A record cannot carry a command (`McpConfigError`). Per episode (`reset()`): a fresh copy of the
workdir in a private temp directory, the server started there through the launcher (operator
limits, no network unless the operator allows it, own process group) with the official `mcp`
client over stdio; `tools()` come from the live `tools/list` (names sanitized to OpenAI's
`^[a-zA-Z0-9_-]{1,64}$`, the original kept for `tools/call`; annotations kept: `tool_meta()`);
`call()` is `tools/call` (`isError` → a failed step, code TOOL_ERROR); `close()` / the next
`reset()` ends the session and kills the process group.

State (`snapshot()`): the output of the server entry's `state_command` run in the workdir copy,
one row per non-empty line (`{"state": [{"line": ...}]}`), or else the content of the workdir:
`{"files": [{"path", "sha256"}]}` without the entry's `state_excludes` (glob patterns on the
relative path; a pattern matching a directory excludes everything under it). So `state_diff`
works on real servers. A URL (streamable HTTP) server has no workdir the toolkit owns: it is
stateless (`{}`) unless the entry gives a `state_command`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import os
import shutil
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
    server,
)
from toolkit.envs.mcp.session import McpSession, McpUnavailable

from toolkit.formats.tools import NAME_RE, sanitize_names  # noqa: F401  (the same rule as tools import)
_LOGGED: set[str] = set()
# what the server process may see of the toolkit's environment (plus the entry's own env)
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TERM", "SYSTEMROOT")


def _log_once(msg: str) -> None:
    if msg not in _LOGGED:
        _LOGGED.add(msg)
        from toolkit.io import log

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

    @classmethod
    def from_ref(cls, ref: Any) -> McpEnvironment:
        if hasattr(ref, "model_dump"):
            ref = ref.model_dump(exclude_none=True)
        ref = dict(ref or {})
        check_record_ref(ref)
        entry = server(ref.get("id"))
        cfg = ref.get("config") or {}
        if ref.get("state"):
            raise McpConfigError("env.state: an mcp environment's initial state is its workdir "
                                 "(env.config.workdir), not an inline state")
        workdir = cfg.get("workdir") or ref.get("path")
        if workdir is not None and not isinstance(workdir, str):
            raise McpConfigError("env.config.workdir must be a path string")
        return cls(entry, workdir=workdir, policy=str(cfg.get("policy") or ""),
                   exclude_keys=[str(k) for k in cfg.get("exclude_keys") or []])

    # -- limits
    def _limits(self) -> dict:
        """The operator's sandbox limits with the server entry's own (also the operator's) on top."""
        from toolkit.sandbox import operator_limits, parse_limits

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
            env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
            env.update({"HOME": tmp, "TMPDIR": tmp})
            env.update({k: subst(v) for k, v in e.env.items()})
            self._env_vars = env
            self._work = work
            sess = McpSession(e, cwd=work, env=env, limits=self.limits,
                              errlog=os.path.join(tmp, "server.stderr"),
                              status_file=os.path.join(tmp, "launch.json"),
                              args=[subst(a) for a in e.args])
            raw = sess.start()
            self._session = sess
            self.episodes += 1
            net = sess.status.get("network")
            if isinstance(net, str) and net.startswith("unavailable"):
                from toolkit.io import note_for_provenance

                note_for_provenance("mcp_network", f"{e.id}: network isolation {net}")
                _log_once(f"mcp env {e.id}: network isolation {net}; the server runs with the host's network")
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
        e = self.entry
        work = self._work
        cmd = e.state_command
        argv = ["/bin/sh", "-c", cmd.replace("{workdir}", work)] if isinstance(cmd, str) else \
            [a.replace("{workdir}", work) for a in cmd]
        try:
            p = subprocess.run(argv, check=False, cwd=work, env=self._env_vars, capture_output=True, text=True,
                               timeout=float(self.limits.get("wall_seconds") or 30), start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(f"mcp env {e.id}: state_command failed: {err}") from None
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
        rows = []
        root = self._work
        for dirpath, dirnames, filenames in os.walk(root):
            reld = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames
                                 if not self._excluded(os.path.normpath(os.path.join(reld, d))))
            for f in sorted(filenames):
                rel = os.path.normpath(os.path.join(reld, f))
                if self._excluded(rel):
                    continue
                p = os.path.join(dirpath, f)
                if os.path.islink(p):
                    digest = "symlink:" + os.readlink(p)
                else:
                    h = hashlib.sha256()
                    try:
                        with open(p, "rb") as fh:
                            for chunk in iter(lambda: fh.read(1 << 20), b""):
                                h.update(chunk)
                    except OSError as err:
                        digest = f"unreadable: {err.strerror}"
                    else:
                        digest = h.hexdigest()
                rows.append({"path": rel, "sha256": digest})
        return rows
