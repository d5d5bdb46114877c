"""User simulators (`rollout --user-simulator`, registry kind `users`) and the LLM user simulator.

A user simulator factory is `factory(ctx: UserContext) -> user | None` (None: no user, the episode
ends when the agent replies in text). A user has `async respond(history, user_tools, usage) ->
message dict`; optional attributes the episode loop reads: `scripted` (True: a bare ###STOP### is
the end of the script, not a message), `hidden_tools()` (tool names not offered yet).

Built-ins: `llm` (the LLM user simulator over the task's user scenario), `scripted` (the task's
scripted turns `task.user_turns`, BFCL style: the next turn when the agent ends its reply;
`task.held_out_tools` {turn: [names]} are offered from that turn on), `auto` (scripted when the
task has `user_turns`, else llm).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit import prompts, registry
from toolkit.episodes.text import GREETING, STOP, _add_usage, clean, turn_prefix, user_system_prompt
from toolkit.schema import Record, Usage


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


def user_simulator(name: str, help: str = "", flow: str | None = None) -> Callable:
    """Register `factory(ctx: UserContext) -> user | None` as `rollout --user-simulator name`."""
    return registry.register("users", name, help=help, flow=flow)


@dataclass
class UserContext:
    record: Record
    llm_user: Callable[[], Any]  # builds the LLM user simulator for this episode (or None)
    env: Any = None
    sample_index: int = 0


def user_turns(record: Record) -> list[list[dict]] | None:
    t = record.task
    turns = t.user_turns if t is not None else None
    return turns if isinstance(turns, list) and turns else None


@dataclass
class ScriptedUser:
    """Plays `turns` (turn k's user messages); turn 0 is the episode's first message."""

    turns: list[list[dict]]
    held_out: dict[str, list[str]] = field(default_factory=dict)
    turn: int = 0
    scripted: bool = True

    @staticmethod
    def text(msgs: list[dict]) -> str:
        return "\n".join(str(m.get("content") or "") for m in msgs if m.get("role", "user") == "user")

    def first_message(self) -> str:
        return self.text(self.turns[0]) if self.turns else ""

    async def respond(self, history: list[dict], user_tools: list[dict], usage: Usage) -> dict:
        self.turn += 1
        if self.turn >= len(self.turns):
            return {"role": "assistant", "content": STOP}
        return {"role": "assistant", "content": self.text(self.turns[self.turn]) or "(continue)"}

    def hidden_tools(self) -> set[str]:
        return {n for k, names in self.held_out.items() if int(k) > self.turn for n in names}


@user_simulator("scripted", help="the task's scripted turns (task.user_turns; BFCL multi-turn): the next turn "
                "when the agent ends its reply; task.held_out_tools are offered from their turn on")
def scripted_user(ctx: UserContext) -> ScriptedUser | None:
    turns = user_turns(ctx.record)
    if turns is None:
        return None
    held = ctx.record.task.held_out_tools or {}
    return ScriptedUser(turns=turns, held_out={str(k): list(v) for k, v in dict(held).items()})


@user_simulator("llm", help="the LLM user simulator over task.user_scenario (none without a scenario)")
def llm_user(ctx: UserContext) -> Any:
    return ctx.llm_user()


@user_simulator("auto", help="scripted when the task has task.user_turns, else llm")
def auto_user(ctx: UserContext) -> Any:
    if user_turns(ctx.record) is not None:
        return scripted_user(ctx)
    return ctx.llm_user()
