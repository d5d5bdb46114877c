"""The `mcp` environment backend: live MCP servers registered by the operator (see env.py,
servers.py; docs/mcp.md)."""

from __future__ import annotations

from toolkit.envs.base import register_backend
from toolkit.envs.mcp.env import McpEnvironment, sanitize_names
from toolkit.envs.mcp.servers import (
    McpConfigError,
    ServerEntry,
    load_servers,
    server,
    servers,
    set_servers,
)
from toolkit.envs.mcp.session import McpUnavailable

__all__ = [
    "McpConfigError",
    "McpEnvironment",
    "McpUnavailable",
    "ServerEntry",
    "list_tools",
    "load_servers",
    "sanitize_names",
    "server",
    "servers",
    "set_servers",
]


def list_tools(sid: str, workdir: str | None = None) -> tuple[list[dict], dict[str, dict], dict]:
    """The live server's tools: (OpenAI schemas, {name: meta with the original name and
    annotations}, serverInfo). Starts the server once and stops it."""
    env = McpEnvironment(server(sid), workdir=workdir)
    try:
        tools = env.tools()
        return tools, env.tool_meta(), dict(env._session.server_info if env._session else {})
    finally:
        env.close()


register_backend("mcp", McpEnvironment.from_ref,
                 doc="a live MCP server registered by the operator (--mcp-servers): one server process per "
                     "episode over stdio (or streamable HTTP), state from its state_command or the workdir")
