"""One episode: agent x user simulator x environment.

    messages = [system(policy)] + first user message
    loop (≤ max_turns agent turns):
        agent acts → assistant message: tool calls (run in the env, one `tool` message each, a Step
                     with the state hash after the call) or text to the user
        text → the user simulator answers (or the episode ends when there is no user scenario);
               ###STOP### / ###TRANSFER### / ###OUT-OF-SCOPE### end it; in dual-control domains the
               user simulator may call its own tools first (Steps with side="user")
    termination: user_stop | transfer | out_of_scope | agent_stop | max_turns | max_errors |
                 context_length | error | replay_done

A crash inside one episode marks that trajectory failed (termination "error", the reason in
`error`) and never takes the batch down.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from toolkit.envs import Environment, ToolResult
from toolkit.episodes.agents import ReplayAgent
from toolkit.episodes.text import (GREETING, OUT_OF_SCOPE, STOP, TERMINATE, TRANSFER, _approx_chars,
                                   agent_system_prompt, agent_view, opening_message)
from toolkit.llm.transport import ToolSchemas
from toolkit.episodes.users import LLMUser
from toolkit.schema import Message, Record, Step, Trajectory, Usage


# The tool schemas offered to the agent, interned per distinct tool set: every episode of a domain
# sends the same schemas (~35 KB of JSON for airline) with every agent turn, and one shared
# ToolSchemas lets the LLM client JSON-encode them once per process instead of once per request.
# The interned copy is private (a deep copy, never put in records); each episode's own list still
# goes into its Trajectory.
_TOOLSETS: dict[tuple, list] = {}



def _wire_tools(offered: list[dict]) -> list[dict]:
    if not offered:
        return offered
    try:
        key = tuple((t.get("function") or {}).get("name") for t in offered)
    except AttributeError:
        return offered
    bucket = _TOOLSETS.get(key)
    if bucket is None:
        if len(_TOOLSETS) >= 256:
            _TOOLSETS.clear()
        bucket = _TOOLSETS[key] = []
    for ts in bucket:
        if ts == offered:
            return ts
    if len(bucket) >= 8:
        bucket.pop(0)
    ts = ToolSchemas(copy.deepcopy(offered))
    bucket.append(ts)
    return ts



@dataclass
class EpisodeLimits:
    max_turns: int = 30
    max_tool_errors: int = 5
    max_context_tokens: int = 16000
    max_user_tool_calls: int = 10


def unknown_tool(name: str, valid_names: set[str]) -> ToolResult:
    """The structured error of a call of a tool the episode does not offer."""
    return ToolResult.fail("UNKNOWN_TOOL", f"Tool {name!r} is not available here.",
                           hint="call one of: " + ", ".join(sorted(valid_names))[:500])


def tool_step(env: Environment, res: ToolResult, name: str, args: dict, side: str, tcid: str) -> Step:
    """The Step of one executed call (the environment's state hash after it; None for a backend
    without snapshots)."""
    try:
        h = env.state_hash()
    except Exception:  # pragma: no cover - a backend without snapshots
        h = None
    return Step(tool_call_id=tcid, name=name, side=side, ok=res.ok,
                arguments=args if side == "user" else None,
                error_code=(res.error or {}).get("code"), state_hash=h)


async def _run_tool(env: Environment, name: str, args: dict, side: str, tcid: str,
                    valid_names: set[str], fresh: dict | None = None) -> tuple[str, Step, bool]:
    """`fresh["hash"]`: the environment's state hash while no tool call has run since it was
    computed (None otherwise); run_episode reuses it as the final hash instead of hashing again
    (state_hash snapshots and canonicalizes every table: ~0.5 ms for airline, a third of the
    hashing in a short episode)."""
    if name not in valid_names:
        res = unknown_tool(name, valid_names)
    else:
        if fresh is not None:
            fresh["hash"] = None
        res = await env.acall(name, args, side=side)
    step = tool_step(env, res, name, args, side, tcid)
    if fresh is not None:
        fresh["hash"] = step.state_hash
    return res.to_content(), step, res.ok


async def run_episode(record: Record, env: Environment, agent: Any, user: LLMUser | None,
                      traj_id: str, limits: EpisodeLimits, extra_tools: list[dict] | None = None,
                      agent_model: str | None = None, user_model: str | None = None,
                      first_message: str = "instruction") -> Trajectory:
    """first_message: "instruction" opens with task.instruction verbatim when there is one (cheap,
    deterministic); "simulate" lets the user simulator write the opening message (tau2 style)."""
    usage = Usage()
    agent_tools = env.tools("agent")
    user_tools = env.tools("user")
    offered = agent_tools + list(extra_tools or [])
    wire_tools = _wire_tools(offered)  # what the agent is sent: equal to `offered`, encoded once
    valid_agent = {t["function"]["name"] for t in agent_tools}
    all_valid_agent = valid_agent
    hidden: set[str] = set()  # tools a scripted user holds back until their turn (BFCL miss_func)
    valid_user = {t["function"]["name"] for t in user_tools}
    system = agent_system_prompt(env)
    messages: list[dict] = [{"role": "system", "content": system}]
    steps: list[Step] = []
    user_side: list[dict] = []  # the user simulator's own tool exchanges (not shown to the agent)
    termination, error = None, None
    initial_hash = None
    fresh: dict = {"hash": None}  # see _run_tool
    begin = getattr(env, "begin_episode", None)
    if callable(begin):  # record id + sample index: per-episode randomness (fault injection) keys on it
        begin(traj_id)
    if user is not None and getattr(user, "max_turns", 0) is None:  # an LLM user's turn budget (a scripted user has none)
        user.max_turns = limits.max_turns
    try:
        initial_hash = env.state_hash()
        fresh["hash"] = initial_hash
        # ---- first user message
        if getattr(user, "scripted", False):
            messages.append({"role": "user", "content": user.first_message() or "Hello."})
        elif isinstance(agent, ReplayAgent) or user is None or (
                first_message == "instruction" and record.task and record.task.instruction):
            messages.append({"role": "user", "content": opening_message(record)})
        else:
            messages.append({"role": "assistant", "content": GREETING})  # τ² orchestrator's opening
            umsg = await _user_turn(user, messages, user_side, user_tools, valid_user, env, steps, usage, limits,
                                    fresh)
            if umsg is None:
                termination = "error"
                error = "user simulator produced no message"
            else:
                messages.append({"role": "user", "content": umsg})
                termination = _stop_reason(umsg)
        errors = 0
        turns = 0
        ctx_chars, counted = 0, 0  # approx_tokens(messages) * 4, updated as messages are appended
        while termination is None:
            if turns >= limits.max_turns:
                termination = "max_turns"
                break
            ctx_chars += sum(_approx_chars(m) for m in messages[counted:])
            counted = len(messages)
            if ctx_chars // 4 > limits.max_context_tokens:
                termination = "context_length"
                break
            turns += 1
            if isinstance(agent, ReplayAgent):  # reference actions of the user side (dual control)
                for a in agent.next_user_actions():
                    cid = f"user_{len(steps)}"
                    messages.append({"role": "assistant", "name": "user", "content": None, "tool_calls": [
                        {"id": cid, "type": "function",
                         "function": {"name": a.name, "arguments": json.dumps(a.arguments, ensure_ascii=False)}}]})
                    content, st, _ = await _run_tool(env, a.name, a.arguments, "user", cid, valid_user, fresh)
                    steps.append(st)
                    messages.append({"role": "tool", "tool_call_id": cid, "content": content})
            if user is not None and hasattr(user, "hidden_tools") and user.hidden_tools() != hidden:
                hidden = user.hidden_tools()
                wire_tools = _wire_tools([t for t in offered if t["function"]["name"] not in hidden])
                valid_agent = all_valid_agent - hidden
            amsg = await agent.act(agent_view(messages), wire_tools, usage)
            messages.append(amsg)
            if amsg.get("tool_calls"):
                for tc in amsg["tool_calls"]:
                    f = tc["function"]
                    try:
                        args = json.loads(f.get("arguments") or "{}")
                        if not isinstance(args, dict):
                            raise ValueError("arguments must be a JSON object")
                    except (json.JSONDecodeError, ValueError) as e:
                        content = json.dumps({"error": {"code": "INVALID_ARGUMENTS", "message": f"arguments are not a JSON object: {e}",
                                                        "violated_rule": None, "hint": "send arguments as a JSON object"}})
                        steps.append(Step(tool_call_id=tc["id"], name=f["name"], ok=False, error_code="INVALID_ARGUMENTS"))
                        ok = False
                    else:
                        content, st, ok = await _run_tool(env, f["name"], args, "agent", tc["id"], valid_agent, fresh)
                        steps.append(st)
                    messages.append({"role": "tool", "tool_call_id": tc["id"], "content": content})
                    if not ok:
                        errors += 1
                    if f["name"] in ("transfer_to_human_agents", "transfer_to_human"):
                        termination = "transfer"
                if errors >= limits.max_tool_errors and termination is None:
                    termination = "max_errors"
                continue
            # a text reply to the user
            if isinstance(agent, ReplayAgent) and (user is None or agent.turns is None):
                termination = "replay_done"
                break
            if user is None:
                termination = "agent_stop"
                break
            umsg = await _user_turn(user, messages, user_side, user_tools, valid_user, env, steps, usage, limits,
                                    fresh)
            if umsg is None:
                termination = "error"
                error = "user simulator produced no message"
                break
            if getattr(user, "scripted", False) and umsg.strip() == STOP:  # the script's end, not a message
                termination = "user_stop"
                break
            messages.append({"role": "user", "content": umsg})
            termination = _stop_reason(umsg)
    except Exception as e:  # one broken episode never takes the batch down
        if "context length" in str(e) or "context_length" in str(e):
            termination, error = "context_length", f"{type(e).__name__}: {e}"[:500]
        else:
            termination = "error"
            error = f"{type(e).__name__}: {e}"[:1000]
    final_hash = fresh["hash"]
    if final_hash is None:
        try:
            final_hash = env.state_hash()
        except Exception:
            pass
    msgs = _valid_messages(messages)
    traj = Trajectory(
        id=traj_id, messages=msgs, tools=offered, steps=steps, initial_state_hash=initial_hash,
        final_state_hash=final_hash, termination=termination, error=error,
        agent_model=agent_model, user_model=user_model if user is not None else None, usage=usage)
    if user is not None and not getattr(user, "system_prompt", True) and getattr(user, "max_turns", None):
        traj.extra["user_max_turns"] = user.max_turns  # the user-model SFT rows render the same prompt
    return traj


def _stop_reason(text: str) -> str | None:
    if STOP in text or TERMINATE in text:
        return "user_stop"
    if TRANSFER in text:
        return "transfer"
    if OUT_OF_SCOPE in text:
        return "out_of_scope"
    return None


async def _user_turn(user: LLMUser, messages: list[dict], user_side: list[dict], user_tools: list[dict],
                     valid_user: set[str], env: Environment, steps: list[Step], usage: Usage,
                     limits: EpisodeLimits, fresh: dict | None = None) -> str | None:
    """The user simulator's turn: optional own tool calls (dual control), then a text message."""
    for _ in range(limits.max_user_tool_calls + 1):
        history = [m for m in messages if m["role"] in ("user", "assistant")] + user_side
        msg = await user.respond(history, user_tools, usage)
        calls = msg.get("tool_calls") or []
        if calls and user_tools:
            user_side.append({"role": "_user_tool", "payload": {"role": "assistant", "content": msg.get("content"),
                                                                 "tool_calls": calls}})
            messages.append({"role": "assistant", "name": "user", "content": None, "tool_calls": calls})
            for tc in calls:
                try:
                    args = json.loads(tc["function"].get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = {}
                content, st, _ = await _run_tool(env, tc["function"]["name"], args, "user", tc["id"], valid_user,
                                                 fresh)
                steps.append(st)
                user_side.append({"role": "_user_tool", "payload": {"role": "tool", "tool_call_id": tc["id"],
                                                                     "content": content}})
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": content})
            continue
        text = (msg.get("content") or "").strip()
        return text or None
    return STOP + " (user tool-call budget exhausted)"


def _valid_messages(messages: list[dict]) -> list[Message]:
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant" and not m.get("tool_calls"):
            m.pop("tool_calls", None)
            m["content"] = m.get("content") or ""
        out.append(Message.model_validate({k: v for k, v in m.items()
                                           if k in ("role", "content", "tool_calls", "tool_call_id", "name",
                                                    "reasoning_content")}))
    return out
