"""The simulated backend's ASTRA fault injection: keyed by record id, sample index and call index.

Over 10,000 episodes of one server, the injected-failure rate is 20% ± 1% at each call position
0-5 (the old key, `env.id:call:tool`, was the same for every plan and sample of a server, so a
position failed either always or never); two samples of one task fail at different calls."""

import asyncio
import hashlib
import json
import random

from toolkit.envs.simulated import SimulatedEnvironment
from toolkit.llm import Meter
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.env_simulator import inject_fault
from toolkit.schema import Record
from toolkit.stages import rollout

TOOLS = [{"type": "function", "function": {"name": "find_pets", "description": "Find pets by tag.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def _env() -> SimulatedEnvironment:
    return SimulatedEnvironment({"backend": "simulated", "id": "petstore",
                                 "config": {"tools": TOOLS, "fault_rate": 0.2}})


def _fails(key: str, rate: float = 0.2) -> bool:
    """Written from the documented rule (blake2b-seeded draw < rate), not by calling the code."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return random.Random(seed).random() < rate


def test_rate_is_20_percent_at_every_call_position():
    n = 10_000
    hits = [0] * 6
    for i in range(n):
        env = _env()
        env.begin_episode(f"petstore-chain{i % 50}-task{i // 50}-t0")   # 50 plans x 200 tasks, sample 0
        for pos in range(6):
            hits[pos] += inject_fault(env.fault_rate, env.fault_key(pos)) is not None
    rates = [h / n for h in hits]
    assert all(abs(r - 0.2) <= 0.01 for r in rates), rates
    # the key is the one documented: episode key (record id + sample index) and call index
    env = _env()
    env.begin_episode("rec-7-t1")
    assert env.fault_key(3) == "rec-7-t1:3"
    assert (inject_fault(0.2, env.fault_key(3)) is not None) == _fails("rec-7-t1:3")


def test_without_an_episode_key_falls_back_to_the_env_id():
    env = _env()
    assert env.fault_key(0) == "petstore:0"


def _task(rid: str, n_calls: int, base_url: str) -> Record:
    return Record.model_validate({
        "id": rid, "flow": "astra",
        "env": {"backend": "simulated", "id": "petstore", "config": {
            "tools": TOOLS, "fault_rate": 0.2, "policy": "Pet store.", "base_url": base_url, "model": "scripted"}},
        "task": {"instruction": "Find my pets.", "ground_truth": {
            "actions": [{"name": "find_pets", "arguments": {"i": k}} for k in range(n_calls)]}}})


def test_two_samples_of_one_task_fail_at_different_calls():
    n_calls = 6
    # a task whose two samples' predicted failures differ and are not empty (found, not assumed)
    rid = next(f"task-{j}" for j in range(1000)
               if {k for k in range(n_calls) if _fails(f"task-{j}-t0:{k}")}
               and {k for k in range(n_calls) if _fails(f"task-{j}-t1:{k}")}
               and {k for k in range(n_calls) if _fails(f"task-{j}-t0:{k}")}
               != {k for k in range(n_calls) if _fails(f"task-{j}-t1:{k}")})
    want = [[k for k in range(n_calls) if _fails(f"{rid}-t{s}:{k}")] for s in (0, 1)]

    def script(req):
        return json.dumps({"success": True, "observation": {"pets": ["rex"]}})

    with ScriptedServer(script) as srv:
        fn = rollout.build({"n": 2, "agent_kind": "replay", "max_turns": 20, "max_tool_errors": 20,
                            "base_url": srv.base_url, "model": "scripted", "max_retries": 0}, Meter())
        out = asyncio.run(fn(_task(rid, n_calls, srv.base_url)))
    got = []
    for t in out.trajectories:
        steps = [s for s in t.steps if s.side == "agent"]
        assert len(steps) == n_calls, t.error
        got.append([k for k, s in enumerate(steps) if not s.ok])
        assert all(s.error_code in ("TIMEOUT", "SERVICE_UNAVAILABLE", "CONNECTION_RESET")
                   for s in steps if not s.ok)
    assert got == want and got[0] != got[1]
    # the simulator was asked only for the calls that did not fail
    assert srv.chat_count == 2 * n_calls - len(want[0]) - len(want[1])
