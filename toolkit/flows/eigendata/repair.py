"""repair --strategy eigendata: EigenData ModifyAgent (FLOWS §1.2 Stage 6).

Mode from the record's failing verdicts (deterministic, `choose_mode`):
  TASK        a validate-task verdict failed (attribution task)
  COMBINED    a verify verdict failed with attribution task (the trajectory failed because of the task)
  TRAJECTORY  a verify verdict failed with attribution trajectory (or none)
A failure attributed to user_simulator / infrastructure is not repaired (re-run the rollout): the
record is rejected with that reason; so is a verify verdict that is only a malformed judge reply
(scores.malformed, no attribution): that is a judge failure (re-run verify), never TRAJECTORY repair; a record without failing verdicts passes through unchanged.

Rounds: the record's `extra.repair_round` + 1; at most `--max-rounds` (≤ 3): 1 minimal, 2 broader,
3 aggressive or discard. A record past the limit, or one the model discards, is rejected.

Preservation (checked mechanically; a violation is a malformed reply, retried): primary testing
objective and complexity level unchanged (preserved_elements must name them), ≥ 80% of the
original must_have_functions kept, behavioural pattern unchanged, every function name exists.

Repaired trajectories: the model lists turns and function calls only; every call is RE-EXECUTED in
a fresh environment and the real result inserted (tool results the model writes are dropped).

Output: a NEW record (id `<root>-rep<round>`, parent_id = the input id) with extra.repair_round,
repair_mode, repairs_applied, repair_history; its verdicts are cleared (re-validate it).
"""

from __future__ import annotations

import json

from toolkit.flows.eigendata import common as C
from toolkit.formats.tools import tools_text
from toolkit.flows.eigendata.user_intent import primary_objective
from toolkit.io import StageError, add_provenance, log
from toolkit.roles.structured import Malformed, RoleRejected, ask_structured, need_enum, parse_json_object
from toolkit.schema import Record
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.eigendata import options as O
from toolkit.flows.eigendata.validate_task import task_text
from toolkit.roles.env_simulator import render_history

MODES = ("TASK", "TRAJECTORY", "COMBINED")
MAX_ROUNDS = O.MAX_ROUNDS
KEEP_FRACTION = 0.8
SCENARIO_FIELDS = {"context": "persona", "reason_for_call": "reason_for_call", "known_info": "known_info",
                   "unknown_info": "unknown_info", "task_instructions": "instructions", "instructions": "instructions"}


def failures(record: Record) -> list:
    return [v for v in record.verdicts if not v.passed and v.stage in ("validate-task", "verify")]


def choose_mode(record: Record) -> tuple[str | None, list]:
    """(mode, failing verdicts); mode None = nothing to repair. Raises StageError for failures
    that repair cannot fix (user simulator / infrastructure)."""
    fails = failures(record)
    if not fails:
        return None, []
    task_fail = [v for v in fails if v.stage == "validate-task"]
    if task_fail:
        return "TASK", task_fail
    vf = [v for v in fails if v.stage == "verify"]
    judge_fail = [v for v in vf if v.scores.get("malformed")]
    vf = [v for v in vf if not v.scores.get("malformed")]
    if judge_fail and not vf:
        # no verdict on the trajectory at all: the JUDGE failed, nothing says the trajectory is wrong
        raise StageError("the judge's reply was malformed (no verdict, no attribution): a judge failure, "
                         "not a trajectory failure; re-run verify instead of repairing", field="verdicts")
    if vf and all(v.attribution in ("user_simulator", "infrastructure") for v in vf):
        raise StageError("the failure is attributed to " + "/".join(sorted({v.attribution for v in vf}))
                         + ": re-run the rollout instead of repairing", field="verdicts")
    if any(v.attribution == "task" for v in vf):
        return "COMBINED", vf
    return "TRAJECTORY", vf


def _behavior(record: Record) -> str | None:
    t = record.task
    if t is None:
        return None
    us = t.user_scenario.extra if t.user_scenario else {}
    return us.get("behavioral_pattern") or (t.extra.get("selected_parameters") or {}).get("behavioral_pattern")


def _complexity(record: Record) -> str | None:
    t = record.task
    return (t.complexity or {}).get("level") or t.difficulty if t else None


def make_parser(record: Record, mode: str, names: set[str], round_: int):
    must = list(record.task.ground_truth.must_have_functions) if record.task and record.task.ground_truth else []
    prim, cx, beh = primary_objective(record.task), _complexity(record), _behavior(record)

    def parse(text: str | None) -> dict:
        obj = parse_json_object(text)
        if obj.get("discard") is True:
            if round_ < MAX_ROUNDS:
                raise Malformed(f"discard is only allowed in round {MAX_ROUNDS}; this is round {round_}")
            return {"discard": True, "reason": str(obj.get("reason") or "discarded by the ModifyAgent")}
        got = need_enum(obj, "repair_mode", MODES)
        if got != mode:
            raise Malformed(f"repair_mode must be {mode} (chosen from the verdicts), got {got}")
        if not isinstance(obj.get("repairs_applied"), list) or not obj["repairs_applied"]:
            raise Malformed("'repairs_applied' must be a non-empty list")
        pe = obj.get("preserved_elements")
        if not isinstance(pe, dict):
            raise Malformed("'preserved_elements' must be an object")
        if prim and prim not in json.dumps(pe.get("testing_objectives"), ensure_ascii=False):
            raise Malformed(f"the primary testing objective {prim!r} must be preserved")
        if cx and str(pe.get("complexity_level", "")).strip().lower() != str(cx).lower():
            raise Malformed(f"the complexity level must stay {cx!r}, got {pe.get('complexity_level')!r}")
        out = dict(obj, repair_mode=got)
        if mode in ("TASK", "COMBINED"):
            sc = obj.get("repaired_scenario")
            if not isinstance(sc, dict) or not sc:
                raise Malformed(f"{mode} mode needs a non-empty 'repaired_scenario'")
            if "must_have_functions" in sc:
                mh = sc["must_have_functions"]
                if not isinstance(mh, list) or not all(isinstance(x, str) for x in mh):
                    raise Malformed("repaired must_have_functions must be a list of names")
                unknown = [x for x in mh if x not in names]
                if unknown:
                    raise Malformed(f"repaired must_have_functions names unknown function(s) {', '.join(unknown)}")
                if must:
                    kept = len(set(must) & set(mh)) / len(set(must))
                    if kept < KEEP_FRACTION:
                        raise Malformed(f"only {kept:.0%} of must_have_functions kept; at least 80% required")
            for i, a in enumerate(sc.get("expected_actions") or []):
                if not isinstance(a, dict) or a.get("name") not in names or not isinstance(a.get("arguments", {}), dict):
                    raise Malformed(f"repaired expected_actions[{i}] is not a call of a known function")
            if beh and sc.get("behavioral_pattern") not in (None, beh):
                raise Malformed(f"the behavioural pattern must stay {beh!r}")
            if cx and sc.get("complexity_level") not in (None, cx):
                raise Malformed(f"the complexity level must stay {cx!r}")
        if mode in ("TRAJECTORY", "COMBINED"):
            out["trajectory_items"], out["dropped_tool_results"] = trajectory_items(obj.get("repaired_trajectory"), names)
        return out

    return parse


def trajectory_items(raw, names: set[str]) -> tuple[list[dict], int]:
    if not isinstance(raw, list) or not raw:
        raise Malformed("'repaired_trajectory' must be a non-empty list of turns")
    items, dropped = [], 0
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise Malformed(f"repaired_trajectory[{i}] must be an object")
        role = t.get("role")
        if role == "tool":  # results are never taken from the model
            dropped += 1
            continue
        calls = []
        if isinstance(t.get("function"), dict):
            calls = [t["function"]]
        elif isinstance(t.get("tool_call"), dict):
            calls = [t["tool_call"]]
        elif isinstance(t.get("tool_calls"), list):
            calls = [c.get("function", c) for c in t["tool_calls"] if isinstance(c, dict)]
        if calls:
            for c in calls:
                args = c.get("arguments") or {}
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        raise Malformed(f"repaired_trajectory[{i}]: arguments are not JSON") from None
                if c.get("name") not in names or not isinstance(args, dict):
                    raise Malformed(f"repaired_trajectory[{i}] calls unknown function {c.get('name')!r}")
                items.append({"tool_call": {"name": c["name"], "arguments": args}, "side": t.get("side") or "agent"})
            continue
        if role not in ("user", "assistant") or not isinstance(t.get("content"), str):
            raise Malformed(f"repaired_trajectory[{i}] must be a user/assistant turn with content or a function call")
        items.append({"role": role, "content": t["content"]})
    if not any(it.get("role") == "user" for it in items):
        raise Malformed("the repaired trajectory has no user turn")
    return items, dropped


def apply_scenario(task: dict, sc: dict) -> None:
    us = task.setdefault("user_scenario", {}) or {}
    task["user_scenario"] = us
    for k, field in SCENARIO_FIELDS.items():
        if isinstance(sc.get(k), str):
            us[field] = sc[k]
    if isinstance(sc.get("reason_for_call"), str):
        task["instruction"] = sc["reason_for_call"]
    gt = task.setdefault("ground_truth", {}) or {}
    task["ground_truth"] = gt
    if isinstance(sc.get("must_have_functions"), list):
        gt["must_have_functions"] = list(dict.fromkeys(sc["must_have_functions"]))
    if sc.get("rubrics"):
        gt["rubrics"] = C.text_list(sc["rubrics"])
    if isinstance(sc.get("expected_actions"), list):
        gt["actions"] = [{"name": a["name"], "arguments": a.get("arguments") or {}} for a in sc["expected_actions"]]
        gt.pop("target_state", None)
        gt.pop("target_state_ref", None)


@strategy("repair", "eigendata", options=O.RepairOptions, help="EigenData ModifyAgent: TASK/TRAJECTORY/COMBINED, ≤3 rounds, preservation checked, tool calls re-executed")
def build(opts: O.RepairOptions, ctx: StageContext):
    max_rounds = min(MAX_ROUNDS, opts.max_rounds)
    attempts = opts.attempts

    async def fn(record: Record):
        mode, fails = choose_mode(record)
        if mode is None:
            log(f"repair eigendata {record.id}: no failing verdict, passed through")
            return record
        if record.task is None:
            raise StageError("record has no task to repair", field="task")
        round_ = int(record.extra.get("repair_round") or 0) + 1
        if round_ > max_rounds:
            raise StageError(f"discarded: still failing after {round_ - 1} repair round(s) (max {max_rounds})",
                             field="extra.repair_round")
        env = C.load_record_env(record)
        try:
            names = set(C.tool_names(env))
            traj = None
            if mode != "TASK":
                bad_ids = {v.trajectory_id for v in fails}
                traj = next((t for t in record.trajectories if t.id in bad_ids), None) or (
                    record.trajectories[0] if record.trajectories else None)
                if traj is None:
                    raise StageError(f"{mode} repair needs the failed trajectory", field="trajectories")

            fail_text = "\n".join(f"- [{v.stage}/{v.name}] attribution={v.attribution}: " + "; ".join(v.reasons)[:1500]
                                  + (f" categories={v.scores.get('failure_categories') or v.scores.get('critical')}"
                                     if (v.scores.get('failure_categories') or v.scores.get('critical')) else "")
                                  for v in fails)
            gt = record.task.ground_truth
            p = C.role_prompt("modify", record)
            text = p.render(mode=mode, round=round_, max_rounds=max_rounds, policy=C.policy_text(env, 4000),
                            tools=tools_text(C.tool_schemas(env, "agent") + C.tool_schemas(env, "user"), "signatures", limit=12000),
                            failures=fail_text, task=task_text(record),
                            trajectory=render_history([m.model_dump(mode="json", exclude_none=True) for m in traj.messages],
                                                      16000) if traj else "(not used in TASK mode)",
                            primary_objective=primary_objective(record.task) or "(not recorded)",
                            complexity=_complexity(record) or "(not recorded)",
                            must_have=", ".join(gt.must_have_functions) if gt else "(none)",
                            behavioral_pattern=_behavior(record) or "(not recorded)",
                            guidance=C.guidance(record, "modify"))
            try:
                got = await ask_structured(ctx.llm("repair"), [{"role": "user", "content": text}],
                                           make_parser(record, mode, names, round_), role="modify", attempts=attempts)
            except RoleRejected as e:
                raise StageError(str(e), field="task") from None
            v = got.value
            if v.get("discard"):
                raise StageError(f"discarded in round {round_}: {v['reason']}", field="extra.repair_round")
            data = record.model_dump(mode="json", by_alias=True)
            root = record.extra.get("repair_root") or record.id
            data.update(id=f"{root}-rep{round_}", parent_id=record.id, verdicts=[], verifier=None)
            if mode in ("TASK", "COMBINED"):
                apply_scenario(data["task"], v["repaired_scenario"])
            if mode in ("TRAJECTORY", "COMBINED"):
                env.reset()
                system = next((m.content for m in traj.messages if m.role == "system"), None)
                new = C.calls_to_trajectory(env, v["trajectory_items"], f"{traj.id}-rep{round_}", system=system,
                                            tools=[t.model_dump(mode="json") for t in traj.tools])
                new.extra["repaired_from"] = traj.id
                data["trajectories"] = [new.model_dump(mode="json")]
            elif mode == "TASK":
                data["trajectories"] = []
        finally:
            env.close()
        hist = list(record.extra.get("repair_history") or []) + [{
            "round": round_, "mode": mode, "parent_id": record.id,
            "failures": [{"stage": f.stage, "name": f.name, "attribution": f.attribution, "reasons": f.reasons[:3]}
                         for f in fails]}]
        data["extra"] = dict(data.get("extra") or {}, repair_round=round_, repair_mode=mode, repair_root=root,
                             repairs_applied=v["repairs_applied"], original_failure=v.get("original_failure"),
                             dropped_tool_results=v.get("dropped_tool_results", 0), repair_history=hist)
        out = Record.model_validate(data)
        add_provenance(out, "repair", strategy="eigendata", model=got.model, recipe_hash=opts.recipe_hash,
                       usage=got.usage)
        return out

    return fn
