"""Rule coverage for the goal explorer: per trigger rule, a state where a call violates it
(violation-first tasks) and a state at N-1 of it (boundary tasks), all found by execution.

- violation witnesses: probes from s_origin, then the domain check's search (`find_violating_call`,
  a setup call allowed: its state becomes the task's s_origin), then states whose cells the trigger
  analysis derives (an OLD-row value, a subquery column set to its violating value);
- boundary witnesses (N-1): a state S, a goal g and a next unit n with g accepted on S, n rejected
  for the rule after g, and (state rules) n NOT rejected for the rule on S itself, so g is exactly
  the last allowed unit. Per rule: skipped when the trigger analysis shows that no visible write
  changes what its condition reads (`reach.Reach.impossible`, reported in `boundary_impossible`);
  else an integer column updated past its limit is seeded one below its limit by executing the
  update (`seeded.by = "executed calls"`); then the targeted search (`targeted.Targeted`: a write
  that changes what the condition reads, on the row the witness reads); then random draws (S
  from the analysis's cell seeds, from executed calls, s_origin; at most `max_draws` pairs). The
  first verified boundary ends a rule's search; a rule without one is reported in
  `boundary_dropped` with the reason and the draws it took (`boundary_search`).

Every failure of the analysis or the search is logged and counted (`report()`), never swallowed.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from toolkit.flows.logigen.explorer import (
    POLICY_VIOLATION,
    Boundary,
    Probe,
    _is_date,
    _new_key,
    _shift_date,
    candidates,
    canonical_state,
)
from toolkit.flows.logigen.reach import _operands, row_refs

DEFAULT_MAX_DRAWS = 50  # `boundary_max_draws`: fruitless random draws per rule before it is dropped
DEFAULT_TARGETED_DRAWS = 400


@dataclass
class Witness:
    origin: dict
    call: Probe
    seeded: dict = field(default_factory=dict)


class RuleCoverage:
    def __init__(self, gx: Any, rng: random.Random, max_calls: int = 1000, max_draws: int = DEFAULT_MAX_DRAWS,
                 targeted_draws: int = DEFAULT_TARGETED_DRAWS):
        self.gx = gx
        self.view = gx.view
        self.rng = rng
        self.seed = rng.random()
        self.max_calls = max_calls
        self.max_draws = max_draws  # random (goal, next unit) draws per rule before it is dropped
        self.targeted_draws = targeted_draws
        self.errors: list[str] = []
        self.dropped: dict[str, str] = {}
        self.impossible: dict[str, str] = {}
        self.draws: dict[str, dict] = {}  # per rule: targeted / random draws verified, found by, capped
        self._left = 0
        self._two_left = 600  # tool calls of the two-step searches of this record (twostep.py)
        try:
            from toolkit.flows.logigen.analysis import analyze

            self.an = analyze(gx.env_base)
            self.rules = sorted(self.an.rules)
        except Exception as e:  # noqa: BLE001 - reported, and the search goes on without it
            self.an = None
            self.rules = []
            self.errors.append(f"trigger analysis failed: {type(e).__name__}: {e}")
        self._cps: dict[int, tuple[dict, bytes]] = {}
        self._goal_memo: dict[tuple, tuple[dict, bytes | None]] = {}
        self._hash_memo: dict[int, tuple[dict, str]] = {}
        self._probe_memo: dict[tuple, tuple[dict, str | None]] = {}
        self.violations: dict[str, list[Witness]] = {r: [] for r in self.rules}
        self.boundaries: dict[str, list[tuple[Boundary, dict]]] = {r: [] for r in self.rules}

    # -- violations ------------------------------------------------------------------------------

    def find_violations(self) -> None:
        w = self.gx.walker
        w.restore(self.gx.base_cp)
        base = self.gx.base
        for p in candidates(self.view, base, self.rng):
            r = w.probe(p.name, p.args)
            err = r.error or {}
            if not r.ok and err.get("code") == POLICY_VIOLATION and err.get("violated_rule") in self.violations:
                p.rule, p.code, p.message = err.get("violated_rule"), POLICY_VIOLATION, err.get("message")
                if len(self.violations[p.rule]) < 6:
                    self.violations[p.rule].append(Witness(base, p))
        # NEW.<col> thresholds of the analysis: accepted calls with the column at its violating value
        oks = [p for p in candidates(self.view, base, self.rng)]
        for rule in self.rules:
            if len(self.violations[rule]) >= 2 or not self.an:
                continue
            for rc in self.an.rules.get(rule, []):
                for th in rc.thresholds:
                    if not th.ref.startswith("NEW.") or not isinstance(th.violating, (int, float)):
                        continue
                    col = th.ref[4:]
                    tried: set = set()
                    for p in oks:
                        if p.table != rc.table or p.name not in rc.tools or p.name in tried:
                            continue
                        q = Probe(p.name, {**p.args, col: th.violating}, p.kind, p.table, column=col if p.kind == "update" else None)
                        if p.kind == "update":
                            t = self.view.tables[p.table]
                            q.args = {**{k: p.args[k] for k in t.pk}, col: th.violating}
                        r = w.probe(q.name, q.args)
                        if not r.ok and (r.error or {}).get("violated_rule") == rule:
                            q.rule, q.code = rule, POLICY_VIOLATION
                            self.violations[rule].append(Witness(base, q))
                            tried.add(p.name)  # one witness per tool (an insert and an update)
        # a rule whose every witness belongs to someone with no rows of their own to go on with
        # (a banned customer with no bookings): look for one in a derived state as well
        stuck = [r for r in self.rules if self.violations[r]
                 and not any(self._has_rows(wit.origin, self._owner(wit.origin, wit.call)) for wit in self.violations[r])]
        missing = [r for r in self.rules if not self.violations[r]] + stuck
        if not missing:
            return
        from toolkit.flows.logigen.provoke import ViolationSearch, find_violating_call

        for rule in missing:
            if rule not in stuck and self._repeat_witness(rule):
                continue
            if rule in stuck:
                hit = None
            else:
              try:
                hit = find_violating_call(w.env, rule, max_calls=self.max_calls)
              except Exception as e:  # noqa: BLE001
                self.errors.append(f"{rule}: violation search failed: {type(e).__name__}: {e}")
                hit = None
              w.restore(self.gx.base_cp)
            if hit:
                origin, seeded = base, {}
                if hit.get("setup"):
                    origin = self._after(base, hit["setup"])
                    seeded = {"by": "executed calls", "calls": hit["setup"]}
                p = self._probe_of(hit["call"], rule)
                if origin is not None and p is not None:
                    self.violations[rule].append(Witness(origin, p, seeded))
                    if self._has_rows(origin, self._owner(origin, p)):
                        continue
            if self.violations[rule] and self._cell_witness(rule):
                continue
            # states derived from the rule's condition (an OLD value, a subquery cell)
            try:
                vs = ViolationSearch(w.env.domain, self.an, w.env, self.max_calls, base_state=base)
                derived = vs.derived_states(self.an.rules[rule])
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{rule}: derived states failed: {type(e).__name__}: {e}")
                derived = []
            for label, st in derived[:8]:
                try:
                    st = canonical_state(self.gx.env_base, st)
                    hit = find_violating_call(w.env, rule, state=st, max_calls=self.max_calls // 4)
                except Exception as e:  # noqa: BLE001
                    self.errors.append(f"{rule}: search from {label} failed: {type(e).__name__}: {e}")
                    continue
                w.restore(self.gx.base_cp)
                if hit and not hit.get("setup"):
                    p = self._probe_of(hit["call"], rule)
                    if p is not None and (rule not in stuck or self._has_rows(st, self._owner(st, p))):
                        self.violations[rule].append(Witness(st, p, {"by": "state cell", "derived": label}))
                        break
        w.restore(self.gx.base_cp)

    def _repeat_witness(self, rule: str, max_steps: int = 6, max_starts: int = 8) -> bool:
        """A count or sum limit (`(SELECT COUNT(*) FROM orders WHERE user_id = NEW.user_id AND
        status = 'pending') >= 2`): an accepted call of the rule's own tool, executed again and
        again (a fresh key each time) until the rule rejects it. The calls before the rejected
        one are the witness's setup: its state is the task's s_origin (`seeded.by = "executed
        calls"`). Cheap, so it runs before the general search (`find_violating_call`); only for
        rules whose analysis reads an aggregate. True when a witness of an owner with rows of
        their own was added."""
        if not self.an:
            return False
        checks = self.an.rules.get(rule, [])
        if not any(o.kind == "subquery" and o.aggregate for rc in checks for o in _operands(rc)):
            return False
        limit = max([int(th.violating) for rc in checks for th in rc.thresholds
                     if "(" in th.ref and isinstance(th.violating, (int, float))] or [max_steps - 1])
        steps = max(2, min(max_steps, limit + 1))
        tools = {t for rc in checks for t in rc.tools}
        gx, w, base = self.gx, self.gx.walker, self.gx.base
        starts: list[Probe] = []
        seen: set = set()
        for _ in range(4):  # candidates are drawn at random: a few draws, so accepted ones are among them
            for p in candidates(self.view, base, self.rng):
                k = self._ckey(p.call())
                if p.name in tools and k not in seen:
                    seen.add(k)
                    starts.append(p)
        tried = 0
        for p in starts:
            if tried >= max_starts:
                break
            w.restore(gx.base_cp)
            if not w.probe(p.name, p.args).ok:
                continue
            tried += 1
            t = self.view.tables[p.table]
            fresh = [c for c in t.columns if c.pk and not c.rowid_alias and c.name in p.args]
            calls: list[dict] = []
            for _ in range(steps):
                args = dict(p.args)
                if calls:
                    snap = w.env.snapshot() if fresh else {}
                    for c in fresh:
                        args[c.name] = _new_key(snap, t, c, self.rng)
                h0 = w.hash()
                r = w.call(p.name, args)
                if r.ok and w.hash() != h0:
                    calls.append({"name": p.name, "arguments": args})
                    continue
                if not r.ok and (r.error or {}).get("violated_rule") == rule and calls:
                    w.restore(gx.base_cp)
                    origin = self._after(base, calls)
                    q = self._probe_of({"name": p.name, "arguments": args}, rule)
                    if origin is not None and q is not None:
                        self._load(origin)
                        ok = self._violates(q.call(), rule)
                        w.restore(gx.base_cp)
                        if ok:
                            self.violations[rule].append(Witness(origin, q, {
                                "by": "executed calls", "calls": calls, "found_by": "repeated call"}))
                            if self._has_rows(origin, self._owner(origin, q)):
                                return True
                break
        w.restore(gx.base_cp)
        return False

    def _cell_witness(self, rule: str) -> bool:
        """For a rule whose witnesses belong to someone with nothing else to do: set the state
        cell its condition reads (`(SELECT col FROM t WHERE ...) <op> literal`) on the row of a
        principal who owns rows, and replay a witness call for that principal."""
        gx = self.gx
        if not self.an or gx.principal is None:
            return False
        tmpl = self.violations[rule][0].call
        for rc in self.an.rules.get(rule, []):
            for cond in rc.conditions:
                sub = next((x for x in (cond.lhs, cond.rhs) if getattr(x, "kind", None) == "subquery"), None)
                lit = next((x for x in (cond.lhs, cond.rhs) if getattr(x, "kind", None) == "literal"), None)
                if sub is None or lit is None or sub.table not in self.view.tables:
                    continue
                t = self.view.tables[sub.table]
                c = t.colmap.get(sub.column)
                if c is None:
                    continue
                values = [lit.value] + [v for v in (c.enum or []) if v != lit.value]
                base = gx.base
                for i, row in enumerate(base.get(sub.table, [])[:8]):
                    who = gx.owner_of(base, sub.table, row)
                    if who is None or not self._has_rows(base, who):
                        continue
                    for val in values[:4]:
                        if row.get(sub.column) == val:
                            continue
                        st = copy.deepcopy(base)
                        st[sub.table][i][sub.column] = val
                        try:
                            st = canonical_state(gx.env_base, st)
                        except Exception as e:  # noqa: BLE001 - counted, the next value is tried
                            self.errors.append(f"{rule}: cell {sub.table}.{sub.column}={val!r} does not load: {e}")
                            continue
                        args = dict(tmpl.args)
                        for k in args:
                            fk = self.view.fk(tmpl.table, k)
                            if fk and fk.get("table") == gx.principal:
                                args[k] = who
                        self._load(st)
                        if self._violates({"name": tmpl.name, "arguments": args}, rule):
                            p = self._probe_of({"name": tmpl.name, "arguments": args}, rule)
                            self.violations[rule].insert(0, Witness(st, p, {
                                "by": "state cell", "table": sub.table, "column": sub.column, "value": val,
                                "row": {k: row.get(k) for k in t.pk}, "found_by": "trigger analysis"}))
                            gx.walker.restore(gx.base_cp)
                            return True
        gx.walker.restore(gx.base_cp)
        return False

    def _writers_of(self, table: Any) -> set:
        """Tables whose writes (through their AFTER triggers) change `table`."""
        out = {table}
        for tr in (self.an.triggers if self.an else []):
            if any(e.table == table for e in tr.effects):
                out.add(tr.table)
        return out

    def _has_rows(self, state: dict, who: Any) -> bool:
        """Whether the principal `who` owns rows the agent can write (a booking to change...)."""
        gx = self.gx
        if gx.principal is None or who is None:
            return True
        return any(gx.owner_of(state, td.table, r) == who for td in gx.writes if td.kind == "update"
                   for r in state.get(td.table, []))

    def _probe_of(self, call: dict, rule: str) -> Probe | None:
        td = self.view.tools.get(call["name"])
        if td is None or td.kind not in ("insert", "update"):
            return None
        t = self.view.tables[td.table]
        col = next((k for k in call["arguments"] if k not in t.pk), None) if td.kind == "update" else None
        p = Probe(call["name"], dict(call["arguments"]), td.kind, td.table, column=col)
        p.rule, p.code = rule, POLICY_VIOLATION
        return p

    def _after(self, state: dict, calls: list[dict]) -> dict | None:
        w = self.gx.walker
        w.env.reset(state)
        try:
            for c in calls:
                r = w.call(c["name"], c["arguments"])
                if not r.ok:
                    return None
            return self._snap()
        finally:
            w.restore(self.gx.base_cp)

    # -- boundaries ------------------------------------------------------------------------------

    def find_boundaries(self) -> None:
        """Every rule's boundary search (`search_boundary`), in the rules' order: searching only
        the first k rules gives the same results for them (GoalDesigner searches lazily)."""
        self.start_boundaries()
        for rule in self.rules:
            self.search_boundary(rule)

    def start_boundaries(self) -> None:
        """The static analysis the boundary search of every rule reads (`search_boundary`)."""
        self._reach = None
        if self.an is not None:
            try:
                from toolkit.flows.logigen.reach import Reach

                self._reach = Reach(self.an, self.view)
                self.impossible = self._reach.impossible()
            except Exception as e:  # noqa: BLE001 - reported; every rule is searched then
                self.errors.append(f"static boundary analysis failed: {type(e).__name__}: {e}")
                self._reach = None

    def search_boundary(self, rule: str) -> None:
        """Skipped when the trigger analysis shows no state can be one action away
        (`reach.Reach.impossible`, `boundary_impossible`); else an integer update limit
        (`_update_threshold`), the targeted search (`targeted.Targeted`), the two-step one, then
        at most `max_draws` random (goal, next unit) pairs (`_state_boundary`); it stops at the
        first verified boundary. After `start_boundaries`; the walker ends on s_origin."""
        reach = self._reach
        try:
            if rule in self.impossible:
                return
            if not self.violations[rule]:
                self.dropped[rule] = "no call violates it from any state tried: no boundary either"
                return
            wits = sorted(self.violations[rule], key=lambda x: x.call.kind != "update")
            st = self.draws[rule] = {"targeted": 0, "random": 0, "found_by": None, "capped": False}
            found = self._search(rule, wits, reach, st)
            if found is not None:
                self.boundaries[rule].append(found)
                return
            two = f", {st['two_step']} two-step" if st.get("two_step") else ""
            if st["capped"]:
                self.dropped[rule] = (f"no N-1 state found within {self.max_draws} random draws (boundary_max_draws) "
                                      f"after {st['targeted']} targeted{two} ones")
            else:
                self.dropped[rule] = ("no N-1 state found: no write tried makes the violating call cross the rule "
                                      f"({st['targeted']} targeted{two}, {st['random']} random draws)")
        finally:
            self.gx.walker.restore(self.gx.base_cp)

    def _search(self, rule: str, wits: list, reach: Any, st: dict) -> tuple[Boundary, dict] | None:
        for wit in wits[:3]:
            b = self._update_threshold(rule, wit)
            if b is not None:
                st["found_by"] = "update limit"
                return b
        for wit in wits[:3]:
            b = self._amount_limit(rule, wit)
            if b is not None:
                st["found_by"] = "amount limit"
                return b
        if reach is not None:
            from toolkit.flows.logigen.targeted import Targeted

            t = Targeted(self, reach, rule, self.targeted_draws)
            try:
                b = t.run(wits[:3])
            except Exception as e:  # noqa: BLE001 - counted, the random draws still run
                self.errors.append(f"{rule}: targeted boundary search failed: {type(e).__name__}: {e}")
                b = None
            finally:
                st["targeted"] = t.tried
                self.gx.walker.restore(self.gx.base_cp)
            if b is not None:
                st["found_by"] = "targeted"
                return b
            # S reached by one or two executed writes of what the rule reads (twostep.py)
            from toolkit.flows.logigen.twostep import TwoStep

            two = TwoStep(self, reach, rule, max_calls=min(200, self._two_left))
            try:
                b = two.run(wits[:2]) if self._two_left > 0 else None
            except Exception as e:  # noqa: BLE001 - counted, the random draws still run
                self.errors.append(f"{rule}: two-step boundary search failed: {type(e).__name__}: {e}")
                b = None
            finally:
                st["two_step"] = two.tried
                self._two_left -= two.spent()
                self.gx.walker.restore(self.gx.base_cp)
            if b is not None:
                st["found_by"] = "two-step"
                return b
        self._left = self.max_draws
        for k in range(2):  # a second draw of candidates when the first finds nothing
            # one generator per rule and draw: a rule's search does not depend on the others'
            self.rng = random.Random(f"{self.seed}:{rule}:{k}")
            for wit in wits[:3]:
                b = self._state_boundary(rule, wit)
                st["random"] = self.max_draws - self._left
                if b is not None:
                    st["found_by"] = "random"
                    return b
                if self._left <= 0:
                    st["capped"] = True
                    return None
        return None

    def _snap(self) -> dict:
        """The walker's state as a dict, its checkpoint kept for `_load` (no rebuild from rows)."""
        w = self.gx.walker
        st = w.env.snapshot_loadable()  # a chain from it later resets to this dict
        self._cps[id(st)] = (st, w.cp())
        return st

    def _load(self, state: dict) -> None:
        w = self.gx.walker
        if state is self.gx.base:
            w.restore(self.gx.base_cp)
            return
        hit = self._cps.get(id(state))
        if hit is not None and hit[0] is state:
            w.restore(hit[1])
            return
        w.env.reset(state)
        self._cps[id(state)] = (state, w.cp())

    def _violates(self, call: dict, rule: str) -> bool:
        r = self.gx.walker.probe(call["name"], call["arguments"])
        return (not r.ok) and (r.error or {}).get("violated_rule") == rule

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
        for col, bad in v.args.items():
            c = t.colmap.get(col)
            if (c is None or c.pk or col not in reads or c.json_type not in ("integer", "number")
                    or isinstance(bad, bool) or not isinstance(bad, (int, float)) or bad <= 2):
                continue
            self._load(wit.origin)

            def ok(x: int, col: str = col) -> bool:
                return w.probe(v.name, {**v.args, col: x}).ok

            if not ok(1):
                continue
            lo, hi = 1, int(bad)  # lo accepted, hi refused (the witness's own amount)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if ok(mid) else (lo, mid)
            if lo <= 1:
                continue
            goal = {"name": v.name, "arguments": {**v.args, col: lo}}
            nxt = {"name": v.name, "arguments": {**v.args, col: 1}}
            for k in t.pk:  # a second row of a table keyed by the call: its own new key
                kc = t.colmap.get(k)
                if k in v.args and kc is not None and not kc.rowid_alias:
                    nxt["arguments"][k] = _new_key(wit.origin, t, kc, self.rng)
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

    def _verify(self, origin: dict, goal: dict, nxt: dict, rule: str, state_rule: bool) -> bool:
        """On origin: goal accepted (and changes the state), nxt rejected for `rule` after it; a
        state rule's nxt is not rejected for `rule` on origin itself.

        Memoized per origin (by identity, kept alive in `_cps`): a probe's outcome on a state
        (`_probe_on`) and the state after an accepted, state-changing goal (`_after_goal`, a
        checkpoint) are computed once; the search asks the same (origin, goal) for several next
        units and several rules, so most answers are a restore and one probe."""
        w = self.gx.walker
        try:
            if state_rule and self._probe_on(origin, nxt, rule):
                return False
            cp = self._after_goal(origin, goal)
            if cp is None:
                return False
            return self._probe_on(origin, nxt, rule, after=(goal, cp))
        finally:
            w.restore(self.gx.base_cp)

    @staticmethod
    def _ckey(call: dict) -> str:
        return repr((call["name"], sorted(call["arguments"].items(), key=lambda kv: str(kv[0]))))

    def _after_goal(self, origin: dict, goal: dict) -> bytes | None:
        """The checkpoint after `goal` on `origin` when it is accepted and changes the state hash."""
        key = (id(origin), self._ckey(goal))
        hit = self._goal_memo.get(key)
        if hit is not None and hit[0] is origin:
            return hit[1]
        w = self.gx.walker
        self._load(origin)
        h0 = self._origin_hash(origin)
        r = w.call(goal["name"], goal["arguments"])
        cp = w.cp() if r.ok and w.hash() != h0 else None
        self._goal_memo[key] = (origin, cp)
        return cp

    def _origin_hash(self, origin: dict) -> str:
        hit = self._hash_memo.get(id(origin))
        if hit is not None and hit[0] is origin:
            return hit[1]
        h = self.gx.walker.hash()  # the state was just loaded from `origin`
        self._hash_memo[id(origin)] = (origin, h)
        return h

    def _probe_on(self, origin: dict, call: dict, rule: str, after: tuple | None = None) -> bool:
        """Whether `call` is rejected for `rule` on `origin` (after the goal `after`, when given)."""
        key = (id(origin), self._ckey(after[0]) if after else None, self._ckey(call))
        hit = self._probe_memo.get(key)
        if hit is None or hit[0] is not origin:
            if after is None:
                self._load(origin)
            else:
                self.gx.walker.restore(after[1])
            r = self.gx.walker.probe(call["name"], call["arguments"])
            hit = self._probe_memo[key] = (origin, None if r.ok else (r.error or {}).get("violated_rule"))
        return hit[1] == rule

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

    def report(self) -> dict:
        return {"rules": len(self.rules),
                "violation": {r: len(v) for r, v in self.violations.items()},
                "boundary": {r: len(b) for r, b in self.boundaries.items()},
                "boundary_impossible": dict(self.impossible), "boundary_dropped": dict(self.dropped),
                "boundary_search": {"max_draws": self.max_draws, "rules": {r: dict(v) for r, v in self.draws.items()},
                                    "capped": sorted(r for r, v in self.draws.items() if v["capped"])},
                "errors": list(self.errors)}
