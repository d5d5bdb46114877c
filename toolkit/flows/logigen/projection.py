"""LOGIGEN user-view projection (§3.5.3): one-sided, goal-first, procedure-hidden.

The user scenario keeps the what and the why and removes the how: no tool names, no schema
identifiers (snake_case table or column names), no internal ids the user could not know
(technical keys, keys of rows the task itself creates). `facts()` turns a draft into
user-visible facts; `template_view()` writes the scenario deterministically; `llm_view()` asks the
LLM (toolkit/prompts/logigen/user_view) to phrase it, with the same leak check as a hard parse
rule. `leaks()` is the rule check validate-task runs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from toolkit.flows.logigen.explorer import Draft, DomainView, Probe

VIEW_KEYS = ("instruction", "persona", "reason_for_call", "known_info", "unknown_info", "instructions")
PERSONAS = {
    "Mismatch": "A customer whose first wish conflicts with the rules; they accept the closest allowed alternative.",
    "Entangled": "A customer with two related requests that must be handled in order.",
    "Rookie": "A first-time customer who knows little about how things work here.",
    "Edge": "A careful customer who wants exactly as much as is allowed.",
}


def words(ident: str) -> str:
    return str(ident).replace("_", " ").strip()


def _val(view: DomainView, table: str, col: str, v: Any) -> str:
    c = view.tables[table].colmap.get(col)
    if c is not None and c.enum and isinstance(v, str):
        return words(v)
    if v is None:
        return "none"
    return str(v)


def _identify(view: DomainView, state: dict, table: str, key: dict, rookie: bool) -> tuple[str, list[str]]:
    """How the user names a row: its key when they know it, else attributes that single it out."""
    t = view.tables[table]
    row = next((r for r in state.get(table, []) if all(r.get(k) == v for k, v in key.items())), None)
    keytxt = " ".join(f"{_val(view, table, k, v)}" for k, v in key.items())
    if not rookie or row is None:
        return f"{words(table)} {keytxt}", [f"the {words(table)} is {keytxt}"]
    rows = state.get(table, [])
    cols = [c.name for c in t.columns if not c.pk and c.name not in view.exclude_keys and row.get(c.name) is not None
            and not c.readonly]
    cols.sort(key=lambda c: (view.fk(table, c) is None, t.colmap[c].enum is None))  # references, then enums
    for n in (1, 2, 3):
        import itertools

        for combo in itertools.combinations(cols, n):
            match = [r for r in rows if all(r.get(c) == row.get(c) for c in combo)]
            if len(match) == 1:
                desc = " and ".join(f"{words(c)} {_val(view, table, c, row[c])}" for c in combo)
                return f"{words(table)} with {desc}", [f"the {words(table)} has {desc}"]
    return f"{words(table)} {keytxt}", [f"the {words(table)} is {keytxt}"]


def describe(view: DomainView, state: dict, p: Probe, rookie: bool = False) -> tuple[str, list[str]]:
    """(request in words, facts the user knows) for one write."""
    t = view.tables[p.table]
    if p.kind == "update":
        key = {k: p.args[k] for k in t.pk}
        name, known = _identify(view, state, p.table, key, rookie)
        row = next((r for r in state.get(p.table, []) if all(r.get(k) == v for k, v in key.items())), {})
        parts = []
        for k, v in p.args.items():
            if k in key:
                continue
            old = row.get(k)
            parts.append(f"the {words(k)} changed from {_val(view, p.table, k, old)} to {_val(view, p.table, k, v)}")
        return f"have {' and '.join(parts)} on my {name}", known
    attrs = [f"{words(k)} {_val(view, p.table, k, v)}" for k, v in p.args.items()
             if k not in view.exclude_keys]
    return f"create a new {words(p.table)} with " + ", ".join(attrs), [", ".join(attrs)]


def facts(view: DomainView, draft: Draft) -> dict:
    rookie = draft.archetype == "Rookie"
    out: dict = {"archetype": draft.archetype, "requests": [], "known": [], "fallback": None}
    state = draft.origin
    if draft.attempt is not None:
        want, known = describe(view, state, draft.attempt, rookie)
        fix, _ = describe(view, state, draft.goals[0], rookie)
        out["requests"].append(want)
        out["fallback"] = fix
        out["known"] += known
    else:
        for i, g in enumerate(draft.goals):
            st = draft.before_goal if (i > 0 and draft.before_goal is not None) else state
            req, known = describe(view, st, g, rookie)
            out["requests"].append(req)
            out["known"] += known
    if draft.boundary is not None:
        out["limit_note"] = "they want the largest (or smallest) amount that is still allowed, exactly as stated"
    out["known"] = list(dict.fromkeys(out["known"]))
    return out


def template_view(f: dict) -> dict:
    reqs = f["requests"]
    first = f"Hi, I'd like to {reqs[0]}."
    if f.get("fallback"):
        instr = (f"Ask to {reqs[0]}. If the agent says this is not allowed, accept it and ask instead to "
                 f"{f['fallback']}. Once that is done, end the conversation.")
        reason = f"wants to {reqs[0]}; otherwise to {f['fallback']}"
    else:
        steps = "; then ".join(reqs)
        instr = f"Ask to {steps}. Confirm when the agent asks for confirmation. Once everything is done, end the conversation."
        reason = f"wants to {steps}"
    return {"instruction": first, "persona": PERSONAS.get(f["archetype"], PERSONAS["Rookie"]),
            "reason_for_call": reason, "known_info": "; ".join(f["known"]) or "nothing beyond the request",
            "unknown_info": "the internal rules and how the system records the change",
            "instructions": instr}


# ----------------------------------------------------------------------------------------------
# the leak rule check


def forbidden_terms(view: DomainView, origin: dict | None, target: dict | None,
                    allowed: set[str] | None = None) -> dict[str, list[str]]:
    """Terms a user view must not contain: tool names, snake_case table/column names, hidden ids
    (technical-key values, keys of rows that exist only in the target). `allowed`: values the
    user states themselves (arguments of the writes they ask for, e.g. a new row's chosen key)."""
    tools = sorted(view.domain.tools)
    idents = sorted({t for t in view.tables if "_" in t}
                    | {c.name for t in view.tables.values() for c in t.columns if "_" in c.name})
    hidden: set[str] = set()
    for tname, t in view.tables.items():
        o_rows = (origin or {}).get(tname, []) or []
        for r in (target or {}).get(tname, []) or []:
            for k in view.exclude_keys:
                if k in r and r[k] is not None:
                    hidden.add(str(r[k]))
        if t.pk and target:
            okeys = {tuple(r.get(k) for k in t.pk) for r in o_rows}
            for r in target.get(tname, []) or []:
                kv = tuple(r.get(k) for k in t.pk)
                if kv not in okeys:
                    hidden |= {str(v) for v in kv if v is not None}
        for r in o_rows:
            for k in view.exclude_keys:
                if k in r and r[k] is not None:
                    hidden.add(str(r[k]))
    hidden = {h for h in hidden if len(h) >= 3} - set(allowed or ())
    return {"tool": tools, "identifier": idents, "hidden id": sorted(hidden)}


def leaks(texts: list[str], terms: dict[str, list[str]]) -> list[str]:
    found = []
    blob = "\n".join(t for t in texts if t)
    for kind, items in terms.items():
        for term in items:
            if re.search(r"(?<![\w-])" + re.escape(term) + r"(?![\w-])", blob):
                found.append(f"{kind} {term!r}")
    return found


def view_texts(task: Any) -> list[str]:
    us = getattr(task, "user_scenario", None)
    out = [getattr(task, "instruction", None)]
    if us is not None:
        out += [us.persona, us.reason_for_call, us.known_info, us.unknown_info, us.instructions]
    return [t for t in out if t]


# ----------------------------------------------------------------------------------------------
# the LLM role


_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


def fact_values(f: dict) -> list[str]:
    """The concrete numbers of the facts (ids the customer knows, amounts, counts): a user view
    that leaves one out cannot make the simulated user ask for THIS task (a vague view)."""
    texts = list(f.get("requests") or []) + list(f.get("known") or []) + [f.get("fallback") or ""]
    return list(dict.fromkeys(v for t in texts for v in _NUM.findall(str(t))))


def _has_value(blob: str, v: str) -> bool:
    alts = [v] + ([v[:-2]] if v.endswith(".0") else [])
    return any(re.search(r"(?<![\d.])" + re.escape(a) + r"(?![\d])", blob) for a in alts)


def parse_view(text: str | None, terms: dict[str, list[str]], required: list[str] | tuple = ()) -> dict:
    """A user view: the six keys as non-empty strings, no leaked term, and every value of
    `required` (fact_values: "Keep every concrete value from the facts exactly") present."""
    from toolkit.roles.structured import Malformed, parse_json_object

    obj = parse_json_object(text, required=VIEW_KEYS)
    for k in VIEW_KEYS:
        if not isinstance(obj.get(k), str) or not obj[k].strip():
            raise Malformed(f"{k!r} must be a non-empty string")
    bad = leaks([obj[k] for k in VIEW_KEYS], terms)
    if bad:
        raise Malformed("the user view reveals " + ", ".join(bad[:5]))
    blob = "\n".join(obj[k] for k in VIEW_KEYS)
    missing = [v for v in required if not _has_value(blob, v)]
    if missing:
        raise Malformed("the user view leaves out the task's value(s) " + ", ".join(missing[:5])
                        + " (keep every concrete value from the facts)")
    return {k: obj[k].strip() for k in VIEW_KEYS}


async def llm_view(client: Any, f: dict, policy: str, terms: dict, attempts: int = 3, **overrides: Any):
    """Structured (value = view dict) from the LLM, or raises RoleRejected."""
    from toolkit import prompts
    from toolkit.roles.structured import ask_structured

    tpl = prompts.load("logigen/user_view")
    msgs = [{"role": "user", "content": tpl.render(facts=json.dumps(f, indent=1, ensure_ascii=False),
                                                   policy=(policy or "")[:3000])}]
    need = fact_values(f)
    return await ask_structured(client, msgs, lambda t: parse_view(t, terms, need), role="user_view",
                                attempts=attempts, **overrides)
