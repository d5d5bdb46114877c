"""The episode engine: agent x user simulator x environment, below the commands.

    text         the messages and prompts an episode is made of (agent system prompt, opening
                 message, the user simulator's scenario and prompt, the agent's view)
    agents       LLMAgent, ReplayAgent (the task's reference actions)
    users        the LLM user simulator and the registered ones (`rollout --user-simulator`)
    loop         run_episode: one episode, its limits and termination reasons
    distractors  irrelevant tools mixed into the agent's list (`rollout --distractor-mode`)
    runner       EpisodeRunner: `rollout`'s n episodes per record from the typed RolloutOptions

Used by `rollout` (toolkit.stages.rollout), `eval-tau2`, GRPO's rollouts (toolkit.train.grpo),
the SFT export (toolkit.train.export), the trainer integrations and the flows (LOGIGEN's LLM
explorer, ASTRA's distractor bands) alike.
"""

from toolkit.episodes.agents import Agent, LLMAgent, ReplayAgent
from toolkit.episodes.distractors import (DistractorSettings, auto_distractor_mode, distractor_source,
                                          distractor_tools)
from toolkit.episodes.loop import EpisodeLimits, run_episode, tool_step, unknown_tool
from toolkit.episodes.runner import ENV_FAIL, EpisodeRunner
from toolkit.episodes.text import (GREETING, OUT_OF_SCOPE, SCENARIO_EXTRA, STOP, TERMINATE, TRANSFER,
                                   agent_system_prompt, agent_view, approx_tokens, clean, opening_message,
                                   scenario_text, turn_prefix, user_system_prompt)
from toolkit.episodes.users import LLMUser, ScriptedUser, UserContext, user_simulator

__all__ = ["Agent", "LLMAgent", "ReplayAgent", "DistractorSettings", "auto_distractor_mode", "distractor_source",
           "distractor_tools", "EpisodeLimits", "run_episode", "tool_step", "unknown_tool", "ENV_FAIL",
           "EpisodeRunner", "GREETING", "OUT_OF_SCOPE", "SCENARIO_EXTRA", "STOP", "TERMINATE", "TRANSFER",
           "agent_system_prompt", "agent_view", "approx_tokens", "clean", "opening_message", "scenario_text",
           "turn_prefix", "user_system_prompt", "LLMUser", "ScriptedUser", "UserContext", "user_simulator"]
