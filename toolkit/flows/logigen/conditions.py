"""SQL firing conditions as data: `Operand`, `Condition`, `BoolExpr` parsed from a trigger's WHEN /
RAISE condition (sqlexpr's parser; what it cannot parse is an `opaque` condition, never an
exception), and the numeric `Threshold`s read off them (the N-1 seeds). The trigger analysis
(analysis.py) builds on these and re-exports them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from toolkit.flows.logigen.sqlexpr import AGGS, ParseError, Parser


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
        for o in self.operands():
            for r in o.refs:
                if r not in out:
                    out.append(r)
        return out

    def operands(self) -> list[Operand]:
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
        return [o.text for o in self.operands() if o.kind == "func"]

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
        elif c[0] == "FUNC" and c[1] in AGGS:
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
        p = Parser(sql)
        node = p.expr()
        if p.peek() is not None:
            raise ParseError(f"trailing text {p.span(p.i, len(p.toks))!r}")
        b = _bool(node)
        # a bare non-boolean expression (e.g. `WHERE NEW.flag`) is opaque
        return b
    except (ParseError, RecursionError) as e:
        return BoolExpr("LEAF", cond=Condition("opaque", "", None, None, re.sub(r"\s+", " ", sql).strip()
                                               + f"  -- not analyzed: {e}"))


# ----------------------------------------------------------------------------------------------
# Thresholds (numeric boundaries -> N-1 seeds)

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!=", "IS": "IS", "IS NOT": "IS NOT"}


def threshold_of(c: Condition) -> Threshold | None:
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
