"""The scoring engine's core types: the scorer registry decorator, the run's Plan (resolved from the
typed VerifyOptions), what a scorer gets (Scoring) and returns (Outcome), and the JSON helpers its
results go through."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit import registry
from toolkit.io import UsageError
from toolkit.options import VerifyOptions, model_for, typed_options
from toolkit.schema import Record, Trajectory, Verdict
from toolkit.scoring import rewards as R

VERDICT_KINDS = typing.get_args(Verdict.model_fields["kind"].annotation)


def scorer(name: str, *, verdict_kind: str = "rule", help: str = "", llm_role: str | None = None,
           flow: str | None = None) -> Callable:
    """Register `fn(s: Scoring) -> Outcome | Awaitable[Outcome]` as `verify --strategy name`.

    verdict_kind is the Verdict.kind its verdicts carry (one of VERDICT_KINDS); llm_role names
    the LLM role whose client it uses (`s.llm(role)`), built when the run starts."""
    if verdict_kind not in VERDICT_KINDS:
        raise ValueError(f"scorer {name!r}: verdict_kind must be one of {', '.join(VERDICT_KINDS)} "
                         f"(got {verdict_kind!r})")
    return registry.register("scorers", name, help=help, flow=flow, verdict_kind=verdict_kind, llm_role=llm_role)


def scorer_names() -> list[str]:
    return registry.names("scorers")


POLICY_VIOLATION = "POLICY_VIOLATION"


# ----------------------------------------------------------------------------------------------
# the run's plan


@dataclass
class Plan:
    """What a verify run resolves from its typed `VerifyOptions` (toolkit.options, where every
    option and its default lives) and the registry: the strategies run and required, their
    verdict kinds, the epsilons in effect. Never a second copy of an option."""

    strategies: list[str]
    required: list[str]
    verdict_kinds: dict[str, str]
    epsilon: float       # proximity ε (LOGIGEN §4.2): --proximity-epsilon, else rewards.DEFAULT_EPSILON
    f1_epsilon: float    # ASTRA's ε in p = n̂/(c+ε): --f1-epsilon, else rewards.DEFAULT_EPSILON

    @classmethod
    def of(cls, o: VerifyOptions) -> "Plan":
        strategies = list(o.strategy) or ["state_diff"]
        known = scorer_names()
        unknown = [s for s in strategies if s not in known]
        if unknown:
            raise UsageError(f"unknown verify strategy {', '.join(map(repr, unknown))}; "
                             f"choose from {', '.join(known)}")
        required = list(o.require or [])
        missing = [s for s in required if s not in strategies]
        if missing:
            raise UsageError(f"--require {', '.join(missing)}: not among the strategies run "
                             f"({', '.join(strategies)}); add --strategy {missing[0]}")
        rubrics = registry.names("rubrics")
        if "judge" in strategies and o.judge_rubric not in rubrics:
            raise UsageError(f"judge_rubric {o.judge_rubric!r} is unknown; choose from {', '.join(rubrics)}")
        kinds = {s: registry.get("scorers", s).meta.get("verdict_kind") or "rule" for s in strategies}
        return cls(strategies=strategies, required=required or list(strategies), verdict_kinds=kinds,
                   epsilon=R.DEFAULT_EPSILON if o.proximity_epsilon is None else o.proximity_epsilon,
                   f1_epsilon=R.DEFAULT_EPSILON if o.f1_epsilon is None else o.f1_epsilon)


def verify_options(src: Any = None) -> VerifyOptions:
    """verify's typed options from itself, another options model or, for library callers, a
    mapping of its keys (keys verify does not read are ignored; role-prefixed LLM keys such as
    judge_model are kept)."""
    return typed_options(model_for("verify"), src or {})


# ----------------------------------------------------------------------------------------------
# strategy results


@dataclass
class Outcome:
    passed: bool
    score: float
    scores: dict = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    attribution: str | None = None
    usage: dict | None = None  # LLM usage of the scorer ({prompt_tokens, completion_tokens, cost})


@dataclass
class Scoring:
    """What a scorer gets for one trajectory."""

    record: Record
    traj: Trajectory
    calls: list  # [Call]: the trajectory's tool calls in execution order
    env: Any  # replay.EnvContext: replay / target state of record.env (shared by the record's trajectories)
    opts: VerifyOptions  # the run's typed options (toolkit.options; a flow's scorer reads its keys here)
    plan: Plan
    llm: Callable[[str], Any]  # role -> LLM client (built once per run)


# ----------------------------------------------------------------------------------------------
# JSON helpers


def _canon_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _is_plain_json(x: Any, depth: int = 0) -> bool:
    """Already JSON data (str/int/finite float/bool/None, lists, str-keyed dicts)?"""
    t = type(x)
    if t is str or t is int or t is bool or x is None:
        return True
    if t is float:
        return x == x and x not in (float("inf"), float("-inf"))
    if depth > 20:
        return False
    if t is list:
        return all(_is_plain_json(v, depth + 1) for v in x)
    if t is dict:
        return all(type(k) is str and _is_plain_json(v, depth + 1) for k, v in x.items())
    return False


def _jsonable(x: Any) -> Any:
    if _is_plain_json(x):
        return x
    return json.loads(json.dumps(x, ensure_ascii=False, default=str))


def _short_repr(x: Any, n: int = 200) -> str:
    s = repr(x)
    return s if len(s) <= n else s[:n] + "..."
