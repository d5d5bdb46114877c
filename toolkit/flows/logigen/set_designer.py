"""LOGIGEN Set Designer (§3.4): s_origin for a task.

- Boundary-adjacent seeding: numeric thresholds at N-1 / discrete rules one valid action away.
  The boundary itself is found by executing calls (explorer.find_arg_threshold / corrections);
  The trigger analysis (toolkit.flows.logigen.analysis) comes first: NEW.<arg> thresholds are
  probed at their boundary/violating values, and subquery thresholds over a state cell seed that
  cell at its boundary; an execution scan of integer arguments is the fallback.
- Phase 1, resource injection: trade-offs, distractors, substitutes, noise — rows cloned from the
  state with fresh keys; an injection that changes how the reference path behaves is dropped.
- Phase 2, cast assembly: the user archetype (Mismatch, Entangled, Rookie, Edge).
Everything is recorded in `task.complexity`.
"""

from __future__ import annotations

import copy
import random
import re
from datetime import date, timedelta
from typing import Any

from toolkit.envs.sqlite import DomainError
from toolkit.flows.logigen.explorer import DomainView, Draft, boundary_check
from toolkit.flows.logigen.replay import run_traced

STRATEGIES = ("distractor", "substitute", "tradeoff", "noise")
ARCHETYPES = ("Mismatch", "Entangled", "Rookie", "Edge")
TAGS = ("Conditional-Logic", "Multi-Step", "State-Based", "Waterfall", "Adversarial", "Reasoning",
        "Hidden-Constraint")


def _fresh_key(view: DomainView, state: dict, table: str, col: Any, taken: set, j: int) -> Any:
    vals = [r.get(col.name) for r in state.get(table, [])]
    if col.json_type == "integer":
        return max([v for v in vals if isinstance(v, int)] + [v for v in taken if isinstance(v, int)] + [0]) + 1
    base = str(vals[0]) if vals else table
    stem = re.sub(r"\d+$", "", base) or base + "_"
    n = 7000 + j
    while f"{stem}{n}" in set(map(str, vals)) | {str(t) for t in taken}:
        n += 1
    return f"{stem}{n}"


def clone_row(view: DomainView, state: dict, table: str, row: dict, rng: random.Random, j: int,
              mutate: str | None = None) -> dict | None:
    """A copy of `row` with fresh key values (and unique text columns altered); `mutate`:
    None (substitute), "one" (distractor: one attribute changed), "tradeoff" (two numbers moved
    in opposite directions)."""
    t = view.tables[table]
    new = copy.deepcopy(row)
    taken: set = set()
    for k in t.pk:
        c = t.colmap[k]
        if view.fk(table, k):
            return None  # a key made of references: cloning would need new parents
        new[k] = _fresh_key(view, state, table, c, taken, j)
        taken.add(new[k])
    for c in t.columns:
        if c.pk or view.fk(table, c.name) or c.enum or c.json_type != "string":
            continue
        v = new.get(c.name)
        others = [r.get(c.name) for r in state.get(table, [])]
        if isinstance(v, str) and v and others.count(v) == 1 and len(set(others)) == len(others):
            new[c.name] = f"{v[:-1]}{chr(ord('a') + j % 26)}" if "@" not in v else v.replace("@", f"+{j}@", 1)
    nums = [c for c in t.columns if not c.pk and not view.fk(table, c.name) and c.json_type in ("integer", "number")
            and isinstance(new.get(c.name), (int, float)) and not isinstance(new.get(c.name), bool)]
    if mutate == "one":
        enums = [c for c in t.columns if c.enum and not c.pk and len(c.enum) > 1]
        if enums and (not nums or rng.random() < 0.5):
            c = rng.choice(enums)
            new[c.name] = rng.choice([v for v in c.enum if v != new.get(c.name)])
        elif nums:
            c = rng.choice(nums)
            new[c.name] = new[c.name] + (1 if c.json_type == "integer" else round(abs(new[c.name]) * 0.2 + 1, 2))
        else:
            return None
    elif mutate == "tradeoff":
        if len(nums) < 2:
            return None
        a, b = rng.sample(nums, 2)
        for c, sign in ((a, 1), (b, -1)):
            v = new[c.name]
            d = 1 if c.json_type == "integer" else round(abs(v) * 0.2 + 1, 2)
            new[c.name] = max(0, v + sign * d) if c.json_type == "integer" else round(max(0.01, v + sign * d), 2)
    return new


def generate_rows(view: DomainView, state: dict, table: str, n: int, rng: random.Random) -> list[dict]:
    """`n` new rows for `table` drawn from its column types and constraints (not copies): fresh
    keys, references to existing rows, enum values, numbers in the observed range (within CHECK
    bounds seen in the data), dates around the observed ones, text made from the column's name.
    Rows that would need a reference with no target are not generated."""
    t = view.tables[table]
    rows = state.get(table, [])
    out: list[dict] = []
    taken: set = set()
    for j in range(n):
        new: dict = {}
        for c in t.columns:
            fk = view.fk(table, c.name)
            vals = [r.get(c.name) for r in rows if r.get(c.name) is not None]
            if c.pk and not fk:
                if c.rowid_alias:
                    continue
                new[c.name] = _fresh_key(view, {table: rows + out}, table, c, taken, 100 + j)
                taken.add(new[c.name])
            elif fk:
                refs = view.ref_values(state, fk)
                if not refs:
                    return out
                new[c.name] = rng.choice(refs)
            elif c.enum:
                new[c.name] = rng.choice(list(c.enum))
            elif c.json_type == "integer" and not isinstance(c.default, str):
                lo, hi = (min(vals), max(vals)) if vals and all(isinstance(v, int) for v in vals) else (0, 5)
                new[c.name] = rng.randint(lo, max(lo, hi))
            elif c.json_type == "number":
                nums = [v for v in vals if isinstance(v, (int, float))]
                lo, hi = (min(nums), max(nums)) if nums else (1.0, 100.0)
                new[c.name] = round(rng.uniform(lo, hi), 2)
            elif vals and all(isinstance(v, str) and len(v) == 10 and v[4] == "-" for v in vals):
                d0 = date.fromisoformat(rng.choice(vals))
                new[c.name] = (d0 + timedelta(days=rng.randint(-20, 20))).isoformat()
            elif c.json_type == "string" or isinstance(rng.choice(vals) if vals else "", str):
                if not c.notnull and rng.random() < 0.3:
                    continue
                new[c.name] = f"{c.name.replace('_', ' ')} {rng.randint(100, 999)}{chr(97 + j % 26)}"
            elif c.notnull and c.default is None:
                new[c.name] = vals[0] if vals else 0
        if t.pk and all(k in new for k in t.pk) and any(all(r.get(k) == new[k] for k in t.pk) for r in rows + out):
            continue
        out.append(new)
    return out


def referenced_rows(view: DomainView, state: dict, draft: Draft) -> list[tuple[str, dict]]:
    """Rows the goal points at (foreign-key arguments), then the updated row itself."""
    out = []
    g = draft.goals[0]
    for k, v in g.args.items():
        fk = view.fk(g.table, k)
        if not fk:
            continue
        rt = view.tables.get(fk["table"])
        if rt is None:
            continue
        to = fk.get("to") or (rt.pk[0] if rt.pk else None)
        out += [(rt.name, r) for r in state.get(rt.name, []) if to and r.get(to) == v]
    if g.kind == "update":
        t = view.tables[g.table]
        out += [(t.name, r) for r in state.get(t.name, []) if all(r.get(k) == g.args.get(k) for k in t.pk)]
    return out


def inject(view: DomainView, env_base: Any, draft: Draft, strategy: str, rng: random.Random,
           volume: int = 0) -> dict | None:
    """Apply one resource-injection strategy to draft.origin; returns the record of it (or None
    when nothing fits). The caller re-executes the reference path to keep it valid."""
    # the new s_origin shares the rows of draft.origin (never mutated: new rows are appended,
    # clone_row copies the row it clones)
    state = {t: list(rows) if isinstance(rows, list) else rows for t, rows in draft.origin.items()}
    added: list[dict] = []
    if strategy == "noise" and volume > 0:
        # realistic volume: rows generated from the column types, in tables the reference path
        # does not search (a generated row must not make a look-up ambiguous or change a menu)
        queried = {view.tools[a["name"]].table for a in draft.actions
                   if a["name"] in view.tools and view.tools[a["name"]].kind == "query"}
        tables = [t for t, tt in view.tables.items() if len(state.get(t) or []) > 1 and t not in queried and tt.pk]
        rng.shuffle(tables)
        for table in tables[:3]:
            for new in generate_rows(view, state, table, volume, rng):
                state[table].append(new)
                added.append({"table": table, "row": new})
    elif strategy == "noise":
        tables = [t for t in view.tables if state.get(t)]
        rng.shuffle(tables)
        for j, table in enumerate(tables[:3]):
            for i in range(rng.randint(2, 4)):
                row = rng.choice(state[table])
                new = clone_row(view, state, table, row, rng, j * 10 + i, mutate="one")
                if new is not None:
                    state[table].append(new)
                    added.append({"table": table, "row": new})
    else:
        refs = referenced_rows(view, state, draft)
        rng.shuffle(refs)
        for j, (table, row) in enumerate(refs[:2]):
            new = clone_row(view, state, table, row, rng, j, mutate={"distractor": "one", "substitute": None,
                                                                     "tradeoff": "tradeoff"}[strategy])
            if new is not None:
                state[table].append(new)
                added.append({"table": table, "row": new, "like": {k: row.get(k) for k in view.tables[table].pk}})
    if not added:
        return None
    return {"strategy": strategy, "state": state, "rows": added}


def apply_injection(view: DomainView, env_base: Any, draft: Draft, strategy: str, rng: random.Random,
                    volume: int = 0) -> bool:
    """Inject, then re-execute the reference path on the new s_origin: keep the injection only
    when every call behaves as before (and a boundary still holds). The re-execution is the
    draft's traced run (replay.run_traced): a kept injection leaves it in `draft.trace`, with
    `draft.origin` its canonical s_origin."""
    inj = inject(view, env_base, draft, strategy, rng, volume)
    if inj is None:
        return False
    try:
        tr = run_traced(env_base, inj["state"], draft.actions)
    except (ValueError, DomainError):
        return False
    if [r["code"] for r in tr["results"]] != [r["code"] for r in draft.results]:
        return False
    if draft.boundary is not None:
        ok, _ = boundary_check(env_base, inj["state"], draft.boundary.goal.call(), draft.boundary.crossing,
                               rule=draft.boundary.rule)
        if not ok:
            return False
    draft.origin, draft.trace = tr["origin"], tr
    draft.injections.append({"strategy": strategy,
                             "rows": [{"table": a["table"], **({"like": a["like"]} if "like" in a else {})}
                                      for a in inj["rows"]][:20], "count": len(inj["rows"]),
                             **({"generated": True} if volume and strategy == "noise" else {})})
    return True


def complexity(draft: Draft, delta_tables: list[str]) -> tuple[dict, str]:
    """task.complexity and the difficulty level (L1/L2/L3, LOGIGEN §3.6)."""
    tags = []
    if draft.attempt is not None:
        tags += ["Hidden-Constraint", "Conditional-Logic", "Adversarial"]
    if len(draft.goals) > 1:
        tags.append("Multi-Step")
    if draft.boundary is not None:
        tags += ["State-Based", "Conditional-Logic"]
    if len(delta_tables) > 1:
        tags.append("Waterfall")
    if any(i["strategy"] != "noise" for i in draft.injections):
        tags.append("Reasoning")
    tags = [t for t in TAGS if t in tags]
    if {"State-Based", "Adversarial", "Waterfall"} & set(tags):
        level = "L3"
    elif tags:
        level = "L2"
    else:
        level = "L1"
    cx = {"archetype": draft.archetype, "tags": tags, "level": level,
          "injection": draft.injections, "writes": len(draft.goals),
          "violation_first": draft.attempt is not None,
          "tables_changed": delta_tables}
    if draft.attempt is not None:
        cx["violation"] = {"rule": draft.attempt.rule, "message": draft.attempt.message,
                           "attempt": draft.attempt.call(), "correction": draft.goals[0].call()}
    if draft.boundary is not None:
        cx["boundary"] = draft.boundary.as_dict()
    return cx, level
