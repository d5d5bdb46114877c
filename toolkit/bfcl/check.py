"""BFCL's own multi-turn checker (bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker: the
state of every instance after each turn equals the ground truth's, and the ground truth's
execution results are among the model's), run inside the sandbox on a trajectory's calls.

The trajectory is cut into turns at its user messages (one per scripted turn) and into steps at
its assistant messages; each step's tool calls become BFCL call strings. As BFCL's eval runner
does: steps without calls are skipped, a turn count that differs from the ground truth's is
`multi_turn:force_terminated`."""

from __future__ import annotations

from typing import Any

from toolkit.bfcl.data import call_string
from toolkit.sandbox import run_function

CHECK_SOURCE = '''
def check(decoded, ground_truth, entry, category):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    r = multi_turn_checker(decoded, ground_truth, entry, category, "toolkit")
    out = {"valid": bool(r.get("valid")), "error_type": r.get("error_type"),
           "error_message": r.get("error_message")}
    if not out["valid"]:
        d = r.get("details") or {}
        if "differences" in d:
            out["differences"] = str(d["differences"])[:2000]
        if "missing_items" in d:
            out["missing_items"] = [str(x)[:500] for x in d["missing_items"]][:20]
    return out
'''


def decode_turns(messages: list[dict]) -> list[list[list[str]]]:
    """[[step calls as BFCL strings] per assistant message with calls] per user turn."""
    turns: list[list[list[str]]] = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            turns.append([])
        elif role == "assistant" and m.get("tool_calls") and m.get("name") != "user" and turns:
            step = []
            for tc in m["tool_calls"]:
                fn = tc.get("function") or {}
                try:
                    import json

                    args = json.loads(fn.get("arguments") or "{}")
                    step.append(call_string(fn.get("name") or "", args if isinstance(args, dict) else {}))
                except (ValueError, TypeError):
                    continue  # undecodable: skipped, as BFCL skips failed decodes
            if step:
                turns[-1].append(step)
    return turns


def check(messages: list[dict], bfcl: dict, initial_config: dict, limits: Any = None) -> dict:
    """{"valid", "error_type", "error_message", ...} from bfcl-eval's checker (in the sandbox)."""
    gt = bfcl["ground_truth"]
    decoded = decode_turns(messages)
    if len(decoded) != len(gt):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"the trajectory has {len(decoded)} user turn(s), the ground truth {len(gt)}"}
    entry = {"id": bfcl["id"], "initial_config": initial_config, "involved_classes": bfcl["involved_classes"]}
    res = run_function(CHECK_SOURCE, "check", args=[decoded, gt, entry, bfcl["category"]], limits=limits)
    if not res.ok:
        return {"valid": False, "error_type": "checker_error",
                "error_message": (res.error or "the checker failed in the sandbox").splitlines()[0][:1000]}
    return res.value
