"""Limit boundary witnesses of the rule coverage (rules.RuleCoverage): N-1 of a rule that limits a
value the goal itself writes.

`_update_threshold`: a column updated past its limit (an integer, or an ISO date moved by days),
the row seeded one before the limit by executing the update; `_amount_limit`: an amount
argument of an insert / update at its limit on the witness's row (`_limit_on_row`).
"""

from __future__ import annotations

from typing import Any

from toolkit.flows.logigen.explorer import (
    Boundary,
    Probe,
    _is_date,
    new_key,
    _shift_date,
)
from toolkit.flows.logigen.reach import row_refs
from toolkit.flows.logigen.witness_violation import Witness

AMOUNT_MOVES = 40  # other referenced rows the amount bisection moves a witness to


class LimitWitnesses:
    """RuleCoverage's argument / column limit boundaries."""

    def _update_threshold(self, rule: str, wit: Witness) -> tuple[Boundary, dict] | None:
        """A column updated past its limit (an integer, or an ISO date moved by days): the goal is
        the last accepted value, the next unit one further, and the row is seeded one before the
        goal by executing the update. The witness's row first, then other rows of the table (the
        witness's own row may have no room below its limit: a single room holds one guest)."""
        v = wit.call
        if v.kind != "update":
            return None
        t = self.view.tables[v.table]
        key0 = {k: v.args[k] for k in t.pk}
        rows = [r for r in wit.origin.get(v.table, []) if all(r.get(k) == x for k, x in key0.items())]
        rows += [r for r in wit.origin.get(v.table, []) if r not in rows][:6]
        for col, bad in v.args.items():
            c = t.colmap.get(col)
            if c is None or c.pk or col in self.view.exclude_keys:
                continue
            if c.json_type == "integer" and isinstance(bad, int) and not isinstance(bad, bool):
                def shift(x: Any, d: int) -> Any:
                    return x + d if isinstance(x, int) and not isinstance(x, bool) else None
            elif _is_date(bad):
                def shift(x: Any, d: int) -> Any:
                    return _shift_date(x, d) if _is_date(x) else None
            else:
                continue
            for row in rows[:4]:
                b = self._limit_on_row(rule, wit, v, t, row, col, bad, shift)
                if b is not None:
                    return b
        return None

    def _limit_on_row(self, rule: str, wit: Witness, v: Probe, t: Any, row: dict, col: str, bad: Any,
                      shift: Any) -> tuple[Boundary, dict] | None:
        w = self.gx.walker
        key = {k: row.get(k) for k in t.pk}
        cur = row.get(col)
        own = all(row.get(k) == v.args.get(k) for k in t.pk)
        for step in (-1, 1):
            # the last accepted value: walking back from the violating value on the witness's row,
            # forward from the current value (towards the limit) on another row
            self._load(wit.origin)
            n_val = None
            if own:
                for i in range(1, 30):
                    x = shift(bad, step * i)
                    if x is None or (isinstance(x, int) and x < 0):
                        break
                    if w.probe(v.name, {**key, col: x}).ok:
                        n_val = x
                        break
            else:
                last = cur
                for i in range(1, 30):
                    x = shift(cur, -step * i)
                    if x is None or (isinstance(x, int) and x < 0):
                        break
                    r = w.probe(v.name, {**key, col: x})
                    if not r.ok:
                        if (r.error or {}).get("violated_rule") == rule:
                            n_val = last
                        break
                    last = x
            if n_val is None:
                continue
            seed_val = shift(n_val, step)
            if seed_val is None or (isinstance(seed_val, int) and seed_val < 0):
                continue
            seed_call = {"name": v.name, "arguments": {**key, col: seed_val}}
            if cur != seed_val:
                origin = self._after(wit.origin, [seed_call])
                seeded = {"by": "executed calls", "calls": [seed_call], "value": seed_val, "was": cur}
            else:
                origin = wit.origin
                seeded = {"by": "state already at N-1 (verified)", "value": seed_val}
            if origin is None:
                continue
            goal = Probe(v.name, {**key, col: n_val}, "update", v.table, column=col)
            nxt = {"name": v.name, "arguments": {**key, col: shift(n_val, -step)}}
            if self._verify(origin, goal.call(), nxt, rule, state_rule=False):
                seeded.update(n_minus_1=True, **({"witness": wit.seeded} if wit.seeded else {}))
                b = Boundary(rule=rule, arg=col, threshold=n_val, goal=goal, crossing=[goal.call(), nxt],
                             seeded=seeded, found_by="execution search")
                return b, origin
        return None

    def _amount_limit(self, rule: str, wit: Witness) -> tuple[Boundary, dict] | None:
        """An insert whose amount the state caps (`NEW.points > (SELECT points FROM guest ...)`,
        a balance, a stock): the goal takes the largest amount accepted on S (found by
        bisection), the next unit the same call for the smallest one, which S accepts and the
        state after the goal does not."""
        v = wit.call
        if v.kind != "insert" or not self.an:
            return None
        reads = {c for rc in self.an.rules.get(rule, []) for side, c in row_refs(rc) if side == "NEW"}
        t = self.view.tables[v.table]
        w = self.gx.walker
        # the witness's own row first, then the witness moved to other rows its references point
        # to (its payment on a fully paid permit has no amount left to bisect; another resident's
        # permit with some owed does): at most AMOUNT_MOVES of them
        moves: list[dict] = [dict(v.args)]
        for a, x in v.args.items():
            fk = self.view.fk(v.table, a)
            rt = self.view.tables.get(fk.get("table")) if fk else None
            if rt is None:
                continue
            to = fk.get("to") or (rt.pk[0] if rt.pk else None)
            others = [r.get(to) for r in wit.origin.get(rt.name, []) if r.get(to) not in (None, x)]
            moves += [{**v.args, a: o} for o in others]
        for args, (col, bad) in ((m, cb) for m in moves[:1 + AMOUNT_MOVES] for cb in v.args.items()):
            c = t.colmap.get(col)
            if (c is None or c.pk or col not in reads or c.json_type not in ("integer", "number")
                    or isinstance(bad, bool) or not isinstance(bad, (int, float)) or bad <= 2):
                continue
            self._load(wit.origin)

            def ok(x: int, col: str = col, args: dict = args) -> bool:
                return w.probe(v.name, {**args, col: x}).ok

            if not ok(1):
                continue
            lo, hi = 1, int(bad)  # lo accepted, hi refused (the witness's own amount)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if ok(mid) else (lo, mid)
            if lo <= 1:
                continue
            goal = {"name": v.name, "arguments": {**args, col: lo}}
            nxt = {"name": v.name, "arguments": {**args, col: 1}}
            for k in t.pk:  # a second row of a table keyed by the call: its own new key
                kc = t.colmap.get(k)
                if k in v.args and kc is not None and not kc.rowid_alias:
                    nxt["arguments"][k] = new_key(wit.origin, t, kc, self.rng)
            w.restore(self.gx.base_cp)
            if self._verify(wit.origin, goal, nxt, rule, state_rule=True):
                gp = self._probe_of(goal, rule)
                gp.rule = gp.code = None
                seeded = {"by": "state already at N-1 (verified)", "n_minus_1": True, "amount": lo,
                          **({"witness": wit.seeded} if wit.seeded else {})}
                return Boundary(rule=rule, arg=col, threshold=lo, goal=gp, crossing=[goal, nxt],
                                seeded=seeded, found_by="execution search"), wit.origin
        w.restore(self.gx.base_cp)
        return None
