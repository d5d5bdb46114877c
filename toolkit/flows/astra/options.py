"""ASTRA strategies' options (recipe keys and their defaults; see toolkit.options)."""

from __future__ import annotations

from typing import Optional

from toolkit.options import StrategyOptions


class PlanOptions(StrategyOptions):
    """gen-plan --strategy astra."""

    chain_pairs: int = 8
    walks: int = 24
    walk_min_len: int = 2
    walk_max_len: int = 4
    acyclic: bool = True
    max_candidates: Optional[int] = None  # default 2 x n
    strict_outputs: bool = False
    min_tools: int = 3
    min_description_words: int = 3


class TasksOptions(StrategyOptions):
    """gen-task --strategy astra."""

    augment: Optional[list[str]] = None  # default: every axis


class QAOptions(StrategyOptions):
    """gen-task --strategy astra-qa (a record's extra overrides these)."""

    domain: Optional[str] = None
    corpus: Optional[str] = None
    min_hops: Optional[int] = None
    max_hops: Optional[int] = None


class ValidateOptions(StrategyOptions):
    """validate-task --strategy astra (min_qs and theta_* are also validate-task flags)."""

    min_qs: float = 1.0
    theta_qq: float = 3
    theta_sr: float = 3
    theta_tn: float = 3


class EnvSynthOptions(StrategyOptions):
    """make-verifier --strategy astra."""

    impl_attempts: int = 3
    merge_attempts: int = 2
    merge: bool = True
    sandbox_wall_seconds: float = 5
    sandbox_cpu_seconds: float = 5
    sandbox_memory_mb: int = 512
    out_dir: Optional[str] = None  # also a make-verifier flag (--out-dir)
