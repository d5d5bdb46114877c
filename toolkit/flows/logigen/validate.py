"""`validate-task --strategy logigen`: deterministic checks of generated LOGIGEN tasks.

One verdict (stage validate-task) per check, reasons attached; `--filter passed` keeps records
whose checks all pass:
- replay (kind state_diff): the reference actions replayed from s_origin by verify's state_diff
  target builder (expected errors must occur; the replayed state must hash to target_state_ref)
  reach the stored target: DIFF(replayed, target_state) = 0;
- delta0 (state_diff): Δ0 = DIFF(s_origin, s_target) > 0 — the task changes something;
- projection (rule): the user view has an instruction and names no tool, no snake_case schema
  identifier and no hidden id (projection.leaks);
- duplicate (rule): a record with the same s_origin and s_target earlier in this run fails;
- boundary (rule, only when task.complexity.boundary is set): on s_origin the crossing step is a
  POLICY_VIOLATION that leaves the state unchanged and the goal at the boundary succeeds;
- target_rules (rule): every row the task adds or changes passes every rule's condition re-run on
  the target (validate.target_rule_violations), so a limit guarded on one event only cannot be
  broken through the other;
- tags (rule): task.complexity archetype/tags/level are recomputed from what the task requires
  (labels.py: a replay of the reference path and the user view) and must match; when missing
  they are filled from the replay;
- domain (rule): the deterministic domain check (domain_check.check_domain) of the task's domain,
  once per domain per run (recipe key `domain_check: false` skips it).
A record without env / task / ground truth is rejected (StageError) naming the field.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from toolkit.flows.logigen import options as O
from toolkit.flows.logigen import projection as P
from toolkit.flows.logigen.analysis import analyze, evaluate
from toolkit.flows.logigen.domain_check import check_domain
from toolkit.flows.logigen.explorer import DomainView, boundary_check
from toolkit.flows.logigen.labels import compare, record_labels
from toolkit.flows.logigen.set_designer import TAGS
from toolkit.envs import backend_capabilities
from toolkit.io import StageError, add_provenance
from toolkit.schema import Record, Verdict
from toolkit.stages.registry import StageContext, strategy

STAGE = "validate-task"


def _verdict(name: str, kind: str, passed: bool, reasons: list[str], score: float | None = None,
             scores: dict | None = None) -> Verdict:
    return Verdict(stage=STAGE, kind=kind, name=name, passed=passed, reasons=reasons,
                   score=score if score is not None else float(passed), scores=scores or {},
                   attribution=None if passed else "task")


def domain_verdict(record: Record, reports: dict, lock: threading.Lock) -> Verdict | None:
    """The deterministic domain check (toolkit.flows.logigen.domain_check) once per domain."""
    ref = record.env.path or record.env.id
    if not ref:
        return None
    with lock:
        rep = reports.get(ref)
        if rep is None:
            rep = reports[ref] = check_domain(ref)
    return _verdict("domain", "rule", rep.ok, rep.reasons[:10] or [f"domain check passed ({rep.domain})"])


def check_record(record: Record, seen: dict, lock: threading.Lock, cache: Any) -> list[Verdict]:
    from toolkit.scorers import EnvContext

    if record.env is None:
        raise StageError("no `env`: validate-task --strategy logigen needs the task's sqlite domain", field="env")
    if record.task is None or record.task.ground_truth is None:
        raise StageError("no task.ground_truth to validate", field="task.ground_truth")
    gt = record.task.ground_truth
    verdicts: list[Verdict] = []

    # replay through verify's target builder (reference actions only, never the stored target)
    probe = record.model_copy(deep=True)
    stored = probe.task.ground_truth.target_state
    probe.task.ground_truth.target_state = None
    ctx = EnvContext(probe, None, cache)
    try:
        try:
            info = ctx.target()
        except StageError as e:
            verdicts.append(_verdict("replay", "state_diff", False, [f"{e} (field {e.field})" if e.field else str(e)]))
            return verdicts
        env = ctx.env()
        replayed_target = info.index.target if hasattr(info.index, "target") else None
        d = info.index.diff(stored) if stored is not None else 0
        reasons = [] if d == 0 else [f"DIFF(replayed target, stored target_state) = {d}"]
        if stored is None and not gt.target_state_ref:
            reasons.append("neither target_state nor target_state_ref: the target cannot be checked")
        verdicts.append(_verdict("replay", "state_diff", not reasons, reasons or
                                 ["the reference actions reach the target (DIFF 0)"], scores={"diff": d}))
        verdicts.append(_verdict("delta0", "state_diff", info.delta0 > 0,
                                 [f"DIFF(s_origin, s_target) = {info.delta0}"], scores={"delta0": info.delta0}))

        # projection leaks
        view = DomainView(env)
        env.reset()
        origin = env.snapshot()
        target = stored
        if target is None:
            for a in gt.actions:
                env.call(a.name, dict(a.arguments), side=a.side)
            target = env.snapshot()
            env.reset()
        allowed = {str(v) for a in gt.actions if not a.expect_error and view.tools.get(a.name) is not None
                   and view.tools[a.name].kind != "query" for v in a.arguments.values()}
        terms = P.forbidden_terms(view, origin, target, allowed)
        texts = P.view_texts(record.task)
        bad = P.leaks(texts, terms)
        miss = [] if record.task.instruction else ["task.instruction is empty"]
        verdicts.append(_verdict("projection", "rule", not bad and not miss,
                                 (["the user view reveals " + ", ".join(bad[:8])] if bad else []) + miss
                                 or ["no tool/table names or hidden ids in the user view"]))

        # duplicates (same origin and target) within this run
        key = (env.hash_state(origin), env.hash_state(target))
        with lock:
            first = seen.setdefault(key, record.id)
        dup = first != record.id
        verdicts.append(_verdict("duplicate", "rule", not dup,
                                 [f"same s_origin and s_target as {first}"] if dup else ["unique in this run"]))

        # boundary
        cx = record.task.complexity or {}
        b = cx.get("boundary")
        if b:
            if not isinstance(b, dict) or not isinstance(b.get("goal"), dict) or not b.get("crossing"):
                ok, why = False, "task.complexity.boundary needs `goal` (a call) and `crossing` (calls)"
            else:
                try:
                    ok, why = boundary_check(env, origin, b["goal"], b["crossing"], rule=b.get("rule"))
                except (KeyError, TypeError) as e:
                    ok, why = False, f"task.complexity.boundary is malformed: {type(e).__name__}: {e}"
            verdicts.append(_verdict("boundary", "rule", ok, [why]))

        # the target satisfies every rule: the triggers' conditions re-run on its new/changed rows
        broken = target_rule_violations(env, origin, target)
        verdicts.append(_verdict("target_rules", "rule", not broken, broken[:8] or
                                 ["every new or changed row of the target passes the rules' conditions"]))

        # complexity / difficulty tags: recomputed from what the task requires (labels.py)
        filled = []
        computed = None
        if "tags" in cx and cx.get("archetype") and cx.get("level"):
            _, computed = record_labels(env, record)
            diffs = compare(cx, computed)
            verdicts.append(_verdict("tags", "rule", not diffs, diffs or
                                     ["archetype, tags and level match what the task requires"],
                                     scores={"tags": cx.get("tags"), "level": cx.get("level"),
                                             "computed": computed}))
            _ = replayed_target
            return verdicts
        if not cx.get("tags") and "tags" not in cx:
            diff_tables = sorted(env.diff(origin, target)["tables"])
            writes = [a for a in gt.actions if not a.expect_error and view.tools.get(a.name) is not None
                      and view.tools[a.name].kind != "query"]
            tags = []
            if any(a.expect_error for a in gt.actions):
                tags += ["Hidden-Constraint", "Conditional-Logic"]
            if len(writes) > 1:
                tags.append("Multi-Step")
            if len(diff_tables) > 1:
                tags.append("Waterfall")
            cx = dict(cx, tags=[t for t in TAGS if t in tags])
            filled.append("complexity.tags")
        if not cx.get("level"):
            tags = set(cx.get("tags") or [])
            cx = dict(cx, level="L3" if tags & {"State-Based", "Adversarial", "Waterfall"} else "L2" if tags else "L1")
            filled.append("complexity.level")
        record.task.complexity = cx
        if not record.task.difficulty:
            record.task.difficulty = cx["level"]
            filled.append("difficulty")
        verdicts.append(_verdict("tags", "rule", True,
                                 [f"filled {', '.join(filled)}"] if filled else ["complexity and difficulty present"],
                                 scores={"tags": cx.get("tags"), "level": cx.get("level")}))
        _ = replayed_target
        return verdicts
    finally:
        ctx.close()


_ANALYSES: dict[int, tuple[Any, Any]] = {}


def target_rule_violations(env: Any, origin: dict, target: dict, target_bytes: bytes | None = None) -> list[str]:
    """Rows the task adds or changes that break a rule's condition when re-run on the target
    (a limit checked by one event only, e.g. INSERT, can be broken through the other). Only limits
    on the row's own values (`NEW.col <op> ...`) are re-run; conditions that need the OLD row or
    count rows of their own table (the row itself would be counted) are not. `target_bytes`: the
    target's database (a checkpoint), restored instead of loading `target`; the target is loaded
    only when a changed row has a limit to re-check. The env is reset after."""
    try:
        key = id(env.domain)
        hit = _ANALYSES.get(key)
        if hit is None or hit[0] is not env.domain:
            hit = _ANALYSES[key] = (env.domain, analyze(env))
            while len(_ANALYSES) > 16:
                _ANALYSES.pop(next(iter(_ANALYSES)))
        an = hit[1]
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        return [f"trigger analysis failed: {type(e).__name__}: {e}"]
    out: list[str] = []
    # tables the state changes through (visible writes, trigger side effects): a condition on them
    # held when the row was written and may not any more (seats sold since); static tables stay
    visible = set(env.tool_names("agent")) if hasattr(env, "tool_names") else set(env.domain.tools)
    dynamic = {td.table for n, td in env.domain.tools.items() if td.kind in ("insert", "update") and n in visible}
    for tr in an.triggers:
        dynamic |= {e.table for e in tr.effects}
    loaded = False  # the target is loaded (`target_bytes`: its database, restored) for the first check
    try:
        for name, t in env.domain.tables.items():
            if not t.pk:
                continue
            old = {tuple(r.get(k) for k in t.pk): r for r in origin.get(name, [])}
            rows = [r for r in target.get(name, []) if old.get(tuple(r.get(k) for k in t.pk)) != r]
            if not rows:
                continue
            for rule, checks in an.rules.items():
                for rc in checks:
                    sql = rc.sql or ""
                    if rc.table != name or re.search(r"\bOLD\.", sql) or \
                            re.search(r"\bFROM\s+\"?" + re.escape(name) + r"\b", sql, re.IGNORECASE):
                        continue
                    # only limits on the row's own values (NEW.col <op> ...): conditions about the
                    # rest of the state (is the car free?) held when the row was written, not after
                    limits = [c for c in rc.conditions if c.kind == "compare" and c.op in ("<", "<=", ">", ">=")
                              and any(getattr(x, "kind", None) == "new" for x in (c.lhs, c.rhs))
                              and not any(getattr(x, "kind", None) == "subquery" and getattr(x, "table", None) in dynamic
                                          for x in (c.lhs, c.rhs))]
                    if not limits:
                        continue
                    cols = {x.column for c in limits for x in (c.lhs, c.rhs) if getattr(x, "kind", None) == "new"}
                    for r in rows:
                        o = old.get(tuple(r.get(k) for k in t.pk))
                        if o is not None and all(o.get(c) == r.get(c) for c in cols):
                            continue  # the limited values did not change: they were checked when written
                        if not loaded:
                            env.restore(target_bytes) if target_bytes is not None else env.reset(target)
                            loaded = True
                        if evaluate(env, sql, new=r) is True:
                            out.append(f"target row {name} { {k: r.get(k) for k in t.pk} } breaks rule {rule!r} "
                                       f"(trigger {rc.trigger})")
    finally:
        env.reset()
    return sorted(set(out))


@strategy("validate-task", "logigen", options=O.ValidateTaskOptions,
          help="LOGIGEN: replay reaches the target (DIFF 0), Δ0 > 0, no leaks in the user view, "
               "no duplicates, boundary holds, tags filled")
def build(opts: O.ValidateTaskOptions, ctx: StageContext):
    from toolkit.scorers import TargetCache

    seen: dict = {}
    lock = threading.Lock()
    cache = TargetCache()
    reports: dict = {}

    def fn(record: Record) -> Record:
        verdicts = check_record(record, seen, lock, cache)
        if opts.domain_check and record.env is not None and backend_capabilities(record.env.backend).relational:
            dv = domain_verdict(record, reports, lock)
            if dv is not None:
                verdicts.append(dv)
        record.verdicts = [v for v in record.verdicts if v.stage != STAGE] + verdicts
        add_provenance(record, STAGE, strategy="logigen", recipe_hash=opts.recipe_hash)
        return record

    return fn
