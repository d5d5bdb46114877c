"""verify's core types: the scorer registry decorator, the resolved Options, what a scorer gets
(Scoring) and returns (Outcome), and the JSON helpers its results go through."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit import registry
from toolkit.io import UsageError
from toolkit.options import VerifyOptions, as_list, typed_options
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
NOT_REPLAYABLE = ("simulated",)
DETERMINISTIC = ("sqlite", "tau2")  # backends whose replays are memoized (python envs run user code)


# ----------------------------------------------------------------------------------------------
# options


def _as_list(v: Any) -> list[str]:
    return as_list(v) or []


@dataclass
class Options:
    """verify's resolved options: built from the typed `VerifyOptions` (toolkit.options), where
    every default lives."""

    strategies: list[str]
    required: list[str]
    filter: str
    lambda_err: float
    epsilon: float
    diff_exclude: list[str]
    sandbox: str
    code_cpu_seconds: float
    code_wall_seconds: float
    code_memory_mb: int
    judge_rubric: str
    judge_attempts: int
    judge_threshold: float
    f1_threshold: float | None
    f1_epsilon: float
    recipe_hash: str | None
    replay_memo: bool
    penalize_invalid_calls: bool
    no_write_basis: bool = True
    grounding_match: str | None = None
    grounding_threshold: float | None = None
    code_reward: str = "binary"
    actions_mode: str = "strict"  # strict | subset (tau2's rule)
    verdict_kinds: dict = field(default_factory=dict)  # strategy -> Verdict.kind (from the registry)

    @classmethod
    def from_options(cls, o: VerifyOptions) -> "Options":
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
        return cls(strategies=strategies, required=required or list(strategies), filter=o.filter,
                   lambda_err=o.lambda_err,
                   epsilon=R.DEFAULT_EPSILON if o.proximity_epsilon is None else o.proximity_epsilon,
                   diff_exclude=list(o.diff_exclude or []), sandbox=o.sandbox,
                   code_cpu_seconds=o.code_cpu_seconds, code_wall_seconds=o.code_wall_seconds,
                   code_memory_mb=o.code_memory_mb, judge_rubric=o.judge_rubric, judge_attempts=o.judge_attempts,
                   judge_threshold=o.judge_threshold, f1_threshold=o.f1_threshold,
                   f1_epsilon=R.DEFAULT_EPSILON if o.f1_epsilon is None else o.f1_epsilon,
                   recipe_hash=o.recipe_hash, replay_memo=o.replay_memo,
                   penalize_invalid_calls=o.penalize_invalid_calls, no_write_basis=o.no_write_basis,
                   grounding_match=o.grounding_match, grounding_threshold=o.grounding_threshold,
                   code_reward=o.code_reward, actions_mode=o.actions_mode)

    @classmethod
    def from_config(cls, cfg: dict | VerifyOptions) -> "Options":
        """From a merged config dict (library callers; keys verify does not read are ignored) or
        the typed options."""
        return cls.from_options(typed_options(VerifyOptions, cfg))


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
    opts: Options
    cfg: dict
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
