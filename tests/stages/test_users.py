"""User simulators (registry kind `users`): the scripted user plays task.user_turns and holds back
task.held_out_tools until their turn."""

from __future__ import annotations

import asyncio
import json

import pytest

from toolkit import registry
from toolkit.envs import load_env
from toolkit.schema import Record, Usage
from toolkit.episodes.loop import EpisodeLimits, run_episode
from toolkit.episodes.users import ScriptedUser, UserContext

SRC = ("def note(state, text):\n    state.setdefault('notes', []).append(text)\n    return 'ok'\n\n"
       "def secret(state):\n    return 'the held-out tool ran'\n")
TOOLS = [{"type": "function", "function": {"name": "note", "description": "Write a note.", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
         {"type": "function", "function": {"name": "secret", "description": "A held-out tool.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def _record() -> Record:
    return Record.model_validate({
        "id": "scripted-1", "env": {"backend": "python", "config": {"tools": TOOLS, "source": SRC}, "state": {}},
        "task": {"instruction": "first", "user_turns": [[{"role": "user", "content": "first"}],
                                                        [{"role": "user", "content": "second"}],
                                                        [{"role": "user", "content": "third"}]],
                 "held_out_tools": {"2": ["secret"]}}})


class RecordingAgentDouble:
    """Test double of an agent: per turn, calls `secret` once and `note` once, then ends its reply;
    records the tool names it was offered at each act."""

    name = "double"

    def __init__(self):
        self.offered: list[tuple[int, list[str]]] = []
        self.done_turns: dict[int, int] = {}

    async def act(self, messages, tools, usage):
        turn = sum(m["role"] == "user" for m in messages) - 1
        self.offered.append((turn, sorted(t["function"]["name"] for t in tools)))
        k = self.done_turns.get(turn, 0)
        self.done_turns[turn] = k + 1
        calls = {0: ("secret", {}), 1: ("note", {"text": f"turn {turn}"})}
        if k in calls:
            name, args = calls[k]
            return {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{turn}{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}
        return {"role": "assistant", "content": "done"}


def test_scripted_user_plays_turns_and_holds_back_tools():
    rec = _record()
    user = registry.lookup("users", "auto").obj(UserContext(record=rec, llm_user=lambda: None))
    assert isinstance(user, ScriptedUser)
    agent = RecordingAgentDouble()
    env = load_env(rec.env)
    env.reset()
    traj = asyncio.run(run_episode(rec, env, agent, user, "scripted-1-t0", EpisodeLimits(max_tool_errors=10)))
    env.close()
    assert [m.content for m in traj.messages if m.role == "user"] == ["first", "second", "third"]
    assert traj.termination == "user_stop"
    offered = dict(agent.offered)
    assert offered[0] == offered[1] == ["note"] and offered[2] == ["note", "secret"]
    secret = [(s.ok, s.error_code) for s in traj.steps if s.name == "secret"]
    assert secret == [(False, "UNKNOWN_TOOL"), (False, "UNKNOWN_TOOL"), (True, None)]
    assert [s.name for s in traj.steps if s.ok] == ["note", "note", "secret", "note"]


def test_scripted_user_absent_without_turns():
    rec = _record()
    rec.task.user_turns = None
    assert registry.lookup("users", "scripted").obj(UserContext(record=rec, llm_user=lambda: None)) is None
    assert registry.lookup("users", "auto").obj(UserContext(record=rec, llm_user=lambda: "llm")) == "llm"


def test_unknown_user_simulator_is_a_usage_error():
    from toolkit.io import UsageError
    from toolkit.stages.rollout import build

    with pytest.raises(UsageError, match="--user-simulator"):
        build({"agent_kind": "replay", "user_simulator": "nope"}, None)
    asyncio.run(ScriptedUser([[{"role": "user", "content": "x"}]]).respond([], [], Usage()))
