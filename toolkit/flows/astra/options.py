"""ASTRA strategies' options (recipe keys and their defaults; see toolkit.options)."""

from __future__ import annotations

from typing import Any, Optional

from toolkit.options import Options


class PlanOptions(Options):
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


class TasksOptions(Options):
    """gen-task --strategy astra."""

    augment: Optional[list[str]] = None  # default: every axis


class QAOptions(Options):
    """gen-task --strategy astra-qa (a record's extra overrides these)."""

    domain: Optional[str] = None
    corpus: Optional[str] = None
    min_hops: Optional[int] = None
    max_hops: Optional[int] = None


class ValidateOptions(Options):
    """validate-task --strategy astra (min_qs and theta_* are validate-task flags)."""

    tools: Optional[list[Any]] = None


class EnvSynthOptions(Options):
    """make-verifier --strategy astra."""

    impl_attempts: int = 3
    merge_attempts: int = 2
    merge: bool = True
    sandbox_wall_seconds: float = 5
    sandbox_cpu_seconds: float = 5
    sandbox_memory_mb: int = 512
