"""One rendering for training and inference: an SFT row of a replayed airline episode, rendered by
the toolkit chat template, is byte for byte the prompt the agent got at rollout (hermes protocol,
the same tool rendering), so a model trained on toolkit rows is evaluated on what it learned."""

from __future__ import annotations

import asyncio

import pytest

from toolkit.formats.hermes import render_hermes
from toolkit.formats.tools import QUERY_CONTROLS, minimal_tool
from toolkit.llm.toolcalls import to_hermes_messages
from toolkit.schema import Record


def _replayed(n: int = 3) -> list[Record]:
    from toolkit.domains import load_tasks
    from toolkit.stages import rollout, verify

    recs = [Record.model_validate(r) for r in load_tasks("airline")[:n]]
    roll = rollout.build({"agent_kind": "replay"}, None)
    ver = verify.build({"strategy": ["state_diff"]}, None)

    async def go():
        return [await ver(await roll(r.model_copy(deep=True))) for r in recs]

    return asyncio.run(go())


@pytest.mark.parametrize("mode,system", [("full", "keep"), ("compact", "keep"), ("minimal", "keep"),
                                         ("minimal", "drop")])
def test_sft_row_equals_the_rollout_prompt(mode, system):
    """system drop: sft/grpo `system_prompt: drop` rows against rollout `agent_system_prompt: drop`
    (LLMAgent sends no system message)."""
    from toolkit.train import export as X

    seen = 0
    for rec in _replayed():
        rows = X.record_rows(rec, filter="all", tool_schema=mode, system_prompt=system)
        for row, traj in zip(rows, rec.trajectories, strict=True):
            trained = render_hermes(row["messages"], row.get("tools"))
            sent = [m.model_dump(exclude_none=True) for m in traj.messages]
            if system == "drop":
                sent = [m for m in sent if m["role"] != "system"]
                assert "<policy>" not in trained
            wire = to_hermes_messages(sent,
                                      [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t
                                       for t in traj.tools], compact=False if mode == "full" else mode)
            served = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in wire)
            assert trained == served
            assert "<tool_call>" in trained and "Example (schematic" in trained
            seen += 1
    assert seen == 3


def test_minimal_tool():
    from toolkit.envs.sqlite import QUERY_CONTROL_PARAMS

    assert tuple(QUERY_CONTROL_PARAMS) == QUERY_CONTROLS
    tool = {"type": "function", "function": {"name": "query_x", "description": "Read rows. Long text.", "parameters": {
        "type": "object", "required": ["id"], "properties": {
            "id": {"type": "integer"}, "cabin": {"anyOf": [{"type": "string", "enum": ["eco", "biz", None]}, {"type": "null"}]},
            "limit": {"type": "integer"}, "order_by": {"type": "string", "enum": ["id", "cabin"]}}}}}
    assert minimal_tool(tool) == {"name": "query_x", "parameters": {"id": "integer", "cabin": ["eco", "biz"]},
                                  "required": ["id"]}


def test_rollout_agent_system_prompt_drop():
    """rollout `agent_system_prompt: drop`: the agent's client gets no system message (a recording
    test double stands in for the LLM client), the trajectory still holds the policy."""
    from toolkit.llm.base import ChatResult
    from toolkit.options import RolloutOptions
    from toolkit.episodes.agents import LLMAgent
    from toolkit.schema import Usage

    class RecordingClient:  # test double: records the messages it is sent
        def __init__(self):
            self.sent = []

        async def chat(self, messages, tools=None, **kw):
            self.sent.append(messages)
            return ChatResult(message={"role": "assistant", "content": "ok"}, usage={}, cost=0.0, cached=False,
                              model="double", latency_s=0.0, finish_reason="stop")

    msgs = [{"role": "system", "content": "<policy>P</policy>"}, {"role": "user", "content": "hi"}]
    for mode, n in (("keep", 2), ("drop", 1)):
        c = RecordingClient()
        asyncio.run(LLMAgent(c, system_prompt=mode).act(list(msgs), [], Usage()))
        assert len(c.sent[0]) == n and c.sent[0][-1]["content"] == "hi"
    assert RolloutOptions(agent_system_prompt="drop").agent_system_prompt == "drop"
    with pytest.raises(ValueError):
        RolloutOptions(agent_system_prompt="nope")
