"""Replaying a reference path on a state, and a state's canonical snapshot, in a scratch
environment reused per thread and (domain, config): `reset(state)` instead of a new SQLite
connection for every replay (its prepared statements stay cached)."""

from __future__ import annotations

import copy
import threading
from typing import Any

from toolkit.envs.sqlite import SqliteEnvironment

_SCRATCH = threading.local()


def _scratch_env(env_base: Any, state: dict) -> Any:
    """An environment of `env_base`'s domain and config loaded with `state`: one per thread and
    (domain, config), reused (reset(state)) instead of opening a new connection for every
    replay; its prepared statements stay cached. Callers must not rely on its reset() state."""
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


def _as_declared(i: int, a: dict, res: Any) -> dict:
    """The result of reference action `i`, or ValueError when it did not behave as declared (ok, or
    its expect_error)."""
    err = res.error or {}
    want = a.get("expect_error")
    if want and (res.ok or err.get("code") != want):
        raise ValueError(f"action {i} ({a['name']}) should fail with {want}, got "
                         f"{'success' if res.ok else err.get('code')}")
    if not want and not res.ok:
        raise ValueError(f"action {i} ({a['name']}) failed: {err.get('code')}: {err.get('message')}")
    return {"ok": res.ok, "code": err.get("code"), "rule": err.get("violated_rule"), "message": err.get("message")}


def execute(env_base: Any, origin: dict, actions: list[dict]) -> tuple[dict, list[dict]]:
    """Run the reference path on s_origin in a fresh state (a reused scratch environment):
    (s_target, per-call results). Raises ValueError when a call does not behave as declared (ok,
    or its expect_error)."""
    env = _scratch_env(env_base, origin)
    results = []
    for i, a in enumerate(actions):
        res = env.call(a["name"], copy.deepcopy(a["arguments"]))
        results.append(_as_declared(i, a, res))
    return env.snapshot_loadable(), results


def canonical_state(env_base: Any, state: dict) -> dict:
    return _scratch_env(env_base, state).snapshot_loadable()


def _scalars(obj: Any, out: set[str]) -> None:
    if isinstance(obj, dict):
        for v in obj.values():
            _scalars(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _scalars(v, out)
    elif obj is not None and not isinstance(obj, bool):
        out.add(str(obj))


def waterfall(env: Any, table: str, before: dict, after: dict) -> bool:
    """A side effect of a write on `table` that updates an existing row of another table, from the
    rows `before` and `after` it (a table whose rows are unchanged has none, even when two of its
    rows share a key). The one definition: the generator's trace (`run_traced`) and validation's
    replay (labels.analyze_path) both use it."""
    for name, t in env.domain.tables.items():
        if name == table or not t.pk or before.get(name) == after.get(name):
            continue
        old = {tuple(r.get(k) for k in t.pk): r for r in before.get(name, [])}
        for r in after.get(name, []):
            o = old.get(tuple(r.get(k) for k in t.pk))
            if o is not None and o != r:
                return True
    return False


def run_traced(env_base: Any, origin: dict, actions: list[dict]) -> dict:
    """`execute` and `canonical_state` in one run, keeping the execution trace the generator's
    labels are computed from (labels.facts_from_trace; validation replays independently with
    labels.analyze_path): {"origin": the canonical s_origin, "target", "target_bytes" (its
    database, for restore()), "results", "h_origin",
    "h_target" (state hashes), "tables_changed" (tables whose canonical rows differ), "actions"
    (a copy of the path traced), "steps": per action {"write": a write that changed the state,
    "table", "dep": argument values found in an earlier tool result, "waterfall", "alone_fails":
    the write fails or changes nothing when run alone on s_origin (None: not checked)}}. Raises
    ValueError like `execute`."""
    env = _scratch_env(env_base, origin)
    tools = env.domain.tools
    h_origin = env.state_hash()
    canon0 = {t: tc.digest for t, tc in env.canonical().items()}
    # the trace's states share the row dicts of tables a call left alone (rows are never edited)
    origin_c = env.snapshot_shared()
    start = env.checkpoint()
    seen: set[str] = set()
    results, steps = [], []
    writes = 0
    h0 = h_origin
    snap = origin_c  # the current state's rows while known (reads and failed calls keep them)
    for i, a in enumerate(actions):
        td = tools.get(a["name"])
        is_write = td is not None and td.kind in ("insert", "update")
        before = (snap if snap is not None else env.snapshot_shared()) if is_write else None
        res = env.call(a["name"], copy.deepcopy(a["arguments"]))
        if res.ok and (td is None or td.kind != "query"):
            snap = None
        results.append(_as_declared(i, a, res))
        h1 = env.state_hash()
        step: dict = {"write": False}
        if res.ok and h1 != h0 and is_write:
            writes += 1
            args = a.get("arguments") or {}
            step = {"write": True, "table": td.table, "alone_fails": None,
                    "dep": [str(v) for v in args.values() if v is not None and not isinstance(v, bool)
                            and str(v) in seen],
                    "waterfall": waterfall(env, td.table, before, snap := env.snapshot_shared())}
            if writes > 1 and not a.get("expect_error"):
                cp = env.checkpoint()
                env.restore(start)
                h_a = env.state_hash()
                r2 = env.call(a["name"], copy.deepcopy(args))
                step["alone_fails"] = not r2.ok or env.state_hash() == h_a
                env.restore(cp)
        steps.append(step)
        if res.ok:
            _scalars(res.content, seen)
        h0 = h1
    canon1 = {t: tc.digest for t, tc in env.canonical().items()}
    changed = sorted(t for t in set(canon0) | set(canon1) if canon0.get(t) != canon1.get(t))
    return {"origin": origin_c, "target": snap if snap is not None else env.snapshot_shared(),
            "target_bytes": env.checkpoint(), "results": results,
            "h_origin": h_origin, "h_target": h0, "tables_changed": changed, "steps": steps,
            "actions": [{**a, "arguments": copy.copy(a.get("arguments"))} for a in actions]}
