"""Canonical state: one canonical form for the state hash and for DIFF (used by every environment
backend to hash its state and by the rewards to compare states; pure, no toolkit imports)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

# ----------------------------------------------------------------------------------------------
# Canonical state: ONE canonical form for the state hash and for DIFF
#
# A state is {table: [row dicts]}. Its canonical form is, per non-empty table, the multiset of
# canonical row keys:
# - cells: booleans are 0/1 (SQLite has no boolean type), floats are rounded to 9 digits and a
#   float that then is integral is that integer (2.0 and 2.0000000001 are 2), NaN/inf are their
#   repr, dicts/lists recursively, bytes "base64:...", anything else str();
# - technical columns (`StateKeys`: rowid aliases / INTEGER PRIMARY KEY / AUTOINCREMENT keys of a
#   sqlite domain, and columns declared technical) are left out of the row, so row identity never
#   depends on creation order;
# - a column that references a technical key (a foreign key, or a reference declared in the
#   domain) is replaced by the referenced row's canonical key {"$ref": table, "row": key} (or
#   {"$ref": table, "missing": value} when that row does not exist; a reference on a cycle — a
#   table reaching itself through references, e.g. a parent_id — is just {"$ref": table});
# - a row key is the row's canonical JSON (sorted keys, compact separators, UTF-8).
# DIFF(a, b) = sum over tables of the multiset symmetric difference of the row keys;
# state_hash = sha256 of the canonical JSON {table: sha256 of its sorted row keys joined by "\n"}.
# So state_hash(a) == state_hash(b) exactly when DIFF(a, b) == 0 (with the same StateKeys).


def canon_value(v: Any) -> Any:
    """A cell in canonical form (see above)."""
    t = type(v)
    if t is str or t is int or v is None:
        return v
    if t is bool:
        return int(v)
    if t is float:
        if math.isnan(v) or math.isinf(v):
            return repr(v)
        r = round(v, 9)
        if r.is_integer():
            return int(r)
        return r
    if isinstance(v, dict):
        return {str(k): canon_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [canon_value(x) for x in v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        import base64

        return "base64:" + base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, int):  # int subclasses (IntEnum ...)
        return int(v)
    if isinstance(v, float):
        return canon_value(float(v))
    return str(v)


_canon_value = canon_value  # backward-compatible name


def canon_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


_row_key = canon_json


@dataclass(frozen=True)
class Ref:
    """`table.column` holds the technical key `to_table.to_column` of another row (when every
    (column, value) of `when` holds on the referencing row)."""

    column: str
    to_table: str
    to_column: str
    when: tuple = ()

    def applies(self, row: dict) -> bool:
        return all(row.get(k) == v for k, v in self.when)


class StateKeys:
    """Which columns are technical (left out of canonical rows) and which columns reference
    technical keys (compared by the referenced row's content). See the comment above.

    exclude:   column names left out in every table (declared technical columns);
    technical: {table: column names} left out of that table (rowid aliases, `table.column` declarations);
    refs:      {table: [Ref]}.
    """

    __slots__ = ("_drop", "cyclic", "exclude", "refs", "technical")

    def __init__(self, exclude: Iterable[str] = (), technical: dict | None = None, refs: dict | None = None):
        self.exclude = frozenset(str(x) for x in exclude)
        self.technical = {str(t): frozenset(c) for t, c in (technical or {}).items() if c}
        self.refs = {str(t): tuple(r) for t, r in (refs or {}).items() if r}
        self._drop: dict[str, frozenset] = {}
        # references on a cycle (a table reaching itself through references, e.g. parent_id) are
        # not resolved (their content would be infinite): they compare as {"$ref": table}
        self.cyclic: frozenset = frozenset(
            (t, r) for t, rs in self.refs.items() for r in rs if self._reaches(r.to_table, t))

    def _reaches(self, start: str, goal: str) -> bool:
        seen: set[str] = set()
        todo = [start]
        while todo:
            t = todo.pop()
            if t == goal:
                return True
            if t in seen:
                continue
            seen.add(t)
            todo.extend(r.to_table for r in self.refs.get(t, ()))
        return False

    def dropped(self, table: str) -> frozenset:
        d = self._drop.get(table)
        if d is None:
            d = self._drop[table] = self.exclude | self.technical.get(table, frozenset())
        return d

    def with_exclude(self, extra: Iterable[str]) -> "StateKeys":
        """A copy with more technical columns: bare names (every table) or `table.column`."""
        ex = set(self.exclude)
        tech = {t: set(c) for t, c in self.technical.items()}
        for k in extra:
            k = str(k)
            if "." in k:
                t, _, c = k.partition(".")
                tech.setdefault(t, set()).add(c)
            else:
                ex.add(k)
        return StateKeys(ex, tech, self.refs)

    def is_plain(self) -> bool:
        """No references: a row's canonical key depends on that row alone."""
        return not self.refs

    def to_json(self) -> dict:
        return {"exclude": sorted(self.exclude),
                "technical": {t: sorted(c) for t, c in sorted(self.technical.items())},
                "refs": {t: [[r.column, r.to_table, r.to_column, [list(w) for w in r.when]] for r in rs]
                         for t, rs in sorted(self.refs.items())}}

    def __repr__(self) -> str:
        return f"StateKeys({self.to_json()})"


def as_keys(keys: "StateKeys | None" = None, exclude_keys: Iterable[str] = ()) -> StateKeys:
    """StateKeys from an optional StateKeys plus extra technical column names."""
    extra = [str(k) for k in (exclude_keys or ())]
    if keys is None:
        return StateKeys().with_exclude(extra)
    return keys.with_exclude(extra) if extra else keys


def _ref_lookup_key(v: Any) -> Any:
    """Referenced values compare across types: 1003, 1003.0 and '1003' are the same key."""
    if isinstance(v, bool):
        return ("n", int(v))
    if isinstance(v, int):
        return ("n", v)
    if isinstance(v, float) and v.is_integer():
        return ("n", int(v))
    if isinstance(v, str):
        s = v.strip()
        if s.lstrip("-").isdigit():
            try:
                return ("n", int(s))
            except ValueError:  # pragma: no cover
                pass
        return ("s", v)
    return ("s", str(v))


def _table_rows(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    return [value]


class TableCanon:
    """The canonical row keys of one table (unsorted, aligned with the rows), with the multiset
    and the digest computed lazily once."""

    __slots__ = ("keys", "_counter", "_digest")

    def __init__(self, keys: list[str]):
        self.keys = keys
        self._counter: Any = None
        self._digest: str | None = None

    @property
    def counter(self) -> Any:
        if self._counter is None:
            from collections import Counter

            self._counter = Counter(self.keys)
        return self._counter

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256("\n".join(sorted(self.keys)).encode("utf-8")).hexdigest()
        return self._digest


class CanonicalState:
    """Canonical form of one state dict, computed table by table on demand (memoized)."""

    def __init__(self, state: dict, keys: StateKeys | None = None, row_memo: dict | None = None):
        self.state = state if isinstance(state, dict) else {}
        self.keys = keys or StateKeys()
        # optional {(table, row items, resolved references): row key}, shared by the caller across
        # states of the same StateKeys (a state that differs in one row re-dumps only that row)
        self._row_memo = row_memo
        self._memo: dict[str, TableCanon] = {}
        self._lookups: dict[tuple, dict] = {}
        self._stack: set[str] = set()

    def tables(self) -> list[str]:
        return sorted(self.state)

    def table(self, name: str) -> TableCanon:
        tc = self._memo.get(name)
        if tc is None:
            tc = self._memo[name] = TableCanon(self._compute(name))
        return tc

    def _lookup(self, ref: Ref) -> dict | None:
        """{lookup key of the referenced column: canonical key of that row}; None on a cycle."""
        k = (ref.to_table, ref.to_column)
        lk = self._lookups.get(k)
        if lk is None:
            if ref.to_table in self._stack:
                return None
            keys = self.table(ref.to_table).keys
            lk = {}
            for r, key in zip(_table_rows(self.state.get(ref.to_table)), keys):
                if isinstance(r, dict) and r.get(ref.to_column) is not None:
                    lk.setdefault(_ref_lookup_key(r[ref.to_column]), key)
            self._lookups[k] = lk
        return lk

    def _compute(self, name: str) -> list[str]:
        rows = _table_rows(self.state.get(name))
        drop = self.keys.dropped(name)
        refs = self.keys.refs.get(name, ())
        self._stack.add(name)
        try:
            out: list[str] = []
            cv = canon_value
            memo = self._row_memo
            for r in rows:
                if not isinstance(r, dict):
                    out.append(canon_json(cv(r)))
                    continue
                repl: dict = {}
                for ref in refs:
                    c = ref.column
                    if c in repl or c in drop or c not in r or not ref.applies(r):
                        continue
                    v = r[c]
                    if v is None:
                        repl[c] = None  # kept as is
                        continue
                    lk = None if (name, ref) in self.keys.cyclic else self._lookup(ref)
                    if lk is None:
                        repl[c] = {"$ref": ref.to_table}
                    else:
                        key = lk.get(_ref_lookup_key(v))
                        repl[c] = ({"$ref": ref.to_table, "row": key} if key is not None
                                   else {"$ref": ref.to_table, "missing": cv(v)})
                mk = None
                if memo is not None:
                    # equal cells have equal canonical values (1 == 1.0 == True -> 1), so equal
                    # items and references give the same row key
                    try:
                        mk = (name, tuple(r.items()),
                              tuple((c, None if x is None else tuple(x.items())) for c, x in repl.items()))
                        hit = memo.get(mk)
                    except TypeError:
                        mk = hit = None
                    if hit is not None:
                        out.append(hit)
                        continue
                obj = {str(k): cv(v) for k, v in r.items() if k not in drop}
                for c, x in repl.items():
                    if x is not None:
                        obj[c] = x
                rk = canon_json(obj)
                if mk is not None:
                    if len(memo) > 200000:
                        memo.clear()
                    memo[mk] = rk
                out.append(rk)
            return out
        finally:
            self._stack.discard(name)


def hash_tables(digests: dict[str, str]) -> str:
    """The state hash from per-table digests (empty tables left out by the caller)."""
    return "sha256:" + hashlib.sha256(canon_json(digests).encode("utf-8")).hexdigest()


def canonicalize(state: dict, keys: StateKeys | None = None) -> dict:
    """{table: sorted canonical row keys} of the non-empty tables."""
    cs = CanonicalState(state, keys)
    out = {}
    for t in cs.tables():
        ks = cs.table(t).keys
        if ks:
            out[t] = sorted(ks)
    return out


def canonical_dump(state: dict, keys: StateKeys | None = None) -> str:
    return canon_json(canonicalize(state, keys))


def state_hash(state: dict, keys: StateKeys | None = None, row_memo: dict | None = None) -> str:
    """sha256 of the canonical form (equal hashes <=> DIFF 0 with the same keys); `row_memo`: see
    CanonicalState."""
    cs = CanonicalState(state, keys, row_memo)
    return hash_tables({t: cs.table(t).digest for t in cs.tables() if cs.table(t).keys})


def _legacy_value(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return repr(v)
        if v.is_integer():
            return int(v)
        return float(repr(round(v, 9)))
    if isinstance(v, dict):
        return {str(k): _legacy_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_legacy_value(x) for x in v]
    return v


def legacy_state_hash(state: dict) -> str:
    """The state hash of toolkit versions before the one canonical form (every column, rows
    sorted by their JSON): accepted for `state_ref` / `target_state_ref` of older records."""
    out: dict = {}
    for table in sorted(state):
        rows = state[table]
        if isinstance(rows, list):
            crow = [_legacy_value(r) for r in rows]
            crow.sort(key=canon_json)
            out[table] = crow
        else:
            out[table] = _legacy_value(rows)
    return "sha256:" + hashlib.sha256(canon_json(out).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------
# DIFF (LOGIGEN): sum over tables of |rows(T,a) symmetric-difference rows(T,b)|

# Only declared technical columns are excluded (a business column named `timestamp` counts).
DEFAULT_EXCLUDE_KEYS: tuple[str, ...] = ()


def diff_canonical(a: "CanonicalState", b: "CanonicalState", tables: Iterable[str] | None = None) -> dict:
    per: dict[str, dict[str, int]] = {}
    total = 0
    names = set(tables) if tables is not None else (set(a.state) | set(b.state))
    for t in sorted(names):
        ta, tb = a.table(t), b.table(t)
        if ta.keys == tb.keys:
            continue
        ca, cb = ta.counter, tb.counter
        only_a = sum((ca - cb).values())
        only_b = sum((cb - ca).values())
        if only_a or only_b:
            per[t] = {"only_a": only_a, "only_b": only_b}
            total += only_a + only_b
    return {"total": total, "tables": per}


def diff(a: dict, b: dict, exclude_keys: Iterable[str] = DEFAULT_EXCLUDE_KEYS,
         tables: Iterable[str] | None = None, keys: StateKeys | None = None, row_memo: dict | None = None) -> dict:
    """Per-table symmetric-difference counts between two states (multiset semantics).

    Returns {"total": int, "tables": {table: {"only_a": n, "only_b": n}}} (tables with 0 omitted).
    """
    k = as_keys(keys, exclude_keys)
    return diff_canonical(CanonicalState(a, k, row_memo), CanonicalState(b, k, row_memo), tables)
