"""rollout: agent x user simulator x environment episodes.

One episode:
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
`error`) and never takes the batch down. Episodes of one record run concurrently; the LLM client
limits concurrency per endpoint.

The engine is a library: `run_episode(...)` is used by `rollout`, `eval-tau2` and GRPO rollouts.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolkit import prompts, registry
from toolkit.llm import llm_config
from toolkit.envs import Environment, ToolResult, load_env
from toolkit.io import StageError, UsageError, add_provenance
from toolkit.options import RolloutOptions, typed_options
from toolkit.schema import Message, Record, Step, Trajectory, Usage
from toolkit.stages import FnStage, make_meter  # noqa: F401  (CLI imports it from here)

_ENV_FAIL = "environment could not be built: "

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
TERMINATE = "[TERMINATE]"  # Simia-RL's simulated human (env.backend=simulated, config.human)
GREETING = "Hi! How can I help you today?"


# ----------------------------------------------------------------------------------------------
# helpers


def clean(m: dict) -> dict:
    """A message as the OpenAI API wants it (no null keys)."""
    return {k: v for k, v in m.items() if v is not None}


def agent_view(messages: list[dict]) -> list[dict]:
    """The conversation as the agent sees it: without the user simulator's own tool exchanges
    (assistant messages with name="user" and their tool results; dual-control domains)."""
    hidden: set[str] = set()
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("name") == "user":
            hidden |= {tc["id"] for tc in m.get("tool_calls") or []}
            continue
        if m["role"] == "tool" and m.get("tool_call_id") in hidden:
            continue
        out.append(m)
    return out


def approx_tokens(messages: list[dict]) -> int:
    return sum(_approx_chars(m) for m in messages) // 4


def _approx_chars(m: dict) -> int:
    return len(json.dumps(m, ensure_ascii=False))


# The tool schemas offered to the agent, interned per distinct tool set: every episode of a domain
# sends the same schemas (~35 KB of JSON for airline) with every agent turn, and one shared
# ToolSchemas lets the LLM client JSON-encode them once per process instead of once per request.
# The interned copy is private (a deep copy, never put in records); each episode's own list still
# goes into its Trajectory.
_TOOLSETS: dict[tuple, list] = {}


def _wire_tools(offered: list[dict]) -> list[dict]:
    if not offered:
        return offered
    from toolkit.llm.transport import ToolSchemas

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


def _add_usage(u: Usage, res: Any) -> None:
    u.prompt_tokens += int(res.usage.get("prompt_tokens", 0) or 0)
    u.completion_tokens += int(res.usage.get("completion_tokens", 0) or 0)
    u.cost += float(res.cost or 0.0)
    if res.cached:
        u.cache_hits += 1
    else:
        u.requests += 1


def scenario_text(record: Record) -> str:
    t = record.task
    if t is None:
        return ""
    us = t.user_scenario
    parts = []
    if us is not None:
        for label, val in (("Persona", us.persona), ("Reason for call", us.reason_for_call),
                           ("Known info", us.known_info), ("Unknown info", us.unknown_info),
                           ("Task instructions", us.instructions)):
            if val:
                parts.append(f"{label}: {val}")
        ex = us.extra or {}
        for key, label in SCENARIO_EXTRA:  # EigenData RandomPool's <PARAMETERS>, kept by UserIntent
            val = ex.get(key)
            if isinstance(val, (str, int, float)) and str(val).strip():
                parts.append(f"{label}: {val}")
    if t.instruction and not (us and us.reason_for_call):
        parts.append(f"Your request: {t.instruction}")
    return "\n".join(parts)


# user_scenario.extra keys the simulator acts out (EigenData UserIntentAgent's selected parameters:
# behavioral pattern / urgency / emotional state); they reach the simulator and the user-model SFT rows
SCENARIO_EXTRA = (("behavioral_pattern", "Behaviour pattern"), ("urgency_level", "Urgency"),
                  ("emotional_state", "Emotional state"))


def user_system_prompt(scenario: str, max_turns: int | None = None) -> tuple[object, str]:
    """(template, rendered) user-simulator system prompt: the scenario, the knowledge bounds and,
    with max_turns, the turn budget (EigenData App. 3.1: Current Turn / Max Turns)."""
    tpl = prompts.cached("user_simulator")
    budget = ("\n## Turn Budget\n"
              f"- The conversation is cut after {max_turns} agent turns (every agent message or tool call is one "
              f"turn). Each agent message you see starts with \"[agent turn t of {max_turns}]\".\n"
              "- Work towards your goal within that budget; when it is reached, or cannot be reached, end the "
              "conversation with the right token instead of dragging it on.\n") if max_turns else ""
    return tpl, tpl.render(scenario=scenario, turn_budget=budget)


def turn_prefix(t: int, max_turns: int | None) -> str:
    return f"[agent turn {t} of {max_turns}] " if max_turns and t > 0 else ""


# ----------------------------------------------------------------------------------------------
# agents


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


# ----------------------------------------------------------------------------------------------
# user simulator


@dataclass
class LLMUser:
    client: Any
    scenario: str
    sample_index: int = 0
    overrides: dict = field(default_factory=dict)
    system_prompt: str | None = None  # e.g. τ²'s own user-simulator prompt for tau2 tasks
    max_turns: int | None = None  # the episode's turn budget (run_episode fills it from its limits)

    async def respond(self, history: list[dict], user_tools: list[dict], usage: Usage) -> dict:
        """history: the dialogue so far as the agent sees it; flipped so the simulator is `assistant`."""
        sys_prompt = self.system_prompt
        budget = None if sys_prompt else self.max_turns  # τ²'s own prompt has no turn budget
        if not sys_prompt:
            tpl = prompts.cached("user_simulator")
            cached = self.__dict__.get("_rendered")
            if cached is None or cached[0] is not tpl or cached[2] != budget:
                tpl, text = user_system_prompt(self.scenario, budget)
                cached = self.__dict__["_rendered"] = (tpl, text, budget)
            sys_prompt = cached[1]
        flipped: list[dict] = [{"role": "system", "content": sys_prompt}]
        t = 0
        for m in history:
            if m["role"] == "assistant" and m.get("name") != "user" and m.get("content") != GREETING:
                t += 1  # an agent turn (a message or a tool call), as run_episode counts them
            if m["role"] == "assistant" and m.get("content") and not m.get("tool_calls"):
                flipped.append({"role": "user", "content": turn_prefix(t, budget) + m["content"]})
            elif m["role"] == "user":
                flipped.append({"role": "assistant", "content": m.get("content") or ""})
            elif m["role"] == "_user_tool":  # the simulator's own tool exchanges
                flipped.append(m["payload"])
        if len(flipped) == 1:
            flipped.append({"role": "user", "content": GREETING})
        res = await self.client.chat([clean(m) for m in flipped], tools=user_tools or None,
                                     sample_index=self.sample_index, **self.overrides)
        _add_usage(usage, res)
        return dict(res.message)


# ----------------------------------------------------------------------------------------------
# one episode


@dataclass
class EpisodeLimits:
    max_turns: int = 30
    max_tool_errors: int = 5
    max_context_tokens: int = 16000
    max_user_tool_calls: int = 10


def agent_system_prompt(env: Environment) -> str:
    """The agent's system message for `env`: τ²'s own LLMAgent prompt in tau2 domains, else the
    toolkit's agent prompt around the environment's policy (run_episode and the trainer
    integrations, toolkit.integrations, open every episode with it)."""
    if hasattr(env, "agent_system_prompt"):  # tau2: τ²'s own LLMAgent prompt
        return env.agent_system_prompt()
    return prompts.cached("agent_system").render(policy=env.policy() or "(no policy)")


def opening_message(record: Record) -> str:
    """The first user message when no user simulator writes it: the task's instruction, else the
    scenario text, else "Hello."."""
    return (record.task.instruction if record.task else None) or scenario_text(record) or "Hello."


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


# ----------------------------------------------------------------------------------------------
# distractor tools (irrelevant-tool mixing)


def distractor_source(name: str, help: str = "", flow: str | None = None):
    """Register `fn(record, own_tools, n, seed, cfg) -> [tool schemas]` as `--distractor-mode name`:
    the tools appended to the agent's tool list (own_tools: the env's agent tools; n: --distractor-tools;
    seed: the trajectory index; cfg: the merged config)."""
    return registry.register("distractors", name, help=help, flow=flow)


def distractor_tools(record: Record, own: list[dict], n: int, seed: int, mode: str = "auto",
                     cfg: dict | None = None) -> list[dict]:
    """The tools `--distractor-mode mode` adds (random: n tools from other bundled domains;
    astra-random / bands: ASTRA's, registered by toolkit.flows.astra.mixing; auto, the default:
    the record's flow picks, see `auto_distractor_mode`)."""
    if mode == "auto":
        if n <= 0:
            return []
        mode = auto_distractor_mode(record)
    e = registry.lookup("distractors", mode)
    if e is None:
        raise UsageError(f"unknown --distractor-mode {mode!r}; choose from {', '.join(registry.names('distractors'))}")
    return e.obj(record, own, n, seed, cfg or {})


# the distractor source a flow's records get by default (`--distractor-mode auto`): ASTRA mixes
# irrelevant tools by similarity band (§3.2.2); every other flow draws random tools
FLOW_DISTRACTORS = {"astra": "bands"}


def auto_distractor_mode(record: Record) -> str:
    flow = record.flow or ("astra" if isinstance((record.extra or {}).get("astra"), dict) else None)
    return FLOW_DISTRACTORS.get(flow or "", "random")


@distractor_source("auto", help="the record's flow picks: ASTRA records → bands, others → random")
def auto_distractors(record: Record, own: list[dict], n: int, seed: int, cfg: dict) -> list[dict]:
    return distractor_tools(record, own, n, seed, mode="auto", cfg=cfg)


@distractor_source("random", help="N tools drawn from the other registered sqlite domains")
def random_distractors(record: Record, own: list[dict], n: int, seed: int, cfg: dict) -> list[dict]:
    if n <= 0:
        return []
    from toolkit import domains

    pool: list[dict] = []
    own_names = {t["function"]["name"] for t in own}
    env_id = record.env.id if record.env else None
    for d in domains.list_domains():
        if d == env_id:
            continue
        with load_env({"backend": "sqlite", "id": d}) as e:
            pool += [t for t in e.tools("agent") if t["function"]["name"] not in own_names]
    rng = random.Random(int.from_bytes(hashlib.blake2b(f"{record.id}:{seed}".encode(), digest_size=8).digest(), "big"))
    rng.shuffle(pool)
    return pool[:n]


# ----------------------------------------------------------------------------------------------
# the stage

# Hundreds of concurrent episodes keep a few thousand container objects each alive across every
# LLM round trip (environment, tool schemas, messages). With CPython's default generation-0
# threshold (700 allocations) they are all promoted to the oldest generation within
# milliseconds and its full collections keep re-walking them: measured 15% of the rollout
# process's CPU at 256 concurrent episodes, in stop-the-world pauses of 100+ ms that also add
# latency to every in-flight episode. A larger generation-0 threshold lets most of them die
# young. Raised once per process, never lowered; TOOLKIT_GC_TUNE=0 leaves the GC alone.
GC_GEN0_THRESHOLD = 50_000
_GC_TUNED = False


def _tune_gc() -> None:
    global _GC_TUNED
    if _GC_TUNED or os.environ.get("TOOLKIT_GC_TUNE", "1") == "0":
        return
    _GC_TUNED = True
    t0, t1, t2 = gc.get_threshold()
    if 0 < t0 < GC_GEN0_THRESHOLD:
        gc.set_threshold(GC_GEN0_THRESHOLD, t1, t2)


def build(cfg: dict | RolloutOptions, meter: Any):
    """The per-record rollout function from the typed options (or a merged config dict)."""
    o = typed_options(RolloutOptions, cfg)
    cfg = cfg if isinstance(cfg, dict) else cfg.cfg()  # role-prefixed LLM keys for llm_config
    n = o.n
    kind = o.agent_kind
    limits = EpisodeLimits(max_turns=o.max_turns, max_tool_errors=o.max_tool_errors,
                           max_context_tokens=o.max_context_tokens)
    n_distract = o.distractor_tools
    d_mode = o.distractor_mode
    if registry.lookup("distractors", d_mode) is None:
        raise UsageError(f"unknown --distractor-mode {d_mode!r}; choose from {', '.join(registry.names('distractors'))}")
    user_kind = o.user_simulator
    if registry.lookup("users", user_kind) is None:
        raise UsageError(f"unknown --user-simulator {user_kind!r}; choose from {', '.join(registry.names('users'))}")
    first_message = o.first_message
    if first_message == "auto":
        first_message = "instruction"
    base_seed = o.seed
    agent_client = user_client = None
    agent_cfg = user_cfg = None
    if kind == "llm":
        from toolkit.llm import get_client

        agent_cfg = llm_config(cfg, role="agent")
        agent_client = get_client(agent_cfg, meter)
        _tune_gc()
    user_cfg = llm_config(cfg, role="user")

    def _user_client():
        nonlocal user_client
        if user_client is None:
            from toolkit.llm import get_client

            user_client = get_client(user_cfg, meter)
        return user_client

    def _env_client(record: Record):
        """The simulated environment's LLM (the `env` role, as grpo binds it): `--env-model` /
        `--env-base-url` ..., else the record's env.config model / base_url (gen-task --strategy
        simia's simulator_model / simulator_base_url), else the user simulator's settings (as before)."""
        from toolkit.llm import get_client

        merged = dict(cfg)
        merged.update({k[len("user_"):]: v for k, v in cfg.items() if k.startswith("user_") and v is not None})
        ecfg = (record.env.config or {}) if record.env else {}
        for key in ("model", "base_url"):
            if ecfg.get(key) is not None:
                merged[key] = ecfg[key]
        return get_client(llm_config(merged, role="env"), meter)

    names: dict[str, str] = {}

    def agent_name() -> str:
        # the real model (GGUF file + sha256 on the embedded server, else the served name/path)
        if "agent" not in names:
            from toolkit.llm.models import model_identity

            names["agent"] = model_identity(agent_cfg.model, agent_cfg.base_url)
        return names["agent"]

    def user_name() -> str:
        if "user" not in names:
            from toolkit.llm.models import model_identity

            names["user"] = model_identity(user_cfg.model, user_cfg.base_url)
        return names["user"]

    async def one(record: Record, k: int) -> Trajectory:
        idx = len(record.trajectories) + k
        tid = f"{record.id}-t{idx}"
        overrides = {} if base_seed is None else {"seed": int(base_seed) + idx}
        try:
            env = load_env(record.env)
        except Exception as e:
            return Trajectory(id=tid, messages=[], termination="error",
                              error=f"{_ENV_FAIL}{type(e).__name__}: {e}")
        try:
            initial = record.env.state if record.env and record.env.state else None
            if getattr(env, "blocking_reset", False):  # starts a process (mcp): off the event loop
                await asyncio.to_thread(env.reset, initial)
            else:
                env.reset(initial)
            if hasattr(env, "bind_llm") and agent_client is not None:
                env.bind_llm(_env_client(record))
            def llm_user() -> LLMUser | None:
                if kind == "replay" or not (record.task and record.task.user_scenario):
                    return None
                usp = env.user_simulator_system_prompt() if hasattr(env, "user_simulator_system_prompt") else None
                return LLMUser(_user_client(), scenario_text(record), sample_index=idx,
                               overrides=overrides, system_prompt=usp)

            from toolkit.stages.users import UserContext

            user = registry.lookup("users", user_kind).obj(
                UserContext(record=record, llm_user=llm_user, env=env, sample_index=idx))
            if kind == "replay":
                agent: Any = ReplayAgent(record)
            else:
                agent = LLMAgent(agent_client, sample_index=idx, overrides=overrides,
                                 system_prompt=o.agent_system_prompt)
            extra = (distractor_tools(record, env.tools("agent"), n_distract, idx, mode=d_mode, cfg=cfg)
                     if n_distract > 0 or d_mode not in ("random", "auto") else [])
            traj = await run_episode(
                record, env, agent, user, tid, limits, extra_tools=extra,
                first_message=first_message,
                agent_model=("replay" if kind == "replay" else agent_name()),
                user_model=user_name() if user is not None else None)
            if agent_cfg is not None and agent_cfg.constrain_tool_calls != "off":
                traj.extra["constrained_tool_calls"] = agent_cfg.constrain_tool_calls  # toolkit.llm.constrain
            return traj
        finally:
            if getattr(env, "blocking_reset", False):
                await asyncio.to_thread(env.close)
            else:
                env.close()

    async def fn(record: Record) -> Record:
        if record.env is None:
            raise StageError("record has no env: rollout needs an environment reference", field="env")
        if kind == "replay" and not (record.task and record.task.ground_truth):
            raise StageError("--agent replay needs task.ground_truth (actions may be empty for refusal tasks)",
                             field="task.ground_truth")
        trajs = await asyncio.gather(*(one(record, k) for k in range(n)))
        if trajs and all(t.termination == "error" and (t.error or "").startswith(_ENV_FAIL) for t in trajs):
            # an environment that cannot be built is a reject (exit 1), not n empty trajectories
            where = "env.path" if getattr(record.env, "path", None) else "env"
            hint = (" (a relative env.path is resolved against the --input file's directory, then the "
                    "current directory)") if where == "env.path" else ""
            raise StageError(trajs[0].error + hint, field=where)
        record.trajectories.extend(trajs)
        total = Usage()
        for t in trajs:
            for f_ in ("prompt_tokens", "completion_tokens", "requests", "cache_hits"):
                setattr(total, f_, getattr(total, f_) + getattr(t.usage, f_))
            total.cost += t.usage.cost
        add_provenance(record, "rollout", strategy=kind,
                       model=None if kind == "replay" else agent_name(),
                       recipe_hash=o.recipe_hash, usage=total.model_dump())
        return record

    return fn


class Rollout(FnStage):
    """rollout as a stage object: `Rollout(RolloutOptions(agent_kind="replay", n=2))`."""

    command = "rollout"

    def build(self) -> Any:
        return build(self.opts, self.meter)
