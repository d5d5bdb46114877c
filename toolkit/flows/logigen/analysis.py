"""Deterministic trigger analysis of a compiled sqlite domain (LOGIGEN's policy logic as data).

The Set Designer (boundary-adjacent seeding), the domain check (provoking every rule) and the
Architect's Check-Fix-Verify all need to know, per policy rule, *which write* fires it and *under
which condition*. This module reads the triggers of a compiled domain and returns that as plain
data; nothing here is specific to a domain.

Stable API (other modules import only these names)::

    from toolkit.flows.logigen.analysis import analyze, evaluate, Condition, Operand

    a = analyze(env)                    # env: SqliteEnvironment, CompiledDomain or a domain path
    a.rules                             # {rule_id: [RuleCheck, ...]}  (one per RAISE of that rule)
    a.before                            # [TriggerAnalysis] BEFORE triggers (guards + rule checks)
    a.after                             # [TriggerAnalysis] AFTER triggers (side effects)
    a.effects_of(tool)                  # [Effect] side effects a write tool causes
    a.to_dict()                         # JSON-ready

    rc = a.rules["seat_availability"][0]
    rc.trigger, rc.table, rc.event      # "reservation_insert_rules", "reservation", "INSERT"
    rc.columns                          # UPDATE OF columns ([] = any column / INSERT)
    rc.tools                            # ["insert_reservation"] direct tools, then tools whose AFTER
                                        #   triggers write the table (cascades)
    rc.guard                            # BoolExpr of the trigger's WHEN clause (None = always)
    rc.where                            # BoolExpr of the `SELECT RAISE(...) WHERE ...` (None = always)
    rc.firing                           # guard AND where: the whole firing condition (BoolExpr | None)
    rc.conditions                       # [Condition] the leaves of `firing`, in order
    rc.thresholds                       # [Threshold] numeric NEW/OLD/subquery-vs-literal bounds
    rc.analyzable                       # False when some leaf is kind "opaque"
    rc.sql                              # firing condition as SQL text over NEW.x / OLD.x

    evaluate(env, rc.sql, new={...}, old={...})   # -> True/False/None: does the rule fire for
                                                  #    this NEW/OLD row in env's current state?

Data types (dataclasses; `.to_dict()` on each):

- `Operand(kind, text, column, value, table, keys, filters, default, refs)`; kind is one of
  `new` / `old` (NEW.col / OLD.col: `column`), `literal` (`value`; NULL is value None),
  `column` (a bare or alias-qualified column inside a subquery: `table` alias, `column`),
  `subquery` (`(SELECT column FROM table WHERE ...)` or an EXISTS body: `table`, `column`
  (selected column, None for `SELECT 1`/`COUNT(*)`), `keys` {subquery column: Operand} from
  equalities with NEW/OLD/literals (with several FROM tables the key is "alias.col"), `filters`
  [Condition] the other WHERE leaves, `tables` {alias: table} of the FROM clause, `aggregate`
  e.g. "COUNT"), `list` (IN list: `value` = [Operand]), `expr` (arithmetic over analyzable
  operands: `refs` lists the NEW/OLD columns used), `func` (a function call other than COALESCE:
  julianday, strftime, ...; `refs` likewise). `COALESCE(x, literal)` is x with `default` = literal.
- `Condition(kind, op, lhs, rhs, text, negated)`; kind is one of
  `compare` (op in = != < <= > >= IS IS NOT), `in` (op IN / NOT IN; rhs a list or a subquery),
  `exists` (op EXISTS / NOT EXISTS; rhs the subquery), `null` (op IS NULL / IS NOT NULL),
  `like` (op LIKE / NOT LIKE / GLOB), `between`, or `opaque` (not analyzable: a function, CASE,
  anything else; `text` is the SQL). A Condition whose operands include a `func` is still
  `compare` etc.; `Condition.opaque_parts` says which parts are not structurally analyzable.
- `BoolExpr(op, items)` with op AND / OR / NOT, or op "LEAF" with `cond`.
- `Threshold(ref, op, value, violating, boundary)`: for `NEW.passenger_count > 5`: ref "NEW.passenger_count",
  violating 6 (the smallest integer that fires), boundary 5 (the last valid value: the N-1 state).
- `Effect(verb, table, columns)`: an AFTER trigger's write, e.g. ("updates", "flight_cabin",
  ["seats_available"]).

Everything is derived from the trigger SQL by a small recursive-descent parser of SQLite
expressions (comparisons, AND/OR/NOT, IS [NOT], [NOT] IN, [NOT] EXISTS, LIKE, BETWEEN, scalar
subqueries, arithmetic, function calls, CASE (opaque)). What it cannot parse comes back as an
`opaque` condition with the SQL text, never an exception.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.flows.logigen.sqlexpr import _AGGS, _ParseError, _Parser, _unq

__all__ = [
    "BoolExpr",
    "Condition",
    "DomainAnalysis",
    "Effect",
    "Operand",
    "RuleCheck",
    "Threshold",
    "TriggerAnalysis",
    "analyze",
    "evaluate",
    "parse_condition",
]

# ----------------------------------------------------------------------------------------------
# Data


@dataclass
class Operand:
    kind: str  # new | old | literal | column | subquery | list | expr | func
    text: str = ""
    column: str | None = None
    value: Any = None
    table: str | None = None
    keys: dict[str, Operand] = field(default_factory=dict)
    filters: list[Condition] = field(default_factory=list)
    default: Any = None
    aggregate: str | None = None
    refs: list[str] = field(default_factory=list)  # "NEW.col" / "OLD.col" used anywhere inside
    tables: dict[str, str] = field(default_factory=dict)  # subquery FROM: {alias: table}
    # subquery: the columns its select list reads, as written ("c.kyc_status" in `SELECT CASE
    # c.kyc_status WHEN ... END FROM account a JOIN customer c ...`)
    selects: list[str] = field(default_factory=list)
    # func / expr: the subqueries and NEW/OLD references nested inside (a CASE's
    # `(SELECT tier FROM users WHERE user_id = NEW.user_id)`), so what it reads is known
    parts: list[Operand] = field(default_factory=list)

    @property
    def ref(self) -> str | None:
        """'NEW.col' / 'OLD.col' for a row reference, else None."""
        if self.kind in ("new", "old"):
            return f"{self.kind.upper()}.{self.column}"
        return None

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind, "text": self.text}
        for k in ("column", "table", "aggregate"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.kind == "literal" or self.default is not None:
            d["value" if self.kind == "literal" else "default"] = self.value if self.kind == "literal" else self.default
        if self.kind == "list":
            d["value"] = [o.to_dict() for o in self.value]
        if self.keys:
            d["keys"] = {k: v.to_dict() for k, v in self.keys.items()}
        if self.filters:
            d["filters"] = [c.to_dict() for c in self.filters]
        if self.refs:
            d["refs"] = list(self.refs)
        if self.tables:
            d["tables"] = dict(self.tables)
        if self.parts:
            d["parts"] = [o.to_dict() for o in self.parts]
        return d


@dataclass
class Condition:
    kind: str  # compare | in | exists | null | like | between | opaque
    op: str
    lhs: Operand | None
    rhs: Any = None  # Operand, or (low, high) Operands for between
    text: str = ""

    @property
    def refs(self) -> list[str]:
        out: list[str] = []
        for o in self._operands():
            for r in o.refs:
                if r not in out:
                    out.append(r)
        return out

    def _operands(self) -> list[Operand]:
        ops = [self.lhs] if isinstance(self.lhs, Operand) else []
        if isinstance(self.rhs, Operand):
            ops.append(self.rhs)
        elif isinstance(self.rhs, tuple):
            ops.extend(o for o in self.rhs if isinstance(o, Operand))
        return ops

    @property
    def opaque_parts(self) -> list[str]:
        if self.kind == "opaque":
            return [self.text]
        return [o.text for o in self._operands() if o.kind == "func"]

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind, "op": self.op, "text": self.text}
        if isinstance(self.lhs, Operand):
            d["lhs"] = self.lhs.to_dict()
        if isinstance(self.rhs, Operand):
            d["rhs"] = self.rhs.to_dict()
        elif isinstance(self.rhs, tuple):
            d["rhs"] = [o.to_dict() for o in self.rhs]
        return d


@dataclass
class BoolExpr:
    op: str  # AND | OR | NOT | LEAF
    items: list[BoolExpr] = field(default_factory=list)
    cond: Condition | None = None

    def leaves(self) -> list[Condition]:
        if self.op == "LEAF":
            return [self.cond] if self.cond else []
        out: list[Condition] = []
        for it in self.items:
            out.extend(it.leaves())
        return out

    def to_dict(self) -> dict:
        if self.op == "LEAF":
            return self.cond.to_dict() if self.cond else {}
        return {"op": self.op, "items": [i.to_dict() for i in self.items]}


@dataclass
class Threshold:
    ref: str  # "NEW.col", "OLD.col" or "table.column" (a subquery's selected column)
    op: str  # the firing comparison, normalized with ref on the left: ref op value
    value: float | int
    violating: float | int  # nearest value of ref that fires (integers: value±1 for strict ops)
    boundary: float | int  # nearest value that does not fire: the N-1 seed
    condition: str = ""

    def to_dict(self) -> dict:
        return {"ref": self.ref, "op": self.op, "value": self.value, "violating": self.violating,
                "boundary": self.boundary, "condition": self.condition}


@dataclass
class RuleCheck:
    rule: str
    message: str
    trigger: str
    table: str
    timing: str
    event: str
    columns: list[str]
    tools: list[str]
    guard: BoolExpr | None
    where: BoolExpr | None
    guard_sql: str | None
    where_sql: str | None
    order: int  # position of the RAISE in the trigger body (earlier ones fire first)

    @property
    def firing(self) -> BoolExpr | None:
        parts = [p for p in (self.guard, self.where) if p is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else BoolExpr("AND", parts)

    @property
    def sql(self) -> str:
        parts = [f"({s})" for s in (self.guard_sql, self.where_sql) if s]
        return " AND ".join(parts) if parts else "1"

    @property
    def conditions(self) -> list[Condition]:
        f = self.firing
        return f.leaves() if f else []

    @property
    def analyzable(self) -> bool:
        return all(c.kind != "opaque" for c in self.conditions)

    @property
    def thresholds(self) -> list[Threshold]:
        out = []
        for c in self.conditions:
            t = _threshold(c)
            if t is not None:
                out.append(t)
        return out

    def to_dict(self) -> dict:
        return {"rule": self.rule, "message": self.message, "trigger": self.trigger, "table": self.table,
                "timing": self.timing, "event": self.event, "columns": list(self.columns),
                "tools": list(self.tools), "guard": self.guard_sql, "where": self.where_sql, "sql": self.sql,
                "conditions": [c.to_dict() for c in self.conditions], "analyzable": self.analyzable,
                "thresholds": [t.to_dict() for t in self.thresholds], "order": self.order}


@dataclass
class Effect:
    verb: str  # inserts into | updates | deletes from
    table: str
    columns: list[str]

    def to_dict(self) -> dict:
        return {"verb": self.verb, "table": self.table, "columns": list(self.columns)}


@dataclass
class TriggerAnalysis:
    name: str
    table: str
    timing: str
    event: str
    columns: list[str]
    tools: list[str]
    guard: BoolExpr | None
    guard_sql: str | None
    rules: list[RuleCheck]
    effects: list[Effect]
    notes: list[str]
    unparsed: list[str]  # RAISE messages not in the POLICY_VIOLATION format

    def to_dict(self) -> dict:
        return {"name": self.name, "table": self.table, "timing": self.timing, "event": self.event,
                "columns": list(self.columns), "tools": list(self.tools), "guard": self.guard_sql,
                "rules": [r.rule for r in self.rules], "effects": [e.to_dict() for e in self.effects],
                "notes": list(self.notes), "unparsed": list(self.unparsed)}


@dataclass
class DomainAnalysis:
    domain: str
    triggers: list[TriggerAnalysis]
    rules: dict[str, list[RuleCheck]]

    @property
    def before(self) -> list[TriggerAnalysis]:
        return [t for t in self.triggers if t.timing == "BEFORE"]

    @property
    def after(self) -> list[TriggerAnalysis]:
        return [t for t in self.triggers if t.timing == "AFTER"]

    def effects_of(self, tool: str) -> list[Effect]:
        """Side effects (AFTER-trigger writes) that a call of `tool` causes directly."""
        out: list[Effect] = []
        for t in self.after:
            if tool in t.tools[:1]:
                out.extend(t.effects)
        return out

    def rules_of(self, tool: str) -> list[RuleCheck]:
        return [rc for checks in self.rules.values() for rc in checks if tool in rc.tools]

    def to_dict(self) -> dict:
        return {"domain": self.domain, "triggers": [t.to_dict() for t in self.triggers],
                "rules": {k: [rc.to_dict() for rc in v] for k, v in self.rules.items()}}


# ----------------------------------------------------------------------------------------------
# AST -> Operand / Condition / BoolExpr


def _collect_refs(node: Any, out: list[str]) -> None:
    if isinstance(node, tuple):
        if node and node[0] == "COL" and node[1] and node[1].upper() in ("NEW", "OLD"):
            r = f"{node[1].upper()}.{node[2]}"
            if r not in out:
                out.append(r)
            return
        for x in node:
            _collect_refs(x, out)
    elif isinstance(node, (list, dict)):
        for x in (node.values() if isinstance(node, dict) else node):
            _collect_refs(x, out)


def _visit(node: Any, fn: Any) -> None:
    """Depth first over an expression's nodes (tuples, and lists of them); `fn(node)` returns True
    to not descend into that node."""
    if isinstance(node, tuple) and node:
        if fn(node):
            return
        for x in node[1:]:
            _visit(x, fn)
    elif isinstance(node, list):
        for x in node:
            _visit(x, fn)


def _collect_cols(node: Any, out: list[str]) -> None:
    """The table columns (not NEW/OLD, not inside a nested subquery) an expression reads, as
    "qualifier.column" or "column"."""
    def fn(x: tuple) -> bool:
        if x[0] == "COL" and not (x[1] and x[1].upper() in ("NEW", "OLD")):
            name = f"{x[1]}.{x[2]}" if x[1] else x[2]
            if name not in out:
                out.append(name)
        return x[0] in ("SUB", "COL")

    _visit(node, fn)


def _text(node: tuple) -> str:
    return node[-1] if isinstance(node[-1], str) else ""


def _operand(node: tuple) -> Operand:
    refs: list[str] = []
    _collect_refs(node, refs)
    k = node[0]
    if k == "LIT":
        return Operand("literal", node[2], value=node[1])
    if k == "COL":
        q, col = node[1], node[2]
        if q and q.upper() in ("NEW", "OLD"):
            return Operand(q.lower(), node[3], column=col, refs=refs)
        return Operand("column", node[3], column=col, table=q, refs=refs)
    if k == "SUB":
        return _sub_operand(node[1], node[2])
    if k == "FUNC":
        name, args = node[1], node[2]
        if name in ("COALESCE", "IFNULL") and len(args) == 2 and args[1][0] == "LIT":
            inner = _operand(args[0])
            inner.default = args[1][1]
            inner.text = node[3]
            return inner
        return Operand("func", node[3], column=name, refs=refs, parts=_parts(node))
    if k == "ARITH":
        return Operand("expr", node[-1], refs=refs, parts=_parts(node))
    if k == "LIST":
        return Operand("list", node[2], value=[_operand(x) for x in node[1]], refs=refs)
    if k == "CASE":
        return Operand("func", node[-1], column="CASE", refs=refs, parts=_parts(node))
    return Operand("func", _text(node) or "?", refs=refs)


def _parts(node: Any) -> list[Operand]:
    """The subqueries and NEW/OLD columns nested anywhere inside a function, arithmetic or CASE
    node (not inside the subqueries themselves: those are their own operands)."""
    out: list[Operand] = []

    def fn(x: tuple) -> bool:
        if x[0] == "SUB":
            out.append(_sub_operand(x[1], x[2]))
            return True
        if x[0] == "COL" and x[1] and x[1].upper() in ("NEW", "OLD"):
            out.append(_operand(x))
            return True
        return False

    for x in node[1:]:  # below the function / arithmetic / CASE node itself
        _visit(x, fn)
    return out


def _sub_operand(sub: dict, text: str) -> Operand:
    refs: list[str] = []
    _collect_refs(sub, refs)
    tables = sub["tables"]
    op = Operand("subquery", text, table=tables[0][0] if tables else None, refs=refs)
    cols = sub["cols"]
    found: list = []
    _collect_cols(cols, found)
    op.selects = found
    if len(cols) == 1:
        c = cols[0]
        if c[0] == "COL":
            op.column = c[2]
        elif c[0] == "FUNC" and c[1] in _AGGS:
            op.aggregate = c[1]
            if c[2] and c[2][0] == "COL":
                op.column = c[2][2]
    aliases = {alias: name for name, alias in tables}
    op.tables = dict(aliases)
    if sub["where"] is not None:
        for leaf in _bool(sub["where"]).leaves():
            key = _key_of(leaf, aliases, len(tables) == 1)
            if key is not None and key[0] not in op.keys:
                op.keys[key[0]] = key[1]
            else:
                op.filters.append(leaf)
    return op


def _key_of(c: Condition, aliases: dict[str, str], single: bool) -> tuple[str, Operand] | None:
    """col = NEW.x / OLD.x / literal inside a subquery -> ("col" or "table.col", operand)."""
    if c.kind != "compare" or c.op not in ("=", "IS"):
        return None
    for a, b in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
        if isinstance(a, Operand) and a.kind == "column" and isinstance(b, Operand) and \
                b.kind in ("new", "old", "literal"):
            name = a.column if single or not a.table else f"{a.table}.{a.column}"  # alias as written
            return name, b
    return None


def _bool(node: tuple) -> BoolExpr:
    k = node[0]
    if k in ("AND", "OR"):
        items: list[BoolExpr] = []
        for x in node[1]:
            b = _bool(x)
            if b.op == k:
                items.extend(b.items)
            else:
                items.append(b)
        return BoolExpr(k, items)
    if k == "NOT":
        return BoolExpr("NOT", [_bool(node[1])])
    return BoolExpr("LEAF", cond=_leaf(node))


def _leaf(node: tuple) -> Condition:
    k = node[0]
    try:
        if k == "CMP":
            return Condition("compare", node[1], _operand(node[2]), _operand(node[3]), node[4])
        if k == "NULL":
            return Condition("null", node[1], _operand(node[2]), None, node[3])
        if k == "IN":
            rhs = node[3]
            r = _sub_operand(rhs, rhs["text"]) if isinstance(rhs, dict) else _operand(rhs)
            return Condition("in", node[1], _operand(node[2]), r, node[4])
        if k == "EXISTS":
            return Condition("exists", node[1], None, _sub_operand(node[2], node[3]), node[3])
        if k == "LIKE":
            return Condition("like", node[1], _operand(node[2]), _operand(node[3]), node[4])
        if k == "BETWEEN":
            return Condition("between", node[1], _operand(node[2]), (_operand(node[3]), _operand(node[4])),
                             node[5])
    except (IndexError, TypeError, KeyError):  # pragma: no cover - defensive
        pass
    return Condition("opaque", "", None, None, _text(node))


def parse_condition(sql: str | None) -> BoolExpr | None:
    """Parse a boolean SQL expression (a WHEN or WHERE clause) into a BoolExpr; never raises:
    unparseable text becomes one `opaque` leaf. None/empty -> None."""
    if sql is None or not sql.strip():
        return None
    try:
        p = _Parser(sql)
        node = p.expr()
        if p.peek() is not None:
            raise _ParseError(f"trailing text {p.span(p.i, len(p.toks))!r}")
        b = _bool(node)
        # a bare non-boolean expression (e.g. `WHERE NEW.flag`) is opaque
        return b
    except (_ParseError, RecursionError) as e:
        return BoolExpr("LEAF", cond=Condition("opaque", "", None, None, re.sub(r"\s+", " ", sql).strip()
                                               + f"  -- not analyzed: {e}"))


# ----------------------------------------------------------------------------------------------
# Thresholds (numeric boundaries -> N-1 seeds)

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!=", "IS": "IS", "IS NOT": "IS NOT"}


def _threshold(c: Condition) -> Threshold | None:
    if c.kind != "compare" or c.op not in ("<", "<=", ">", ">="):
        return None
    lhs, rhs, op = c.lhs, c.rhs, c.op
    if not isinstance(lhs, Operand) or not isinstance(rhs, Operand):
        return None
    if lhs.kind == "literal" and rhs.kind != "literal":
        lhs, rhs, op = rhs, lhs, _FLIP[op]
    if rhs.kind != "literal" or isinstance(rhs.value, bool) or not isinstance(rhs.value, (int, float)):
        return None
    if lhs.kind in ("new", "old"):
        ref = lhs.ref
    elif lhs.kind == "subquery" and lhs.table:
        ref = f"{lhs.table}.{lhs.aggregate + '(' + (lhs.column or '*') + ')' if lhs.aggregate else lhs.column}"
    else:
        return None
    v = rhs.value
    step = 1 if isinstance(v, int) else 0.01
    if op == ">":
        viol, bound = v + step, v
    elif op == ">=":
        viol, bound = v, v - step
    elif op == "<":
        viol, bound = v - step, v
    else:  # <=
        viol, bound = v, v + step
    if isinstance(v, float):
        viol, bound = round(viol, 6), round(bound, 6)
    return Threshold(ref=ref or "", op=op, value=v, violating=viol, boundary=bound, condition=c.text)


# ----------------------------------------------------------------------------------------------
# Trigger bodies: RAISE statements with their WHERE, AFTER writes with their columns


def _statements(body: str) -> list[str]:
    """Split a trigger body (BEGIN ... END, comments already blanked) into statements."""
    b = re.sub(r"\bEND\s*;?\s*$", "", body.strip(), flags=re.IGNORECASE)
    out, depth, cur, i = [], 0, [], 0
    while i < len(b):
        ch = b[i]
        if ch == "'":
            j = i + 1
            while j < len(b):
                if b[j] == "'" and (j + 1 >= len(b) or b[j + 1] != "'"):
                    break
                j += 2 if b[j] == "'" else 1
            cur.append(b[i:j + 1])
            i = j + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == ";" and depth == 0:
            s = "".join(cur).strip()
            if s:
                out.append(s)
            cur = []
        else:
            cur.append(ch)
        i += 1
    s = "".join(cur).strip()
    if s:
        out.append(s)
    return out


_RAISE_STMT = re.compile(
    r"^\s*SELECT\s+RAISE\s*\(\s*(?:ABORT|FAIL|ROLLBACK)\s*,\s*'((?:[^']|'')*)'\s*\)\s*(?:FROM\s+.+?)?"
    r"(?:\s+WHERE\s+(?P<where>.*))?$", re.IGNORECASE | re.DOTALL)
_PV = re.compile(r"^\s*POLICY_VIOLATION\s*:\s*([^:]+?)\s*:\s*(.*)$", re.DOTALL)
_CASE_RAISE = re.compile(r"RAISE\s*\(\s*(?:ABORT|FAIL|ROLLBACK)\s*,\s*'((?:[^']|'')*)'\s*\)", re.IGNORECASE)


def _write_effect(stmt: str) -> Effect | None:
    s = stmt.strip()
    m = re.match(r"(?:INSERT|REPLACE)\s+(?:OR\s+\w+\s+)?INTO\s+(\"[^\"]+\"|\w+)\s*(\(([^()]*)\))?", s, re.IGNORECASE)
    if m:
        cols = [_unq(c) for c in m.group(3).split(",")] if m.group(3) else []
        return Effect("inserts into", _unq(m.group(1)), [c.strip() for c in cols if c.strip()])
    m = re.match(r"UPDATE\s+(?:OR\s+\w+\s+)?(\"[^\"]+\"|\w+)\s+SET\s+(.*)$", s, re.IGNORECASE | re.DOTALL)
    if m:
        rest = m.group(2)
        # column names at depth 0 right before '=' (not '==')
        cols: list[str] = []
        depth = 0
        for tm in re.finditer(r"'(?:[^']|'')*'|[()]|(?:(?<=^)|(?<=,))\s*(\"[^\"]+\"|\w+)\s*=(?!=)|\bWHERE\b", rest,
                              re.IGNORECASE):
            tok = tm.group(0)
            if tok == "(":
                depth += 1
            elif tok == ")":
                depth -= 1
            elif depth == 0 and tok.upper() == "WHERE":
                break
            elif depth == 0 and tm.group(1):
                cols.append(_unq(tm.group(1)))
        return Effect("updates", _unq(m.group(1)), cols)
    m = re.match(r"DELETE\s+FROM\s+(\"[^\"]+\"|\w+)", s, re.IGNORECASE)
    if m:
        return Effect("deletes from", _unq(m.group(1)), [])
    return None


def _strip_comments(sql: str) -> str:
    from toolkit.envs.sqlite import _split_comments

    return _split_comments(sql)[0]


def _body_of(sql: str) -> str:
    code = _strip_comments(sql)
    m = re.search(r"\bBEGIN\b(.*)$", code, re.IGNORECASE | re.DOTALL)
    return m.group(1) if m else ""


def _direct_tools(table: str, event: str) -> list[str]:
    return [f"{event.lower()}_{table}"] if event in ("INSERT", "UPDATE") else []


def analyze(domain: Any) -> DomainAnalysis:
    """Analyze the triggers of a compiled sqlite domain.

    `domain`: a SqliteEnvironment, a CompiledDomain, or a path (directory / JSON / YAML file).
    Deterministic: the same domain gives the same analysis.
    """
    from toolkit.envs.sqlite import (
        CompiledDomain,
        SqliteEnvironment,
        compiled_from_path,
    )

    if isinstance(domain, SqliteEnvironment):
        dom = domain.domain
    elif isinstance(domain, CompiledDomain):
        dom = domain
    elif isinstance(domain, (str, Path)):
        dom = compiled_from_path(domain)
    else:
        raise TypeError(f"analyze() needs a SqliteEnvironment, CompiledDomain or path, got {type(domain).__name__}")
    # one analysis per compiled domain (by identity; the entry keeps the domain alive): the
    # synthesis and the violation search ask for it again per rule. Callers only read it.
    hit = _ANALYZED.get(id(dom))
    if hit is not None and hit[0] is dom:
        return hit[1]
    out = _analyze(dom)
    _ANALYZED[id(dom)] = (dom, out)
    while len(_ANALYZED) > 16:
        _ANALYZED.pop(next(iter(_ANALYZED)))
    return out


_ANALYZED: dict[int, tuple[Any, DomainAnalysis]] = {}


def _analyze(dom: Any) -> DomainAnalysis:
    # which tools write each table (directly, or through AFTER-trigger cascades)
    writers: dict[tuple[str, str], list[str]] = {}  # (table, event) -> tools
    for t in dom.tables:
        for ev in ("INSERT", "UPDATE"):
            writers[(t, ev)] = _direct_tools(t, ev)
    after_effects: dict[str, list[Effect]] = {}
    for trg in dom.triggers:
        if trg.timing == "AFTER":
            effs = [e for e in (_write_effect(s) for s in _statements(_body_of(trg.sql))) if e is not None]
            after_effects[trg.name] = effs
    # an UPDATE trigger `OF cols` is fired by a cascade only if the AFTER trigger's UPDATE sets
    # one of those columns; writers are keyed by (table, event) and filtered per trigger below
    cascade_cols: dict[tuple[str, str, str], set[str]] = {}  # (table, event, tool) -> columns set
    changed = True
    while changed:  # fixed point over cascades
        changed = False
        for trg in dom.triggers:
            if trg.timing != "AFTER":
                continue
            src = writers.get((trg.table, trg.event), [])
            for e in after_effects.get(trg.name, []):
                ev = {"inserts into": "INSERT", "updates": "UPDATE"}.get(e.verb)
                if ev is None or (e.table, ev) not in writers:
                    continue
                for tool in src:
                    if tool == f"{ev.lower()}_{e.table}":
                        continue
                    cols = cascade_cols.setdefault((e.table, ev, tool), set())
                    if not set(e.columns) <= cols:
                        cols.update(e.columns)
                        changed = True
                    if tool not in writers[(e.table, ev)]:
                        writers[(e.table, ev)].append(tool)
                        changed = True

    out_triggers: list[TriggerAnalysis] = []
    rules: dict[str, list[RuleCheck]] = {}
    for trg in dom.triggers:
        tools = [tool for tool in writers.get((trg.table, trg.event), _direct_tools(trg.table, trg.event))
                 if tool == f"{trg.event.lower()}_{trg.table}" or not trg.columns
                 or set(trg.columns) & cascade_cols.get((trg.table, trg.event, tool), set())]
        guard = parse_condition(trg.when)
        checks: list[RuleCheck] = []
        unparsed: list[str] = []
        effects = after_effects.get(trg.name, []) if trg.timing == "AFTER" else \
            [e for e in (_write_effect(s) for s in _statements(_body_of(trg.sql))) if e is not None]
        order = 0
        for stmt in _statements(_body_of(trg.sql)):
            m = _RAISE_STMT.match(stmt)
            msgs: list[tuple[str, str | None]] = []
            if m:
                msgs.append((m.group(1).replace("''", "'"), m.group("where")))
            else:  # RAISE inside CASE or elsewhere: the condition is not analyzed
                for cm in _CASE_RAISE.finditer(stmt):
                    msgs.append((cm.group(1).replace("''", "'"), "\x00opaque\x00" + re.sub(r"\s+", " ", stmt)))
            for msg, where_sql in msgs:
                pv = _PV.match(msg)
                if not pv:
                    unparsed.append(msg)
                    continue
                rule, text = pv.group(1).strip(), pv.group(2).strip()
                if where_sql and where_sql.startswith("\x00opaque\x00"):
                    stmt_text = where_sql[len("\x00opaque\x00"):]
                    where = BoolExpr("LEAF", cond=Condition("opaque", "", None, None, stmt_text))
                    where_sql = None
                else:
                    where_sql = re.sub(r"\s+", " ", where_sql).strip() if where_sql else None
                    where = parse_condition(where_sql)
                rc = RuleCheck(rule=rule, message=text, trigger=trg.name, table=trg.table, timing=trg.timing,
                               event=trg.event, columns=list(trg.columns), tools=tools, guard=guard, where=where,
                               guard_sql=trg.when, where_sql=where_sql, order=order)
                order += 1
                checks.append(rc)
                rules.setdefault(rule, []).append(rc)
        out_triggers.append(TriggerAnalysis(
            name=trg.name, table=trg.table, timing=trg.timing, event=trg.event, columns=list(trg.columns),
            tools=tools, guard=guard, guard_sql=trg.when, rules=checks, effects=effects,
            notes=[n for n in trg.notes], unparsed=unparsed))
    return DomainAnalysis(domain=dom.spec.name, triggers=out_triggers, rules=rules)


# ----------------------------------------------------------------------------------------------
# Evaluation of a firing condition against a concrete NEW/OLD row and the env's current state

_REF_RE = re.compile(r"\b(NEW|OLD)\s*\.\s*(\"[^\"]+\"|\w+)", re.IGNORECASE)


def _bind(sql: str) -> tuple[str, list[tuple[str, str]]]:
    """Replace NEW.x / OLD.x outside string literals with named parameters."""
    names: list[tuple[str, str]] = []

    def sub(m: re.Match) -> str:
        which, col = m.group(1).lower(), _unq(m.group(2))
        key = f"{which}_{len(names)}"
        names.append((key, f"{which}:{col}"))
        return f":{key}"

    parts = re.split(r"('(?:[^']|'')*')", sql)
    return "".join(p if i % 2 else _REF_RE.sub(sub, p) for i, p in enumerate(parts)), names


@functools.lru_cache(maxsize=4096)
def _bound_query(sql: str) -> tuple[str, tuple[tuple[str, str, str], ...]]:
    """`evaluate`'s SELECT for `sql` and its parameters (key, new|old, column), once per text."""
    text, names = _bind(sql)
    return (f"SELECT CASE WHEN ({text}) THEN 1 ELSE 0 END",
            tuple((key, *spec.split(":", 1)) for key, spec in names))


def evaluate(env: Any, sql: str | None, new: dict | None = None, old: dict | None = None) -> bool | None:
    """Does the boolean SQL expression `sql` (a RuleCheck.sql, guard or WHERE) hold for the row
    values `new` (NEW.x) and `old` (OLD.x) in env's current state? Read-only (one SELECT).

    Returns None when the expression cannot be evaluated (a missing NEW/OLD value, SQL error).
    `env` is a SqliteEnvironment or a sqlite3.Connection.
    """
    if not sql or not sql.strip():
        return True
    q, names = _bound_query(sql)
    params: dict[str, Any] = {}
    for key, which, col in names:
        row = new if which == "new" else old
        if row is None or col not in row:
            return None
        v = row[col]
        params[key] = int(v) if isinstance(v, bool) else v
    try:
        if isinstance(env, sqlite3.Connection):
            r = env.execute(q, params).fetchone()
        else:
            r = env.evaluate_sql(q, params)
    except sqlite3.Error:
        return None
    return bool(r[0]) if r else None


def domain_analysis(env: Any):
    """The trigger analysis of the domain (`analyze`), None when it fails: boundary search then
    falls back to executing calls."""
    try:
        return analyze(env)
    except Exception:  # noqa: BLE001 - any analysis failure: the search falls back to executing calls
        return None
