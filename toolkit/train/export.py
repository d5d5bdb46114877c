"""Records → chat+tools training rows (what `sft` trains on and `sft --export` writes).

A training row is
    {"id": "<record id>/<trajectory id>", "role": "assistant" | "user",
     "messages": [...], "tools": [...], "meta": {"record_id", "trajectory_id", "reward", "passed", "flow"}}
with messages in OpenAI shape except that tool-call `arguments` are **dicts** (chat templates
write them with `tojson`; a JSON string would come out double-encoded and teach the model to emit
stringified arguments). `tools` is the trajectory's offered tool list — the same OpenAI function
schemas `grpo` passes to the chat template when it renders the policy prompt.

Agent rows (`role="assistant"`, the default): the conversation as the agent saw it
(`toolkit.episodes.text.agent_view`: the user simulator's own tool traffic in dual-control
domains — assistant messages named "user" and their tool results — is dropped).

User rows (`role="user"`, EigenData's user-model SFT): the conversation as the user simulator saw
it, flipped exactly as `rollout.LLMUser.respond` flips it: system = the user-simulator prompt with
the task's scenario, the agent's text replies become `user` turns, the user's messages become
`assistant` turns (so "assistant-only loss" trains exactly the user turns), the agent's tool calls
and results are dropped; a conversation the user opens starts with the greeting as a `user` turn.

Formats for other stacks (openai, sharegpt, hermes): `toolkit.formats.rows.export_row`.
"""

from __future__ import annotations

from typing import Any, Iterable

from toolkit.formats.chat import arguments_dict, chat_messages, plain_message
from toolkit.formats.tools import prepare_tools
from toolkit.io import StageError
from toolkit.schema import Record, Trajectory
from toolkit.episodes.text import GREETING, agent_view, scenario_text, turn_prefix, user_system_prompt
from toolkit.envs import load_env

ROLES = ("assistant", "user")
FILTERS = ("all", "passed", "failed")


# ----------------------------------------------------------------------------------------------
# which trajectories


def trajectory_passed(record: Record, traj: Trajectory) -> bool | None:
    """verify's decision for one trajectory: scores.verify.passed, else all its verify verdicts
    pass (None when it was never verified)."""
    v = (traj.scores or {}).get("verify")
    if isinstance(v, dict) and "passed" in v:
        return bool(v["passed"])
    verdicts = [x for x in record.verdicts if x.stage == "verify" and x.trajectory_id == traj.id]
    if not verdicts:
        return None
    return all(x.passed for x in verdicts)


def select(record: Record, filter: str = "all", min_reward: float | None = None) -> list[Trajectory]:
    if filter not in FILTERS:
        raise ValueError(f"filter must be one of {FILTERS}")
    out = []
    for t in record.trajectories:
        if not t.messages:
            continue
        if filter != "all":
            p = trajectory_passed(record, t)
            if p is None or p != (filter == "passed"):
                continue
        if min_reward is not None and (t.reward is None or t.reward < min_reward):
            continue
        out.append(t)
    return out


# ----------------------------------------------------------------------------------------------
# messages


def agent_messages(traj: Trajectory, ti: int = 0) -> list[dict]:
    """The agent's view with dict arguments and tool names on tool results."""
    return chat_messages(agent_view([plain_message(m) for m in traj.messages]), ti)


def user_messages(record: Record, traj: Trajectory, ti: int = 0) -> list[dict]:
    """The user simulator's view (see module doc), flipped like rollout.LLMUser.respond."""
    budget = traj.extra.get("user_max_turns")
    budget = budget if isinstance(budget, int) and budget > 0 else None
    _, system = user_system_prompt(scenario_text(record), budget)
    flipped: list[dict] = [{"role": "system", "content": system}]
    user_side: set[str] = set()
    t = 0  # agent turns so far, counted as rollout.LLMUser.respond counts them
    for j, m in enumerate(traj.messages):
        d = plain_message(m)
        if d["role"] == "assistant" and d.get("name") != "user" and d.get("content") != GREETING:
            t += 1
        if d["role"] == "assistant" and d.get("name") == "user" and d.get("tool_calls"):
            calls = []
            for k, tc in enumerate(d["tool_calls"]):
                where = f"trajectories[{ti}].messages[{j}].tool_calls[{k}].function.arguments"
                calls.append({"id": tc.get("id"), "type": "function",
                              "function": {"name": tc["function"]["name"],
                                           "arguments": arguments_dict(tc["function"].get("arguments"), where)}})
                user_side.add(tc.get("id"))
            flipped.append({"role": "assistant", "content": d.get("content") or "", "tool_calls": calls})
        elif d["role"] == "tool" and d.get("tool_call_id") in user_side:
            flipped.append({"role": "tool", "tool_call_id": d["tool_call_id"], "content": d.get("content") or ""})
        elif d["role"] == "assistant" and d.get("content") and not d.get("tool_calls"):
            flipped.append({"role": "user", "content": turn_prefix(t, budget) + d["content"]})
        elif d["role"] == "user":
            flipped.append({"role": "assistant", "content": d.get("content") or ""})
    if len(flipped) > 1 and flipped[1]["role"] == "assistant":
        flipped.insert(1, {"role": "user", "content": GREETING})
    return flipped


SYSTEM_MODES = ("keep", "drop")


def prepare_system(messages: list[dict], mode: str = "keep") -> list[dict]:
    """keep the system prompt (the domain policy) or drop it (a policy-internalizing model; short CPU tests)."""
    if mode not in SYSTEM_MODES:
        raise ValueError(f"system_prompt must be one of {SYSTEM_MODES}")
    if mode == "drop":
        return [m for m in messages if m["role"] != "system"]
    return messages


def user_tools(record: Record) -> list[dict]:
    """The user side's own tools (dual-control domains), from the record's environment; [] when it
    cannot be built here."""
    if record.env is None:
        return []
    try:
        with load_env(record.env) as env:
            return prepare_tools(env.tools("user"))
    except Exception:
        return []


def training_row(record: Record, traj: Trajectory, role: str = "assistant", ti: int = 0,
                 tool_schema: str = "full", system_prompt: str = "keep") -> dict:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    if role == "assistant":
        messages = prepare_system(agent_messages(traj, ti), system_prompt)
        tools = prepare_tools(traj.tools, tool_schema)
    else:
        messages = user_messages(record, traj, ti)
        tools = user_tools(record) if any(m.get("tool_calls") for m in messages) else []
    if not any(m["role"] == "assistant" for m in messages):
        raise StageError(f"trajectory {traj.id} has no {role} turn to train on", field=f"trajectories[{ti}].messages")
    return {"id": f"{record.id}/{traj.id}", "role": role, "messages": messages, "tools": tools,
            "meta": {"record_id": record.id, "trajectory_id": traj.id, "reward": traj.reward,
                     "passed": trajectory_passed(record, traj), "flow": record.flow}}


def record_rows(record: Record, role: str = "assistant", filter: str = "all",
                min_reward: float | None = None, tool_schema: str = "full", system_prompt: str = "keep") -> list[dict]:
    if not record.trajectories:
        raise StageError("record has no trajectories to train on", field="trajectories")
    index = {id(t): i for i, t in enumerate(record.trajectories)}
    return [training_row(record, t, role, index[id(t)], tool_schema, system_prompt)
            for t in select(record, filter, min_reward)]


def iter_rows(records: Iterable[Record], role: str = "assistant", filter: str = "all",
              min_reward: float | None = None, **kw: Any) -> Iterable[dict]:
    for r in records:
        yield from record_rows(r, role, filter, min_reward, **kw)
