"""Serve any HF checkpoint (base or trained) through a real OpenAI-compatible server, started and
stopped by the toolkit like the embedded llama.cpp server (`toolkit serve --model PATH|NAME
[--backend auto|llamacpp|transformers|vllm]`): vLLM when a GPU and vLLM are there; on CPU a llama
checkpoint is exported to an F16 GGUF (toolkit.llm.gguf_export) and served by llama.cpp's server,
which keeps each conversation's KV cache between turns (docs/learn.md has the measured
difference); other architectures get `transformers serve`.

One server per checkpoint: its pid, port and command live in `$TOOLKIT_HOME/served/<key>.json`
(key = a hash of the checkpoint's absolute path); a second `serve` of the same checkpoint reuses a
healthy server; `stop_served(model)` / `toolkit serve --model X --stop` stops it.  The server
answers to the checkpoint's absolute path as model name: pass it as `--model` (rollout records it
as the trajectory's agent model).  Only loopback; a minimal environment (`embedded.server_env`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from toolkit.llm.embedded import (
    _free_port,
    _log_tail,
    _pid_alive,
    _terminate,
    server_env,
    toolkit_home,
)
from toolkit.llm.models import resolve_model

__all__ = ["ServeError", "pick_backend", "serve_model", "served_status", "stop_served"]


BACKENDS = ("auto", "llamacpp", "transformers", "vllm")


class ServeError(RuntimeError):
    pass


def _dir() -> str:
    d = os.path.join(toolkit_home(), "served")
    os.makedirs(d, exist_ok=True)
    return d


def _key(path: str) -> str:
    return hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]


def _state_file(path: str) -> str:
    return os.path.join(_dir(), _key(path) + ".json")


def _read(path: str) -> dict | None:
    try:
        with open(_state_file(path)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _http_json(url: str, timeout: float) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read() or b"null")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _is_ours(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        return b"toolkit-serve-hf" in cmd or b"vllm" in cmd or b"transformers" in cmd or b"llama_cpp" in cmd
    except OSError:
        return _pid_alive(pid)


def _healthy(st: dict | None, timeout: float = 5.0) -> bool:
    if not st or not st.get("pid"):
        return False
    pid = int(st["pid"])
    return _pid_alive(pid) and _is_ours(pid) and _http_json(st["base_url"] + "/models", timeout) is not None


def pick_backend(backend: str = "auto", path: str | None = None) -> str:
    """vllm (a GPU and the vllm package); on CPU llamacpp (llama-cpp-python installed and `path` a
    llama checkpoint: it is exported to GGUF, toolkit.llm.gguf_export) else transformers."""
    if backend in BACKENDS[1:]:
        return backend
    if backend != "auto":
        raise ServeError(f"unknown serve backend {backend!r}: {', '.join(BACKENDS)}")
    try:
        import torch

        gpu = bool(torch.cuda.is_available())
    except ImportError:
        gpu = False
    if gpu and importlib.util.find_spec("vllm") is not None:
        return "vllm"
    if not gpu and path and importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("gguf"):
        try:
            with open(os.path.join(path, "config.json")) as f:
                if json.load(f).get("model_type") == "llama":
                    return "llamacpp"
        except (OSError, ValueError):
            pass
    return "transformers"


# run as `python -c BOOT <args>`: a recognizable command line (the marker) for pid checks
_BOOT_TRANSFORMERS = ("# toolkit-serve-hf\nimport sys\nfrom transformers.cli.transformers import main\n"
                      "sys.argv = ['transformers'] + sys.argv[1:]\nsys.exit(main())\n")
_BOOT_VLLM = ("# toolkit-serve-hf\nimport sys, runpy\nsys.argv = ['vllm'] + sys.argv[1:]\n"
              "from vllm.entrypoints.cli.main import main\nsys.exit(main())\n")


def _command(backend: str, path: str, port: int, device: str | None, log=None) -> list[str]:
    if backend == "llamacpp":
        from toolkit.llm.embedded import _BOOTSTRAP
        from toolkit.llm.gguf_export import ExportError, export_gguf

        try:
            gguf_path = export_gguf(path, log=log)
        except ExportError as e:
            raise ServeError(f"--backend llamacpp: {e}") from None
        threads = os.environ.get("TOOLKIT_EMBEDDED_THREADS") or str(os.cpu_count() or 1)
        return [sys.executable, "-c", "# toolkit-serve-hf\n" + _BOOTSTRAP, "--model", gguf_path,
                "--model_alias", path, "--host", "127.0.0.1", "--port", str(port), "--chat_format", "chatml",
                "--n_ctx", os.environ.get("TOOLKIT_EMBEDDED_N_CTX", "8192"), "--n_threads", threads,
                "--n_threads_batch", threads, "--interrupt_requests", "False", "--verbose", "False",
                "--logits_all", "False"]
    if backend == "vllm":
        return [sys.executable, "-c", _BOOT_VLLM, "serve", path, "--host", "127.0.0.1", "--port", str(port),
                "--served-model-name", path, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    return [sys.executable, "-c", _BOOT_TRANSFORMERS, "serve", path, "--host", "127.0.0.1", "--port", str(port),
            "--device", device or "cpu", "--dtype", "float32" if (device or "cpu") == "cpu" else "auto",
            "--log-level", "warning"]


def serve_model(model: str, backend: str = "auto", port: int | None = None, device: str | None = None,
                timeout: float | None = None, log=None) -> dict:
    """Start (or reuse) a server for `model` (a checkpoint path or a known name); its state:
    {"base_url", "model", "pid", "port", "backend", "log", ...}."""
    path = resolve_model(model, log=log)
    if not path or not os.path.isdir(path):
        raise ServeError(f"--model {model!r}: not a checkpoint directory nor a known model name "
                         "(toolkit models list)")
    path = os.path.abspath(path)
    st = _read(path)
    if _healthy(st):
        return st
    if st and st.get("pid") and _pid_alive(int(st["pid"])) and _is_ours(int(st["pid"])):
        _terminate(int(st["pid"]))
    be = pick_backend(backend, path)
    port = port or _free_port()
    timeout = timeout or float(os.environ.get("TOOLKIT_SERVE_START_TIMEOUT", "300"))
    log_path = os.path.join(_dir(), _key(path) + ".log")
    cmd = _command(be, path, port, device, log=log)
    env = server_env()  # OMP_WAIT_POLICY=PASSIVE: spinning OpenMP workers collapse throughput on a shared box
    for k in ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CUDA_HOME"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local checkpoint: never reach for the hub
    t0 = time.monotonic()
    with open(log_path, "ab") as lf:
        lf.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {be} serve {path} on port {port}\n".encode())
        lf.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    base = f"http://127.0.0.1:{port}/v1"
    while True:
        if proc.poll() is not None:
            raise ServeError(f"{be} serve exited with code {proc.returncode} during startup; log: {log_path}\n"
                             f"{_log_tail(log_path)}")
        if _http_json(base + "/models", 2.0) is not None:
            break
        if time.monotonic() - t0 > timeout:
            _terminate(proc.pid)
            raise ServeError(f"{be} serve did not answer within {timeout:.0f}s; log: {log_path}\n{_log_tail(log_path)}")
        time.sleep(0.5)
    st = {"base_url": base, "model": path, "pid": proc.pid, "port": port, "backend": be,
          "device": device or ("cuda" if be == "vllm" else "cpu"), "log": log_path,
          **({"gguf": cmd[cmd.index("--model") + 1]} if be == "llamacpp" else {}),
          "started_at": time.time(), "startup_s": round(time.monotonic() - t0, 2)}
    tmp = _state_file(path) + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(st, f, indent=1)
    os.replace(tmp, _state_file(path))
    return st


def _path_of(model: str) -> str:
    """The checkpoint path a server of `model` was started for, without materializing anything."""
    from toolkit.llm.models import known_model, models_dir

    if not os.path.exists(model) and known_model(model):
        return os.path.join(models_dir(), known_model(model).name)
    return os.path.abspath(model)


def stop_served(model: str | None = None) -> list[str]:
    """Stop the server of `model` (every served checkpoint when None); the paths stopped."""
    stopped = []
    files = ([_state_file(_path_of(model))] if model
             else [os.path.join(_dir(), f) for f in os.listdir(_dir()) if f.endswith(".json")])
    for sf in files:
        try:
            with open(sf) as f:
                st = json.load(f)
        except (OSError, ValueError):
            continue
        pid = int(st.get("pid") or 0)
        if pid and _pid_alive(pid) and _is_ours(pid):
            _terminate(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session: children (workers) too
            stopped.append(st.get("model", "?"))
        with contextlib.suppress(OSError):
            os.remove(sf)
    return stopped


def served_status() -> list[dict]:
    out = []
    for f in sorted(os.listdir(_dir())):
        if f.endswith(".json"):
            try:
                with open(os.path.join(_dir(), f)) as fh:
                    st = json.load(fh)
            except (OSError, ValueError):
                continue
            st["running"] = _healthy(st, 2.0)
            out.append(st)
    return out
