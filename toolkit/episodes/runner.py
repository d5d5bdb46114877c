"""rollout's engine: `opts.n` episodes of one record (the environment built from `record.env`, the
agent and the user simulator chosen by the typed `RolloutOptions`), run concurrently.

`EpisodeRunner(opts, meter).episodes(record)` returns the record's new trajectories; the `rollout`
command (toolkit.stages.rollout) adds the checks, the rejects and the provenance around it.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Mapping
from typing import Any

from toolkit import registry
from toolkit.envs import load_env
from toolkit.episodes.agents import LLMAgent, ReplayAgent
from toolkit.episodes.distractors import DistractorSettings, distractor_tools
from toolkit.episodes.loop import EpisodeLimits, run_episode
from toolkit.episodes.text import scenario_text
from toolkit.episodes.users import LLMUser, UserContext
from toolkit.io import UsageError
from toolkit.llm import LLMConfig, get_client, llm_config
from toolkit.llm.models import model_identity
from toolkit.options import RolloutOptions, model_for, typed_options
from toolkit.schema import Record, Trajectory

ENV_FAIL = "environment could not be built: "

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


def env_llm_config(opts: Any, env_config: Mapping | None) -> LLMConfig:
    """The simulated environment's LLM (the `env` role, as grpo binds it): `--env-model` /
    `--env-base-url` ..., else the record's env.config model / base_url (gen-task --strategy
    simia's simulator_model / simulator_base_url), else the user simulator's settings."""
    keys = LLMConfig.model_fields
    merged: dict[str, Any] = {k: getattr(opts, k, None) for k in keys}
    merged.update({k: v for k in keys if (v := getattr(opts, f"user_{k}", None)) is not None})
    merged.update({k: (env_config or {})[k] for k in ("model", "base_url") if (env_config or {}).get(k) is not None})
    merged.update({f"env_{k}": getattr(opts, f"env_{k}", None) for k in keys})
    return llm_config(merged, role="env")


class EpisodeRunner:
    """The per-record episode engine of `rollout`, from the typed options (a mapping of the same
    keys for library callers: `Options.of` semantics, role-prefixed LLM keys included)."""

    def __init__(self, opts: RolloutOptions | Mapping, meter: Any):
        o = self.opts = typed_options(model_for("rollout"), opts)
        self.meter = meter
        self.kind = o.agent_kind
        self.limits = EpisodeLimits(max_turns=o.max_turns, max_tool_errors=o.max_tool_errors,
                                    max_context_tokens=o.max_context_tokens)
        if registry.lookup("distractors", o.distractor_mode) is None:
            raise UsageError(f"unknown --distractor-mode {o.distractor_mode!r}; "
                             f"choose from {', '.join(registry.names('distractors'))}")
        if registry.lookup("users", o.user_simulator) is None:
            raise UsageError(f"unknown --user-simulator {o.user_simulator!r}; "
                             f"choose from {', '.join(registry.names('users'))}")
        self.distractors = DistractorSettings(pool=tuple(o.distractor_pool or ()), embed_base_url=o.embed_base_url,
                                              embed_model=o.embed_model)
        self.first_message = "instruction" if o.first_message == "auto" else o.first_message
        self.agent_llm: LLMConfig | None = None
        self.agent_client: Any = None
        if self.kind == "llm":
            self.agent_llm = llm_config(o, role="agent")
            self.agent_client = get_client(self.agent_llm, meter)
            _tune_gc()
        self.user_llm = llm_config(o, role="user")
        self._user_client: Any = None
        self._names: dict[str, str] = {}

    def user_client(self) -> Any:
        if self._user_client is None:
            self._user_client = get_client(self.user_llm, self.meter)
        return self._user_client

    def agent_name(self) -> str:
        """The real model (GGUF file + sha256 on the embedded server, else the served name/path)."""
        if self.kind == "replay":
            return "replay"
        if "agent" not in self._names:
            self._names["agent"] = model_identity(self.agent_llm.model, self.agent_llm.base_url)
        return self._names["agent"]

    def user_name(self) -> str:
        if "user" not in self._names:
            self._names["user"] = model_identity(self.user_llm.model, self.user_llm.base_url)
        return self._names["user"]

    async def episode(self, record: Record, k: int) -> Trajectory:
        """The record's k-th new episode (trajectory index len(record.trajectories) + k)."""
        o = self.opts
        idx = len(record.trajectories) + k
        tid = f"{record.id}-t{idx}"
        overrides = {} if o.seed is None else {"seed": int(o.seed) + idx}
        try:
            env = load_env(record.env)
        except Exception as e:
            return Trajectory(id=tid, messages=[], termination="error",
                              error=f"{ENV_FAIL}{type(e).__name__}: {e}")
        try:
            initial = record.env.state if record.env and record.env.state else None
            if getattr(env, "blocking_reset", False):  # starts a process (mcp): off the event loop
                await asyncio.to_thread(env.reset, initial)
            else:
                env.reset(initial)
            if hasattr(env, "bind_llm") and self.agent_client is not None:
                env.bind_llm(get_client(env_llm_config(o, record.env.config if record.env else None), self.meter))

            def llm_user() -> LLMUser | None:
                if self.kind == "replay" or not (record.task and record.task.user_scenario):
                    return None
                usp = env.user_simulator_system_prompt() if hasattr(env, "user_simulator_system_prompt") else None
                return LLMUser(self.user_client(), scenario_text(record), sample_index=idx,
                               overrides=overrides, system_prompt=usp)

            user = registry.lookup("users", o.user_simulator).obj(
                UserContext(record=record, llm_user=llm_user, env=env, sample_index=idx))
            if self.kind == "replay":
                agent: Any = ReplayAgent(record)
            else:
                agent = LLMAgent(self.agent_client, sample_index=idx, overrides=overrides,
                                 system_prompt=o.agent_system_prompt)
            extra = (distractor_tools(record, env.tools("agent"), o.distractor_tools, idx, mode=o.distractor_mode,
                                      settings=self.distractors)
                     if o.distractor_tools > 0 or o.distractor_mode not in ("random", "auto") else [])
            traj = await run_episode(
                record, env, agent, user, tid, self.limits, extra_tools=extra,
                first_message=self.first_message, agent_model=self.agent_name(),
                user_model=self.user_name() if user is not None else None)
            if self.agent_llm is not None and self.agent_llm.constrain_tool_calls != "off":
                traj.extra["constrained_tool_calls"] = self.agent_llm.constrain_tool_calls  # toolkit.llm.constrain
            return traj
        finally:
            if getattr(env, "blocking_reset", False):
                await asyncio.to_thread(env.close)
            else:
                env.close()

    async def episodes(self, record: Record) -> list[Trajectory]:
        """`opts.n` new episodes of the record, concurrently (not yet added to it)."""
        return list(await asyncio.gather(*(self.episode(record, k) for k in range(self.opts.n))))
