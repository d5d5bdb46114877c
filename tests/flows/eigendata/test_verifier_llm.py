"""make-verifier acceptance on the LLM path: the VerificationFunctionAgent (scripted server) writes
`evaluate_submission` for every bundled airline / clinic task, the verifier passes its sandbox
self-test, and `verify --strategy code` with it agrees with `verify --strategy state_diff` on the
replayed reference trajectory and on perturbed ones (wrong id, wrong amount, missing key call).

The reply is a hand-written module in the agent's output format (one ```python block): a generic
body written here by hand (NOT the toolkit's template), with the task's expectations embedded as
constants taken from the prompt, as the prompt asks ("embed them in your code as constants")."""

import json
import re

import pytest

from tests.flows.eigendata.util import run_strategy
from tests.flows.eigendata.test_verifier import agreement_with_state_diff
from toolkit.domains import load_tasks

BODY = r'''
SKIP_ENDINGS = ("_at", "_time", "timestamp", "uuid", "token")
TEXT_FIELDS = ("description", "message", "note", "notes", "content", "comment", "reason", "text")


def _kind(key, value):
    low = key.lower()
    if key in SKIP_KEYS or low.endswith(SKIP_ENDINGS):
        return "skip"
    if isinstance(value, str) and any(low == t or low.endswith("_" + t) for t in TEXT_FIELDS) \
            and not low.endswith("_id") and low not in ("status", "amount"):
        return "text"
    return "exact"


def fuzzy_text_match(a, b):
    wa, wb = set(str(a).lower().split()), set(str(b).lower().split())
    return (not wa and not wb) or len(wa & wb) / max(1, len(wa | wb)) >= 0.5


def _same_row(a, b):
    ka = {k for k, v in a.items() if _kind(k, v) != "skip"}
    kb = {k for k, v in b.items() if _kind(k, v) != "skip"}
    if ka != kb:
        return False
    for k in ka:
        if _kind(k, a[k]) == "text":
            if not fuzzy_text_match(a[k], b[k]):
                return False
        elif a[k] != b[k]:
            return False
    return True


def _diff(before, after):
    """rows of `after` with no equal row in `before` (multiset, skip fields ignored)."""
    left = list(before)
    out = []
    for row in after:
        hit = next((i for i, r in enumerate(left) if _same_row(r, row)), None)
        if hit is None:
            out.append(row)
        else:
            left.pop(hit)
    return out


def _match_lists(want, got):
    if len(want) != len(got):
        return False
    left = list(got)
    for w in want:
        hit = next((i for i, g in enumerate(left) if _same_row(w, g)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def extract_function_calls(eval):
    return [c for c in (eval.get("tool_calls") or []) if c.get("ok")]


def check_critical_params(call, expected):
    args = call.get("arguments") or {}
    return all(args.get(k) == v for k, v in expected["critical"].items()) and \
        all(fuzzy_text_match(args.get(k, ""), v) for k, v in expected.get("semantic", {}).items())


def evaluate_submission(reference, eval):
    checks_state, checks_functions, checks_policy = [], [], []
    try:
        init, fin = eval.get("initial_state") or {}, eval.get("final_state") or {}
        for table in sorted(set(init) | set(fin) | set(DELTA)):
            a, b = init.get(table) or [], fin.get(table) or []
            if not isinstance(a, list) or not isinstance(b, list):
                continue
            want = DELTA.get(table, {"added": [], "removed": []})
            ok = _match_lists(want["added"], _diff(a, b)) and _match_lists(want["removed"], _diff(b, a))
            checks_state.append({"table": table, "ok": ok})
        calls = extract_function_calls(eval)
        for kc in KEY_CALLS:
            ok = any(c.get("name") == kc["name"] and check_critical_params(c, kc) for c in calls)
            checks_functions.append({"call": kc["name"], "ok": ok})
        refused = sum(1 for c in eval.get("tool_calls") or [] if "POLICY_VIOLATION" in str(c.get("result") or ""))
        checks_policy.append({"refused": refused, "allowed": REFERENCE_VIOLATIONS, "ok": refused <= REFERENCE_VIOLATIONS})
    except Exception as e:  # never raise
        return {"overall_pass": False, "reward": 0.0, "component_scores": {}, "error": repr(e)}
    parts = {"state": all(c["ok"] for c in checks_state), "functions": all(c["ok"] for c in checks_functions),
             "policy": all(c["ok"] for c in checks_policy)}
    ok = all(parts.values())
    return {"overall_pass": ok, "reward": 1.0 if ok else 0.0,
            "component_scores": {k: float(v) for k, v in parts.items()},
            "checks_state": checks_state, "checks_functions": checks_functions, "checks_policy": checks_policy}
'''


def _between(text, start, end):
    m = re.search(re.escape(start) + r"\s*(.*?)\s*" + re.escape(end), text, re.S)
    assert m, f"prompt has no {start!r} section"
    return m.group(1)


def agent_reply(request: dict) -> str:
    """What the VerificationFunctionAgent answers: the body above with the prompt's expectations
    as constants."""
    prompt = request["messages"][-1]["content"]
    delta = json.loads(_between(prompt, "Reference state delta (JSON):", "Key calls (JSON"))
    key_calls = json.loads(_between(prompt, "critical + semantic parameters):", "\n").strip())
    skip = _between(prompt, "token and these keys:", ". Unexpected")
    skip_keys = [] if skip.startswith("(none)") else [s.strip() for s in skip.split(",")]
    violations = int(_between(prompt, "than the reference (", ")"))
    head = (f"import json\n\nDELTA = json.loads({json.dumps(json.dumps(delta))})\n"
            f"KEY_CALLS = json.loads({json.dumps(json.dumps(key_calls))})\n"
            f"SKIP_KEYS = {tuple(skip_keys)!r}\nREFERENCE_VIOLATIONS = {violations}\n")
    return "```python\n" + head + BODY + "```"


@pytest.mark.parametrize("domain", ["airline", "clinic"])
def test_llm_verifiers_agree_with_state_diff(domain):
    from toolkit.llm.testserver import ScriptedServer

    checked, kinds = 0, set()
    with ScriptedServer(agent_reply) as srv:
        for raw in load_tasks(domain):
            out = run_strategy("make-verifier", {"base_url": srv.base_url, "verifier_fallback": "none"},
                               raw, "eigendata")
            st = out.verifier.self_test
            assert out.verdicts[-1].passed, (raw["id"], out.verdicts[-1].reasons)
            assert st["generator"] == "llm" and st["passed"] and "DELTA = json.loads" in out.verifier.source
            assert st["n_ok"] == st["n_cases"] >= 2  # reference + the applicable perturbations, in the sandbox
            ids = agreement_with_state_diff(out, raw["id"])
            kinds.update(ids)
            checked += len(ids)
        assert srv.chat_count == len(load_tasks(domain))  # one source per task, no template fallback
    assert checked >= 12 and {"reference", "wrong_id", "missing_key_call"} <= kinds
