"""Automatic perturbations of a reference call sequence, for the self-test of generated verifiers
(make-verifier): a verifier must PASS the reference and FAIL every applicable perturbation.

Deterministic: the same reference gives the same perturbations (no randomness).

A call is {"name", "arguments", "side"?, "state_changed"?}; `state_changed` (from executing the
reference) marks the state-modifying calls. Key calls (EigenData App. 3.1 VerificationFunction
Part 2) are the state-modifying calls whose name is in must_have_functions (all state-modifying
calls when must_have_functions is empty); for a reference that changes no state, its successful
(must-have) lookups.

Perturbations, in this order:
  wrong_id          the first id-like argument (`id` or `*_id`) of the first key call that has one
                    is changed: int → +1, str → its last digit/letter advanced by one
  wrong_amount      the first numeric, non-id argument of the first key call that has one → +1
  missing_key_call  the last key call is dropped
  policy_violation  a refused call is injected after the last key call: a copy of the first key call
                    (else of the first call) whose result is a POLICY_VIOLATION error; it is NOT
                    executed (the environment refused it)
  unchanged_state   the reference calls, but the final state equals the initial state (a
                    trajectory that claims the actions without their effect)
  no_calls          no tool call at all (a submission that does nothing)
A perturbation that cannot be built (no key call, no id / numeric argument, no state change) is
returned with applicable=False and the reason.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

NAMES = ("wrong_id", "wrong_amount", "missing_key_call", "policy_violation", "unchanged_state", "no_calls")
POLICY_ERROR = {"error": {"code": "POLICY_VIOLATION", "message": "refused by the policy (injected perturbation)",
                          "violated_rule": "perturbation", "hint": None}}


@dataclass
class Perturbation:
    name: str
    calls: list[dict] = field(default_factory=list)
    applicable: bool = True
    why: str = ""
    unchanged_state: bool = False


def is_id_key(k: str) -> bool:
    return k == "id" or k.endswith("_id")


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def bump_id(v):
    """int → v+1; str → last digit (9→0) or letter (z→a, Z→A) advanced, else 'X' appended."""
    if _num(v):
        return v + 1
    s = str(v)
    for i in range(len(s) - 1, -1, -1):
        c = s[i]
        if c.isdigit():
            return s[:i] + str((int(c) + 1) % 10) + s[i + 1:]
        if "a" <= c <= "z":
            return s[:i] + chr((ord(c) - 97 + 1) % 26 + 97) + s[i + 1:]
        if "A" <= c <= "Z":
            return s[:i] + chr((ord(c) - 65 + 1) % 26 + 65) + s[i + 1:]
    return s + "X"


def key_indices(calls: list[dict], must_have: list[str] | None = None) -> list[int]:
    """The key calls: state-modifying calls (named in must_have_functions when some are). A
    reference that changes no state (a lookup task) has its successful must-have calls as key calls
    (all successful calls when must_have_functions names none of them): what such a task's outcome
    is observable by."""
    writes = [i for i, c in enumerate(calls) if c.get("state_changed")]
    if must_have:
        named = [i for i in writes if calls[i]["name"] in set(must_have)]
        if named:
            return named
    if writes:
        return writes
    ok = [i for i, c in enumerate(calls) if c.get("ok", True) and not c.get("injected_result")]
    named = [i for i in ok if calls[i]["name"] in set(must_have or ())]
    return named or ok


def _args(c: dict) -> dict:
    a = c.get("arguments")
    return a if isinstance(a, dict) else {}


def perturbations(calls: list[dict], must_have: list[str] | None = None,
                  policy_codes: bool = True) -> list[Perturbation]:
    """`policy_codes`: whether the environment ever refuses a call with POLICY_VIOLATION; where it
    does not (τ²), an injected refusal is no observable behaviour and policy_violation is skipped."""
    calls = [dict(c, arguments=copy.deepcopy(_args(c))) for c in calls]
    keys = key_indices(calls, must_have)
    out: list[Perturbation] = []

    def first_arg(pred) -> tuple[int, str] | None:
        for i in keys:
            for k in sorted(_args(calls[i])):
                if pred(k, calls[i]["arguments"][k]):
                    return i, k
        return None

    hit = first_arg(lambda k, v: is_id_key(k) and isinstance(v, (str, int)) and not isinstance(v, bool))
    if hit:
        i, k = hit
        cs = copy.deepcopy(calls)
        cs[i]["arguments"][k] = bump_id(cs[i]["arguments"][k])
        out.append(Perturbation("wrong_id", cs, why=f"call {i} ({cs[i]['name']}).{k}: "
                                f"{json.dumps(calls[i]['arguments'][k])} → {json.dumps(cs[i]['arguments'][k])}"))
    else:
        out.append(Perturbation("wrong_id", applicable=False, why="no key call with an id argument"))
    hit = first_arg(lambda k, v: not is_id_key(k) and _num(v))
    if hit:
        i, k = hit
        cs = copy.deepcopy(calls)
        cs[i]["arguments"][k] = cs[i]["arguments"][k] + 1
        out.append(Perturbation("wrong_amount", cs, why=f"call {i} ({cs[i]['name']}).{k}: "
                                f"{calls[i]['arguments'][k]} → {cs[i]['arguments'][k]}"))
    else:
        out.append(Perturbation("wrong_amount", applicable=False, why="no key call with a numeric argument"))
    if keys:
        j = keys[-1]
        out.append(Perturbation("missing_key_call", [c for n, c in enumerate(copy.deepcopy(calls)) if n != j],
                                why=f"dropped call {j} ({calls[j]['name']})"))
    else:
        out.append(Perturbation("missing_key_call", applicable=False, why="no state-modifying call"))
    if not policy_codes:
        out.append(Perturbation("policy_violation", applicable=False,
                                why="the environment never refuses calls with POLICY_VIOLATION"))
    elif calls:
        src = calls[keys[0]] if keys else calls[0]
        inj = {"name": src["name"], "arguments": copy.deepcopy(_args(src)), "side": src.get("side", "agent"),
               "injected_result": POLICY_ERROR}
        pos = (keys[-1] + 1) if keys else len(calls)
        cs = copy.deepcopy(calls)
        cs.insert(pos, inj)
        out.append(Perturbation("policy_violation", cs, why=f"refused copy of {src['name']} injected at {pos}"))
    else:
        out.append(Perturbation("policy_violation", applicable=False, why="no call to copy"))
    if any(c.get("state_changed") for c in calls):
        out.append(Perturbation("unchanged_state", copy.deepcopy(calls), unchanged_state=True,
                                why="reference calls with the initial state as final state"))
    else:
        out.append(Perturbation("unchanged_state", applicable=False, why="the reference changes no state"))
    if calls:
        out.append(Perturbation("no_calls", [], why="a submission that makes no tool call"))
    else:
        out.append(Perturbation("no_calls", applicable=False, why="the reference makes no call"))
    return out
