"""EigenData / AReaL-SEA strategies' options (recipe keys, their defaults and help; see toolkit.options)."""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from toolkit.options import StrategyOptions

MAX_ROUNDS = 3  # EigenData's ModifyAgent: at most three repair rounds, discard only in the last


class GenPlanOptions(StrategyOptions):
    """gen-plan --strategy eigendata / sea."""

    llm_roles: ClassVar[tuple[str, ...]] = ("planner",)
    n: int = Field(4, ge=1, description="prompt sets (eigendata) / plans (sea) per environment record")


class GenTaskOptions(StrategyOptions):
    """gen-task --strategy eigendata."""

    llm_roles: ClassVar[tuple[str, ...]] = ("generator",)
    n: int = Field(1, ge=1, description="tasks (scenarios) per input record")


class SeaGenTaskOptions(GenTaskOptions):
    """gen-task --strategy sea."""

    synthesis_max_calls: int = Field(12, ge=0, description="tool calls the Task Synthesis agent may run")
    synthesis_min_calls: int = Field(1, ge=0, description="tool calls it must run before writing the task")


class ValidateTaskOptions(StrategyOptions):
    """validate-task --strategy eigendata / sea."""

    llm_roles: ClassVar[tuple[str, ...]] = ("validator",)
    validate_mode: Literal["scratch", "readonly"] = Field(
        "scratch", description="scratch: the validator's writes change only a scratch environment; readonly: a call that changed the state is undone")
    validate_max_calls: int = Field(12, ge=0, description="tool calls the validator may run")
    validate_min_calls: int = Field(1, ge=0, description="tool calls it must run before its verdict")


class RepairOptions(StrategyOptions):
    """repair --strategy eigendata."""

    llm_roles: ClassVar[tuple[str, ...]] = ("repair",)
    max_rounds: int = Field(MAX_ROUNDS, ge=1, description=f"repair rounds before a record is discarded "
                                                           f"(capped at {MAX_ROUNDS}; also a repair flag)")


class ReflectOptions(StrategyOptions):
    """reflect --strategy eigendata / sea (the evolved prompts' folder is reflect's --prompts-dir)."""

    llm_roles: ClassVar[tuple[str, ...]] = ("reflector",)
    pilot_criteria: Optional[dict[str, float]] = Field(
        None, description="pilot stop thresholds per metric (unset: toolkit.flows.eigendata.metrics' defaults)")
    judge_targets: Optional[dict[str, float]] = Field(
        None, description="orchestration Judge axis → minimum batch mean (unset: the Judge's defaults)")


class MakeVerifierOptions(StrategyOptions):
    """make-verifier --strategy eigendata."""

    llm_roles: ClassVar[tuple[str, ...]] = ("verifier",)
    verifier_source: Literal["llm", "template"] = Field("llm", description="who writes the verifier")
    verifier_fallback: Literal["template", "none"] = Field(
        "template", description="when no LLM verifier passes its self-test: the template, or give up")
    verifier_attempts: int = Field(3, ge=1, description="LLM verifier sources tried")
    code_cpu_seconds: float = Field(10.0, gt=0, description="sandbox CPU limit per self-test case")
    code_wall_seconds: float = Field(20.0, gt=0, description="sandbox wall-clock limit per self-test case")
    code_memory_mb: int = Field(1024, ge=1, description="sandbox memory limit per self-test case")
    sandbox: Literal["auto", "process", "docker"] = Field("auto", description="where self-tests run")
