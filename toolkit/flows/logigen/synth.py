"""The symbolic path of `gen-task --strategy logigen`: plans a run of goal-driven tasks.

Coverage first (when `rule_coverage` is on, the default): every trigger rule with a violation
witness gets a violation-first task and every rule with an N-1 state a boundary task
(rules.RuleCoverage); then tasks are drawn with `violation_share` violation-first,
`boundary_share` boundary and the rest plain goal chains of `min_writes`..`max_writes` writes.
Resource injection (set_designer.apply_injection) keeps only injections after which the path
replays unchanged. The coverage report (rules with tasks, rules dropped with the reason, search
errors) goes to the first task's `task.extra.rule_coverage` and a summary line to stderr.
"""

from __future__ import annotations

import math
import random
from typing import Any

from toolkit.io import log

WRITES = (1, 2, 3, 3, 4, 4, 5, 5, 6, 8)


class GoalDesigner:
    def __init__(self, env: Any, base: dict, seed: int, cfg: dict):
        from toolkit.flows.logigen.goals import GoalExplorer
        from toolkit.flows.logigen.rules import RuleCoverage

        self.env = env
        self.base = base
        self.seed = seed
        self.cfg = cfg
        self.gx = GoalExplorer(env, base, seed)
        self.view = self.gx.view

        def f(k: str, d: float) -> float:
            return float(cfg.get(k) if cfg.get(k) is not None else d)

        self.violation_share = f("violation_share", 0.3)
        self.boundary_share = f("boundary_share", 0.2)
        self.inject_share = f("inject_share", 0.5)
        self.coverage_on = str(cfg.get("rule_coverage", True)).lower() not in ("0", "false", "no", "off")
        lo, hi = int(cfg.get("min_writes") or 1), int(cfg.get("max_writes") or 8)
        self.writes = [w for w in WRITES if lo <= w <= hi] or [max(lo, 1)]
        self.cov = RuleCoverage(self.gx, random.Random(f"{seed}:cov"))
        self.cov.find_violations()
        self.cov.find_boundaries()
        for e in self.cov.errors:
            log(f"gen-task: rule coverage: {e}")

    def close(self) -> None:
        self.gx.close()

    # -- one draft -------------------------------------------------------------------------------

    def draft(self, kind: str, rule: str | None, rng: random.Random):
        gx = self.gx
        want = rng.choice(self.writes)
        if kind == "mismatch":
            rules = [r for r, ws in self.cov.violations.items() if ws]
            if not rules:
                return None
            rule = rule or rng.choice(rules)
            wits = self.cov.violations[rule]
            good = [x for x in wits if self.cov._has_rows(x.origin, self.cov._owner(x.origin, x.call))]
            wit = rng.choice(good or wits)
            seg = gx.mismatch_segment(wit.call, wit.origin, rng)
            if seg is None:
                return None
            d = gx.chain(rng, wit.origin, max(want, len(seg) - 1) + 1, first=seg)
            if d is None:
                return None
            d.attempt = wit.call
            d.seeded = wit.seeded
            return d
        if kind == "edge":
            rules = [r for r, bs in self.cov.boundaries.items() if bs]
            if not rules:
                return None
            rule = rule or rng.choice(rules)
            b, origin = rng.choice(self.cov.boundaries[rule])
            st = origin
            acts, req, pats, _ = gx.plan_write(b.goal, st, rng, {}, 0.0, 0.7)
            if b.arg == b.goal.column and b.goal.kind == "update":
                req["text"] = req["text"].split(": ")[0] + ": as much as the rules allow, exactly up to the limit"
                pats = pats + ["at-limit"]
            first = [{"call": b.goal.call(), "read": acts[0] if acts else None, "request": req,
                      "patterns": pats + ["boundary"]}]
            d = gx.chain(rng, origin, max(want, 1), first=first)
            if d is None:
                return None
            d.boundary = b
            return d
        d = gx.chain(rng, self.base, max(want, 1), menu_share=0.6, lookup_share=0.8)
        return d

    # -- the run ---------------------------------------------------------------------------------

    def plan(self, n: int) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        if self.coverage_on:
            out += [("mismatch", r) for r, ws in sorted(self.cov.violations.items()) if ws]
            out += [("edge", r) for r, bs in sorted(self.cov.boundaries.items()) if bs]
        return out[:n]

    def drafts(self, n: int, max_tries: int) -> list:
        from toolkit.flows.logigen.explorer import execute
        from toolkit.flows.logigen.set_designer import STRATEGIES, apply_injection

        env = self.env
        planned = self.plan(n)
        out: list = []
        seen: set = set()
        sigs: set = set()
        made = {"mismatch": 0, "edge": 0, "goal": 0}
        failed: dict[str, int] = {}
        i = 0
        queue = list(planned)
        while len(out) < n and i < n * max_tries:
            rng = random.Random(f"{self.seed}:{i}")
            i += 1
            if queue:
                kind, rule = queue.pop(0)
            else:
                rule = None
                k = len(out) + 1
                if made["mismatch"] < math.ceil(self.violation_share * k) and any(self.cov.violations.values()):
                    kind = "mismatch"
                elif made["edge"] < math.ceil(self.boundary_share * k) and any(self.cov.boundaries.values()):
                    kind = "edge"
                else:
                    kind = "goal"
            d = self.draft(kind, rule, rng)
            if d is None:
                failed[kind] = failed.get(kind, 0) + 1
                if rule is not None and failed[kind] < 4 * len(planned) + 4:
                    queue.append((kind, rule))  # try a covered rule again with another draw
                continue
            try:
                _, d.results = execute(env, d.origin, d.actions)
            except ValueError as e:
                failed[f"{kind}: replay"] = failed.get(f"{kind}: replay", 0) + 1
                d.notes.append(str(e))
                continue
            from toolkit.flows.logigen.explorer import canonical_state, probe_goals

            d.goals = probe_goals(self.view, d.actions)
            if d.goals and rng.random() < self.inject_share:
                strat = STRATEGIES[(i + rng.randint(0, 3)) % len(STRATEGIES)]
                apply_injection(self.view, env, d, strat, rng)
            d.origin = canonical_state(env, d.origin)
            try:
                d.target, d.results = execute(env, d.origin, d.actions)
            except ValueError:
                continue
            if env.diff(d.origin, d.target)["total"] == 0:
                continue
            from toolkit.flows.logigen.validate import target_rule_violations

            broken = target_rule_violations(env, d.origin, d.target)
            if broken:
                failed["target breaks a rule"] = failed.get("target breaks a rule", 0) + 1
                continue
            key = env.hash_state(d.target)
            if key in seen:
                continue
            sig = tuple(a["name"] for a in d.actions)
            if sig in sigs and i < n * max_tries // 2 and rule is None:
                continue  # the same sequence of tools as an earlier task: draw another one
            seen.add(key)
            sigs.add(sig)
            out.append(d)
            made[kind] += 1
        self.failed = failed
        return out

    def coverage(self, drafts: list) -> dict:
        rep = self.cov.report()
        viol = sorted({d.attempt.rule for d in drafts if d.attempt is not None})
        bnd = sorted({d.boundary.rule for d in drafts if d.boundary is not None})
        rules = self.cov.rules
        rep.update(tasks_violation_rules=viol, tasks_boundary_rules=bnd,
                   violation_covered=f"{len(viol)}/{len(rules)}", boundary_covered=f"{len(bnd)}/{len(rules)}",
                   missing_violation=[r for r in rules if r not in viol],
                   missing_boundary=[r for r in rules if r not in bnd], draws_failed=dict(self.failed))
        return rep
