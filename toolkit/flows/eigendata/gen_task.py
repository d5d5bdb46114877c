"""gen-task --strategy eigendata: RandomPool → UserIntent (EigenData §4.2, App. 3.1).

Per input record (an environment record, or a plan record of a prompt set): one RandomPool call
(pool checked against the paper's counts), then `-n` scenarios, each with parameters drawn
deterministically from the pool and one UserIntent call whose `<intent>` JSON is checked against
the environment (function names exist, 2+ sequential calls) before it becomes a task record.
Malformed replies are retried (`--attempts`); a role that never answers validly rejects the
input line with every attempt's reason.
"""

from __future__ import annotations

import json

from toolkit.flows.eigendata import common as C
from toolkit.formats.tools import tools_text
from toolkit.flows.eigendata.random_pool import parse_pool, select
from toolkit.flows.eigendata.user_intent import make_parser, to_task
from toolkit.io import StageError, add_provenance, log
from toolkit.roles.structured import RoleRejected, add_usage, ask_structured, new_usage
from toolkit.schema import Record
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.eigendata import options as O
from toolkit.flows.eigendata.tool_loop import tool_loop
from toolkit.roles.structured import Malformed, tagged_text

SYSTEM = "You are a data-synthesis worker agent. Follow the output format exactly."


@strategy("gen-task", "eigendata", options=O.GenTaskOptions, help="EigenData RandomPool → UserIntent (<intent> JSON, counts and tool names checked)")
def build(opts: O.GenTaskOptions, ctx: StageContext):
    n, attempts = opts.n, opts.attempts

    async def fn(record: Record):
        client = ctx.llm("generator")
        env = C.load_record_env(record)
        try:
            tools = C.tool_schemas(env, "agent") + C.tool_schemas(env, "user")
            names = C.tool_names(env)
            if not names:
                raise StageError("the environment exposes no tools", field="env")
            view = {"policy": C.policy_text(env, 4000), "tools": tools_text(tools, "signatures", limit=12000),
                    "state": C.state_summary(env)}
        finally:
            env.close()
        usage = new_usage()
        p_pool = C.role_prompt("random_pool", record)
        msgs = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": p_pool.render(**view, guidance=C.guidance(record, "random_pool"))}]
        try:
            got = await ask_structured(client, msgs, parse_pool, role="random_pool", attempts=attempts)
        except RoleRejected as e:
            raise StageError(str(e), field="task.extra.random_factors") from None
        add_usage(usage, got.usage)
        pool = got.value
        p_int = C.role_prompt("user_intent", record)
        parse = make_parser(names)
        prompt_ids = {"random_pool": C.prompt_id(record, "random_pool"), "user_intent": C.prompt_id(record, "user_intent")}
        out, errors = [], []
        for k in range(n):
            sel = select(pool, record.id, k)
            params = (f"behavioral pattern {sel['behavioral_pattern']}; complexity {sel['complexity_level']}; "
                      f"urgency {sel['urgency_level']}; emotional state {sel['emotional_state']}")
            text = p_int.render(**view, profile=json.dumps(sel["user_profile"], ensure_ascii=False),
                                testing_objectives=", ".join(sel["testing_objectives"]),
                                deception_tactics=", ".join(sel["deception_tactics"]),
                                operational_complexity=", ".join(sel["operational_complexity"]),
                                policy_focuses=", ".join(sel["policy_focuses"]), parameters=params,
                                guidance=C.guidance(record, "user_intent"))
            try:
                it = await ask_structured(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                                          parse, role="user_intent", attempts=attempts, sample_index=k * attempts)
            except RoleRejected as e:
                add_usage(usage, e.usage)
                errors.append(f"scenario {k}: {e}")
                continue
            add_usage(usage, it.usage)
            task = to_task(it.value, sel, pool, prompt_ids)
            task["extra"]["attempts"] = {"random_pool": got.attempts, "user_intent": it.attempts}
            data = {"id": f"{record.id}-ed{k}", "parent_id": record.id, "flow": C.FLOW,
                    "tags": list(dict.fromkeys(list(record.tags) + ["eigendata"])),
                    "env": record.env.model_dump(mode="json") if record.env else None,
                    "plan": record.plan.model_dump(mode="json") if record.plan else None,
                    "task": task}
            out.append(Record.model_validate(data))
        if not out:
            raise StageError("user_intent: no valid scenario: " + " | ".join(errors), field="task")
        for e in errors:
            log(f"gen-task eigendata {record.id}: {e}")
        share = {k: (v / len(out) if isinstance(v, (int, float)) else v) for k, v in usage.items()}
        for r in out:
            add_provenance(r, "gen-task", strategy="eigendata", model=ctx.model_name("generator"),
                           recipe_hash=opts.recipe_hash, usage=share)
        return out

    return fn


# ----------------------------------------------------------------------------------------------
# AReaL-SEA Task Synthesis agent


def make_sea_parser(known: set[str], min_calls: int):
    def parse(text: str | None, transcript: list[dict]) -> dict:
        body = tagged_text(text, "synthetic_task")
        if body.startswith("```"):
            body = body.strip("`").removeprefix("json").strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            raise Malformed(f"<synthetic_task> is not valid JSON: {e.msg} at char {e.pos}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("user_instruction"), str) or not obj["user_instruction"].strip():
            raise Malformed("the synthetic task needs a non-empty 'user_instruction'")
        spec = obj.get("task_spec")
        if not isinstance(spec, dict):
            raise Malformed("'task_spec' must be an object")
        exp = obj.get("expected")
        if not isinstance(exp, dict) or not isinstance(exp.get("actions"), list):
            raise Malformed("'expected.actions' must be a list")
        acts = []
        for i, x in enumerate(exp["actions"]):
            if not isinstance(x, dict) or x.get("name") not in known or not isinstance(x.get("arguments", {}), dict):
                raise Malformed(f"expected.actions[{i}] is not a call of a known function")
            acts.append({"name": x["name"], "arguments": x.get("arguments") or {}})
        if len(acts) < 2:
            raise Malformed(f"the task needs 2+ sequential calls; expected.actions has {len(acts)}")
        ran = [t for t in transcript if t.get("error_code") != "UNKNOWN_TOOL"]
        if len(ran) < min_calls:
            raise Malformed(f"explore the environment first: {len(ran)} tool call(s) executed, {min_calls} required")
        return dict(obj, actions=acts)

    return parse


@strategy("gen-task", "sea", options=O.SeaGenTaskOptions, help="AReaL-SEA Task Synthesis agent: explores the env with read tools, writes q=(u, t, a*)")
def build_sea(opts: O.SeaGenTaskOptions, ctx: StageContext):
    n, attempts = opts.n, opts.attempts
    max_calls, min_calls = opts.synthesis_max_calls, opts.synthesis_min_calls

    async def fn(record: Record):
        env = C.load_record_env(record)
        out, errors, usage = [], [], new_usage()
        model = None
        try:
            tools = C.tool_schemas(env, "agent")
            names = set(C.tool_names(env))
            plan = (record.plan.synthesis_plan if record.plan and record.plan.synthesis_plan else
                    "(no plan: synthesize one realistic multi-step task)")
            p = C.role_prompt("task_synthesis", record)
            for k in range(n):
                env.reset()
                text = p.render(task_description=C.policy_text(env), synthesis_plan=plan, env_tools=tools_text(tools, "signatures", limit=12000),
                                guidance=C.guidance(record, "task_synthesis"))
                try:
                    res = await tool_loop(ctx.llm("generator"), [{"role": "user", "content": text}], env, tools,
                                          make_sea_parser(names, min_calls), role="task_synthesis", attempts=attempts,
                                          max_calls=max_calls, mode="readonly")
                except RoleRejected as e:
                    add_usage(usage, e.usage)
                    errors.append(f"task {k}: {e}")
                    continue
                add_usage(usage, res.usage)
                model = res.model
                v = res.value
                spec = {kk: v["task_spec"][kk] for kk in ("persona", "reason_for_call", "known_info", "unknown_info",
                                                          "instructions") if isinstance(v["task_spec"].get(kk), str)}
                exp = v["expected"]
                task = {"instruction": v["user_instruction"], "user_scenario": spec,
                        "ground_truth": {"actions": v["actions"],
                                         "must_have_functions": list(dict.fromkeys(a["name"] for a in v["actions"])),
                                         "final_answer": exp.get("final_answer"),
                                         "nl_assertions": C.text_list(exp.get("nl_assertions"))},
                        "extra": {"spec": v["task_spec"], "exploration": res.transcript, "attempts": res.attempts,
                                  "prompt_ids": {"task_synthesis": C.prompt_id(record, "task_synthesis")}}}
                out.append(Record.model_validate({
                    "id": f"{record.id}-sea{k}", "parent_id": record.id, "flow": C.FLOW,
                    "tags": list(dict.fromkeys(list(record.tags) + ["eigendata", "sea"])),
                    "env": record.env.model_dump(mode="json") if record.env else None,
                    "plan": record.plan.model_dump(mode="json") if record.plan else None, "task": task}))
        finally:
            env.close()
        if not out:
            raise StageError("task_synthesis: no valid task: " + " | ".join(errors), field="task")
        for e in errors:
            log(f"gen-task sea {record.id}: {e}")
        share = {k: (x / len(out) if isinstance(x, (int, float)) else x) for k, x in usage.items()}
        for r in out:
            add_provenance(r, "gen-task", strategy="sea", model=model, recipe_hash=opts.recipe_hash, usage=share)
        return out

    return fn
