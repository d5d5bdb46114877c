"""What a rule's firing condition reads, and whether a visible write tool can change it: the
static half of the boundary (N-1) search (rules.RuleCoverage).

A boundary needs a state S, a goal g accepted on S and a next unit n on a row of S that g makes
cross the rule. For that, g must change something the rule's condition reads. `reads(rc)` lists
what one rule check reads from the state (besides the call's own arguments):

- a **cell** (table, column) of the row the call writes: `OLD.c`, and `NEW.c` on UPDATE (the
  row's value when the call does not set c);
- a **cell** of another table's row selected by a scalar subquery on its key
  (`(SELECT status FROM flight WHERE flight_id = NEW.flight_id)`): the selected column and the
  non-key columns it filters on; through a JOIN whose every table is reached by its primary key
  (`... FROM dispensing f JOIN prescription r ON r.rx_id = f.rx_id JOIN patient pa ON
  pa.patient_id = r.patient_id WHERE f.fill_id = NEW.fill_id`), the columns of those rows;
- the **rows** of a table (an aggregate, EXISTS, IN, a subquery not on the row's key — e.g.
  `(SELECT today FROM clock)`, also inside a function or expression): any insert or any column
  update of that table.

A subquery nested in a function, arithmetic or CASE (`CASE (SELECT tier FROM users WHERE
user_id = NEW.user_id) WHEN 'vip' THEN 10 ELSE 3 END`) is read like a top-level one; only an
expression the parser keeps as text falls back to "the rows of every table it names".

`movable(...)` says whether a visible write tool can change a read: an update tool of that
table with the column as a parameter, or an AFTER trigger of a visible tool that updates it
(inserts, for rows) — unless every such write is rejected by a rule that makes the column
immutable (`NEW.c IS NOT OLD.c`, alone or OR-ed with others: `owner_fixed`), or the check
reads nothing but `NEW.c` of the row it checks (every write of c passes this same check, so no
reachable value makes a later call cross: `email_format`). An insert that creates the row a
later update reads is not counted (the next unit must act on a row of S). An UPDATE check with a
numeric limit on a column the call sets (`NEW.total_bags > 5 * ...`) can always be met exactly
(the goal is the last allowed value: `RuleCoverage._update_threshold`).

`impossible(an, view)` returns {rule: reason} for the rules none of whose checks reads anything
movable: no state can be one action away from them, so the search skips them. The decision is
sound for what the search looks for, not complete: a movable read may still never reach the
values that make the rule fire (a column whose writes another rule restricts to some
transitions), and then the rule is searched and reported as not found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_REF = re.compile(r"\b(NEW|OLD)\.(\w+)", re.IGNORECASE)
_FROM = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)", re.IGNORECASE)
_CONST_SELECT = re.compile(r"^\(?\s*SELECT\s+(?:\d+|\*|NULL)\s+FROM\b", re.IGNORECASE)


@dataclass(frozen=True)
class Read:
    kind: str  # cell | rows
    table: str
    column: str | None = None  # cell: the column; rows: None (any insert or update)
    via: str = ""  # "OLD.c" / "NEW.c" / "subquery" / "function"

    def label(self) -> str:
        return f"{self.table}.{self.column}" if self.kind == "cell" else f"rows of {self.table}"


def operands(rc: Any) -> list:
    out = []
    for c in rc.conditions:
        out.extend(cond_operands(c))
    return out


def cond_operands(c: Any) -> list:
    ops = []
    for o in (c.lhs, *(c.rhs if isinstance(c.rhs, tuple) else (c.rhs,))):
        if o is None or not hasattr(o, "kind"):
            continue
        ops.append(o)
        if o.kind == "list":
            ops.extend(x for x in (o.value or []) if hasattr(x, "kind"))
        if o.kind == "subquery":
            for f in o.filters:
                ops.extend(cond_operands(f))
        if o.kind in ("func", "expr"):
            ops.extend(_nested(o))
    return ops


def _nested(o: Any) -> list:
    out = []
    for x in getattr(o, "parts", None) or []:
        out.append(x)
        if x.kind == "subquery":
            for f in x.filters:
                out.extend(cond_operands(f))
    return out


def row_refs(rc: Any) -> set[tuple[str, str]]:
    """{("NEW"|"OLD", column)} the check's condition reads anywhere (keys of subqueries too)."""
    return {(a.upper(), b) for a, b in _REF.findall(rc.sql)}


def reads(rc: Any, tables: dict) -> list[Read]:
    out: list[Read] = []

    def add(r: Read) -> None:
        if r not in out:
            out.append(r)

    t0 = tables.get(rc.table)
    for side, col in sorted(row_refs(rc)):
        if t0 is not None and col in t0.pk:
            continue  # the row's key: which row, not something a write changes
        if side == "NEW" and rc.event == "UPDATE" and list(rc.columns or []) == [col]:
            continue  # `UPDATE OF status`: NEW.status is the call's own argument, never the row's
        if side == "OLD" or rc.event == "UPDATE":
            add(Read("cell", rc.table, col, f"{side}.{col}"))
    for o in operands(rc):
        if o.kind == "subquery":
            tabs = list(dict.fromkeys((o.tables or {}).values())) or ([o.table] if o.table else [])
            t = tables.get(o.table)
            selected = [c.split(".")[-1] for c in (getattr(o, "selects", None) or [])] or \
                ([o.column] if o.column else [])
            const = not selected and bool(_CONST_SELECT.match(o.text or ""))  # EXISTS (SELECT 1 ...)
            keyed = (t is not None and len(tabs) == 1 and o.aggregate is None and (bool(selected) or const)
                     and all(c in t.colmap for c in selected) and t.pk and set(t.pk) <= set(o.keys))
            joined = _joined(o, tables) if not keyed and len(o.tables or {}) > 1 else None
            if joined is not None:
                for r in joined:
                    add(r)
            elif keyed:
                for c in selected:  # `SELECT balance + overdraft_limit FROM account WHERE ...`: both
                    add(Read("cell", o.table, c, "subquery"))
                for k in o.keys:
                    if k not in t.pk:
                        add(Read("cell", o.table, k, "subquery"))
                for f in o.filters:
                    for x in cond_operands(f):
                        if x.kind == "column" and x.column:
                            add(Read("cell", o.table, x.column, "subquery"))
            else:
                for tb in tabs:
                    add(Read("rows", tb, None, "subquery"))
        elif o.kind in ("func", "expr") and not o.parts:  # parsed parts are operands of their own
            for tb in _FROM.findall(o.text or ""):
                add(Read("rows", tb, None, "function"))
    for c in rc.conditions:
        if c.kind == "opaque":
            for tb in _FROM.findall(c.text or ""):
                add(Read("rows", tb, None, "function"))
    return out


def _joined(o: Any, tables: dict) -> list[Read] | None:
    """The cells a JOIN subquery reads when every table in it is reached by its primary key:
    one table by a key equal to the call's row (`f.fill_id = NEW.fill_id`), the others through
    `x.pk = y.col` equalities (`r.rx_id = f.rx_id`, `pa.patient_id = r.patient_id`). Such a
    subquery reads exactly one row per table, so only those rows' columns matter (`pa.plan_code`,
    `r.patient_id`, `f.rx_id`), not their tables' other rows. None when a table is reached
    otherwise (an aggregate, a range): its rows are read."""
    if o.aggregate is not None:
        return None
    al = dict(o.tables or {})
    if any(t not in tables for t in al.values()):
        return None

    def pk(a: str) -> list:
        return list(tables[al[a]].pk)

    def where(name: str, qual: str | None = None) -> tuple[str, str] | None:
        if "." in name:
            qual, name = name.split(".", 1)
        if qual is not None:
            return (qual, name) if qual in al else None
        hits = [a for a, t in al.items() if name in tables[t].colmap]
        return (hits[0], name) if len(hits) == 1 else None

    cols: dict[str, set] = {a: set() for a in al}
    anchored: set = set()
    for k, op in o.keys.items():
        w = where(k)
        if w is None:
            return None
        cols[w[0]].add(w[1])
        if op.kind in ("new", "old", "literal") and pk(w[0]) == [w[1]]:
            anchored.add(w[0])
    edges = []
    for f in o.filters:
        ops = [x for x in cond_operands(f) if x.kind == "column"]
        for x in ops:
            w = where(x.column, x.table)
            if w is None:
                return None
            cols[w[0]].add(w[1])
        if f.kind == "compare" and f.op in ("=", "IS") and len(ops) == 2:
            edges.append(tuple(where(x.column, x.table) for x in ops))
    selects = list(getattr(o, "selects", None) or ([o.column] if o.column else []))
    if not selects and not _CONST_SELECT.match(o.text or ""):
        return None  # a select list whose reads are not known
    for name in selects:  # a plain column, or those a computed one reads (a CASE on c.kyc_status)
        w = where(name)
        if w is None:
            return None
        cols[w[0]].add(w[1])
    grew = True
    while grew:
        grew = False
        for (a, ca), (b, cb) in edges:
            for (x, cx), (y, _) in (((a, ca), (b, cb)), ((b, cb), (a, ca))):
                if y in anchored and x not in anchored and pk(x) == [cx]:
                    anchored.add(x)
                    grew = True
    if anchored != set(al):
        return None
    out: list[Read] = []
    for a, cs in cols.items():
        for c in sorted(cs):
            r = Read("cell", al[a], c, "join")
            if c not in pk(a) and r not in out:
                out.append(r)
    return out


def immutable(an: Any) -> dict[tuple[str, str], str]:
    """{(table, column): rule} for columns a rule forbids to change on UPDATE: its whole firing
    condition is `NEW.c IS NOT OLD.c`, or an OR of such comparisons."""
    out: dict[tuple[str, str], str] = {}
    for rule, checks in an.rules.items():
        for rc in checks:
            f = rc.firing
            if rc.event != "UPDATE" or f is None:
                continue
            items = [f] if f.op == "LEAF" else (f.items if f.op == "OR" else [])
            if not items or any(i.op != "LEAF" or i.cond is None for i in items):
                continue
            cols = []
            for i in items:
                c = i.cond
                sides = sorted(getattr(x, "kind", "") for x in (c.lhs, c.rhs))
                if (c.kind == "compare" and c.op in ("IS NOT", "!=", "<>") and sides == ["new", "old"]
                        and c.lhs.column == c.rhs.column):
                    cols.append(c.lhs.column)
                else:
                    cols = []
                    break
            for col in cols:
                out.setdefault((rc.table, col), rule)
    return out


class Reach:
    """Which visible tools change which cells and tables of one domain (see the module doc)."""

    def __init__(self, an: Any, view: Any):
        self.an = an
        self.view = view
        self.fixed = immutable(an)
        visible = set(view.tools)
        # (table, column) -> tool names that set it directly; table -> tools that insert into it
        self.set_by: dict[tuple[str, str], list[str]] = {}
        self.insert_by: dict[str, list[str]] = {}
        for td in view.writes:
            t = view.tables.get(td.table)
            if t is None:
                continue
            if td.kind == "update":
                for p in sorted(view.params.get(td.name, ())):
                    if p in t.colmap and p not in t.pk:
                        self.set_by.setdefault((td.table, p), []).append(td.name)
            elif td.kind == "insert":
                self.insert_by.setdefault(td.table, []).append(td.name)
        # AFTER triggers of visible tools: (table, column) / table -> the tools that cause them
        self.effect_by: dict[tuple[str, str | None], list[str]] = {}
        for tr in an.after:
            tools = [x for x in tr.tools if x in visible]
            if not tools:
                continue
            for e in tr.effects:
                if e.verb == "updates":
                    for col in (e.columns or [None]):
                        self.effect_by.setdefault((e.table, col), []).extend(tools)
                elif e.verb.startswith("inserts"):
                    self.effect_by.setdefault((e.table, "+rows"), []).extend(tools)

    def writers(self, r: Read) -> list[str]:
        """Visible tools that change the read (directly or through an AFTER trigger)."""
        if r.kind == "cell":
            out = list(self.set_by.get((r.table, r.column), [])) + self.effect_by.get((r.table, r.column), [])
            out += self.effect_by.get((r.table, None), [])
        else:
            out = list(self.insert_by.get(r.table, [])) + self.effect_by.get((r.table, "+rows"), [])
            for (tb, col), tools in list(self.set_by.items()) + list(self.effect_by.items()):
                if tb == r.table and col != "+rows" and (tb, col) not in self.fixed:
                    out += tools
        return list(dict.fromkeys(out))

    def why_not(self, rc: Any, r: Read) -> str | None:
        """None when a visible tool can change the read for this check; else the reason."""
        if r.kind == "cell" and (r.table, r.column) in self.fixed and r.column is not None:
            ws = self.writers(r)
            rule = self.fixed[(r.table, r.column)]
            return (f"{r.label()}: " + (f"only {', '.join(ws)} writes it and " if ws else "")
                    + f"{rule} rejects every change of it")
        ws = self.writers(r)
        if not ws:
            return f"{r.label()}: no visible tool " + ("writes it" if r.kind == "cell" else "inserts or changes them")
        if r.kind == "cell" and r.table == rc.table and rc.event == "UPDATE" and self._self_guard(rc, r.column):
            return (f"{r.label()}: the check reads nothing but NEW.{r.column}, so every write of it passes "
                    "this same check")
        return None

    @staticmethod
    def _self_guard(rc: Any, col: str | None) -> bool:
        refs = row_refs(rc)
        if refs != {("NEW", col)}:
            return False
        if rc.columns and col not in rc.columns:
            return False
        return all(o.kind in ("new", "literal", "list") for o in operands(rc))

    def check_movable(self, rc: Any) -> tuple[list[Read], list[str]]:
        """(the reads a visible tool can change, the reasons for the others)."""
        tables = self.view.tables
        rs = reads(rc, tables)
        if rc.event == "UPDATE":
            for th in rc.thresholds:
                col = th.ref[4:] if th.ref.startswith("NEW.") else None
                c = tables[rc.table].colmap.get(col) if col and rc.table in tables else None
                if (c is not None and c.json_type in ("integer", "number") and self.set_by.get((rc.table, col))
                        and (rc.table, col) not in self.fixed):
                    # the goal can be the last allowed value (an argument limit on an update)
                    return [Read("cell", rc.table, col, "NEW limit")], []
        ok, why = [], []
        for r in rs:
            w = self.why_not(rc, r)
            if w is None:
                ok.append(r)
            else:
                why.append(w)
        return ok, why

    def impossible(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for rule, checks in sorted(self.an.rules.items()):
            reasons: list[str] = []
            movable = False
            for rc in checks:
                ok, why = self.check_movable(rc)
                if ok:
                    movable = True
                    break
                args = sorted(f"NEW.{c}" for s, c in row_refs(rc) if s == "NEW" and rc.event == "INSERT")
                reasons += why
                if args or not why:
                    reasons.append(f"{rc.event.lower()} check: otherwise the call's own arguments"
                                   + (f" ({', '.join(args)})" if args else "") + " and constants"
                                   if why else f"{rc.event.lower()} check reads only the call's arguments"
                                   + (f" ({', '.join(args)})" if args else "") + " and constants")
            if not movable:
                out[rule] = ("no N-1 state can exist (static): " + "; ".join(dict.fromkeys(reasons)))
        return out


# the names goals.py, hints.py and targeted.py import (until they use the public ones above)
_operands, _cond_operands, _immutable = operands, cond_operands, immutable
