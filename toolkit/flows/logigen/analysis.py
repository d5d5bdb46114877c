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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.envs.sqlite import CompiledDomain, SqliteEnvironment, _split_comments, compiled_from_path
from toolkit.flows.logigen.conditions import BoolExpr, Condition, Operand, Threshold, parse_condition, threshold_of
from toolkit.flows.logigen.sqlexpr import unquote

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
            t = threshold_of(c)
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
        cols = [unquote(c) for c in m.group(3).split(",")] if m.group(3) else []
        return Effect("inserts into", unquote(m.group(1)), [c.strip() for c in cols if c.strip()])
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
                cols.append(unquote(tm.group(1)))
        return Effect("updates", unquote(m.group(1)), cols)
    m = re.match(r"DELETE\s+FROM\s+(\"[^\"]+\"|\w+)", s, re.IGNORECASE)
    if m:
        return Effect("deletes from", unquote(m.group(1)), [])
    return None


def _strip_comments(sql: str) -> str:
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
        which, col = m.group(1).lower(), unquote(m.group(2))
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
