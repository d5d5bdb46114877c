"""The docker backend (optional: pip install docker): each call in a throw-away container."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

from toolkit.sandbox.confine import _WORKDIR
from toolkit.sandbox.isolation import _note_used
from toolkit.sandbox.limits import SandboxLimits
from toolkit.sandbox.pool import _classify, _fmt_s
from toolkit.sandbox.result import SandboxResult, SandboxUnavailable
from toolkit.sandbox.worker import _SANDBOX_FILE, _w_execute, _w_format_exc

_DOCKER_IMAGE_ENV = "TOOLKIT_SANDBOX_DOCKER_IMAGE"
_DOCKER_MARK = "\x00TOOLKIT-SANDBOX-RESULT\x00"


def _docker_client():
    try:
        import docker  # type: ignore
    except ImportError as e:
        raise SandboxUnavailable(
            "docker sandbox unavailable: the 'docker' Python package is not installed "
            f"({e}); `pip install docker` and run a Docker engine, or use --sandbox process") from e
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as e:  # noqa: BLE001
        raise SandboxUnavailable(
            "docker sandbox unavailable: no Docker engine is reachable "
            f"({type(e).__name__}: {str(e)[:200]}); use --sandbox process") from e
    return client


def docker_status() -> str:
    try:
        _docker_client()
        return "available"
    except SandboxUnavailable as e:
        return "unavailable: " + str(e).split("unavailable: ", 1)[-1]


def _docker_runner_source() -> str:
    import inspect

    parts = ["import json, os, sys, time\nfrom typing import Any\n",
             f"_SANDBOX_FILE = {_SANDBOX_FILE!r}\n",
             inspect.getsource(_w_format_exc), inspect.getsource(_w_execute),
             r'''
def _main():
    import base64, tempfile
    req = json.loads(base64.b64decode("".join(sys.argv[1:])))
    real_out = os.dup(1)
    out = tempfile.TemporaryFile(); err = tempfile.TemporaryFile(); inp = tempfile.TemporaryFile()
    inp.write((req.get("stdin") or "").encode()); inp.flush(); inp.seek(0)
    os.dup2(inp.fileno(), 0); os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
    import io
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  line_buffering=True)
    t0 = time.monotonic()
    raw = _w_execute(req)
    dt = time.monotonic() - t0
    for s in (sys.stdout, sys.stderr):
        try: s.flush()
        except Exception: pass
    def rd(f):
        f.seek(0); return f.read(1 << 20).decode("utf-8", "replace")
    doc = {"result": raw.decode("utf-8", "surrogatepass"), "stdout": rd(out), "stderr": rd(err),
           "duration_s": dt}
    os.write(real_out, (''' + repr(_DOCKER_MARK) + r''' + json.dumps(doc)).encode())
_main()
'''.replace("_w_execute(req)", "_w_execute(req)")]
    return "\n".join(parts)


def _docker_run(req: dict, limits: SandboxLimits) -> SandboxResult:  # pragma: no cover - needs engine
    import base64

    client = _docker_client()
    from docker.types import Ulimit  # type: ignore

    req = dict(req)
    req["limits"] = asdict(limits)
    blob = base64.b64encode(json.dumps(req).encode()).decode()
    chunks = [blob[i:i + 100_000] for i in range(0, len(blob), 100_000)] or [""]
    image = os.environ.get(_DOCKER_IMAGE_ENV) or f"python:{sys.version_info[0]}.{sys.version_info[1]}-slim"
    cpu = max(1, int(-(-float(limits.cpu_seconds) // 1)))
    fsz = int(limits.file_size_mb) << 20
    t0 = time.monotonic()
    container = client.containers.run(
        image, ["python", "-I", "-c", _docker_runner_source(), *chunks], detach=True,
        network_disabled=not limits.network, network_mode=None if limits.network else "none",
        mem_limit=f"{int(limits.memory_mb)}m", memswap_limit=f"{int(limits.memory_mb)}m",
        pids_limit=int(limits.max_processes), read_only=True,
        tmpfs={_WORKDIR: f"size={max(32, limits.file_size_mb * 4)}m,mode=1777", "/tmp": "size=16m"},
        working_dir=_WORKDIR, user="65534:65534", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], environment={"HOME": _WORKDIR, "TMPDIR": _WORKDIR},
        ulimits=[Ulimit(name="cpu", soft=cpu, hard=cpu + 1), Ulimit(name="fsize", soft=fsz, hard=fsz),
                 Ulimit(name="core", soft=0, hard=0)],
    )
    killed = None
    status_code = None
    try:
        try:
            status_code = container.wait(timeout=float(limits.wall_seconds) + 2.0).get("StatusCode")
        except Exception:  # noqa: BLE001 - requests ReadTimeout / ConnectionError
            killed = "wall_timeout"
            try:
                container.kill()
            except Exception:  # noqa: BLE001
                pass
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001
            pass
    dt = time.monotonic() - t0
    if killed:
        return SandboxResult(ok=False, killed=killed, duration_s=dt, error_type="TimeoutError",
                             isolation="docker",
                             error=f"TimeoutError: wall time {_fmt_s(limits.wall_seconds)}s exceeded")
    if _DOCKER_MARK not in logs:
        sig = {137: "SIGKILL", 152: "SIGXCPU", 153: "SIGXFSZ"}.get(status_code or 0)
        return SandboxResult(ok=False, stderr=logs[-20000:], duration_s=dt,
                             killed="cpu_limit" if sig == "SIGXCPU" else
                             ("memory" if sig == "SIGKILL" else sig),
                             error=f"SandboxError: container exited with status {status_code} "
                                   "without a result", error_type="SandboxError")
    doc = json.loads(logs.split(_DOCKER_MARK, 1)[1])
    hdr = {"status": 0, "killed": None, "duration_s": doc.get("duration_s", dt),
           "stdout": doc.get("stdout", ""), "stderr": doc.get("stderr", "")}
    res = _classify(hdr, doc.get("result", "").encode("utf-8", "surrogatepass"), limits)
    res.isolation = "docker"
    _note_used("docker")
    return res
