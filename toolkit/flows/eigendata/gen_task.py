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
from toolkit.flows.eigendata.random_pool import parse_pool, select
from toolkit.flows.eigendata.user_intent import make_parser, to_task
from toolkit.io import StageError, add_provenance, log
from toolkit.roles.structured import RoleRejected, add_usage, ask_structured, new_usage
from toolkit.schema import Record
from toolkit.stages.registry import strategy

SYSTEM = "You are a data-synthesis worker agent. Follow the output format exactly."


@strategy("gen-task", "eigendata", help="EigenData RandomPool → UserIntent (<intent> JSON, counts and tool names checked)")
def build(cfg: dict, ctx):
    n = int(cfg.get("n") or 1)
    attempts = int(cfg.get("attempts") or 3)

    async def fn(record: Record):
        client = ctx.llm("generator")
        env = C.load_record_env(record)
        try:
            tools = C.tool_schemas(env, "agent") + C.tool_schemas(env, "user")
            names = C.tool_names(env)
            if not names:
                raise StageError("the environment exposes no tools", field="env")
            view = {"policy": C.policy_text(env, 4000), "tools": C.tools_text(tools),
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
                           recipe_hash=cfg.get("recipe_hash"), usage=share)
        return out

    return fn
