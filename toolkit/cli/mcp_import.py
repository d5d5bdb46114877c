"""`toolkit tools import mcp:<id>`: the tools of a live MCP server (registered by the operator)
through the tool-doc importer (toolkit.flows.astra.tooldocs), as a server record whose env is the
real `mcp` backend (so gen-plan / rollout / verify run the real server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.envs.mcp import list_tools, server, set_servers
from toolkit.flows.astra import tooldocs as T


def live_document(sid: str, workdir: str | None = None) -> tuple[dict, dict]:
    """(an MCP tools/list document with the server's original names and annotations, the env ref)."""
    entry = server(sid)
    tools, meta, info = list_tools(sid, workdir=workdir)
    raw = []
    for t in tools:
        fn = t["function"]
        m = meta.get(fn["name"], {})
        item = {"name": m.get("name", fn["name"]), "description": fn.get("description") or "",
                "inputSchema": fn.get("parameters") or {"type": "object", "properties": {}}}
        for k in ("annotations", "outputSchema", "title"):
            if m.get(k):
                item[k] = m[k]
        raw.append(item)
    ref: dict[str, Any] = {"backend": "mcp", "id": sid}
    if workdir:
        ref["config"] = {"workdir": str(Path(workdir).resolve())}
    desc = entry.description or (f"{info.get('name')} {info.get('version', '')}".strip() if info else "")
    return {"server": sid, "description": desc, "tools": raw}, ref


def import_live(specs: list[str], res: Any, *, mcp_servers: str | None = None, workdir: str | None = None,
                **kw: Any) -> None:
    """Adds one server per `mcp:<id>` spec to `res` (a tooldocs.ImportResult)."""
    if mcp_servers:
        set_servers(mcp_servers)
    for spec in specs:
        sid = spec.split(":", 1)[1]
        doc, ref = live_document(sid, workdir)
        before = len(res.servers)
        T.import_documents([(sid, doc)], result=res, **kw)
        for s in res.servers[before:]:
            s.env = ref
            s.source = "mcp"
