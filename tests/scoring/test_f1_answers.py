"""F1 reward hardening (issue 8): answers match on token / number boundaries, never as substrings,
and a sub-question that names a tool is only solved by that tool."""

from __future__ import annotations

import json

import pytest

from toolkit.schema import Record
from toolkit.stages.verify import build
from toolkit.scoring.rewards import answer_tokens, contains_answer


@pytest.mark.parametrize("text,answer", [
    ("order 42 shipped", 4),  # 4 is a digit of 42, not a number of the text
    ("balance 1000", 100),
    ("the flight is not available", "no"),
    ("flight HAT170-2024-05-20", 5),  # dates and ids hold no separate numbers
    ("total 10000", "$1,000"),
    ("nowhere", "no"),
    ("Paris-Orly airport", "orly airport paris"),
    ('{"x": 1}', True),
    (None, "x"),
    ("x", None),
])
def test_gaming_cases_do_not_match(text, answer):
    assert contains_answer(text, answer) is False


@pytest.mark.parametrize("text,answer", [
    ("Total: $1,000.00", 1000),
    ("Total: $1,000.00", "1000"),
    ("refund of 248.0 USD", 248),
    ("The capital is Paris.", "Paris"),
    ("THE CAPITAL IS PARIS", "paris"),
    ('{"temp": 21, "city": "Paris"}', "paris"),
    ("It costs 42 dollars", 42.0),
    ("temperature -5 today", -5),
    ("No, the flight is not available", "no"),
    ("departs 2024-05-20 at 10:30", "2024-05-20"),
    ("paid with the Visa ending 4421.", "visa ending 4421"),
    ('{"ok": true}', True),
    ("rate 3.5%", 3.5),
    ("ｐａｒｉｓ", "paris"),  # NFKC: full-width letters
    ("Paris and Rome", ["rome", "paris"]),  # every leaf
])
def test_real_answers_match(text, answer):
    assert contains_answer(text, answer) is True


def test_list_answer_needs_every_leaf():
    assert not contains_answer("Paris only", ["rome", "paris"])
    assert answer_tokens("Total: $1,000.00!") == ["total", "1,000.00"]


def _rec(gt: dict, calls: list[tuple[str, str]], final: str) -> Record:
    msgs = [{"role": "user", "content": "q"}]
    for i, (name, result) in enumerate(calls):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
    msgs.append({"role": "assistant", "content": final})
    return Record.model_validate({"id": "r", "task": {"ground_truth": gt},
                                  "trajectories": [{"id": "t0", "messages": msgs}]})


def _f1(rec: Record) -> dict:
    import asyncio

    out = asyncio.run(build({"strategy": ["f1"]}, None)(rec))
    return out.trajectories[0].scores["f1"]


def test_f1_substring_gaming_scores_zero():
    # each answer is a substring of what the agent said, never a token of it: n̂ = 0 → F1 = 0
    gt = {"sub_questions": [{"q": "order?", "a": 4, "tool": "orders"},
                            {"q": "balance?", "a": 100, "tool": "balance"},
                            {"q": "available?", "a": "no", "tool": "flight"}]}
    rec = _rec(gt, [("orders", json.dumps({"order": 42, "status": "shipped"})),
                    ("balance", json.dumps({"balance": 1000})),
                    ("flight", json.dumps({"status": "not available"}))],
               "order 42 shipped; balance 1000; the flight is not available")
    sc = _f1(rec)
    assert sc["solved"] == [False, False, False] and sc["f1"] == 0.0


def test_named_tool_is_required():
    # the answer is in the result of another tool and in the final message: not solved, because
    # the node names `weather` and weather was never called successfully
    gt = {"sub_questions": [{"q": "temp?", "a": 21, "tool": "weather"}]}
    sc = _f1(_rec(gt, [("search", '{"temp": 21}')], "It is 21 degrees."))
    assert sc["solved"] == [False] and sc["f1"] == 0.0
    # a failed call of the named tool does not count either
    sc = _f1(_rec(gt, [("weather", '{"error": {"code": "TIMEOUT"}}')], "It is 21 degrees."))
    assert sc["solved"] == [False]
    # the named tool, answer in its result: solved; one call → p = r = 1
    sc = _f1(_rec(gt, [("weather", '{"temp": 21.0}')], "ok"))
    assert sc["solved"] == [True] and sc["f1"] == pytest.approx(1.0)


def test_precision_capped_at_one():
    # one call answers two sub-questions: the paper's p = 2/1 = 2; here p = 1, F1 = 1
    gt = {"sub_questions": [{"q": "a?", "a": 21, "tool": "w"}, {"q": "b?", "a": "Paris", "tool": "w"}]}
    sc = _f1(_rec(gt, [("w", '{"temp": 21, "city": "Paris"}')], "done"))
    assert sc["precision"] == 1.0 and sc["f1"] == pytest.approx(1.0)
