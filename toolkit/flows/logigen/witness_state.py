"""State boundary witnesses of the rule coverage (rules.RuleCoverage): N-1 of a state rule found by
random draws of (state, goal, next unit).

States from the trigger analysis's cell seeds (`_cell_seeds`, `_guard_seeds`), from executed
calls and s_origin; at most `max_draws` pairs per rule (`_state_boundary`).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from toolkit.flows.logigen.explorer import (
    Boundary,
    Probe,
    canonical_state,
)
from toolkit.flows.logigen.witness_violation import Witness


class StateWitnesses:
    """RuleCoverage's random N-1 state search."""

    def _cell_seeds(self, rule: str, v: Probe) -> list[tuple[dict, dict]]:
        """States with a threshold's state cell at its boundary value (trigger analysis)."""
        out = []
        base = self.gx.base
        vals = {x for x in v.args.values() if isinstance(x, (str, int)) and not isinstance(x, bool)}
        vrow: dict = {}
        if v.kind == "update" and v.table in self.view.tables:
            pk = self.view.tables[v.table].pk
            vrow = next((r for r in base.get(v.table, []) if pk and all(r.get(k) == v.args.get(k) for k in pk)), {})
            # the row it updates: its other values (its flight) single out the cell too
            vals |= {x for x in vrow.values() if isinstance(x, (str, int)) and not isinstance(x, bool)}
        cells: list[tuple[str, str, Any]] = []
        for rc in (self.an.rules.get(rule, []) if self.an else []):
            for th in rc.thresholds:
                ref = th.ref
                if ref.startswith(("NEW.", "OLD.")) or "(" in ref or "." not in ref:
                    continue
                tbl, _, col = ref.partition(".")
                cells.append((tbl, col, th.boundary))
            # `(SELECT col FROM t WHERE ...) <op> NEW.arg`: the cell at the call's own value (the
            # last seats for this many passengers, the last units of stock)
            for cond in rc.conditions:
                if cond.kind != "compare" or cond.op not in ("<", "<=", ">", ">="):
                    continue
                sides = {getattr(x, "kind", None): x for x in (cond.lhs, cond.rhs)}
                sub, new, old = sides.get("subquery"), sides.get("new"), sides.get("old")
                arg = v.args.get(getattr(new, "column", None)) if new is not None else None
                if new is None and old is not None:  # `< OLD.passenger_count`: the updated row's value
                    arg = vrow.get(old.column)
                if sub is None or not isinstance(arg, (int, float)) or isinstance(arg, bool):
                    continue
                op = cond.op if cond.lhs is sub else {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[cond.op]
                if isinstance(arg, float) and op in ("<=", ">="):
                    continue  # no next unit of a real number
                cells.append((sub.table, sub.column, {"<": arg, "<=": arg + 1, ">": arg, ">=": arg - 1}[op]))
        out += self._guard_seeds(rule, v, vrow)
        for tbl, col, value in cells:
                t = self.view.tables.get(tbl)
                if t is None or col not in t.colmap or not isinstance(value, (int, float)):
                    continue
                rows = base.get(tbl, [])
                rows = sorted(range(len(rows)), key=lambda i: -sum(rows[i].get(k) in vals for k in t.pk))
                for i in rows[:3]:
                    if base[tbl][i].get(col) == value:
                        continue
                    st = copy.deepcopy(base)
                    was = st[tbl][i].get(col)
                    st[tbl][i][col] = value
                    try:
                        st = canonical_state(self.gx.env_base, st)
                    except Exception as e:  # noqa: BLE001 - a seed that does not load is skipped, counted
                        self.errors.append(f"{rule}: cell seed {tbl}.{col}={value} does not load: {e}")
                        continue
                    out.append((st, {"by": "state cell", "table": tbl, "column": col, "value": value,
                                     "was": was, "row": {k: base[tbl][i].get(k) for k in t.pk},
                                     "found_by": "trigger analysis"}))
        return out

    def _guard_seeds(self, rule: str, v: Probe, vrow: dict) -> list[tuple[dict, dict]]:
        """For an update refused only when it changes a column (`NEW.room_no IS NOT OLD.room_no
        AND <the new room is under maintenance>`): the state where the row already holds the
        refused value (a booking made before its room went into maintenance), so the refused call
        is a no-op there and moving the row away is the goal that makes it cross."""
        if v.kind != "update" or not vrow or not self.an:
            return []
        t = self.view.tables[v.table]
        out = []
        for rc in self.an.rules.get(rule, []):
            for cond in rc.conditions:
                kinds = sorted(getattr(x, "kind", "") for x in (cond.lhs, cond.rhs))
                if cond.kind != "compare" or cond.op not in ("IS NOT", "!=", "<>") or kinds != ["new", "old"]:
                    continue
                col = cond.lhs.column
                if col != cond.rhs.column or col not in v.args or col in t.pk or vrow.get(col) == v.args[col]:
                    continue
                base = self.gx.base
                i = next(k for k, r in enumerate(base[v.table]) if r is vrow)
                st = copy.deepcopy(base)
                st[v.table][i][col] = v.args[col]
                try:
                    st = canonical_state(self.gx.env_base, st)
                except Exception as e:  # noqa: BLE001 - a seed that does not load is skipped, counted
                    self.errors.append(f"{rule}: guard seed {v.table}.{col}={v.args[col]!r} does not load: {e}")
                    continue
                out.append((st, {"by": "state cell", "table": v.table, "column": col, "value": v.args[col],
                                 "was": vrow.get(col), "row": {k: vrow.get(k) for k in t.pk},
                                 "found_by": "trigger analysis (guard)"}))
        return out[:2]

    def _owner(self, state: dict, v: Probe) -> Any:
        gx = self.gx
        t = self.view.tables[v.table]
        row = v.args
        if v.kind == "update":
            row = next((r for r in state.get(v.table, []) if all(r.get(k) == v.args.get(k) for k in t.pk)), v.args)
        return gx.owner_of(state, v.table, row)

    def _state_boundary(self, rule: str, wit: Witness) -> tuple[Boundary, dict] | None:
        """A state S, a goal g and a next unit n (see the module doc). S: the trigger analysis's
        cell seeds, then the state after one executed write, then s_origin itself when it is
        already one action away (recorded as such)."""
        gx = self.gx
        v = wit.call
        w = gx.walker
        t = self.view.tables[v.table]
        seeds = self._cell_seeds(rule, v)
        row = v.args
        if v.kind == "update":
            row = next((r for r in wit.origin.get(v.table, []) if all(r.get(k) == v.args.get(k) for k in t.pk)), v.args)
        anchors = {x for x in row.values() if isinstance(x, str)}
        who = self._owner(gx.base, v)
        self._load(gx.base)
        for p in gx.step_candidates(gx.base, self.rng, anchors, {}, {}, who, width=2)[:4]:
            h0 = w.hash()
            r = w.call(p.name, p.args)
            if r.ok and w.hash() != h0:
                seeds.append((self._snap(), {"by": "executed calls", "calls": [p.call()]}))
            w.restore(gx.base_cp)
        seeds.append((gx.base, {"by": "s_origin already one action away (verified)"}))
        budget = self.max_calls
        owned = Counter(gx.owner_of(gx.base, v.table, r) for r in gx.base.get(v.table, []))
        people = [who] + sorted(set(owned) - {None, who}, key=lambda p: (-owned[p], str(p)))
        for origin, seeded in seeds:
          for person in people[:3]:
            goals = gx.step_candidates(origin, self.rng, anchors, {}, {}, person, width=2)
            if seeded.get("by") == "state cell":
                # the goal that moves the seeded cell: a write whose triggers write its table
                moves = self._writers_of(seeded.get("table"))
                goals.sort(key=lambda g: g.table not in moves)
            else:
                goals.sort(key=lambda g: (g.name != v.name, g.column != v.column or g.column is None))
            goals = goals[:24 if seeded.get("by") == "state cell" else 8]
            for g in goals:
                base_n = dict(v.args)
                for k in v.args:
                    fk = self.view.fk(v.table, k)
                    if fk and fk.get("table") == gx.principal and person is not None:
                        base_n[k] = person
                nexts = [{"name": v.name, "arguments": base_n}]
                if v.kind == "update" and g.kind == "update" and g.table == v.table:
                    gk = {k: g.args[k] for k in t.pk}
                    nexts.insert(0, {"name": v.name, "arguments": {**v.args, **gk}})
                    other = {k: x for k, x in g.args.items() if k not in t.pk}
                    nexts.append({"name": v.name, "arguments": {**gk, **{k: x for k, x in v.args.items() if k not in t.pk
                                                                              and k not in other}}})
                for k in v.args:
                    fk = self.view.fk(v.table, k)
                    if fk and k not in t.pk and fk.get("table") != gx.principal and k in g.args and g.table == v.table:
                        nexts.insert(0, {"name": v.name, "arguments": {**base_n, k: g.args[k]}})
                for n in nexts[:3]:
                    budget -= 3
                    self._left -= 1
                    if budget <= 0 or self._left < 0:
                        self._left = max(self._left, 0)
                        return None
                    if self._verify(origin, g.call(), n, rule, state_rule=True):
                        if seeded.get("by") == "executed calls" and self._verify(gx.base, g.call(), n, rule, True):
                            continue  # the seeding call did not matter: s_origin already was one action away
                        sd = dict(seeded, n_minus_1=True)
                        b = Boundary(rule=rule, arg=str(sd.get("table", v.table)) + "." + str(sd.get("column", "*")),
                                     threshold=sd.get("value"), goal=g, crossing=[g.call(), n],
                                     seeded=sd, found_by=sd.get("found_by", "execution search"))
                        return b, origin
        return None
