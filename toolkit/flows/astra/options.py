"""ASTRA strategies' options (recipe keys, their defaults and help; see toolkit.options)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from toolkit.options import StrategyOptions

Axis = Literal["diversity", "complexity", "persona"]  # the augmentation axes (toolkit.flows.astra.tasks.AXES)


class PlanOptions(StrategyOptions):
    """gen-plan --strategy astra."""

    n: int = Field(5, ge=1, description="plans (verified chains) per server")
    seed: int = Field(0, description="seeds the random walks")
    chain_pairs: int = Field(8, ge=1, description="(task, chain) pairs the LLM writes per server")
    walks: int = Field(24, ge=1, description="random walks sampled on the chain graph")
    walk_min_len: int = Field(2, ge=1, description="shortest walk (tool calls)")
    walk_max_len: int = Field(4, ge=1, description="longest walk (tool calls)")
    acyclic: bool = Field(True, description="walks never revisit a tool")
    max_candidates: Optional[int] = Field(None, ge=1, description="walks tried per server (unset: 2 x n)")
    strict_outputs: bool = Field(False, description="an output reference the docs cannot confirm fails the chain")
    min_tools: int = Field(3, ge=1, description="a server with fewer usable tools is dropped")
    min_description_words: int = Field(3, ge=0, description="a tool with a shorter description is dropped")


class TasksOptions(StrategyOptions):
    """gen-task --strategy astra."""

    n: int = Field(3, ge=1, description="server-only tasks per server record")
    augment: list[Axis] = Field(["diversity", "complexity", "persona"],
                                description="augmentation axes: one augmented child per task and axis")


class QAOptions(StrategyOptions):
    """gen-task --strategy astra-qa (a record's `extra` overrides domain / corpus / min_hops / max_hops)."""

    n: int = Field(1, ge=1, description="samples (instances asked for) per record")
    domain: str = Field("general", description="the knowledge domain")
    corpus: str = Field("", description="source text the instances are grounded in (empty: synthesized data)")
    min_hops: int = Field(1, description="fewest hops of an instance")
    max_hops: int = Field(4, description="most hops of an instance")


class ValidateOptions(StrategyOptions):
    """validate-task --strategy astra (min_qs and theta_* are also validate-task flags)."""

    min_qs: float = Field(1.0, description="QA tasks pass iff QS >= min_qs")
    theta_qq: float = Field(3, description="tasks pass iff S_qq >= theta_qq (1-5 scale)")
    theta_sr: float = Field(3, description="... and S_sr >= theta_sr")
    theta_tn: float = Field(3, description="... and S_tn >= theta_tn")


class EnvSynthOptions(StrategyOptions):
    """make-verifier --strategy astra."""

    seed: int = Field(0, description="seeds the merge base choice")
    impl_attempts: int = Field(3, ge=1, description="invocation + implementation tries per tool node")
    merge_attempts: int = Field(2, ge=1, description="tries per insertion when merging homogeneous tools")
    merge: bool = Field(True, description="merge homogeneous sub-questions' tools (B4)")
    sandbox_wall_seconds: float = Field(5, gt=0, description="sandbox wall-clock limit per check")
    sandbox_cpu_seconds: float = Field(5, gt=0, description="sandbox CPU limit per check")
    sandbox_memory_mb: int = Field(512, ge=1, description="sandbox memory limit per check")
    out_dir: Optional[str] = Field(None, description="write each environment as a python-backend directory "
                                                     "(also a make-verifier flag, --out-dir)")
