"""LOGIGEN strategies' options (recipe keys and their defaults; see toolkit.options)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from toolkit.options import StrategyOptions


class ArchitectOptions(StrategyOptions):
    """gen-plan --strategy logigen."""

    llm_roles: ClassVar[tuple[str, ...]] = ("architect", "checker")
    semantic_check: bool = True
    max_calls: Optional[int] = None


class GenTaskOptions(StrategyOptions):
    """gen-task --strategy logigen."""

    llm_roles: ClassVar[tuple[str, ...]] = ("user_view", "consultant", "client", "boundary_seeder",
                                            "injection_designer")
    inline_target: bool = True
    max_tries: int = 8
    user_view: Literal["auto", "llm", "template"] = "auto"
    llm_boundary: Any = None          # auto (default: with --explorer llm) | true | false
    llm_boundary_share: Optional[float] = None  # default 0.5
    llm_boundary_rules: Optional[list[str]] = None
    llm_boundary_max_rules: int = 6
    llm_inject: bool = False
    llm_inject_share: float = 0.3
    violation_share: float = 0.3
    inject_share: float = 0.5
    noise_rows: int = 0               # > 0: the noise injection generates this many rows per table (up to 3 tables)
    boundary_share: float = 0.2       # goal explorer: share of boundary (N-1) tasks beyond the coverage plan
    rule_coverage: bool = True        # goal explorer: one violation-first and one boundary task per rule first
    boundary_max_draws: int = 50      # goal explorer: fruitless random N-1 draws per rule before it is dropped
    search_cache: bool = True         # goal explorer: keep the rule search per domain under $TOOLKIT_HOME (search_cache.py)
    min_writes: int = 1               # goal explorer: writes per task are drawn between these
    max_writes: int = 8
    max_turns: Optional[int] = None   # llm explorer: Consultant turns (default 12)
    max_tool_errors: Optional[int] = None
    llm_tries: int = 3
    menu_size: int = 3                # llm explorer: goals in the option menu O(s_0) the Client picks from


class ValidateTaskOptions(StrategyOptions):
    """validate-task --strategy logigen."""

    domain_check: bool = True
