"""Replaying a reference path on a state, and a state's canonical snapshot, in a scratch
environment reused per thread and (domain, config): `reset(state)` instead of a new SQLite
connection for every replay (its prepared statements stay cached)."""

from __future__ import annotations

import copy
import threading
from typing import Any

_SCRATCH = threading.local()


def _scratch_env(env_base: Any, state: dict) -> Any:
    """An environment of `env_base`'s domain and config loaded with `state`: one per thread and
    (domain, config), reused (reset(state)) instead of opening a new connection for every
    replay; its prepared statements stay cached. Callers must not rely on its reset() state."""
    from toolkit.envs.sqlite import SqliteEnvironment

    pool = getattr(_SCRATCH, "pool", None)
    if pool is None:
        pool = _SCRATCH.pool = {}
    key = (id(env_base.domain), repr(sorted((env_base.config or {}).items(), key=lambda kv: str(kv[0]))))
    hit = pool.get(key)
    if hit is None or hit[0] is not env_base.domain:
        if len(pool) > 8:
            for _, e in pool.values():
                e.close()
            pool.clear()
        hit = pool[key] = (env_base.domain, SqliteEnvironment(env_base.domain, config=env_base.config))
    env = hit[1]
    env.reset(state)
    return env


def execute(env_base: Any, origin: dict, actions: list[dict]) -> tuple[dict, list[dict]]:
    """Run the reference path on s_origin in a fresh state (a reused scratch environment):
    (s_target, per-call results). Raises ValueError when a call does not behave as declared (ok,
    or its expect_error)."""
    env = _scratch_env(env_base, origin)
    results = []
    for i, a in enumerate(actions):
        res = env.call(a["name"], copy.deepcopy(a["arguments"]))
        err = res.error or {}
        want = a.get("expect_error")
        if want and (res.ok or err.get("code") != want):
            raise ValueError(f"action {i} ({a['name']}) should fail with {want}, got "
                             f"{'success' if res.ok else err.get('code')}")
        if not want and not res.ok:
            raise ValueError(f"action {i} ({a['name']}) failed: {err.get('code')}: {err.get('message')}")
        results.append({"ok": res.ok, "code": err.get("code"), "rule": err.get("violated_rule"),
                        "message": err.get("message")})
    return env.snapshot_loadable(), results


def canonical_state(env_base: Any, state: dict) -> dict:
    return _scratch_env(env_base, state).snapshot_loadable()
