"""Bundled sqlite domains: tasks replay to their targets, every trigger is provoked, docs are consistent."""

from __future__ import annotations

import pytest

from toolkit.domains import domain_path, list_domains, load_tasks, replay
from toolkit.envs import load_env
from toolkit.schema import Record

DOMAINS = ("airline", "clinic")


def _env(name: str):
    return load_env({"backend": "sqlite", "id": name})


def _all_tasks():
    return [(d, r) for d in DOMAINS for r in load_tasks(d)]


# ---------------------------------------------------------------------------------------------
# inventory


def test_bundled_domains_listed():
    assert set(DOMAINS) <= set(list_domains())
    for d in DOMAINS:
        p = domain_path(d)
        for f in ("policy.md", "schema.sql", "tools.yaml", "domain.yaml", "tasks.jsonl", "TASKS.md"):
            assert (p / f).is_file(), f"{d}/{f}"
    with pytest.raises(KeyError):
        domain_path("../airline")
    with pytest.raises(KeyError):
        domain_path("no_such_domain")


@pytest.mark.parametrize("name", DOMAINS)
def test_domain_size_requirements(name):
    env = _env(name)
    try:
        assert env.policy().strip()
        assert len(env.triggers) >= 5
        assert len(env.tools()) >= 8
        tasks = load_tasks(name)
        assert 4 <= len(tasks) <= 6
        assert any("refusal" in t["tags"] for t in tasks), "one task must avoid a policy-refused action"
        # every rule raised by a trigger is documented in the policy (the hint comes from there)
        for rule, info in env.rules.items():
            assert info["hint"], f"rule {rule} is not named in policy.md"
        # tool descriptions expose the logic
        descs = {t["function"]["name"]: t["function"]["description"] for t in env.tools()}
        assert any("Preconditions (enforced" in d for d in descs.values())
        assert any("Side effects" in d for d in descs.values())
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# tasks: reference actions reach the target (DIFF = 0, R = 1)


@pytest.mark.parametrize("name,rec", _all_tasks(), ids=[r["id"] for _, r in _all_tasks()])
def test_task_replays_to_target(name, rec):
    Record.model_validate(rec)
    gt = rec["task"]["ground_truth"]
    assert rec["env"] == {"backend": "sqlite", "id": name, "state_ref": rec["env"]["state_ref"]}
    env, results = replay(rec)
    try:
        assert env.initial_state_hash() == rec["env"]["state_ref"], "seed changed: run rebuild_targets"
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        final = env.snapshot()
        d = env.diff(final, gt["target_state"])
        assert d["total"] == 0, d
        reward = 1 if d["total"] == 0 else 0
        assert reward == 1
        assert env.state_hash() == gt["target_state_ref"] == env.hash_state(gt["target_state"])
        # the task is not trivially satisfied by doing nothing, unless it is a pure refusal
        env.reset()
        d0 = env.diff(env.snapshot(), gt["target_state"])
        writes = [a for a in gt["actions"] if not a["name"].startswith("query_")]
        assert (d0["total"] > 0) == bool(writes)
    finally:
        env.close()


def test_tool_overrides_of_bundled_domains():
    env = _env("clinic")
    try:
        names = env.tool_names()
        assert "query_drug" in names and "query_doctor" in names  # un-hidden by tools.yaml
        assert "insert_drug" not in names and "update_doctor" not in names and "insert_referral" not in names
        props = next(t for t in env.tools() if t["function"]["name"] == "insert_appointment")["function"]["parameters"]["properties"]
        assert "copay" not in props and "referral_id" not in props  # readonly
        assert props["slot"]["enum"][0] == "09:00"
    finally:
        env.close()


def test_task_ids_unique_and_refusals_are_not_in_actions():
    ids = [r["id"] for _, r in _all_tasks()]
    assert len(ids) == len(set(ids))
    # airline-task-002 (pure refusal): no write at all
    rec = next(r for r in load_tasks("airline") if r["id"] == "airline-task-002")
    assert all(a["name"].startswith("query_") for a in rec["task"]["ground_truth"]["actions"])


# ---------------------------------------------------------------------------------------------
# every POLICY_VIOLATION rule of every trigger is provoked: structured error + unchanged state

# (trigger, rule) -> (setup actions, offending call)
AIRLINE_PROVOKE = {
    ("reservation_insert_rules", "passenger_limit"): (
        [], ("insert_reservation", {"user_id": "mia_li_3668", "flight_id": "HAT172-2024-05-20", "cabin": "economy", "passenger_count": 6})),
    ("reservation_insert_rules", "new_reservation_active"): (
        [], ("insert_reservation", {"user_id": "mia_li_3668", "flight_id": "HAT172-2024-05-20", "cabin": "economy", "passenger_count": 1, "status": "cancelled"})),
    ("reservation_insert_rules", "flight_bookable"): (
        [], ("insert_reservation", {"user_id": "mia_li_3668", "flight_id": "HAT601-2024-05-19", "cabin": "economy", "passenger_count": 1})),
    ("reservation_insert_rules", "seat_availability"): (
        [], ("insert_reservation", {"user_id": "mia_li_3668", "flight_id": "HAT170-2024-05-20", "cabin": "basic_economy", "passenger_count": 1})),
    ("reservation_insert_rules", "bag_limit"): (
        [], ("insert_reservation", {"user_id": "mia_li_3668", "flight_id": "HAT172-2024-05-20", "cabin": "economy", "passenger_count": 1, "total_bags": 6})),
    ("reservation_cancelled_final", "cancelled_is_final"): (
        [], ("update_reservation", {"reservation_id": 1008, "total_bags": 1})),
    ("reservation_fixed_fields", "passenger_count_fixed"): (
        [], ("update_reservation", {"reservation_id": 1001, "passenger_count": 2})),
    ("reservation_fixed_fields", "owner_fixed"): (
        [], ("update_reservation", {"reservation_id": 1001, "user_id": "omar_davis_3817"})),
    ("reservation_fixed_fields", "insurance_at_booking_only"): (
        [], ("update_reservation", {"reservation_id": 1001, "insurance": "yes"})),
    ("reservation_cancel_rules", "no_cancel_after_departure"): (
        [], ("update_reservation", {"reservation_id": 1006, "status": "cancelled"})),
    ("reservation_cancel_rules", "cancellation_eligibility"): (
        [], ("update_reservation", {"reservation_id": 1002, "status": "cancelled"})),
    ("reservation_flight_change_rules", "basic_economy_no_flight_change"): (
        [], ("update_reservation", {"reservation_id": 1002, "flight_id": "HAT305-2024-05-16"})),
    ("reservation_flight_change_rules", "same_route"): (
        [], ("update_reservation", {"reservation_id": 1001, "flight_id": "HAT201-2024-05-18"})),
    ("reservation_flight_change_rules", "flight_bookable"): (
        [("insert_reservation", {"user_id": "raj_patel_1043", "flight_id": "HAT305-2024-05-22", "cabin": "economy", "passenger_count": 1})],
        ("update_reservation", {"reservation_id": 1009, "flight_id": "HAT305-2024-05-16"})),
    ("reservation_flight_change_rules", "seat_availability"): (
        [("insert_reservation", {"user_id": "omar_davis_3817", "flight_id": "HAT172-2024-05-20", "cabin": "economy", "passenger_count": 5})],
        ("update_reservation", {"reservation_id": 1009, "flight_id": "HAT170-2024-05-20"})),
    ("reservation_cabin_change_rules", "seat_availability"): (
        [], ("update_reservation", {"reservation_id": 1001, "cabin": "basic_economy"})),
    ("reservation_bag_rules", "bags_only_increase"): (
        [], ("update_reservation", {"reservation_id": 1001, "total_bags": 1})),
    ("reservation_bag_rules", "bag_limit"): (
        [], ("update_reservation", {"reservation_id": 1001, "total_bags": 6})),
    ("payment_charge_rules", "reservation_active"): (
        [], ("insert_payment", {"reservation_id": 1008, "payment_id": "credit_card_5120", "purpose": "booking", "amount": 10})),
    ("payment_charge_rules", "payment_method_owner"): (
        [], ("insert_payment", {"reservation_id": 1001, "payment_id": "credit_card_9001", "purpose": "baggage", "amount": 50})),
    ("payment_charge_rules", "payment_method_active"): (
        [], ("insert_payment", {"reservation_id": 1004, "payment_id": "credit_card_0007", "purpose": "baggage", "amount": 50})),
    ("payment_charge_rules", "insufficient_balance"): (
        [], ("insert_payment", {"reservation_id": 1002, "payment_id": "gift_card_1180", "purpose": "baggage", "amount": 50})),
    ("payment_charge_rules", "one_certificate_per_reservation"): (
        [], ("insert_payment", {"reservation_id": 1003, "payment_id": "certificate_8846", "purpose": "baggage", "amount": 10})),
    ("customer_update_rules", "email_format"): (
        [], ("update_customer", {"user_id": "mia_li_3668", "email": "not-an-email"})),
    ("customer_update_rules", "membership_fixed"): (
        [], ("update_customer", {"user_id": "mia_li_3668", "membership": "silver"})),
}

_APPT = {"patient_id": "P-1001", "doctor_id": "D-01", "date": "2024-06-13", "slot": "09:00", "kind": "consultation"}
CLINIC_PROVOKE = {
    ("appointment_insert_rules", "patient_active"): ([], ("insert_appointment", {**_APPT, "patient_id": "P-1005"})),
    ("appointment_insert_rules", "new_appointment_scheduled"): ([], ("insert_appointment", {**_APPT, "status": "completed"})),
    ("appointment_insert_rules", "future_date_only"): ([], ("insert_appointment", {**_APPT, "date": "2024-06-10"})),
    ("appointment_insert_rules", "weekday_only"): ([], ("insert_appointment", {**_APPT, "date": "2024-06-15"})),
    ("appointment_insert_rules", "slot_taken"): (
        [], ("insert_appointment", {**_APPT, "patient_id": "P-1004", "date": "2024-06-12", "slot": "09:00"})),
    ("appointment_insert_rules", "doctor_capacity"): (
        [], ("insert_appointment", {**_APPT, "patient_id": "P-1003", "doctor_id": "D-03", "date": "2024-06-14", "slot": "09:00"})),
    ("appointment_insert_rules", "patient_double_booking"): (
        [], ("insert_appointment", {**_APPT, "patient_id": "P-1003", "doctor_id": "D-02", "date": "2024-06-12", "slot": "10:00"})),
    ("appointment_specialist_rules", "referral_required"): (
        [], ("insert_appointment", {**_APPT, "patient_id": "P-1002", "doctor_id": "D-04"})),
    ("appointment_follow_up_rules", "follow_up_history"): (
        [], ("insert_appointment", {**_APPT, "patient_id": "P-1006", "doctor_id": "D-02", "kind": "follow_up"})),
    ("appointment_fixed_fields", "appointment_fixed_fields"): (
        [], ("update_appointment", {"appointment_id": 505, "date": "2024-06-13"})),
    ("appointment_status_rules", "status_final"): ([], ("update_appointment", {"appointment_id": 501, "status": "cancelled"})),
    ("appointment_status_rules", "cancellation_notice"): ([], ("update_appointment", {"appointment_id": 510, "status": "cancelled"})),
    ("appointment_status_rules", "outcome_after_visit"): ([], ("update_appointment", {"appointment_id": 505, "status": "completed"})),
    ("prescription_insert_rules", "established_patient"): (
        [], ("insert_prescription", {"patient_id": "P-1006", "doctor_id": "D-01", "drug_id": "DRG-AMOX", "quantity": 10})),
    ("prescription_insert_rules", "quantity_limit"): (
        [], ("insert_prescription", {"patient_id": "P-1001", "doctor_id": "D-01", "drug_id": "DRG-AMOX", "quantity": 31})),
    ("prescription_insert_rules", "controlled_no_refills"): (
        [], ("insert_prescription", {"patient_id": "P-1001", "doctor_id": "D-01", "drug_id": "DRG-OXY", "quantity": 10, "refills_left": 1})),
    ("prescription_insert_rules", "duplicate_prescription"): (
        [], ("insert_prescription", {"patient_id": "P-1001", "doctor_id": "D-01", "drug_id": "DRG-LISI", "quantity": 30})),
    ("prescription_insert_rules", "new_prescription_active"): (
        [], ("insert_prescription", {"patient_id": "P-1001", "doctor_id": "D-01", "drug_id": "DRG-AMOX", "quantity": 10, "status": "completed"})),
    ("prescription_refill_rules", "prescription_active"): ([], ("update_prescription", {"rx_id": 9002, "refills_left": -1})),
    ("prescription_refill_rules", "no_refills_left"): ([], ("update_prescription", {"rx_id": 9004, "refills_left": -1})),
    ("prescription_refill_rules", "refill_one_at_a_time"): ([], ("update_prescription", {"rx_id": 9001, "refills_left": 0})),
    ("prescription_status_rules", "prescription_final"): ([], ("update_prescription", {"rx_id": 9002, "status": "active"})),
}

PROVOKE = {"airline": AIRLINE_PROVOKE, "clinic": CLINIC_PROVOKE}


@pytest.mark.parametrize("name", DOMAINS)
def test_every_trigger_rule_has_a_provocation(name):
    env = _env(name)
    try:
        declared = {(t.name, rule) for t in env.triggers for rule, _ in t.rules}
        assert declared == set(PROVOKE[name]), (declared ^ set(PROVOKE[name]))
        # every trigger that raises is covered; every other trigger has a side-effect test
        raising = {t.name for t in env.triggers if t.raw_messages}
        others = {t.name for t in env.triggers} - raising
        assert others == set(SIDE_EFFECTS[name])
    finally:
        env.close()


def _provocations():
    return [(d, trg, rule) for d in DOMAINS for (trg, rule) in PROVOKE[d]]


@pytest.fixture(scope="module")
def envs():
    out = {d: _env(d) for d in DOMAINS}
    yield out
    for e in out.values():
        e.close()


@pytest.mark.parametrize("name,trigger,rule", _provocations(), ids=[f"{d}:{t}:{r}" for d, t, r in _provocations()])
def test_trigger_provoked(envs, name, trigger, rule):
    env = envs[name]
    env.reset()
    setup, (tool, args) = PROVOKE[name][(trigger, rule)]
    for stool, sargs in setup:
        r = env.call(stool, sargs)
        assert r.ok, r.error
    before_hash = env.state_hash()
    before_schema = env.schema_sql()
    r = env.call(tool, args)
    assert not r.ok
    assert r.error["code"] == "POLICY_VIOLATION", r.error
    assert r.error["violated_rule"] == rule
    assert r.error["message"] and r.error["hint"]
    assert set(r.error) == {"code", "message", "violated_rule", "hint"}
    assert trigger in env.rules[rule]["triggers"]
    assert env.state_hash() == before_hash, "a refused write must leave the state unchanged"
    assert env.schema_sql() == before_schema
    assert r.is_policy_violation


# ---------------------------------------------------------------------------------------------
# AFTER triggers: the side effects happen (and only once)


def _row(env, table, **key):
    rows = env.call(f"query_{table}", key).content["rows"]
    assert len(rows) == 1, rows
    return rows[0]


def _audit(env):
    return env.snapshot()["audit_log"]


def fx_reservation_after_insert(env):
    seats0 = _row(env, "flight_cabin", flight_id="HAT172-2024-05-20", cabin="economy")["seats_available"]
    r = env.call("insert_reservation", {"user_id": "sofia_kim_7290", "flight_id": "HAT172-2024-05-20",
                                        "cabin": "economy", "passenger_count": 2, "total_bags": 5})
    assert r.ok, r.error
    assert r.content["created_on"] == "2024-05-15"
    assert r.content["nonfree_bags"] == 5 - 2 * (1 + 1)  # silver + economy: 2 free per passenger
    assert _row(env, "flight_cabin", flight_id="HAT172-2024-05-20", cabin="economy")["seats_available"] == seats0 - 2
    assert [a["event"] for a in _audit(env)] == ["booked"]


def fx_reservation_after_cancel(env):
    r = env.call("update_reservation", {"reservation_id": 1003, "status": "cancelled"})
    assert r.ok, r.error
    refunds = env.call("query_payment", {"reservation_id": 1003, "kind": "refund"}).content["rows"]
    assert sorted((p["payment_id"], p["amount"]) for p in refunds) == [("certificate_8845", 50), ("credit_card_5120", 248)]
    assert _row(env, "payment_method", payment_id="certificate_8845")["balance"] == 100
    assert _row(env, "flight_cabin", flight_id="HAT201-2024-05-18", cabin="economy")["seats_available"] == 4


def fx_reservation_after_move(env):
    r = env.call("update_reservation", {"reservation_id": 1001, "flight_id": "HAT172-2024-05-20"})
    assert r.ok, r.error
    assert _row(env, "flight_cabin", flight_id="HAT170-2024-05-20", cabin="economy")["seats_available"] == 4
    assert _row(env, "flight_cabin", flight_id="HAT172-2024-05-20", cabin="economy")["seats_available"] == 8
    assert [a["event"] for a in _audit(env)] == ["moved"]


def fx_reservation_after_bags(env):
    r = env.call("update_reservation", {"reservation_id": 1001, "total_bags": 4})
    assert r.ok and r.content["nonfree_bags"] == 1  # gold economy: 3 free
    r = env.call("update_reservation", {"reservation_id": 1001, "cabin": "business"})
    assert r.ok and r.content["nonfree_bags"] == 0  # gold business: 4 free


def fx_payment_after_insert(env):
    r = env.call("insert_payment", {"reservation_id": 1001, "payment_id": "gift_card_7791", "purpose": "baggage", "amount": 50})
    assert r.ok and r.content["kind"] == "charge"
    assert _row(env, "payment_method", payment_id="gift_card_7791")["balance"] == 200
    r = env.call("insert_payment", {"reservation_id": 1001, "payment_id": "credit_card_4421", "purpose": "baggage", "amount": 50})
    assert r.ok
    assert _row(env, "payment_method", payment_id="credit_card_4421")["balance"] is None


def fx_appointment_after_insert(env):
    r = env.call("insert_appointment", {"patient_id": "P-1004", "doctor_id": "D-05", "date": "2024-06-18",
                                        "slot": "11:00", "kind": "consultation"})
    assert r.ok, r.error
    assert r.content["copay"] == 40 and r.content["referral_id"] == 3
    assert _row(env, "referral", referral_id=3)["status"] == "used"
    r = env.call("insert_appointment", {"patient_id": "P-1003", "doctor_id": "D-04", "date": "2024-06-18",
                                        "slot": "11:00", "kind": "consultation"})
    assert r.ok and r.content["copay"] == 0 and r.content["referral_id"] is None  # premium: no referral needed


def fx_appointment_after_status(env):
    r = env.call("update_appointment", {"appointment_id": 510, "status": "no_show"})
    assert r.ok, r.error
    p = _row(env, "patient", patient_id="P-1004")
    assert (p["no_show_count"], p["status"]) == (3, "suspended")
    # cancelling an appointment that used a referral re-opens it
    env.reset()
    r = env.call("insert_appointment", {"patient_id": "P-1001", "doctor_id": "D-03", "date": "2024-06-17",
                                        "slot": "09:00", "kind": "consultation"})
    assert r.ok and _row(env, "referral", referral_id=1)["status"] == "used"
    r = env.call("update_appointment", {"appointment_id": r.content["appointment_id"], "status": "cancelled"})
    assert r.ok and _row(env, "referral", referral_id=1)["status"] == "open"


def fx_prescription_after_insert(env):
    r = env.call("insert_prescription", {"patient_id": "P-1001", "doctor_id": "D-01", "drug_id": "DRG-AMOX",
                                         "quantity": 10, "refills_left": 1})
    assert r.ok and r.content["issued_on"] == "2024-06-10" and r.content["status"] == "active"


def fx_prescription_after_refill(env):
    r = env.call("update_prescription", {"rx_id": 9003, "refills_left": 0})
    assert r.ok and r.content["status"] == "completed"
    r = env.call("update_prescription", {"rx_id": 9001, "refills_left": 1})
    assert r.ok and r.content["status"] == "active"


SIDE_EFFECTS = {
    "airline": {"reservation_after_insert": fx_reservation_after_insert, "reservation_after_cancel": fx_reservation_after_cancel,
                "reservation_after_move": fx_reservation_after_move, "reservation_after_bags": fx_reservation_after_bags,
                "payment_after_insert": fx_payment_after_insert},
    "clinic": {"appointment_after_insert": fx_appointment_after_insert, "appointment_after_status": fx_appointment_after_status,
               "prescription_after_insert": fx_prescription_after_insert, "prescription_after_refill": fx_prescription_after_refill},
}


@pytest.mark.parametrize("name,trigger", [(d, t) for d in DOMAINS for t in SIDE_EFFECTS[d]])
def test_after_trigger_side_effects(envs, name, trigger):
    env = envs[name]
    env.reset()
    SIDE_EFFECTS[name][trigger](env)
    env.reset()
