"""reflect --strategy eigendata | sea: read a verified batch, aggregate failure categories per
(prompt set, prompt version) and write the next version of each plan record.

A batch strategy: every input record is taken in (nothing is written for it) and, once the input
is exhausted, one plan record per group is written (`finish`):
  id `<prompt set>-v<version>`, plan.prompt_version = the new version, plan.extra.pilot =
  {metrics, criteria (metrics.pilot_criteria), stop}, plan.extra.reflections += {from_version,
  to_version, changes, evidence: {categories, examples, records}}.
Every group is first scored by the orchestration Judge (orchestration.judge_batch: executability,
tool correctness, trajectory coherence, difficulty & coverage per artifact; plan.extra.pilot.judge).
eigendata: when the pilot criteria hold and no Judge axis is below its target (or there is neither a
failure nor a low axis) no LLM is asked: the version stays and pilot.stop is true (the pilot loop's
stop signal); a low axis alone (`judge_low_<axis>` category) is enough to evolve a set with no
failures. sea: Reflect runs whenever there are task-attributed failures or <eval_rules_improve>
items (from passing evaluations too).

eigendata  the Prompt Engineer's revision (prompt_revision): changes {role, operation ∈
           add_constraint | add_negative_example | relax_rule | tighten_rule | style_control, text,
           addresses}; strict: known roles and operations, every change addresses an observed
           category and the most frequent category is addressed. With a prompts directory
           (recipe/CLI `prompts_dir`, else $TOOLKIT_PROMPTS; never the shipped toolkit/prompts) each
           changed role's prompt is written there as a new version `eigendata/<role>.v<N+1>.txt`
           (the set's current version + a section with the learned rules), pinned in
           plan.extra.prompt_versions[role] with plan.extra.prompts_dir, and each reflection lists
           the files in `prompt_files`; without one the lines are appended to
           plan.extra.guidance[role] (rendered through {{guidance}}). Evaluation-side changes
           (task_validation, task_quality, trajectory_validation) are also appended to
           plan.evaluation_rules, which `verify --strategy judge` and the SEA roles read.
sea        AReaL-SEA Reflect: prompt 5 rewrites plan.synthesis_plan from the reports of
           task-attributed failures; prompt 6 rewrites plan.evaluation_rules from the collected
           <eval_rules_improve> items (only when there are some).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from toolkit.flows.eigendata import common as C
from toolkit.flows.eigendata import metrics as M
from toolkit.flows.eigendata import orchestration as OJ
from toolkit.io import add_provenance, log
from toolkit.roles.structured import (Malformed, RoleRejected, add_usage, ask_structured, new_usage, parse_tagged_json,
                                      tagged_text)
from toolkit.roles.judge import improve_items
from toolkit.schema import Record
from toolkit.stages.base import StageParts
from toolkit.stages.registry import strategy
from toolkit.flows.eigendata import options as O
from toolkit import prompts
from toolkit.io import UsageError

ROLES = ("random_pool", "user_intent", "task_validation", "task_quality", "modify", "verification_function",
         "trajectory_validation")
EVAL_ROLES = ("task_validation", "task_quality", "trajectory_validation")
OPERATIONS = ("add_constraint", "add_negative_example", "relax_rule", "tighten_rule", "style_control")


def evidence(records: list[Record], per_category: int = 3) -> dict:
    ex: dict[str, list[str]] = defaultdict(list)
    for r in records:
        cats = M.failure_categories(r)
        reasons = [x for v in r.verdicts if not v.passed for x in v.reasons]
        for c in dict.fromkeys(cats):
            if len(ex[c]) < per_category:
                ex[c].append(f"{r.id}: " + C.short("; ".join(reasons), 300))
    return dict(ex)


def parse_revision(categories: list[str]):
    top = categories[0] if categories else None

    def parse(text: str | None) -> dict:
        obj = parse_tagged_json(text, "revision")
        if not isinstance(obj, dict) or not isinstance(obj.get("changes"), list) or not obj["changes"]:
            raise Malformed("<revision> needs a non-empty 'changes' list")
        for i, c in enumerate(obj["changes"]):
            if not isinstance(c, dict):
                raise Malformed(f"changes[{i}] must be an object")
            if c.get("role") not in ROLES:
                raise Malformed(f"changes[{i}].role must be one of {', '.join(ROLES)}, got {c.get('role')!r}")
            if c.get("operation") not in OPERATIONS:
                raise Malformed(f"changes[{i}].operation must be one of {', '.join(OPERATIONS)}, got {c.get('operation')!r}")
            if not isinstance(c.get("text"), str) or not c["text"].strip():
                raise Malformed(f"changes[{i}].text is empty")
            if c.get("addresses") not in categories:
                raise Malformed(f"changes[{i}].addresses must be an observed category ({', '.join(categories)}), "
                                f"got {c.get('addresses')!r}")
        if top and not any(c["addresses"] == top for c in obj["changes"]):
            raise Malformed(f"no change addresses the most frequent category {top!r}")
        return obj

    return parse


def _tag_parser(tag: str):
    return lambda text: tagged_text(text, tag, allow_empty=False)


def _next_version(v: str | None) -> str:
    try:
        return str(int(str(v or "1").lstrip("v")) + 1)
    except ValueError:
        return f"{v}.1"


def prompts_dir(given: str | None) -> Path | None:
    """Where evolved prompt versions go: `given` (reflect's --prompts-dir), else $TOOLKIT_PROMPTS;
    refused when it is (inside) the shipped prompts folder."""
    d = given or os.environ.get("TOOLKIT_PROMPTS")
    if not d:
        return None
    p = Path(d).expanduser().resolve()
    shipped = prompts.SHIPPED.resolve()
    if p == shipped or shipped in p.parents:
        raise UsageError(f"prompts_dir {d} is the shipped prompts folder; reflect writes new versions to a "
                         "directory of your own (--prompts-dir / $TOOLKIT_PROMPTS)")
    return p


def _line(c: dict) -> str:
    line = c["text"].strip()
    if c["operation"] == "add_negative_example" and not line.lower().startswith("do not"):
        line = "Negative example (do NOT do this): " + line
    return line


def write_prompt_version(root: Path, role: str, plan: dict, changes: list[dict], key: tuple[str, str]) -> dict:
    """Write `root/eigendata/<role>.v<N+1>.txt`: the prompt set's current version of the role
    (pinned or newest) plus the learned rules; N+1 is above every existing version (shipped,
    $TOOLKIT_PROMPTS, root) so files never collide. Returns {role, from, version, path}."""
    pinned = (plan["extra"].get("prompt_versions") or {}).get(role)
    # builds on this set's own version: pinned, else the un-evolved newest (never another set's)
    base = prompts.load_for_set(f"{C.FLOW}/{role}", int(pinned) if pinned else None, dirs=[str(root)])
    new_v = max(prompts.versions(f"{C.FLOW}/{role}", dirs=[str(root)])) + 1
    # learned text must not create {{placeholders}} the renderer would demand
    lines = [f"- [{c['operation']}; addresses {c['addresses']}] " + _line(c).replace("{{", "{ {").replace("}}", "} }")
             for c in changes]
    text = base.text.rstrip("\n") + (
        f"\n\nRules learned from earlier failures (reflect: prompt set {key[0]}, version {key[1]}; "
        f"prompt {base.id} → v{new_v}). Follow them:\n" + "\n".join(lines) + "\n")
    d = root / C.FLOW
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{role}.v{new_v}.txt"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    own = prompts.owner_path(path)
    own.write_text(json.dumps({"prompt_set": key[0], "from_version": key[1], "role": role, "from": base.id,
                               "version": new_v}, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return {"role": role, "from": base.id, "version": new_v, "path": str(path)}


def _base_plan(records: list[Record], key: tuple[str, str]) -> dict:
    first = next((r for r in records if r.plan is not None), None)
    plan = first.plan.model_dump(mode="json") if first else {"id": key[0]}
    plan.setdefault("prompt_set", key[0])
    plan["prompt_set"] = plan.get("prompt_set") or key[0]
    plan["prompt_version"] = key[1]
    plan.setdefault("extra", {})
    plan["extra"].setdefault("guidance", {})
    plan["extra"].setdefault("reflections", [])
    return plan


def _judge_examples(judge: dict, per_axis: int = 3) -> dict:
    out: dict[str, list[str]] = {}
    for axis in judge.get("low") or []:
        ex = [f"{a['id']}: {c}" for a in judge["artifacts"] for c in a["critiques"] if c.startswith(axis)]
        out[f"judge_low_{axis}"] = ex[:per_axis] or [f"batch mean {judge['means'][axis]} < target {judge['targets'][axis]}"]
    return out


def _build(opts: O.ReflectOptions, ctx, flavour: str):
    attempts, thresholds, judge_targets = opts.attempts, opts.pilot_criteria, opts.judge_targets
    held: list[Record] = []
    out_dir = prompts_dir(ctx.opts.prompts_dir) if flavour == "eigendata" else None

    async def fn(record: Record):
        held.append(record)
        return None

    async def finish() -> list[Record]:
        groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
        for r in held:
            groups[M.group_key(r)].append(r)
        out = []
        for key in sorted(groups):
            try:
                rec = await reflect_group(key, groups[key])
            except Exception as e:  # one bad group must not lose the others' new versions
                log(f"reflect {flavour} {key[0]} v{key[1]}: {type(e).__name__}: {e}")
                continue
            out.append(rec)
        return out

    async def reflect_group(key: tuple[str, str], recs: list[Record]) -> Record:
        m = M.batch_metrics(recs)
        crit = M.pilot_criteria(m, thresholds)
        plan = _base_plan(recs, key)
        judge = OJ.judge_batch(recs, judge_targets)  # the orchestration Judge's multi-axis scores
        jcats = OJ.low_categories(judge) if flavour == "eigendata" else []
        cats = list(m["categories"]) + jcats
        ev = {"records": len(recs), "categories": dict(m["categories"], **{c: judge["n_artifacts"] for c in jcats}),
              "examples": dict(evidence(recs), **_judge_examples(judge)),
              "judge": {k: judge[k] for k in ("means", "targets", "low")}}
        usage, model = new_usage(), None
        if flavour == "eigendata":
            # the Prompt Engineer revises from failures AND from the Judge's scores: a set whose
            # batch has no failure still evolves while an axis is below its target (§4.3)
            stop = (crit["met"] and not jcats) or not cats
            act = not stop
        else:
            reports = [f"{r.id}: " + "; ".join(v.reasons)[:800] for r in recs for v in r.verdicts
                       if not v.passed and v.attribution == "task"]
            # prompt 6 consumes the aggregated <eval_rules_improve> items of every evaluation
            items = list(dict.fromkeys(
                x for r in recs for v in r.verdicts for x in improve_items(v.scores.get("eval_rules_improve"), None)))
            act = bool(reports or items)  # Reflect(P_s, P_e, F): failures and rule improvements
            stop = crit["met"] or not act
        change: dict = {"from_version": key[1], "to_version": key[1], "evidence": ev, "changes": []}
        if act:
            try:
                if flavour == "eigendata":
                    p = C.role_prompt("prompt_revision")
                    text = p.render(prompt_set=key[0], version=key[1], top=cats[0],
                                    current=json.dumps(plan["extra"]["guidance"], ensure_ascii=False),
                                    metrics=json.dumps(m, ensure_ascii=False), evidence=json.dumps(ev, ensure_ascii=False),
                                    judge=json.dumps({k: judge[k] for k in ("axes", "means", "targets", "low")},
                                                     ensure_ascii=False))
                    got = await ask_structured(ctx.llm("reflector"), [{"role": "user", "content": text}],
                                               parse_revision(cats), role="prompt_revision", attempts=attempts)
                    add_usage(usage, got.usage)
                    model = got.model
                    by_role: dict[str, list[dict]] = defaultdict(list)
                    for c in got.value["changes"]:
                        by_role[c["role"]].append(c)
                        if out_dir is None:
                            plan["extra"]["guidance"].setdefault(c["role"], []).append(_line(c))
                    if out_dir is not None:
                        files = [write_prompt_version(out_dir, role, plan, cs, key) for role, cs in by_role.items()]
                        for f in files:
                            plan["extra"].setdefault("prompt_versions", {})[f["role"]] = f["version"]
                            log(f"reflect eigendata {key[0]} v{key[1]}: wrote {f['path']}")
                        plan["extra"]["prompts_dir"] = str(out_dir)
                        change["prompt_files"] = files
                    rules = [f"- {_line(c)} (learned from {c['addresses']} failures)"
                             for r in EVAL_ROLES for c in by_role.get(r, [])]
                    if rules:
                        plan["evaluation_rules"] = ((plan.get("evaluation_rules") or "").rstrip() + "\n"
                                                    "Rules learned from earlier failures:\n" + "\n".join(rules)).strip()
                    change["changes"] = got.value["changes"]
                    change["rationale"] = got.value.get("rationale")
                else:
                    env_desc = plan.get("evaluation_rules") or ""
                    if reports:
                        p = C.role_prompt("plan_improvement")
                        got = await ask_structured(ctx.llm("reflector"), [{"role": "user", "content": p.render(
                            task_description=recs[0].extra.get("target") or env_desc or "(see the plan)",
                            synthesis_plan=plan.get("synthesis_plan") or "(none)",
                            evaluation_reports="\n".join(reports[:20]))}], _tag_parser("synthesis_plan"),
                            role="plan_improvement", attempts=attempts)
                        add_usage(usage, got.usage)
                        model = got.model
                        change["changes"].append({"field": "synthesis_plan", "old": plan.get("synthesis_plan"),
                                                  "new": got.value, "addresses": "task"})
                        plan["synthesis_plan"] = got.value
                    if items:
                        p = C.role_prompt("rules_improvement")
                        got = await ask_structured(ctx.llm("reflector"), [{"role": "user", "content": p.render(
                            task_description=recs[0].extra.get("target") or "(see the plan)",
                            eval_rules=plan.get("evaluation_rules") or "(none)",
                            eval_rules_improvements="\n".join(f"- {x}" for x in items[:25]))}],
                            _tag_parser("eval_rules"), role="rules_improvement", attempts=attempts)
                        add_usage(usage, got.usage)
                        model = got.model
                        change["changes"].append({"field": "evaluation_rules", "old": plan.get("evaluation_rules"),
                                                  "new": got.value, "addresses": "eval_rules_improve"})
                        plan["evaluation_rules"] = got.value
            except RoleRejected as e:
                log(f"reflect {flavour} {key[0]} v{key[1]}: {e}")
                change["error"] = str(e)
            if change["changes"]:
                change["to_version"] = plan["prompt_version"] = _next_version(key[1])
        plan["extra"]["reflections"] = list(plan["extra"]["reflections"]) + [change]
        plan["extra"]["pilot"] = {"metrics": m, "criteria": crit, "stop": stop, "judge": judge,
                                  "iteration": len(plan["extra"]["reflections"])}
        first = next((r for r in recs if r.env is not None), recs[0])
        rec = Record.model_validate({"id": f"{key[0]}-v{plan['prompt_version']}", "flow": C.FLOW,
                                     "tags": ["eigendata", "plan"], "plan": plan,
                                     "env": first.env.model_dump(mode="json") if first.env else None,
                                     "extra": {"target": first.extra.get("target")} if first.extra.get("target") else {}})
        add_provenance(rec, "reflect", strategy=flavour, model=model, recipe_hash=opts.recipe_hash, usage=usage)
        return rec

    return StageParts(process=fn, finish=finish)


@strategy("reflect", "eigendata", options=O.ReflectOptions, help="EigenData prompt evolution: failure categories per prompt set/version → new versioned guidance")
def build_eigendata(opts: O.ReflectOptions, ctx):
    return _build(opts, ctx, "eigendata")


@strategy("reflect", "sea", options=O.ReflectOptions, help="AReaL-SEA Reflect: improve synthesis plan (task failures) and evaluation rules (improve items)")
def build_sea(opts: O.ReflectOptions, ctx):
    return _build(opts, ctx, "sea")
