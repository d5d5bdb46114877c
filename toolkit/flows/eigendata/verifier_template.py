"""The reference specification of a task's verifier and a deterministic verifier written from it.

`spec_from_reference(initial, final, calls, must_have, skip_keys)` derives what a correct
submission must show (EigenData App. 3.1 VerificationFunctionAgent): the state delta of the
reference (rows added / removed per table, with field classes EXACT / SEMANTIC / SKIP), the key
function calls with their critical and semantic parameters, and how many policy-refused calls
the reference itself had. `render(spec)` returns a self-contained `evaluate_submission(reference,
eval)` module (stdlib only) that checks exactly that; make-verifier uses it as the fallback when
the LLM's verifiers fail their self-test, and it is the model the LLM prompt describes.
"""

from __future__ import annotations

import json
from collections import Counter
from toolkit.flows.eigendata.perturb import key_indices

SEMANTIC_KEYS = ("description", "message", "note", "notes", "content", "comment", "reason", "text")
SKIP_SUFFIXES = ("_at", "_time", "timestamp", "uuid", "token")


def field_class(key: str, value=None, skip_keys: tuple = ()) -> str:
    k = key.lower()
    if key in skip_keys or any(k.endswith(s) for s in SKIP_SUFFIXES) or k in ("timestamp", "uuid", "token"):
        return "skip"
    if k.endswith("_id") or k == "id" or k.endswith("_count") or k in ("status", "amount"):
        return "exact"
    if any(k == s or k.endswith("_" + s) for s in SEMANTIC_KEYS) and isinstance(value, str):
        return "semantic"
    return "exact"


def _rowkey(row) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def project(row, skip_keys: tuple) -> dict:
    if not isinstance(row, dict):
        return row
    return {k: v for k, v in row.items() if field_class(k, v, skip_keys) != "skip"}


def delta(initial: dict, final: dict, skip_keys: tuple = ()) -> dict:
    """{table: {"added": [rows], "removed": [rows]}} (multiset difference, skip fields dropped)."""
    out = {}
    for t in sorted(set(initial or {}) | set(final or {})):
        a, b = (initial or {}).get(t), (final or {}).get(t)
        if not isinstance(a or [], list) or not isinstance(b or [], list):
            continue
        ca = Counter(_rowkey(project(r, skip_keys)) for r in a or [])
        cb = Counter(_rowkey(project(r, skip_keys)) for r in b or [])
        added = [json.loads(k) for k, n in sorted((cb - ca).items()) for _ in range(n)]
        removed = [json.loads(k) for k, n in sorted((ca - cb).items()) for _ in range(n)]
        if added or removed:
            out[t] = {"added": added, "removed": removed}
    return out


def spec_from_reference(initial: dict | None, final: dict | None, calls: list[dict], must_have: list[str],
                        skip_keys: tuple = (), policy_codes: bool = True) -> dict:
    """`policy_codes`: whether the environment refuses policy-violating calls with a
    POLICY_VIOLATION error (sqlite domains with triggers, python envs). Where it never does (τ²,
    simulated) Part 3 cannot observe anything and is reported "not applicable", never a pass."""
    keys = key_indices(calls, must_have)
    key_calls = []
    for i in keys:
        c = calls[i]
        crit, sem = {}, {}
        for k, v in sorted((c.get("arguments") or {}).items()):
            cls = field_class(k, v, skip_keys)
            if cls == "semantic":
                sem[k] = v
            elif cls == "exact":
                crit[k] = v
        key_calls.append({"name": c["name"], "critical": crit, "semantic": sem})
    return {
        "version": 1,
        "state_checked": initial is not None and final is not None,
        "delta": delta(initial or {}, final or {}, skip_keys) if initial is not None and final is not None else {},
        "skip_keys": sorted(set(skip_keys)),
        "key_calls": key_calls,
        "reference_violations": sum(1 for c in calls if c.get("error_code") == "POLICY_VIOLATION"),
        "policy_check": "refused_calls" if policy_codes else "not_applicable",
        "fuzzy_threshold": 0.5,
    }


TEMPLATE = r'''"""evaluate_submission(reference, eval) for one task (toolkit make-verifier, EigenData contract).

Part 1 state comparison: the submission's state delta (final vs initial, SKIP fields dropped) must
equal the reference delta; EXACT fields compared exactly, SEMANTIC fields by word overlap.
Part 2 key function verification: every key call of the reference appears among the successful
calls with its critical parameters equal (semantic ones fuzzy).
Part 3 policy compliance: no more policy-refused calls than the reference had; "not applicable"
(reported in checks_policy, no policy component) where the environment never emits policy codes.
Reward: 1.0 iff every applicable part passes (binary, EigenData §5)."""
import json
from collections import Counter

SPEC = json.loads(__SPEC__)
SEMANTIC_KEYS = ("description", "message", "note", "notes", "content", "comment", "reason", "text")
SKIP_SUFFIXES = ("_at", "_time", "timestamp", "uuid", "token")


def field_class(key, value=None):
    k = key.lower()
    if key in SPEC["skip_keys"] or any(k.endswith(s) for s in SKIP_SUFFIXES) or k in ("timestamp", "uuid", "token"):
        return "skip"
    if k.endswith("_id") or k == "id" or k.endswith("_count") or k in ("status", "amount"):
        return "exact"
    if any(k == s or k.endswith("_" + s) for s in SEMANTIC_KEYS) and isinstance(value, str):
        return "semantic"
    return "exact"


def fuzzy_text_match(a, b, threshold=None):
    threshold = SPEC["fuzzy_threshold"] if threshold is None else threshold
    wa, wb = set(str(a).lower().split()), set(str(b).lower().split())
    if not wa and not wb:
        return True
    return len(wa & wb) / max(1, len(wa | wb)) >= threshold


def _key(row):
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _project(row):
    if not isinstance(row, dict):
        return row
    return {k: v for k, v in row.items() if field_class(k, v) != "skip"}


def state_delta(initial, final):
    out = {}
    for t in sorted(set(initial or {}) | set(final or {})):
        a, b = (initial or {}).get(t), (final or {}).get(t)
        if not isinstance(a or [], list) or not isinstance(b or [], list):
            continue
        ca = Counter(_key(_project(r)) for r in a or [])
        cb = Counter(_key(_project(r)) for r in b or [])
        added = [json.loads(k) for k, n in sorted((cb - ca).items()) for _ in range(n)]
        removed = [json.loads(k) for k, n in sorted((ca - cb).items()) for _ in range(n)]
        if added or removed:
            out[t] = {"added": added, "removed": removed}
    return out


def deep_compare(expected, got):
    """True when the two rows agree on every non-SKIP field (EXACT exactly, SEMANTIC fuzzily)."""
    if not isinstance(expected, dict) or not isinstance(got, dict):
        return expected == got
    if set(expected) != set(got):
        return False
    for k, v in expected.items():
        cls = field_class(k, v)
        if cls == "skip":
            continue
        if cls == "semantic":
            if not fuzzy_text_match(v, got[k]):
                return False
        elif v != got[k]:
            return False
    return True


def _match_rows(expected, got):
    left = list(got)
    matched = 0
    for e in expected:
        for i, g in enumerate(left):
            if deep_compare(e, g):
                matched += 1
                del left[i]
                break
    return matched, len(left)


def extract_function_calls(ev):
    return [c for c in (ev.get("tool_calls") or []) if isinstance(c, dict)]


def check_critical_params(key_call, call):
    if call.get("name") != key_call["name"] or not call.get("ok"):
        return False
    args = call.get("arguments") or {}
    for k, v in key_call["critical"].items():
        if args.get(k) != v:
            return False
    for k, v in key_call["semantic"].items():
        if not fuzzy_text_match(v, args.get(k, "")):
            return False
    return True


def evaluate_submission(reference, eval):
    checks_state, checks_functions, checks_policy = [], [], []
    try:
        # Part 1: state
        if SPEC["state_checked"]:
            if eval.get("final_state") is None or eval.get("initial_state") is None:
                checks_state.append("environment states missing from the submission")
                state_score = 0.0
            else:
                got = state_delta(eval["initial_state"], eval["final_state"])
                want = SPEC["delta"]
                total, ok = 0, 0
                for t in sorted(set(want) | set(got)):
                    for side in ("added", "removed"):
                        w = want.get(t, {}).get(side, [])
                        g = got.get(t, {}).get(side, [])
                        m, extra = _match_rows(w, g)
                        total += len(w) + extra
                        ok += m
                        if m < len(w):
                            checks_state.append(f"{t}: {len(w) - m} expected {side} row(s) missing")
                        if extra:
                            checks_state.append(f"{t}: {extra} unexpected {side} row(s)")
                state_score = 1.0 if total == 0 else ok / total
        else:
            state_score = 1.0
        # Part 2: key function calls
        calls = extract_function_calls(eval)
        kc = SPEC["key_calls"]
        hit = 0
        for k in kc:
            if any(check_critical_params(k, c) for c in calls):
                hit += 1
            else:
                checks_functions.append(f"key call {k['name']} {json.dumps(k['critical'], sort_keys=True)} not found")
        fn_score = 1.0 if not kc else hit / len(kc)
        # Part 3: policy
        comps = {"state": state_score, "key_functions": fn_score}
        if SPEC.get("policy_check", "refused_calls") == "not_applicable":
            policy_ok = True
            checks_policy.append("not applicable: this environment never refuses calls with POLICY_VIOLATION; "
                                 "policy effects are checked through the state (Part 1)")
        else:
            refused = 0
            for c in calls:
                r = c.get("result")
                if isinstance(r, str) and '"POLICY_VIOLATION"' in r:
                    refused += 1
            policy_ok = refused <= SPEC["reference_violations"]
            if not policy_ok:
                checks_policy.append(f"{refused} policy-refused call(s) (reference: {SPEC['reference_violations']})")
            comps["policy"] = 1.0 if policy_ok else 0.0
        passed = state_score == 1.0 and fn_score == 1.0 and policy_ok
        return {"overall_pass": passed, "reward": 1.0 if passed else 0.0, "component_scores": comps,
                "checks_state": checks_state, "checks_functions": checks_functions, "checks_policy": checks_policy}
    except Exception as e:  # a malformed submission fails, never crashes the verifier
        return {"overall_pass": False, "reward": 0.0, "component_scores": {},
                "checks_error": [f"{type(e).__name__}: {e}"]}
'''


def render(spec: dict) -> str:
    return TEMPLATE.replace("__SPEC__", repr(json.dumps(spec, ensure_ascii=False, sort_keys=True)))
