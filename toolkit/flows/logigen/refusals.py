"""Refusals the goal explorer need not run again: which (write tool, rule) refusals are a function
of the call's arguments and some tables' rows alone (`failure_scopes`, read off the trigger
analysis), and the memo that keys them on exactly that (`Refusals`).

A chain step tries up to 24 candidate writes and most are refused by a rule (citypermits: 89% of
the walker's write calls). A refusal remembered under the whole state's hash only helps on that
very state, and an insert's fresh key makes every candidate new; keyed on what the rule reads, a
refusal carries over to every state whose read tables hold the same rows
(`SqliteEnvironment.table_ids()`).
"""

from __future__ import annotations

import re
from typing import Any

from toolkit.flows.logigen.reach import _FROM

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


_ABSENT = object()  # an argument the call does not pass (its default / the row's value)
_MAX_ENTRIES = 200000


class Refusals:
    """(tool, scope, the values of the arguments the rule reads, the content ids of its tables)
    -> the rule that refused such a call. `scopes`: `failure_scopes(...)`."""

    def __init__(self, scopes: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]):
        self.scopes = scopes
        self.by_tool: dict[str, list[tuple]] = {}  # tool -> the distinct scopes of its rules
        for (tool, _), scope in sorted(scopes.items()):
            if scope not in self.by_tool.setdefault(tool, []):
                self.by_tool[tool].append(scope)
        self._memo: dict = {}

    def __bool__(self) -> bool:
        return bool(self.by_tool)

    @staticmethod
    def _key(name: str, args: dict, scope: tuple, ids: dict) -> tuple:
        tabs, cols = scope
        return (name, scope, tuple(args.get(c, _ABSENT) for c in cols), tuple(ids[t] for t in tabs))

    def known(self, name: str, args: dict, ids: dict) -> str | None:
        """The rule that refused a call of `name` agreeing with `args` on what the rule reads, on a
        state whose read tables had the rows they have under `ids` (`table_ids()`); or None.
        `args`' values must be hashable."""
        for scope in self.by_tool.get(name, ()):
            rule = self._memo.get(self._key(name, args, scope, ids))
            if rule is not None:
                return rule
        return None

    def remember(self, name: str, args: dict, rule: str, ids: dict) -> None:
        """A call of `name` with `args` was refused by `rule` on the state whose `table_ids()` are
        `ids` (kept only for a pair `failure_scopes` vouches for)."""
        scope = self.scopes.get((name, rule))
        if scope is not None:
            if len(self._memo) >= _MAX_ENTRIES:
                self._memo.clear()
            self._memo[self._key(name, args, scope, ids)] = rule
