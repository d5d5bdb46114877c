"""The sqlite environment at run time: `SqliteEnvironment` (one in-memory database per episode,
tool calls validated and run in a SAVEPOINT, structured errors, snapshots, incremental canonical
state and its hash), `compile_domain` (build + the seeded state's hash) and the compiled-domain
cache behind `compiled_from_path`."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
import hashlib
import json
import math
import re
import sqlite3
import sys
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from toolkit import diskcache
from toolkit.envs.base import Environment, ToolResult
from toolkit.envs.sqlite.compiler import _load_state_bytes, _remember_state_bytes, build_domain
from toolkit.envs.sqlite.domain import (
    SPEC_FILES,
    CompiledDomain,
    DomainError,
    DomainSpec,
    Table,
    ToolDef,
    TriggerInfo,
    load_domain_spec,
    spec_from_dict,
)
from toolkit.envs.sqlite.errors import tool_error
from toolkit.envs.sqlite.registered import domain_path
from toolkit.envs.sqlite.guard import _DENIED_FUNCTIONS, _DENY, _MAX_VALUE_BYTES, SqlBudget, _harden, max_pages
from toolkit.envs.sqlite.sqltext import _short, qident
from toolkit.envs.sqlite.tools import _ArgError, _insert_required, check_keys, check_value, query_sql
from toolkit.sandbox.limits import limits_for_data, operator_limits
from toolkit.scoring.state import CanonicalState, StateKeys, TableCanon, hash_tables, state_hash
from toolkit.scoring.state import diff as _state_diff

_CANON_CACHE_SIZE = 4096  # table contents whose canonical keys are kept (per domain)
_SAVEPOINT = "tk_tool_call"


_CP_CANON_SIZE = 64  # canonical forms kept per environment for checkpoints/loaded bytes
_SHARED_ROWS_SIZE = 256  # table contents kept as row dicts per environment (snapshot_shared)
_HASH_MEMO_SIZE = 4096  # state hashes kept per environment, by the tables' content ids
_CAP_WANTED = object()  # a write interrupted to put the size cap in place (`_write`)
_CAP_AFTER_WRITES = 8  # the size cap is back in place before the 8th write after a load ...
_UNCAPPED_SECONDS = 0.002  # ... or once a write has taken this much CPU

class SqliteEnvironment(Environment):
    """One in-memory SQLite database compiled from a domain; see the package docstring (toolkit.envs.sqlite)."""

    backend = "sqlite"

    def __init__(self, domain: CompiledDomain, state: dict | None = None, config: dict | None = None):
        self.domain = domain
        self.config = dict(config or {})
        extra = [str(k) for k in (self.config.get("exclude_keys") or [])]
        self.exclude_keys: tuple[str, ...] = tuple(dict.fromkeys(list(domain.exclude_keys) + extra))
        dkeys = domain.keys if domain.keys is not None else StateKeys(domain.exclude_keys)
        self.keys: StateKeys = dkeys.with_exclude(extra) if extra else dkeys
        self._keys_sig = json.dumps(self.keys.to_json(), sort_keys=True)
        # row keys by (table, row, references) under self.keys, shared by the domain's environments
        # (dict.setdefault is atomic: no lock, a constructor may run under the domain's lock)
        self._row_memo: dict = domain.row_memos.setdefault(self._keys_sig, {})
        self._deps = {t: self._dep_tables(t) for t in domain.tables}
        self._canon_key: Any = None
        self._canon_val: dict[str, TableCanon] = {}
        self._raw: dict[str, tuple] = {}  # table -> rows (as fetched) behind _canon_val
        self._raw_id: dict[str, int] = {}  # table -> content id of those rows (domain-wide)
        self._dirty: set[str] | None = None  # tables to re-read (None: all)
        self._tracked = -1  # total_changes after the last tracked call / canonical()
        self._at_init = False  # the state is the untouched reset() state
        self._init_canon: tuple[dict, dict, dict] | None = None  # (raw, canonical) of the reset() state
        self._loaded: tuple[bytes, int] | None = None  # (bytes loaded, total_changes then) while untouched
        self._cp_canon: OrderedDict[int, tuple[bytes, tuple[dict, dict, dict]]] = OrderedDict()
        self._shared_rows: OrderedDict[tuple[str, int], list[dict]] = OrderedDict()  # snapshot_shared
        self._hash_memo: dict[tuple[int, ...], str] = {}  # state_hash by content ids
        self._hidden_extra = [str(x) for x in (self.config.get("hide") or [])]
        self._visible_memo: dict[tuple[str, str], bool] = {}  # (tool, side) -> visible (config is fixed)
        self._initial_state = copy.deepcopy(state) if state is not None else None
        self._init_hash: str | None = None
        # the operator's limits (a record's config.limits may only narrow them): every tool call's
        # SQL, the triggers it fires included, gets wall_seconds; the database at most db_size_mb
        self.limits, self.limit_notes = limits_for_data(self.config.get("limits"), "sqlite")
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False,
                                     cached_statements=512)
        self._lock = threading.RLock()
        self._init_bytes = _load_state_bytes(domain, state) if state is not None else domain.pristine
        self._conn.execute("PRAGMA foreign_keys = ON")  # a connection flag: survives deserialize
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        _harden(self._conn)  # no extensions, no attached databases (trigger bodies are LLM-written)
        self._budget = SqlBudget(self._conn)
        self._loading = False
        self._conn.set_authorizer(self._authorize)
        self._load(self._init_bytes)
        self._snap_sql = {t.name: f"SELECT * FROM {qident(t.name)} ORDER BY "
                          + (", ".join(qident(k) for k in t.pk) if t.pk else "rowid")
                          for t in domain.tables.values()}

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_ref(cls, ref: dict) -> SqliteEnvironment:
        if hasattr(ref, "model_dump"):
            ref = ref.model_dump(exclude_none=True)
        ref = dict(ref or {})
        if ref.get("path"):
            dom = compiled_from_path(ref["path"])
        elif ref.get("id"):
            try:
                dom = compiled_from_path(domain_path(str(ref["id"])))
            except KeyError as e:
                raise DomainError(str(e.args[0] if e.args else e)) from None
        else:
            raise DomainError("a sqlite env ref needs `id` (bundled domain) or `path` (directory or JSON/YAML file)")
        return cls(dom, state=ref.get("state"), config=ref.get("config") or {})

    @classmethod
    def from_path(cls, path: str | Path, state: dict | None = None, config: dict | None = None) -> SqliteEnvironment:
        return cls(compiled_from_path(path), state=state, config=config)

    @classmethod
    def from_spec(cls, spec: dict | DomainSpec, state: dict | None = None,
                  config: dict | None = None) -> SqliteEnvironment:
        """Compile an in-memory spec (e.g. an Architect draft) without writing files."""
        if isinstance(spec, dict):
            spec = spec_from_dict(spec)
        return cls(compile_domain(spec), state=state, config=config)

    # -- protocol -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.domain.spec.name

    @property
    def tables(self) -> dict[str, Table]:
        return self.domain.tables

    @property
    def triggers(self) -> list[TriggerInfo]:
        return self.domain.triggers

    @property
    def rules(self) -> dict[str, dict]:
        """{rule: {rule, message, triggers, tables, hint}} for every POLICY_VIOLATION rule."""
        return self.domain.rules

    def _visible(self, td: ToolDef, side: str) -> bool:
        k = (td.name, side)
        hit = self._visible_memo.get(k)
        if hit is None:
            hit = not (td.hidden or any(fnmatch.fnmatchcase(td.name, p) for p in self._hidden_extra)) and (
                td.side == "both" or td.side == side)
            self._visible_memo[k] = hit
        return hit

    def tools(self, side: str = "agent") -> list[dict]:
        return [copy.deepcopy(td.schema) for td in self.domain.tools.values() if self._visible(td, side)]

    def tool_names(self, side: str = "agent") -> list[str]:
        return [td.name for td in self.domain.tools.values() if self._visible(td, side)]

    def policy(self) -> str:
        return self.domain.spec.policy

    def write_tools(self) -> set[str]:
        """The insert_/update_ tools (hidden ones included: a call of one is still a write)."""
        return {n for n, td in self.domain.tools.items() if td.kind != "query"}

    def _authorize(self, action: int, _a1: Any, a2: Any, *_: Any) -> int:
        # runs when a statement is prepared (cached statements are not re-authorized); a trigger
        # body (LLM-written) is authorized with the statement that fires it
        if self._loading:
            return sqlite3.SQLITE_OK
        if action in _DENY:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and a2 is not None and a2.lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _load(self, data: bytes) -> None:
        # deserialize runs an internal ATTACH that the authorizer would refuse; a flag lets it
        # through (toggling set_authorizer instead expires every prepared statement: ~20x slower)
        self._loading = True
        try:
            self._conn.deserialize(data)
            # load the schema now: a write that fails and rolls back as the first statement after
            # deserialize otherwise leaves the connection without a schema ("no such table")
            self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            self._loading = False
            self._gen = getattr(self, "_gen", 0) + 1  # invalidates the cached state hash
        # deserialize drops the size cap (PRAGMA max_page_count is per pager); `_write` puts it back
        # (the PRAGMA costs a schema parse, ~25x a tool call: not on every load)
        self._capped = False
        self._writes = 0  # writes since this load
        ps = int.from_bytes(data[16:18], "big") if len(data) >= 100 else 4096  # from the file header
        self._page_size = 65536 if ps == 1 else (ps or 4096)
        self._at_init = data is self._init_bytes
        self._loaded = (data, self._conn.total_changes)
        hit = self._init_canon if self._at_init else None
        if hit is None and not self._at_init:
            c = self._cp_canon.get(id(data))
            if c is not None and c[0] is data:
                hit = c[1]
                self._cp_canon.move_to_end(id(data))
        if hit is not None:
            self._raw, self._canon_val = dict(hit[0]), dict(hit[1])
            self._raw_id = dict(hit[2])
            self._dirty = set()
            self._tracked = self._conn.total_changes
            self._canon_key = (self._gen, self._conn.total_changes)
        else:
            self._dirty = None

    def reset(self, state: dict | None = None) -> None:
        with self._lock:
            if state is None:
                self._load(self._init_bytes)
            else:
                self._load(_load_state_bytes(self.domain, state))

    def checkpoint(self) -> bytes:
        """The current state as bytes (SQLite serialize): `restore(cp)` returns to it exactly,
        much cheaper than snapshot() + reset(state) (a search that probes many calls uses it)."""
        with self._lock:
            ld = self._loaded
            # untouched since a load: the loaded bytes are this state (no serialize; restoring
            # them later is then a no-op while nothing is written)
            data = ld[0] if ld is not None and ld[1] == self._conn.total_changes else self._conn.serialize()
            # a checkpoint of a state whose canonical form is known: restore(cp) reuses it
            if self._canon_key == (self._gen, self._conn.total_changes):
                self._remember_canon(data, (dict(self._raw), dict(self._canon_val), dict(self._raw_id)))
            return data

    def _remember_canon(self, data: bytes, canon: tuple[dict, dict, dict]) -> None:
        """Keep the canonical form of the loaded/checkpointed bytes `data` (bounded, by identity:
        the entry holds the bytes) so that loading them again re-reads nothing."""
        self._cp_canon[id(data)] = (data, canon)
        self._cp_canon.move_to_end(id(data))
        while len(self._cp_canon) > _CP_CANON_SIZE:
            self._cp_canon.popitem(last=False)

    def restore(self, cp: bytes) -> None:
        """Back to a `checkpoint()` of this environment. A no-op when the environment was loaded
        from these very bytes and nothing was written since (total_changes unchanged): a search
        that returns to its base after every probe mostly finds itself there already."""
        with self._lock:
            ld = self._loaded
            if ld is not None and ld[0] is cp and ld[1] == self._conn.total_changes:
                return
            self._load(cp)

    def initial_state_hash(self) -> str:
        """Hash of the state reset() restores (seed, or the ref's inline state)."""
        if self._initial_state is None and not self.config.get("exclude_keys"):
            return self.domain.initial_hash
        if self._init_hash is None:
            self._init_hash = self.hash_state(self._snapshot_of(self._init_bytes))
        return self._init_hash

    def state_keys(self) -> StateKeys:
        """Technical columns and references decided from the schema (`state_keys_for`)."""
        return self.keys

    def hash_state(self, state: dict) -> str:
        return state_hash(state, self.keys, row_memo=self._row_memo)

    def _dep_tables(self, name: str) -> tuple[str, ...]:
        """`name` and every table its references reach (transitively), in a fixed order."""
        out: list[str] = []
        todo = [name]
        while todo:
            t = todo.pop()
            if t in out:
                continue
            out.append(t)
            todo.extend(r.to_table for r in self.keys.refs.get(t, ()))
        return tuple(out)

    def canonical(self) -> dict[str, TableCanon]:
        """{table: TableCanon} of the current state: the canonical form of `snapshot()` under
        `state_keys()` (toolkit.envs.base, toolkit.scoring.state), without building the snapshot.

        Incremental: after a tool call only the tables it may write (`_write_sets`: its table, the
        tables its triggers write, foreign-key dependents) are re-read, as tuples (in C); a table's
        canonical keys are looked up by content (its rows and those of the tables it references)
        in a per-domain cache, so only contents never seen before are canonicalized in Python; the
        reset() state's canonical form is kept. Any write not made through `call()` (or a tool
        with an unknown write set) makes the next call re-read every table. Memoized until the
        state changes (load generation + total_changes)."""
        with self._lock:
            conn = self._conn
            key = (self._gen, conn.total_changes)
            if key == self._canon_key:
                return self._canon_val
            tables = self.domain.tables
            dirty = self._dirty
            if dirty is None or conn.total_changes != self._tracked:
                dirty = set(tables)
            raw = self._raw
            rid = self._raw_id
            dom = self.domain
            intern = dom.content_ids
            for n in dirty:
                rows = tuple(conn.execute(self._snap_sql[n]).fetchall())
                raw[n] = rows
                # a small integer per distinct table content (hashing the rows once per read)
                with dom.lock:
                    cid = intern.get((n, rows))
                    if cid is None:
                        cid = intern[(n, rows)] = len(intern) + 1 + dom.content_ids_base
                        if len(intern) > _CANON_CACHE_SIZE:
                            dom.content_ids_base += len(intern)
                            intern.clear()
                            intern[(n, rows)] = cid
                rid[n] = cid
            cache = dom.canon_cache
            out = dict(self._canon_val)
            for n in tables:
                deps = self._deps[n]
                if n in out and not any(d in dirty for d in deps):
                    continue
                ck = (self._keys_sig, n, tuple(rid[d] for d in deps))
                with dom.lock:
                    tc = cache.get(ck)
                if tc is None:
                    part = {d: self._rows(tables[d], list(raw[d])) for d in deps}
                    tc = CanonicalState(part, self.keys, self._row_memo).table(n)
                    with dom.lock:
                        cache[ck] = tc
                        while len(cache) > _CANON_CACHE_SIZE:
                            cache.popitem(last=False)
                out[n] = tc
            self._dirty = set()
            self._tracked = conn.total_changes
            self._canon_key, self._canon_val = key, out
            if self._at_init and self._init_canon is None:
                self._init_canon = (dict(raw), dict(out), dict(rid))
            elif (not self._at_init and self._loaded is not None and conn.total_changes == self._loaded[1]
                  and id(self._loaded[0]) not in self._cp_canon):
                self._remember_canon(self._loaded[0], (dict(raw), dict(out), dict(rid)))
            return out

    def table_ids(self) -> dict[str, int]:
        """{table: content id} of the current state: two states of this domain hold the same rows
        in a table exactly when its ids are equal (ids are interned per domain and never reused;
        content seen again after the intern table was emptied gets a new id, so equal ids are
        always equal rows, unequal ids not always different rows)."""
        with self._lock:
            self.canonical()
            return dict(self._raw_id)

    def _snapshot_of(self, data: bytes) -> dict:
        tmp = SqliteEnvironment(self.domain)
        try:
            tmp._load(data)
            return tmp.snapshot()
        finally:
            tmp.close()

    def snapshot(self) -> dict:
        out: dict[str, list[dict]] = {}
        with self._lock:
            # the rows canonical() read (same query) while the state has not changed since
            raw = self._raw if self._canon_key == (self._gen, self._conn.total_changes) else {}
            for t in self.domain.tables.values():
                rows = raw.get(t.name)
                if rows is None:
                    rows = self._conn.execute(self._snap_sql[t.name]).fetchall()
                out[t.name] = self._rows(t, rows)
        return out

    def snapshot_shared(self) -> dict:
        """snapshot(), with row dicts shared with this environment's earlier and later
        snapshot_shared() results of the same table contents: a table whose rows did not change
        is not turned into dicts again (a search that snapshots after every write). Each table's
        list is new; the caller must not edit the row dicts."""
        with self._lock:
            self.canonical()
            raw, rid, cache = self._raw, self._raw_id, self._shared_rows
            out: dict[str, list[dict]] = {}
            for t in self.domain.tables.values():
                k = (t.name, rid[t.name])
                rows = cache.get(k)
                if rows is None:
                    rows = cache[k] = self._rows(t, raw[t.name])
                    if len(cache) > _SHARED_ROWS_SIZE:
                        cache.popitem(last=False)
                else:
                    cache.move_to_end(k)
                out[t.name] = list(rows)
        return out

    def snapshot_loadable(self) -> dict:
        """snapshot(), and a later reset() to that dict (in any environment of this domain) loads
        this state's bytes instead of rebuilding the database from its rows."""
        st = self.snapshot()
        # an untyped column's bytes come back as text in the dict: rebuilding differs, keep it so
        if not any(t.untyped for t in self.domain.tables.values()):
            _remember_state_bytes(self.domain, st, self.checkpoint())
        return st

    def state_hash(self) -> str:
        """Cached until the state changes: every write (triggers included, rolled back or not)
        bumps SQLite's total_changes, and every (re)load bumps the generation."""
        with self._lock:
            key = (getattr(self, "_gen", 0), self._conn.total_changes)
            if key != getattr(self, "_hash_key", None):
                canon = self.canonical()
                # the tables' content ids fix every table's canonical form under this env's keys:
                # a state seen before (a search returns to the same few) is not hashed again
                rid = self._raw_id
                ids = tuple([rid[t] for t in self.domain.tables])
                h = self._hash_memo.get(ids)
                if h is None:
                    h = hash_tables({t: tc.digest for t, tc in sorted(canon.items()) if tc.keys})
                    if len(self._hash_memo) >= _HASH_MEMO_SIZE:
                        self._hash_memo.clear()
                    self._hash_memo[ids] = h
                self._hash_val = h
                self._hash_key = key
            return self._hash_val

    def diff(self, a: dict, b: dict | None = None) -> dict:
        """DIFF(a, b) with this domain's technical keys; b defaults to the current state."""
        return _state_diff(a, self.snapshot() if b is None else b, keys=self.keys, row_memo=self._row_memo)

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001, S110 - closing twice or from another thread
            pass

    # -- tool calls -----------------------------------------------------------------------------

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        conn = self._conn
        before = conn.total_changes
        try:
            return self._call_safe(name, args, side)
        finally:
            after = conn.total_changes
            if after != before:  # something was written (maybe rolled back): re-read what it may touch
                self._at_init = False
                self._loaded = None
                if self._tracked == before and self._dirty is not None:
                    ws = self.domain.write_sets.get(name) if isinstance(name, str) else None
                    if ws is None:
                        self._dirty = None
                    else:
                        self._dirty |= ws
                        self._tracked = after
                else:
                    self._dirty = None

    def _call_safe(self, name: str, args: dict, side: str) -> ToolResult:
        try:
            return self._call(name, args, side)
        except _ArgError as e:
            return ToolResult.fail("INVALID_ARGUMENTS", e.message, None, e.hint)
        except (UnicodeError, OverflowError) as e:  # e.g. a lone surrogate in a string
            return ToolResult.fail("INVALID_ARGUMENTS", f"{_short(name)}: {_short(str(e), 200)}", None,
                                   "strings must be valid UTF-8 text")
        except Exception as e:  # noqa: BLE001 - never a traceback to the agent
            return ToolResult.fail("INTERNAL", f"{type(e).__name__}: {_short(str(e), 300)}", None,
                                   "unexpected failure; the state was not changed")

    def _call(self, name: Any, args: Any, side: str) -> ToolResult:
        td = self.domain.tools.get(name) if isinstance(name, str) else None
        if td is None or not self._visible(td, side):
            avail = self.tool_names(side)
            close = difflib.get_close_matches(name, avail, n=3) if isinstance(name, str) and len(name) < 200 else []
            hint = (f"did you mean: {', '.join(close)}?" if close else "available tools: " + ", ".join(avail))
            return ToolResult.fail("UNKNOWN_TOOL", f"no tool named {_short(name)} for side {side!r}", None, hint)
        if args is None:
            args = {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                raise _ArgError("arguments are not valid JSON", "pass a JSON object of named arguments")
        if not isinstance(args, dict):
            raise _ArgError(f"arguments must be an object, got {type(args).__name__}",
                            "pass a JSON object of named arguments")
        table = self.domain.tables[td.table]
        with self._lock:
            self._budget.start(self.limits.wall_seconds)
            try:
                if td.kind == "query":
                    return self._query(table, args)
                if td.kind == "insert":
                    return self._insert(table, args)
                return self._update(table, args)
            finally:
                self._budget.stop()

    # -- query ----------------------------------------------------------------------------------

    def _query(self, t: Table, args: dict) -> ToolResult:
        sql, params, limit, offset = query_sql(t, args)
        try:
            rows = self._conn.execute(sql, (*params, limit + 1, offset)).fetchall()
        except sqlite3.Error as e:
            return self._error(e, t, "query")
        truncated = len(rows) > limit
        out = self._rows(t, rows[:limit])
        return ToolResult.success({"rows": out, "count": len(out), "truncated": truncated})

    # -- writes ---------------------------------------------------------------------------------

    @staticmethod
    def _rows(t: Table, rows: list) -> list[dict]:
        names = t.names
        if t.untyped:  # only untyped/BLOB columns can hold bytes
            return [dict(zip(names, map(_jsonable, r))) for r in rows]
        return [dict(zip(names, r)) for r in rows]

    def _fetch_row(self, t: Table, where: str, params: list) -> dict | None:
        r = self._conn.execute(f"SELECT * FROM {qident(t.name)} WHERE {where}", params).fetchone()
        return None if r is None else self._rows(t, [r])[0]

    def _write(self, t: Table, kind: str, fn) -> ToolResult:
        """Run `fn` (a write and what it returns) in a SAVEPOINT, rolled back on any failure.

        The database size cap (db_size_mb, PRAGMA max_page_count) is dropped by every load and
        put back here: before the `_CAP_AFTER_WRITES`-th write since the load, or as soon as a
        write has taken `_UNCAPPED_SECONDS` of CPU (the budget interrupts it, it is rolled back,
        the cap set and the write run again under the same deadline). A normal write takes
        20-100 µs; replays and searches, which load a state before every few writes, never pay
        the PRAGMA's schema parse."""
        budget = self._budget
        if not self._capped:
            self._writes += 1
            if self._writes >= _CAP_AFTER_WRITES:
                self._cap()
        if self._capped:
            budget.cap_deadline = math.inf
        else:
            budget.cap_wall = time.monotonic() + _UNCAPPED_SECONDS
            budget.cap_deadline = time.thread_time() + _UNCAPPED_SECONDS
        try:
            result = self._write_once(t, kind, fn)
            if result is _CAP_WANTED:
                self._cap()
                budget.cap_deadline = math.inf
                result = self._write_once(t, kind, fn)
        finally:
            budget.cap_deadline = math.inf
        return result

    def _cap(self) -> None:
        self._loading = True  # the runtime authorizer refuses PRAGMAs
        try:
            with self._budget.paused():
                self._conn.execute(f"PRAGMA max_page_count = {max_pages(self.limits.db_size_mb, self._page_size)}")
        finally:
            self._loading = False
        self._capped = True

    def _write_once(self, t: Table, kind: str, fn) -> Any:
        conn = self._conn
        with self._budget.paused():  # the budgets bound the write, never its savepoint or its release
            conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            result = fn()
        except Exception as e:
            with self._budget.paused():  # the rollback must run even when the budget is spent
                self._rollback()
            if self._budget.cap_wanted(e):
                return _CAP_WANTED
            if isinstance(e, sqlite3.Error):
                return self._error(e, t, kind)
            if isinstance(e, (OverflowError, UnicodeError, ValueError)):
                return ToolResult.fail("INVALID_ARGUMENTS", f"{kind}_{t.name}: {_short(str(e), 200)}", None,
                                       "check the argument values")
            raise
        if isinstance(result, ToolResult) and not result.ok:
            with self._budget.paused():
                self._rollback()
            return result
        with self._budget.paused():  # an interrupt here would surface as an INTERNAL error of a done write
            conn.execute(f"RELEASE {_SAVEPOINT}")
        return result

    def _rollback(self) -> None:
        conn = self._conn
        if conn.in_transaction:  # RAISE(ROLLBACK) has already ended it
            try:
                conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
                conn.execute(f"RELEASE {_SAVEPOINT}")
            except sqlite3.Error:
                conn.execute("ROLLBACK")

    def _insert(self, t: Table, args: dict) -> ToolResult:
        tool = f"insert_{t.name}"
        allowed = [c.name for c in t.columns if not c.readonly]
        check_keys(t, args, allowed, tool)
        names: list[str] = []
        vals: list[Any] = []
        for key, v in args.items():
            c = t.colmap[key]
            names.append(c.name)
            vals.append(check_value(c, v, tool, nullable=c.nullable))
        missing = [c.name for c in t.columns if _insert_required(c) and c.name not in args]
        if missing:
            raise _ArgError(f"{tool}: missing required argument(s): {', '.join(missing)}",
                            f"required: {', '.join(missing)}")
        if names:
            sql = (f"INSERT INTO {qident(t.name)} ({', '.join(qident(n) for n in names)}) "
                   f"VALUES ({', '.join('?' * len(names))})")
        else:
            sql = f"INSERT INTO {qident(t.name)} DEFAULT VALUES"

        def run() -> ToolResult:
            cur = self._conn.execute(sql, vals)
            if cur.rowcount == 0:
                return ToolResult.success({"inserted": None, "note": "the write was ignored by a trigger"})
            if t.without_rowid:
                if not all(k in args for k in t.pk):
                    return ToolResult.success({"inserted": None})
                row = self._fetch_row(t, " AND ".join(f"{qident(k)} = ?" for k in t.pk),
                                      [vals[names.index(k)] for k in t.pk])
            else:
                row = self._fetch_row(t, "rowid = ?", [cur.lastrowid])
            return ToolResult.success(row)

        return self._write(t, "insert", run)

    def _update(self, t: Table, args: dict) -> ToolResult:
        tool = f"update_{t.name}"
        allowed = [c.name for c in t.columns if not c.readonly]
        check_keys(t, args, allowed, tool)
        missing = [k for k in t.pk if k not in args]
        if missing:
            raise _ArgError(f"{tool}: missing primary key argument(s): {', '.join(missing)}",
                            f"identify the row with {', '.join(t.pk)}; use query_{t.name} to find it")
        key_vals = [check_value(t.colmap[k], args[k], tool, nullable=False, enforce_enum=False) for k in t.pk]
        sets: list[str] = []
        vals: list[Any] = []
        for key, v in args.items():
            c = t.colmap[key]
            if c.pk:
                continue
            sets.append(f"{qident(c.name)} = ?")
            vals.append(check_value(c, v, tool, nullable=c.nullable))
        if not sets:
            settable = [c.name for c in t.columns if not c.pk and not c.readonly]
            raise _ArgError(f"{tool}: nothing to change", f"pass at least one of: {', '.join(settable)}")
        where = " AND ".join(f"{qident(k)} = ?" for k in t.pk)

        def run() -> ToolResult:
            exists = self._conn.execute(f"SELECT 1 FROM {qident(t.name)} WHERE {where}", key_vals).fetchone()
            if exists is None:
                keys = ", ".join(f"{k}={_short(v, 60) if isinstance(v, str) else v!r}" for k, v in zip(t.pk, key_vals))
                return ToolResult.fail("NOT_FOUND", f"{tool}: no {t.name} row with {keys}", None,
                                       f"use query_{t.name} to find existing rows")
            self._conn.execute(f"UPDATE {qident(t.name)} SET {', '.join(sets)} WHERE {where}", (*vals, *key_vals))
            return ToolResult.success(self._fetch_row(t, where, key_vals))

        return self._write(t, "update", run)

    # -- error translation ----------------------------------------------------------------------

    def _error(self, e: sqlite3.Error, t: Table, kind: str) -> ToolResult:
        return tool_error(e, t, kind, self.domain, timed_out=self._budget.interrupted(e), limits=self.limits)

    def evaluate_sql(self, select_sql: str, params: Any = ()) -> tuple | None:
        """Run one read-only SELECT (e.g. a trigger condition bound to NEW/OLD values, see
        toolkit.flows.logigen.analysis.evaluate) on the current state; returns the first row."""
        if not re.match(r"\s*SELECT\b", select_sql, re.IGNORECASE):
            raise ValueError("evaluate_sql runs a single SELECT")
        with self._lock:
            self._budget.start(self.limits.wall_seconds)  # an LLM-written condition: bounded too
            try:
                return self._conn.execute(select_sql, params).fetchone()
            finally:
                self._budget.stop()

    def schema_sql(self) -> str:
        """The current schema (tables, indexes, triggers) as stored in sqlite_master."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        return "\n".join(f"{r[0]} {r[1]} {r[2]}: {r[3]}" for r in rows)


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        import base64

        return "base64:" + base64.b64encode(v).decode("ascii")
    return v


def compile_domain(spec: DomainSpec) -> CompiledDomain:
    """Compile a domain (`build_domain`: execute the DDL, introspect tables and triggers, load the
    seed, generate the tools), then read the seeded state once through the environment to record
    its hash.

    Raises DomainError with a readable message when anything does not compile (this is LOGIGEN's
    "physical executability" check for an Architect-generated schema).
    """
    dom = build_domain(spec)
    env = SqliteEnvironment(dom)
    try:
        dom.initial_hash = env.state_hash()
    except sqlite3.Error as e:
        raise DomainError(f"{spec.name}: the seeded state cannot be read: {e}") from None
    finally:
        env.close()
    return dom


# compiled-domain cache: (resolved source, file stamps) -> CompiledDomain
_DOMAIN_CACHE: dict[tuple, CompiledDomain] = {}
_DOMAIN_LOCK = threading.Lock()


def _stamp(p: Path) -> tuple:
    files = sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]
    return tuple((x.name, x.stat().st_mtime_ns, x.stat().st_size) for x in files)


# ... and on disk, between processes ($TOOLKIT_HOME/sqlite-domains/, toolkit.diskcache): a fresh
# command skips the yaml parse, the DDL and the seed load (~0.1 CPU-s of a `gen-task -n 1`)
DISK_CACHE_ENV, DISK_MAGIC, DISK_SUBDIR, DISK_MAX_ENTRIES = "TOOLKIT_SQLITE_DOMAIN_CACHE", b"TKSQLDOMAIN1\n", "sqlite-domains", 128
DISK_STATS: Counter = Counter()  # hit | miss | corrupt | stored | store_failed | pruned (this process)
_CODE_DIRS = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent.parent / "scoring")


def _disk_key(p: Path) -> str:
    """sha256 of the compiler's source (toolkit/envs/sqlite, toolkit/scoring), Python's version,
    the operator's limits (the compile checks the seed against db_size_mb), the domain's path and
    the name and bytes of each file the spec is read from (SPEC_FILES: not tasks.jsonl or notes)."""
    lim = json.dumps(dataclasses.asdict(operator_limits()), sort_keys=True, default=repr)
    h = hashlib.sha256(f"{diskcache.source_digest(_CODE_DIRS)}\0{sys.version}\0{lim}\0{p}\0".encode())
    for f in ([p / n for n in SPEC_FILES if (p / n).is_file()] if p.is_dir() else [p]):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _compiled_on_disk(p: Path) -> CompiledDomain:
    if not diskcache.enabled(DISK_CACHE_ENV):
        return compile_domain(load_domain_spec(p))
    key = _disk_key(p)
    path = diskcache.path_of(DISK_SUBDIR, key)
    dom = diskcache.read(path, key, DISK_MAGIC, DISK_STATS, "sqlite domain cache", expect=CompiledDomain)
    if dom is None:
        dom = compile_domain(load_domain_spec(p))
        diskcache.write(path, key, dom, DISK_MAGIC, DISK_STATS, "sqlite domain cache", DISK_MAX_ENTRIES)
    return dom


def compiled_from_path(path: str | Path) -> CompiledDomain:
    p = Path(path).resolve()
    if not p.exists():
        raise DomainError(f"domain path not found: {path}")
    key = (str(p), _stamp(p))
    with _DOMAIN_LOCK:
        dom = _DOMAIN_CACHE.get(key)
    if dom is None:
        dom = _compiled_on_disk(p)
        with _DOMAIN_LOCK:
            for k in [k for k in _DOMAIN_CACHE if k[0] == key[0]]:
                del _DOMAIN_CACHE[k]
            _DOMAIN_CACHE[key] = dom
    return dom
