"""The operator's MCP servers: an `mcpServers` JSON file in the format MCP clients already use.

    {"mcpServers": {
       "git": {"command": "mcp-server-git", "args": ["--repository", "{workdir}"],
               "env": {"GIT_AUTHOR_NAME": "agent"},
               "state_command": "git status --porcelain; git log --format=%T",
               "state_excludes": [".git/index"],
               "limits": {"memory_mb": 1024, "cpu_seconds": 60},
               "workdir_roots": ["repos/"], "read_paths": ["/opt/node"],
               "startup_seconds": 60},
       "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {...}, "state_command": "..."}}}

Given by `--mcp-servers FILE` (every command), the recipe key `mcp_servers`, or
`TOOLKIT_MCP_SERVERS` (a path, or the JSON itself). Only the operator registers commands: a record
names a server by id (`{"backend": "mcp", "id": "git", "config": {"workdir": DIR}}`) and a record
that carries `command`, `args`, `env`, `url` ... is rejected (`McpConfigError`).

`{workdir}` in `args` / `env` values / `state_command` is replaced by the episode's copy of the
workdir (also the server's current directory).

Host paths come from the operator only: a record's `env.config.workdir` must resolve (after
symlinks and `..`) to a directory under one of the entry's `workdir_roots` or of the roots in
`TOOLKIT_MCP_WORKDIR_ROOTS` (paths separated by `:`); a relative workdir is looked up under the
roots. Relative roots in a servers file are relative to the file's directory. `read_paths`: host
directories the confined server may read besides the system, Python and its own installation
(`toolkit.sandbox.commands`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from toolkit.sandbox import parse_limits

ENV_VAR = "TOOLKIT_MCP_SERVERS"
ROOTS_VAR = "TOOLKIT_MCP_WORKDIR_ROOTS"
ENTRY_KEYS = {"command", "args", "env", "cwd", "url", "headers", "state_command", "state_excludes", "limits",
              "startup_seconds", "call_seconds", "description", "type", "transport", "disabled",
              "workdir_roots", "read_paths"}
# keys a record's env.config may carry (data): everything else is the operator's
RECORD_CONFIG_KEYS = {"workdir", "exclude_keys", "policy"}
OPERATOR_ONLY = ENTRY_KEYS - {"description"}


class McpConfigError(ValueError):
    """A bad mcpServers file or entry, or a record asking for what only the operator may give."""


@dataclass
class ServerEntry:
    id: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    state_command: str | list[str] | None = None
    state_excludes: list[str] = field(default_factory=list)
    limits: dict = field(default_factory=dict)
    startup_seconds: float = 60.0
    call_seconds: float | None = None
    description: str = ""
    workdir_roots: list[str] = field(default_factory=list)  # absolute (resolved against the file's dir)
    read_paths: list[str] = field(default_factory=list)

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"


_SERVERS: dict[str, ServerEntry] | None = None   # set_servers(); else $TOOLKIT_MCP_SERVERS
_SOURCE: str | None = None


def _paths(e: dict, key: str, sid: str, where: str, base: Path) -> list[str]:
    v = e.get(key) or []
    if not isinstance(v, list) or not all(isinstance(a, str) and a for a in v):
        raise McpConfigError(f"{where}: mcpServers.{sid}.{key}: expected a list of directory paths")
    return [str((base / Path(a).expanduser()).resolve()) for a in v]


def _entry(sid: str, e: Any, where: str, base: Path | None = None) -> ServerEntry:
    if not isinstance(e, dict):
        raise McpConfigError(f"{where}: mcpServers.{sid}: expected an object, got {type(e).__name__}")
    unknown = sorted(set(e) - ENTRY_KEYS)
    if unknown:
        raise McpConfigError(f"{where}: mcpServers.{sid}: unknown key(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(ENTRY_KEYS))})")
    if bool(e.get("command")) == bool(e.get("url")):
        raise McpConfigError(f"{where}: mcpServers.{sid}: give exactly one of `command` (stdio) or `url` "
                             "(streamable HTTP)")
    for k, typ in (("command", str), ("url", str), ("description", str)):
        if e.get(k) is not None and not isinstance(e[k], typ):
            raise McpConfigError(f"{where}: mcpServers.{sid}.{k}: expected a string")
    args = e.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}: mcpServers.{sid}.args: expected a list of strings")
    for k in ("env", "headers"):
        v = e.get(k) or {}
        if not isinstance(v, dict) or not all(isinstance(a, str) and isinstance(b, str) for a, b in v.items()):
            raise McpConfigError(f"{where}: mcpServers.{sid}.{k}: expected an object of strings")
    sc = e.get("state_command")
    if sc is not None and not (isinstance(sc, str) or (isinstance(sc, list) and all(isinstance(a, str) for a in sc))):
        raise McpConfigError(f"{where}: mcpServers.{sid}.state_command: expected a shell string or an argv list")
    ex = e.get("state_excludes") or []
    if not isinstance(ex, list) or not all(isinstance(a, str) for a in ex):
        raise McpConfigError(f"{where}: mcpServers.{sid}.state_excludes: expected a list of glob patterns")
    lim = e.get("limits") or {}
    if lim:
        try:
            parse_limits(lim)
        except ValueError as err:
            raise McpConfigError(f"{where}: mcpServers.{sid}.limits: {err}") from None
    return ServerEntry(id=sid, command=e.get("command"), args=list(args), env=dict(e.get("env") or {}),
                       url=e.get("url"), headers=dict(e.get("headers") or {}), state_command=sc,
                       state_excludes=list(ex), limits=dict(lim),
                       startup_seconds=float(e.get("startup_seconds") or 60.0),
                       call_seconds=float(e["call_seconds"]) if e.get("call_seconds") else None,
                       description=e.get("description") or "",
                       workdir_roots=_paths(e, "workdir_roots", sid, where, base or Path.cwd()),
                       read_paths=_paths(e, "read_paths", sid, where, base or Path.cwd()))


def parse_servers(doc: Any, where: str = "mcpServers", base: Path | None = None) -> dict[str, ServerEntry]:
    """{id: ServerEntry} from a parsed mcpServers document (McpConfigError naming the entry)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("mcpServers"), dict):
        raise McpConfigError(f"{where}: expected {{\"mcpServers\": {{id: {{command, args, env}}}}}}")
    out = {}
    for sid, e in doc["mcpServers"].items():
        if isinstance(e, dict) and e.get("disabled"):
            continue
        out[sid] = _entry(sid, e, where, base)
    return out


def load_servers(value: Any) -> dict[str, ServerEntry]:
    """From a path, a JSON string or a parsed dict."""
    if isinstance(value, dict):
        return parse_servers(value)
    text = str(value).strip()
    if text.startswith("{"):
        try:
            return parse_servers(json.loads(text), "mcp servers JSON")
        except json.JSONDecodeError as e:
            raise McpConfigError(f"mcp servers JSON: {e}") from None
    p = Path(text).expanduser()
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise McpConfigError(f"mcp servers file {text}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise McpConfigError(f"mcp servers file {text}: not JSON: {e}") from None
    return parse_servers(doc, str(p), p.resolve().parent)


def set_servers(value: Any) -> dict[str, ServerEntry]:
    """The operator's servers (`--mcp-servers`, recipe `mcp_servers`); None: back to $TOOLKIT_MCP_SERVERS."""
    global _SERVERS, _SOURCE
    if value is None:
        _SERVERS, _SOURCE = None, None
        return servers()
    _SERVERS = load_servers(value)
    _SOURCE = str(value) if not isinstance(value, dict) else "(mapping)"
    return dict(_SERVERS)


def servers() -> dict[str, ServerEntry]:
    if _SERVERS is not None:
        return dict(_SERVERS)
    v = os.environ.get(ENV_VAR)
    return load_servers(v) if v else {}


def server(sid: Any) -> ServerEntry:
    known = servers()
    if not isinstance(sid, str) or sid not in known:
        where = _SOURCE or (f"${ENV_VAR}" if os.environ.get(ENV_VAR) else None)
        raise McpConfigError(f"mcp server {sid!r} is not registered by the operator "
                             f"({'known: ' + ', '.join(sorted(known)) if known else 'no servers registered'}"
                             f"{'; from ' + where if where else ''}); register it in an mcpServers file given by "
                             f"--mcp-servers, the recipe key mcp_servers or ${ENV_VAR}")
    return known[sid]


def check_record_ref(ref: dict) -> None:
    """A record's env ref may name a server and give a workdir; it may not carry a command."""
    bad = sorted(k for k in ref if k in OPERATOR_ONLY)
    cfg = ref.get("config") or {}
    if not isinstance(cfg, dict):
        raise McpConfigError("env.config must be an object")
    bad += sorted(f"config.{k}" for k in cfg if k in OPERATOR_ONLY or k == "mcpServers")
    if bad:
        raise McpConfigError(f"env: a record cannot define an MCP server ({', '.join(bad)}): servers and their "
                             "commands are registered by the operator (--mcp-servers / mcp_servers / "
                             f"${ENV_VAR}); the record names one by `id`")
    unknown = sorted(k for k in cfg if k not in RECORD_CONFIG_KEYS)
    if unknown:
        raise McpConfigError(f"env.config: unknown key(s) {', '.join(unknown)} for the mcp backend "
                             f"(allowed: {', '.join(sorted(RECORD_CONFIG_KEYS))})")


def workdir_roots(entry: ServerEntry) -> list[str]:
    """The directories under which a record's workdir may lie: the entry's `workdir_roots` and
    $TOOLKIT_MCP_WORKDIR_ROOTS, after symlinks."""
    env = [p for p in os.environ.get(ROOTS_VAR, "").split(os.pathsep) if p.strip()]
    return [os.path.realpath(os.path.expanduser(p)) for p in list(entry.workdir_roots) + env]


def resolve_workdir(entry: ServerEntry, value: Any, field: str = "env.config.workdir") -> str:
    """A record's workdir as a real host directory under a root the operator registered; else
    McpConfigError naming `field`. A relative value is looked up under the roots, in order."""
    if not isinstance(value, str) or not value.strip():
        raise McpConfigError(f"{field}: expected a directory path string, got {value!r}")
    roots = workdir_roots(entry)
    if not roots:
        raise McpConfigError(f"{field}: {value!r}: no workdir root is registered for mcp server {entry.id!r}, so "
                             "a record cannot name a host directory; the operator registers roots with the "
                             f"entry's \"workdir_roots\" or ${ROOTS_VAR}")
    cands = [value] if os.path.isabs(value) else [os.path.join(r, value) for r in roots]
    inside = [real for real in map(os.path.realpath, cands)
              if any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)]
    for real in inside:
        if os.path.isdir(real):
            return real
    if inside:
        raise McpConfigError(f"{field}: {value!r} is not a directory (under {', '.join(roots)})")
    raise McpConfigError(f"{field}: {value!r} resolves to {os.path.realpath(cands[0])!r}, outside the workdir roots "
                         f"the operator registered for mcp server {entry.id!r} ({', '.join(roots)}); records name "
                         "data, the operator names host paths")
