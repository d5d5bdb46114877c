"""What both LOGIGEN explorers (§3.5) share: the schema view, probes and the boundary checks.

Both explorers EXECUTE calls in the real sqlite environment, so s_target is the state actually
reached (no ground-truth drift) and the reference actions are the executed calls, a
policy-violating attempt included (replayed later with `expect_error`):
- `--explorer symbolic`: the goal machinery (goals.py, rules.py, drawn by synth.GoalDesigner);
- `--explorer llm`: a Client x Consultant episode (llm_explorer.py).

Here: `DomainView` (schema-derived facts), candidate calls derived from the tool schemas and the
current state only (enum values, foreign-key targets, ±1 on integers, other values of categorical
columns, cloned rows for inserts), the `Prober` that runs them one by one on a fresh copy of the
state and classifies them (ok / POLICY_VIOLATION <rule> / other error), the `Boundary` / `Draft`
records and the boundary checks. Nothing here knows a domain. A `Draft` is what the Set Designer
and the projection turn into a task record. (The older symbolic explorer that drew tasks from
these probes directly is retired; llm_seeder.BaseProbes keeps the probes the LLM boundary seeder
reads.)
"""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from toolkit.envs.sqlite import SqliteEnvironment
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
        # {table: its columns that are references}
        self.fk_cols: dict[str, frozenset] = {t.name: frozenset(fk.get("column") for fk in t.fks)
                                              for t in self.tables.values()}

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

        return self.name + json.dumps(self.args, sort_keys=True, default=str)


class Prober:
    """Runs candidate calls from one fixed state (a private environment reset before each call)."""

    def __init__(self, env_base: Any, state: dict):
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
        distinct = _distinct(rows, col.name)
        if 1 < len(distinct) <= max(4, len(rows) // 2):
            vals = [v for v in distinct if v != cur]
    return vals[:k]


_DISTINCT: dict = {}


def _distinct(rows: list, name: str) -> list:
    """The column's distinct non-null values in row order, per rows list (by identity and length;
    the entry keeps the list alive: state rows are never edited in place): every candidate row of
    a table asks again."""
    k = (id(rows), len(rows), name)
    hit = _DISTINCT.get(k)
    if hit is None or hit[0] is not rows:
        out = list(dict.fromkeys(r.get(name) for r in rows if r.get(name) is not None))
        if len(_DISTINCT) > 4096:
            _DISTINCT.clear()
        hit = _DISTINCT[k] = (rows, out)
    return hit[1]


def new_key(state: dict, table: Any, col: Any, rng: random.Random) -> Any:
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
            v = new_key(state, t, c, rng)
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
