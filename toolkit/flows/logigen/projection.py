"""LOGIGEN user-view projection (§3.5.3): one-sided, goal-first, procedure-hidden.

The user scenario keeps the what and the why and removes the how: no tool names, no schema
identifiers (snake_case table or column names), no column followed by one of its enum values
("status cancelled"), no internal ids the user could not know (technical keys, keys of rows the
task itself creates), no literal target values nobody states (values the triggers compute), no
procedure (tool-call order, "call the ... tool", "update the row"). `facts()` turns a draft into
user-visible facts; `template_view()` writes the scenario deterministically; `llm_view()` asks the
LLM (toolkit/prompts/logigen/user_view, given the facts and the policy, so the user knows what the
policy requires them to give) to phrase it, with the same leak check as a hard parse rule. `leaks()` is the rule check validate-task runs.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from toolkit import prompts
from toolkit.envs.sqlite.vocab import domain_words, words
from toolkit.flows.logigen.explorer import DomainView, Draft, Probe
from toolkit.flows.logigen.phrases import Phrases
from toolkit.roles.structured import Malformed, ask_structured, parse_json_object

VIEW_KEYS = ("instruction", "persona", "reason_for_call", "known_info", "unknown_info", "instructions")
PERSONAS = {
    "Mismatch": "A customer whose first wish conflicts with the rules; they accept the closest allowed alternative.",
    "Entangled": "A customer with two related requests that must be handled in order.",
    "Rookie": "A first-time customer who knows little about how things work here.",
    "Edge": "A careful customer who wants exactly as much as is allowed.",
}


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
    noun = domain_words(view.domain).noun(table)
    if not rookie or row is None:
        return f"{noun} {keytxt}", [f"the {noun} is {keytxt}"]
    rows = state.get(table, [])
    say = Phrases(view)
    cols = [c.name for c in t.columns if not c.pk and c.name not in view.exclude_keys and row.get(c.name) is not None
            and not c.readonly and say.nameable(table, c.name)]
    cols.sort(key=lambda c: (view.fk(table, c) is None, t.colmap[c].enum is None))  # references, then enums
    for n in (1, 2, 3):
        for combo in itertools.combinations(cols, n):
            match = [r for r in rows if all(r.get(c) == row.get(c) for c in combo)]
            if len(match) == 1:
                desc = say.row(table, {c: row[c] for c in combo})[4:]  # enum values as adjectives
                return desc, [f"it is {desc}"]
    return f"{noun} {keytxt}", [f"the {noun} is {keytxt}"]


def describe(view: DomainView, state: dict, p: Probe, rookie: bool = False) -> tuple[str, list[str]]:
    """(request in words, facts the user knows) for one write."""
    t = view.tables[p.table]
    if p.kind == "update":
        key = {k: p.args[k] for k in t.pk}
        name, known = _identify(view, state, p.table, key, rookie)
        row = next((r for r in state.get(p.table, []) if all(r.get(k) == v for k, v in key.items())), {})
        say = Phrases(view)
        parts = [say.change(p.table, k, row.get(k), v) for k, v in p.args.items() if k not in key]
        return f"have my {name} changed: {' and '.join(parts)}", known
    say = Phrases(view)
    attrs = [say.value(p.table, k, v) for k, v in p.args.items() if k not in view.exclude_keys]
    return f"create {say.a_new(p.table)} with " + ", ".join(attrs), [", ".join(attrs)]


def goal_facts(draft: Draft) -> dict:
    """User-visible facts of a goal-explorer draft: the goals in order (what, not how), the
    fallbacks, what the user knows (their identities), and behaviour cues (menu, mind change)."""
    goals: list[dict] = []
    known: list[str] = []
    for r in draft.requests:
        known += r.get("known") or []
        if r.get("identity"):
            continue
        if r.get("fallback_for") is not None and goals:
            goals[-1]["fallback"] = r["text"]
            continue
        g = {"want": r["text"]}
        for k in ("fallback", "mind_change", "violates"):
            if r.get(k):
                g[k] = r[k]
        goals.append(g)
    return {"archetype": draft.archetype, "goals": goals, "known": list(dict.fromkeys(known)),
            "patterns": list(draft.patterns), "insist": "insist" in draft.patterns}


ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth", "Ninth", "Tenth",
            "Eleventh", "Twelfth")


def step_word(i: int, n: int) -> str:
    """The word that orders the i-th (0-based) of n goals: "First", "Second", ..., "Finally".
    Words, not "(1)", "(2)": a numbered list puts small integers in the user's text, and a key
    the agent must look up (parcel 2 of a shipment) would read as one the user stated."""
    if n > 1 and i == n - 1 and i >= len(ORDINALS):
        return "Finally"
    return ORDINALS[i] if i < len(ORDINALS) else "Next"


def goal_view(f: dict) -> dict:
    goals = f["goals"]
    steps = []
    for i, g in enumerate(goals):
        s = f"{step_word(i, len(goals))}, you want {g['want']}."
        if g.get("mind_change"):
            s += f" When the agent offers the options, {g['mind_change']}."
        if g.get("violates"):
            if f.get("insist"):
                s += " If the agent says it is not allowed, insist once that you really need it;"
            else:
                s += " If the agent says it is not allowed,"
            s += f" then accept {g['fallback']}." if g.get("fallback") and not g["fallback"].startswith("drop") \
                else " then drop it and go on."
        steps.append(s)
    first = goals[0]["want"] if goals else "some help"
    wants = "; ".join(g["want"] for g in goals)
    return {"instruction": f"Hi, I'd like to ask about {first}.",
            "persona": "A customer with a goal in mind who knows their own details but not the internal "
                       "reference numbers or the rules.",
            "reason_for_call": f"wants {wants}",
            "known_info": "; ".join(f["known"]) or "only what is said in the request",
            "unknown_info": "internal reference numbers they were never given, the rules, what the options are",
            "instructions": "Tell the agent what you want, one goal at a time, in this order: " + " ".join(steps)
                            + " Let the agent look up anything you do not know. Confirm when the agent asks for "
                              "confirmation. Once everything is done, end the conversation."}


def facts(view: DomainView, draft: Draft) -> dict:
    if draft.requests:
        return goal_facts(draft)
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
    if "goals" in f:
        return goal_view(f)
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
    # literal target values the user could not know: values the task's writes produce without
    # anyone stating them (computed by triggers: a price, a copay, a generated reference)
    said = {str(v) for v in (allowed or ())}
    # a number the user states is said in any of its forms: 2500 stated, 2500.0 stored (a REAL column)
    said_nums = {_number(v) for v in said} - {None}
    produced: set[str] = set()
    # a value anywhere in s_origin (a date in the settings, a price in the catalogue) can be known
    o_vals = {str(v) for rows in (origin or {}).values() for r in rows or [] for v in r.values() if v is not None}
    for tname, t in view.tables.items():
        o_rows = {tuple(sorted((k, str(v)) for k, v in r.items())) for r in (origin or {}).get(tname, []) or []}
        for r in (target or {}).get(tname, []) or []:
            if tuple(sorted((k, str(v)) for k, v in r.items())) in o_rows:
                continue
            for c in t.columns:
                v = r.get(c.name)
                if v is None or isinstance(v, bool) or str(v) in said or str(v) in o_vals:
                    continue
                if isinstance(v, (int, float)) and _number(v) in said_nums:
                    continue
                sv = str(v)
                if isinstance(v, (int, float)) and len(sv.replace(".", "").replace("-", "").lstrip("0")) < 3:
                    continue  # small numbers occur in any text
                if isinstance(v, str) and (len(sv) < 4 or not any(ch.isdigit() for ch in sv)):
                    continue  # words ("appointment") occur in any text; codes and amounts do not
                produced.add(sv)
    # a column followed by one of its enum values ("status cancelled", "tier: gold")
    enum_phrases = []
    for t in view.tables.values():
        for c in t.columns:
            if not c.enum:
                continue
            names = {c.name, words(c.name)}
            vals = {str(v) for v in c.enum} | {words(v) for v in c.enum}
            enum_phrases.append(r"(?i)\b(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                                + r")\b\W{0,3}(?:(?:is|to|of|=|as|set to)\W{1,3})?(?:"
                                + "|".join(re.escape(v) for v in sorted(vals, key=len, reverse=True)) + r")\b")
    # a multi-word column name with spaces ("due day") and "a <plural table>" ("a new loans")
    named = domain_words(view.domain).patterns()
    return {"tool": tools, "identifier": idents, "hidden id": sorted(hidden), "target value": sorted(produced),
            "column=value": enum_phrases, "column name": named, "procedure": list(PROCEDURE)}


# tool-call order / procedure: the user view says what the user wants, never how it is done
PROCEDURE = (
    r"(?i)\b(?:call|use|run|invoke)\s+(?:the\s+)?\w*\s*(?:tool|function|api|endpoint)s?\b",
    r"(?i)\b(?:query|insert|update)\s+(?:the\s+|a\s+)?(?:table|row|record|database|column)s?\b",
    (r"(?i)\b(?:first|then|next|after that)\b[^.;]{0,40}\b(?:query|look\s*up|search)\b[^.;]{0,60}\b(?:then|and then)\b"
     r"[^.;]{0,40}\b(?:update|insert|call)\b"),
    r"(?i)\bset\s+(?:the\s+)?[a-z]+(?:_[a-z]+)+\b",
)
PATTERN_KINDS = ("column=value", "column name", "procedure")


def _number(v: Any) -> float | None:
    """The value as a number (2500, 2500.0 and "2500.0" are one), None when it is not one."""
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def leaks(texts: list[str], terms: dict[str, list[str]]) -> list[str]:
    found = []
    blob = "\n".join(t for t in texts if t)
    for kind, items in terms.items():
        for term in items:
            if kind in PATTERN_KINDS:
                m = re.search(term, blob)
                if m:
                    found.append(f"{kind} {m.group(0)!r}")
            elif re.search(r"(?<![\w-])" + re.escape(term) + r"(?![\w-])", blob):
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
    for g in f.get("goals") or []:  # goal-explorer facts: what the user wants, their fallback and mind change
        texts += [str(g.get(k) or "") for k in ("want", "fallback", "mind_change")]
    return list(dict.fromkeys(v for t in texts for v in _NUM.findall(str(t))))


def _has_value(blob: str, v: str) -> bool:
    alts = [v] + ([v[:-2]] if v.endswith(".0") else [])
    return any(re.search(r"(?<![\d.])" + re.escape(a) + r"(?![\d])", blob) for a in alts)


def parse_view(text: str | None, terms: dict[str, list[str]], required: list[str] | tuple = ()) -> dict:
    """A user view: the six keys as non-empty strings, no leaked term, and every value of
    `required` (fact_values: "Keep every concrete value from the facts exactly") present."""
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


POLICY_CHARS = 16000  # toolkit default: the whole policy of any bundled domain (~4.5k characters)


async def llm_view(client: Any, f: dict, policy: str, terms: dict, attempts: int = 3, **overrides: Any):
    """Structured (value = view dict) from the LLM, or raises RoleRejected."""
    tpl = prompts.load("logigen/user_view")
    pol = policy or "(no policy)"
    if len(pol) > POLICY_CHARS:
        pol = pol[:POLICY_CHARS] + f"\n[... policy cut at {POLICY_CHARS} characters]"
    msgs = [{"role": "user", "content": tpl.render(facts=json.dumps(f, indent=1, ensure_ascii=False), policy=pol)}]
    need = fact_values(f)
    return await ask_structured(client, msgs, lambda t: parse_view(t, terms, need), role="user_view",
                                attempts=attempts, **overrides)
