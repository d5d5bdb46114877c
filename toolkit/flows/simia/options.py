"""Simia strategies' options (recipe keys, their defaults and help; see toolkit.options).

`simulate-env --mode trajectory` reads simulate-env's own options (toolkit.options.SimulateEnvOptions:
prompt_family, temperatures, temperature_spread, seed_trajectory)."""

from __future__ import annotations

from typing import ClassVar, Optional, Union

from pydantic import Field

from toolkit.options import StrategyOptions

# one key for two readers: the simia prompts' tool list (true: compact, auto: compact when the full list
# is over 12,000 characters, anything else: full) and the LLM client's hermes rendering (toolkit.llm:
# true / "compact" / "minimal")
CompactTools = Union[bool, str]


class RLOptions(StrategyOptions):
    """gen-task --strategy simia (Simia-RL tasks on the simulated environment)."""

    seed_trajectory: int = Field(0, ge=0, description="which trajectory of a seed record is the seed")
    simulator_model: Optional[str] = Field(None, description="the environment simulator's model (env.config.model)")
    simulator_base_url: Optional[str] = Field(None, description="its endpoint (env.config.base_url)")
    fault_rate: Optional[float] = Field(None, ge=0, le=1, description="simulated tool failures (env.config.fault_rate)")


class PrefilterOptions(StrategyOptions):
    """validate-task --strategy simia."""

    llm_roles: ClassVar[tuple[str, ...]] = ("judge",)
    prefilter_llm: bool = Field(True, description="ask the LLM after the rule checks pass (false: rules only)")
    seed_trajectory: int = Field(0, ge=0, description="which trajectory of a seed record is the seed")
    compact_tools: CompactTools = Field("auto", description="compact tool lists in the prompt: true | false | auto")


class RulesOptions(StrategyOptions):
    """repair --strategy rules."""

    system_prompt: Optional[str] = Field(None, description="replace each trajectory's system prompt with this text")
    system_prompt_file: Optional[str] = Field(None, description="... or with this file's text")
    keep_raw: bool = Field(False, description="keep the simulator's raw reply in extra.simia.raw")
