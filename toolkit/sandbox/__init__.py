"""Sandbox for untrusted code (LLM-generated verifiers and generated tool code).

Backends
--------
``process`` (the default, also what ``auto`` means unless ``set_default_backend`` / the
``TOOLKIT_SANDBOX`` env var says otherwise): a pool of warm *zygote* workers. Each worker is a
Python process started once with an empty environment; on Linux, when the kernel lets us, it
enters fresh mount, pid, network, ipc and uts namespaces (plus a user namespace when not root),
``pivot_root``\\s into a read-only tmpfs that holds only read-only binds of the system and Python
directories, and then serves requests. Each request forks a child that

* gets a fresh, size-limited tmpfs mounted at ``/sandbox`` as its working directory,
* drops to an unprivileged uid unique to the worker (root host) or drops every capability
  (user-namespace mode), sets ``no_new_privs``,
* applies RLIMIT_CPU / RLIMIT_AS / RLIMIT_FSIZE / RLIMIT_NPROC (+ NOFILE, CORE),
* gets a cleared environment (PATH, HOME, TMPDIR, LANG only),
* installs an audit hook (network and writes outside the work dir) as a last layer,
* executes the code and returns a JSON result over a pipe.

The worker enforces the wall timeout and, after every call, kills every process the call left
behind (``kill(-1)`` from pid 1 of the private pid namespace). When namespaces are unavailable the
pool refuses (``SandboxUnavailable``) unless isolation "none-unsafe" was chosen explicitly.

``docker``: runs each call in a throw-away container through the ``docker`` SDK (optional extra).
If the SDK is missing or no engine is reachable, ``SandboxUnavailable`` is raised.

Public API: ``SandboxLimits``, ``SandboxResult``, ``run_function``, ``run_code``,
``isolation_report``, ``SandboxPool``, ``SandboxError``, ``SandboxUnavailable``,
``set_default_backend``, ``default_pool``.

Modules: ``limits`` (SandboxLimits, operator limits, clamping), ``result`` (SandboxResult and the
errors), ``isolation`` (isolation names and the process default), ``pool`` (the process backend:
SandboxPool and its workers), ``memcg`` (per-worker memory cgroups), ``docker`` (the docker
backend); ``worker`` and ``confine`` are the worker program, standard library only, shipped as
source to each worker (see ``pool._worker_program``); ``commands`` (host side) and ``launcher``
(standard library only) run operator commands, MCP servers and their state command, confined
with the same ``confine`` code. This package's ``__init__`` holds the default pool and backend
selection.
"""

from __future__ import annotations

import atexit
import os
import threading

from toolkit.sandbox.docker import _docker_run, docker_status
from toolkit.sandbox.isolation import (
    ISOLATIONS,
    _default_isolation,
    normalize_isolation,
    set_default_isolation,
    used_isolation,
)
from toolkit.sandbox.limits import (
    SandboxLimits,
    check_limits,
    clamp_limits,
    limits_for_data,
    operator_limits,
    parse_limits,
    set_operator_limits,
)
from toolkit.sandbox.pool import SandboxPool, _check_json
from toolkit.sandbox.result import SandboxError, SandboxResult, SandboxUnavailable

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxError",
    "SandboxUnavailable",
    "SandboxPool",
    "run_function",
    "run_code",
    "isolation_report",
    "default_pool",
    "set_default_backend",
    "set_default_isolation",
    "set_operator_limits",
    "operator_limits",
    "clamp_limits",
    "limits_for_data",
    "parse_limits",
    "check_limits",
    "normalize_isolation",
    "used_isolation",
    "ISOLATIONS",
    "docker_status",
]


# ----------------------------------------------------------------------------------------------
# default pool, backend selection

_DEFAULT_POOL: SandboxPool | None = None
_DEFAULT_LOCK = threading.Lock()
_DEFAULT_BACKEND = os.environ.get("TOOLKIT_SANDBOX", "process") or "process"


def default_pool() -> SandboxPool:
    """The module-level pool (created lazily, shut down at exit; re-created after fork or when the
    default isolation changes)."""
    global _DEFAULT_POOL
    want = _default_isolation()
    if want == "docker":
        want = "namespaces"
    with _DEFAULT_LOCK:
        if (_DEFAULT_POOL is None or _DEFAULT_POOL._pid != os.getpid() or _DEFAULT_POOL._closed
                or _DEFAULT_POOL.isolation != want):
            old = _DEFAULT_POOL
            _DEFAULT_POOL = SandboxPool(isolation=want)
            atexit.register(_DEFAULT_POOL.shutdown)
            if old is not None and old._pid == os.getpid() and not old._closed:
                old.shutdown()
        return _DEFAULT_POOL


def set_default_backend(name: str) -> None:
    """What backend="auto" resolves to ("process" or "docker"); e.g. from `--sandbox docker`."""
    global _DEFAULT_BACKEND
    if name not in ("process", "docker", "auto"):
        raise ValueError(f"unknown sandbox backend {name!r}; use process|docker")
    _DEFAULT_BACKEND = "process" if name == "auto" else name


def _resolve_backend(backend: str) -> str:
    b = (backend or "auto").lower()
    if b == "auto":
        b = _DEFAULT_BACKEND if _DEFAULT_BACKEND in ("process", "docker") else "process"
        if _default_isolation() == "docker":
            b = "docker"
    if b not in ("process", "docker"):
        raise ValueError(f"unknown sandbox backend {backend!r}; use auto|process|docker")
    return b


def run_function(source: str, func: str, args: list | None = None, kwargs: dict | None = None,
                 limits: SandboxLimits | None = None, backend: str = "auto") -> SandboxResult:
    """exec `source` in a fresh module, call func(*args, **kwargs) and return its JSON value."""
    limits = check_limits(limits or operator_limits())
    req = {"kind": "function", "source": source, "func": func, "args": list(args or []),
           "kwargs": dict(kwargs or {})}
    _check_json(req)
    if _resolve_backend(backend) == "docker":
        return _docker_run(req, limits)
    return default_pool()._run(req, limits)


def run_code(source: str, stdin: str = "", limits: SandboxLimits | None = None,
             backend: str = "auto") -> SandboxResult:
    """Run a script; value is the exit code (0 on success); stdout/stderr captured."""
    limits = check_limits(limits or operator_limits())
    req = {"kind": "code", "source": source, "stdin": stdin or ""}
    if _resolve_backend(backend) == "docker":
        return _docker_run(req, limits)
    return default_pool()._run(req, limits)


def isolation_report(probe: bool = True) -> dict:
    """What isolation is actually active (with a live probe), plus the docker backend status."""
    try:
        rep = default_pool().isolation_report(probe=probe)
    except SandboxError as e:
        rep = {"backend": "process", "error": str(e)}
    rep["docker"] = docker_status()
    rep["default_backend"] = _DEFAULT_BACKEND
    try:
        rep["default_isolation"] = _default_isolation()
    except ValueError as e:
        rep["default_isolation"] = f"invalid: {e}"
    return rep
