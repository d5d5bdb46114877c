"""EigenData UserIntentAgent (gen-task step `user_intent`): the `<intent>` JSON, checked
mechanically against the environment (function names exist, 2+ sequential calls) and mapped into
task.user_scenario / task.ground_truth / task.extra (FLOWS §1.2 Stage 2)."""

from __future__ import annotations

from typing import Any

from toolkit.flows.eigendata.common import text_list
from toolkit.roles.structured import Malformed, parse_tagged_json

REQUIRED = ("context", "purpose", "reason_for_call", "known_info", "task_instructions", "rubrics",
            "must_have_functions", "selected_parameters")
MIN_CALLS = 2


def make_parser(known_tools: list[str]):
    known = set(known_tools)

    def parse(text: str | None) -> dict:
        obj = parse_tagged_json(text, "intent")
        if not isinstance(obj, dict):
            raise Malformed("<intent> must hold a JSON object")
        missing = [k for k in REQUIRED if k not in obj]
        if missing:
            raise Malformed(f"<intent> misses {', '.join(missing)}")
        for k in ("context", "purpose", "reason_for_call", "known_info", "task_instructions"):
            if not isinstance(obj[k], str) or not obj[k].strip():
                raise Malformed(f"{k!r} must be a non-empty string")
        mh = obj["must_have_functions"]
        if not isinstance(mh, list) or not all(isinstance(x, str) for x in mh):
            raise Malformed("'must_have_functions' must be a list of function names")
        mh = list(dict.fromkeys(x.strip() for x in mh if x.strip()))
        unknown = [x for x in mh if x not in known]
        if unknown:
            raise Malformed(f"must_have_functions names unknown function(s) {', '.join(unknown)}; "
                            f"the environment has: {', '.join(sorted(known))[:600]}")
        actions = obj.get("expected_actions") or []
        if not isinstance(actions, list):
            raise Malformed("'expected_actions' must be a list")
        norm = []
        for i, a in enumerate(actions):
            if not isinstance(a, dict) or not isinstance(a.get("name"), str):
                raise Malformed(f"expected_actions[{i}] must be {{\"name\", \"arguments\"}}")
            if a["name"] not in known:
                raise Malformed(f"expected_actions[{i}] calls unknown function {a['name']!r}")
            args = a.get("arguments") or {}
            if not isinstance(args, dict):
                raise Malformed(f"expected_actions[{i}].arguments must be an object")
            norm.append({"name": a["name"], "arguments": args})
        if max(len(mh), len(norm)) < MIN_CALLS:
            raise Malformed(f"the task needs {MIN_CALLS}+ sequential function calls; must_have_functions "
                            f"has {len(mh)} and expected_actions {len(norm)}")
        rub = text_list(obj["rubrics"])
        if not rub:
            raise Malformed("'rubrics' is empty")
        if not isinstance(obj["selected_parameters"], dict):
            raise Malformed("'selected_parameters' must be an object")
        return dict(obj, must_have_functions=mh, expected_actions=norm, rubrics=rub)

    return parse


def to_task(intent: dict, selection: dict, pool: dict, prompt_ids: dict) -> dict:
    """The task dict (schema Task) for one validated intent."""
    return {
        "instruction": intent["reason_for_call"],
        "user_scenario": {
            "persona": intent["context"],
            "reason_for_call": intent["reason_for_call"],
            "known_info": intent["known_info"],
            "instructions": intent["task_instructions"],
            "extra": {"behavioral_pattern": selection["behavioral_pattern"],
                      "urgency_level": selection["urgency_level"],
                      "emotional_state": selection["emotional_state"],
                      "user_profile": selection["user_profile"]},
        },
        "ground_truth": {
            "must_have_functions": intent["must_have_functions"],
            "rubrics": intent["rubrics"],
            "actions": intent["expected_actions"],
        },
        "difficulty": selection["complexity_level"],
        "complexity": {"level": selection["complexity_level"],
                       "operational_complexity": selection["operational_complexity"],
                       "min_calls": max(len(intent["must_have_functions"]), len(intent["expected_actions"]))},
        "extra": {
            "purpose": intent["purpose"],
            "primary_objective": selection["testing_objectives"][0],
            "selected_parameters": selection,
            "llm_selected_parameters": intent["selected_parameters"],
            "random_factors": pool,
            "prompt_ids": prompt_ids,
        },
    }


def primary_objective(task: Any) -> str | None:
    ex = task.extra if task is not None else {}
    return ex.get("primary_objective") or ((ex.get("selected_parameters") or {}).get("testing_objectives") or [None])[0]
