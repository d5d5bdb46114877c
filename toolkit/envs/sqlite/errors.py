"""SQLite errors of a tool call as the structured tool errors the agent sees: a trigger's RAISE as
POLICY_VIOLATION (with the rule's hint), constraints as CONSTRAINT (with what they require),
the time budget as TIMEOUT and the size cap as EXECUTION_ERROR (docs/sandbox.md)."""

from __future__ import annotations

import re
import sqlite3

from toolkit.envs.base import ToolResult
from toolkit.envs.sqlite.domain import CompiledDomain, Table
from toolkit.envs.sqlite.guard import is_full
from toolkit.envs.sqlite.sqltext import _PV_RE, _check_clauses, _short
from toolkit.sandbox.limits import SandboxLimits


def tool_error(e: sqlite3.Error, t: Table, kind: str, domain: CompiledDomain, timed_out: bool,
               limits: SandboxLimits) -> ToolResult:
    """The structured error of a `kind` call (query / insert / update) on table `t` that raised `e`
    (the call is rolled back by then); `timed_out`: `e` is the interrupt of the call's time budget."""
    msg = str(e)
    tool = f"{kind}_{t.name}"
    if timed_out:
        return ToolResult.fail(
            "TIMEOUT", f"{tool}: its SQL (the triggers it fires included) ran longer than "
            f"{limits.wall_seconds:g} s (the operator's wall_seconds) and was stopped",
            None, "the call was rolled back; the state is unchanged")
    if is_full(e):
        return ToolResult.fail(
            "EXECUTION_ERROR", f"{tool}: the database is full: it may hold at most "
            f"{limits.db_size_mb} MB (the operator's db_size_mb)", None,
            "the call was rolled back; the state is unchanged")
    pv = _PV_RE.match(msg)
    if pv:
        rule, text = pv.group(1).strip(), pv.group(2).strip()
        info = domain.rules.get(rule) or {}
        hint = info.get("hint") or f"see the preconditions in the description of {tool}"
        return ToolResult.fail("POLICY_VIOLATION", text, rule, hint)
    for trg in domain.triggers:  # a RAISE message not in the POLICY_VIOLATION format
        if msg in trg.raw_messages:
            return ToolResult.fail("POLICY_VIOLATION", msg, trg.name,
                                   f"see the preconditions in the description of {tool}")
    if isinstance(e, sqlite3.IntegrityError):
        m = re.match(r"(NOT NULL|UNIQUE|CHECK) constraint failed: (.*)$", msg)
        if m:
            kind_c, what = m.group(1), m.group(2).strip()
            if kind_c == "NOT NULL":
                hint = f"{what} must have a value"
            elif kind_c == "UNIQUE":
                hint = f"a row with the same {what} already exists; use query_{t.name} to find it"
            else:
                checks = [c for c in _check_clauses(t.sql) if c == what] or _check_clauses(t.sql)
                hint = ("the values must satisfy: " + "; ".join(checks)) if checks else \
                    "the value is outside the allowed range"
            return ToolResult.fail("CONSTRAINT", msg, f"{kind_c} {what}", _short(hint, 600))
        if "FOREIGN KEY" in msg:
            refs = [f"{t.name}.{fk['column']} -> {fk['table']}.{fk['to'] or 'rowid'}" for fk in t.fks]
            hint = "a referenced row does not exist" + (f" ({'; '.join(refs)})" if refs else "") + \
                   "; query the referenced table first"
            return ToolResult.fail("CONSTRAINT", msg, "FOREIGN KEY", hint)
        return ToolResult.fail("CONSTRAINT", msg, None, f"see the description of {tool}")
    if isinstance(e, sqlite3.DataError) or "too big" in msg or "too many" in msg:
        return ToolResult.fail("INVALID_ARGUMENTS", msg, None, "check the argument values")
    return ToolResult.fail("EXECUTION_ERROR", msg, None, "the call was rolled back; the state is unchanged")
