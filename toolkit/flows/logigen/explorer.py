"""LOGIGEN Explorer (§3.5): from s_origin to an executed s_target and the reference actions.

Two explorers share one contract — they EXECUTE calls in the real sqlite environment, so s_target
is the state actually reached (no ground-truth drift) and the reference actions are the executed
calls, a policy-violating attempt included (replayed later with `expect_error`):

- `symbolic` (this module): deterministic and seeded. Candidate calls are derived from the tool
  schemas and the current state only (enum values, foreign-key targets, ±1 on integers, other
  values of categorical columns, cloned rows for inserts), then probed one by one on a fresh copy
  of the state and classified (ok / POLICY_VIOLATION <rule> / other error). Goals, violating
  attempts and their one-argument corrections, and numeric boundaries are picked from those probes.
  Nothing here knows a domain: it works on any compiled sqlite domain.
- `llm` (`explore_llm`): a Client x Consultant episode through toolkit.episodes.loop.run_episode.

A `Draft` is what the Set Designer and the projection turn into a task record.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass, field
from typing import Any

from toolkit.flows.logigen.hints import _is_date, _shift_date, hint_values  # noqa: F401 - re-exported
from toolkit.flows.logigen.replay import canonical_state, execute  # noqa: F401 - re-exported

WRITE_KINDS = ("insert", "update")
POLICY_VIOLATION = "POLICY_VIOLATION"
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


# ----------------------------------------------------------------------------------------------
# what the schema says


class DomainView:
    """Schema-derived facts of a compiled sqlite environment: tables, the agent's visible tools,
    their parameters, foreign keys."""

    def __init__(self, env: Any):
        self.env = env
        self._refs: dict = {}
        dom = env.domain
        self.domain = dom
        self.tables = dom.tables
        visible = set(env.tool_names("agent"))
        self.tools = {n: td for n, td in dom.tools.items() if n in visible}
        self.writes = [td for td in self.tools.values() if td.kind in WRITE_KINDS]
        self.query_tool = {td.table: td.name for td in self.tools.values() if td.kind == "query"}
        self.params = {n: set(((td.schema.get("function") or {}).get("parameters") or {}).get("properties") or {})
                       for n, td in self.tools.items()}
        self.exclude_keys = tuple(env.exclude_keys)
        # {(table, column): its first foreign key}: asked hundreds of thousands of times per input
        self._fks: dict = {}
        for t in self.tables.values():
            for fk in t.fks:
                self._fks.setdefault((t.name, fk.get("column")), fk)

    def fk(self, table: str, col: str) -> dict | None:
        if table not in self.tables:
            raise KeyError(table)
        return self._fks.get((table, col))

    def ref_values(self, state: dict, fk: dict) -> list:
        rt = self.tables.get(fk.get("table"))
        if rt is None:
            return []
        to = fk.get("to") or (rt.pk[0] if rt.pk else None)
        if to is None:
            return []
        rows = state.get(rt.name, [])
        # memoized per rows list (by identity and length, the list kept alive by the entry): the
        # candidate generators ask for the same table's keys thousands of times per state
        key = (id(rows), len(rows), to)
        hit = self._refs.get(key)
        if hit is None or hit[0] is not rows:
            if len(self._refs) > 4096:
                self._refs.clear()
            hit = self._refs[key] = (rows, list(dict.fromkeys(r.get(to) for r in rows if r.get(to) is not None)))
        return list(hit[1])

    def tool(self, name: str):
        return self.tools[name]


# ----------------------------------------------------------------------------------------------
# probes

_SCALARS = (str, int, float, bool, type(None))


def copy_args(args: Any) -> Any:
    """A deep copy of a call's arguments: a flat dict of scalars (nearly every call) is copied
    as a dict, anything else with copy.deepcopy."""
    if type(args) is dict and all(type(v) in _SCALARS for v in args.values()):
        return dict(args)
    return copy.deepcopy(args)



@dataclass
class Probe:
    name: str
    args: dict
    kind: str
    table: str
    column: str | None = None  # update: the column it changes
    ok: bool = False
    code: str | None = None
    rule: str | None = None
    message: str | None = None
    delta: int = 0

    @property
    def violation(self) -> bool:
        return self.code == POLICY_VIOLATION

    def call(self, expect_error: str | None = None) -> dict:
        d = {"name": self.name, "arguments": copy_args(self.args)}
        if expect_error:
            d["expect_error"] = expect_error
        return d

    def sig(self) -> str:
        import json

        return self.name + json.dumps(self.args, sort_keys=True, default=str)


class Prober:
    """Runs candidate calls from one fixed state (a private environment reset before each call)."""

    def __init__(self, env_base: Any, state: dict):
        from toolkit.envs.sqlite import SqliteEnvironment

        self.state = state
        self.env = SqliteEnvironment(env_base.domain, state=state, config=env_base.config)
        self.before = self.env.snapshot()
        self.calls = 0
        self._memo: dict[str, Probe] = {}

    def close(self) -> None:
        self.env.close()

    def run(self, p: Probe) -> Probe:
        key = p.sig()
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        self.env.reset()
        res = self.env.call(p.name, copy_args(p.args))
        self.calls += 1
        p.ok = bool(res.ok)
        if not res.ok:
            err = res.error or {}
            p.code, p.rule, p.message = err.get("code"), err.get("violated_rule"), err.get("message")
        else:
            p.delta = self.env.diff(self.before)["total"]
        self._memo[key] = p
        return p

    def after(self, p: Probe) -> dict:
        """The state after running p (which must succeed)."""
        self.env.reset()
        res = self.env.call(p.name, copy_args(p.args))
        if not res.ok:
            raise RuntimeError(f"{p.name} no longer succeeds: {res.error}")
        return self.env.snapshot()


# ----------------------------------------------------------------------------------------------
# candidate calls from the schema and the state


def alt_values(view: DomainView, state: dict, table: str, col: Any, cur: Any, rng: random.Random,
               k: int = 4, hints: dict | None = None) -> list:
    """Other values a column could plausibly take (from the schema and the state): the values the
    rules compare it with first when `hints` (hints.column_hints) are given."""
    rows = state.get(table) or []
    fk = view.fk(table, col.name)
    vals: list = []
    mine = hints.get((table, col.name)) if hints and not fk and not col.enum else None
    if mine:  # the values the rules compare this column with first (hints.py)

        first = hint_values(mine, state, col, cur)
        if first:
            rest = alt_values(view, state, table, col, cur, rng, k=k)
            return list(dict.fromkeys(first + rest))[:k]
    if col.enum:
        vals = [v for v in col.enum if v != cur]
    elif fk:
        vals = [v for v in view.ref_values(state, fk) if v != cur]
        rng.shuffle(vals)
    elif col.json_type == "integer":
        vals = [1] if cur is None else [v for v in (cur + 1, cur + 2, cur - 1, cur + 4) if v >= 0]
    elif col.json_type == "number":
        if cur is not None:
            vals = [v for v in (round(cur * 1.5, 2), round(cur * 0.5, 2), round(cur + 1, 2)) if v != cur]
    elif isinstance(cur, str) and _DATE_RE.match(cur):
        vals = [v for v in (_shift_date(cur, d) for d in (1, 7, -1)) if v]
    else:
        distinct = list(dict.fromkeys(r.get(col.name) for r in rows if r.get(col.name) is not None))
        if 1 < len(distinct) <= max(4, len(rows) // 2):
            vals = [v for v in distinct if v != cur]
    return vals[:k]


def _new_key(state: dict, table: Any, col: Any, rng: random.Random) -> Any:
    existing = {r.get(col.name) for r in state.get(table.name, [])}
    if col.json_type == "integer":
        return max([v for v in existing if isinstance(v, int)] or [0]) + 1
    base = rng.choice(sorted(str(v) for v in existing if v is not None) or [f"{table.name}_1"])
    stem = re.sub(r"\d+$", "", base) or base + "_"
    for _ in range(50):
        cand = f"{stem}{rng.randint(1000, 9999)}"
        if cand not in existing:
            return cand
    return f"{stem}{len(existing) + 10000}"


def _default_value(col: Any) -> Any:
    if col.enum:
        return col.enum[0]
    return {"integer": 1, "number": 1.0, "boolean": 0}.get(col.json_type or "", "n/a")


def update_candidates(view: DomainView, state: dict, td: Any, rng: random.Random, max_rows: int = 6,
                      hints: dict | None = None) -> list[Probe]:
    """`hints`: values the rules compare a column with, tried first (hints.column_hints)."""
    t = view.tables[td.table]
    rows = list(state.get(t.name) or [])
    if not rows or not t.pk:
        return []
    if len(rows) > max_rows:
        rows = rng.sample(rows, max_rows)
    params = view.params[td.name]
    settable = [c for c in t.columns if not c.pk and c.name in params]
    out = []
    for row in rows:
        key = {k: row[k] for k in t.pk}
        for c in settable:
            for v in alt_values(view, state, t.name, c, row.get(c.name), rng, hints=hints):
                out.append(Probe(td.name, {**key, c.name: v}, "update", t.name, column=c.name))
    return out


def insert_args(view: DomainView, state: dict, td: Any, rng: random.Random, base: dict | None) -> dict:
    t = view.tables[td.table]
    params = view.params[td.name]
    args: dict = {}
    for c in t.columns:
        if c.name not in params or c.rowid_alias:
            continue
        v = (base or {}).get(c.name)
        fk = view.fk(t.name, c.name)
        if c.pk and not fk:
            v = _new_key(state, t, c, rng)
        elif fk:
            refs = view.ref_values(state, fk)
            v = rng.choice(refs) if refs else v
        elif c.default is not None and not c.pk and rng.random() < 0.6:
            continue  # leave it to the column default
        if v is None:
            if c.notnull and c.default is None:
                v = _default_value(c)
            else:
                continue
        args[c.name] = v
    return args


def insert_candidates(view: DomainView, state: dict, td: Any, rng: random.Random, n: int = 8) -> list[Probe]:
    rows = list(state.get(td.table) or [])
    out = []
    for _ in range(n):
        base = rng.choice(rows) if rows else None
        out.append(Probe(td.name, insert_args(view, state, td, rng, base), "insert", td.table))
    return out


def candidates(view: DomainView, state: dict, rng: random.Random) -> list[Probe]:
    out: list[Probe] = []
    for td in view.writes:
        out += update_candidates(view, state, td, rng) if td.kind == "update" else \
            insert_candidates(view, state, td, rng)
    return out


def one_arg_variants(view: DomainView, state: dict, p: Probe, rng: random.Random) -> list[Probe]:
    """The call with one non-key argument changed ("one valid action away")."""
    t = view.tables[p.table]
    out = []
    for k, cur in p.args.items():
        c = t.colmap.get(k)
        if c is None or c.pk and p.kind == "update":
            continue
        for v in alt_values(view, state, t.name, c, cur, rng, k=6):
            out.append(Probe(p.name, {**p.args, k: v}, p.kind, p.table, column=p.column or (k if p.kind == "update" else None)))
    return out


# ----------------------------------------------------------------------------------------------
# numeric boundaries


def int_args(view: DomainView, p: Probe) -> list[str]:
    t = view.tables[p.table]
    out = []
    for k, v in p.args.items():
        c = t.colmap.get(k)
        if c is None or c.pk or view.fk(t.name, k) or c.json_type != "integer" or isinstance(v, bool):
            continue
        out.append(k)
    return out


def find_arg_thresholds(prober: Prober, p: Probe, arg: str, span: int = 12) -> list[tuple[Probe, Probe]]:
    """Scan an integer argument upwards and downwards from its value: [(at, over)] with `at` the
    last value that succeeds and `over` = at ± 1 rejected with POLICY_VIOLATION."""
    v0 = p.args[arg]
    found = []
    for step in (1, -1):
        last_ok = p if p.ok else None
        for i in range(1, span + 1):
            v = v0 + step * i
            if v < 0:
                break
            q = prober.run(Probe(p.name, {**p.args, arg: v}, p.kind, p.table, column=p.column))
            if q.ok:
                last_ok = q
                continue
            if q.violation and last_ok is not None:
                found.append((last_ok, q))
            break
    return found


@dataclass
class Boundary:
    rule: str
    arg: str  # the argument ("NEW.col") or state cell ("table.column") at its threshold
    threshold: Any  # the last accepted value N
    goal: Probe  # the call at the boundary (accepted)
    crossing: list[dict]  # the step(s) one unit further: the last one is rejected with POLICY_VIOLATION
    seeded: dict = field(default_factory=dict)  # how s_origin was moved next to the threshold
    found_by: str = "execution search"  # or "trigger analysis"

    def as_dict(self) -> dict:
        return {"rule": self.rule, "argument": self.arg, "threshold": self.threshold,
                "goal": self.goal.call(), "crossing": self.crossing, "seeded": self.seeded,
                "found_by": self.found_by}


# ----------------------------------------------------------------------------------------------
# drafts


@dataclass
class Draft:
    """One task before projection: s_origin, the executed reference path and its annotations."""

    origin: dict
    actions: list[dict]  # reference calls (name, arguments, expect_error?) in order
    goals: list[Probe]  # the successful writes the user asks for
    attempt: Probe | None = None  # the violating first attempt (Mismatch)
    boundary: Boundary | None = None
    injections: list[dict] = field(default_factory=list)
    archetype: str = "Rookie"
    target: dict | None = None
    results: list[dict] = field(default_factory=list)  # per reference call: ok / code / rule
    trace: dict | None = None  # replay.run_traced of (origin, actions): hashes and label facts
    notes: list[str] = field(default_factory=list)
    before_goal: dict | None = None  # the state each goal description is read against
    usage: dict = field(default_factory=dict)  # LLM usage of an llm exploration
    exploration: dict = field(default_factory=dict)  # llm explorer: turns, termination, calls
    requests: list[dict] = field(default_factory=list)  # goal explorer: what the user asks, step by step
    patterns: list[str] = field(default_factory=list)  # goal explorer: option-menu, mind-change, ...
    seeded: dict = field(default_factory=dict)  # how s_origin was set up for a violation-first task


def subject_query(view: DomainView, p: Probe) -> dict | None:
    """A read that grounds the goal (the Consultant looks before it writes): the row an update
    targets, or the first referenced row of an insert."""
    t = view.tables[p.table]
    if p.kind == "update" and p.table in view.query_tool:
        return {"name": view.query_tool[p.table], "arguments": {k: p.args[k] for k in t.pk}}
    for k, v in p.args.items():
        fk = view.fk(p.table, k)
        if fk and fk.get("table") in view.query_tool:
            rt = view.tables[fk["table"]]
            to = fk.get("to") or (rt.pk[0] if rt.pk else None)
            if to:
                return {"name": view.query_tool[rt.name], "arguments": {to: v}}
    return None


class SymbolicExplorer:
    """Deterministic, seeded exploration of one base state (probes are computed once and reused
    by every task drawn from that state)."""

    def __init__(self, env_base: Any, base_state: dict, seed: int):
        self.env_base = env_base
        self.view = DomainView(env_base)
        self.base = base_state
        self.rng = random.Random(seed)
        self.prober = Prober(env_base, base_state)
        self.probes = [self.prober.run(p) for p in candidates(self.view, base_state, self.rng)]
        self.ok = [p for p in self.probes if p.ok and p.delta > 0]
        self.violating = [p for p in self.probes if p.violation]
        self._corrections: dict[str, list[Probe]] = {}
        # verified LLM boundary seeds [(Boundary, s_origin)] (llm_seeder.seed_boundaries; empty
        # unless gen-task's `llm_boundary` is on) and the share of Edge drafts that use them
        self.llm_boundaries: list[tuple[Boundary, dict]] = []
        self.llm_boundary_share = 0.5
        self._llm_used = 0
        self._add_rule_violations()

    def _add_rule_violations(self, max_calls: int = 300) -> None:
        """Discrete rules one valid action away, from the trigger analysis: for every rule that no
        random candidate provoked, the domain check's search (find_violating_call) looks for one
        call that violates it from s_origin itself (no setup call)."""
        from toolkit.flows.logigen.analysis import analyze
        from toolkit.flows.logigen.provoke import find_violating_call
        from toolkit.io import log

        try:
            rules = sorted(analyze(self.env_base).rules)
        except Exception as e:  # noqa: BLE001 - logged; the probes found so far are used
            log(f"gen-task: trigger analysis failed, no extra violating calls: {type(e).__name__}: {e}")
            return
        have = {p.rule for p in self.violating}
        for rule in rules:
            if rule in have:
                continue
            try:
                hit = find_violating_call(self.prober.env, rule, max_calls=max_calls)
            except Exception as e:  # noqa: BLE001 - logged, the next rule is searched
                log(f"gen-task: violation search for rule {rule!r} failed: {type(e).__name__}: {e}")
                continue
            if not hit or hit.get("setup"):
                continue
            call = hit["call"]
            td = self.view.tools.get(call["name"])
            if td is None or td.kind not in WRITE_KINDS:
                continue
            t = self.view.tables[td.table]
            col = next((k for k in call["arguments"] if k not in t.pk), None) if td.kind == "update" else None
            p = self.prober.run(Probe(call["name"], dict(call["arguments"]), td.kind, td.table, column=col))
            if p.violation:
                self.violating.append(p)

    def close(self) -> None:
        self.prober.close()

    @property
    def calls(self) -> int:
        return self.prober.calls

    def corrections(self, v: Probe) -> list[Probe]:
        key = v.sig()
        if key not in self._corrections:
            rng = random.Random(key)
            outs = [self.prober.run(q) for q in one_arg_variants(self.view, self.base, v, rng)]
            self._corrections[key] = [q for q in outs if q.ok and q.delta > 0]
        return self._corrections[key]

    def follow_ups(self, state: dict, first: Probe, rng: random.Random, limit: int = 12) -> list[Probe]:
        """Successful writes from the state after `first` on the same row / a linked table."""
        pr = Prober(self.env_base, state)
        try:
            cands = [p for p in candidates(self.view, state, rng)
                     if p.table == first.table or any(v == w for v in p.args.values() for w in first.args.values()
                                                      if isinstance(v, str) and len(v) >= 3)]
            rng.shuffle(cands)
            out = []
            for p in cands[:60]:
                q = pr.run(p)
                if q.ok and q.delta > 0 and q.sig() != first.sig():
                    out.append(q)
                    if len(out) >= limit:
                        break
            return out
        finally:
            pr.close()

    # -- task drafts ----------------------------------------------------------------------------

    def plain(self, rng: random.Random) -> Draft | None:
        if not self.ok:
            return None
        g = rng.choice(self.ok)
        return Draft(origin=self.base, actions=self._path([g]), goals=[g], archetype="Rookie")

    def mismatch(self, rng: random.Random) -> Draft | None:
        """A violating attempt, then a correction one argument away."""
        by_rule: dict[str, list[Probe]] = {}
        for v in self.violating:
            by_rule.setdefault(v.rule or "", []).append(v)
        rules = sorted(by_rule)
        rng.shuffle(rules)  # a rule first (so every provoked rule gets its tasks), then its calls
        pool = []
        for r in rules:
            vs = list(by_rule[r])
            rng.shuffle(vs)
            pool += vs[:3]
        for v in pool[:12]:
            fixes = self.corrections(v)
            if fixes:
                # a correction that changes an attribute (enum, number, date) reads more naturally
                # than one that switches to another referenced row; prefer it when there is one
                attr = [q for q in fixes if not any(self.view.fk(q.table, k) for k in q.args
                                                    if q.args.get(k) != v.args.get(k))]
                c = rng.choice(attr or fixes)
                acts = self._path([c], attempt=v)
                return Draft(origin=self.base, actions=acts, goals=[c], attempt=v, archetype="Mismatch")
        return None

    def entangled(self, rng: random.Random) -> Draft | None:
        if not self.ok:
            return None
        for _ in range(4):
            g1 = rng.choice(self.ok)
            s1 = self.prober.after(g1)
            fresh = self._new_keys(s1)
            # the user cannot name a row the first request creates (its key is not theirs to know)
            nxt = [p for p in self.follow_ups(s1, g1, rng)
                   if not any(isinstance(v, (int, str)) and not isinstance(v, bool) and v in fresh
                              for v in p.args.values())]
            if nxt:
                g2 = rng.choice(nxt)
                d = Draft(origin=self.base, actions=self._path([g1, g2]), goals=[g1, g2], archetype="Entangled")
                d.before_goal = s1
                return d
        return None

    def edge(self, rng: random.Random) -> Draft | None:
        """A goal exactly at a numeric boundary, s_origin seeded one unit below it (N-1).
        The trigger analysis and the execution scan first; verified LLM seeds (rules they cannot
        read) take `llm_boundary_share` of the draws while unused ones remain, and are the fallback."""
        if self.llm_boundaries and self._llm_used < len(self.llm_boundaries) and rng.random() < self.llm_boundary_share:
            d = self.llm_edge(rng)
            if d is not None:
                return d
        d = self._edge(rng)
        if d is None and self.llm_boundaries:
            d = self.llm_edge(rng)
        return d

    def llm_edge(self, rng: random.Random) -> Draft | None:
        """An Edge draft from a verified LLM boundary seed (unused ones first, in order)."""
        if not self.llm_boundaries:
            return None
        if self._llm_used < len(self.llm_boundaries):
            b, origin = self.llm_boundaries[self._llm_used]
            self._llm_used += 1
        else:
            b, origin = rng.choice(self.llm_boundaries)
        b = copy.deepcopy(b)
        d = Draft(origin=origin, actions=self._path([b.goal]), goals=[b.goal], boundary=b, archetype="Edge")
        return d if self._boundary_holds(d) else None

    def _edge(self, rng: random.Random) -> Draft | None:
        fixes = [q for qs in self._corrections.values() for q in qs]
        everything = list({p.sig(): p for p in self.ok + fixes}.values())
        state_first = rng.random() < 0.5
        if state_first:
            d = self._state_threshold(rng, everything)
            if d is not None:
                return d
        pool = [p for p in everything if int_args(self.view, p)]
        rng.shuffle(pool)
        found_by: dict = {}

        def thresholds(g: Probe):
            # the trigger analysis first (NEW.col <op> literal), then an execution scan
            for arg, at_v, over_v in self._analysis_args(g):
                at = self.prober.run(Probe(g.name, {**g.args, arg: at_v}, g.kind, g.table, column=g.column))
                over = self.prober.run(Probe(g.name, {**g.args, arg: over_v}, g.kind, g.table, column=g.column))
                if at.ok and over.violation:
                    found_by[(at.sig(), over.sig())] = "trigger analysis"
                    yield arg, (at, over)
            for a in int_args(self.view, g):
                for f in find_arg_thresholds(self.prober, g, a):
                    yield a, f

        for g in pool[:40]:
            for arg, (at, over) in thresholds(g):
                b = Boundary(rule=over.rule or "", arg=arg, threshold=at.args[arg], goal=at, crossing=[over.call()],
                             found_by=found_by.get((at.sig(), over.sig()), "execution search"))
                origin = self.base
                # numeric threshold at N-1: move the state itself next to the boundary when the
                # goal is an update of that column (executed through the tool, so side effects apply)
                if g.kind == "update" and arg == g.column and isinstance(at.args[arg], int):
                    n_minus_1 = at.args[arg] - (over.args[arg] - at.args[arg])
                    row_key = {k: v for k, v in at.args.items() if k != arg}
                    cur = self._cell(g.table, row_key, arg)
                    if cur is not None and n_minus_1 != cur and n_minus_1 >= 0:
                        seed_call = Probe(g.name, {**row_key, arg: n_minus_1}, g.kind, g.table, column=arg)
                        sp = self.prober.run(Probe(seed_call.name, dict(seed_call.args), g.kind, g.table, column=arg))
                        if sp.ok:
                            origin = self.prober.after(sp)
                            b.seeded = {"by": "executed call", "call": sp.call(), "value": n_minus_1, "was": cur}
                if not b.seeded:
                    b.seeded = {"by": "none (the boundary is one argument unit away)", "value": at.args[arg]}
                d = Draft(origin=origin, actions=[], goals=[at], boundary=b, archetype="Edge")
                d.actions = self._path([at])
                if not self._boundary_holds(d):
                    continue
                return d
        return None if state_first else self._state_threshold(rng, everything)

    def _analysis(self):
        if not hasattr(self, "_an"):
            from toolkit.flows.logigen.analysis import domain_analysis

            self._an = domain_analysis(self.env_base)
        return self._an

    def _analysis_args(self, g: Probe) -> list[tuple[str, Any, Any]]:
        """[(argument, boundary value, violating value)] for NEW.<arg> thresholds of rules the
        goal's tool can fire (toolkit.flows.logigen.analysis)."""
        an = self._analysis()
        if an is None:
            return []
        out = []
        for rc in an.rules_of(g.name) if hasattr(an, "rules_of") else []:
            if rc.table != g.table:
                continue
            for t in rc.thresholds:
                if t.ref.startswith("NEW.") and t.ref[4:] in g.args and isinstance(t.boundary, int) \
                        and t.ref[4:] in int_args(self.view, g):
                    out.append((t.ref[4:], t.boundary, t.violating))
        return out

    def _state_threshold(self, rng: random.Random, pool: list[Probe]) -> Draft | None:
        """Seed a state cell at its threshold (trigger analysis: `(SELECT col FROM t WHERE key =
        NEW.x) <op> literal`): the goal is still accepted on s_origin, and the same step once more
        is rejected — the state is one valid action away from the violation."""
        an = self._analysis()
        if an is None:
            return None
        cands = []
        for g in pool:
            for rc in an.rules_of(g.name) if hasattr(an, "rules_of") else []:
                if rc.table != g.table:
                    continue
                for cond in rc.conditions:
                    for t in rc.thresholds:
                        if t.condition != cond.text or t.ref.startswith(("NEW.", "OLD.")):
                            continue
                        sub = cond.lhs if getattr(cond.lhs, "kind", None) == "subquery" else cond.rhs
                        if getattr(sub, "kind", None) != "subquery" or not sub.keys:
                            continue
                        cands.append((g, rc, t, sub))
        rng.shuffle(cands)
        for g, rc, t, sub in cands[:12]:
            table, col = sub.table, sub.column
            if table not in self.view.tables or not isinstance(t.boundary, (int, float)):
                continue
            match = {}
            for kcol, op in sub.keys.items():
                if getattr(op, "kind", None) in ("new", "old") and op.column in g.args:
                    match[kcol.split(".")[-1]] = g.args[op.column]
                elif getattr(op, "kind", None) == "literal":
                    match[kcol.split(".")[-1]] = op.value
            rows = [r for r in self.base.get(table, []) if match and all(r.get(k) == v for k, v in match.items())]
            if len(rows) != 1:
                continue
            origin = copy.deepcopy(self.base)
            row = next(r for r in origin[table] if all(r.get(k) == v for k, v in match.items()))
            was = row.get(col)
            row[col] = t.boundary
            try:
                origin = canonical_state(self.env_base, origin)
            except Exception:  # noqa: BLE001, S112 - a seed the state cannot hold is skipped
                continue
            crossing = [g.call(), g.call()]
            b = Boundary(rule=rc.rule, arg=f"{table}.{col}", threshold=t.boundary, goal=g, crossing=crossing,
                         seeded={"by": "state cell", "table": table, "row": match, "column": col,
                                 "value": t.boundary, "was": was},
                         found_by="trigger analysis")
            d = Draft(origin=origin, actions=self._path([g]), goals=[g], boundary=b, archetype="Edge")
            ok, _ = boundary_check(self.env_base, origin, g.call(), crossing)
            if ok and boundary_rule(self.env_base, origin, crossing) == rc.rule:
                return d
        return None

    def _new_keys(self, state: dict) -> set:
        """Key values of rows in `state` that s_origin does not have."""
        out: set = set()
        for name, t in self.view.tables.items():
            if not t.pk:
                continue
            old = {tuple(r.get(k) for k in t.pk) for r in self.base.get(name, [])}
            for r in state.get(name, []):
                kv = tuple(r.get(k) for k in t.pk)
                if kv not in old:
                    out |= {v for v in kv if v is not None}
        return out

    def _cell(self, table: str, key: dict, col: str) -> Any:
        for r in self.base.get(table, []):
            if all(r.get(k) == v for k, v in key.items()):
                return r.get(col)
        return None

    def _boundary_holds(self, d: Draft) -> bool:
        """On s_origin: the goal succeeds and the crossing step is a POLICY_VIOLATION."""
        return boundary_check(self.env_base, d.origin, d.boundary.goal.call(), d.boundary.crossing,
                              rule=d.boundary.rule)[0]

    def _path(self, goals: list[Probe], attempt: Probe | None = None) -> list[dict]:
        acts = []
        q = subject_query(self.view, attempt or goals[0])
        if q:
            acts.append(q)
        if attempt is not None:
            acts.append(attempt.call(expect_error=POLICY_VIOLATION))
        acts += [g.call() for g in goals]
        return acts


def _run_crossing(env: Any, crossing: list[dict] | dict) -> tuple[Any, str, str]:
    steps = crossing if isinstance(crossing, list) else [crossing]
    for c in steps[:-1]:
        r = env.call(c["name"], copy.deepcopy(c["arguments"]))
        if not r.ok:
            return None, "", f"crossing step {c['name']} before the last one failed: {(r.error or {}).get('code')}"
    h0 = env.state_hash()
    last = steps[-1]
    r = env.call(last["name"], copy.deepcopy(last["arguments"]))
    if r.ok or (r.error or {}).get("code") != POLICY_VIOLATION:
        return None, "", f"the crossing step {last['name']} is not a policy violation from s_origin"
    if env.state_hash() != h0:
        return None, "", "the rejected crossing step changed the state"
    return r, (r.error or {}).get("violated_rule") or "", ""


def boundary_rule(env_base: Any, origin: dict, crossing: list[dict] | dict) -> str | None:
    from toolkit.envs.sqlite import SqliteEnvironment

    env = SqliteEnvironment(env_base.domain, state=origin, config=env_base.config)
    try:
        r, rule, _ = _run_crossing(env, crossing)
        return rule if r is not None else None
    finally:
        env.close()


def _argument_limit(env_base: Any, goal: dict, last: dict) -> bool:
    """Whether the next unit is the goal's own call one value further (an argument at its
    limit: the same update of the same row, or the same insert with one number or date moved),
    where no state before the goal has to be checked."""
    if goal["name"] != last["name"] or set(goal["arguments"]) != set(last["arguments"]):
        return False
    td = env_base.domain.tools.get(goal["name"])
    if td is None:
        return False
    if td.kind == "update":
        return True
    diff = [k for k in goal["arguments"] if goal["arguments"][k] != last["arguments"][k]]
    return len(diff) == 1 and all(
        (isinstance(x, (int, float)) and not isinstance(x, bool)) or _is_date(x)
        for x in (goal["arguments"][diff[0]], last["arguments"][diff[0]]))


def boundary_check(env_base: Any, origin: dict, goal: dict, crossing: list[dict] | dict,
                   rule: str | None = None) -> tuple[bool, str]:
    """(holds, reason): on s_origin the goal call succeeds, and the crossing step(s) end in a call
    rejected with POLICY_VIOLATION that leaves the state unchanged (one step from a violation).
    With `rule` (N-1 of that rule): rejected for that rule (an injected row can make another rule
    fire first), and, for a state rule (the next unit is not the goal's own update one value
    further), the next unit alone is not rejected for it on s_origin."""
    from toolkit.envs.sqlite import SqliteEnvironment

    env = SqliteEnvironment(env_base.domain, state=origin, config=env_base.config)
    try:
        r1, hit, why = _run_crossing(env, crossing)
        if r1 is None:
            return False, why
        if rule is not None:
            if hit != rule:
                return False, f"the crossing step is rejected for {hit or 'another reason'}, not for {rule}"
            last = crossing[-1] if isinstance(crossing, list) else crossing
            if not _argument_limit(env_base, goal, last):
                env.reset()
                r0 = env.call(last["name"], copy.deepcopy(last["arguments"]))
                if not r0.ok and (r0.error or {}).get("violated_rule") == rule:
                    return False, f"the next unit already breaks {rule} on s_origin: not N-1"
        rule = hit
        env.reset()
        r2 = env.call(goal["name"], copy.deepcopy(goal["arguments"]))
        if not r2.ok:
            return False, f"the boundary goal {goal['name']} fails on s_origin: {(r2.error or {}).get('code')}"
        return True, f"crossing step rejected ({rule}), goal at the boundary accepted"
    finally:
        env.close()


def probe_goals(view: DomainView, actions: list[dict]) -> list[Probe]:
    """The successful writes of a reference path as probes (in order)."""
    out = []
    for a in actions:
        td = view.tools.get(a["name"])
        if td is None or td.kind not in WRITE_KINDS or a.get("expect_error"):
            continue
        t = view.tables[td.table]
        col = next((k for k in a["arguments"] if k not in t.pk), None) if td.kind == "update" else None
        out.append(Probe(a["name"], copy.deepcopy(a["arguments"]), td.kind, td.table, column=col, ok=True))
    return out
