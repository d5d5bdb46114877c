"""The embedded llama.cpp server stays bounded: prompt cache counted by real memory (and off by
default), an idle timeout, its RSS in `serve --status` / doctor, and the real model's name.

Every test that starts a server uses its own TOOLKIT_HOME (so its own state file, lock and
port) and stops only that server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import ROOT, run_cmd
from toolkit.llm import embedded

_OK, _WHY = embedded.embedded_available()
needs_server = pytest.mark.skipif(not _OK, reason=f"embedded backend unavailable: {_WHY}")


def test_model_name_is_the_real_model(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLKIT_EMBEDDED_MODEL", raising=False)
    assert embedded.embedded_model_name() == embedded.EMBEDDED_MODEL_NAME
    bundled = os.path.join(str(tmp_path), embedded.EMBEDDED_PACKAGE, "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert embedded.embedded_model_name(bundled) == embedded.EMBEDDED_MODEL_NAME
    other = tmp_path / "qwen2.5-0.5b-instruct-q4_k_m.gguf"
    other.write_bytes(b"GGUF")
    monkeypatch.setenv("TOOLKIT_EMBEDDED_MODEL", str(other))
    assert embedded.embedded_model_name() == "qwen2.5-0.5b-instruct-q4_k_m"
    # the LLM client keys requests (and so its cache) on that name, not on SmolLM2's
    from toolkit.llm import LLMClient, LLMConfig

    assert LLMClient(LLMConfig())._model == "qwen2.5-0.5b-instruct-q4_k_m"
    assert embedded._same_model({"model_path": str(other)}, str(other))
    assert not embedded._same_model({"model_path": bundled}, str(other))
    # a copy of the same GGUF in another environment (another checkout's venv) is the same model
    copy_dir = tmp_path / "venv2"
    copy_dir.mkdir()
    (copy_dir / other.name).write_bytes(other.read_bytes())
    assert embedded._same_model({"model_path": str(other)}, str(copy_dir / other.name))
    (copy_dir / other.name).write_bytes(b"GGUF-different-weights")
    assert not embedded._same_model({"model_path": str(other)}, str(copy_dir / other.name))


def test_prompt_cache_is_bounded_by_the_memory_it_really_holds():
    """Each saved state keeps a 512 x vocab float32 logits array the stock cache does not count."""
    pytest.importorskip("llama_cpp")
    prog = embedded._CACHE_PATCH + (
        "import numpy as np\n"
        "from llama_cpp.llama import LlamaState\n"
        "from llama_cpp.llama_cache import LlamaRAMCache\n"
        "c = LlamaRAMCache(capacity_bytes=250 << 20)\n"
        "for i in range(6):\n"
        "    scores = np.zeros((512, 49152), dtype=np.single)\n"  # 96 MiB, like SmolLM2's
        "    c[(i, 1, 2)] = LlamaState(np.zeros(8, dtype=np.intc), scores, 3, b'x' * 1000, 1000, 0)\n"
        "print(len(c.cache_state), c.cache_size)\n")
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    n, size = map(int, p.stdout.split())
    assert n == 2 and size <= 250 << 20  # unpatched: all 6 kept (576 MiB "counted" as 6 KB)


@pytest.fixture
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TOOLKIT_EMBEDDED_PORT", raising=False)
    yield str(tmp_path / "home")
    embedded.stop_embedded_server()  # the server recorded in OUR home only


def _chat(base: str, model: str, text: str, max_tokens: int = 4) -> dict:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}],
                       "max_tokens": max_tokens, "temperature": 0.0}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


@needs_server
@pytest.mark.embedded
def test_real_model_name_rss_status_and_idle_timeout(private_home, tmp_path, monkeypatch):
    gguf = tmp_path / "my-tiny-model.gguf"
    os.symlink(embedded.embedded_model_path(), gguf)
    monkeypatch.setenv("TOOLKIT_EMBEDDED_MODEL", str(gguf))
    monkeypatch.setenv("TOOLKIT_EMBEDDED_IDLE_TIMEOUT", "4")
    base = embedded.ensure_embedded_server()
    with urllib.request.urlopen(base + "/models", timeout=30) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["my-tiny-model"]
    assert _chat(base, "my-tiny-model", "Hi")["model"] == "my-tiny-model"
    p = run_cmd(["toolkit", "serve", "--status"], env={"TOOLKIT_HOME": private_home,
                                                       "TOOLKIT_EMBEDDED_MODEL": str(gguf)})
    st = json.loads(p.stdout)
    assert st["running"] and st["model"] == "my-tiny-model" and st["model_path"] == str(gguf)
    assert 50 < st["rss_mb"] < 2048 and st["idle_timeout_s"] == 4 and st["prompt_cache_mb"] == 0
    pid = st["pid"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and embedded._pid_alive(pid):
        time.sleep(0.5)
    assert not embedded._pid_alive(pid), "the server did not exit after its idle timeout"
    assert embedded.embedded_status()["running"] is False
    log = open(os.path.join(private_home, embedded.LOG_FILE)).read()
    assert "idle for 4s, exiting" in log


@needs_server
@pytest.mark.embedded
@pytest.mark.slow
def test_soak_200_requests_keeps_rss_flat_and_under_2gb(private_home, monkeypatch):
    """The audit: after the demo and the test suite the shared server held 10.8 GB RSS."""
    monkeypatch.delenv("TOOLKIT_EMBEDDED_MODEL", raising=False)
    monkeypatch.delenv("TOOLKIT_EMBEDDED_CACHE_MB", raising=False)
    base = embedded.ensure_embedded_server()
    st = embedded.embedded_status()
    pid, model = st["pid"], st["model"]
    rss = []
    for i in range(200):
        _chat(base, model, f"Say the number {i * 7919}.")  # distinct short prompts
        rss.append(embedded._rss_mb(pid))
    early, late = rss[19], rss[-1]
    print(f"soak RSS MB: after 1 {rss[0]}, after 20 {early}, max {max(rss)}, after 200 {late}")
    assert max(rss) < 2048
    assert late - early < 150, rss[::20]  # flat: no per-request growth after warm-up
