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

from datetime import date, timedelta
from typing import Any

from toolkit.flows.logigen.reach import _cond_operands, _operands, row_refs


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
