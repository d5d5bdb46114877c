"""Scoring a task whose target state equals its start state (a refusal or a read-only request).

DIFF(final, target) = 0 holds for any episode that changes nothing, so on such a task the state
alone would give reward 1.0 to an agent that did nothing at all (or called an unknown tool and
echoed its output).  Following τ²-bench's reward basis (DB + ACTION + COMMUNICATE), a no-write
task passes only when, besides the unchanged state:

- no forbidden write was attempted: no agent call changed the state on the way (even if a later
  call undid it), none was refused as a POLICY_VIOLATION (the write the policy forbids), and none
  named a tool the environment marks as a write (when it says which tools write);
- ACTION: every reference action (the reads that ground the answer) matches an agent call;
- COMMUNICATE: the agent said something to the user: its last reply is text, not a tool-call
  attempt, and every `communicate_info` item appears in its replies (τ²'s rule: lower case,
  commas removed).

Pure functions; `toolkit.scorers` (state_diff) calls `no_write_check`, and GRPO's reward,
which is verify's, inherits it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from toolkit.scoring.rewards import action_matches, match_actions

__all__ = ["communicated", "is_tool_call_text", "no_write_check"]

POLICY_VIOLATION = "POLICY_VIOLATION"

# text that is a tool-call attempt (Hermes / tool_response / <function> markup, bare JSON call)
_CALL_MARKUP = re.compile(r"<\s*/?\s*(tool_call|tool_response|function)\b", re.IGNORECASE)
_BARE_JSON_CALL = re.compile(r'^\s*[\[{]\s*"(name|function|tool)"\s*:', re.DOTALL)


def is_tool_call_text(text: str) -> bool:
    """A reply whose text is (or contains) a tool-call attempt rather than words for the user."""
    return bool(_CALL_MARKUP.search(text) or _BARE_JSON_CALL.match(text))


def _norm(s: str) -> str:
    return s.lower().replace(",", "")


def communicated(replies: Sequence[str], communicate_info: Iterable[str]) -> tuple[bool, list[str], str | None]:
    """(ok, missing items, why-not) for the agent's text replies in order (τ² COMMUNICATE)."""
    texts = [t for t in replies if t and t.strip()]
    if not texts:
        return False, list(communicate_info), "the agent never replied to the user in text"
    if is_tool_call_text(texts[-1]):
        return False, list(communicate_info), "the agent's last reply is a tool-call attempt, not an answer to the user"
    joined = _norm("\n".join(texts))
    missing = [str(i) for i in communicate_info if _norm(str(i)) not in joined]
    if missing:
        return False, missing, f"information the user needed was never said: {', '.join(map(repr, missing))}"
    return True, [], None


def no_write_check(*, delta0: int, diffs: Sequence[int], codes: Sequence[str | None],
                   names: Sequence[str], sides: Sequence[str], expected_actions: Sequence[dict],
                   pred_calls: Sequence[tuple[str, dict]], replies: Sequence[str],
                   communicate_info: Iterable[str] = (), write_tools: set[str] | None = None,
                   call_args: Sequence[dict | None] | None = None) -> dict:
    """The no-write basis for one trajectory.

    diffs/codes/names/sides/call_args: per replayed call (in order), DIFF to the target after it,
    its error code, tool name, side and arguments (a call the reference makes too, e.g. an attempt
    it expects to be refused, is no forbidden write); pred_calls: the agent's (name, args) calls; replies: the agent's text
    replies in order; write_tools: names of tools that write, when the environment says.
    Returns {"applies", "passed", "write_attempts", "actions_ok", "missing_actions",
    "communicated", "missing_info", "reasons"}; `applies` is False (and passed True) when the task
    needs a state change (delta0 > 0): the DIFF decides there."""
    if delta0 != 0:
        return {"applies": False, "passed": True, "reasons": []}
    reasons: list[str] = []
    attempts: list[dict] = []
    args_of = list(call_args) if call_args is not None else [None] * len(names)
    for i, (d, code, name, side) in enumerate(zip(diffs, codes, names, sides)):
        if side == "user":
            continue
        a = args_of[i] if i < len(args_of) else None
        if d == 0 and a is not None and any(action_matches(x["name"], x.get("arguments") or {},
                                                           x.get("compare_args"), name, a)
                                            for x in expected_actions):
            continue  # the reference makes this call too (an attempt it expects to be refused)
        why = None
        if d != 0:
            why = "changed the state"
        elif code == POLICY_VIOLATION:
            why = "refused by the policy (a forbidden write)"
        elif write_tools is not None and name in write_tools:
            why = "is a write tool"
        if why:
            attempts.append({"index": i, "name": name, "why": why})
    if attempts:
        reasons.append("the task needs no state change but the agent attempted a write: "
                       + "; ".join(f"call {a['index']} {a['name']} {a['why']}" for a in attempts))
    res = match_actions(list(expected_actions), list(pred_calls)) if expected_actions else None
    missing_actions = ([a["name"] for a, ok in zip(expected_actions, res.matched) if not ok] if res else [])
    if missing_actions:
        reasons.append(f"reference action(s) not performed: {', '.join(missing_actions)} "
                       "(the reads the answer rests on)")
    ok_comm, missing_info, why_not = communicated(replies, communicate_info)
    if why_not:
        reasons.append(why_not)
    passed = not attempts and not missing_actions and ok_comm
    return {"applies": True, "passed": passed, "write_attempts": attempts, "actions_ok": not missing_actions,
            "missing_actions": missing_actions, "communicated": ok_comm, "missing_info": missing_info,
            "reasons": reasons}
