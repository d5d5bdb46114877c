"""simulate-env: answer pending tool calls with an LLM environment simulator.

Modes (`--mode`) are registered strategies of scope `simulate-env:mode` (toolkit.registry):
`call` (below) and `trajectory` (Simia's one-call trajectory simulation, registered by
toolkit/flows/simia/simulate.py).

For each record, the last trajectory must end with an assistant message carrying tool calls that
have no `tool` answer yet. Each pending call is simulated (Simia environment-feedback prompt;
`astra` adds fault injection) and answered with a `tool` message; a `Step` is recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolkit.envs import backend_capabilities, load_env
from toolkit.io import StageError, add_provenance
from toolkit.llm import get_client, llm_config
from toolkit.options import SimulateEnvOptions
from toolkit.roles.env_simulator import render_history, simulate_call
from toolkit.schema import Message, Record, Step
from toolkit.stages.base import FnStage, StageParts
from toolkit.stages.registry import StageContext, get, strategy

MODE_SCOPE = "simulate-env:mode"


def pending_calls(messages: list[Message]) -> list[dict]:
    if not messages or messages[-1].role != "assistant" or not messages[-1].tool_calls:
        return []
    return [tc.model_dump() for tc in messages[-1].tool_calls]


def context_for(record: Record) -> tuple[str, list[dict]]:
    """(policy, tools) from the record's environment when it can be rebuilt, else its config."""
    policy, tools = "", []
    if record.env is not None:
        config = record.env.config or {}  # the record's env config (data, not options)
        policy = config.get("policy") or ""
        tools = config.get("tools") or []
        if not backend_capabilities(record.env.backend).simulated and not (policy and tools):
            try:
                with load_env(record.env) as env:
                    policy = policy or env.policy()
                    tools = tools or env.tools("agent")
            except Exception:  # the record may describe an env we can't build here: simulate anyway
                pass
    return policy, tools


def reference_text(record: Record, current_index: int) -> str:
    ref = record.extra.get("reference")
    if isinstance(ref, str):
        return ref
    if isinstance(ref, list):
        return json.dumps(ref, ensure_ascii=False)[:8000]
    for i, t in enumerate(record.trajectories):
        if i != current_index:
            return render_history([m.model_dump(exclude_none=True) for m in t.messages], 8000)
    return ""


def build(opts: SimulateEnvOptions | Mapping, meter: Any):
    """The per-record function of the registered `--mode` (default call); a mapping of the options'
    keys is validated into SimulateEnvOptions first."""
    opts = SimulateEnvOptions.typed(opts)
    info = get(MODE_SCOPE, opts.mode)
    return info.factory(opts, StageContext(command="simulate-env", opts=opts, meter=meter))


@strategy(MODE_SCOPE, "call", help="answer the pending tool calls (--strategy simia | astra with --fault-rate)")
def build_call(opts: SimulateEnvOptions, ctx: StageContext):
    lcfg = llm_config(opts, role="env")
    client = get_client(lcfg, ctx.meter)
    strategy = opts.strategy
    fault_rate = opts.fault_rate

    async def fn(record: Record) -> Record:
        if not record.trajectories:
            raise StageError("record has no trajectory to continue", field="trajectories")
        ti = len(record.trajectories) - 1
        traj = record.trajectories[ti]
        calls = pending_calls(traj.messages)
        if not calls:
            raise StageError("no pending tool call: the last message of the last trajectory is not an "
                             "assistant message with tool_calls", field=f"trajectories.{ti}.messages")
        policy, tools = context_for(record)
        tools = tools or [t.model_dump() for t in traj.tools]
        history = [m.model_dump(exclude_none=True) for m in traj.messages]
        ref = reference_text(record, ti)
        total = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
        for tc in calls:
            result, usage = await simulate_call(
                client, policy=policy, tools=tools, history=history, tool_call=tc, reference=ref,
                fault_rate=fault_rate if strategy == "astra" or fault_rate else 0.0,
                fault_key=f"{record.id}:{traj.id}:{tc['id']}")
            msg = {"role": "tool", "tool_call_id": tc["id"], "content": result.to_content()}
            history.append(msg)
            traj.messages.append(Message.model_validate(msg))
            traj.steps.append(Step(tool_call_id=tc["id"], name=tc["function"]["name"], ok=result.ok,
                                   error_code=(result.error or {}).get("code")))
            for k in total:
                total[k] += usage.get(k, 0)
            traj.usage.prompt_tokens += usage["prompt_tokens"]
            traj.usage.completion_tokens += usage["completion_tokens"]
            traj.usage.requests += usage["requests"]
            traj.usage.cache_hits += usage["cache_hits"]
            traj.usage.cost += usage["cost"]
        add_provenance(record, "simulate-env", strategy=strategy, model=lcfg.model or "embedded",
                       recipe_hash=opts.recipe_hash, usage=total)
        return record

    return fn


class SimulateEnv(FnStage):
    """simulate-env as a stage object."""

    command = "simulate-env"

    def build(self) -> StageParts:
        return StageParts.of(build(self.opts, self.meter))
