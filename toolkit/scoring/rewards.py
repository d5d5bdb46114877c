"""Pure reward functions (no IO): LOGIGEN state DIFF / binary success / proximity / dense r_t and
TA-GRPO advantages, tau2-style expected-action matching, ASTRA F1.

Everything here works on plain Python data (state dicts `{table: [row dicts]}`, lists of numbers,
tool calls as `(name, arguments dict)`), so training code, the `verify` stage and benchmarks share one
definition of each reward.

LOGIGEN (arXiv 2603.00540, §4.2 "Deterministic and Dense Reward Mechanism")
--------------------------------------------------------------------------
    DIFF(s_a, s_b) = Σ_{T ∈ tables} |rows(T, s_a) △ rows(T, s_b)|
        rows are canonicalized and technical keys (auto-increment ids) are excluded: here the
        canonical form of `toolkit.scoring.state` (one definition for the state hash and DIFF: booleans
        are 0/1, floats rounded to 9 digits and integral results ints), with `StateKeys` naming the
        technical columns (a sqlite domain derives them from its schema: rowid aliases / INTEGER
        PRIMARY KEY / AUTOINCREMENT, plus the columns declared in domain.yaml) and the columns that
        reference them (compared by the referenced row's content, so the same bookings made in
        another order give DIFF 0). Only declared technical columns are excluded: a business column
        named `timestamp` counts. Rows are compared as multisets (a duplicated row counts twice).
        `TargetIndex` indexes a target once and computes exactly the same DIFF much faster (see its
        tiers; bench/verify_bench.py).
    R_final = I[DIFF(s_final, s_target) = 0]
    Δ0 = DIFF(s_origin, s_target)
    P_t = 1 − min(DIFF(s_t, s_target), Δ0) / (Δ0 + ε)                      (proximity, in [0, 1])
    r_t = P_t − P_{t−1}   if the tool call executed (success, or a non-policy error)
        = −λ_err          if the call was rejected as a policy violation (POLICY_VIOLATION), and
                          (toolkit default, `penalize_invalid_calls`) a call to an unknown tool or
                          with invalid arguments (UNKNOWN_TOOL / INVALID_ARGUMENTS): see penalized()
    Edge case Δ0 = 0 (the initial state already equals the target): min(·, 0) = 0, so P_t = 1 for
    every t and r_t = 0 for every executed call (only policy violations are penalized). This is the
    paper's formula taken literally; R_final still reports whether the final state equals the target.

TA-GRPO (§4.3): A_it = A_i + min(r_t, 0), A_i = (R_i − mean R) / std R over the group.

tau2 actions (tau2/data_model/tasks.py `Action.compare_with_tool_call`, evaluator_action.py):
each expected action must match at least one tool call of the trajectory (agent or user side,
any order, extra calls ignored): same name; if `compare_args` is None the compared keys are the
*predicted call's* argument keys (tau2's rule: the call's arguments must equal the expected ones on
those keys, so a call that omits an expected argument still matches); else only `compare_args`.
An empty key set matches. reward = 1 if every expected action matched else 0. This is
`match_actions` (verify's `actions_mode: subset`): a subset test, so extra calls are free, harmful
ones included.

Strict actions (`strict_actions`, verify's default `actions_mode: strict`; docs/scoring.md):
reward 1 iff
- every expected action is matched by a call that *succeeded* (one with `expect_error` by a call
  that failed with that code), arguments compared exactly (`action_matches_exact`: `compare_args`
  when given, else the union of both key sets, so an empty call matches nothing);
- no agent call wrote where the reference does not: every successful agent write is matched by an
  expected write of its own (one each: a repeated write is unexpected);
- no agent write was attempted that the task forbids: on a task whose reference writes nothing
  (a refusal or a read-only request) any write attempt, whatever its result; elsewhere a write the
  environment refused as a POLICY_VIOLATION (unless the reference expects that refusal).
Which tools write comes from the environment when it says (sqlite: the tool kinds; tau2: its
ToolType), else from the name: a tool is a read only when its name starts with a read verb
(`READ_PREFIXES`: query_, get_, list_, search_, find_, check_, lookup, read_, show_), every other
name counts as a write (the conservative side). User-side calls (dual control) are not the
agent's and are not checked for writes.

ASTRA (§3.2.2 "Reward Design", eq. 30-31):
    r = n̂ / n,  p = n̂ / (c + ε),  F1 = 2pr / (p + r)   (F1 = 0 when p + r = 0)
n = required sub-tasks, n̂ = solved sub-tasks, c = tool invocations. Here p is capped at 1 (the
paper's formula is not). Whether a sub-question's answer appears in a text is `contains_answer`:
token / number boundaries after normalization, never a bare substring (see its docstring).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter, ne
from typing import Any, Callable, Iterable, Sequence

from toolkit.scoring.state import (
    DEFAULT_EXCLUDE_KEYS,
    CanonicalState,
    StateKeys,
    TableCanon,
    as_keys,
    canon_json,
    canon_value,
)
from toolkit.scoring.state import diff as base_diff

DEFAULT_EPSILON = 1e-9
POLICY_VIOLATION = "POLICY_VIOLATION"
# names of tools that only read, when the environment does not say which tools write
READ_PREFIXES = ("query_", "get_", "list_", "search_", "find_", "check_", "lookup", "read_", "show_")

# ----------------------------------------------------------------------------------------------
# canonical row keys


def _canon(v: Any) -> Any:
    """Canonical value (the one definition: `toolkit.scoring.state.canon_value`)."""
    return canon_value(v)


def row_key(row: Any, exclude: frozenset | set = frozenset()) -> str:
    """Canonical JSON of a row minus the excluded keys (the identity of a row in DIFF, for tables
    without references; see `toolkit.scoring.state.CanonicalState`)."""
    if isinstance(row, dict):
        row = {str(k): canon_value(v) for k, v in row.items() if k not in exclude}
    else:
        row = canon_value(row)
    return canon_json(row)


def _rows(value: Any) -> list:
    """A table's rows: a list as is; None → []; anything else is one row."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    return [value]


def _table_names(a: dict, b: dict, tables: Iterable[str] | None) -> list[str]:
    return sorted(set(tables) if tables is not None else (set(a) | set(b)))


def state_diff_detail(a: dict, b: dict, exclude_keys: Iterable[str] = DEFAULT_EXCLUDE_KEYS,
                      tables: Iterable[str] | None = None, keys: StateKeys | None = None) -> dict:
    """Reference (straightforward) DIFF: {"total": n, "tables": {t: {"only_a": x, "only_b": y}}}."""
    return base_diff(a, b, exclude_keys, tables, keys)


def state_diff(a: dict, b: dict, exclude_keys: Iterable[str] = DEFAULT_EXCLUDE_KEYS,
               tables: Iterable[str] | None = None, keys: StateKeys | None = None) -> int:
    """LOGIGEN DIFF(s_a, s_b): the total size of the per-table symmetric differences."""
    return state_diff_detail(a, b, exclude_keys, tables, keys)["total"]


# ----------------------------------------------------------------------------------------------
# fast DIFF against a fixed target (precomputed once, reused for every state compared to it)


def _canon_scalar(v: Any) -> Any:
    """Hashable canonical cell value (same equality as `row_key`): floats rounded, nested values
    as canonical JSON (tagged so they never equal a plain string)."""
    t = type(v)
    if t is str or t is int:
        return v
    if t is float:
        return _canon(v)
    if t is dict or t is list or t is tuple:
        return ("__json__", json.dumps(_canon(v), sort_keys=True, separators=(",", ":"),
                                       ensure_ascii=False, default=str))
    if t is bool:
        return int(v)
    return v


class _TableIndex:
    """One target table, indexed for fast comparison with many states' versions of it.

    Tiers, cheapest first (each exact: the result always equals `state_diff`):
    1. one C-level pass over the common length finds the positions whose rows differ; none (and
       the same length) -> 0;
    2. few positions differ (a snapshot taken in a stable order with a few rows updated or
       appended): rows equal at the same position cancel in the multiset difference, so only the
       differing positions and the tails are compared, with canonical keys (target keys cached);
    3. homogeneous tables (every row a dict with the same non-excluded columns, hashable cells):
       a row's identity is the tuple of its column values (`operator.itemgetter`, in C); first
       position by position against the target's tuples (rows whose excluded keys, e.g.
       timestamps, all differ), else set/Counter difference; the rows left over are re-compared
       with canonical keys (0.1+0.2 vs 0.3);
    4. anything else (ragged rows, nested values, non-dict rows): canonical JSON keys.
    Booleans equal 0/1 throughout (SQLite has no boolean type).
    """

    __slots__ = ("rows", "exclude", "cols", "colset", "getter", "fast", "keyset", "counter",
                 "unique", "_json", "_ckeys", "tkeys", "_ccanon", "_shapes")

    def __init__(self, rows: list, exclude: frozenset):
        self.rows = rows
        self.exclude = exclude
        self._json: Counter | None = None
        self._ckeys: dict[int, Any] = {}
        self._ccanon: dict[tuple, tuple] = {}
        self._shapes: dict[tuple, bool] = {}
        self.fast = False
        self.cols: tuple = ()
        self.colset: frozenset | None = None
        self.getter: Any = None
        self.keyset: set | frozenset = frozenset()
        self.counter: Counter = Counter()
        self.tkeys: list = []
        self.unique = True
        if rows and all(isinstance(r, dict) for r in rows):
            cols = frozenset(rows[0]) - exclude
            if all((r.keys() - exclude) == cols for r in rows):
                self._set_cols(cols)
                try:
                    keys = list(map(self.getter, rows))
                    self.counter = Counter(keys)
                except TypeError:  # unhashable cell (list / dict): tiers 1, 2 and 4 only
                    return
                self.tkeys = keys
                self.keyset = set(self.counter)
                self.unique = len(self.keyset) == len(keys)
                self.fast = True

    def _set_cols(self, cols: frozenset) -> None:
        self.colset = cols
        self.cols = tuple(sorted(cols))
        if len(self.cols) == 0:
            self.getter = lambda r: ()
        elif len(self.cols) == 1:
            g = itemgetter(self.cols[0])
            self.getter = lambda r: (g(r),)
        else:
            self.getter = itemgetter(*self.cols)

    def json_counter(self) -> Counter:
        if self._json is None:
            self._json = Counter(row_key(r, self.exclude) for r in self.rows)
        return self._json

    def compare(self, rows: list) -> tuple[int, int]:
        """(#rows only in `rows`, #rows only in the target), multiset semantics."""
        trows = self.rows
        if not rows:
            return 0, len(trows)
        if not trows:
            return len(rows), 0
        n, m = len(rows), len(trows)
        limit = (n + m) // 4  # "few" leftover rows for the positional tiers
        r0, t0 = rows[0], trows[0]
        projected_only = False
        if r0 != t0 and self.fast and isinstance(r0, dict):
            # equal projections but unequal dicts: the excluded keys (timestamps) differ, and
            # probably on every row: compare projections directly (tier 3)
            try:
                projected_only = self.getter(r0) == self.tkeys[0]
            except (KeyError, TypeError):
                pass
        if not projected_only:
            # one C-level pass over the common length: positions whose rows differ; rows equal at
            # the same position cancel, the tails (appended / removed rows) are left over
            k = min(n, m)
            pos = list(compress(range(k), map(ne, rows, trows)))
            if not pos and n == m:
                return 0, 0
            if 2 * len(pos) + abs(n - m) <= limit:
                return self._small([rows[i] for i in pos] + rows[k:], [trows[i] for i in pos] + trows[k:])
        if self.fast:
            res = self._compare_fast(rows, limit)
            if res is not None:
                return res
        cs = Counter(row_key(r, self.exclude) for r in rows)
        ct = self.json_counter()
        return sum((cs - ct).values()), sum((ct - cs).values())

    def _key(self, r: Any) -> Any:
        """Canonical identity of one row: a tuple of canonical cells when the row has the target's
        columns, else tagged canonical JSON (which then equals no target row of another shape)."""
        g = self.getter
        if g is not None and isinstance(r, dict) and r.keys() - self.exclude == self.colset:
            try:
                return tuple(map(_canon_scalar, g(r)))
            except (KeyError, TypeError):  # pragma: no cover - guarded by the column check
                pass
        return ("__row__", row_key(r, self.exclude))

    def _tkey(self, r: Any) -> Any:
        """`_key` of a target row, cached (target rows live as long as the index)."""
        ck = self._ckeys
        k = ck.get(id(r))
        if k is None:
            k = ck[id(r)] = self._key(r)
        return k

    def _small(self, extra: list, missing: list) -> tuple[int, int]:
        """Multiset difference of a few state rows (`extra`) and target rows (`missing`)."""
        if not extra or not missing:
            return len(extra), len(missing)
        rem = [self._tkey(r) for r in missing]
        left = 0
        for r in extra:
            try:
                rem.remove(self._key(r))
            except ValueError:
                left += 1
        return left, len(rem)

    def _small_keys(self, extra: list, missing: list) -> tuple[int, int]:
        """`_small` for rows already projected to exact column tuples (target side: hashable)."""
        if not extra or not missing:
            return len(extra), len(missing)
        cc = self._ccanon
        rem = []
        for k in missing:
            c = cc.get(k)
            if c is None:
                c = cc[k] = tuple(map(_canon_scalar, k))
            rem.append(c)
        left = 0
        for k in extra:
            try:
                rem.remove(tuple(map(_canon_scalar, k)))
            except ValueError:
                left += 1
        return left, len(rem)

    def _shape_ok(self, first: Any) -> bool:
        """The row has exactly the target's non-excluded columns (memoized per key tuple)."""
        if not isinstance(first, dict):
            return False
        ks = tuple(first)
        ok = self._shapes.get(ks)
        if ok is None:
            if len(self._shapes) > 64:
                self._shapes.clear()
            ok = self._shapes[ks] = first.keys() - self.exclude == self.colset
        return ok

    def _compare_fast(self, rows: list, limit: int) -> tuple[int, int] | None:
        first = rows[0]
        ok = self._shapes.get(tuple(first)) if type(first) is dict else None
        if ok is None:
            ok = self._shape_ok(first)
        if not ok:
            return None
        try:
            # every row as wide as the first (and, below, holding every column)
            if len(set(map(len, rows))) != 1:
                return None
            keys = list(map(self.getter, rows))  # KeyError: a row lacks a column
            # projections position by position (same order as the target), tails left over
            tkeys = self.tkeys
            if keys == tkeys:
                return 0, 0
            n, m = len(keys), len(tkeys)
            k = min(n, m)
            pos = list(compress(range(k), map(ne, keys, tkeys)))
            if 2 * len(pos) + abs(n - m) <= limit:
                return self._small_keys([keys[i] for i in pos] + keys[k:], [tkeys[i] for i in pos] + tkeys[k:])
            if self.unique:
                s = set(keys)  # TypeError: unhashable cell
                if len(s) == len(keys):
                    if s == self.keyset:
                        return 0, 0
                    return self._small_keys(list(s - self.keyset), list(self.keyset - s))
            c = Counter(keys)
        except (KeyError, TypeError):
            return None
        if c == self.counter:
            return 0, 0
        extra: list = []
        for k, m in (c - self.counter).items():
            extra.extend([k] * m)
        missing: list = []
        for k, m in (self.counter - c).items():
            missing.extend([k] * m)
        return self._small_keys(extra, missing)


class _RefTableIndex:
    """A target table whose rows reference technical keys: compared by canonical keys (the
    references resolve against the whole state), memoized per state table content."""

    __slots__ = ("canon", "rows", "_memo")

    def __init__(self, canon: TableCanon, rows: list):
        self.canon = canon
        self.rows = rows
        self._memo: dict[int, tuple[TableCanon, tuple[int, int]]] = {}

    def compare_canon(self, tc: TableCanon) -> tuple[int, int]:
        hit = self._memo.get(id(tc))
        if hit is not None and hit[0] is tc:
            return hit[1]
        t = self.canon
        if tc.keys == t.keys or (len(tc.keys) == len(t.keys) and tc.digest == t.digest):
            res = (0, 0)
        else:
            ca, cb = tc.counter, t.counter
            res = (sum((ca - cb).values()), sum((cb - ca).values()))
        if len(self._memo) > 4096:
            self._memo.clear()
        self._memo[id(tc)] = (tc, res)
        return res


class TargetIndex:
    """A target state indexed once, then compared with many states: `DIFF(state, target)`.

    `keys` (StateKeys) names technical columns and references (see toolkit.scoring.state); tables
    without references use the tiered `_TableIndex`, tables with references compare canonical
    keys. `diff_canonical` takes per-table `TableCanon`s (what `SqliteEnvironment.canonical()`
    returns, cached per table content) and skips every table whose digest equals the target's.

    >>> idx = TargetIndex({"t": [{"id": 1, "x": "a"}]})
    >>> idx.diff({"t": [{"id": 1, "x": "b"}]})
    2
    """

    def __init__(self, target: dict, exclude_keys: Iterable[str] = DEFAULT_EXCLUDE_KEYS,
                 tables: Iterable[str] | None = None, keys: StateKeys | None = None):
        self.target = target
        self.keys = as_keys(keys, exclude_keys)
        self.exclude = self.keys.exclude
        self.tables = None if tables is None else frozenset(tables)
        names = self.tables if self.tables is not None else target.keys()
        self.canon = CanonicalState(target, self.keys)
        self._idx: dict[str, Any] = {}
        for t in names:
            rows = _rows(target.get(t))
            if t in self.keys.refs:
                self._idx[t] = _RefTableIndex(self.canon.table(t), rows)
            else:
                self._idx[t] = _TableIndex(rows, self.keys.dropped(t))
        self._has_refs = any(isinstance(ti, _RefTableIndex) for ti in self._idx.values())
        self._memo: dict[tuple, tuple] = {}  # (table, id(TableCanon)) -> (TableCanon, (only_a, only_b))
        self._empty_canon = TableCanon([])

    def target_canon(self, t: str) -> TableCanon:
        return self.canon.table(t)

    def _cmp(self, t: str, ti: Any, rows: list, cs: CanonicalState | None) -> tuple[int, int]:
        if isinstance(ti, _RefTableIndex):
            return ti.compare_canon(cs.table(t))  # type: ignore[union-attr]
        return ti.compare(rows)

    def _names(self, present: Iterable[str]) -> Iterable[str]:
        return self._idx.keys() if self.tables is not None else (self._idx.keys() | set(present))

    def diff_detail(self, state: dict) -> dict:
        """{"total", "tables": {t: {"only_a": rows only in state, "only_b": rows only in target}}}."""
        per: dict[str, dict[str, int]] = {}
        total = 0
        cs = CanonicalState(state, self.keys) if self._has_refs else None
        for t in self._names(state.keys()):
            ti = self._idx.get(t)
            if ti is None:
                a, b = len(_rows(state.get(t))), 0
            else:
                a, b = self._cmp(t, ti, _rows(state.get(t)), cs)
            if a or b:
                per[t] = {"only_a": a, "only_b": b}
                total += a + b
        return {"total": total, "tables": dict(sorted(per.items()))}

    def diff(self, state: dict) -> int:
        return self.diff_detail(state)["total"] if self._has_refs else self._diff_plain(state)

    def _diff_plain(self, state: dict) -> int:
        total = 0
        idx = self._idx
        if self.tables is None:
            for t, rows in state.items():
                if type(rows) is not list:
                    rows = _rows(rows)
                ti = idx.get(t)
                if ti is None:
                    total += len(rows)
                    continue
                a, b = ti.compare(rows)
                total += a + b
            for t, ti in idx.items():
                if t not in state:
                    total += len(ti.rows)
        else:
            for t, ti in idx.items():
                a, b = ti.compare(_rows(state.get(t)))
                total += a + b
        return total

    def diff_canonical_detail(self, canon: dict[str, TableCanon]) -> dict:
        """DIFF against a state given as {table: TableCanon} (canonical keys computed with the
        same StateKeys): a table whose digest equals the target's costs one string compare, and
        the result per table content (TableCanon object, cached by the environment) is memoized."""
        per: dict[str, dict[str, int]] = {}
        total = 0
        names = self._idx.keys() if self.tables is not None else (self._idx.keys() | canon.keys())
        memo = self._memo
        for t in names:
            tc = canon.get(t) or self._empty_canon
            hit = memo.get((t, id(tc)))
            if hit is not None and hit[0] is tc:
                a, b = hit[1]
            else:
                if t not in self._idx:
                    a, b = len(tc.keys), 0
                else:
                    ti = self._idx[t]
                    if isinstance(ti, _RefTableIndex):
                        a, b = ti.compare_canon(tc)
                    else:
                        tt = self.canon.table(t)
                        if len(tc.keys) == len(tt.keys) and tc.digest == tt.digest:
                            a = b = 0
                        else:
                            ca, cb = tc.counter, tt.counter
                            a, b = sum((ca - cb).values()), sum((cb - ca).values())
                if len(memo) > 8192:
                    memo.clear()
                memo[(t, id(tc))] = (tc, (a, b))
            if a or b:
                per[t] = {"only_a": a, "only_b": b}
                total += a + b
        return {"total": total, "tables": dict(sorted(per.items()))}

    def diff_canonical(self, canon: dict[str, TableCanon]) -> int:
        total = 0
        memo = self._memo
        for t, tc in canon.items():
            hit = memo.get((t, id(tc)))
            if hit is None or hit[0] is not tc or (self.tables is not None and t not in self._idx):
                return self.diff_canonical_detail(canon)["total"]
            total += hit[1][0] + hit[1][1]
        if len(canon) != len(self._idx) or (self.tables is None and canon.keys() != self._idx.keys()):
            return self.diff_canonical_detail(canon)["total"]
        return total


# ----------------------------------------------------------------------------------------------
# binary success, proximity, dense rewards


def binary_success(diff_final: int) -> int:
    """R_final = I[DIFF(s_final, s_target) = 0]."""
    return 1 if diff_final == 0 else 0


def proximity(diff_t: int | float, delta0: int | float, epsilon: float = DEFAULT_EPSILON) -> float:
    """P_t = 1 − min(DIFF(s_t, target), Δ0) / (Δ0 + ε). With Δ0 = 0 this is 1 for every state."""
    return 1.0 - min(diff_t, delta0) / (delta0 + epsilon)


PENALIZED_CODES = ("POLICY_VIOLATION",)
INVALID_CALL_CODES = ("UNKNOWN_TOOL", "INVALID_ARGUMENTS")


def penalized(error_code: str | None, penalize_invalid_calls: bool = True) -> bool:
    """Whether a call that returned `error_code` earns r_t = −λ_err: always for POLICY_VIOLATION
    (LOGIGEN §4.2); for UNKNOWN_TOOL / INVALID_ARGUMENTS too unless `penalize_invalid_calls` is off
    (ours: a malformed call is as wasteful as a violating one and must not score like a no-op)."""
    if not error_code:
        return False
    return error_code in PENALIZED_CODES or (penalize_invalid_calls and error_code in INVALID_CALL_CODES)


def dense_rewards(diffs: Sequence[int | float], delta0: int | float, violations: Sequence[bool],
                  lambda_err: float = 0.1, epsilon: float = DEFAULT_EPSILON) -> dict:
    """Per tool call t = 1..T: P_t and r_t from DIFF(s_t, target) and the policy-violation flags.

    `diffs[t-1]` is DIFF after call t (a rejected call leaves the state unchanged, so its DIFF equals
    the previous one). P_0 is the proximity of s_origin (≈ 0 when Δ0 > 0). Returns
    {"p0": P_0, "proximity": [P_1..P_T], "dense": [r_1..r_T]}.
    """
    if len(diffs) != len(violations):
        raise ValueError("diffs and violations must have the same length")
    p_prev = proximity(delta0, delta0, epsilon)
    p0 = p_prev
    prox: list[float] = []
    dense: list[float] = []
    for d, bad in zip(diffs, violations):
        p = proximity(d, delta0, epsilon)
        dense.append(-float(lambda_err) if bad else p - p_prev)
        prox.append(p)
        p_prev = p
    return {"p0": p0, "proximity": prox, "dense": dense}


def grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """A_i = (R_i − mean) / std over one group (population std; 0 when the group is uniform)."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    if std < eps:
        return [0.0] * n
    return [(r - mean) / std for r in rewards]


def ta_grpo_advantages(rewards: Sequence[float], dense: Sequence[Sequence[float]]) -> list[list[float]]:
    """LOGIGEN TA-GRPO (§4.3): A_it = A_i + ΔA_it with ΔA_it = r_t if r_t < 0 else 0."""
    if len(rewards) != len(dense):
        raise ValueError("one dense-reward list per trajectory")
    adv = grpo_advantages(rewards)
    return [[a + (r if r < 0 else 0.0) for r in rs] for a, rs in zip(adv, dense)]


# ----------------------------------------------------------------------------------------------
# tau2-style expected actions


def action_matches(name: str, arguments: dict, compare_args: Sequence[str] | None,
                   call_name: str, call_args: dict) -> bool:
    """tau2 `Action.compare_with_tool_call`, reproduced exactly."""
    if name != call_name:
        return False
    keys = call_args.keys() if compare_args is None else compare_args
    if len(keys) == 0:
        return True
    tool_args = {k: v for k, v in call_args.items() if k in keys}
    action_args = {k: v for k, v in arguments.items() if k in keys}
    return tool_args == action_args


_ABSENT = object()


def action_matches_exact(name: str, arguments: dict, compare_args: Sequence[str] | None,
                         call_name: str, call_args: dict | None) -> bool:
    """A call that does what the action does: same name and equal values on `compare_args` when
    given, else on every key of either side (an argument only one side names is a difference).
    Stricter than tau2's rule (`action_matches`), where a call that names no argument matches any
    action of that name."""
    if name != call_name or not isinstance(call_args, dict):
        return False
    keys = set(compare_args) if compare_args is not None else set(arguments) | set(call_args)
    return all(arguments.get(k, _ABSENT) == call_args.get(k, _ABSENT) for k in keys)


def looks_like_read(name: str) -> bool:
    """A tool whose name starts with a read verb (`READ_PREFIXES`): the guess for environments that
    do not say which of their tools write (anything else is taken as a write)."""
    return str(name).startswith(READ_PREFIXES)


@dataclass
class ActionsResult:
    reward: float
    matched: list[bool]
    matched_by: list[int | None] = field(default_factory=list)  # index of the first matching call
    unexpected_writes: list[dict] = field(default_factory=list)  # strict: {index, name, arguments}
    forbidden_attempts: list[dict] = field(default_factory=list)  # strict: {index, name, error_code, why}


@dataclass(frozen=True)
class CallOutcome:
    """One executed tool call as the strict actions check sees it."""

    name: str
    args: dict | None
    ok: bool
    error_code: str | None = None
    side: str = "agent"


def match_actions(expected: Sequence[dict], calls: Sequence[tuple[str, dict]]) -> ActionsResult:
    """Each expected {"name", "arguments", "compare_args"} must match some call (name, args)."""
    matched: list[bool] = []
    by: list[int | None] = []
    for act in expected:
        hit = None
        for i, (cname, cargs) in enumerate(calls):
            if action_matches(act["name"], act.get("arguments") or {}, act.get("compare_args"), cname, cargs):
                hit = i
                break
        matched.append(hit is not None)
        by.append(hit)
    reward = 1.0 if all(matched) else 0.0
    return ActionsResult(reward=reward, matched=matched, matched_by=by)


def strict_actions(expected: Sequence[dict], calls: Sequence[CallOutcome],
                   is_write: Callable[[str], bool]) -> ActionsResult:
    """The strict actions reward (module docstring, "Strict actions"): expected actions matched by
    successful calls (exact arguments), no unexpected successful agent write, no forbidden write
    attempt. `expected`: {"name", "arguments", "compare_args", "expect_error", "side"} dicts;
    `is_write(name)`: whether a tool writes."""
    def fits(act: dict, c: CallOutcome) -> bool:
        if not action_matches_exact(act["name"], act.get("arguments") or {}, act.get("compare_args"), c.name, c.args):
            return False
        want = act.get("expect_error")
        return (not c.ok and c.error_code == want) if want else c.ok

    matched: list[bool] = []
    by: list[int | None] = []
    for act in expected:
        hit = next((i for i, c in enumerate(calls) if fits(act, c)), None)
        matched.append(hit is not None)
        by.append(hit)
    writes = [a for a in expected if is_write(a["name"]) and not a.get("expect_error")]
    refused = [a for a in expected if a.get("expect_error")]
    refusal_task = not writes
    left = list(range(len(writes)))  # expected writes not yet used by a call
    unexpected: list[dict] = []
    forbidden: list[dict] = []
    for i, c in enumerate(calls):
        if c.side == "user" or not is_write(c.name):
            continue
        if c.ok:
            j = next((j for j in left if fits(writes[j], c)), None)
            if j is None:
                unexpected.append({"index": i, "name": c.name, "arguments": c.args})
            else:
                left.remove(j)
            continue
        if any(fits(a, c) for a in refused):
            continue  # the reference makes this attempt too (a violation-first task)
        if refusal_task:
            why = "the task's reference writes nothing: a write attempt is one the task forbids"
        elif c.error_code == POLICY_VIOLATION:
            why = "refused as a POLICY_VIOLATION: a write the policy forbids"
        else:
            continue  # a failed write on a task that writes (bad arguments ...): not forbidden as such
        forbidden.append({"index": i, "name": c.name, "error_code": c.error_code, "why": why})
    ok = all(matched) and not unexpected and not forbidden
    return ActionsResult(reward=1.0 if ok else 0.0, matched=matched, matched_by=by,
                         unexpected_writes=unexpected, forbidden_attempts=forbidden)


# ----------------------------------------------------------------------------------------------
# ASTRA F1


def f1_reward(n: int, n_hat: int, c: int, epsilon: float = DEFAULT_EPSILON) -> dict:
    """ASTRA eq. 30-31: r = n̂/n, p = n̂/(c+ε), F1 = 2pr/(p+r); F1 = 0 when p + r = 0.

    p is capped at 1 (a single call may answer several sub-questions; the paper's p is meant as the
    fraction of effective calls). n must be ≥ 1.
    """
    if n <= 0:
        raise ValueError("F1 needs at least one required sub-task (n >= 1)")
    r = n_hat / n
    p = min(1.0, n_hat / (c + epsilon))
    f1 = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return {"n": n, "n_hat": n_hat, "c": c, "recall": r, "precision": p, "f1": f1}


def normalize_text(x: Any) -> str:
    """Unicode NFKC, case-folded, whitespace collapsed (dicts/lists as their JSON)."""
    if not isinstance(x, str):
        x = json.dumps(x, ensure_ascii=False, sort_keys=True) if isinstance(x, (dict, list)) else str(x)
    return " ".join(unicodedata.normalize("NFKC", x).casefold().split())


# a token: a run of word characters, joined by single internal connectors (- / : . , ') so that
# dates (2024-05-20), ids (HAT170-2024-05-20, mia_li_3668), times (10:30), numbers (1,000.00)
# and contractions (don't) stay one token; a leading minus belongs to the token ("-5")
_TOKEN = re.compile(r"-?\w+(?:[-/:.,'’]\w+)*")
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def answer_tokens(x: Any) -> list[str]:
    """The tokens of `normalize_text(x)` (punctuation around tokens dropped: '$', '%', '.', '"')."""
    return _TOKEN.findall(normalize_text(x))


def _as_number(tok: str) -> float | None:
    """A token that is exactly a number (thousands commas allowed) as a float, else None."""
    if not _NUMBER.fullmatch(tok):
        return None
    try:
        return float(tok.replace(",", ""))
    except ValueError:  # pragma: no cover - guarded by the regex
        return None


def _num_eq(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _expected_number(a: Any) -> float | None:
    if isinstance(a, bool):
        return None
    if isinstance(a, (int, float)):
        return float(a) if math.isfinite(a) else None
    if isinstance(a, str):
        toks = answer_tokens(a)
        if len(toks) == 1:
            return _as_number(toks[0])
    return None


def _leaves(a: Any) -> list[Any]:
    if isinstance(a, dict):
        return [x for v in a.values() for x in _leaves(v)]
    if isinstance(a, (list, tuple)):
        return [x for v in a for x in _leaves(v)]
    return [a]


def contains_answer(text: Any, a: Any) -> bool:
    """Whether the expected answer a_i appears in `text`, on token boundaries.

    Both sides are normalized (NFKC, case-folded, whitespace collapsed) and split into tokens
    (`answer_tokens`: punctuation around words is dropped, connectors inside a word are kept, so
    'HAT170-2024-05-20' and '1,000.00' are one token each). Then:
    - a numeric answer (int/float, or a string that is one number token such as "$1,000") matches a
      number token of equal value: 1000 matches 'Total: $1,000.00' and '1000.0', not '10000',
      'balance 1000' does not contain 100, 'order 42' does not contain 4, and a date or an id
      ('2024-05-20') holds no number;
    - a boolean matches the token 'true' / 'false';
    - any other scalar matches when its token sequence occurs contiguously in the text's tokens:
      'Paris' in 'The capital is Paris.', not 'no' in 'the flight is not available';
    - a dict / list answer matches when every leaf value matches.
    """
    if text is None or a is None:
        return False
    toks = answer_tokens(text)
    leaves = _leaves(a)
    if not leaves:
        return False
    return all(_contains_one(toks, x) for x in leaves)


def _contains_one(toks: list[str], a: Any) -> bool:
    if a is None:
        return "null" in toks or "none" in toks
    num = _expected_number(a)
    if num is not None:
        for t in toks:
            v = _as_number(t)
            if v is not None and _num_eq(v, num):
                return True
        return False
    want = answer_tokens(json.dumps(a) if isinstance(a, bool) else a)
    if not want:
        return False
    k = len(want)
    first = want[0]
    for i in range(len(toks) - k + 1):
        if toks[i] == first and toks[i:i + k] == want:
            return True
    return False
