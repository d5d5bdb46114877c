"""LOGIGEN's Architect: `gen-plan --strategy logigen` compiles a domain brief into a sqlite
policy environment (LOGIGEN, arXiv 2603.00540, Stage 1).

Input record: the brief in `extra.brief`::

    {"id": "brief-1", "extra": {"brief": {"name": "library", "description": "Members borrow books ...",
                                          "policy": "optional existing policy text"}}}

`name` (letters, digits, _ and -; it names the domain) and `description` are required. When
`policy` is given and already declares rule ids (`- **[rule_id]** ...` bullets) it is used as the
policy (the Policy stage only checks it); otherwise it is context for the Analyze stage.

Four compile stages, each followed by Check-Fix-Verify:

1. Analyze  -> blueprint JSON {entities, rules: [{id, kind, statement, tables}], side_effects,
   boundaries}; deterministic check: snake_case unique ids, kinds from multi_variable /
   state_dependent / role_permission / irreversible / threshold, at least 3 rules of 2+ kinds.
2. Policy   -> markdown with one `- **[rule_id]** ...` bullet per blueprint rule; deterministic
   check: every blueprint id declared once, no other ids.
3. Tables   -> DDL (tables only) + seed JSON + optional tools YAML; deterministic check: compiles
   with its seed, primary keys not nullable, no triggers yet, some seed rows.
4. Triggers -> BEFORE triggers raising `POLICY_VIOLATION: <rule>: ...`, AFTER side effects, and
   optionally a corrected seed (when a rule cannot be provoked because no seed row sits near its
   boundary); deterministic check: the full domain check (toolkit/flows/logigen/domain_check.py),
   so every rule must be enforced AND provoked by a real call with the seed data.

Check-Fix-Verify per round: the deterministic check runs first; when it passes, an LLM checker
compares the artifact with its upstream (brief -> blueprint -> policy -> tables -> triggers) and
answers {"verdict": PASS|FAIL, "issues": [...]}. A failure goes back to the Architect as a
structured report ({stage, round, deterministic: {ok, reasons}, semantic: {verdict, issues}}) with
its previous draft, up to `max_rounds` rounds per stage (default 3, ours: the paper leaves it
unspecified). Malformed replies are retried by `ask_structured` (`--attempts`); a stage that
never passes or a role that never answers in format rejects the record with the reasons.

Config (recipe keys, section gen-plan; CLI flags where noted): `max_rounds` (--max-rounds),
`out_dir` (--out-dir, default "logigen_domains"), `attempts` (--attempts), `semantic_check`
(default true; false = deterministic checks only), `max_calls` (domain-check search budget).
LLM roles: `architect` and `checker` (role-prefixed config keys override, e.g. checker_model).

Output: the input record with `flow: logigen`, `env = {backend: sqlite, path: <out_dir>/<record
id>}` (absolute; the documented domain layout: domain.yaml, policy.md, schema.sql, seed.json,
tools.yaml, plus blueprint.json and check_report.json), and `plan` = {id, policy_id
("<name>@<sha256 of policy.md, 12 hex>"), synthesis_plan (the blueprint's rule statements),
extra: {brief, blueprint, rounds {stage: n}, checks [every round's report], domain_check (the
final report summary), usage}}.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from toolkit import prompts
from toolkit.envs.sqlite import DomainError, DomainSpec, compile_domain
from toolkit.flows.logigen import options as O
from toolkit.flows.logigen.domain_check import MAX_CALLS_PER_RULE, check_domain, policy_rule_ids
from toolkit.io import StageError, add_provenance, note_warning
from toolkit.roles.structured import (
    Malformed,
    RoleRejected,
    add_usage,
    ask_structured,
    need_enum,
    new_usage,
    parse_json_object,
    tagged_text,
)
from toolkit.schema import EnvRef, Plan, Record
from toolkit.stages.registry import StageContext, strategy

STAGES = ("analyze", "policy", "tables", "triggers")
RULE_KINDS = ("multi_variable", "state_dependent", "role_permission", "irreversible", "threshold")
# toolkit defaults (the paper gives none): a stage's reply (a whole policy, DDL with its seed, every
# trigger) runs to thousands of tokens, far past the client's default max_tokens of 512. Table 5's
# averages per turn are ~2.3k (policy), ~2.2k (tables) and ~3.9k (triggers) completion tokens.
# `architect_max_tokens` / `checker_max_tokens` (or the plain `max_tokens`) override them.
ROLE_MAX_TOKENS = {"architect": 8192, "checker": 4096}


def role_max_tokens(command_opts: Any) -> dict[str, int]:
    """Each role's max_tokens: `<role>_max_tokens`, else the plain `max_tokens`, else ROLE_MAX_TOKENS."""
    return {role: getattr(command_opts, f"{role}_max_tokens", None) or getattr(command_opts, "max_tokens", None) or d
            for role, d in ROLE_MAX_TOKENS.items()}


_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


# ----------------------------------------------------------------------------------------------
# parsers (strict: raise Malformed with a reason)


def _malformed(msg: str) -> Exception:
    return Malformed(msg)


def _tag(text: str | None, tag: str, required: bool = True) -> str | None:
    body = tagged_text(text, tag, required=required)
    if body is None:
        return None
    fence = re.match(r"^```[a-zA-Z]*\n(.*?)\n?```$", body, re.DOTALL)
    return fence.group(1).strip() if fence else body


def parse_blueprint(text: str | None) -> dict:
    obj = parse_json_object(text, required=("entities", "rules"))
    rules = obj.get("rules")
    if not isinstance(rules, list) or not rules:
        raise _malformed("'rules' must be a non-empty list")
    for i, r in enumerate(rules):
        if not isinstance(r, dict) or not all(isinstance(r.get(k), str) and r.get(k) for k in ("id", "kind", "statement")):
            raise _malformed(f"rules[{i}] needs string id, kind and statement")
    if not isinstance(obj.get("entities"), list):
        raise _malformed("'entities' must be a list")
    return obj


def parse_policy(text: str | None) -> str:
    body = _tag(text, "policy")
    if not body or not body.strip():
        raise _malformed("empty <policy> block")
    return body.strip() + "\n"


def parse_tables(text: str | None) -> dict:
    ddl = _tag(text, "tables_sql")
    seed_text = _tag(text, "seed_json")
    if not ddl:
        raise _malformed("empty <tables_sql> block")
    try:
        seed = json.loads(seed_text or "")
    except json.JSONDecodeError as e:
        raise _malformed(f"<seed_json> is not valid JSON: {e.msg} at char {e.pos}") from None
    if not isinstance(seed, dict):
        raise _malformed("<seed_json> must be an object {table: [rows]}")
    tools: dict = {}
    tools_text = _tag(text, "tools_yaml", required=False)
    if tools_text:
        try:
            tools = yaml.safe_load(tools_text) or {}
        except yaml.YAMLError as e:
            raise _malformed(f"<tools_yaml> is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(tools, dict):
            raise _malformed("<tools_yaml> must be a mapping (hide, readonly, tools)")
        tools = {k: v for k, v in tools.items() if v not in (None, [], {})}
    return {"tables_sql": ddl.strip() + "\n", "seed": seed, "tools": tools}


def parse_triggers(text: str | None) -> dict:
    """-> {"triggers_sql", "seed" (None, or a corrected seed when the reply has <seed_json>)}."""
    body = _tag(text, "triggers_sql")
    if not body or "CREATE TRIGGER" not in body.upper():
        raise _malformed("<triggers_sql> holds no CREATE TRIGGER statement")
    seed = None
    seed_text = _tag(text, "seed_json", required=False)
    if seed_text:
        try:
            seed = json.loads(seed_text)
        except json.JSONDecodeError as e:
            raise _malformed(f"<seed_json> is not valid JSON: {e.msg} at char {e.pos}") from None
        if not isinstance(seed, dict):
            raise _malformed("<seed_json> must be an object {table: [rows]}")
    return {"triggers_sql": body.strip() + "\n", "seed": seed}


def parse_check(text: str | None) -> dict:
    obj = parse_json_object(text, required=("verdict",))
    verdict = need_enum(obj, "verdict", ("PASS", "FAIL"))
    issues = obj.get("issues") or []
    if not isinstance(issues, list):
        raise _malformed("'issues' must be a list")
    return {"verdict": verdict, "issues": issues}


# ----------------------------------------------------------------------------------------------
# deterministic checks per stage: -> list of reasons (empty = pass)


def check_blueprint(bp: dict) -> list[str]:
    reasons: list[str] = []
    ids: list[str] = []
    for i, r in enumerate(bp.get("rules", [])):
        rid = r.get("id", "")
        if not _ID_RE.match(rid):
            reasons.append(f"rules[{i}].id {rid!r} is not snake_case")
        if rid in ids:
            reasons.append(f"rule id {rid!r} is used twice")
        ids.append(rid)
        if r.get("kind") not in RULE_KINDS:
            reasons.append(f"rule {rid!r}: kind {r.get('kind')!r} is not one of {', '.join(RULE_KINDS)}")
    if len(ids) < 3:
        reasons.append(f"only {len(ids)} rule(s): a policy environment needs at least 3")
    kinds = {r.get("kind") for r in bp.get("rules", [])} & set(RULE_KINDS)
    if len(kinds) < 2:
        reasons.append("all rules are of one kind: add multi-variable, state-dependent, role or irreversible logic")
    if not bp.get("entities"):
        reasons.append("no entities (tables)")
    return reasons


def check_policy(policy: str, bp: dict) -> list[str]:
    declared = policy_rule_ids(policy)
    reasons: list[str] = []
    wanted = [r["id"] for r in bp.get("rules", [])]
    for rid in wanted:
        if rid not in declared:
            reasons.append(f"blueprint rule {rid!r} has no '- **[{rid}]** ...' bullet in the policy")
    for rid in declared:
        if rid not in wanted:
            reasons.append(f"policy rule {rid!r} is not in the blueprint")
    counts = {rid: len(re.findall(r"^\s*(?:[-*+]|\d+\.)\s+(?:\*\*|__)?\[" + re.escape(rid) + r"\]", policy, re.MULTILINE))
              for rid in declared}
    for rid, n in counts.items():
        if n > 1:
            reasons.append(f"policy rule {rid!r} is declared {n} times")
    return reasons


def check_tables(tables: dict, policy: str) -> list[str]:
    if re.search(r"\bCREATE\s+TRIGGER\b", tables["tables_sql"], re.IGNORECASE):
        return ["the tables stage must not define triggers (they come in the next stage)"]
    spec = DomainSpec(name="draft", schema_sql=tables["tables_sql"], policy=policy, seed=tables["seed"],
                      tools=tables.get("tools") or {})
    try:
        dom = compile_domain(spec)
    except DomainError as e:
        return [str(e)]
    reasons: list[str] = []
    for t in dom.tables.values():
        if not t.pk:
            reasons.append(f"table {t.name} has no PRIMARY KEY (no update tool, rows cannot be identified)")
        for c in t.columns:
            if c.pk and not c.rowid_alias and not c.notnull and not t.without_rowid:
                reasons.append(f"{t.name}.{c.name} is a primary key that can be NULL (declare it NOT NULL)")
    if not any(tables["seed"].get(t) for t in dom.tables):
        reasons.append("the seed has no rows")
    return reasons


def assemble(name: str, description: str, policy: str, tables: dict, triggers_sql: str) -> dict:
    """The spec dict of the whole domain (toolkit.envs.sqlite.spec_from_dict keys)."""
    return {"name": name, "description": description, "policy": policy,
            "schema": tables["tables_sql"].rstrip() + "\n\n" + triggers_sql, "seed": tables["seed"],
            "tools": tables.get("tools") or {}, "exclude_keys": []}


def write_domain(out: Path, spec: dict, blueprint: dict, report: dict) -> Path:
    """Write the documented domain layout (docs/adding-a-domain.md)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "domain.yaml").write_text(yaml.safe_dump(
        {"name": spec["name"], "description": spec["description"], "exclude_keys": spec.get("exclude_keys") or []},
        sort_keys=False, allow_unicode=True), encoding="utf-8")
    (out / "policy.md").write_text(spec["policy"], encoding="utf-8")
    (out / "schema.sql").write_text(spec["schema"], encoding="utf-8")
    (out / "seed.json").write_text(json.dumps(spec["seed"], indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "tools.yaml").write_text(yaml.safe_dump(spec.get("tools") or {}, sort_keys=False, allow_unicode=True),
                                    encoding="utf-8")
    (out / "blueprint.json").write_text(json.dumps(blueprint, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "check_report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str) + "\n",
                                           encoding="utf-8")
    for stale in ("seed.sql", "seed.yaml", "seed.yml", "tools.yml", "tools.json", "domain.yml", "domain.json"):
        if (out / stale).exists():  # a previous run's file would shadow ours
            (out / stale).unlink()
    return out


# ----------------------------------------------------------------------------------------------
# the loop


def parse_brief(record: Record) -> dict:
    brief = (record.extra or {}).get("brief")
    if not isinstance(brief, dict):
        raise StageError("gen-plan --strategy logigen needs extra.brief = {name, description, policy?}",
                         field="extra.brief")
    name, desc = brief.get("name"), brief.get("description")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise StageError("extra.brief.name must be 1-64 letters, digits, '_' or '-'", field="extra.brief.name")
    if not isinstance(desc, str) or not desc.strip():
        raise StageError("extra.brief.description must be a non-empty string", field="extra.brief.description")
    pol = brief.get("policy")
    if pol is not None and not isinstance(pol, str):
        raise StageError("extra.brief.policy must be a string", field="extra.brief.policy")
    return {"name": name, "description": desc.strip(), "policy": (pol or "").strip()}


def _feedback(prev: str | None, report: dict | None) -> str:
    if not report:
        return ""
    return ("\nYour previous draft FAILED the checks. Fix every reported item and keep what passed.\n"
            f"Previous draft:\n{prev}\n\nCheck report (JSON):\n{json.dumps(report, ensure_ascii=False, indent=1)}\n")


class _CutWatch:
    """The role's client, reporting every reply that ended at max_tokens."""

    def __init__(self, client: Any, on_cut: Any):
        self._client, self._on_cut = client, on_cut

    async def chat(self, messages: list[dict], **kw: Any) -> Any:
        res = await self._client.chat(messages, **kw)
        if getattr(res, "finish_reason", None) == "length":
            self._on_cut()
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class Architect:
    def __init__(self, opts: O.ArchitectOptions, architect_llm: Any, checker_llm: Any | None,
                 max_tokens: dict[str, int] | None = None):
        """`max_tokens`: per role (default ROLE_MAX_TOKENS; `role_max_tokens(ctx.opts)` reads the
        configured ones)."""
        self.opts = opts
        self.llm = architect_llm
        self.checker = checker_llm
        self.max_rounds = opts.max_rounds
        self.attempts = opts.attempts
        self.semantic = opts.semantic_check
        self.max_calls = opts.max_calls
        self.usage = new_usage()
        self.reports: list[dict] = []
        self.rounds: dict[str, int] = {}
        self.max_tokens = dict(max_tokens or ROLE_MAX_TOKENS)
        self.cut: dict[str, int] = {}  # replies cut at max_tokens (finish_reason=length), per role

    def _note_cut(self, role: str) -> None:
        """A reply cut at max_tokens: counted (plan.extra.cut_replies) and warned, never silent."""
        self.cut[role] = self.cut.get(role, 0) + 1
        msg = (f"gen-plan logigen: {role} reply cut at max_tokens ({self.max_tokens[role]}; finish_reason=length): "
               f"raise {role}_max_tokens")
        note_warning(msg)  # the run summary's warning counter

    async def _ask(self, client: Any, prompt: str, parse: Any, role: str) -> Any:
        try:
            res = await ask_structured(_CutWatch(client, lambda: self._note_cut(role)),
                                       [{"role": "user", "content": prompt}], parse, role=role,
                                       attempts=self.attempts, max_tokens=self.max_tokens[role])
        except RoleRejected as e:
            add_usage(self.usage, e.usage)
            raise StageError(f"{role}: no reply in the expected format after {len(e.reasons)} attempt(s): "
                             + "; ".join(e.reasons), field="extra.brief") from None
        add_usage(self.usage, res.usage)
        return res.value

    async def _stage(self, stage: str, render: Any, parse: Any, det: Any, upstream: str, show: Any) -> Any:
        """One compile stage with Check-Fix-Verify: -> the accepted artifact."""
        prev_text, report = None, None
        check_prompt = prompts.load("logigen/architect_check")
        for rnd in range(1, self.max_rounds + 1):
            self.rounds[stage] = rnd
            artifact = await self._ask(self.llm, render(_feedback(prev_text, report)), parse, "architect")
            reasons = await asyncio.to_thread(det, artifact)  # CPU-bound: keep other records' calls flowing
            report = {"stage": stage, "round": rnd, "deterministic": {"ok": not reasons, "reasons": reasons}}
            if not reasons and self.semantic and self.checker is not None:
                verdict = await self._ask(self.checker, check_prompt.render(
                    stage=stage, upstream=upstream, artifact=show(artifact)), parse_check, "checker")
                report["semantic"] = verdict
            self.reports.append(report)
            sem_ok = report.get("semantic", {}).get("verdict", "PASS") == "PASS"
            if not reasons and sem_ok:
                return artifact
            prev_text = show(artifact)
        last = self.reports[-1]
        why = last["deterministic"]["reasons"] or [
            f"{i.get('item', '?')}: {i.get('problem', i)}" if isinstance(i, dict) else str(i)
            for i in last.get("semantic", {}).get("issues", [])] or ["semantic check FAIL"]
        raise StageError(f"{stage} did not pass its checks in {self.max_rounds} round(s): " + "; ".join(map(str, why[:8])),
                         field="extra.brief")

    async def build_domain(self, brief: dict) -> tuple[dict, dict, dict]:
        """-> (spec dict, blueprint, final domain-check report)."""
        name, desc = brief["name"], brief["description"]
        given_policy = brief["policy"] if policy_rule_ids(brief["policy"]) else ""
        brief_text = f"name: {name}\ndescription: {desc}\npolicy:\n{brief['policy'] or '(none)'}"

        p = prompts.load("logigen/architect_analyze")
        blueprint = await self._stage(
            "analyze", lambda fb: p.render(name=name, description=desc, policy=brief["policy"] or "(none)", feedback=fb),
            parse_blueprint, check_blueprint, brief_text, lambda a: json.dumps(a, ensure_ascii=False, indent=1))
        if given_policy:  # codified already: keep it, make the blueprint's ids match
            ids = policy_rule_ids(given_policy)
            have = {r["id"] for r in blueprint["rules"]}
            blueprint["rules"] = [r for r in blueprint["rules"] if r["id"] in ids] + [
                {"id": i, "kind": "state_dependent", "statement": f"see policy [{i}]", "tables": []}
                for i in ids if i not in have]
        bp_text = json.dumps(blueprint, ensure_ascii=False, indent=1)

        if given_policy:
            policy = given_policy + "\n"
            reasons = check_policy(policy, blueprint)
            self.reports.append({"stage": "policy", "round": 0, "given": True,
                                 "deterministic": {"ok": not reasons, "reasons": reasons}})
            self.rounds["policy"] = 0
        else:
            p = prompts.load("logigen/architect_policy")
            policy = await self._stage(
                "policy", lambda fb: p.render(name=name, description=desc, blueprint=bp_text, feedback=fb),
                parse_policy, lambda pol: check_policy(pol, blueprint), bp_text, lambda a: a)

        p = prompts.load("logigen/architect_tables")
        tables = await self._stage(
            "tables", lambda fb: p.render(policy=policy, blueprint=bp_text, feedback=fb),
            parse_tables, lambda t: check_tables(t, policy), policy,
            lambda t: f"<tables_sql>\n{t['tables_sql']}</tables_sql>\n<seed_json>\n"
                      f"{json.dumps(t['seed'], ensure_ascii=False)}\n</seed_json>")

        final: dict = {}

        def with_seed(trig: dict) -> dict:
            return dict(tables, seed=trig["seed"]) if trig.get("seed") is not None else tables

        def det_triggers(trig: dict) -> list[str]:
            rep = check_domain(assemble(name, desc, policy, with_seed(trig), trig["triggers_sql"]),
                               max_calls=self.max_calls or MAX_CALLS_PER_RULE)
            final.clear()
            final.update(rep.to_dict())
            return rep.reasons

        p = prompts.load("logigen/architect_triggers")
        seed_text = json.dumps(tables["seed"], ensure_ascii=False)
        triggers = await self._stage(
            "triggers", lambda fb: p.render(policy=policy, tables_sql=tables["tables_sql"], seed_json=seed_text,
                                            feedback=fb),
            parse_triggers, det_triggers, f"{policy}\n\nTables:\n{tables['tables_sql']}",
            lambda a: f"<triggers_sql>\n{a['triggers_sql']}</triggers_sql>"
                      + (f"\n<seed_json>\n{json.dumps(a['seed'], ensure_ascii=False)}\n</seed_json>" if a.get("seed") else ""))
        return assemble(name, desc, policy, with_seed(triggers), triggers["triggers_sql"]), blueprint, final


@strategy("gen-plan", "logigen", options=O.ArchitectOptions, help="Architect: domain brief -> compiled sqlite policy environment "
                                      "(analyze, policy, tables, triggers; check-fix-verify)")
def build(opts: O.ArchitectOptions, ctx: StageContext):
    out_dir = Path(opts.out_dir)
    max_tokens = role_max_tokens(ctx.opts)

    async def fn(record: Record) -> Record:
        brief = parse_brief(record)
        arch = Architect(opts, ctx.llm("architect"), ctx.llm("checker") if opts.semantic_check else None, max_tokens)
        spec, blueprint, final = await arch.build_domain(brief)
        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", record.id)[:120]
        path = (out_dir / safe_id).resolve()
        report = {"rounds": arch.rounds, "checks": arch.reports, "domain_check": final}
        write_domain(path, spec, blueprint, report)
        written = await asyncio.to_thread(check_domain, path, max_calls=arch.max_calls or MAX_CALLS_PER_RULE)  # the files users get
        if not written.ok:  # pragma: no cover - the spec passed the same check in memory
            raise StageError("the written domain fails its check: " + "; ".join(written.reasons[:5]),
                             field="extra.brief")
        digest = hashlib.sha256(spec["policy"].encode("utf-8")).hexdigest()[:12]
        record.flow = "logigen"
        record.env = EnvRef(backend="sqlite", path=str(path))
        record.plan = Plan(
            id=f"{record.id}-plan", policy_id=f"{brief['name']}@{digest}",
            synthesis_plan="\n".join(f"[{r['id']}] ({r.get('kind')}) {r.get('statement')}" for r in blueprint["rules"]),
            extra={"brief": brief, "blueprint": blueprint, "rounds": arch.rounds, "checks": arch.reports,
                   "domain_check": {"ok": written.ok, "seconds": round(written.seconds, 4),
                                    "rules": {k: {"provoked": v.get("provoked"), "call": v.get("call"),
                                                  "hint_found": v.get("hint_found")}
                                              for k, v in written.rules.items()}},
                   "usage": dict(arch.usage), "max_tokens": dict(arch.max_tokens),
                   "cut_replies": dict(arch.cut)})
        add_provenance(record, "gen-plan", strategy="logigen", model=ctx.model_name("architect"),
                       recipe_hash=opts.recipe_hash, usage=arch.usage)
        return record

    return fn
