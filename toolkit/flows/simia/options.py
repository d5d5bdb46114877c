"""Simia strategies' options (recipe keys and their defaults; see toolkit.options)."""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from toolkit.options import StrategyOptions


class RLOptions(StrategyOptions):
    """gen-task --strategy simia (Simia-RL tasks on the simulated environment)."""

    seed_trajectory: int = 0
    simulator_model: Optional[str] = None
    simulator_base_url: Optional[str] = None
    fault_rate: Optional[float] = None


class PrefilterOptions(StrategyOptions):
    """validate-task --strategy simia."""

    llm_roles: ClassVar[tuple[str, ...]] = ("judge",)
    prefilter_llm: bool = True
    seed_trajectory: int = 0
    compact_tools: Any = "auto"  # also an LLM key (toolkit.options.LLMOpts): true | false | auto


class RulesOptions(StrategyOptions):
    """repair --strategy rules."""

    system_prompt: Optional[str] = None
    system_prompt_file: Optional[str] = None
    keep_raw: bool = False
