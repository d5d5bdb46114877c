"""Episodes and groups: G episodes per task through rollout's engine, scored by verify."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.envs import load_env
from toolkit.episodes.distractors import DistractorSettings, distractor_tools
from toolkit.episodes.loop import EpisodeLimits, run_episode
from toolkit.episodes.text import scenario_text
from toolkit.episodes.users import LLMUser
from toolkit.llm import get_client, llm_config
from toolkit.schema import Record, Trajectory
from toolkit.scorers.engine import Verifier
from toolkit.train import advantages as ADV
from toolkit.train.grpo.agent import PolicyAgent
from toolkit.options import GRPOCommandOptions
from toolkit.train.grpo.options import GRPOOptions

# ----------------------------------------------------------------------------------------------
# episodes and groups


@dataclass
class Episode:
    record_id: str
    traj: Trajectory
    ids: list[int]
    mask: list[int]
    turn_of: list[int]
    calls_per_turn: list[int]
    prompt_len: int
    format_errors: int
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)
    sampling_logps: list[float] | None = None  # behaviour policy log-prob per id (vLLM / async), NaN on context

    @property
    def policy_tokens(self) -> int:
        return sum(self.mask)


class Rollouts:
    """Runs groups of episodes and verifies them (rollout's engine + verify's strategies)."""

    def __init__(self, copts: GRPOCommandOptions | Mapping, opts: GRPOOptions, tok, generator, meter: Any = None):
        self.opts, self.tok, self.generator = opts, tok, generator
        # the policy's --model is a checkpoint path, never the simulator's / judge's model name, and
        # its sampling settings are not theirs (user_temperature, judge_temperature ... set those)
        side = GRPOCommandOptions.typed(copts).model_copy(update={"model": None, "base_url": None, "temperature": None,
                                                                  "top_p": None})
        self.side_opts = side
        self.meter = meter
        vsrc = {**side.model_dump(), **(side.__pydantic_extra__ or {})}
        vsrc.update({"strategy": list(opts.verify_strategy), "lambda_err": opts.lambda_err,
                     "penalize_invalid_calls": opts.penalize_invalid_calls, "filter": "all",
                     "judge_rubric": opts.judge_rubric})
        self.verifier = Verifier(vsrc, meter)
        self._user_client = None

    def user_client(self):
        if self._user_client is None:
            self._user_client = get_client(llm_config(self.side_opts, role="user"), self.meter)
        return self._user_client

    async def episode(self, record: Record, k: int, step: int) -> Episode:
        key = f"{record.id}-s{step}-g{k}"
        agent = PolicyAgent(self.tok, self.generator, self.opts, key=key)
        env = load_env(record.env)
        try:
            env.reset(record.env.state if record.env and record.env.state else None)
            if hasattr(env, "bind_llm"):
                env.bind_llm(get_client(llm_config(self.side_opts, role="env"), self.meter))
            user = None
            if record.task and record.task.user_scenario:
                usp = env.user_simulator_system_prompt() if hasattr(env, "user_simulator_system_prompt") else None
                user = LLMUser(self.user_client(), scenario_text(record), sample_index=step * 1000 + k,
                               system_prompt=usp)
            extra = (distractor_tools(record, env.tools("agent"), self.opts.distractor_tools, step * 1000 + k,
                                      mode=self.opts.distractor_mode, settings=DistractorSettings())
                     if self.opts.distractor_tools else [])
            limits = EpisodeLimits(max_turns=self.opts.max_turns, max_tool_errors=self.opts.max_tool_errors,
                                   max_context_tokens=10**9)
            traj = await run_episode(record, env, agent, user, key, limits, extra_tools=extra,
                                     first_message=self.opts.first_message, agent_model="policy", user_model="user-simulator" if user else None)
        finally:
            env.close()
        if agent.truncated:
            traj.termination = "context_length"
        return Episode(record.id, traj, agent.ids, agent.mask, agent.turn_of, agent.calls_per_turn,
                       agent.prompt_len, agent.format_errors, sampling_logps=agent.sampling_logps)

    async def group(self, record: Record, step: int) -> tuple[ADV.Group, Record]:
        eps = await asyncio.gather(*(self.episode(record, k, step) for k in range(self.opts.num_generations)))
        rec = record.model_copy(deep=True)
        rec.trajectories = [e.traj for e in eps]
        await self.verifier.score(rec)
        scored = rec
        for e, t in zip(eps, scored.trajectories):
            e.traj = t
            e.reward = float(t.reward) if t.reward is not None else 0.0
            agent_steps = [s for s in t.steps if s.side == "agent"]
            step_turns = [ti for ti, n in enumerate(e.calls_per_turn) for _ in range(n)]
            if len(agent_steps) == len(step_turns):
                e.turn_rewards = ADV.turn_dense_rewards([s.reward for s in agent_steps], step_turns,
                                                        len(e.calls_per_turn))
            else:  # an episode cut short mid-turn: no dense signal rather than a misaligned one
                e.turn_rewards = [0.0] * len(e.calls_per_turn)
        return ADV.Group(record.id, [e.reward for e in eps], list(eps)), scored
