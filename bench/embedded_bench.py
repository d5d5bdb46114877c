"""Embedded llama.cpp server: prompt-cache on/off latency and an RSS soak, on a PRIVATE server.

    python bench/embedded_bench.py                          # cache off vs on, 24 episode-like calls each
    python bench/embedded_bench.py --soak 200 --cache-mb 0  # 200 short requests, RSS after each

Each run starts its own server (its own TOOLKIT_HOME and port, so a shared server is never
touched), then stops it. "Episode-like" calls alternate two conversations (an agent with a long
system prompt and a user simulator), each growing by one exchange per turn, as rollouts do; the
soak sends short distinct prompts. Prints JSON: per-call latency (median / total), server RSS
(start, max, end, and the slope over the second half of the soak in MB per 100 requests).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from toolkit.llm import embedded  # noqa: E402

AGENT_SYS = ("You are an airline customer service agent. Follow the policy strictly. " +
             "Policy: " + " ".join(f"Rule {i}: reservations of class {i % 3} may be changed only "
                                    f"within {i + 1} days and only by the owner." for i in range(40)))
USER_SYS = ("You are playing the role of a customer who wants to change a flight. " +
            " ".join(f"Fact {i}: your reservation code is R{i:03d}." for i in range(20)))


def post(base: str, model: str, messages: list[dict], max_tokens: int) -> float:
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0.0, "seed": 1}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        json.loads(r.read())
    return time.perf_counter() - t0


class PrivateServer:
    def __init__(self, cache_mb: int, idle: float = 0.0) -> None:
        self.home = tempfile.mkdtemp(prefix="toolkit-embedded-bench-")
        self.env = {"TOOLKIT_HOME": self.home, "TOOLKIT_EMBEDDED_CACHE_MB": str(cache_mb),
                    "TOOLKIT_EMBEDDED_IDLE_TIMEOUT": str(idle), "TOOLKIT_EMBEDDED_PORT": ""}
        self.saved = {k: os.environ.get(k) for k in self.env}

    def __enter__(self) -> "PrivateServer":
        for k, v in self.env.items():
            if v:
                os.environ[k] = v
            else:
                os.environ.pop(k, None)
        self.base = embedded.ensure_embedded_server()
        st = embedded.embedded_status()
        self.pid, self.model = st["pid"], st["model"]
        return self

    def rss(self) -> float:
        return embedded._rss_mb(self.pid) or 0.0

    def __exit__(self, *exc) -> None:
        try:
            embedded.stop_embedded_server()
        finally:
            for k, v in self.saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def episodes(srv: PrivateServer, turns: int, max_tokens: int) -> dict:
    agent = [{"role": "system", "content": AGENT_SYS}]
    user = [{"role": "system", "content": USER_SYS}]
    lat = []
    rss = [srv.rss()]
    for t in range(turns):
        user.append({"role": "user", "content": f"The agent said: turn {t}. Reply briefly."})
        lat.append(post(srv.base, srv.model, user, max_tokens))
        user.append({"role": "assistant", "content": f"I want to change reservation R{t:03d}."})
        agent.append({"role": "user", "content": f"I want to change reservation R{t:03d}."})
        lat.append(post(srv.base, srv.model, agent, max_tokens))
        agent.append({"role": "assistant", "content": f"Let me look up R{t:03d} for you."})
        rss.append(srv.rss())
    return {"calls": len(lat), "median_s": round(statistics.median(lat), 3),
            "total_s": round(sum(lat), 2), "rss_start_mb": rss[0], "rss_max_mb": max(rss),
            "rss_end_mb": rss[-1]}


def soak(srv: PrivateServer, n: int, max_tokens: int = 4) -> dict:
    rss = [srv.rss()]
    lat = []
    for i in range(n):
        lat.append(post(srv.base, srv.model, [{"role": "user", "content": f"Say the number {i * 7919}."}],
                        max_tokens))
        rss.append(srv.rss())
    half = rss[len(rss) // 2:]
    slope = (half[-1] - half[0]) / max(1, len(half) - 1) * 100
    return {"requests": n, "median_s": round(statistics.median(lat), 3),
            "rss_start_mb": rss[0], "rss_after_first_mb": rss[1], "rss_max_mb": max(rss),
            "rss_end_mb": rss[-1], "rss_slope_second_half_mb_per_100": round(slope, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--cache-mb", type=int, action="append", help="default: 0 and 512")
    ap.add_argument("--soak", type=int, default=0, help="N short requests instead of episodes")
    a = ap.parse_args()
    ok, why = embedded.embedded_available()
    if not ok:
        sys.exit(f"embedded backend unavailable: {why}")
    out = {}
    for mb in a.cache_mb or [0, 512]:
        with PrivateServer(mb) as srv:
            out[f"cache_mb={mb}"] = soak(srv, a.soak) if a.soak else episodes(srv, a.turns, a.max_tokens)
        print(json.dumps({f"cache_mb={mb}": out[f"cache_mb={mb}"]}), flush=True)


if __name__ == "__main__":
    main()
