"""A small recursive-descent parser of SQLite expressions (the subset trigger WHEN/WHERE clauses
use): comparisons, AND/OR/NOT, IS [NOT] [DISTINCT FROM], [NOT] IN (list | subquery), [NOT] EXISTS,
LIKE/GLOB, BETWEEN, scalar subqueries (SELECT cols FROM tables [JOIN ... ON] [WHERE ...]),
arithmetic, function calls, CAST, CASE (a CASE outside this grammar is kept as opaque text).

`Parser(sql).expr()` returns tuple nodes ("OR"|"AND", items, text), ("NOT", node, text),
("CMP", op, l, r, text), ("NULL", op, node, text), ("IN", op, l, rhs, text),
("EXISTS", op, subquery, text), ("LIKE", op, l, r, text), ("BETWEEN", op, x, lo, hi, text),
("ARITH", op, l, r, text), ("LIT", value, text), ("COL", qualifier, name, text),
("FUNC", NAME, args, text), ("SUB", subquery, text), ("LIST", items, text),
("CASE", base | None, [(when, then)], else | None, text), ("OPAQUE", text);
a subquery is {"cols", "tables": [(name, alias)], "where": node | None, "text"}. Errors raise
`ParseError`. Used by toolkit.flows.logigen.analysis, which turns nodes into data.
"""

from __future__ import annotations

import re
from typing import Any

# ----------------------------------------------------------------------------------------------
# Tokenizer and expression parser (SQLite expression subset)

_TOK = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<qid>\"(?:[^\"]|\"\")*\"|\[[^\]]*\]|`[^`]*`)"
    r"|(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)|(?P<param>[?:@$]\w*)"
    r"|(?P<id>[A-Za-z_][\w$]*)|(?P<op><=|>=|<>|!=|==|\|\||<<|>>|[-+*/%<>=(),.~&|;]))",
    re.DOTALL,
)


class _Tok:
    __slots__ = ("end", "kind", "start", "text")

    def __init__(self, kind: str, text: str, start: int, end: int):
        self.kind, self.text, self.start, self.end = kind, text, start, end

    @property
    def up(self) -> str:
        return self.text.upper() if self.kind == "id" else self.text


def _tokenize(sql: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    n = len(sql)
    while pos < n:
        if sql[pos:].strip() == "":
            break
        m = _TOK.match(sql, pos)
        if not m or m.end() == pos:
            raise ParseError(f"cannot tokenize at {sql[pos:pos + 20]!r}")
        kind = m.lastgroup or "op"
        text = m.group(kind)
        toks.append(_Tok(kind, text, m.start(kind), m.end(kind)))
        pos = m.end()
    return toks


class ParseError(ValueError):
    pass


AGGS = {"COUNT", "SUM", "MIN", "MAX", "AVG", "TOTAL", "GROUP_CONCAT"}
_CMP = {"=", "==", "!=", "<>", "<", "<=", ">", ">="}


class Parser:
    """Recursive descent over tokens; nodes are tuples ("kind", ...) with source spans."""

    def __init__(self, sql: str):
        self.sql = sql
        self.toks = _tokenize(sql)
        self.i = 0

    # helpers
    def peek(self, k: int = 0) -> _Tok | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def at(self, *words: str) -> bool:
        t = self.peek()
        return t is not None and t.up in words

    def take(self, *words: str) -> _Tok:
        t = self.peek()
        if t is None or (words and t.up not in words):
            raise ParseError(f"expected {' or '.join(words) or 'a token'}, got {t.text if t else 'end'!r}")
        self.i += 1
        return t

    def span(self, a: int, b: int) -> str:
        if a >= b:
            return ""
        return re.sub(r"\s+", " ", self.sql[self.toks[a].start:self.toks[b - 1].end]).strip()

    # grammar: or > and > not > equality-ish > relational > additive > multiplicative > concat > unary
    def expr(self) -> tuple:
        return self.or_()

    def or_(self) -> tuple:
        a = self.i
        items = [self.and_()]
        while self.at("OR"):
            self.take()
            items.append(self.and_())
        return items[0] if len(items) == 1 else ("OR", items, self.span(a, self.i))

    def and_(self) -> tuple:
        a = self.i
        items = [self.not_()]
        while self.at("AND"):
            self.take()
            items.append(self.not_())
        return items[0] if len(items) == 1 else ("AND", items, self.span(a, self.i))

    def not_(self) -> tuple:
        a = self.i
        if self.at("NOT") and not (self.peek(1) and self.peek(1).up == "EXISTS"):
            self.take()
            inner = self.not_()
            return ("NOT", inner, self.span(a, self.i))
        return self.equality()

    def equality(self) -> tuple:
        a = self.i
        left = self.relational()
        while True:
            t = self.peek()
            if t is None:
                return left
            up = t.up
            if up in ("=", "==", "!=", "<>"):
                self.take()
                right = self.relational()
                left = ("CMP", "!=" if up in ("!=", "<>") else "=", left, right, self.span(a, self.i))
            elif up == "IS":
                self.take()
                neg = False
                if self.at("NOT"):
                    self.take()
                    neg = True
                if self.at("DISTINCT"):
                    self.take()
                    self.take("FROM")
                    neg = not neg
                right = self.relational()
                if right[0] == "LIT" and right[1] is None:
                    left = ("NULL", "IS NOT NULL" if neg else "IS NULL", left, self.span(a, self.i))
                else:
                    left = ("CMP", "IS NOT" if neg else "IS", left, right, self.span(a, self.i))
            elif up in ("NOTNULL", "ISNULL"):
                self.take()
                left = ("NULL", "IS NOT NULL" if up == "NOTNULL" else "IS NULL", left, self.span(a, self.i))
            elif up == "NOT" and self.peek(1) and self.peek(1).up in ("IN", "LIKE", "GLOB", "BETWEEN", "NULL"):
                self.take()
                left = self._postfix(left, a, negated=True)
            elif up in ("IN", "LIKE", "GLOB", "BETWEEN"):
                left = self._postfix(left, a, negated=False)
            else:
                return left

    def _postfix(self, left: tuple, a: int, negated: bool) -> tuple:
        t = self.take()
        up = t.up
        if up == "NULL":
            return ("NULL", "IS NOT NULL", left, self.span(a, self.i))
        if up == "IN":
            self.take("(")
            if self.at("SELECT"):
                sub = self.subquery_body()
                self.take(")")
                return ("IN", "NOT IN" if negated else "IN", left, sub, self.span(a, self.i))
            items = []
            if not self.at(")"):
                items.append(self.expr())
                while self.at(","):
                    self.take()
                    items.append(self.expr())
            self.take(")")
            return ("IN", "NOT IN" if negated else "IN", left, ("LIST", items, ""), self.span(a, self.i))
        if up in ("LIKE", "GLOB"):
            right = self.relational()
            if self.at("ESCAPE"):
                self.take()
                self.relational()
            op = up if not negated else f"NOT {up}"
            return ("LIKE", op, left, right, self.span(a, self.i))
        # BETWEEN
        low = self.relational()
        self.take("AND")
        high = self.relational()
        return ("BETWEEN", "NOT BETWEEN" if negated else "BETWEEN", left, low, high, self.span(a, self.i))

    def relational(self) -> tuple:
        a = self.i
        left = self.additive()
        while self.at("<", "<=", ">", ">="):
            op = self.take().text
            right = self.additive()
            left = ("CMP", op, left, right, self.span(a, self.i))
        return left

    def additive(self) -> tuple:
        a = self.i
        left = self.mult()
        while self.at("+", "-"):
            op = self.take().text
            right = self.mult()
            left = ("ARITH", op, left, right, self.span(a, self.i))
        return left

    def mult(self) -> tuple:
        a = self.i
        left = self.concat()
        while self.at("*", "/", "%"):
            op = self.take().text
            right = self.concat()
            left = ("ARITH", op, left, right, self.span(a, self.i))
        return left

    def concat(self) -> tuple:
        a = self.i
        left = self.unary()
        while self.at("||"):
            self.take()
            right = self.unary()
            left = ("ARITH", "||", left, right, self.span(a, self.i))
        return left

    def unary(self) -> tuple:
        a = self.i
        if self.at("-", "+"):
            op = self.take().text
            inner = self.unary()
            if inner[0] == "LIT" and isinstance(inner[1], (int, float)):
                return ("LIT", -inner[1] if op == "-" else inner[1], self.span(a, self.i))
            return ("ARITH", op, ("LIT", 0, "0"), inner, self.span(a, self.i))
        return self.primary()

    def _case(self, a: int) -> tuple:
        """CASE [base] WHEN w THEN t ... [ELSE e] END -> ("CASE", base | None, [(w, t)], e | None, text)."""
        self.take("CASE")
        base = None if self.at("WHEN") else self.expr()
        arms = []
        while self.at("WHEN"):
            self.take()
            w = self.expr()
            self.take("THEN")
            arms.append((w, self.expr()))
        if not arms:
            raise ParseError("CASE without WHEN")
        els = None
        if self.at("ELSE"):
            self.take()
            els = self.expr()
        self.take("END")
        return ("CASE", base, arms, els, self.span(a, self.i))

    def primary(self) -> tuple:
        a = self.i
        t = self.peek()
        if t is None:
            raise ParseError("unexpected end of expression")
        if t.kind == "str":
            self.take()
            return ("LIT", t.text[1:-1].replace("''", "'"), t.text)
        if t.kind == "num":
            self.take()
            v: Any = float(t.text) if any(c in t.text for c in ".eE") else int(t.text)
            return ("LIT", v, t.text)
        if t.kind == "param":
            self.take()
            return ("OPAQUE", t.text)
        if t.text == "(":
            self.take()
            if self.at("SELECT"):
                sub = self.subquery_body()
                self.take(")")
                return ("SUB", sub, self.span(a, self.i))
            inner = self.expr()
            if self.at(","):  # row value
                while self.at(","):
                    self.take()
                    self.expr()
                self.take(")")
                return ("OPAQUE", self.span(a, self.i))
            self.take(")")
            return inner
        if t.up == "NOT" and self.peek(1) and self.peek(1).up == "EXISTS":
            self.take()
            self.take()
            self.take("(")
            sub = self.subquery_body()
            self.take(")")
            return ("EXISTS", "NOT EXISTS", sub, self.span(a, self.i))
        if t.up == "EXISTS":
            self.take()
            self.take("(")
            sub = self.subquery_body()
            self.take(")")
            return ("EXISTS", "EXISTS", sub, self.span(a, self.i))
        if t.up == "NULL":
            self.take()
            return ("LIT", None, "NULL")
        if t.up in ("TRUE", "FALSE"):
            self.take()
            return ("LIT", 1 if t.up == "TRUE" else 0, t.text)
        if t.up in ("CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP"):
            self.take()
            return ("FUNC", t.up, [], t.text)
        if t.up == "CASE":
            save = self.i
            try:
                return self._case(a)
            except ParseError:
                self.i = save  # a CASE this grammar does not cover: its text, unparsed
            depth = 0
            while self.peek() is not None:
                w = self.take().up
                if w == "CASE":
                    depth += 1
                elif w == "END":
                    depth -= 1
                    if depth == 0:
                        break
            return ("OPAQUE", self.span(a, self.i))
        if t.up == "CAST":
            self.take()
            self.take("(")
            inner = self.expr()
            self.take("AS")
            while not self.at(")"):
                self.take()
            self.take(")")
            return ("FUNC", "CAST", [inner], self.span(a, self.i))
        if t.up == "RAISE":
            raise ParseError("RAISE inside an expression")
        if t.kind in ("id", "qid"):
            self.take()
            name = unquote(t.text)
            if self.at("("):  # function call
                self.take()
                args: list[tuple] = []
                if self.at("DISTINCT"):
                    self.take()
                if self.at("*"):
                    self.take()
                    args.append(("STAR",))
                elif not self.at(")"):
                    args.append(self.expr())
                    while self.at(","):
                        self.take()
                        args.append(self.expr())
                self.take(")")
                return ("FUNC", name.upper(), args, self.span(a, self.i))
            if self.at(".") and self.peek(1) is not None and self.peek(1).kind in ("id", "qid"):
                self.take()
                col = unquote(self.take().text)
                return ("COL", name, col, self.span(a, self.i))
            return ("COL", None, name, self.span(a, self.i))
        raise ParseError(f"unexpected token {t.text!r}")

    def subquery_body(self) -> dict:
        """SELECT <cols> FROM <tables> [WHERE expr] [GROUP/ORDER/LIMIT ...]; the current token is SELECT."""
        a = self.i
        self.take("SELECT")
        if self.at("DISTINCT", "ALL"):
            self.take()
        cols: list[tuple] = []
        cols.append(self._result_col())
        while self.at(","):
            self.take()
            cols.append(self._result_col())
        tables: list[tuple[str, str]] = []
        joins_on: list[tuple] = []
        if self.at("FROM"):
            self.take()
            while True:
                tt = self.take()
                if tt.text == "(":
                    raise ParseError("nested FROM subqueries are not analyzed")
                tname = unquote(tt.text)
                alias = tname
                if self.at("AS"):
                    self.take()
                    alias = unquote(self.take().text)
                elif self.peek() is not None and self.peek().kind in ("id", "qid") and self.peek().up not in (
                        "WHERE", "JOIN", "INNER", "LEFT", "CROSS", "NATURAL", "ON", "ORDER", "GROUP", "LIMIT",
                        "USING", "OUTER"):
                    alias = unquote(self.take().text)
                tables.append((tname, alias))
                if self.at("ON"):
                    self.take()
                    joins_on.append(self.expr())
                if self.at(","):
                    self.take()
                    continue
                if self.at("JOIN", "INNER", "LEFT", "CROSS", "NATURAL"):
                    while self.at("INNER", "LEFT", "CROSS", "NATURAL", "OUTER"):
                        self.take()
                    self.take("JOIN")
                    continue
                break
        where = None
        if self.at("WHERE"):
            self.take()
            where = self.expr()
        for on in joins_on:
            where = on if where is None else ("AND", [where, on], "")
        # skip GROUP BY / ORDER BY / LIMIT up to the closing parenthesis of the subquery
        depth = 0
        while self.peek() is not None:
            t = self.peek()
            if t.text == "(":
                depth += 1
            elif t.text == ")":
                if depth == 0:
                    break
                depth -= 1
            self.take()
        return {"cols": cols, "tables": tables, "where": where, "text": self.span(a, self.i)}

    def _result_col(self) -> tuple:
        if self.at("*"):
            self.take()
            return ("STAR",)
        e = self.expr()
        if self.at("AS"):
            self.take()
            self.take()
        return e


def unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and ((s[0] == s[-1] == '"') or (s[0] == s[-1] == "`")):
        return s[1:-1].replace('""', '"')
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]":
        return s[1:-1]
    return s
