"""LOGIGEN trigger analysis: rules, conditions, thresholds, tools and side effects as data.

Expected values below were read off the trigger SQL by hand (toolkit/domains/*/schema.sql and
tests/data/library/schema.sql), not copied from the analysis output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.envs import load_env
from toolkit.envs.sqlite import SqliteEnvironment
from toolkit.flows.logigen.analysis import analyze, evaluate, parse_condition

LIBRARY = Path(__file__).resolve().parents[2] / "data" / "library"


def _env(name: str):
    if name == "library":
        return load_env({"backend": "sqlite", "path": str(LIBRARY)})
    return load_env({"backend": "sqlite", "id": name})


@pytest.mark.parametrize("name", ["airline", "clinic", "library"])
def test_every_rule_of_the_env_is_analyzed(name):
    env = _env(name)
    a = analyze(env)
    assert set(a.rules) == set(env.rules)
    for rule, checks in a.rules.items():
        for rc in checks:
            assert rc.timing == "BEFORE" and rc.event in ("INSERT", "UPDATE")
            assert rc.tools[0] == f"{rc.event.lower()}_{rc.table}"
            assert rc.message and rc.trigger
    json.dumps(a.to_dict())  # JSON-ready
    assert analyze(env).to_dict() == a.to_dict()  # deterministic


def test_airline_conditions_by_hand():
    a = analyze(_env("airline"))
    (pl,) = a.rules["passenger_limit"]
    assert pl.table == "reservation" and pl.event == "INSERT" and pl.tools == ["insert_reservation"]
    assert pl.where.op == "OR" and [c.kind for c in pl.conditions] == ["compare", "compare"]
    th = {(t.ref, t.op): t for t in pl.thresholds}
    assert th[("NEW.passenger_count", "<")].violating == 0 and th[("NEW.passenger_count", "<")].boundary == 1
    assert th[("NEW.passenger_count", ">")].violating == 6 and th[("NEW.passenger_count", ">")].boundary == 5

    ins, flight_change, cabin_change = a.rules["seat_availability"]
    c = ins.conditions[0]
    assert c.kind == "compare" and c.op == "<"
    assert c.lhs.kind == "subquery" and c.lhs.table == "flight_cabin" and c.lhs.column == "seats_available"
    assert c.lhs.default == 0  # COALESCE(..., 0)
    assert c.lhs.keys["flight_id"].ref == "NEW.flight_id" and c.lhs.keys["cabin"].ref == "NEW.cabin"
    assert c.rhs.ref == "NEW.passenger_count"
    assert flight_change.columns == ["flight_id"] and flight_change.guard_sql == "NEW.flight_id IS NOT OLD.flight_id"
    assert cabin_change.guard.op == "AND" and len(cabin_change.conditions) == 3

    (final,) = a.rules["cancelled_is_final"]
    assert final.where is None and final.guard_sql == "OLD.status = 'cancelled'"
    g = final.conditions[0]
    assert g.lhs.ref == "OLD.status" and g.rhs.kind == "literal" and g.rhs.value == "cancelled"

    (nd,) = a.rules["no_cancel_after_departure"]
    inc = nd.conditions[-1]
    assert inc.kind == "in" and inc.op == "IN" and inc.lhs.kind == "subquery" and inc.lhs.table == "flight"
    assert [o.value for o in inc.rhs.value] == ["flying", "landed"]

    (route,) = a.rules["same_route"]
    ex = route.conditions[-1]
    assert ex.kind == "exists" and ex.op == "NOT EXISTS" and ex.rhs.table == "flight"
    assert ex.rhs.keys["a.flight_id"].ref == "OLD.flight_id" and ex.rhs.keys["b.flight_id"].ref == "NEW.flight_id"

    (email,) = a.rules["email_format"]
    assert email.conditions[0].kind == "like" and email.conditions[0].op == "NOT LIKE"
    assert email.tools == ["update_customer"]

    # the payment rules are reachable from insert_payment (direct) and from update_reservation
    # (cancelling inserts refund payments through an AFTER trigger)
    (owner,) = a.rules["payment_method_owner"]
    assert owner.tools[0] == "insert_payment" and "update_reservation" in owner.tools
    # UPDATE OF flight_id rules are not reachable from insert_reservation (its AFTER trigger only
    # sets created_on and nonfree_bags)
    assert all(rc.tools == ["update_reservation"] for rc in a.rules["same_route"])


def test_airline_side_effects():
    a = analyze(_env("airline"))
    after = {t.name: t for t in a.after}
    eff = after["reservation_after_insert"].effects
    assert ("updates", "flight_cabin", ["seats_available"]) in [(e.verb, e.table, e.columns) for e in eff]
    assert any(e.verb == "inserts into" and e.table == "audit_log" for e in eff)
    refund = after["reservation_after_cancel"]
    assert refund.guard_sql == "NEW.status = 'cancelled' AND OLD.status = 'active'"
    assert ("inserts into", "payment") in [(e.verb, e.table) for e in refund.effects]
    assert {e.table for e in a.effects_of("insert_payment")} == {"payment_method", "audit_log"}


def test_clinic_conditions_by_hand():
    a = analyze(_env("clinic"))
    (cap,) = a.rules["doctor_capacity"]
    c = cap.conditions[0]
    assert c.op == ">=" and c.lhs.aggregate == "COUNT" and c.lhs.table == "appointment"
    assert c.rhs.table == "doctor" and c.rhs.column == "daily_capacity"
    (fu,) = a.rules["follow_up_history"]
    assert fu.guard_sql == "NEW.kind = 'follow_up'" and fu.conditions[-1].op == "NOT EXISTS"
    (ctl,) = a.rules["controlled_no_refills"]
    assert [(t.ref, t.violating, t.boundary) for t in ctl.thresholds] == [("NEW.refills_left", 1, 0)]
    (wk,) = a.rules["weekday_only"]
    assert wk.conditions[0].kind == "in" and wk.conditions[0].lhs.kind == "func"  # strftime(...)
    assert wk.conditions[0].opaque_parts  # the function part is flagged


def test_library_third_domain():
    env = _env("library")
    a = analyze(env)
    assert set(a.rules) == {"member_in_good_standing", "unpaid_fines", "loan_limit", "copy_available",
                            "new_loan_active", "returned_is_final", "renewal_limit"}
    (copy,) = a.rules["copy_available"]
    assert [(t.ref, t.op, t.value, t.violating, t.boundary) for t in copy.thresholds] == \
        [("book.copies_on_shelf", "<", 1, 0, 1)]
    (ren,) = a.rules["renewal_limit"]
    assert ren.columns == ["renewals"] and ren.tools == ["update_loan"]
    assert [(t.ref, t.violating, t.boundary) for t in ren.thresholds if t.op == ">"] == [("NEW.renewals", 3, 2)]
    # evaluate: the firing condition against concrete rows and the seed state
    (lim,) = a.rules["loan_limit"]
    assert evaluate(env, lim.sql, new={"member_id": "M-1", "book_id": "B-3"}) is True   # 2 active, limit 2
    assert evaluate(env, lim.sql, new={"member_id": "M-2", "book_id": "B-3"}) is False  # 0 active, limit 3
    assert evaluate(env, copy.sql, new={"book_id": "B-2"}) is True
    assert evaluate(env, copy.sql, new={"book_id": "B-1"}) is False
    assert evaluate(env, ren.sql, new={"renewals": 3}, old={"renewals": 2}) is True
    assert evaluate(env, ren.sql, new={"renewals": 2}, old={"renewals": 1}) is False
    assert evaluate(env, ren.sql, new={"renewals": 3}) is None  # OLD missing: cannot tell
    # ...and the engine agrees: the seed state is one step from each of these violations
    r = env.call("insert_loan", {"member_id": "M-1", "book_id": "B-3"})
    assert r.error["violated_rule"] == "loan_limit"
    after = {t.name: t for t in a.after}
    assert [(e.verb, e.table, e.columns) for e in after["loan_after_return"].effects][0] == \
        ("updates", "book", ["copies_on_shelf"])


def test_opaque_and_edge_conditions_never_raise():
    b = parse_condition("CASE WHEN NEW.a > 1 THEN 1 ELSE 0 END")
    assert b.leaves()[0].kind == "opaque"
    b = parse_condition("NEW.a > (SELECT")  # truncated
    assert b.leaves()[0].kind == "opaque" and "not analyzed" in b.leaves()[0].text
    b = parse_condition("NOT (NEW.x BETWEEN 1 AND 5) AND NEW.y IS NULL AND NEW.z NOT IN (SELECT k FROM t)")
    kinds = [c.kind for c in b.leaves()]
    assert kinds == ["between", "null", "in"] and b.op == "AND" and b.items[0].op == "NOT"
    assert parse_condition(None) is None and parse_condition("  ") is None


def test_rule_in_case_expression_is_opaque_not_lost():
    env = SqliteEnvironment.from_spec({
        "name": "t", "policy": "- [r1] no", "schema": """
        CREATE TABLE a (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);
        CREATE TRIGGER a_rules BEFORE INSERT ON a BEGIN
          SELECT CASE WHEN NEW.v > 3 THEN RAISE(ABORT, 'POLICY_VIOLATION: r1: v at most 3') END;
        END;"""})
    a = analyze(env)
    (rc,) = a.rules["r1"]
    assert not rc.analyzable and rc.conditions[0].kind == "opaque"
