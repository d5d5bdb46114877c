"""validate-task --strategy eigendata | sea.

eigendata  EigenData TaskValidationAgent (FLOWS §1.2 Stage 3): first the mechanical checks (every
           must-have / expected function exists in the environment, 2+ calls, the expected actions
           replay without error on a scratch copy) → verdict kind=rule name=task_mechanics; then the
           feasibility agent: a tool-calling loop whose calls really run against a scratch copy of
           the environment (`validate_mode: scratch | readonly`), ending in the FEASIBLE /
           INFEASIBLE JSON → verdict kind=llm name=task_feasibility (categories, suggested fixes,
           the executed calls with their real results in scores.tool_calls).
sea        AReaL-SEA Task Verification (prompt 3, FLOWS §2.1 Stage 2): the same loop, at most one
           call per response, ending in <eval_report> with "TASK QUALITY VERDICT: ACCEPT|REJECT" and
           <eval_rules_improve> (0-5 items) → verdict kind=llm name=task_quality.

A failed verdict carries attribution "task". "Execute, don't assume": a verdict reached without a
single executed tool call is refused as malformed (`validate_min_calls`, default 1) and retried.
A role that never answers validly rejects the record (reasons in --rejects).
"""

from __future__ import annotations

import json
import re

from toolkit.flows.eigendata import common as C
from toolkit.formats.tools import tools_text
from toolkit.flows.eigendata.tool_loop import tool_loop
from toolkit.io import StageError, add_provenance
from toolkit.roles.structured import (Malformed, RoleRejected, add_usage, need_enum, new_usage, parse_json_object,
                                      tagged_text)
from toolkit.roles.judge import improve_items
from toolkit.roles.reply import MalformedJudgeOutput
from toolkit.schema import Record, Verdict
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.eigendata import options as O

STAGE = "validate-task"
CATEGORIES = ("missing_resource", "contradictory_constraints", "policyViolation")
FIX_TYPES = ("modify_user_data", "modify_scenario")
SYSTEM = "You are a meticulous task validator with access to the environment's tools."


def task_text(record: Record) -> str:
    t = record.task
    if t is None:
        return "(no task)"
    d = t.model_dump(mode="json", exclude_none=True, exclude={"extra": True, "ground_truth": {"target_state", "extra"}})
    ex = {k: t.extra[k] for k in ("purpose", "primary_objective", "selected_parameters", "spec") if k in t.extra}
    if ex:
        d["extra"] = ex
    return json.dumps(d, ensure_ascii=False, indent=1)[:12000]


# ----------------------------------------------------------------------------------------------
# mechanical checks (deterministic)


def mechanical_checks(record: Record, env) -> tuple[bool, list[str], dict]:
    names = set(C.tool_names(env))
    gt = record.task.ground_truth if record.task else None
    reasons: list[str] = []
    scores: dict = {}
    if gt is None:
        return False, ["task.ground_truth is missing"], {}
    unknown = [f for f in gt.must_have_functions if f not in names]
    unknown += [a.name for a in gt.actions if a.name not in names]
    if unknown:
        reasons.append(f"unknown function(s) in the ground truth: {', '.join(dict.fromkeys(unknown))}")
    n_calls = max(len(gt.must_have_functions), len(gt.actions))
    scores["n_calls"] = n_calls
    if record.flow == C.FLOW and n_calls < 2:
        reasons.append(f"the task needs 2+ sequential calls; the ground truth names {n_calls}")
    replay = []
    if gt.actions and not unknown:
        env.reset()
        for i, a in enumerate(gt.actions):
            r = C.execute(env, a.name, a.arguments, side=a.side)
            replay.append({"name": a.name, "ok": r["ok"], "error_code": r["error_code"]})
            if not r["ok"]:
                reasons.append(f"expected action {i} ({a.name}) fails in the environment: {C.short(r['content'], 300)}")
        env.reset()
    scores["actions_replay"] = replay
    return not reasons, reasons, scores


# ----------------------------------------------------------------------------------------------
# parsers (strict)


def _min_calls(transcript: list[dict], need: int) -> None:
    ran = [t for t in transcript if t.get("source") == "env" and t.get("error_code") != "UNKNOWN_TOOL"]
    if len(ran) < need:
        raise Malformed(f"a verdict needs evidence: {len(ran)} tool call(s) executed, at least {need} required "
                        "(execute, don't assume)")


def make_feasibility_parser(min_calls: int):
    def parse(text: str | None, transcript: list[dict]) -> dict:
        obj = parse_json_object(text, required=("validation_status",))
        status = need_enum(obj, "validation_status", ("FEASIBLE", "INFEASIBLE"))
        if status == "FEASIBLE":
            plan = obj.get("solution_plan")
            if not isinstance(plan, dict) or not isinstance(plan.get("primary_path"), list) or not plan["primary_path"]:
                raise Malformed("a FEASIBLE verdict needs solution_plan.primary_path (a non-empty list)")
            if "confidence" in obj:
                need_enum(obj, "confidence", ("high", "medium", "low"))
        else:
            fr = obj.get("failure_reasons")
            if not isinstance(fr, list) or not fr:
                raise Malformed("an INFEASIBLE verdict needs failure_reasons (a non-empty list)")
            for i, r in enumerate(fr):
                if not isinstance(r, dict):
                    raise Malformed(f"failure_reasons[{i}] must be an object")
                cat = str(r.get("category", "")).strip()
                if cat.lower() in ("policy_violation", "policyviolation"):
                    r["category"] = "policyViolation"
                else:
                    r["category"] = need_enum(r, "category", CATEGORIES)
                if not isinstance(r.get("description"), str) or not r["description"].strip():
                    raise Malformed(f"failure_reasons[{i}] needs a description")
            for i, f in enumerate(obj.get("suggested_fixes") or []):
                if not isinstance(f, dict):
                    raise Malformed(f"suggested_fixes[{i}] must be an object")
                need_enum(f, "fix_type", FIX_TYPES)
        _min_calls(transcript, min_calls)
        obj["validation_status"] = status
        return obj

    return parse


_TQ = re.compile(r"TASK\s+QUALITY\s+VERDICT\s*:\s*\[?\s*([A-Za-z]+)\s*\]?", re.I)


def parse_sea_report(text: str | None, transcript: list[dict], min_calls: int = 1, need_trajectory: bool = False) -> dict:
    s = text or ""
    rep = tagged_text(s, "eval_report", required=False)
    if rep is None:
        raise Malformed("no <eval_report> block")
    m = _TQ.search(rep)
    if not m:
        raise Malformed("the eval report has no 'TASK QUALITY VERDICT: ACCEPT|REJECT' line")
    v = m.group(1).upper()
    if v not in ("ACCEPT", "REJECT"):
        raise Malformed(f"TASK QUALITY VERDICT must be ACCEPT or REJECT, got {m.group(1)!r}")
    out = {"task_quality_verdict": v, "eval_report": rep}
    imp = tagged_text(s, "eval_rules_improve", required=False)
    try:
        out["eval_rules_improve"] = improve_items(imp)
    except MalformedJudgeOutput as e:
        raise Malformed(f"<eval_rules_improve>: {e}") from None
    _min_calls(transcript, min_calls)
    return out


# ----------------------------------------------------------------------------------------------
# strategies


def _replace(record: Record, names: set[str]) -> None:
    record.verdicts = [v for v in record.verdicts if not (v.stage == STAGE and v.name in names)]


def _task_of(record: Record) -> None:
    if record.task is None:
        raise StageError("record has no task to validate", field="task")


async def _validator_loop(ctx: StageContext, o: O.ValidateTaskOptions, text: str, env, tools: list, parse, role: str, verdict: str, **kw):
    """The validator's tool-executing loop on the task prompt; no valid reply → reject naming the verdict."""
    try:
        return await tool_loop(ctx.llm("validator"), [{"role": "system", "content": SYSTEM},
                                                     {"role": "user", "content": text}],
                               env, tools, parse, role=role, attempts=o.attempts, max_calls=o.validate_max_calls,
                               mode=o.validate_mode, **kw)
    except RoleRejected as e:
        raise StageError(str(e), field=f"verdicts.{verdict}") from None


def _claimed_not_run(claimed: list, transcript: list[dict]) -> list[str]:
    ran = {t["function"] for t in transcript}
    out = []
    for c in claimed or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, str) and fn not in ran:
            out.append(fn)
    return out


@strategy("validate-task", "eigendata", options=O.ValidateTaskOptions, help="EigenData TaskValidationAgent: mechanical checks + tool-executing FEASIBLE/INFEASIBLE agent")
def build_eigendata(o: O.ValidateTaskOptions, ctx: StageContext):

    async def fn(record: Record) -> Record:
        _task_of(record)
        env = C.load_record_env(record)
        usage = new_usage()
        try:
            ok, reasons, scores = mechanical_checks(record, env)
            _replace(record, {"task_mechanics", "task_feasibility"})
            record.verdicts.append(Verdict(stage=STAGE, kind="rule", name="task_mechanics", passed=ok,
                                           score=1.0 if ok else 0.0, scores=scores, reasons=reasons,
                                           attribution=None if ok else "task"))
            tools = C.tool_schemas(env, "agent")
            p = C.role_prompt("task_validation", record)
            text = p.render(policy=C.policy_text(env), tools=tools_text(tools, "signatures", limit=12000), task=task_text(record),
                            guidance=C.guidance(record, "task_validation"))
            env.reset()
            h0 = C.safe_hash(env)
            res = await _validator_loop(ctx, o, text, env, tools, make_feasibility_parser(o.validate_min_calls),
                                        "task_validation", "task_feasibility")
            add_usage(usage, res.usage)
            h1 = C.safe_hash(env)
        finally:
            env.close()
        v = res.value
        feasible = v["validation_status"] == "FEASIBLE"
        vreasons = []
        if not feasible:
            vreasons = [f"{r['category']}: {r['description']}" + (f" (evidence: {C.short(r.get('evidence'), 300)})"
                                                                  if r.get("evidence") else "")
                        for r in v["failure_reasons"]]
        ghost = _claimed_not_run(v.get("tool_calls_executed"), res.transcript)
        if ghost:
            vreasons.append("claimed tool calls that were not executed: " + ", ".join(ghost))
        sc = {"validation_status": v["validation_status"], "confidence": v.get("confidence"),
              "failure_categories": [r["category"] for r in v.get("failure_reasons") or []],
              "suggested_fixes": v.get("suggested_fixes") or [], "tool_calls": res.transcript,
              "n_executed": len(res.transcript), "writes": sum(1 for t in res.transcript if t.get("state_changed")),
              "mode": o.validate_mode, "state_hash_before": h0, "state_hash_after": h1,
              "attempts": res.attempts, "prompt": C.prompt_id(record, "task_validation")}
        record.verdicts.append(Verdict(stage=STAGE, kind="llm", name="task_feasibility", passed=feasible,
                                       score=1.0 if feasible else 0.0, scores=sc, reasons=vreasons,
                                       attribution=None if feasible else "task"))
        if feasible:
            record.task.extra["feasibility"] = {"solution_plan": v.get("solution_plan"),
                                                "verification_results": v.get("verification_results")}
        add_provenance(record, STAGE, strategy="eigendata", model=res.model, recipe_hash=o.recipe_hash,
                       usage=usage)
        return record

    return fn


@strategy("validate-task", "sea", options=O.ValidateTaskOptions, help="AReaL-SEA Task Verification: tool loop (≤1 call/response) → TASK QUALITY VERDICT ACCEPT/REJECT")
def build_sea(o: O.ValidateTaskOptions, ctx: StageContext):

    async def fn(record: Record) -> Record:
        _task_of(record)
        env = C.load_record_env(record)
        usage = new_usage()
        try:
            tools = C.tool_schemas(env, "agent")
            rules = (record.plan.evaluation_rules if record.plan and record.plan.evaluation_rules else
                     "(none given: judge executability, clarity, checkability and policy consistency)")
            p = C.role_prompt("task_quality", record)
            text = p.render(task_description=C.policy_text(env), synthetic_task=task_text(record), eval_rules=rules,
                            env_tools=tools_text(tools, "signatures", limit=12000), guidance=C.guidance(record, "task_quality"))

            def parse(t, tr):
                return parse_sea_report(t, tr, o.validate_min_calls)

            res = await _validator_loop(ctx, o, text, env, tools, parse, "task_quality", "task_quality",
                                        calls_per_turn=1)
            add_usage(usage, res.usage)
        finally:
            env.close()
        v = res.value
        ok = v["task_quality_verdict"] == "ACCEPT"
        _replace(record, {"task_quality"})
        record.verdicts.append(Verdict(stage=STAGE, kind="llm", name="task_quality", passed=ok, score=1.0 if ok else 0.0,
                                       scores={"task_quality_verdict": v["task_quality_verdict"],
                                               "eval_rules_improve": v["eval_rules_improve"],
                                               "tool_calls": res.transcript, "n_executed": len(res.transcript),
                                               "attempts": res.attempts, "prompt": C.prompt_id(record, "task_quality")},
                                       reasons=[C.short(v["eval_report"], 2000)], attribution=None if ok else "task"))
        add_provenance(record, STAGE, strategy="sea", model=res.model, recipe_hash=o.recipe_hash, usage=usage)
        return record

    return fn
