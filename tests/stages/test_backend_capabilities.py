"""Backend capabilities come from the registry, never from the backend's name: a plugin backend
registered with `deterministic=True` gets verify's replay memo and its own write classification,
one registered `replayable=False` is refused by state_diff, whatever it is called."""

from __future__ import annotations

import asyncio
import json

import pytest

from toolkit import registry
from toolkit.domains import load_tasks
from toolkit.envs import BackendCapabilities, backend_capabilities, load_env, register_backend
from toolkit.schema import Record
from toolkit.stages.verify import build


def _sqlite_under(name: str):
    """A real sqlite environment, registered under another name."""
    def factory(ref: dict):
        return load_env(dict(ref, backend="sqlite"))
    return factory


@pytest.fixture
def plugin_backends():
    names = []

    def add(name: str, caps: BackendCapabilities | None):
        register_backend(name, _sqlite_under(name), doc="test plugin", capabilities=caps)
        names.append(name)
    yield add
    for n in names:
        registry.unregister("backends", n)


def _record(backend: str) -> dict:
    t = load_tasks("airline")[0]
    acts = t["task"]["ground_truth"]["actions"]
    msgs = [{"role": "user", "content": "task"}]
    for i, a in enumerate(acts):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": a["name"], "arguments": json.dumps(a["arguments"])}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "{}"})
    msgs.append({"role": "assistant", "content": "done"})
    env = dict(t["env"], backend=backend)
    return dict(t, env=env, trajectories=[{"id": f"t{k}", "messages": msgs} for k in range(3)])


def _verify(cfg: dict, rec: dict):
    fn = build(cfg, None)
    out = asyncio.run(fn(Record.model_validate(rec)))
    return out, fn.state


def test_registered_capabilities_are_what_core_code_sees(plugin_backends):
    plugin_backends("memo-plugin", BackendCapabilities(deterministic=True))
    plugin_backends("plain-plugin", None)
    assert backend_capabilities("memo-plugin").deterministic
    assert backend_capabilities("plain-plugin") == BackendCapabilities()  # the defaults: replayable only
    assert backend_capabilities("sqlite").deterministic and backend_capabilities("sqlite").relational
    assert not backend_capabilities("simulated").replayable and backend_capabilities("simulated").simulated
    assert backend_capabilities("no-such-backend") == BackendCapabilities()
    assert registry.lookup("backends", "memo-plugin").meta["deterministic"] is True  # listed by `toolkit plugins`


def test_a_plugin_backend_declared_deterministic_is_memoized_and_classifies_writes(plugin_backends):
    plugin_backends("memo-plugin", BackendCapabilities(deterministic=True))
    plugin_backends("plain-plugin", None)
    out, verifier = _verify({"strategy": ["state_diff", "actions"]}, _record("memo-plugin"))
    assert verifier.cache.replay_hits == 2  # three equal trajectories: two replays memoized
    assert all(t.reward == 1.0 for t in out.trajectories)
    acts = [v for v in out.verdicts if v.name == "actions"]
    assert acts and all(v.scores["writes_from"] == "the memo-plugin environment" for v in acts)

    # the same environment without the capability: every trajectory replayed, writes by tool name
    out2, verifier2 = _verify({"strategy": ["state_diff", "actions"]}, _record("plain-plugin"))
    assert verifier2.cache.replay_hits == 0
    assert [t.reward for t in out2.trajectories] == [t.reward for t in out.trajectories]
    assert all(v.scores["writes_from"] == "tool names (read verbs are reads)"
               for v in out2.verdicts if v.name == "actions")


def test_a_plugin_backend_declared_not_replayable_is_refused_by_state_diff(plugin_backends):
    from toolkit.io import StageError

    plugin_backends("llm-played", BackendCapabilities(replayable=False, simulated=True))
    with pytest.raises(StageError, match="cannot be replayed"):
        _verify({"strategy": ["state_diff"]}, _record("llm-played"))
