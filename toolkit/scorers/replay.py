"""Replay of a trajectory's calls in the rebuilt environment, the target-state cache and the
replay memo (shared by the run), and the per-record EnvContext scorers get as `Scoring.env`."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from toolkit.envs import backend_capabilities, load_env
from toolkit.io import StageError
from toolkit.options import VerifyOptions
from toolkit.schema import Record, Trajectory
from toolkit.scorers.calls import Call
from toolkit.scorers.core import _canon_json
from toolkit.scoring import rewards as R
from toolkit.scoring.state import StateKeys, legacy_state_hash, state_hash


def _env_hash(env: Any) -> str | None:
    """The backend's own state hash (tau2 uses its DB hash), None when it has none."""
    try:
        return env.state_hash()
    except Exception:
        return None


def _legacy_hash(state: dict) -> str:
    return legacy_state_hash(state)


def _plain_hash(state: dict) -> str:
    return state_hash(state)


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

    def __init__(self, record: Record, opts: VerifyOptions | None = None, cache: TargetCache | None = None):
        self.record = record
        self.opts = opts if opts is not None else VerifyOptions()
        self.diff_exclude = list(self.opts.diff_exclude or [])
        self.cache = cache if cache is not None else TargetCache()
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
            if not backend_capabilities(rec.env.backend).replayable:
                raise StageError(f"env backend {rec.env.backend!r} is not deterministic and cannot be replayed "
                                 "for state_diff; use --strategy judge (or actions/f1)", field="env.backend")
            pooled = self.cache.take_env(self._env_key())
            if pooled is not None:
                self._env = pooled
                return pooled
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
            # an env holding a live process per episode (mcp) is never pooled: closing it ends that process
            if not getattr(env, "poolable", True) or not self.cache.give_env(self._env_key(), env):
                try:
                    env.close()
                except Exception:  # pragma: no cover
                    pass

    def exclude_keys(self) -> tuple[str, ...]:
        """Declared technical columns on top of the environment's own (env config, recipe)."""
        env = self.env()
        keys = list(R.DEFAULT_EXCLUDE_KEYS) + list(getattr(env, "exclude_keys", ()) or ())
        keys += [str(k) for k in ((self.record.env.config or {}).get("exclude_keys") or [])]
        keys += self.diff_exclude
        return tuple(dict.fromkeys(keys))

    def state_keys(self) -> Any:
        """The StateKeys DIFF uses: the environment's (technical keys decided from its schema)
        plus `diff_exclude` from the recipe; the same object as the env's when nothing is added
        (then the env's cached canonical form can be compared directly)."""
        env = self.env()
        base = env.state_keys() if hasattr(env, "state_keys") else None
        extra = [k for k in self.exclude_keys() if base is None or k not in base.exclude]
        if base is None:
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
            blob = "\n".join([self._env_key(), gt_part, _canon_json(self.diff_exclude)])
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
        deterministic backends (sqlite, tau2: BackendCapabilities.deterministic), so a trajectory whose calls equal an earlier one's (a
        GRPO group's duplicates, a re-verified file) is not executed again."""
        info = self.target() if with_target else None
        backend = self.record.env.backend if self.record.env is not None else None
        mkey = (self._memo_key(calls) if (info is not None and not need_final and self.opts.replay_memo
                                          and backend_capabilities(backend).deterministic) else None)
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
