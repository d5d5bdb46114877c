"""The agents of an episode: the LLM agent and the replay agent (the task's reference actions)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolkit.episodes.text import _add_usage, clean
from toolkit.schema import Record, Usage


class Agent(Protocol):
    name: str

    async def act(self, messages: list[dict], tools: list[dict], usage: Usage) -> dict: ...


@dataclass
class LLMAgent:
    client: Any
    sample_index: int = 0
    overrides: dict = field(default_factory=dict)
    name: str = "llm"
    system_prompt: str = "keep"  # drop: the model is sent no system prompt (the trajectory keeps it)

    async def act(self, messages: list[dict], tools: list[dict], usage: Usage) -> dict:
        if self.system_prompt == "drop":  # as sft/grpo `system_prompt: drop` train it
            messages = [m for m in messages if m.get("role") != "system"]
        res = await self.client.chat([clean(m) for m in messages], tools=tools or None,
                                     sample_index=self.sample_index, **self.overrides)
        _add_usage(usage, res)
        msg = dict(res.message)
        msg["role"] = "assistant"
        if not msg.get("tool_calls") and not (msg.get("content") or "").strip():
            msg["content"] = msg.get("content") or ""
        return msg


class ReplayAgent:
    """Replays the task's reference actions (oracle / teacher trajectories), then states the
    communicate_info (or a closing line). User-side actions are returned as `user_calls`."""

    name = "replay"

    def __init__(self, record: Record):
        gt = record.task.ground_truth if record.task else None
        self.actions = list(gt.actions) if gt else []
        self.communicate = list(gt.communicate_info) if gt else []
        self.i = 0
        self.n_calls = 0
        # per-turn reference actions (scripted multi-turn tasks, BFCL): turn k's actions answer the
        # k-th user message, then the agent ends its reply and the scripted user goes on
        self.turns: list[list[Any]] | None = gt.turns if gt is not None else None
        self.turn_pos: dict[int, int] = {}
        if self.turns is not None:
            self.actions = []

    def next_user_actions(self) -> list:
        out = []
        while self.i < len(self.actions) and self.actions[self.i].side == "user":
            out.append(self.actions[self.i])
            self.i += 1
        return out

    async def act(self, messages: list[dict], tools: list[dict], usage: Usage) -> dict:
        if self.turns is not None:
            k = sum(1 for m in messages if m["role"] == "user") - 1
            acts = self.turns[k] if 0 <= k < len(self.turns) else []
            j = self.turn_pos.get(k, 0)
            if j < len(acts):
                self.turn_pos[k] = j + 1
                self.n_calls += 1
                a = acts[j]
                return {"role": "assistant", "content": None, "tool_calls": [{
                    "id": f"call_{self.n_calls}", "type": "function",
                    "function": {"name": a.name, "arguments": json.dumps(a.arguments, ensure_ascii=False)}}]}
            return {"role": "assistant", "content": "Done."}
        if self.i < len(self.actions) and self.actions[self.i].side == "agent":
            a = self.actions[self.i]
            self.i += 1
            self.n_calls += 1
            return {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{self.n_calls}", "type": "function",
                "function": {"name": a.name, "arguments": json.dumps(a.arguments, ensure_ascii=False)}}]}
        text = " ".join(str(c) for c in self.communicate) if self.communicate else "Your request has been completed."
        return {"role": "assistant", "content": text}

    @property
    def done(self) -> bool:
        return self.i >= len(self.actions)
