"""The verify fast paths give exactly the results of the plain path: the replay memo (duplicate
trajectories are not re-executed), pooled environments, the incremental canonical form."""

from __future__ import annotations

import asyncio
import json

from toolkit.domains import load_tasks
from toolkit.schema import Record
from toolkit.stages.verify import build


def _msgs(acts: list[dict]) -> list[dict]:
    msgs = [{"role": "user", "content": "task"}]
    for i, a in enumerate(acts):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": a["name"], "arguments": json.dumps(a["arguments"])}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "{}"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


def _records() -> list[dict]:
    out = []
    for t in load_tasks("airline") + load_tasks("clinic"):
        acts = t["task"]["ground_truth"]["actions"]
        trajs = [{"id": f"t{k}", "messages": _msgs(acts)} for k in range(3)]
        trajs.append({"id": "t3", "messages": _msgs(acts[1:])})
        trajs.append({"id": "t4", "messages": _msgs(acts[::-1])})
        out.append(dict(t, trajectories=trajs))
    return out


def _run(cfg: dict, recs: list[dict]) -> tuple[list[dict], object]:
    fn = build(cfg, None)

    async def go():
        return [(await fn(Record.model_validate(r))).model_dump(mode="json", exclude={"provenance"}) for r in recs]

    return asyncio.run(go()), fn


def test_memo_and_pool_give_the_plain_results():
    recs = _records() * 2  # the second pass hits the memo for every trajectory
    fast, fn = _run({"strategy": ["state_diff"]}, recs)
    plain, fn2 = _run({"strategy": ["state_diff"], "replay_memo": False}, recs)
    assert fast == plain
    assert fn.state.cache.replay_hits >= len(recs) * 2  # duplicates within and across records
    assert fn2.state.cache.replay_hits == 0
    rewards = [t["reward"] for r in fast for t in r["trajectories"]]
    assert 0.0 in rewards and 1.0 in rewards


def test_memo_hit_still_checks_recorded_step_hashes():
    t = load_tasks("airline")[0]
    acts = t["task"]["ground_truth"]["actions"]
    steps_ok = [{"tool_call_id": f"c{i}", "name": a["name"], "ok": True} for i, a in enumerate(acts)]
    bad = [dict(s, state_hash="sha256:" + "0" * 64) for s in steps_ok]
    rec = dict(t, trajectories=[{"id": "a", "messages": _msgs(acts), "steps": steps_ok},
                                {"id": "b", "messages": _msgs(acts), "steps": bad}])
    out, fn = _run({"strategy": ["state_diff"]}, [rec])
    va, vb = [v for v in out[0]["verdicts"] if v["name"] == "state_diff"]
    assert fn.state.cache.replay_hits == 1
    assert not any("diverged" in x for x in va["reasons"])
    assert any("state hash differs" in x for x in vb["reasons"])
