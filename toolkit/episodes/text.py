"""What an episode says: the messages, prompts and helpers the episode loop, the SFT export and the
trainer integrations share (the agent's system prompt, the opening message, the user simulator's
scenario text and prompt, the agent's view of a dual-control dialogue)."""

from __future__ import annotations

import json
from typing import Any

from toolkit import prompts
from toolkit.envs import Environment
from toolkit.schema import Record, Usage

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
TERMINATE = "[TERMINATE]"  # Simia-RL's simulated human (env.backend=simulated, config.human)
GREETING = "Hi! How can I help you today?"


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

