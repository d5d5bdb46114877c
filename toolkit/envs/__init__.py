"""Environment backends. See base.py for the protocol; `load_env(record.env)` rebuilds any of them."""

from __future__ import annotations

from toolkit import registry
from toolkit.envs.base import (  # noqa: F401
    BackendCapabilities, Environment, ToolResult, backend_capabilities, backends, load_env, register_backend)


def import_builtin_backends() -> dict[str, str]:
    """Load the `toolkit.backends` plugin modules; returns {module: "ok" | error string}."""
    registry.load("backends")
    status = {m: "ok" for k, _, m in registry.BUILTINS if k == "backends"}
    for e in registry.errors():
        if e.kind == "backends":
            status[e.module] = e.error
    return status
