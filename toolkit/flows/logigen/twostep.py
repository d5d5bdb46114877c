"""The two-step N-1 search: a boundary whose state one executed write cannot reach.

The targeted search (targeted.py) moves what a rule reads with ONE goal g on a state S that is
s_origin, the witness's state or a seeded cell. Some rules need S itself to be reached by writes:
a student must first leave the section that already takes their time slot before enrolling in
another one at that slot is the last allowed step; a count or a sum must first be walked to one
below its limit by writes that are not the next unit's own. Here S is reached by executing one or
two setup writes w1 (, w2) of the witness's owner, each a write that changes what the rule reads
(`reach.Reach.writers`: direct writers and writes through AFTER triggers); on each such S the
goals g are the same writers and the next units n the witness adapted to the owner, the goal
repeated (a new row of a rowid table) and the witness moved to g's row. A pair is kept when it is
a verified N-1 boundary on S (`RuleCoverage._verify`) and NOT one on s_origin (the setup matters).
The boundary records `seeded = {"by": "executed calls", "calls": [w1, w2?], "search": "two-step"}`.

Budget: at most `setups` first writes, `setups // 2` second writes per first, `goals` goals per
state, `budget` verified pairs and `max_calls` tool calls per rule (defaults 4, 2, 6, 96 and 200);
`RuleCoverage` gives the searches of one record 600 tool calls in all.
"""

from __future__ import annotations

import random
from typing import Any

from toolkit.flows.logigen.explorer import Boundary, Probe


class TwoStep:
    def __init__(self, cov: Any, reach: Any, rule: str, budget: int = 96, setups: int = 4, goals: int = 6,
                 max_calls: int = 300):
        self.cov = cov
        self.max_calls = max_calls  # tool calls (setups, goals, verifications) this rule's search may make
        self.calls0 = cov.gx.walker.calls
        self.gx = cov.gx
        self.view = cov.view
        self.reach = reach
        self.rule = rule
        self.budget = budget
        self.setups = setups
        self.goals = goals
        self.tried = 0
        self.rng = random.Random(f"{cov.seed}:{rule}:two-step")

    def _writers(self) -> set[str]:
        out: set[str] = set()
        for rc in self.cov.an.rules.get(self.rule, []):
            ok, _ = self.reach.check_movable(rc)
            for r in ok:
                out.update(self.reach.writers(r))
            out.update(rc.tools)  # the rule's own writes (a count walked by the next unit's kind)
        return {t for t in out if t in self.view.tools}

    def spent(self) -> int:
        return self.gx.walker.calls - self.calls0

    def _moves(self, state: dict, who: Any, tools: set, k: int, anchors: set) -> list[tuple[dict, dict]]:
        """Up to k accepted, state-changing writes of `tools` by `who` on `state`: (call, state after)."""
        gx, w = self.gx, self.gx.walker
        out: list = []
        if self.spent() >= self.max_calls:
            return out
        self.cov._load(state)
        base_cp = w.cp()
        h0 = w.hash()
        tries = 0
        for p in gx.step_candidates(state, self.rng, anchors, {}, {}, who, width=2, only=tools, hints=True):
            if len(out) >= k or tries >= 4 * k:  # at most 4 calls per write wanted
                break
            tries += 1
            r = w.call(p.name, p.args)
            if r.ok and w.hash() != h0:
                out.append((p.call(), self.cov._snap()))
            w.restore(base_cp)
        return out

    def run(self, wits: list) -> tuple[Boundary, dict] | None:
        tools = self._writers()
        if not tools:
            return None
        gx, cov = self.gx, self.cov
        for wit in wits[:2]:
            v = wit.call
            who = cov._owner(gx.base, v)
            vt = self.view.tables[v.table]
            row = v.args
            if v.kind == "update":
                row = next((r for r in gx.base.get(v.table, []) if all(r.get(k) == v.args.get(k) for k in vt.pk)),
                           v.args)
            anchors = {x for x in row.values() if isinstance(x, str)}
            # the owner's own writes, then anyone's (another member borrows the second-last copy)
            firsts = self._moves(gx.base, who, tools, self.setups // 2, anchors)
            firsts += [m for m in self._moves(gx.base, None, tools, self.setups, anchors) if m[0] not in
                       [f[0] for f in firsts]][:self.setups - len(firsts)]
            states: list[tuple[dict, list[dict]]] = [(s1, [c1]) for c1, s1 in firsts]
            for c1, s1 in firsts:
                states += [(s2, [c1, c2]) for c2, s2 in self._moves(s1, who, tools, max(1, self.setups // 2), anchors)]
            for st, calls in states:
                found = self._pairs_on(st, calls, v, who, tools, anchors)
                if found is not None:
                    return found
                if self.tried >= self.budget or self.spent() >= self.max_calls:
                    return None
        return None

    def _nexts(self, v: Probe, g: dict, who: Any) -> list[dict]:
        view = self.view
        vt = view.tables[v.table]
        base = dict(v.args)
        for k in v.args:
            fk = view.fk(v.table, k)
            if fk and fk.get("table") == self.gx.principal and who is not None:
                base[k] = who
        out = [{"name": v.name, "arguments": base}]
        td = view.tools.get(g["name"])
        if td is not None and td.kind == "update" and td.table == v.table and v.kind == "update":
            out.append({"name": v.name, "arguments": {**v.args, **{k: g["arguments"][k] for k in vt.pk}}})
        if td is not None and td.kind == "insert" and g["name"] == v.name:
            # the goal's own request once more (the next permit of the month, the next loan)
            out.append({"name": g["name"], "arguments": dict(g["arguments"])})
        return out

    def _pairs_on(self, st: dict, calls: list[dict], v: Probe, who: Any, tools: set, anchors: set):
        cov, gx = self.cov, self.gx
        for g, _ in self._moves(st, who, tools, self.goals, anchors):
            for n in self._nexts(v, g, who):
                if self.tried >= self.budget or self.spent() >= self.max_calls:
                    return None
                self.tried += 1
                if not cov._verify(st, g, n, self.rule, state_rule=True):
                    continue
                if cov._verify(gx.base, g, n, self.rule, state_rule=True):
                    continue  # s_origin already is one action away: the setup did not matter
                td = self.view.tools[g["name"]]
                t = self.view.tables[td.table]
                col = next((k for k in g["arguments"] if k not in t.pk), None) if td.kind == "update" else None
                gp = Probe(g["name"], dict(g["arguments"]), td.kind, td.table, column=col)
                sd = {"by": "executed calls", "calls": list(calls), "search": "two-step", "n_minus_1": True}
                return Boundary(rule=self.rule, arg=f"after {len(calls)} setup write(s)", threshold=None, goal=gp,
                                crossing=[g, n], seeded=sd, found_by="two-step search"), st
        return None
