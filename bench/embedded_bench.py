"""Embedded llama.cpp server: peak RSS over a conversation growing to the full context, prompt
cache on/off latency, and short- and long-request soaks, each on a PRIVATE server.

    python bench/embedded_bench.py                     # 40 requests growing to n_ctx: new vs old settings
    python bench/embedded_bench.py --no-baseline       # new settings only
    python bench/embedded_bench.py --long-soak 10      # 10 distinct requests of ~7k tokens, RSS after each
    python bench/embedded_bench.py --episodes          # cache off vs on, 24 episode-like calls each
    python bench/embedded_bench.py --slots --turns 4   # one shared server vs one server per role
    python bench/embedded_bench.py --soak 200 --cache-mb 0  # 200 short requests, RSS after each

Each run starts its own server (its own TOOLKIT_HOME and port, so a shared server is never
touched), then stops it. The default run grows one conversation by ~n_ctx/40 tokens per request
(a user message of numbered facts; the model's reply is appended as the assistant turn) until the
prompt fills the context (n_ctx - max_tokens - 8), sampling the server's VmRSS every 0.1 s and its
VmHWM (kernel-kept peak) after each request; printed per step and at the end. The baseline is the
same conversation on a server with the pre-fix settings (`--logits_all True`, llama_cpp.server's
default, via TOOLKIT_EMBEDDED_LOGITS_ALL=1), measured in the same run; "ratio" = new peak /
baseline peak. Goal: peak RSS < 2 GB (2e9 bytes = 1907 MiB) at the full context with the new
settings. Memory figures are MiB (kB / 1024), like `rss_mb` in `toolkit serve --status`.
"Episode-like" calls alternate two conversations (an agent with a long system prompt and a user
simulator), each growing by one exchange per turn, as rollouts do; the soak sends short distinct
prompts. Output: one JSON line per step/phase on stdout, the summary last.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from toolkit.llm import embedded  # noqa: E402

AGENT_SYS = ("You are an airline customer service agent. Follow the policy strictly. " +
             "Policy: " + " ".join(f"Rule {i}: reservations of class {i % 3} may be changed only "
                                    f"within {i + 1} days and only by the owner." for i in range(40)))
USER_SYS = ("You are playing the role of a customer who wants to change a flight. " +
            " ".join(f"Fact {i}: your reservation code is R{i:03d}." for i in range(20)))


GOAL_MB = 1907  # 2 GB = 2e9 bytes, in MiB (the toolkit's "MB", like rss_mb, is kB / 1024)


def _post_json(url: str, payload: dict, timeout: float = 1800) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def chat(base: str, model: str, messages: list[dict], max_tokens: int) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = _post_json(base + "/chat/completions", {"model": model, "messages": messages,
                                                  "max_tokens": max_tokens, "temperature": 0.0,
                                                  "seed": 1})
    return time.perf_counter() - t0, out


def post(base: str, model: str, messages: list[dict], max_tokens: int) -> float:
    return chat(base, model, messages, max_tokens)[0]


def proc_mb(pid: int, field: str) -> float:
    """VmRSS / VmHWM of `pid` in MB (0.0 when gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


class RssPoller:
    """Samples VmRSS every `every` seconds in a thread; `.peak` is the highest sample."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid, self.every, self.peak = pid, every, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, proc_mb(self.pid, "VmRSS"))
            self._stop.wait(self.every)

    def __enter__(self) -> "RssPoller":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def fact_sentences(start: int, n: int) -> str:
    return " ".join(f"Fact {i}: reservation R{i:05d} belongs to passenger {i * 7919 % 10007}, "
                    f"seat {i % 40}{'ABCDEF'[i % 6]}, flying to city {i % 97}."
                    for i in range(start, start + n))


def count_tokens(base: str, text: str) -> int:
    return _post_json(base.removesuffix("/v1") + "/extras/tokenize/count", {"input": text})["count"]


def tokens_per_sentence(base: str) -> float:
    return count_tokens(base, fact_sentences(0, 200)) / 200


class PrivateServer:
    def __init__(self, cache_mb: int, idle: float = 0.0, old_settings: bool = False) -> None:
        self.home = tempfile.mkdtemp(prefix="toolkit-embedded-bench-")
        self.env = {"TOOLKIT_HOME": self.home, "TOOLKIT_EMBEDDED_CACHE_MB": str(cache_mb),
                    "TOOLKIT_EMBEDDED_IDLE_TIMEOUT": str(idle), "TOOLKIT_EMBEDDED_PORT": "",
                    "TOOLKIT_EMBEDDED_LOGITS_ALL": "1" if old_settings else ""}
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


def slots(turns: int, max_tokens: int, agent_rules: int) -> dict:
    """Seconds per agent call on episode-like traffic (an agent conversation with a long system
    prompt and a user-simulator conversation, alternating, each growing by one exchange per turn):
    one shared server (TOOLKIT_EMBEDDED_SLOTS=shared: each call re-reads its whole prompt, the
    other conversation having evicted it) vs one server per role (=role: each server keeps its
    conversation's KV cache, a turn evaluates only the new tokens). Both measured in this run."""
    agent_sys = ("You are an airline customer service agent. Follow the policy strictly. Policy: "
                 + " ".join(f"Rule {i}: reservations of class {i % 3} may be changed only within {i + 1} days "
                            "and only by the owner." for i in range(agent_rules)))
    out = {}
    for mode in ("shared", "role"):
        home = tempfile.mkdtemp(prefix="toolkit-embedded-slots-")
        saved = {k: os.environ.get(k) for k in ("TOOLKIT_HOME", "TOOLKIT_EMBEDDED_SLOTS", "TOOLKIT_EMBEDDED_PORT",
                                                "TOOLKIT_EMBEDDED_IDLE_TIMEOUT", "TOOLKIT_EMBEDDED_CACHE_MB")}
        os.environ.update({"TOOLKIT_HOME": home, "TOOLKIT_EMBEDDED_SLOTS": mode, "TOOLKIT_EMBEDDED_IDLE_TIMEOUT": "0",
                           "TOOLKIT_EMBEDDED_CACHE_MB": "0"})
        os.environ.pop("TOOLKIT_EMBEDDED_PORT", None)
        try:
            a_url = embedded.ensure_embedded_server(slot=embedded.slot_for_role("agent"))
            u_url = embedded.ensure_embedded_server(slot=embedded.slot_for_role("user"))
            model = embedded.embedded_model_name()
            agent = [{"role": "system", "content": agent_sys}]
            user = [{"role": "system", "content": USER_SYS}]
            a_lat, u_lat = [], []
            for t in range(turns):
                user.append({"role": "user", "content": f"The agent said: turn {t}. Reply briefly."})
                u_lat.append(post(u_url, model, user, max_tokens))
                user.append({"role": "assistant", "content": f"I want to change reservation R{t:03d}."})
                agent.append({"role": "user", "content": f"I want to change reservation R{t:03d}."})
                a_lat.append(post(a_url, model, agent, max_tokens))
                agent.append({"role": "assistant", "content": f"Let me look up R{t:03d} for you."})
            out[mode] = {"servers": 1 if a_url == u_url else 2, "agent_calls": len(a_lat),
                         "agent_s": [round(x, 2) for x in a_lat],
                         "agent_median_s": round(statistics.median(a_lat), 3),
                         "agent_after_first_median_s": round(statistics.median(a_lat[1:] or a_lat), 3),
                         "user_median_s": round(statistics.median(u_lat), 3),
                         "agent_system_tokens": count_tokens(a_url, agent_sys)}
        finally:
            embedded.stop_embedded_server()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        print(json.dumps({mode: out[mode]}), flush=True)
    out["agent_after_first_ratio_role_vs_shared"] = round(
        out["role"]["agent_after_first_median_s"] / out["shared"]["agent_after_first_median_s"], 3)
    return out


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


def grow_to_context(srv: PrivateServer, label: str, steps: int, n_ctx: int, max_tokens: int) -> dict:
    """One conversation growing by ~n_ctx/steps tokens per request until the prompt fills the
    context; prints each step, returns the peak figures."""
    limit = n_ctx - max_tokens - 8
    per_sentence = tokens_per_sentence(srv.base)
    messages = [{"role": "system", "content": "You are a booking assistant. Answer in one short sentence."}]
    next_fact, prompt_tokens, used, rows = 0, 0, 0, []
    rss_start = srv.rss()
    with RssPoller(srv.pid) as poll:
        for step in range(steps):
            left = steps - step
            target = prompt_tokens + used + (limit - prompt_tokens - used) / left
            # the chat template adds ~8 tokens per message; the question adds ~12
            n = max(1, int((target - prompt_tokens - used - 20) / per_sentence))
            if step == steps - 1:
                n = max(1, int((limit - prompt_tokens - used - 20) / per_sentence) - 1)
            question = f"Which city does R{next_fact + n // 2:05d} fly to?"
            messages.append({"role": "user", "content": fact_sentences(next_fact, n) + "\n" + question})
            next_fact += n
            dt, out = chat(srv.base, srv.model, messages, max_tokens)
            reply = out["choices"][0]["message"]["content"] or ""
            messages.append({"role": "assistant", "content": reply})
            prompt_tokens = out["usage"]["prompt_tokens"]
            used = out["usage"]["completion_tokens"] + 8  # the reply, re-sent next time
            row = {"run": label, "step": step + 1, "prompt_tokens": prompt_tokens, "s": round(dt, 1),
                   "rss_mb": srv.rss(), "hwm_mb": proc_mb(srv.pid, "VmHWM"), "poll_peak_mb": poll.peak}
            rows.append(row)
            print(json.dumps(row), flush=True)
    peak = max(r["hwm_mb"] for r in rows)
    first, last = rows[0], rows[-1]
    per_tok = (last["rss_mb"] - first["rss_mb"]) / max(1, last["prompt_tokens"] - first["prompt_tokens"])
    return {"run": label, "requests": len(rows), "final_prompt_tokens": last["prompt_tokens"],
            "rss_start_mb": rss_start, "rss_end_mb": last["rss_mb"], "peak_rss_mb": peak,
            "poll_peak_mb": poll.peak, "kb_per_token": round(per_tok * 1024, 1),
            "total_s": round(sum(r["s"] for r in rows), 1)}


def long_soak(srv: PrivateServer, n: int, tokens: int, max_tokens: int) -> dict:
    """`n` distinct requests of ~`tokens` prompt tokens each (no shared prefix past the system
    line, so each evaluates the whole prompt): RSS after each, and the kernel-kept peak."""
    rss = [srv.rss()]
    for i in range(n):
        first = 100_000 * (i + 1)
        k = int((tokens - 40) / (count_tokens(srv.base, fact_sentences(first, 200)) / 200))
        msgs = [{"role": "user", "content": f"Request {i}. " + fact_sentences(first, k)
                 + f"\nWhich city does R{first + k // 2:05d} fly to?"}]
        dt, out = chat(srv.base, srv.model, msgs, max_tokens)
        rss.append(srv.rss())
        print(json.dumps({"run": "long-soak", "request": i + 1, "prompt_tokens": out["usage"]["prompt_tokens"],
                          "s": round(dt, 1), "rss_mb": rss[-1], "hwm_mb": proc_mb(srv.pid, "VmHWM")}),
              flush=True)
    return {"run": "long-soak", "requests": n, "rss_start_mb": rss[0], "rss_after_first_mb": rss[1],
            "rss_max_mb": max(rss), "rss_end_mb": rss[-1], "peak_rss_mb": proc_mb(srv.pid, "VmHWM"),
            "rss_drift_after_first_mb": round(rss[-1] - rss[1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="requests growing to the full context")
    ap.add_argument("--n-ctx", type=int, default=int(os.environ.get("TOOLKIT_EMBEDDED_N_CTX", "8192")))
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the pre-fix settings (logits_all=True) run")
    ap.add_argument("--long-soak", type=int, default=0, metavar="N",
                    help="N distinct requests of --long-tokens tokens each instead")
    ap.add_argument("--long-tokens", type=int, default=7000)
    ap.add_argument("--episodes", action="store_true", help="cache on/off episode latency instead")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--cache-mb", type=int, action="append", help="--episodes/--soak: default 0 and 512")
    ap.add_argument("--soak", type=int, default=0, help="N short requests instead")
    ap.add_argument("--slots", action="store_true", help="shared server vs one server per role (agent latency)")
    ap.add_argument("--agent-rules", type=int, default=160, help="--slots: policy rules in the agent prompt (~4k tokens)")
    a = ap.parse_args()
    # a SIGTERM unwinds like Ctrl-C, so the private server is stopped (PrivateServer.__exit__)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ok, why = embedded.embedded_available()
    if not ok:
        sys.exit(f"embedded backend unavailable: {why}")
    if a.slots:
        print(json.dumps(slots(a.turns, a.max_tokens, a.agent_rules)), flush=True)
        return
    if a.episodes or a.soak:
        for mb in a.cache_mb or [0, 512]:
            with PrivateServer(mb) as srv:
                res = soak(srv, a.soak) if a.soak else episodes(srv, a.turns, a.max_tokens)
            print(json.dumps({f"cache_mb={mb}": res}), flush=True)
        return
    os.environ["TOOLKIT_EMBEDDED_N_CTX"] = str(a.n_ctx)
    if a.long_soak:
        with PrivateServer(0) as srv:
            res = long_soak(srv, a.long_soak, min(a.long_tokens, a.n_ctx - a.max_tokens - 8), a.max_tokens)
        print(json.dumps(res), flush=True)
        return
    with PrivateServer(0) as srv:
        new = grow_to_context(srv, "new", a.steps, a.n_ctx, a.max_tokens)
    print(json.dumps(new), flush=True)
    summary = {"n_ctx": a.n_ctx, "goal_mb": GOAL_MB, "new": new,
               "new_under_goal": new["peak_rss_mb"] < GOAL_MB}
    if not a.no_baseline:
        with PrivateServer(0, old_settings=True) as srv:
            old = grow_to_context(srv, "baseline-old-settings", a.steps, a.n_ctx, a.max_tokens)
        print(json.dumps(old), flush=True)
        summary["baseline_old_settings"] = old
        summary["peak_ratio_new_vs_old"] = round(new["peak_rss_mb"] / old["peak_rss_mb"], 3)
    print(json.dumps(summary), flush=True)
    print(f"peak RSS at {new['final_prompt_tokens']} prompt tokens (n_ctx {a.n_ctx}): "
          f"{new['peak_rss_mb']:.0f} MB new settings"
          + (f", {summary['baseline_old_settings']['peak_rss_mb']:.0f} MB old settings "
             f"(ratio {summary['peak_ratio_new_vs_old']})" if not a.no_baseline else "")
          + f"; goal < {GOAL_MB} MB: {'met' if summary['new_under_goal'] else 'NOT met'}",
          file=sys.stderr)
    sys.exit(0 if summary["new_under_goal"] else 1)


if __name__ == "__main__":
    main()
