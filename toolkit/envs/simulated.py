"""The simulated backend: an LLM plays the environment (Simia-RL feedback; ASTRA emulator).

Stateful per episode: the simulator sees the episode's earlier calls and results (they are the
state). Optional fault injection (`fault_rate`, ASTRA uses 0.2) returns transient errors,
deterministically per (episode key, call index): the episode key is the record id and sample index
that `run_episode` passes to `begin_episode` (without one, `config.episode` or the env id), so the
rate is `fault_rate` at every call position, and two samples of one task fail at different calls.

Env ref: {"backend": "simulated", "config": {"policy": "...", "tools": [<OpenAI tools>],
          "reference": "<reference conversation text>", "fault_rate": 0.2,
          "human": false, "model": null, "base_url": null}}

`human: true` (Simia-RL, APIGen-MT): the simulator also plays the human side from the reference
conversation (`user_simulator_system_prompt`), ending with `[TERMINATE]`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from toolkit import aio
from toolkit import prompts
from toolkit.envs.base import BackendCapabilities, Environment, ToolResult, register_backend
from toolkit.llm import LLMConfig, get_client
from toolkit.roles.env_simulator import simulate_call


class SimulatedEnvironment(Environment):
    backend = "simulated"

    def __init__(self, ref: dict):
        config = dict(ref.get("config") or {})
        self._policy = config.get("policy") or ""
        self._tools = list(config.get("tools") or [])
        self.reference = config.get("reference") or ""
        self.fault_rate = float(config.get("fault_rate") or 0.0)
        self.human = bool(config.get("human"))
        self.episode = str(config.get("episode") or ref.get("id") or "episode")
        self._llm_cfg = {k: config[k] for k in ("model", "base_url", "temperature", "seed", "cache") if config.get(k) is not None}
        self.client: Any = None
        self.history: list[dict] = []
        self._initial = ref.get("state") or {}
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "requests": 0, "cache_hits": 0}

    def bind_llm(self, client: Any) -> None:
        self.client = client

    def _client(self) -> Any:
        if self.client is None:
            self.client = get_client(LLMConfig(**self._llm_cfg))
        return self.client

    def tools(self, side: str = "agent") -> list[dict]:
        return list(self._tools) if side == "agent" else []

    def policy(self) -> str:
        return self._policy

    def user_simulator_system_prompt(self) -> str | None:
        """Simia-RL (APIGen-MT, Fig 13): with `config.human: true` the simulator also plays the human,
        following the reference conversation, and ends the episode with `[TERMINATE]` (rollout reads
        it like ###STOP###). None otherwise: rollout's own user-simulator prompt is used."""
        if not self.human:
            return None
        return prompts.load("simia/env_human").render(policy=self._policy or "(none)",
                                                      reference=self.reference or "(none)")

    def begin_episode(self, key: str) -> None:
        self.episode = str(key)

    def fault_key(self, call_index: int) -> str:
        """The injection key of the call at `call_index` (0-based) of this episode."""
        return f"{self.episode}:{call_index}"

    def reset(self, state: dict | None = None) -> None:
        self.history = []
        if state is not None:
            self._initial = state

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        return aio.run(self.acall(name, args, side))

    async def acall(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        call_id = f"sim_{len(self.history) // 2}_{uuid.uuid5(uuid.NAMESPACE_OID, self.episode).hex[:6]}"
        tc = {"id": call_id, "type": "function",
              "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False, sort_keys=True)}}
        result, usage = await simulate_call(
            self._client(), policy=self._policy, tools=self._tools, history=self.history, tool_call=tc,
            reference=self.reference, fault_rate=self.fault_rate,
            fault_key=self.fault_key(len(self.history) // 2))
        for k in self.usage:
            self.usage[k] += usage.get(k, 0)
        self.history.append({"role": "assistant", "content": None, "tool_calls": [tc]})
        self.history.append({"role": "tool", "tool_call_id": call_id, "content": result.to_content()})
        return result

    def snapshot(self) -> dict:
        calls = []
        for i in range(0, len(self.history), 2):
            f = self.history[i]["tool_calls"][0]["function"]
            calls.append({"i": i // 2, "name": f["name"], "arguments": f["arguments"],
                          "result": self.history[i + 1]["content"]})
        return {"initial": [self._initial] if self._initial else [], "calls": calls}


register_backend("simulated", SimulatedEnvironment, "LLM-simulated environment (Simia / ASTRA emulator)",
                 capabilities=BackendCapabilities(replayable=False, simulated=True))
