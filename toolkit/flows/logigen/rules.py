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

import random
from typing import Any

from toolkit.flows.logigen.analysis import analyze
from toolkit.flows.logigen.explorer import Boundary
from toolkit.flows.logigen.targeted import Targeted
from toolkit.flows.logigen.twostep import TwoStep
from toolkit.flows.logigen.witness_limit import LimitWitnesses
from toolkit.flows.logigen.witness_state import StateWitnesses
from toolkit.flows.logigen.witness_violation import ViolationWitnesses, Witness

DEFAULT_MAX_DRAWS = 50  # `boundary_max_draws`: fruitless random draws per rule before it is dropped
DEFAULT_TARGETED_DRAWS = 400


class RuleCoverage(ViolationWitnesses, LimitWitnesses, StateWitnesses):
    """Per trigger rule of the domain, the violation witnesses (`violations`) and the verified N-1
    boundaries (`boundaries`) the goal designer draws tasks from; every failure is counted in
    `report()`. The kinds of witness live in witness_violation.py, witness_limit.py and
    witness_state.py; the walker plumbing they share (`_load`, `_verify`, ...) here."""

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
        # the rules whose violation search has not run yet (start_violations / search_violation)
        self.pending: list[str] = []
        self.stuck: set[str] = set()
        self.boundaries: dict[str, list[tuple[Boundary, dict]]] = {r: [] for r in self.rules}

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

    def report(self) -> dict:
        return {"rules": len(self.rules),
                "violation": {r: len(v) for r, v in self.violations.items()},
                "boundary": {r: len(b) for r, b in self.boundaries.items()},
                "boundary_impossible": dict(self.impossible), "boundary_dropped": dict(self.dropped),
                "boundary_search": {"max_draws": self.max_draws, "rules": {r: dict(v) for r, v in self.draws.items()},
                                    "capped": sorted(r for r, v in self.draws.items() if v["capped"])},
                "errors": list(self.errors)}
