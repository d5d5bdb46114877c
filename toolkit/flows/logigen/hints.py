"""Values the rules themselves suggest for a column: the goal explorer's candidate writes try them
first, so a chain step finds an accepted write in fewer calls and writes what the policy is about
(a book returned today, a hold moved into the allowed window) instead of random neighbours.

`column_hints(an)` reads, once per domain, every rule condition that mentions `NEW.<col>`: the
literals it compares with (`NEW.status <> 'cancelled'`, an IN list) and the one-row state
constants it reads (`(SELECT today FROM clock)`); `hint_values(...)` evaluates them on a state:
the literal, or the constant and the days (integers) after it (`today`, `today + 1`,
`today + 7`). Nothing here knows a domain.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

from toolkit.flows.logigen.reach import _FROM, _cond_operands, _operands, row_refs


def _is_date(v: Any) -> bool:
    """An ISO date string (YYYY-MM-DD)."""
    return isinstance(v, str) and len(v) == 10 and v[4] == "-" and v[7] == "-" and v[:4].isdigit()


def _shift_date(v: str, days: int) -> str | None:
    try:
        return (date.fromisoformat(v) + timedelta(days=days)).isoformat()
    except ValueError:
        return None


def column_hints(an: Any) -> dict[tuple[str, str], list]:
    """{(table, column): [("lit", value) | ("const", subquery operand)]} from the rule checks."""
    out: dict[tuple[str, str], list] = {}
    for checks in an.rules.values():
        for rc in checks:
            for cond in rc.conditions:
                ops = _cond_operands(cond)
                cols = [o.column for o in ops if o.kind == "new" and o.column]
                if not cols:
                    continue
                found: list = []
                # an order comparison suggests the days (units) after a constant too
                order = not (cond.kind in ("in", "null") or cond.op in ("=", "==", "IS", "IS NOT", "!=", "<>"))
                for o in ops:
                    if o.kind == "literal" and o.value is not None:
                        found.append(("lit", o.value))
                    elif o.kind == "list":
                        found += [("lit", x.value) for x in (o.value or []) if getattr(x, "kind", None) == "literal"
                                  and x.value is not None]
                    elif (o.kind == "subquery" and not o.refs and not o.keys and not o.filters and o.column
                          and not o.aggregate and len(set((o.tables or {}).values())) <= 1):
                        found.append(("const" if order else "eq", o))
                for col in cols:
                    lst = out.setdefault((rc.table, col), [])
                    for f in found:
                        if f not in lst:
                            lst.append(f)
    return out


def fits_column(c: Any, v: Any, none_ok: bool = False) -> bool:
    """`v` has the JSON type of column `c` (a bool never does; None only for an untyped column, and
    only with `none_ok`)."""
    jt = getattr(c, "json_type", None)
    if isinstance(v, bool) or (v is None and not none_ok):
        return False
    if jt == "integer":
        return isinstance(v, int)
    if jt == "number":
        return isinstance(v, (int, float))
    if jt == "string":
        return isinstance(v, str)
    return True


def hint_values(hints: list, state: dict, col: Any, cur: Any) -> list:
    """The hinted values of a column on `state` (see the module doc), those that fit its type and
    differ from `cur`."""
    out: list = []
    for kind, x in hints:
        if kind == "lit":
            vals = [x]
        else:
            rows = state.get(x.table) or []
            if len(rows) != 1 or rows[0].get(x.column) is None:
                continue
            v = rows[0].get(x.column)
            if kind == "eq":
                vals = [v]
            elif _is_date(v):
                vals = [v, _shift_date(v, 1), _shift_date(v, 7)]
            elif isinstance(v, int) and not isinstance(v, bool):
                vals = [v, v + 1, v + 7]
            else:
                vals = [v]
        for v in vals:
            if v != cur and v not in out and fits_column(col, v) and (not col.enum or v in col.enum):
                out.append(v)
    return out


def row_only_rules(an: Any) -> set[str]:
    """Rules with an UPDATE check that reads nothing but the old row (`OLD.returned_day IS NOT
    NULL`: a returned loan cannot change): when such a rule refuses an update of a row, every
    update of that row is refused, whatever it sets."""
    out: set[str] = set()
    for rule, checks in an.rules.items():
        def old_only(rc: Any) -> bool:
            refs = row_refs(rc)
            return (rc.event == "UPDATE" and not rc.columns and bool(refs) and all(side == "OLD" for side, _ in refs)
                    and not any(o.kind == "subquery" for o in _operands(rc)) and rc.guard is None)

        if checks and all(old_only(rc) for rc in checks):
            out.add(rule)
    return out


_NEW_OLD = re.compile(r"\b(NEW|OLD)\.(\w+)", re.IGNORECASE)
_UNSTABLE = re.compile(r"\bnow\b|current_|random|changes\s*\(|last_insert_rowid", re.IGNORECASE)


def failure_scopes(an: Any, tables: dict, tools: dict) -> dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]:
    """{(write tool, rule): (the tables the rule's checks read, the arguments they read)} for the
    pairs where a refusal is a function of those arguments and those tables' contents alone:
    when the tool's call was refused by the rule on one state, a call with the same values of
    those arguments is refused on every state whose read tables hold the same rows (by this
    rule, or by one that fires before it). The goal explorer skips such a call instead of
    running it (GoalExplorer._next_write): an insert's fresh key is not among the arguments a
    rule reads unless the rule names NEW.<key>.

    A pair qualifies only when every check of the rule that the tool reaches is a BEFORE check
    on the tool's own table and event (it sees the state before the call: no cascade through an
    AFTER trigger, whose writes may depend on other tables), no BEFORE trigger of that table and
    event writes anything, the condition names only tables of the domain (no view, no CTE) and
    nothing time- or call-dependent (`now`, `CURRENT_*`, `random()`, `changes()`). The read
    tables are every table named after FROM/JOIN in the condition, and the tool's table for an
    UPDATE (OLD.*, and NEW.* of the columns the call does not set). The arguments are the
    columns the condition names as NEW.<c> (a column the call does not pass is its default on
    an INSERT, the row's value on an UPDATE: the caller keys on its absence too), and on an
    UPDATE the table's key (which row)."""
    writing_before = {(t.table, t.event) for t in an.before if t.effects}
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for name, td in tools.items():
        event = {"insert": "INSERT", "update": "UPDATE"}.get(td.kind)
        if event is None or (td.table, event) in writing_before:
            continue
        for rule, checks in an.rules.items():
            reached = [rc for rc in checks if name in rc.tools or (rc.table == td.table and rc.event == event)]
            if not reached:
                continue
            read: set[str] = {td.table} if event == "UPDATE" else set()
            cols: set[str] = set(tables[td.table].pk) if event == "UPDATE" and td.table in tables else set()
            ok = True
            for rc in reached:
                # a RAISE inside a CASE keeps its statement only as an opaque condition's text
                sql = " ".join([rc.sql, *(c.text or "" for c in rc.conditions if c.kind == "opaque")])
                if (rc.table != td.table or rc.event != event or rc.timing != "BEFORE"
                        or _UNSTABLE.search(sql)):
                    ok = False
                    break
                named = set(_FROM.findall(sql))
                if not named <= set(tables):
                    ok = False
                    break
                read |= named
                cols |= {c for side, c in _NEW_OLD.findall(sql) if side.upper() == "NEW"}
            if ok:
                out[(name, rule)] = (tuple(sorted(read)), tuple(sorted(cols)))
    return out
