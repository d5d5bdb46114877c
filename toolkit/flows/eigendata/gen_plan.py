"""gen-plan --strategy eigendata | sea: N plans / prompt sets per environment record, generated
SEQUENTIALLY, each conditioned on summaries of the ones already made (diversification).

eigendata  EigenData Phase 1: K prompt sets (the Prompt Engineer). Each is a plan record with
           plan.prompt_set = `<input id>-ps<k>`, plan.prompt_version = "1", the set's guidance per
           worker role in plan.extra.guidance (read by gen-task / validate-task / repair /
           make-verifier through common.guidance) and its one-line summary.
sea        AReaL-SEA §4.1: N (synthesis plan, evaluation rules) pairs (prompt 1): plan.synthesis_plan,
           plan.evaluation_rules; the "summary report" the prompt presupposes is the toolkit's
           deterministic environment summary (plan.extra.summary_report).

The generation target comes from the input record's `extra.target` (or `task.instruction`), else a
generic one. `-n` sets N/K (default 4). A duplicate of an earlier set/plan is a malformed reply.
"""

from __future__ import annotations

import json

from toolkit.flows.eigendata import common as C
from toolkit.formats.tools import tools_text
from toolkit.io import StageError, add_provenance
from toolkit.roles.structured import (Malformed, RoleRejected, add_usage, ask_structured, new_usage, parse_tagged_json,
                                      tagged_text)
from toolkit.schema import Record
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.eigendata import options as O

ROLES = ("random_pool", "user_intent", "task_validation", "task_quality", "modify", "verification_function")
DEFAULT_TARGET = "Generate realistic customer-service tasks that require multi-step tool use in this environment."


def _target(record: Record) -> str:
    return str(record.extra.get("target") or (record.task.instruction if record.task and record.task.instruction else "")
               or DEFAULT_TARGET)


def _view(record: Record) -> dict:
    env = C.load_record_env(record)
    try:
        tools = C.tool_schemas(env, "agent") + C.tool_schemas(env, "user")
        if not tools:
            raise StageError("the environment exposes no tools", field="env")
        return {"policy": C.policy_text(env, 4000), "tools": tools_text(tools, "signatures", limit=12000), "state": C.state_summary(env)}
    finally:
        env.close()


def parse_prompt_set(previous: list[str]):
    def parse(text: str | None) -> dict:
        obj = parse_tagged_json(text, "prompt_set")
        if not isinstance(obj, dict):
            raise Malformed("<prompt_set> must hold a JSON object")
        for k in ("focus", "summary"):
            if not isinstance(obj.get(k), str) or not obj[k].strip():
                raise Malformed(f"{k!r} must be a non-empty string")
        g = obj.get("guidance")
        if not isinstance(g, dict) or not g:
            raise Malformed("'guidance' must be a non-empty object {role: [lines]}")
        bad = [r for r in g if r not in ROLES]
        if bad:
            raise Malformed(f"unknown role(s) in guidance: {', '.join(bad)}; roles: {', '.join(ROLES)}")
        for r, lines in g.items():
            if not isinstance(lines, list) or not all(isinstance(x, str) and x.strip() for x in lines):
                raise Malformed(f"guidance[{r!r}] must be a list of non-empty strings")
        norm = " ".join(obj["summary"].lower().split())
        for i, p in enumerate(previous):
            if norm == " ".join(p.lower().split()):
                raise Malformed(f"the summary duplicates prompt set {i}: make this set different")
        if obj.get("evaluation_rules") is not None and not isinstance(obj["evaluation_rules"], str):
            raise Malformed("'evaluation_rules' must be a string")
        return obj

    return parse


def parse_sea_plan(previous: list[str]):
    def parse(text: str | None) -> dict:
        s = text or ""
        plan = tagged_text(s, "synthesis_plan", allow_empty=False)
        rules = tagged_text(s, "evaluation_rules", allow_empty=False)
        low = plan.lower()
        if "information gathering" not in low or "task synthesis" not in low:
            raise Malformed("the synthesis plan must give the steps Information Gathering and Task Synthesis")
        if "ACCEPT" not in rules or "REJECT" not in rules:
            raise Malformed("the evaluation rules must end in [ACCEPT] or [REJECT]")
        if any(plan.strip() == p.strip() for p in previous):
            raise Malformed("this synthesis plan duplicates an earlier one")
        return {"synthesis_plan": plan, "evaluation_rules": rules}

    return parse


def _summary(plan_text: str, n: int = 240) -> str:
    first = " ".join(plan_text.split())
    return first[:n] + ("..." if len(first) > n else "")


def _plan_record(record: Record, rid: str, plan: dict) -> Record:
    return Record.model_validate({"id": rid, "parent_id": record.id, "flow": C.FLOW,
                                  "tags": list(dict.fromkeys(list(record.tags) + ["eigendata", "plan"])),
                                  "env": record.env.model_dump(mode="json") if record.env else None, "plan": plan,
                                  "extra": {"target": _target(record)}})


async def _ask_planner(ctx, text: str, parse, role: str, attempts: int, k: int, what: str):
    """The k-th sequential planner request (its own sample indices); no valid reply → reject."""
    try:
        return await ask_structured(ctx.llm("planner"), [{"role": "user", "content": text}], parse, role=role,
                                    attempts=attempts, sample_index=k * attempts)
    except RoleRejected as e:
        raise StageError(f"{what} {k}: {e}", field="plan") from None


def _with_provenance(out: list[Record], usage: dict, model: str | None, strategy_name: str,
                     recipe_hash: str | None) -> list[Record]:
    """Every plan of the input record gets an equal share of the requests that made them."""
    share = {k: (x / len(out) if isinstance(x, (int, float)) else x) for k, x in usage.items()}
    for r in out:
        add_provenance(r, "gen-plan", strategy=strategy_name, model=model, recipe_hash=recipe_hash,
                       usage=share)
    return out


@strategy("gen-plan", "eigendata", options=O.GenPlanOptions, help="EigenData Phase 1: K diversified, versioned prompt sets (Prompt Engineer)")
def build_eigendata(opts: O.GenPlanOptions, ctx: StageContext):
    n, attempts = opts.n, opts.attempts

    async def fn(record: Record):
        view = _view(record)
        p = C.role_prompt("prompt_engineer", record)
        usage, out, summaries, model = new_usage(), [], [], None
        for k in range(n):
            prev = "\n".join(f"- set {i}: {s}" for i, s in enumerate(summaries)) or "(none yet)"
            text = p.render(target=_target(record), previous=prev, index=k + 1, total=n,
                            guidance=C.guidance(record, "prompt_engineer"), **view)
            got = await _ask_planner(ctx, text, parse_prompt_set(summaries), "prompt_engineer", attempts, k,
                                     "prompt set")
            add_usage(usage, got.usage)
            model = got.model
            v = got.value
            summaries.append(v["summary"])
            ps = f"{record.id}-ps{k}"
            out.append(_plan_record(record, ps, {
                "id": ps, "prompt_set": ps, "prompt_version": "1", "synthesis_plan": v["focus"],
                "evaluation_rules": v.get("evaluation_rules"),
                "extra": {"guidance": {r: list(x) for r, x in v["guidance"].items()}, "summary": v["summary"],
                          "previous_summaries": list(summaries[:-1]), "reflections": []}}))
        return _with_provenance(out, usage, model, "eigendata", opts.recipe_hash)

    return fn


@strategy("gen-plan", "sea", options=O.GenPlanOptions, help="AReaL-SEA meta-planner: N synthesis-plan / evaluation-rules pairs, each conditioned on the earlier ones")
def build_sea(opts: O.GenPlanOptions, ctx: StageContext):
    n, attempts = opts.n, opts.attempts

    async def fn(record: Record):
        view = _view(record)
        report = f"Target: {_target(record)}\nState:\n{view['state']}"
        p = C.role_prompt("synthesis_plan", record)
        usage, out, plans, model = new_usage(), [], [], None
        for k in range(n):
            prev = "\n".join(f"- plan {i}: {_summary(x)}" for i, x in enumerate(plans)) or "(none yet)"
            text = p.render(task_description=view["policy"], env_tools=view["tools"], summary_report=report,
                            previous=prev, guidance=C.guidance(record, "synthesis_plan"))
            got = await _ask_planner(ctx, text, parse_sea_plan(plans), "synthesis_plan", attempts, k, "plan")
            add_usage(usage, got.usage)
            model = got.model
            plans.append(got.value["synthesis_plan"])
            pid = f"{record.id}-plan{k}"
            out.append(_plan_record(record, pid, {
                "id": pid, "prompt_set": pid, "prompt_version": "1", "synthesis_plan": got.value["synthesis_plan"],
                "evaluation_rules": got.value["evaluation_rules"],
                "extra": {"summary_report": report, "summary": _summary(got.value["synthesis_plan"]),
                          "previous_summaries": [_summary(x) for x in plans[:-1]], "reflections": []}}))
        return _with_provenance(out, usage, model, "sea", opts.recipe_hash)

    return fn


def plan_json(record: Record) -> str:
    return json.dumps(record.plan.model_dump(mode="json") if record.plan else {}, ensure_ascii=False)
