"""EigenData / AReaL-SEA strategies' options (recipe keys and their defaults; see toolkit.options)."""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from toolkit.options import StrategyOptions


class GenPlanOptions(StrategyOptions):
    llm_roles: ClassVar[tuple[str, ...]] = ("planner",)


class GenTaskOptions(StrategyOptions):
    llm_roles: ClassVar[tuple[str, ...]] = ("generator",)


class SeaGenTaskOptions(GenTaskOptions):
    synthesis_max_calls: int = 12
    synthesis_min_calls: int = 1


class ValidateTaskOptions(StrategyOptions):
    """validate-task --strategy eigendata / sea."""

    llm_roles: ClassVar[tuple[str, ...]] = ("validator",)
    validate_mode: Literal["scratch", "readonly"] = "scratch"
    validate_max_calls: int = 12
    validate_min_calls: int = 1


class RepairOptions(StrategyOptions):
    llm_roles: ClassVar[tuple[str, ...]] = ("repair",)


class ReflectOptions(StrategyOptions):
    llm_roles: ClassVar[tuple[str, ...]] = ("reflector",)
    pilot_criteria: Optional[dict[str, float]] = None
    judge_targets: Optional[dict[str, float]] = None  # orchestration Judge axis → minimum batch mean


class MakeVerifierOptions(StrategyOptions):
    """make-verifier --strategy eigendata."""

    llm_roles: ClassVar[tuple[str, ...]] = ("verifier",)
    verifier_source: Literal["llm", "template"] = "llm"
    verifier_fallback: Literal["template", "none"] = "template"
    verifier_attempts: int = Field(3, ge=1)
    code_cpu_seconds: float = 10.0
    code_wall_seconds: float = 20.0
    code_memory_mb: int = 1024
    sandbox: Literal["auto", "process", "docker"] = "auto"
