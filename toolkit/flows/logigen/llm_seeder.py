"""LOGIGEN Set Designer, the LLM second: boundary-adjacent seeds for rules the analysis cannot read.

Boundary-adjacent seeding comes "from the triggers by analysis first, the LLM second". The trigger
analysis (analysis.py) and the execution scan (explorer.find_arg_thresholds) find numeric boundaries
of comparisons they can read. For the other rules — a firing condition with an opaque part (CASE,
julianday(...), any function) or a rule for which neither found a boundary — the role
`boundary_seeder` (prompt toolkit/prompts/logigen/boundary_seeder.v1.txt) proposes one, in a strict
JSON contract:

    {"rule": "<rule id asked for>",
     "set": [{"table": t, "key": {pk: v, ...}, "column": c, "value": x}, ...],   # existing rows' cells
     "goal": {"name": tool, "arguments": {...}},          # still accepted in the seeded state
     "crossing": [{"name": tool, "arguments": {...}}, ...],  # the last one: POLICY_VIOLATION <rule>
     "why": "..."}

A reply that breaks the contract (bad JSON, a missing key, a wrong type, an unknown table / column /
row / tool, another rule id) is Malformed and retried through toolkit.roles.structured.ask_structured;
after `attempts` it is rejected with the reasons. A well-formed proposal is then VERIFIED BY
EXECUTION exactly as the analysis-derived seeds are (explorer.boundary_check / boundary_rule): the
seeded state loads (constraints hold), the goal succeeds on it and changes the state, and the last
crossing step is rejected with POLICY_VIOLATION naming the asked rule, the state unchanged. Anything
else is discarded and counted with its reason; an LLM proposal is never trusted unverified.

Off by default on the symbolic path (the deterministic tests stay LLM-free): gen-task setting
`llm_boundary` (auto | true | false; auto = on with `--explorer llm`), `llm_boundary_rules` (only
these rule ids), `llm_boundary_max_rules` (6), `llm_boundary_share` (0.5: the share of the
boundary tasks drawn from verified LLM seeds). Role model: `boundary_seeder_model` /
`boundary_seeder_base_url` override --model / --base-url.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from toolkit import prompts
from toolkit.flows.logigen import options as O
from toolkit.flows.logigen.analysis import domain_analysis
from toolkit.flows.logigen.explorer import (
    WRITE_KINDS,
    Boundary,
    DomainView,
    Probe,
    Prober,
    boundary_check,
    boundary_rule,
    candidates,
    canonical_state,
    execute,
    find_arg_thresholds,
    int_args,
)
from toolkit.flows.logigen.set_designer import referenced_rows
from toolkit.formats.tools import tools_text
from toolkit.llm import LLMError
from toolkit.roles.structured import (
    Malformed,
    RoleRejected,
    add_usage,
    ask_structured,
    need_enum,
    new_usage,
    parse_json_object,
)

ROLE = "boundary_seeder"
FOUND_BY = "llm (verified by execution)"


class BaseProbes:
    """What the seeder reads of one base state s_origin: the domain view, the seeded candidate calls
    probed once (`ok`: those that succeed and change the state), the prober that runs more, the
    trigger analysis, and the verified seeds it keeps (`llm_boundaries`)."""

    def __init__(self, env_base: Any, base_state: dict, seed: int):
        self.env_base = env_base
        self.view = DomainView(env_base)
        self.base = base_state
        self.rng = random.Random(seed)
        self.prober = Prober(env_base, base_state)
        self.probes = [self.prober.run(p) for p in candidates(self.view, base_state, self.rng)]
        self.ok = [p for p in self.probes if p.ok and p.delta > 0]
        self.llm_boundaries: list[tuple[Boundary, dict]] = []  # verified seeds [(Boundary, s_origin)]
        self._an: Any = None
        self._an_done = False

    def analysis(self) -> Any:
        """The domain's trigger analysis (analysis.domain_analysis; None when it cannot be read), once."""
        if not self._an_done:
            self._an = domain_analysis(self.env_base)
            self._an_done = True
        return self._an

    def close(self) -> None:
        self.prober.close()


@dataclass
class SeedReport:
    """What the LLM seeding of one domain state did: asked rules, verified seeds, and the
    proposals discarded (failed verification) or rejected (malformed after retries), with reasons."""

    asked: list[str] = field(default_factory=list)
    reasons_asked: dict[str, str] = field(default_factory=dict)  # rule -> "opaque: ..." / "no boundary found"
    boundaries: list[tuple[Boundary, dict]] = field(default_factory=list)  # (boundary, s_origin)
    discarded: list[dict] = field(default_factory=list)  # {"rule", "reason"}: well-formed but unverified
    rejected: list[dict] = field(default_factory=list)  # {"rule", "reasons"}: malformed after retries
    usage: dict = field(default_factory=new_usage)
    model: str | None = None

    def summary(self) -> dict:
        counts: dict[str, int] = {}
        for d in self.discarded:
            counts[d["reason"]] = counts.get(d["reason"], 0) + 1
        return {"asked": list(self.asked), "why_asked": dict(self.reasons_asked),
                "verified": [b.rule for b, _ in self.boundaries],
                "discarded": len(self.discarded), "discarded_by_reason": counts,
                "rejected": len(self.rejected),
                "rejected_reasons": {r["rule"]: r["reasons"][-3:] for r in self.rejected},
                "model": self.model}


# ----------------------------------------------------------------------------------------------
# which rules


_CALL = re.compile(r"\bCASE\b|\b(?!SELECT\b|IN\b|EXISTS\b|AND\b|OR\b|NOT\b)[A-Za-z_]\w*\s*\(", re.IGNORECASE)


def opaque_parts(rcs: list) -> list[str]:
    """The parts of a rule's firing conditions the analysis cannot read: opaque leaves, function
    or CASE operands, and arithmetic over them (e.g. julianday(a) - julianday(b) > 30)."""
    out: list[str] = []
    for rc in rcs:
        for c in rc.conditions:
            parts = list(c.opaque_parts) if hasattr(c, "opaque_parts") else []
            for o in (c.operands() if hasattr(c, "operands") else []):
                if o.kind == "expr" and _CALL.search(o.text or ""):
                    parts.append(o.text)
            for p in parts:
                if p not in out:
                    out.append(p)
    return out


def covered_rules(explorer: Any, max_probes: int = 40) -> set[str]:
    """Rules whose boundary the analysis (a numeric threshold) or the execution scan (an integer
    argument scanned up/down from a successful call) already finds."""
    an = explorer.analysis()
    out: set[str] = set()
    if an is not None:
        out |= {rule for rule, rcs in an.rules.items() if any(rc.thresholds for rc in rcs)}
    for p in explorer.ok[:max_probes]:
        for a in int_args(explorer.view, p):
            for _, over in find_arg_thresholds(explorer.prober, p, a):
                if over.rule:
                    out.add(over.rule)
    return out


def target_rules(explorer: Any, only: list[str] | None = None,
                 max_rules: int = O.GenTaskOptions.model_fields["llm_boundary_max_rules"].default) -> list[tuple[str, str]]:
    """[(rule, why)] to ask the LLM about: rules with opaque parts first, then rules for which the
    analysis and the scan found no boundary; only rules a visible write tool can fire."""
    an = explorer.analysis()
    if an is None:
        return []
    visible = {n for n, td in explorer.view.tools.items() if td.kind in WRITE_KINDS}
    rules = [r for r in sorted(an.rules) if any(set(rc.tools) & visible for rc in an.rules[r])]
    if only:
        rules = [r for r in rules if r in set(only)]
    opaque = [(r, "opaque: " + "; ".join(opaque_parts(an.rules[r]))[:200]) for r in rules if opaque_parts(an.rules[r])]
    taken = {r for r, _ in opaque}
    rest = [r for r in rules if r not in taken]
    cov = covered_rules(explorer) if rest else set()
    none = [(r, "no boundary found by analysis or scan") for r in rest if r not in cov]
    return (opaque + none)[:max(0, max_rules)]


# ----------------------------------------------------------------------------------------------
# the prompt


def _col_line(view: Any, table: str, c: Any) -> str:
    bits = [c.name, c.decl_type or (c.json_type or "any")]
    if c.pk:
        bits.append("PK")
    if c.enum:
        bits.append("one of " + "/".join(map(str, c.enum)))
    fk = view.fk(table, c.name)
    if fk:
        bits.append(f"-> {fk.get('table')}.{fk.get('to') or '?'}")
    return " ".join(bits)


def _tables_text(view: Any, state: dict, tables: list[str], max_rows: int = 15) -> str:
    out = []
    for t in tables:
        tab = view.tables[t]
        rows = state.get(t, [])
        out.append(f"- {t} (" + ", ".join(_col_line(view, t, c) for c in tab.columns) + ")")
        for r in rows[:max_rows]:
            out.append("    " + json.dumps(r, default=str))
        if len(rows) > max_rows:
            out.append(f"    ... {len(rows) - max_rows} more rows")
    return "\n".join(out)


def relevant_tables(view: Any, rcs: list) -> list[str]:
    """The rule's table, the tables its condition names, and the rule table's references."""
    out: list[str] = []
    for rc in rcs:
        if rc.table not in view.tables:
            continue
        cands = [rc.table] + [t for t in view.tables if re.search(rf"\b{re.escape(t)}\b", rc.sql)]
        cands += [fk.get("table") for fk in view.tables[rc.table].fks]
        for t in cands:
            if t in view.tables and t not in out:
                out.append(t)
    return out


def prompt_for(explorer: Any, rule: str, policy: str) -> str:
    view = explorer.view
    rcs = explorer.analysis().rules[rule]
    rc = rcs[0]
    tools = [n for n in dict.fromkeys(t for r in rcs for t in r.tools) if n in view.tools]
    # the read tools of the relevant tables help the goal name rows; writes that can fire the rule first
    tables = relevant_tables(view, rcs)
    tools += [n for n, td in view.tools.items() if td.kind in WRITE_KINDS and td.table in tables and n not in tools]
    return prompts.load("logigen/boundary_seeder").render(
        rule=rule, message=rc.message, event=rc.event, table=rc.table,
        condition="\n".join(f"  {r.sql}" for r in rcs), policy=policy.strip() or "(none)",
        tools=tools_text([view.tools[n].schema for n in tools], "params"), tables=_tables_text(view, explorer.base, tables))


# ----------------------------------------------------------------------------------------------
# the contract (parse: Malformed -> retried) and the verification (discarded with a reason)


def _call(obj: Any, where: str, view: Any) -> dict:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments"), dict):
        raise Malformed(f"{where} must be an object {{\"name\": str, \"arguments\": object}}")
    if obj["name"] not in view.tools:
        raise Malformed(f"{where}: unknown tool {obj['name']!r}")
    params = view.params[obj["name"]]
    extra = [k for k in obj["arguments"] if k not in params]
    if extra:
        raise Malformed(f"{where}: {obj['name']} has no parameter(s) {', '.join(map(repr, extra))}")
    return {"name": obj["name"], "arguments": obj["arguments"]}


def parse_proposal(text: str | None, rule: str, view: Any, state: dict) -> dict:
    """Strict parse of the boundary_seeder reply (see the module doc); raises Malformed."""
    obj = parse_json_object(text, required=("rule", "set", "goal", "crossing"))
    if obj["rule"] != rule:
        raise Malformed(f"'rule' must be {rule!r}, got {obj['rule']!r}")
    if not isinstance(obj["set"], list):
        raise Malformed("'set' must be a list of cells")
    cells = []
    for i, c in enumerate(obj["set"]):
        w = f"set[{i}]"
        if not isinstance(c, dict) or not {"table", "key", "column", "value"} <= set(c):
            raise Malformed(f"{w} needs table, key, column and value")
        t = view.tables.get(c["table"]) if isinstance(c["table"], str) else None
        if t is None:
            raise Malformed(f"{w}: unknown table {c['table']!r}")
        if not isinstance(c["key"], dict) or set(c["key"]) != set(t.pk):
            raise Malformed(f"{w}: key must give exactly the primary key ({', '.join(t.pk)}) of {t.name}")
        if c["column"] not in t.colmap:
            raise Malformed(f"{w}: {t.name} has no column {c['column']!r}")
        if c["column"] in t.pk:
            raise Malformed(f"{w}: primary-key column {c['column']!r} cannot be set")
        if isinstance(c["value"], (dict, list)):
            raise Malformed(f"{w}: value must be a scalar")
        if not any(all(r.get(k) == v for k, v in c["key"].items()) for r in state.get(t.name, [])):
            raise Malformed(f"{w}: no {t.name} row with key {json.dumps(c['key'])}")
        cells.append({"table": t.name, "key": dict(c["key"]), "column": c["column"], "value": c["value"]})
    goal = _call(obj["goal"], "goal", view)
    if view.tools[goal["name"]].kind not in WRITE_KINDS:
        raise Malformed(f"goal: {goal['name']} is not a write tool")
    if not isinstance(obj["crossing"], list) or not obj["crossing"]:
        raise Malformed("'crossing' must be a non-empty list of calls")
    crossing = [_call(c, f"crossing[{i}]", view) for i, c in enumerate(obj["crossing"])]
    return {"rule": rule, "set": cells, "goal": goal, "crossing": crossing,
            "why": str(obj.get("why") or "")[:300]}


def verify_proposal(explorer: Any, p: dict) -> tuple[tuple[Boundary, dict] | None, str]:
    """Execute the proposal from s_origin: ((boundary, seeded s_origin), "") or (None, reason)."""
    env_base, view = explorer.env_base, explorer.view
    origin = copy.deepcopy(explorer.base)
    seeded = []
    for c in p["set"]:
        row = next(r for r in origin[c["table"]] if all(r.get(k) == v for k, v in c["key"].items()))
        seeded.append({"table": c["table"], "row": dict(c["key"]), "column": c["column"], "value": c["value"],
                       "was": row.get(c["column"])})
        row[c["column"]] = c["value"]
    try:
        origin = canonical_state(env_base, origin)
    except Exception as e:  # a CHECK / NOT NULL / type constraint (DomainError, sqlite3 errors)
        return None, f"the seeded state does not load: {type(e).__name__}: {str(e)[:120]}"
    ok, why = boundary_check(env_base, origin, p["goal"], p["crossing"])
    if not ok:
        return None, why
    hit = boundary_rule(env_base, origin, p["crossing"])
    if hit != p["rule"]:
        return None, f"the crossing step violates {hit or 'nothing'}, not {p['rule']}"
    td = view.tools[p["goal"]["name"]]
    try:
        target, _ = execute(env_base, origin, [p["goal"]])
    except ValueError as e:
        return None, f"the goal does not replay: {e}"
    if env_base.diff(origin, target)["total"] == 0:
        return None, "the goal changes nothing"
    t = view.tables[td.table]
    args = dict(p["goal"]["arguments"])
    col = next((k for k in args if k not in t.pk), None) if td.kind == "update" else None
    goal = Probe(td.name, args, td.kind, td.table, column=col, ok=True)
    last = p["crossing"][-1]
    if seeded:
        arg, threshold = f"{seeded[0]['table']}.{seeded[0]['column']}", seeded[0]["value"]
        how = {"by": "state cells (llm)", "cells": seeded}
    else:
        diff = [k for k in last["arguments"] if last["name"] == goal.name and last["arguments"].get(k) != args.get(k)]
        arg = f"NEW.{diff[0]}" if diff else goal.name
        threshold = args.get(diff[0]) if diff else None
        how = {"by": "none (the boundary is one call away)"}
    how["why"] = p["why"]
    b = Boundary(rule=p["rule"], arg=arg, threshold=threshold, goal=goal, crossing=copy.deepcopy(p["crossing"]),
                 seeded=how, found_by=FOUND_BY)
    return (b, origin), ""


# ----------------------------------------------------------------------------------------------
# the role


async def propose(client: Any, explorer: Any, rule: str, policy: str, attempts: int, sample_index: int = 0):
    text = prompt_for(explorer, rule, policy)
    return await ask_structured(client, [{"role": "user", "content": text}],
                                lambda s: parse_proposal(s, rule, explorer.view, explorer.base),
                                role=ROLE, attempts=attempts, sample_index=sample_index)


async def seed_boundaries(explorer: BaseProbes, client: Any, opts: O.GenTaskOptions, policy: str) -> SeedReport:
    """Ask the LLM for a boundary seed per target rule (`opts.llm_boundary_rules`, at most
    `opts.llm_boundary_max_rules`; `opts.attempts` tries each), verify each by execution, keep the
    verified ones on `explorer.llm_boundaries` and return the report."""
    attempts = opts.attempts
    rep = SeedReport()
    targets = target_rules(explorer, opts.llm_boundary_rules, opts.llm_boundary_max_rules)
    rep.asked = [r for r, _ in targets]
    rep.reasons_asked = dict(targets)
    if not targets:
        return rep

    async def one(k: int, rule: str):
        try:
            return await propose(client, explorer, rule, policy, attempts, sample_index=k * 10)
        except RoleRejected as e:
            return e
        except LLMError as e:  # infrastructure: the rule is simply not seeded by the LLM
            return RoleRejected(ROLE, [f"LLM error: {e}"])

    results = await asyncio.gather(*(one(k, r) for k, r in enumerate(rep.asked)))
    for rule, res in zip(rep.asked, results):
        if isinstance(res, RoleRejected):
            add_usage(rep.usage, res.usage)
            rep.rejected.append({"rule": rule, "reasons": list(res.reasons)})
            continue
        add_usage(rep.usage, res.usage)
        rep.model = res.model or rep.model
        got, why = verify_proposal(explorer, res.value)
        if got is None:
            rep.discarded.append({"rule": rule, "reason": why, "proposal": res.value})
            continue
        got[0].seeded["attempts"] = res.attempts
        rep.boundaries.append(got)
    explorer.llm_boundaries = list(rep.boundaries)
    return rep


__all__ = ["BaseProbes", "FOUND_BY", "INJECT_ROLE", "ROLE", "SeedReport", "covered_rules", "inject_llm", "opaque_parts",
           "parse_injection", "parse_proposal", "prompt_for", "propose", "seed_boundaries", "target_rules",
           "verify_injection", "verify_proposal"]


# ----------------------------------------------------------------------------------------------
# resource injection from the LLM (role `injection_designer`): distractor / substitute rows
#
# Contract: {"rows": [{"strategy": "distractor" | "substitute", "table": t, "like": {pk: v},
# "row": {col: v, ...}}]} (1 to 3 rows). Verified like the deterministic injections
# (set_designer.apply_injection): the rows load into s_origin (new keys, constraints, references),
# the reference path replays with the same outcome per call, and a recorded boundary still holds.
# Off unless gen-task's `llm_inject: true` (share `llm_inject_share`, 0.3 of the drafts).

INJECT_ROLE = "injection_designer"
INJECT_STRATEGIES = ("distractor", "substitute")


def parse_injection(text: str | None, view: Any, state: dict) -> list[dict]:
    obj = parse_json_object(text, required=("rows",))
    rows = obj["rows"]
    if not isinstance(rows, list) or not 1 <= len(rows) <= 3:
        raise Malformed("'rows' must be a list of 1 to 3 rows")
    out = []
    for i, r in enumerate(rows):
        w = f"rows[{i}]"
        if not isinstance(r, dict) or not {"strategy", "table", "like", "row"} <= set(r):
            raise Malformed(f"{w} needs strategy, table, like and row")
        strat = need_enum(r, "strategy", INJECT_STRATEGIES)
        t = view.tables.get(r["table"]) if isinstance(r["table"], str) else None
        if t is None:
            raise Malformed(f"{w}: unknown table {r['table']!r}")
        if not isinstance(r["row"], dict) or not isinstance(r["like"], dict):
            raise Malformed(f"{w}: row and like must be objects")
        bad = [k for k in r["row"] if k not in t.colmap]
        if bad:
            raise Malformed(f"{w}: {t.name} has no column(s) {', '.join(map(repr, bad))}")
        if any(isinstance(v, (dict, list)) for v in r["row"].values()):
            raise Malformed(f"{w}: row values must be scalars")
        missing = [k for k in t.pk if k not in r["row"]]
        if missing:
            raise Malformed(f"{w}: the new row needs its primary key ({', '.join(missing)})")
        if set(r["like"]) != set(t.pk) or not any(all(x.get(k) == v for k, v in r["like"].items())
                                                  for x in state.get(t.name, [])):
            raise Malformed(f"{w}: like must be the primary key of an existing {t.name} row")
        out.append({"strategy": strat, "table": t.name, "like": dict(r["like"]), "row": dict(r["row"])})
    return out


def verify_injection(env_base: Any, draft: Any, rows: list[dict]) -> tuple[dict | None, str]:
    """(new s_origin, "") when the rows load and the reference path behaves as before, else
    (None, reason)."""
    state = copy.deepcopy(draft.origin)
    for r in rows:
        t = env_base.domain.tables[r["table"]]
        key = tuple(r["row"].get(k) for k in t.pk)
        if any(tuple(x.get(k) for k in t.pk) == key for x in state.get(r["table"], [])):
            return None, f"the new {r['table']} row reuses an existing key {list(key)}"
        if r["strategy"] == "distractor":
            like = next(x for x in state[r["table"]] if all(x.get(k) == v for k, v in r["like"].items()))
            if all(r["row"].get(c.name, like.get(c.name)) == like.get(c.name) for c in t.columns if not c.pk):
                return None, "a distractor must differ from the row it imitates in some attribute"
        state.setdefault(r["table"], []).append(copy.deepcopy(r["row"]))
    try:
        state = canonical_state(env_base, state)
    except Exception as e:
        return None, f"the injected state does not load: {type(e).__name__}: {str(e)[:120]}"
    try:
        _, results = execute(env_base, state, draft.actions)
    except ValueError as e:
        return None, f"the reference path no longer replays: {e}"
    if [r["code"] for r in results] != [r["code"] for r in draft.results]:
        return None, "the injection changes how the reference path behaves"
    if draft.boundary is not None:
        ok, why = boundary_check(env_base, state, draft.boundary.goal.call(), draft.boundary.crossing)
        if not ok:
            return None, f"the boundary no longer holds: {why}"
    return state, ""


def injection_prompt(view: Any, draft: Any) -> str:
    used = referenced_rows(view, draft.origin, draft)
    tables = list(dict.fromkeys([t for t, _ in used] + [g.table for g in draft.goals]))
    return prompts.load("logigen/injection_designer").render(
        actions="\n".join("  " + json.dumps(a, default=str) for a in draft.actions),
        used="\n".join(f"  {t}: {json.dumps(r, default=str)}" for t, r in used) or "  (none)",
        tables=_tables_text(view, draft.origin, tables))


async def inject_llm(client: Any, view: Any, env_base: Any, draft: Any, attempts: int, sample_index: int = 0) -> dict:
    """Ask for injected rows for one draft, verify, apply. Returns {"applied": bool, "reason",
    "usage"}; on success draft.origin / target / results are updated and draft.injections records
    it with "source": "llm"."""
    try:
        st = await ask_structured(client, [{"role": "user", "content": injection_prompt(view, draft)}],
                                  lambda s: parse_injection(s, view, draft.origin), role=INJECT_ROLE,
                                  attempts=attempts, sample_index=sample_index)
    except RoleRejected as e:
        return {"applied": False, "reason": "malformed: " + "; ".join(e.reasons[-2:]), "usage": e.usage}
    except LLMError as e:
        return {"applied": False, "reason": f"LLM error: {e}", "usage": new_usage()}
    state, why = verify_injection(env_base, draft, st.value)
    if state is None:
        return {"applied": False, "reason": why, "usage": st.usage}
    draft.origin = state
    draft.target, draft.results = execute(env_base, state, draft.actions)
    for strat in dict.fromkeys(r["strategy"] for r in st.value):
        rows = [r for r in st.value if r["strategy"] == strat]
        draft.injections.append({"strategy": strat, "source": "llm", "count": len(rows),
                                 "rows": [{"table": r["table"], "like": r["like"]} for r in rows]})
    return {"applied": True, "reason": "", "usage": st.usage}
