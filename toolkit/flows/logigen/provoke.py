"""The provocation search of the domain check (check 8, `provoked`): find one tool call that makes a
rule fire, from candidate arguments and states derived from the analyzed condition, then a search
over existing rows × tool schemas (single and joint mutations of valid calls, and a second call
after a successful one). `find_violating_call` is the public entry point; `domain_check` runs it
per rule."""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import itertools
import re
from typing import Any

from toolkit.envs.sqlite import DomainError, SqliteEnvironment, _split_comments
from toolkit.flows.logigen.analysis import Operand, analyze, evaluate

__all__ = ["find_violating_call"]

MAX_CALLS_PER_RULE = 4000
_SPENT = object()  # a violation search ran out of calls
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def named_checks(schema_sql: str) -> dict[str, str]:
    """{constraint name: table} for `CONSTRAINT <name> CHECK (...)` in the DDL."""
    code, _ = _split_comments(schema_sql)
    out: dict[str, str] = {}
    for tm in re.finditer(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\"[^\"]+\"|\w+)\s*\((.*?)\)\s*(?:WITHOUT\s+ROWID\s*)?;",
                          code, re.IGNORECASE | re.DOTALL):
        for cm in re.finditer(r"CONSTRAINT\s+(\"[^\"]+\"|\w+)\s+CHECK\b", tm.group(2), re.IGNORECASE):
            out[cm.group(1).strip('"')] = tm.group(1).strip('"')
    return out


def short_args(a: dict) -> str:
    s = ", ".join(f"{k}={v!r}" for k, v in a.items())
    return s if len(s) < 120 else s[:117] + "..."


def _dates_around(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values[:12]:
        try:
            d = _dt.date.fromisoformat(v)
        except ValueError:
            continue
        for k in (0, 1, -1, 2, 3, 4, 5, 6, 7, 14, 29, 30, 31, 60, -2, -7, -30):
            s = (d + _dt.timedelta(days=k)).isoformat()
            if s not in out:
                out.append(s)
    return out


class ViolationSearch:
    def __init__(self, dom: Any, an: Any, env: Any, max_calls: int, base_state: dict | None = None,
                 derive_states: bool = True, sides: tuple[str, ...] = ("agent", "user")):
        self.dom, self.an, self.env, self.max_calls = dom, an, env, max_calls
        self.base_state, self.derive = base_state, derive_states
        self.visible = set()
        for side in sides:
            self.visible |= set(env.tool_names(side))
        self._agent_tools = frozenset(env.tool_names("agent"))  # side_of, asked for every call tried
        if base_state is not None:
            env.reset(base_state)
        self.snapshot0 = env.snapshot()
        self.calls = 0
        # every value of every column, and every date-like value anywhere
        self.colvals: dict[tuple[str, str], list] = {}
        dates: list[str] = []
        for tname, rows in self.snapshot0.items():
            for row in rows:
                for k, v in row.items():
                    lst = self.colvals.setdefault((tname, k), [])
                    if v not in lst and len(lst) < 40:
                        lst.append(v)
                    if isinstance(v, str) and _DATE_RE.match(v) and v not in dates:
                        dates.append(v)
        self.dates = _dates_around(sorted(dates)) if dates else []

    def side_of(self, tool: str) -> str:
        return "agent" if tool in self._agent_tools else "user"

    # -- candidate values ----------------------------------------------------------------------

    def pool(self, table: str, col: str, checks: list) -> list:
        t = self.dom.tables[table]
        c = t.colmap[col]
        vals: list = []

        def add(v: Any) -> None:
            if v not in vals:
                vals.append(v)

        ref_new, ref_old = f"NEW.{col}", f"OLD.{col}"
        for rc in checks:
            for th in rc.thresholds:
                if th.ref in (ref_new, ref_old):
                    add(th.violating)
            for cond in rc.conditions:
                ops = cond.operands()
                if not any(ref_new in o.refs or ref_old in o.refs or o.ref in (ref_new, ref_old) for o in ops):
                    continue
                for o in ops:
                    if o.kind == "literal":
                        add(o.value)
                    elif o.kind == "list":
                        for x in o.value:
                            if x.kind == "literal":
                                add(x.value)
                    elif o.kind == "subquery" and o.table in self.dom.tables:
                        for k, ko in o.keys.items():
                            if ko.ref in (ref_new, ref_old):
                                kc = k.split(".")[-1]
                                ktable = o.tables.get(k.split(".")[0], o.table) if "." in k else o.table
                                for v in self.colvals.get((ktable, kc), []):
                                    add(v)
                        if o.column and (o.ref is None):
                            for v in self.colvals.get((o.table, o.column), []):
                                if isinstance(v, (int, float)) and not isinstance(v, bool):
                                    add(v + 1)
                                    add(v)
                if cond.kind == "like" and isinstance(cond.rhs, Operand) and cond.rhs.kind == "literal":
                    pat = str(cond.rhs.value)
                    add("x")
                    add(pat.replace("%", "a").replace("_", "a"))
        for fk in t.fks:
            if fk["column"] == col:
                for v in self.colvals.get((fk["table"], fk["to"] or ""), []):
                    add(v)
        if c.enum:
            for v in c.enum:
                add(v)
        for v in self.colvals.get((table, col), []):
            add(v)
        if c.json_type in ("integer", "number"):
            for v in vals[:]:  # a copy: vals grows below
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    add(v + 1)
                    add(v - 1)
            for v in (0, 1, -1, 1_000_000):
                add(v)
        elif c.json_type == "boolean":
            add(0)
            add(1)
        elif c.json_type == "string" or c.json_type is None:
            if any(isinstance(v, str) and _DATE_RE.match(v) for v in self.colvals.get((table, col), [])) or \
                    "date" in col.lower() or "_on" in col.lower():
                for d in self.dates:
                    add(d)
            add("x")
            add("")
            add("probe-" + "x" * 40)
        return [v for v in vals if v is not None or c.nullable]

    def joint(self, rc: Any) -> list[dict]:
        """Joint assignments of NEW columns from the rows of a subquery keyed by them."""
        out: list[dict] = []
        for cond in rc.conditions:
            for o in cond.operands():
                if o.kind != "subquery" or o.table not in self.dom.tables:
                    continue
                newkeys = {k: ko.column for k, ko in o.keys.items() if ko.kind == "new" and "." not in k}
                if len(newkeys) < 2:
                    continue
                for row in self.snapshot0.get(o.table, []):
                    a = {col: row.get(k) for k, col in newkeys.items()}
                    if a not in out:
                        out.append(a)
        return out[:60]

    # -- templates -----------------------------------------------------------------------------

    def insert_templates(self, table: str) -> list[dict]:
        """Insert arguments modelled on existing rows. A key made of references (an enrollment
        keyed by (student_id, section_id)) is not invented: one key column at a time takes
        another value of the table it references, the others stay the row's, so the new row
        pairs a real student with another real section (never a made-up id that only breaks a
        foreign key)."""
        t = self.dom.tables[table]
        settable = [c for c in t.columns if not c.readonly]
        out: list[dict] = []
        rows = self.snapshot0.get(table, [])
        pk = [c for c in t.columns if c.pk and not c.rowid_alias]
        ref = {fk["column"]: fk for fk in t.fks if any(c.name == fk["column"] for c in pk)}
        existing = {tuple(r.get(c.name) for c in pk) for r in rows}
        for row in rows[:15]:
            args = {}
            for c in settable:
                if c.rowid_alias:
                    continue
                v = row.get(c.name)
                if c.pk:
                    v = self._fresh_key(table, c)
                if v is None and not c.notnull:
                    continue
                args[c.name] = v
            if not ref:
                out.append(args)
                continue
            made = 0
            for c in pk:
                fk = ref.get(c.name)
                choices = (self.colvals.get((fk["table"], fk.get("to") or ""), []) if fk
                           else [self._fresh_key(table, c)])
                for v in choices:
                    key = tuple(v if k is c else row.get(k.name) for k in pk)
                    if key in existing:
                        continue
                    existing.add(key)
                    out.append({**args, **{k.name: x for k, x in zip(pk, key)}})
                    made += 1
                    if made >= 4:
                        break
                if made >= 4:
                    break
        if not out:  # synthesize one from the schema
            args = {}
            for c in settable:
                if c.rowid_alias or (not c.notnull and not c.pk) or c.default is not None:
                    continue
                if c.pk:
                    args[c.name] = self._fresh_key(table, c)
                    continue
                pool = self.pool(table, c.name, [])
                args[c.name] = pool[0] if pool else ("x" if c.json_type != "integer" else 1)
            out.append(args)
        return out

    def _fresh_key(self, table: str, c: Any, also: list | None = None) -> Any:
        """A key for a new row: none of the seed's values of the column, nor `also` (keys the
        calls of this search already gave)."""
        existing = list(self.colvals.get((table, c.name), [])) + [v for v in (also or []) if v is not None]
        if c.json_type in ("integer", "number"):
            nums = [v for v in existing if isinstance(v, (int, float))]
            return int(max(nums, default=0)) + 1000
        return next_key([v for v in existing if v is not None])

    # -- calls ---------------------------------------------------------------------------------

    def try_call(self, tool: str, args: dict, rule: str, kind: str) -> tuple[str, Any]:
        """-> ("hit", result) | ("ok", result) | ("other", result)."""
        self.calls += 1
        before = self.env.state_hash()
        res = self.env.call(tool, args, side=self.side_of(tool))
        if res.ok:
            return "ok", res
        e = res.error or {}
        if kind == "trigger" and e.get("code") == "POLICY_VIOLATION" and e.get("violated_rule") == rule:
            return "hit", (res, before, self.env.state_hash())
        if kind == "check" and e.get("code") == "CONSTRAINT" and rule in str(e.get("message", "")) + str(
                e.get("violated_rule", "")):
            return "hit", (res, before, self.env.state_hash())
        return "other", res

    def provoke(self, rule: str, checks: list, kind: str, table_hint: str | None = None) -> dict | None:
        """Find a call that violates `rule`; returns the report entry or None."""
        self.calls = 0
        states: list[tuple[str, dict | None]] = [("initial", self.base_state)]
        if self.derive:
            states += self.derived_states(checks)
        for state_label, state in states:
            try:
                self.env.reset(state)
            except DomainError:
                continue
            for rc in checks if kind == "trigger" else [None]:
                tools = rc.tools if rc is not None else [f"insert_{table_hint}", f"update_{table_hint}"]
                for tool in tools:
                    if tool not in self.visible or tool not in self.dom.tools:
                        continue
                    td = self.dom.tools[tool]
                    hit = self._search_tool(rule, kind, rc, td, evaluate, state_label, state)
                    if hit is not None:
                        self.env.reset(self.base_state)
                        return hit
                    if self.calls >= self.max_calls:
                        self.env.reset(self.base_state)
                        return None
        self.env.reset(self.base_state)
        return None

    def derived_states(self, checks: list) -> list[tuple[str, dict]]:
        """States where an existing row meets the OLD-row / subquery conditions of the rule."""
        out: list[tuple[str, dict]] = []
        for rc in checks:
            if rc is None:
                continue
            wanted: list[tuple[str, str, Any]] = []  # (table, column, value)
            for cond in rc.conditions:
                if cond.kind in ("compare", "in") and cond.lhs is not None:
                    lhs, rhs = cond.lhs, cond.rhs
                    if cond.kind == "compare" and isinstance(rhs, Operand) and rhs.kind in ("old",) and \
                            lhs.kind == "literal":
                        lhs, rhs = rhs, lhs
                    if lhs.kind == "old" and cond.op in ("=", "IS", "IN") and isinstance(rhs, Operand):
                        if rhs.kind == "literal":
                            wanted.append((rc.table, lhs.column, rhs.value))
                        elif rhs.kind == "list" and rhs.value and rhs.value[0].kind == "literal":
                            wanted.append((rc.table, lhs.column, rhs.value[0].value))
            for th in rc.thresholds:
                ref = th.ref
                if ref.startswith("OLD."):
                    wanted.append((rc.table, ref[4:], th.violating))
                elif not ref.startswith("NEW.") and "(" not in ref:
                    tbl, _, col = ref.partition(".")
                    if tbl in self.dom.tables:
                        wanted.append((tbl, col, th.violating))
            by_table: dict[str, list[tuple[str, Any]]] = {}
            for tbl, col, val in wanted:
                if tbl in self.dom.tables and col in self.dom.tables[tbl].colmap:
                    by_table.setdefault(tbl, []).append((col, val))
            for tbl, sets in by_table.items():
                rows = self.snapshot0.get(tbl, [])
                for i in range(min(len(rows), 6)):
                    st = copy.deepcopy(self.snapshot0)
                    for col, val in sets:
                        st[tbl][i][col] = val
                    label = f"derived: {tbl} row {i} with " + ", ".join(f"{c}={v!r}" for c, v in sets)
                    out.append((label, st))
        return out[:24]

    def _repeat(self, td: Any, rule: str, kind: str, firsts: list[dict], state: dict | None, finish: Any,
                vary: Any = None) -> Any:
        """The first of `firsts` that is accepted, repeated with a fresh key while it is accepted,
        until the rule refuses it (the report entry, its setup = the accepted calls), at most
        REPEAT_STEPS times; _SPENT when the budget runs out, None when none gets refused. A repeat
        another rule refuses (the plate already holds a permit for those days) is tried again with
        `vary(args)`'s variants (one column the rule does not read changed), the first the other
        rules let through taken."""
        t = self.dom.tables[td.table]

        def attempt(args: dict) -> tuple[str, Any, dict]:
            st, res = self.try_call(td.name, args, rule, kind)
            if st == "other" and vary is not None:
                for k, alt in enumerate(vary(args)):
                    if k >= REPEAT_VARIANTS or self.calls >= self.max_calls:
                        break
                    st2, res2 = self.try_call(td.name, alt, rule, kind)
                    if st2 in ("hit", "ok"):
                        return st2, res2, alt
            return st, res, args

        def fresh(args: dict) -> dict:
            # a key none of the rows so far has (the seed's and the setup calls' own)
            args = dict(args)
            for c in t.columns:
                if c.pk and not c.rowid_alias and c.name in args:
                    args[c.name] = (self._fresh_key(t.name, c, also=[a["arguments"].get(c.name) for a in setup]
                                                    + [args[c.name]])
                                    if not isinstance(args[c.name], int) else args[c.name] + 1)
            return args

        tried = 0
        setup: list[dict] = []
        for first in firsts:
            if tried >= 8:
                break
            self.env.reset(state)
            st, res = self.try_call(td.name, first, rule, kind)
            if st != "ok":
                continue
            tried += 1
            setup[:] = [{"name": td.name, "arguments": first}]
            st, res, args = attempt(fresh(first))
            while st == "ok" and len(setup) < REPEAT_STEPS:
                setup.append({"name": td.name, "arguments": args})
                st, res, args = attempt(fresh(args))
            if st == "hit":
                out = finish(td.name, args, res, f"after: {td.name}({short_args(first)})"
                             + (f" x{len(setup)}" if len(setup) > 1 else ""))
                out["setup"] = setup
                self.env.reset(state)
                return out
            if self.calls >= self.max_calls:
                return _SPENT
        self.env.reset(state)
        return None

    def _search_tool(self, rule: str, kind: str, rc: Any, td: Any, evaluate: Any, state_label: str,
                     state: dict | None) -> dict | None:
        t = self.dom.tables[td.table]
        checks = [rc] if rc is not None else []
        settable = [c.name for c in t.columns if not c.readonly and not c.rowid_alias]
        refs = set()
        for c in (rc.conditions if rc is not None else []):
            refs.update(r.split(".", 1)[1] for r in c.refs)
        relevant = [c for c in settable if c in refs or (rc is not None and c in rc.columns)]
        # columns read by the other rules of the same write: they must hold while this one fires
        tool_refs: set[str] = set()
        for other in self.an.rules_of(td.name):
            if other.table == t.name:
                for c in other.conditions:
                    tool_refs.update(r.split(".", 1)[1] for r in c.refs)
        paired = relevant + [c for c in settable if c in tool_refs and c not in relevant]
        others = [c for c in settable if c not in relevant]
        pools = {c: self.pool(t.name, c, checks) for c in settable}
        joint = self.joint(rc) if rc is not None else []

        def units(cols: list[str]) -> list[dict]:
            us = [dict(j) for j in joint]
            for col in cols:
                for v in pools[col]:
                    us.append({col: v})
            return us

        def finish(tool: str, args: dict, res_pack: Any, label: str) -> dict:
            res, before, after = res_pack
            return {"provoked": True, "call": {"name": tool, "arguments": args}, "state": label,
                    "error": res.error, "state_unchanged": before == after, "attempts": self.calls}

        def sweep(calls: Any) -> Any:
            """Try each argument dict from `state` in turn: the first violation's result, _SPENT when
            the call budget runs out first, None when no call violates the rule."""
            for args in calls:
                st, res = self.try_call(td.name, args, rule, kind)
                if st == "hit":
                    return finish(td.name, args, res, state_label)
                if st == "ok":
                    self.env.reset(state)
                if self.calls >= self.max_calls:
                    return _SPENT
            return None

        if td.kind == "insert":
            bases = self.insert_templates(t.name)
            defaults = _defaults(t)
            # phase 1: each template x one mutation unit (relevant columns first)
            valid: list[dict] = []
            for base in bases:
                for u in [{}] + units(relevant) + units(others):
                    args = {**base, **u}
                    if rc is not None and kind == "trigger":
                        new = dict(defaults)
                        new.update(args)
                        if evaluate(self.env, rc.sql, new=new) is False:
                            continue
                    st, res = self.try_call(td.name, args, rule, kind)
                    if st == "hit":
                        return finish(td.name, args, res, state_label)
                    if st == "ok":
                        if len(valid) < 8 and args not in valid:
                            valid.append(args)
                        self.env.reset(state)
                    if self.calls >= self.max_calls:
                        return None
            # phase 1b: valid calls found without the evaluate filter (the rule needs a state change)
            if not valid:
                for base in bases:
                    for u in [{}] + units(settable):
                        args = {**base, **u}
                        st, res = self.try_call(td.name, args, rule, kind)
                        if st == "hit":
                            return finish(td.name, args, res, state_label)
                        if st == "ok":
                            self.env.reset(state)
                            if len(valid) < 8 and args not in valid:
                                valid.append(args)
                            if len(valid) >= 4:
                                break
                        if self.calls >= self.max_calls:
                            return None
                    if len(valid) >= 4:
                        break
            # phase 1c: an accepted call repeated while it is accepted (a count limit: a resident at
            # 2 of 3 visitor permits a month gets the third, and the fourth is refused); cheap, so
            # before the mutation sweeps. The templates the evaluate filter skipped count too (a
            # count below its limit evaluates false on the state the search starts from)
            def vary(args: dict) -> Any:
                for col in others:
                    if col in t.pk:
                        continue
                    for v in [x for x in pools[col] if x != args.get(col)][:3]:
                        yield {**args, col: v}

            got = self._repeat(td, rule, kind, valid + [b for b in bases if b not in valid], state, finish, vary)
            if got is not None:
                return None if got is _SPENT else got
            # phase 2: valid templates x one or two mutation units
            for base in valid:
                got = sweep({**base, **u} for u in units(relevant) + units(others))
                if got is None:
                    got = sweep({**base, **u1, **u2} for u1, u2 in itertools.combinations(units(paired), 2)
                                if not set(u1) & set(u2))
                if got is not None:
                    return None if got is _SPENT else got
            # phase 3: a second call after a successful one (capacity, duplicates, uniqueness)
            for first in valid:
                self.env.reset(state)
                r1 = self.env.call(td.name, first, side=self.side_of(td.name))
                if not r1.ok:
                    continue
                label = f"after: {td.name}({short_args(first)})"
                for u in [{}] + units(relevant) + units(others):
                    args = {**first, **u}
                    for c in t.columns:
                        if c.pk and not c.rowid_alias and c.name in args:
                            args[c.name] = (self._fresh_key(t.name, c, also=[first.get(c.name)])
                                            if not isinstance(args[c.name], int) else args[c.name] + 1)
                    st, res = self.try_call(td.name, args, rule, kind)
                    if st == "hit":
                        out = finish(td.name, args, res, label)
                        out["setup"] = [{"name": td.name, "arguments": first}]
                        return out
                    if st == "ok":
                        self.env.reset(state)
                        self.env.call(td.name, first, side=self.side_of(td.name))
                    if self.calls >= self.max_calls:
                        return None
            return None
            return None

        # update: each row x one or two changes
        rows = self.env.snapshot().get(t.name, [])
        upd_cols = [c for c in settable if c not in t.pk]
        rel_upd = [c for c in upd_cols if c in relevant] + [c for c in upd_cols if c not in relevant]
        for pass_no in (1, 2):
            for row in rows[:40]:
                key = {k: row[k] for k in t.pk}
                if pass_no == 1:
                    changes = [{c: v} for c in rel_upd for v in pools[c] if v != row.get(c)]
                    changes = [dict(j) for j in joint] + changes
                else:
                    rel = [c for c in upd_cols if c in paired]
                    changes = []
                    for c1, c2 in itertools.combinations(rel, 2):
                        for v1 in pools[c1][:12]:
                            for v2 in pools[c2][:12]:
                                changes.append({c1: v1, c2: v2})
                got = sweep({**key, **ch} for ch in changes
                            if not (rc is not None and kind == "trigger"
                                    and evaluate(self.env, rc.sql, new={**row, **ch}, old=row) is False))
                if got is not None:
                    return None if got is _SPENT else got
        return None


REPEAT_STEPS = 8  # the same accepted insert repeated at most this often before the refused one
REPEAT_VARIANTS = 12  # variants of a repeat another rule refuses, tried per step


def find_violating_call(env: Any, rule: str, state: dict | None = None, *, max_calls: int = 2000,
                        derive_states: bool = False, side: str = "agent") -> dict | None:
    """One tool call that violates `rule` from `state` (default: the env's initial state), found
    by the same search as the domain check; None when none is found within `max_calls` calls.

    -> {"call": {"name", "arguments"}, "error": {code, message, violated_rule, hint},
        "state_unchanged": bool, "setup": [calls made first] (only when a first call was needed),
        "attempts": n}. With derive_states=False (default) the state is never modified except by
    the reported setup call, so a hit without "setup" proves the state is ONE call away from
    violating the rule (the Set Designer's boundary-adjacent check). The env is left in `state`.
    `env`: a SqliteEnvironment (its domain is analyzed; named CHECK constraints count as rules).
    """
    dom = env.domain
    an = analyze(env)
    named = named_checks(dom.spec.schema_sql)
    search = ViolationSearch(dom, an, env, max_calls, base_state=state, derive_states=derive_states, sides=(side,))
    if rule in an.rules:
        hit = search.provoke(rule, an.rules[rule], "trigger")
    elif rule in named:
        hit = search.provoke(rule, [], "check", table_hint=named[rule])
    else:
        raise KeyError(f"unknown rule {rule!r}; rules: {sorted(set(an.rules) | set(named))}")
    if hit is not None:
        hit = {k: v for k, v in hit.items() if k != "provoked"}
    return hit


def _defaults(t: Any) -> dict:
    """NEW-row values of omitted columns: literal DEFAULTs and NULL; a column whose default is an
    expression is left out (evaluate() then cannot tell, and the candidate is tried)."""
    out: dict[str, Any] = {}
    for c in t.columns:
        d = c.default
        if d is None:
            out[c.name] = None
            continue
        d = str(d).strip()
        if len(d) >= 2 and d[0] == d[-1] == "'":
            out[c.name] = d[1:-1].replace("''", "'")
        elif re.match(r"^[+-]?\d+$", d):
            out[c.name] = int(d)
        elif re.match(r"^[+-]?\d*\.\d+$", d):
            out[c.name] = float(d)
        elif d.upper() == "NULL":
            out[c.name] = None
        elif d.upper() in ("TRUE", "FALSE"):
            out[c.name] = 1 if d.upper() == "TRUE" else 0
    return out


def hidden_tools_search(dom: Any, an: Any, max_calls: int) -> ViolationSearch:
    """A search over a copy of the domain whose tools are all visible (the original is untouched)."""
    dom2 = copy.copy(dom)
    dom2.tools = {n: dataclasses.replace(td, hidden=False, side="both") for n, td in dom.tools.items()}
    return ViolationSearch(dom2, an, SqliteEnvironment(dom2), max_calls)


def next_key(existing: list) -> str:
    """A text key not in `existing`, in the shape of the table's own keys: the next number after
    the highest one with the same prefix ("SR-6997" -> "SR-6998", "B-0042" -> "B-0043"), so a task
    that inserts it reads like the desk's own records (never the column's name: a user says "a new
    service request SR-6998"); "NEW-1" when the table has no key that ends in digits."""
    strs = {str(v) for v in existing}
    shaped = sorted((m.start(), s) for s in strs if (m := re.search(r"\d+$", s)))
    if not shaped:
        k = len(strs) + 1
        while f"NEW-{k}" in strs:
            k += 1
        return f"NEW-{k}"
    base = max((s for _, s in shaped), key=lambda s: (int(re.search(r"\d+$", s).group()), s))
    stem = re.sub(r"\d+$", "", base)
    width = len(base) - len(stem)
    n = int(base[len(stem):]) + 1
    while f"{stem}{n:0{width}d}" in strs:
        n += 1
    return f"{stem}{n:0{width}d}"
