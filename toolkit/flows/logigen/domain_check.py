"""The deterministic domain check: is a sqlite domain a sound LOGIGEN policy environment?

Used alone (`toolkit domain check PATH`), by the Architect's Check-Fix-Verify loop (gen-plan) and by
validate-task. Nothing here is specific to a domain. API::

    from toolkit.flows.logigen.domain_check import check_domain
    report = check_domain("path/to/domain")     # or a bundled name, a DomainSpec, or a spec dict
    report.ok, report.reasons                   # bool, ["rule 'x': ...", ...]
    report.to_dict()                            # the JSON report (see below)
    find_violating_call(env, "rule_id", state)  # (toolkit.flows.logigen.provoke) one call violating the rule

Checks (each failure adds a reason that names the rule/table/tool/trigger):

1. `compile`: DDL, seed and tools.yaml compile (DomainError text otherwise; nothing else runs).
2. `rules_in_policy`: every rule a trigger raises is a policy rule id (`[rule_id]` at the start of a
   policy bullet); every RAISE uses the `POLICY_VIOLATION: <rule>: <message>` format.
3. `policy_enforced`: every policy rule id is raised by a trigger or names a CHECK constraint
   (`CONSTRAINT <rule_id> CHECK (...)`).
4. `no_delete`: no delete tools; no trigger deletes rows (soft-delete through status columns).
5. `pk_not_null`: primary-key columns cannot be NULL (SQLite lets a non-INTEGER PRIMARY KEY hold
   NULL unless it is declared NOT NULL).
6. `reference_writes`: a *reference table* (read by the triggers or referenced by a foreign key,
   never written by a trigger, no rule guarding that write) should have no visible insert/update
   tool unless the tool is flagged deliberate in tools.yaml (`tools: {update_x: {reference_write:
   true}}`). Reported as a warning; a failure with `strict=True` (`--strict`), because whether a
   table is reference data is a judgement (a customer's contact details are referenced too).
7. `descriptions`: every rule's tool lists it under "Preconditions" as a rule (`[rule] message`,
   a message in words, not SQL), and every AFTER trigger's side effect is described on its tool.
8. `provoked`: each rule is provoked by an actual tool call found by search: candidate arguments
   and states derived from the analyzed condition (`analysis.py`: subquery rows, literals,
   thresholds, OLD-row states), then a search over existing rows x tool schemas (single and joint
   mutations of valid calls, and a second call after a successful one). The provoking call must
   return {code: POLICY_VIOLATION, violated_rule: <rule>, hint} with the policy bullet as hint and
   leave the state hash unchanged. A rule enforced only by a CHECK constraint is provoked the same
   way with the CONSTRAINT error naming it. A rule that only hidden tools can fire is provoked
   through them (`via_hidden_tool`) with a warning: the agent can never violate it.

Report (JSON)::

    {"domain", "source", "ok", "reasons": [...], "warnings": [...], "seconds",
     "checks": {name: {"ok", "reasons"}},
     "rules": {rule: {"enforced_by": [...], "in_policy", "provoked", "call": {"name", "arguments"},
                      "state": "initial" | "derived: ..." | "after: <call>", "error": {...},
                      "hint_found", "state_unchanged", "described", "side_effects_described",
                      "attempts"}}}
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.domains import domain_path
from toolkit.envs.sqlite import (
    DomainError,
    DomainSpec,
    SqliteEnvironment,
    compile_domain,
    load_domain_spec,
    spec_from_dict,
)
from toolkit.flows.logigen.analysis import analyze
from toolkit.flows.logigen.provoke import (
    MAX_CALLS_PER_RULE,
    ViolationSearch,
    hidden_tools_search,
    named_checks,
)

__all__ = ["DomainReport", "check_domain", "policy_rule_ids"]

_POLICY_ID_RE = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+(?:\*\*|__)?\[([A-Za-z0-9_.:-]+)\]", re.MULTILINE)
_SQLISH = re.compile(r"\b(?:NEW|OLD)\.\w|\bSELECT\b|\bWHERE\b|<>|!=|\bIS NOT NULL\b")  # case-sensitive


@dataclass
class DomainReport:
    domain: str
    source: str | None
    checks: dict[str, dict] = field(default_factory=dict)
    rules: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0

    def fail(self, check: str, reason: str) -> None:
        c = self.checks.setdefault(check, {"ok": True, "reasons": []})
        c["ok"] = False
        c["reasons"].append(reason)

    def passed(self, check: str) -> None:
        self.checks.setdefault(check, {"ok": True, "reasons": []})

    def warn(self, check: str, message: str) -> None:
        """Reported (JSON and summary) without failing the check."""
        c = self.checks.setdefault(check, {"ok": True, "reasons": []})
        c.setdefault("warnings", []).append(message)

    @property
    def warnings(self) -> list[str]:
        return [f"{name}: {w}" for name, c in self.checks.items() for w in c.get("warnings", [])]

    @property
    def reasons(self) -> list[str]:
        return [f"{name}: {r}" for name, c in self.checks.items() for r in c["reasons"]]

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks.values())

    def to_dict(self) -> dict:
        return {"domain": self.domain, "source": self.source, "ok": self.ok, "reasons": self.reasons,
                "warnings": self.warnings, "seconds": round(self.seconds, 4), "checks": self.checks, "rules": self.rules}

    def summary(self) -> str:
        lines = [f"domain {self.domain}: {'PASS' if self.ok else 'FAIL'} "
                 f"({sum(1 for r in self.rules.values() if r.get('provoked'))}/{len(self.rules)} rules provoked, "
                 f"{self.seconds:.2f}s)"]
        for name, c in self.checks.items():
            lines.append(f"  {'ok  ' if c['ok'] else 'FAIL'} {name}")
            for r in c["reasons"][:20]:
                lines.append(f"       - {r}")
            if len(c["reasons"]) > 20:
                lines.append(f"       ... {len(c['reasons']) - 20} more")
            for w in c.get("warnings", [])[:20]:
                lines.append(f"       ~ warning: {w}")
        return "\n".join(lines)


def policy_rule_ids(policy: str) -> list[str]:
    """Rule ids declared in a policy: `[rule_id]` at the start of a bullet (bold or not)."""
    out: list[str] = []
    for m in _POLICY_ID_RE.finditer(policy or ""):
        if m.group(1) not in out:
            out.append(m.group(1))
    return out


# ----------------------------------------------------------------------------------------------


def _load(target: Any):
    """-> (CompiledDomain | None, name, source, error)."""
    name, source = "domain", None
    try:
        if isinstance(target, DomainSpec):
            spec = target
        elif isinstance(target, dict):
            spec = spec_from_dict(target)
        else:
            p = Path(str(target))
            if not p.exists() and re.match(r"^[a-z0-9_]+$", str(target)):
                try:
                    p = domain_path(str(target))
                except KeyError:
                    pass
            source = str(p)
            name = p.stem
            spec = load_domain_spec(p)
        name = spec.name
        return compile_domain(spec), name, source or spec.source, None
    except DomainError as e:
        return None, name, source, str(e)
    except (OSError, ValueError) as e:  # unreadable file, bad YAML/JSON
        return None, name, source, f"{type(e).__name__}: {e}"


def check_domain(target: Any, *, max_calls: int = MAX_CALLS_PER_RULE, strict: bool = False) -> DomainReport:
    """Run every check on a domain (path, bundled name, DomainSpec or spec dict). Never raises on
    a bad domain: problems are reasons in the report. `strict`: unflagged writes on reference
    tables fail the check (default: they are warnings)."""
    t0 = time.perf_counter()
    dom, name, source, err = _load(target)
    rep = DomainReport(domain=name, source=source)
    if dom is None:
        rep.fail("compile", err or "does not compile")
        rep.seconds = time.perf_counter() - t0
        return rep
    rep.passed("compile")
    env = SqliteEnvironment(dom)
    try:
        an = analyze(env)
        policy_ids = policy_rule_ids(dom.spec.policy)
        named = named_checks(dom.spec.schema_sql)
        steps = [("rules_in_policy", lambda: _check_rules_policy(rep, dom, an, policy_ids, named)),
                 ("no_delete", lambda: _check_no_delete(rep, dom, an)),
                 ("pk_not_null", lambda: _check_pk(rep, dom)),
                 ("reference_writes", lambda: _check_reference_writes(rep, dom, an, env, strict)),
                 ("descriptions", lambda: _check_descriptions(rep, dom, an, env)),
                 ("insert_update_guard", lambda: _check_insert_update(rep, dom, an, strict)),
                 ("provoked", lambda: _check_provoked(rep, dom, an, env, named, max_calls))]
        for check, step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - a checker bug is a failed check, never a traceback
                rep.fail(check, f"internal error while checking: {type(e).__name__}: {e}")
    finally:
        env.close()
    rep.seconds = time.perf_counter() - t0
    return rep


def _check_rules_policy(rep: DomainReport, dom: Any, an: Any, policy_ids: list[str], named: dict) -> None:
    rep.passed("rules_in_policy")
    rep.passed("policy_enforced")
    for rule, checks in an.rules.items():
        info = rep.rules.setdefault(rule, {})
        info["enforced_by"] = [f"trigger {rc.trigger}" for rc in checks]
        info["in_policy"] = rule in policy_ids
        if rule not in policy_ids:
            rep.fail("rules_in_policy", f"rule {rule!r} raised by trigger {checks[0].trigger} is not a policy rule "
                                        f"(no '[{rule}]' bullet in the policy)")
    for t in an.triggers:
        for msg in t.unparsed:
            rep.fail("rules_in_policy", f"trigger {t.name} raises {msg[:80]!r} without the "
                                        f"'POLICY_VIOLATION: <rule>: <message>' format")
    if not policy_ids:
        rep.fail("policy_enforced", "the policy declares no rule ids ('- **[rule_id]** text' bullets)")
    for rule in policy_ids:
        if rule in an.rules:
            continue
        if rule in named:
            info = rep.rules.setdefault(rule, {})
            info["enforced_by"] = [f"CHECK constraint {rule} on {named[rule]}"]
            info["in_policy"] = True
            continue
        rep.fail("policy_enforced", f"policy rule {rule!r} is enforced by no trigger and no CHECK constraint "
                                    f"(raise 'POLICY_VIOLATION: {rule}: ...' or name a constraint {rule})")
        rep.rules.setdefault(rule, {"enforced_by": [], "in_policy": True, "provoked": False})


def _check_insert_update(rep: DomainReport, dom: Any, an: Any, strict: bool = False) -> None:
    """A numeric limit on NEW.<col> checked on INSERT but not on UPDATE of the same table (or the
    reverse) while a tool can write that column the other way: the limit can be dodged (a target
    state may break it). A warning by default, a failure with --strict."""
    rep.passed("insert_update_guard")
    for rule, checks in an.rules.items():
        limits: dict[tuple[str, str], set[str]] = {}
        for rc in checks:
            if re.search(r"\bOLD\.", rc.sql or ""):
                continue  # a transition rule (needs the old row): meaningless on INSERT
            for cond in rc.conditions:  # NEW.col <op> (a literal, a subquery, an expression)
                if cond.kind != "compare" or cond.op not in ("<", "<=", ">", ">="):
                    continue
                for side in (cond.lhs, cond.rhs):
                    if getattr(side, "kind", None) == "new" and getattr(side, "column", None):
                        limits.setdefault((rc.table, side.column), set()).add(rc.event.split()[0].upper())
        for (table, col), events in sorted(limits.items()):
            # any rule's trigger on the other event that reads the column guards it (a rule that
            # freezes the column after insert makes the limit impossible to dodge too)
            guarded = {rc.event.split()[0].upper() for cs in an.rules.values() for rc in cs if rc.table == table
                       and re.search(r"\b(NEW|OLD)\." + re.escape(col) + r"\b", rc.sql or "")
                       and (rc.event.upper().startswith("INSERT") or not rc.columns or col in rc.columns)}
            for ev, other, tool in (("INSERT", "UPDATE", f"update_{table}"), ("UPDATE", "INSERT", f"insert_{table}")):
                td = dom.tools.get(tool)
                t = dom.tables.get(table)
                if ev not in events or other in guarded or td is None or t is None or td.hidden:
                    continue
                c = t.colmap.get(col)
                if c is None or c.readonly or c.pk:
                    continue
                msg = (f"rule {rule!r} limits {table}.{col} on {ev} but no {other} trigger checks it: "
                       f"{tool} can write {col} past the limit (guard both events)")
                (rep.fail if strict else rep.warn)("insert_update_guard", msg)


def _check_no_delete(rep: DomainReport, dom: Any, an: Any) -> None:
    rep.passed("no_delete")
    for name, td in dom.tools.items():
        if td.kind not in ("query", "insert", "update") or name.startswith(("delete_", "remove_")):
            rep.fail("no_delete", f"tool {name} deletes rows; use a status column (soft delete)")
    for t in an.triggers:
        for e in t.effects:
            if e.verb == "deletes from":
                rep.fail("no_delete", f"trigger {t.name} deletes from {e.table}; use a status column (soft delete)")


def _check_pk(rep: DomainReport, dom: Any) -> None:
    rep.passed("pk_not_null")
    for t in dom.tables.values():
        for c in t.columns:
            if c.pk and not c.rowid_alias and not c.notnull and not t.without_rowid:
                rep.fail("pk_not_null", f"{t.name}.{c.name} is a primary key that can be NULL "
                                        f"(declare it {c.decl_type or ''} PRIMARY KEY NOT NULL)".replace("  ", " "))


def _check_reference_writes(rep: DomainReport, dom: Any, an: Any, env: Any, strict: bool = False) -> None:
    rep.passed("reference_writes")
    read: set[str] = set()
    for checks in an.rules.values():
        for rc in checks:
            for c in rc.conditions:
                for o in c.operands():
                    if o.kind == "subquery":
                        read.update(o.tables.values() or ([o.table] if o.table else []))
    referenced = {fk["table"] for t in dom.tables.values() for fk in t.fks}
    written = {e.table for t in an.after for e in t.effects}
    guarded = {(rc.table, rc.event) for checks in an.rules.values() for rc in checks}
    flagged = {n for n, o in ((dom.spec.tools or {}).get("tools") or {}).items()
               if isinstance(o, dict) and o.get("reference_write")}
    visible = set(env.tool_names("agent")) | set(env.tool_names("user"))
    for tname in dom.tables:
        if tname not in (read | referenced) or tname in written:
            continue
        for ev in ("INSERT", "UPDATE"):
            tool = f"{ev.lower()}_{tname}"
            if tool in dom.tools and tool in visible and (tname, ev) not in guarded and tool not in flagged:
                (rep.fail if strict else rep.warn)("reference_writes", f"{tool} writes reference table {tname} (read by the rules or "
                                             f"referenced by keys) with no rule guarding it: hide it in tools.yaml "
                                             f"or flag it with tools.{tool}.reference_write: true")


def _check_descriptions(rep: DomainReport, dom: Any, an: Any, env: Any) -> None:
    rep.passed("descriptions")
    visible = set(env.tool_names("agent"))
    for rule, checks in an.rules.items():
        info = rep.rules.setdefault(rule, {})
        described = True
        for rc in checks:
            tool = rc.tools[0]
            if _SQLISH.search(rc.message):
                rep.fail("descriptions", f"rule {rule!r}: the message {rc.message[:80]!r} reads like SQL; phrase "
                                         f"the precondition as the rule in words")
                described = False
            if tool not in visible:
                continue
            desc = dom.tools[tool].schema["function"].get("description", "")
            if f"[{rule}]" not in desc:
                rep.fail("descriptions", f"rule {rule!r}: the description of {tool} does not list it as a "
                                         f"precondition ('[{rule}] {rc.message[:60]}')")
                described = False
        info["described"] = described
    for t in an.after:
        if not t.effects or not t.tools:
            continue
        tool = t.tools[0]
        if tool not in visible:
            continue
        desc = dom.tools[tool].schema["function"].get("description", "")
        if "Side effects" not in desc or not all(e.table in desc for e in t.effects):
            rep.fail("descriptions", f"the side effects of trigger {t.name} ({', '.join(sorted({e.table for e in t.effects}))}) "
                                     f"are not described on {tool}")
            for checks in an.rules.values():
                for rc in checks:
                    if rc.tools[0] == tool:
                        rep.rules.setdefault(rc.rule, {})["side_effects_described"] = False
    for checks in an.rules.values():
        for rc in checks:
            rep.rules.setdefault(rc.rule, {}).setdefault("side_effects_described", True)


def _bullet_text(policy: str, rule: str) -> str:
    """The text of the policy bullet that declares `[rule]` (markup removed), '' if none."""
    for line in (policy or "").splitlines():
        m = _POLICY_ID_RE.match(line)
        if m and m.group(1) == rule:
            text = re.sub(r"\*\*|__|`", "", line[m.end():]).strip()
            return text.lstrip(":").strip()
    return ""


def _check_provoked(rep: DomainReport, dom: Any, an: Any, env: Any, named: dict, max_calls: int) -> None:
    rep.passed("provoked")
    search = ViolationSearch(dom, an, env, max_calls)
    hidden_search = None
    total = 0
    for rule, info in rep.rules.items():
        if rule in an.rules:
            hit = search.provoke(rule, an.rules[rule], "trigger")
            total += search.calls
            if hit is None and any(rc.tools[0] not in search.visible for rc in an.rules[rule]):
                # the visible tools cannot fire it and its own write tool is hidden (e.g. an
                # integrity rule on a reference table): provoke it through the hidden tool, say so
                if hidden_search is None:
                    hidden_search = hidden_tools_search(dom, an, max_calls)
                hit = hidden_search.provoke(rule, an.rules[rule], "trigger")
                total += hidden_search.calls
                if hit is not None:
                    hit["via_hidden_tool"] = True
                    rep.warn("provoked", f"rule {rule!r} is only reachable through hidden tools "
                                         f"({hit['call']['name']}): the agent can never violate it")
        elif rule in named:
            hit = search.provoke(rule, [], "check", table_hint=named[rule])
            total += search.calls
        else:
            hit = None
        if hit is None:
            info.update({"provoked": False, "attempts": search.calls})
            reachable = [t for rc in an.rules.get(rule, []) for t in rc.tools if t in search.visible]
            why = "no visible tool can fire it" if rule in an.rules and not reachable else \
                f"no call among {search.calls} tried triggers it"
            rep.fail("provoked", f"rule {rule!r} was not provoked: {why} (broken trigger condition, or a seed "
                                 f"with no row near the boundary)")
            continue
        info.update(hit)
        if hit.get("state") != "initial":
            rep.warn("provoked", f"rule {rule!r} was provoked only from {hit.get('state')}: the seed has no row "
                                 f"one call away from violating it")
        err = hit.get("error") or {}
        hint = err.get("hint") or ""
        bullet = _bullet_text(dom.spec.policy, rule)
        info["hint"] = hint
        info["hint_found"] = bool(hint) and bool(bullet) and bullet[:40] in hint if rule in an.rules else bool(hint)
        if not hit["state_unchanged"]:
            rep.fail("provoked", f"rule {rule!r}: the violating call {hit['call']['name']} changed the state")
        if rule in an.rules:
            missing = [k for k in ("code", "message", "violated_rule", "hint") if not err.get(k)]
            if missing:
                rep.fail("provoked", f"rule {rule!r}: the structured error lacks {', '.join(missing)}")
            if not info["hint_found"]:
                rep.fail("provoked", f"rule {rule!r}: the error hint is not the rule's policy bullet")
    rep.checks["provoked"]["calls"] = total
    if hidden_search is not None:
        hidden_search.env.close()
