"""Records → chat+tools training rows (what `sft` trains on and `sft --export` writes).

A training row is
    {"id": "<record id>/<trajectory id>", "role": "assistant" | "user",
     "messages": [...], "tools": [...], "meta": {"record_id", "trajectory_id", "reward", "passed", "flow"}}
with messages in OpenAI shape except that tool-call `arguments` are **dicts** (chat templates
write them with `tojson`; a JSON string would come out double-encoded and teach the model to emit
stringified arguments). `tools` is the trajectory's offered tool list — the same OpenAI function
schemas `grpo` passes to the chat template when it renders the policy prompt.

Agent rows (`role="assistant"`, the default): the conversation as the agent saw it
(`toolkit.stages.rollout.agent_view`: the user simulator's own tool traffic in dual-control
domains — assistant messages named "user" and their tool results — is dropped).

User rows (`role="user"`, EigenData's user-model SFT): the conversation as the user simulator saw
it, flipped exactly as `rollout.LLMUser.respond` flips it: system = the user-simulator prompt with
the task's scenario, the agent's text replies become `user` turns, the user's messages become
`assistant` turns (so "assistant-only loss" trains exactly the user turns), the agent's tool calls
and results are dropped; a conversation the user opens starts with the greeting as a `user` turn.

Formats for other stacks (`export_row`):
    chat      the row itself (HF chat-template ready: dict arguments)
    openai    OpenAI fine-tuning JSONL: {"messages", "tools"}, arguments as JSON strings (the API's
              wire format; do not feed these to a HF chat template)
    sharegpt  LLaMA-Factory ShareGPT: {"conversations": [{"from": human|gpt|function_call|observation,
              "value"}], "system", "tools" (JSON string)}; an assistant turn with text *and* tool
              calls keeps only the calls (ShareGPT alternation), parallel calls are one JSON list
    hermes    {"text": ...} rendered with toolkit.train.template (ChatML + <tool_call> JSON)
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterable

from toolkit import registry
from toolkit.io import StageError
from toolkit.schema import Record, Trajectory

FORMATS = ("chat", "openai", "sharegpt", "hermes")  # the built-in ones; registry.names("exporters") has all
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


def _args_dict(raw: Any, where: str) -> dict:
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    try:
        val = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as e:
        raise StageError(f"tool-call arguments are not JSON ({e}); refusing to train on them", field=where) from None
    if isinstance(val, str):  # already double-encoded upstream: decode once more
        try:
            val = json.loads(val)
        except json.JSONDecodeError:
            pass
    if not isinstance(val, dict):
        raise StageError(f"tool-call arguments must be a JSON object, got {type(val).__name__}", field=where)
    return val


def _plain(m: Any) -> dict:
    d = m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m)
    return d


def agent_messages(traj: Trajectory, ti: int = 0) -> list[dict]:
    """The agent's view with dict arguments and tool names on tool results."""
    from toolkit.stages.rollout import agent_view

    return chat_messages(agent_view([_plain(m) for m in traj.messages]), ti)


def chat_messages(msgs: list, ti: int = 0) -> list[dict]:
    """OpenAI messages (dicts or schema Messages) in chat-template shape: tool-call arguments
    decoded to dicts (StageError naming trajectories[ti].messages[j]...arguments when they are not
    a JSON object), tool results named after their call and given string content, assistant text
    never None."""
    msgs = [_plain(m) for m in msgs]
    out: list[dict] = []
    names: dict[str, str] = {}
    for j, m in enumerate(msgs):
        m = dict(m)
        if m["role"] == "assistant":
            m.pop("name", None)
            if m.get("tool_calls"):
                calls = []
                for k, tc in enumerate(m["tool_calls"]):
                    fn = tc["function"]
                    where = f"trajectories[{ti}].messages[{j}].tool_calls[{k}].function.arguments"
                    calls.append({"id": tc.get("id"), "type": "function",
                                  "function": {"name": fn["name"], "arguments": _args_dict(fn.get("arguments"), where)}})
                    if tc.get("id"):
                        names[tc["id"]] = fn["name"]
                m["tool_calls"] = calls
            else:
                m.pop("tool_calls", None)
                m["content"] = m.get("content") or ""
        elif m["role"] == "tool":
            if m.get("tool_call_id") in names:
                m["name"] = names[m["tool_call_id"]]
            m["content"] = m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        out.append(m)
    return out


def user_messages(record: Record, traj: Trajectory, ti: int = 0) -> list[dict]:
    """The user simulator's view (see module doc), flipped like rollout.LLMUser.respond."""
    from toolkit.stages.rollout import GREETING, _prompt, scenario_text

    system = _prompt("user_simulator").render(scenario=scenario_text(record))
    flipped: list[dict] = [{"role": "system", "content": system}]
    user_side: set[str] = set()
    for j, m in enumerate(traj.messages):
        d = _plain(m)
        if d["role"] == "assistant" and d.get("name") == "user" and d.get("tool_calls"):
            calls = []
            for k, tc in enumerate(d["tool_calls"]):
                where = f"trajectories[{ti}].messages[{j}].tool_calls[{k}].function.arguments"
                calls.append({"id": tc.get("id"), "type": "function",
                              "function": {"name": tc["function"]["name"],
                                           "arguments": _args_dict(tc["function"].get("arguments"), where)}})
                user_side.add(tc.get("id"))
            flipped.append({"role": "assistant", "content": d.get("content") or "", "tool_calls": calls})
        elif d["role"] == "tool" and d.get("tool_call_id") in user_side:
            flipped.append({"role": "tool", "tool_call_id": d["tool_call_id"], "content": d.get("content") or ""})
        elif d["role"] == "assistant" and d.get("content") and not d.get("tool_calls"):
            flipped.append({"role": "user", "content": d["content"]})
        elif d["role"] == "user":
            flipped.append({"role": "assistant", "content": d.get("content") or ""})
    if len(flipped) > 1 and flipped[1]["role"] == "assistant":
        flipped.insert(1, {"role": "user", "content": GREETING})
    return flipped


TOOL_SCHEMAS = ("full", "compact")
SYSTEM_MODES = ("keep", "drop")


def prepare_tools(tools: list, mode: str = "full") -> list[dict]:
    """The tool list as the chat template gets it, in SFT rows and in GRPO prompts alike:
    full = the OpenAI schemas as offered; compact = toolkit.llm.toolcalls.compact_tool (first
    sentence of each description, parameter names/types/enums; ~5x shorter for the sqlite domains)."""
    if mode not in TOOL_SCHEMAS:
        raise ValueError(f"tool_schema must be one of {TOOL_SCHEMAS}")
    out = [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else dict(t) for t in tools]
    if mode == "compact":
        from toolkit.llm.toolcalls import compact_tool

        out = [{"type": "function", "function": compact_tool(t)} for t in out]
    return out


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
        from toolkit.envs import load_env

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


# ----------------------------------------------------------------------------------------------
# formats


def exporter(name: str, help: str = "", flow: str | None = None):
    """Register `fn(row) -> dict` (one output JSONL object per training row) as `sft --export name`."""
    return registry.register("exporters", name, help=help, flow=flow)


@exporter("chat", help="the training row itself (HF chat-template ready: dict arguments)")
def to_chat(row: dict) -> dict:
    return row


@exporter("openai", help="OpenAI fine-tuning JSONL: messages + tools, arguments as JSON strings")
def to_openai(row: dict) -> dict:
    msgs = copy.deepcopy(row["messages"])
    for m in msgs:
        for tc in m.get("tool_calls") or []:
            tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"], ensure_ascii=False)
        if m["role"] == "tool":
            m.pop("name", None)
    out: dict = {"messages": msgs}
    if row.get("tools"):
        out["tools"] = row["tools"]
    return out


@exporter("sharegpt", help="LLaMA-Factory ShareGPT conversations (function_call / observation turns)")
def to_sharegpt(row: dict) -> dict:
    system = ""
    conv: list[dict] = []
    msgs = row["messages"]
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] == "system":
            system = m.get("content") or ""
        elif m["role"] == "user":
            conv.append({"from": "human", "value": m.get("content") or ""})
        elif m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            if calls:
                objs = [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]} for tc in calls]
                conv.append({"from": "function_call",
                             "value": json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)})
            else:
                conv.append({"from": "gpt", "value": m.get("content") or ""})
        elif m["role"] == "tool":
            results = [m.get("content") or ""]
            while i + 1 < len(msgs) and msgs[i + 1]["role"] == "tool":
                i += 1
                results.append(msgs[i].get("content") or "")
            conv.append({"from": "observation",
                         "value": results[0] if len(results) == 1 else json.dumps(results, ensure_ascii=False)})
        i += 1
    out: dict = {"conversations": conv, "system": system}
    if row.get("tools"):
        out["tools"] = json.dumps([t.get("function", t) for t in row["tools"]], ensure_ascii=False)
    return out


@exporter("hermes", help='{"text"} rendered with the toolkit Hermes template (ChatML + <tool_call>)')
def to_hermes(row: dict) -> dict:
    from toolkit.train.template import render_hermes

    return {"text": render_hermes(row["messages"], row.get("tools") or None)}


def export_row(row: dict, fmt: str) -> dict:
    e = registry.lookup("exporters", fmt)
    if e is None:
        raise ValueError(f"unknown export format {fmt!r}; choose from {', '.join(registry.names('exporters'))}")
    return e.obj(row)


def iter_rows(records: Iterable[Record], role: str = "assistant", filter: str = "all",
              min_reward: float | None = None, **kw: Any) -> Iterable[dict]:
    for r in records:
        yield from record_rows(r, role, filter, min_reward, **kw)
