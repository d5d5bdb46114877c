"""LOGIGEN strategies' options: every recipe key of gen-plan / gen-task / validate-task
`--strategy logigen`, its default and its allowed values, declared once here (see toolkit.options).
The strategies receive these models typed; the command-wide keys (`explorer`, `model`, the
role-prefixed LLM keys such as `user_view_model`) come on `ctx.opts`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import Field, field_validator

from toolkit.options import StrategyOptions, as_list

#: the goal explorer's writes per task with --explorer symbolic / llm when `max_writes` is unset
#: (goals of 1-3 writes fit the Consultant's 12-turn budget)
SYMBOLIC_MAX_WRITES = 8
LLM_MAX_WRITES = 3


class ArchitectOptions(StrategyOptions):
    """gen-plan --strategy logigen."""

    llm_roles: ClassVar[tuple[str, ...]] = ("architect", "checker")
    semantic_check: bool = Field(True, description="the checker LLM's semantic review (false: deterministic checks only)")
    max_calls: Optional[int] = Field(None, ge=1, description="the domain check's search budget per rule "
                                                            "(default: domain_check.MAX_CALLS_PER_RULE)")
    max_rounds: int = Field(3, ge=1, description="check-fix rounds per Architect stage")
    out_dir: str = Field("logigen_domains", description="where the compiled domains are written")


class GenTaskOptions(StrategyOptions):
    """gen-task --strategy logigen."""

    llm_roles: ClassVar[tuple[str, ...]] = ("user_view", "consultant", "client", "boundary_seeder",
                                            "injection_designer")
    n: int = Field(10, ge=1, description="tasks per input record")
    seed: int = 0
    inline_target: bool = Field(True, description="keep target_state inline in the ground truth")
    max_tries: int = Field(8, ge=1, description="drafts tried per wanted task")
    user_view: Literal["auto", "llm", "template"] = Field(
        "auto", description="auto = llm when a model or base URL is configured, else the deterministic template")
    llm_boundary: Union[Literal["auto"], bool] = Field(
        "auto", description="LLM boundary seeds for rules the trigger analysis cannot read (auto: with --explorer llm)")
    llm_boundary_share: float = Field(0.5, ge=0, le=1, description="share of boundary tasks from verified LLM seeds")
    llm_boundary_rules: Optional[Union[list[str], str]] = Field(
        None, description="only these rules are asked about (a list, or one comma-separated string)")
    llm_boundary_max_rules: int = Field(6, ge=0, description="rules asked about per input")
    llm_inject: bool = Field(False, description="LLM-proposed distractor / substitute rows")
    llm_inject_share: float = Field(0.3, ge=0, le=1, description="share of the tasks given an LLM injection")
    violation_share: float = 0.3      # goal explorer: at least this share of tasks start with a violating attempt
    inject_share: float = 0.5
    noise_rows: int = 0               # > 0: the noise injection generates this many rows per table (up to 3 tables)
    boundary_share: float = 0.2       # goal explorer: share of boundary (N-1) tasks beyond the coverage plan
    rule_coverage: bool = True        # goal explorer: one violation-first and one boundary task per rule first
    boundary_max_draws: int = 50      # goal explorer: fruitless random N-1 draws per rule before it is dropped
    search_cache: bool = True         # goal explorer: keep the rule search per domain under $TOOLKIT_HOME (search_cache.py)
    min_writes: int = 1               # goal explorer: writes per task are drawn between these
    max_writes: Optional[int] = Field(None, ge=1, description="most writes per task (default: SYMBOLIC_MAX_WRITES, "
                                                                "LLM_MAX_WRITES with --explorer llm)")
    max_turns: int = Field(12, ge=1, description="llm explorer: Consultant turns")
    max_tool_errors: int = Field(5, ge=1, description="llm explorer: tool errors before the episode ends")
    llm_tries: int = Field(3, ge=1, description="llm explorer: episodes tried per wanted task (at most max_tries)")
    menu_size: int = Field(3, ge=1, description="llm explorer: goals in the option menu O(s_0) the Client picks from")

    @field_validator("llm_boundary_rules")
    @classmethod
    def _rule_list(cls, v: Any) -> Optional[list[str]]:
        return as_list(v)

    def writes_cap(self, explorer: str) -> int:
        """`max_writes`, or the explorer's default."""
        if self.max_writes is not None:
            return self.max_writes
        return LLM_MAX_WRITES if explorer == "llm" else SYMBOLIC_MAX_WRITES


class ValidateTaskOptions(StrategyOptions):
    """validate-task --strategy logigen."""

    domain_check: bool = Field(True, description="the deterministic domain check, once per domain per run")
