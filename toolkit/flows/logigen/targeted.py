"""The targeted boundary (N-1) search, tried before the random draws of rules.RuleCoverage.

For a rule whose condition reads something a visible tool can change (reach.Reach), the goal g
is a write that changes exactly that, on the row the rule's violating call (its witness) reads,
and the next unit n is the witness adapted to that row:

- a cell of the row the call updates (`OLD.cabin = 'basic_economy'`, `OLD.status = 'cancelled'`):
  g = an update tool setting the column on that row (or another row of the same owner) to a value
  from the condition's literals, the column's enum or the values in the table; n = the witness
  call on that row, or the witness setting the column back to its value in S (a guard
  `NEW.c IS NOT OLD.c` makes n a no-op on S);
- a cell of another table's row read by a keyed subquery
  (`(SELECT status FROM reservation WHERE reservation_id = NEW.reservation_id)`,
  `(SELECT seats_available FROM flight_cabin WHERE ...)`): g = an update of that cell, or a write
  whose AFTER trigger changes it, addressed to that row (its key columns set from the row); n =
  the witness; S = s_origin, the witness's state or the trigger analysis's cell seed (the cell at
  the value one unit before the witness's own argument crosses);
- the rows of a table read by an aggregate or EXISTS: g = an insert (or a write whose trigger
  inserts) with the subquery's key columns set from the witness.

Every pair is verified by execution with RuleCoverage._verify, like the random candidates: g
accepted on S and changes it, n rejected for the rule right after g, n not rejected for the rule
on S itself.
"""

from __future__ import annotations

import random
import re
from typing import Any

from toolkit.flows.logigen.explorer import Boundary, Probe, _is_date, _shift_date
from toolkit.flows.logigen.goals import _row
from toolkit.flows.logigen.hints import fits_column
from toolkit.flows.logigen.provoke import next_key
from toolkit.flows.logigen.reach import Read, _cond_operands, _operands


def _literals(rc: Any, table: str, col: str) -> list:
    """Literals the condition compares with the column (`OLD.cabin = 'basic_economy'`,
    `(SELECT status FROM t ...) IS NOT 'active'`)."""
    out: list = []

    def about(o: Any) -> bool:
        if o.kind in ("new", "old"):
            return o.column == col and rc.table == table
        return o.kind == "subquery" and o.column == col and o.table == table

    for c in rc.conditions:
        ops = [o for o in (c.lhs, *(c.rhs if isinstance(c.rhs, tuple) else (c.rhs,))) if hasattr(o, "kind")]
        if not any(about(o) for o in ops):
            continue
        for o in ops:
            vals = [o.value] if o.kind == "literal" else ([x.value for x in o.value if x.kind == "literal"]
                                                           if o.kind == "list" else [])
            for v in vals:
                if v is not None and v not in out:
                    out.append(v)
    return out


def state_constants(rc: Any, state: dict) -> list:
    """Values the condition reads from a one-row table with no key (`(SELECT date FROM today)`)
    in `state`: the dates a date window is measured from."""
    out: list = []
    for o in _operands(rc):
        if o.kind != "subquery" or o.refs or o.keys or o.filters or not o.column or len(set((o.tables or {}).values())) > 1:
            continue
        rows = state.get(o.table) or []
        if len(rows) == 1 and rows[0].get(o.column) is not None and rows[0].get(o.column) not in out:
            out.append(rows[0].get(o.column))
    return out


def values(view: Any, state: dict, table: str, col: str, rc: Any, cur: Any, limit: int = 8,
           hints: list | None = None) -> list:
    """Values to set a cell to: the condition's literals, the column's enum, the analysis's
    thresholds, one step either side of an integer; for a date, the days around the dates the
    condition reads from the state (today) and around its own value; then values of the column
    in the state."""
    c = view.tables[table].colmap.get(col)
    if c is None:
        return []
    cands = [v for v in _literals(rc, table, col) if fits_column(c, v, none_ok=True)] + list(c.enum or [])
    if hints:  # what the other rules compare the column with (a return dated today)
        from toolkit.flows.logigen.hints import hint_values

        cands += hint_values(hints, state, c, cur)
    for th in rc.thresholds:
        if th.ref.endswith("." + col):
            cands += [th.boundary, th.violating]
    if isinstance(cur, int) and not isinstance(cur, bool):
        cands += [cur + 1, cur - 1]
    if _is_date(cur):
        for d in [x for x in state_constants(rc, state) if _is_date(x)] + [cur]:
            cands += [_shift_date(d, k) for k in (1, 0, -1, 2)]
    cands += [r.get(col) for r in state.get(table, [])]
    out: list = []
    for v in cands:
        if v is not None and v != cur and v not in out and fits_column(c, v, none_ok=True):
            out.append(v)
    return out[:limit]


def _probe(view: Any, call: dict) -> Probe | None:
    td = view.tools.get(call["name"])
    if td is None:
        return None
    t = view.tables[td.table]
    col = next((k for k in call["arguments"] if k not in t.pk), None) if td.kind == "update" else None
    return Probe(call["name"], dict(call["arguments"]), td.kind, td.table, column=col)


def _row_of(state: dict, table: str, pk: list, args: dict) -> dict | None:
    if not pk or any(k not in args for k in pk):
        return None
    return _row(state, table, {k: args[k] for k in pk})


def _literal_columns(sub: Any) -> set:
    """The columns a subquery compares with a literal (`status = 'active'`, `kind IN (...)`)."""
    out = {k.split(".")[-1] for k, o in sub.keys.items() if o.kind == "literal"}
    for f in sub.filters:
        ops = _cond_operands(f)
        if any(o.kind in ("literal", "list") for o in ops):
            out |= {o.column for o in ops if o.kind == "column" and o.column}
    return out


def _sub_columns(sub: Any) -> list:
    """The columns a subquery selects and filters on (`status IN ('booked', 'checked_in')`)."""
    if sub is None:
        return []
    out = [sub.column] if sub.column else []
    for f in sub.filters:
        for o in _cond_operands(f):
            if o.kind == "column" and o.column and o.column not in out:
                out.append(o.column)
    return out


def _with_dates_moved(view: Any, tool: str, table: str, row: dict, key: dict, col: str, val: Any) -> list[dict]:
    """The update setting `col` to `val`; for a date moved by k days, also the same update with
    the row's other dates the tool sets moved by k days (a stay moved by a day keeps its length:
    moving check-in alone past a one-night stay's check-out breaks another rule)."""
    out = [{**key, col: val}]
    cur = row.get(col)
    if _is_date(cur) and _is_date(val):
        from datetime import date

        k = (date.fromisoformat(val) - date.fromisoformat(cur)).days
        params = view.params.get(tool, set())
        moved = {c: _shift_date(row[c], k) for c in params
                 if c != col and c not in key and _is_date(row.get(c))}
        if k and moved and all(moved.values()):
            out.append({**key, col: val, **moved})
    return out


def _round_robin(gens: list[tuple]):
    """(rc, read, pair) from the plans' pair generators, (rank, rc, read, generator) in rank
    order: a rank's plans in turn (no plan waits for another of its rank to run out of pairs),
    the next rank after."""
    for k in sorted({x[0] for x in gens}):
        live = [x[1:] for x in gens if x[0] == k]
        while live:
            nxt = []
            for rc, r, g in live:
                item = next(g, None)
                if item is None:
                    continue
                nxt.append((rc, r, g))
                yield rc, r, item
            live = nxt


class Targeted:
    """One rule's targeted search on a RuleCoverage `cov` (see the module doc)."""

    def __init__(self, cov: Any, reach: Any, rule: str, budget: int):
        self.cov = cov
        self.gx = cov.gx
        self.view = cov.view
        self.reach = reach
        self.rule = rule
        self.budget = budget
        self.tried = 0
        self.rng = random.Random(f"{cov.seed}:{rule}:targeted")
        self._ok: dict = {}

    def run(self, wits: list) -> tuple[Boundary, dict] | None:
        plans = []
        labels: set = set()
        for rc in self.cov.an.rules.get(self.rule, []):
            ok, _ = self.reach.check_movable(rc)
            for r in ok:  # one plan per cell (NEW.status and OLD.status are the same goals)
                if r.via != "NEW limit" and (id(rc), r.label()) not in labels:
                    labels.add((id(rc), r.label()))
                    plans.append((rc, r))
        if not plans:
            return None
        # reads compared with a literal or a subquery's cell first, guards (`NEW.c IS NOT OLD.c`)
        # and whole tables after
        def rank(p: tuple) -> int:
            return (0 if p[1].kind == "cell" and (p[1].via == "subquery" or _literals(p[0], p[1].table, p[1].column))
                    else 1 if p[1].kind == "rows" else 2)

        plans.sort(key=rank)
        for wit in wits:
            origins = [(self.gx.base, {"by": "s_origin already one action away (verified)"})]
            if wit.origin is not self.gx.base:
                origins.append((wit.origin, dict(wit.seeded)))
            try:
                origins += self.cov._cell_seeds(self.rule, wit.call)
            except Exception as e:  # noqa: BLE001 - counted, the other origins are still tried
                self.cov.errors.append(f"{self.rule}: targeted cell seeds failed: {type(e).__name__}: {e}")
            origins += self._fresh_rows(wit.call, plans)
            origins += self._freed(wit.call, plans)
            for origin, seeded in origins:
                # no origin takes the whole budget: a share of it per witness and origin
                per = self.tried + max(30, self.budget // (len(wits) * len(origins)))
                for rc, r, (g, n, thr) in _round_robin([(rank((rc, r)), rc, r, self._pairs(rc, r, wit.call, origin))
                                                        for rc, r in plans]):
                    if self.tried >= self.budget:
                        return None
                    if self.tried >= per:
                        break
                    self.tried += 1
                    if g == n and not self._repeatable(g):
                        # the same request again, as a new row (on another plate, say, when the
                        # first one is taken): the first twin the rule lets through then refuses
                        g = next((x for x in self._twins(origin, g, rc)
                                  if self.cov._verify(origin, x, n, self.rule, state_rule=True)), None)
                        if g is None:
                            continue
                    elif not self.cov._verify(origin, g, n, self.rule, state_rule=True):
                        continue
                    gp = _probe(self.view, g)
                    if gp is None:
                        continue
                    sd = dict(seeded, n_minus_1=True, search="targeted", moves=r.label())
                    b = Boundary(rule=self.rule, arg=r.label(), threshold=thr, goal=gp, crossing=[g, n],
                                 seeded=sd, found_by="trigger analysis")
                    return b, origin
            for rc, r in plans:
                if r.kind == "rows":
                    hit = self._walk(rc, r, wit.call, self.gx.base, dict(origins[0][1]))
                    if hit is not None:
                        return hit
        return None

    def _twins(self, origin: dict, call: dict, rc: Any, alts: int = 3) -> list[dict]:
        """An insert `call` as a new row: its key made new (the table's own shape, one past the
        largest), then also one column the rule does not read set to another value of that column
        in the table (a plate the first permit does not hold), at most `alts` per column. The goal
        whose next unit is the same request (the third visitor permit of a month, then the
        fourth). Empty for an update or a table whose key the call does not give."""
        td = self.view.tools.get(call["name"])
        if td is None or td.kind != "insert":
            return []
        t = self.view.tables[td.table]
        keys = [k for k in t.pk if k in call["arguments"]]
        if not keys:
            return []
        args = dict(call["arguments"])
        rows = origin.get(td.table, [])
        for k in keys:
            have = [r.get(k) for r in rows if r.get(k) is not None] + [args[k]]
            if isinstance(args[k], int) and not isinstance(args[k], bool):
                args[k] = max(v for v in have if isinstance(v, int) and not isinstance(v, bool)) + 1
            elif isinstance(args[k], str):
                args[k] = next_key(have)
            else:
                return []
        out = [{"name": call["name"], "arguments": args}]
        read = set(re.findall(r"\bNEW\.\"?(\w+)", rc.sql or ""))
        for col in sorted(args):
            # never the key, a column the rule reads, or a date of the row's own (it may be what
            # the rule counts by: the month of a permit)
            if col in keys or col in read or (self.view.fk(td.table, col) is None and _is_date(args[col])):
                continue
            others = list(dict.fromkeys(r.get(col) for r in rows if r.get(col) not in (None, args[col])))[:alts]
            out += [{"name": call["name"], "arguments": {**args, col: v}} for v in others]
        return out

    def _repeatable(self, call: dict) -> bool:
        """An insert into a table keyed by a rowid alias: the same call twice makes two rows (the
        third permit of a month as the goal, the same request again as the next unit)."""
        td = self.view.tools.get(call["name"])
        if td is None or td.kind != "insert":
            return False
        t = self.view.tables[td.table]
        return bool(t.pk) and all(t.colmap[k].rowid_alias and k not in call["arguments"] for k in t.pk)

    # -- (goal, next unit) pairs -----------------------------------------------------------------

    def _pairs(self, rc: Any, r: Read, v: Any, origin: dict):
        view = self.view
        if v.table not in view.tables:
            return
        vt = view.tables[v.table]
        vrow = _row_of(origin, v.table, vt.pk, v.args) if v.kind == "update" else None
        if r.kind == "cell" and r.table == rc.table and rc.event == "UPDATE":
            if v.kind != "update" or v.table != r.table or vrow is None:
                return
            ranked = []
            for extra in (False, True):
                # extra next units only when the witness is refused on every row of S
                if extra and (any(not x[0][0] for x in ranked) or r.column in v.args
                              or v.name not in self.reach.set_by.get((r.table, r.column), [])):
                    break
                ranked = []
                for row in self._rows(origin, v.table, vrow, limit=12):
                    key = {k: row[k] for k in vt.pk}
                    nexts = [{"name": v.name, "arguments": {**v.args, **key}}]
                    if r.column in v.args:
                        nexts.append({"name": v.name, "arguments": {**v.args, **key, r.column: row.get(r.column)}})
                    if extra:
                        # the witness's tool setting the column the rule reads (cancelling the
                        # extra that a cancelled booking has already cancelled), or setting it to
                        # the value it has (a no-op on S that undoes g after it: un-reversing a
                        # transfer that g reversed)
                        hv = self.gx.hints.get((r.table, r.column))
                        nexts += [{"name": v.name, "arguments": {**key, r.column: x}}
                                  for x in [row.get(r.column)] + values(view, origin, r.table, r.column, rc,
                                                                         row.get(r.column), hints=hv)[:3]]
                    ok = [not self.cov._probe_on(origin, x, self.rule) for x in nexts]
                    if any(ok):  # else the rule already fires on this row in S
                        # rows where the witness's own call is accepted outright first (another
                        # rule may refuse it: a checked-in booking cannot be cancelled at all),
                        # then rows where only the undo is
                        usable = [x for x, y in zip(nexts, ok) if y]
                        ranked.append(((not ok[0], not any(self._accepted(origin, x, changes=True) for x in usable),
                                        not any(self._accepted(origin, x) for x in usable)), row, key, usable))
            ranked.sort(key=lambda x: x[0])
            for _, row, key, nexts in ranked[:4]:
                for tool in self.reach.set_by.get((r.table, r.column), []):
                    hv = self.gx.hints.get((r.table, r.column))
                    for val in values(view, origin, r.table, r.column, rc, row.get(r.column), hints=hv):
                        for args in _with_dates_moved(view, tool, r.table, row, key, r.column, val):
                            g = {"name": tool, "arguments": args}
                            for n in nexts:
                                yield g, n, val
                # a write of the row it points to whose AFTER trigger changes the column
                # (cancelling the booking cancels its extras), or of a row pointing to it (a
                # transfer into the account changes its balance)
                for g in self._parent_updates(origin, r, rc, row):
                    for n in nexts:
                        yield g, n, None
                for g in self._child_writes(origin, v, r, row):
                    for n in nexts:
                        yield g, n, None
            return
        n = v.call()
        n.pop("expect_error", None)
        sub = self._subquery(rc, r)
        keyvals = self._keys(sub, v, vrow) if sub is not None else {}
        if r.kind == "cell" and r.via != "join":
            t = view.tables.get(r.table)
            row = _row_of(origin, r.table, t.pk, keyvals) if t is not None else None
            if row is None:
                return
            # the witness's row, then rows of the same owner it can be moved to (its key
            # arguments replaced): the next unit must be accepted on S
            args_of = {o.column: col for col, o in sub.keys.items() if o.kind == "new" and o.column in v.args}
            used = 0
            for other in self._rows(origin, r.table, row, limit=12) if args_of else [row]:
                nn = {"name": n["name"], "arguments": {**n["arguments"],
                                                       **{a: other.get(col) for a, col in args_of.items()}}}
                if self.cov._probe_on(origin, nn, self.rule):
                    continue
                used += 1
                if used > 4:
                    return
                who = self.gx.owner_of(origin, r.table, other)
                key = {k: other[k] for k in t.pk}
                for tool in self.reach.set_by.get((r.table, r.column), []):
                    hv = self.gx.hints.get((r.table, r.column))
                    for val in values(view, origin, r.table, r.column, rc, other.get(r.column), hints=hv):
                        yield {"name": tool, "arguments": {**key, r.column: val}}, nn, val
                tools = self.reach.effect_by.get((r.table, r.column), []) + self.reach.effect_by.get((r.table, None), [])
                for g in self._writes(origin, v, tools, {**keyvals, **key}, who=who):
                    yield g, nn, None
        else:
            tools = self.reach.writers(r)
            for nn, pin in self._variants(origin, v, sub, r, n, keyvals):
                # the row the subquery selects by its key, changed one column at a time (the
                # booking an extra is added to, cancelled)
                for g in self._row_updates(origin, r.table, pin, rc, _sub_columns(sub)):
                    yield g, nn, None
                for g in self._writes(origin, v, tools, pin, like=nn):
                    yield g, nn, None
                # someone else's write (another patient taking the slot)
                for g in self._writes(origin, v, tools, pin, like=nn, who=None, limit=4):
                    yield g, nn, None

    def _variants(self, origin: dict, v: Any, sub: Any, r: Read, n: dict, keyvals: dict) -> list[tuple[dict, dict]]:
        """(next unit, pinned columns): the witness, then the witness moved to other rows its
        keying arguments reference (another booking of the same customer) or other values of a
        plain key (a date, a slot), those accepted on S outright first; never one the rule already
        rejects on S."""
        view = self.view
        args_of = {o.column: col.split(".")[-1] for col, o in (sub.keys.items() if sub is not None else [])
                   if o.kind == "new" and o.column in v.args}
        variants: list[dict] = [{}]
        for a, col in args_of.items():  # one keying argument moved at a time
            fk = view.fk(v.table, a)
            rt = view.tables.get(fk.get("table")) if fk else None
            if rt is not None:
                to = fk.get("to") or (rt.pk[0] if rt.pk else None)
                first = next((x for x in origin.get(rt.name, []) if x.get(to) == v.args[a]), None)
                others = [x.get(to) for x in self._rows(origin, rt.name, first, limit=8)[1:]] if first else []
            else:
                others = list(dict.fromkeys(x.get(col) for x in origin.get(r.table, [])
                                            if x.get(col) not in (None, v.args[a])))[:6]
            variants += [{a: x} for x in others]
        nns = [({"name": n["name"], "arguments": {**n["arguments"], **var}}, var) for var in variants]
        nns = [(x, var) for x, var in nns if not self.cov._probe_on(origin, x, self.rule)]
        nns.sort(key=lambda xv: not self._accepted(origin, xv[0]))
        out = []
        for nn, var in nns[:6]:
            pin = dict(keyvals)
            pin.update({args_of[a]: x for a, x in var.items()})
            out.append((nn, pin))
        return out

    def _walk(self, rc: Any, r: Read, v: Any, origin: dict, seeded: dict, steps: int = 4):
        """A count read (`(SELECT COUNT(*) FROM loan WHERE member_id = NEW.member_id ...) >= limit`):
        S walked towards the limit by executing writes of that table (like the next unit, with its
        keys) while the next unit stays accepted; at each step, the writes are tried as the goal."""
        sub = self._subquery(rc, r)
        if sub is None or not sub.aggregate:
            return None
        n = v.call()
        n.pop("expect_error", None)
        vt = self.view.tables[v.table]
        vrow = _row_of(origin, v.table, vt.pk, v.args) if v.kind == "update" else None
        tools = self.reach.writers(r)
        w = self.gx.walker
        for nn, pin in self._variants(origin, v, sub, r, n, self._keys(sub, v, vrow))[:3]:
            st, calls = origin, []
            for _ in range(steps):
                gs = list(self._writes(st, v, tools, pin, like=nn, limit=4))
                for g in gs:
                    if self.tried >= self.budget:
                        return None
                    self.tried += 1
                    if g == nn and not self._repeatable(g):
                        g = next((x for x in self._twins(st, g, rc)
                                  if self.cov._verify(st, x, nn, self.rule, state_rule=True)), None)
                        ok = g is not None
                    else:
                        ok = self.cov._verify(st, g, nn, self.rule, state_rule=True)
                    if ok:
                        gp = _probe(self.view, g)
                        if gp is not None:
                            sd = dict(seeded, n_minus_1=True, search="targeted", moves=r.label())
                            if calls:
                                sd.update(by="executed calls", calls=list(calls))
                            return Boundary(rule=self.rule, arg=r.label(), threshold=None, goal=gp,
                                            crossing=[g, nn], seeded=sd, found_by="trigger analysis"), st
                nxt = None
                for g in gs:  # one step closer: a write after which the next unit is still accepted
                    self.cov._load(st)
                    h0 = w.hash()
                    res = w.call(g["name"], g["arguments"])
                    if res.ok and w.hash() != h0:
                        s2 = self.cov._snap()
                        w.restore(self.gx.base_cp)
                        if not self.cov._probe_on(s2, nn, self.rule):
                            nxt = (s2, g)
                            break
                    w.restore(self.gx.base_cp)
                if nxt is None:
                    break
                st, calls = nxt[0], calls + [nxt[1]]
        return None

    def _row_updates(self, origin: dict, table: str, pin: dict, rc: Any, cols: list | None = None,
                     per_col: int = 4):
        """Updates of the row of `table` whose key `pin` holds, one column (of `cols`, else any
        the update tools set) at a time, to the values `values()` proposes."""
        view = self.view
        t = view.tables.get(table)
        row = _row_of(origin, table, t.pk, pin) if t is not None else None
        if row is None:
            return
        key = {k: row[k] for k in t.pk}
        for (tb, col), tools in self.reach.set_by.items():
            if tb != table or (cols and col not in cols) or (tb, col) in self.reach.fixed:
                continue
            for tool in tools:
                hv = self.gx.hints.get((table, col))
                for val in values(view, origin, table, col, rc, row.get(col), hints=hv)[:per_col]:
                    for args in _with_dates_moved(view, tool, table, row, key, col, val):
                        yield {"name": tool, "arguments": args}

    def _parent_updates(self, origin: dict, r: Read, rc: Any, row: dict):
        """Updates of the rows `row` references whose tool's AFTER trigger writes the read
        column of `r.table`."""
        tools = set(self.reach.effect_by.get((r.table, r.column), []) + self.reach.effect_by.get((r.table, None), []))
        for col, val in row.items():
            fk = self.view.fk(r.table, col)
            pt = self.view.tables.get(fk.get("table")) if fk else None
            if pt is None or len(pt.pk) != 1 or val is None:
                continue
            for g in self._row_updates(origin, pt.name, {pt.pk[0]: val}, rc):
                if g["name"] in tools:
                    yield g

    def _child_writes(self, origin: dict, v: Any, r: Read, row: dict, limit: int = 6):
        """Writes into tables that reference `row`'s table, pointed at `row`, whose AFTER trigger
        changes the read column (`transfer.to_account` = the account: its balance goes up)."""
        view = self.view
        t = view.tables[r.table]
        if len(t.pk) != 1:
            return
        tools = list(dict.fromkeys(self.reach.effect_by.get((r.table, r.column), [])
                                   + self.reach.effect_by.get((r.table, None), [])))
        for tool in tools:
            td = view.tools.get(tool)
            ct = view.tables.get(td.table) if td is not None else None
            if ct is None or ct.name == r.table:
                continue
            who = self.gx.owner_of(origin, r.table, row)  # the account's owner sends the money
            for fc in [c.name for c in ct.columns if (view.fk(ct.name, c.name) or {}).get("table") == r.table]:
                yield from self._writes(origin, v, [tool], {fc: row[t.pk[0]]}, limit=limit, who=who)

    def _accepted(self, origin: dict, call: dict, changes: bool = False) -> bool:
        """Whether `call` succeeds on `origin` (with `changes`: and changes the state; a status
        set to the value it has is accepted and does nothing). Memoized per origin and call."""
        key = (id(origin), self.cov._ckey(call))
        hit = self._ok.get(key)
        if hit is None or hit[0] is not origin:
            self.cov._load(origin)
            w = self.gx.walker
            h0 = w.hash()
            ok = w.call(call["name"], call["arguments"]).ok  # the walker is restored below
            hit = self._ok[key] = (origin, ok, ok and w.hash() != h0)
            w.restore(self.gx.base_cp)
        return hit[1] and (hit[2] or not changes)

    def _fresh_rows(self, v: Any, plans: list, limit: int = 2) -> list[tuple[dict, dict]]:
        """States after the witness's owner inserted a new row of a table the rule's subqueries
        are keyed on through the witness's arguments (a new booking the next unit can be moved
        to, when every existing one already crossed the rule): S by executed calls."""
        gx, view = self.gx, self.view
        tables = []
        for rc, _r in plans:
            for o in _operands(rc):
                if o.kind != "subquery":
                    continue
                for op in o.keys.values():
                    fk = view.fk(v.table, op.column) if op.kind == "new" and op.column in v.args else None
                    if fk and fk.get("table") in self.reach.insert_by and fk.get("table") not in tables:
                        tables.append(fk.get("table"))
        out: list[tuple[dict, dict]] = []
        if not tables:
            return out
        base = gx.base
        who = self.cov._owner(base, v)
        w = gx.walker
        ins = {td.name for td in gx.writes if td.kind == "insert" and td.table in tables}
        for p in gx.step_candidates(base, self.rng, set(), {}, {}, who, width=2, only=ins):
            if p.kind != "insert" or p.table not in tables:
                continue
            w.restore(gx.base_cp)
            h0 = w.hash()
            r = w.call(p.name, p.args)
            if r.ok and w.hash() != h0:
                out.append((self.cov._snap(), {"by": "executed calls", "calls": [p.call()]}))
            w.restore(gx.base_cp)
            if len(out) >= limit:
                break
        return out

    def _freed(self, v: Any, plans: list, limit: int = 2) -> list[tuple[dict, dict]]:
        """For a count already at its limit where the witness acts (a full section): states after
        one counted row stops counting (an enrolled student drops: one seat free), by executing
        an update of the columns the count filters on, where the witness is no longer refused
        for the rule. Then taking the last seat is the goal, the witness the next unit
        (`seeded.by = "executed calls"`)."""
        view, gx = self.view, self.gx
        base = gx.base
        w = gx.walker
        n = v.call()
        n.pop("expect_error", None)
        vt = view.tables.get(v.table)
        vrow = _row_of(base, v.table, vt.pk, v.args) if vt is not None and v.kind == "update" else None
        out: list[tuple[dict, dict]] = []
        for rc, r in plans:
            sub = self._subquery(rc, r)
            t = view.tables.get(r.table)
            if r.kind != "rows" or sub is None or not sub.aggregate or t is None:
                continue
            keyvals = {k: x for k, x in self._keys(sub, v, vrow).items() if k in t.colmap}
            # only the columns compared with a constant (`status = 'enrolled'`): the row stops
            # counting; never one tied to the call (moving a loan to another member)
            filt = [k for k in keyvals if k not in t.pk and k in _literal_columns(sub)]
            if not keyvals or not filt:
                continue
            rows = [x for x in base.get(r.table, []) if all(x.get(k) == val for k, val in keyvals.items())]
            for row in rows[:4]:
                key = {k: row[k] for k in t.pk}
                for g in self._row_updates(base, r.table, key, rc, cols=filt, per_col=3):
                    self.tried += 1
                    w.restore(gx.base_cp)
                    h0 = w.hash()
                    res = w.call(g["name"], g["arguments"])
                    if res.ok and w.hash() != h0:
                        st = self.cov._snap()
                        w.restore(gx.base_cp)
                        if not self.cov._probe_on(st, n, self.rule):
                            out.append((st, {"by": "executed calls", "calls": [g]}))
                            break
                    w.restore(gx.base_cp)
                if len(out) >= limit:
                    return out
        return out

    def _rows(self, state: dict, table: str, first: dict, limit: int = 4) -> list[dict]:
        """`first`, then rows of `table` with the same owner, then others (`limit` in all)."""
        gx = self.gx
        who = gx.owner_of(state, table, first)
        rest = [x for x in state.get(table, []) if x is not first]
        rest.sort(key=lambda x: gx.owner_of(state, table, x) != who)
        return [first] + rest[:limit - 1]

    def _writes(self, origin: dict, v: Any, tools: list, pin: dict, limit: int = 8, like: dict | None = None,
                who: Any = False):
        """Candidate writes of `tools` by the witness's owner, the columns in `pin` set."""
        if not tools:
            return
        gx = self.gx
        if who is False:
            who = self.cov._owner(origin, v)
        anchors = {x for x in v.args.values() if isinstance(x, str)}
        seen: set = set()
        k = 0
        if like is not None and like["name"] in tools and self._repeatable(like):
            # the next unit's own request made once more first (the third permit of a month
            # before the fourth): a new row each time
            seen.add((like["name"], repr(sorted(like["arguments"].items(), key=lambda kv: kv[0]))))
            yield {"name": like["name"], "arguments": dict(like["arguments"])}
            k += 1
        rank = {t: i for i, t in enumerate(tools)}
        cands = gx.step_candidates(origin, self.rng, anchors, {}, {}, who, width=2, only=rank, hints=True)
        # the tools in turn (direct writers first, then writes through triggers): a limit of 8 is
        # not all taken by the first tool (borrowing takes a copy off the shelf, returning puts
        # one back: both move the count)
        turn: dict = {}

        def on_pinned(p: Any) -> bool:  # an update of a row that holds the pinned values
            if p.kind != "update" or not pin:
                return False
            row = _row_of(origin, p.table, self.view.tables[p.table].pk, p.args)
            return row is not None and any(c in row for c in pin) and all(row.get(c) == x for c, x in pin.items()
                                                                             if c in row)

        cands.sort(key=lambda p: (not on_pinned(p),
                                  turn.__setitem__(p.name, turn.get(p.name, -1) + 1) or turn[p.name], rank[p.name]))
        for p in cands:
            params = self.view.params.get(p.name, set())
            t = self.view.tables[p.table]
            args = dict(p.args)
            for col, val in pin.items():
                if col in params and not (p.kind == "update" and col in t.pk):
                    args[col] = val
            variants = [args]
            if p.kind == "update" and args != p.args:
                # an update of a row that already holds the pinned values, unchanged (a loan of
                # that book returned: its AFTER trigger puts the copy back) before one that sets them
                row = _row_of(origin, p.table, t.pk, p.args)
                if row is not None and all(row.get(c) == x for c, x in pin.items() if c in row):
                    variants.insert(0, dict(p.args))
            if like is not None and like["name"] == p.name and p.kind == "insert":
                # the next unit's own call with this candidate's references (another certificate
                # for the same booking): the same amounts, another row it points to
                variants.insert(0, {**like["arguments"], **{c: x for c, x in args.items()
                                                             if self.view.fk(p.table, c) and c not in pin}})
            for a in variants:
                key = repr(sorted(a.items(), key=lambda kv: kv[0]))
                if (p.name, key) in seen:
                    continue
                seen.add((p.name, key))
                yield {"name": p.name, "arguments": a}
                k += 1
                if k >= limit:
                    return

    @staticmethod
    def _subquery(rc: Any, r: Read) -> Any:
        for o in _operands(rc):
            if o.kind == "subquery" and (o.table == r.table or r.table in (o.tables or {}).values()):
                return o
        return None

    @staticmethod
    def _keys(sub: Any, v: Any, vrow: dict | None) -> dict:
        """The subquery's key columns evaluated on the witness call (NEW: its arguments, else the
        row it updates; OLD: the row), also its `col = NEW.x` filters."""
        out: dict = {}
        items = list(sub.keys.items())
        for f in sub.filters:
            ops = _cond_operands(f)
            if f.kind == "compare" and f.op in ("=", "IS") and len(ops) == 2:
                a, b = ops
                if a.kind != "column":
                    a, b = b, a
                if a.kind == "column" and a.column:
                    items.append((a.column, b))
        for col, o in items:
            col = col.split(".")[-1]
            if o.kind == "literal":
                out[col] = o.value
            elif o.kind == "new":
                if o.column in v.args:
                    out[col] = v.args[o.column]
                elif vrow is not None:
                    out[col] = vrow.get(o.column)
            elif o.kind == "old" and vrow is not None:
                out[col] = vrow.get(o.column)
        return out
