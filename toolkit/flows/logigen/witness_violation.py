"""Violation witnesses of the rule coverage (rules.RuleCoverage): per trigger rule, a state where
a call violates it, for violation-first tasks.

From s_origin's probes, then the domain check's search (`find_violating_call`, a setup call
allowed: its state becomes the task's s_origin), then states reached by repeating a write
(`_repeat_witness`) or whose cells the trigger analysis derives (`_cell_witness`: an OLD-row
value, a subquery column set to its violating value).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from toolkit.flows.logigen.explorer import (
    POLICY_VIOLATION,
    Probe,
    new_key,
    candidates,
    canonical_state,
)
from toolkit.flows.logigen.provoke import MAX_CALLS_PER_RULE, ViolationSearch, find_violating_call
from toolkit.flows.logigen.reach import operands


@dataclass
class Witness:
    origin: dict
    call: Probe
    seeded: dict = field(default_factory=dict)


class ViolationWitnesses:
    """RuleCoverage's violation search (the coverage's walker, analysis and memo state)."""

    def find_violations(self) -> None:
        """Every rule's violation witnesses: `start_violations`, then `search_violation` until no
        rule is left (GoalDesigner calls them lazily, in the same order, so searching the first k
        pending rules gives the same witnesses as this)."""
        self.start_violations()
        while self.search_violation():
            pass

    def start_violations(self) -> None:
        """Witnesses from s_origin's probes and the analysis' NEW.<col> thresholds (every rule at
        once, cheap), then `pending`: the rules left to `search_violation`, in the order it takes
        them (the rules with no witness, sorted, then the stuck ones: every witness belongs to
        someone with no rows of their own to go on with)."""
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
        self.pending = [r for r in self.rules if not self.violations[r]] + stuck
        self.stuck = set(stuck)
        w.restore(self.gx.base_cp)

    def search_violation(self) -> bool:
        """The next pending rule's search (after `start_violations`): a repeated call, the domain
        check's search, a state cell, derived states; False when no rule is pending. Each rule's
        search starts on s_origin and ends there, and reads only the coverage's own random
        generator, so what runs between two of them (a goal chain) changes nothing."""
        if not self.pending:
            return False
        rule = self.pending.pop(0)
        w = self.gx.walker
        w.restore(self.gx.base_cp)
        try:
            self._search_violation(rule, rule in self.stuck)
        finally:
            w.restore(self.gx.base_cp)
        return True

    def settled(self, rule: str) -> bool:
        """The rule's witnesses are final (its search ran, or it needed none)."""
        return rule not in self.pending

    def _search_violation(self, rule: str, stuck: bool) -> None:
        w = self.gx.walker
        base = self.gx.base
        if not stuck and self._repeat_witness(rule):
            return
        if stuck:
            hit = None
        else:
            try:
                # the domain check's own budget: a rule it provokes, the generator finds too
                # (citypermits' household cap: 2,209 calls, ~0.4 CPU-s, once per domain and seed)
                hit = find_violating_call(w.env, rule, max_calls=max(self.max_calls, MAX_CALLS_PER_RULE))
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
                    return
        if self.violations[rule] and self._cell_witness(rule):
            return
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
                if p is not None and (not stuck or self._has_rows(st, self._owner(st, p))):
                    self.violations[rule].append(Witness(st, p, {"by": "state cell", "derived": label}))
                    break

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
        if not any(o.kind == "subquery" and o.aggregate for rc in checks for o in operands(rc)):
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
                        args[c.name] = new_key(snap, t, c, self.rng)
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
