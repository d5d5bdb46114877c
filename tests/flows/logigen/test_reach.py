"""The static half of the boundary (N-1) search: which rules can have no state one action away.

Every expectation below was read off the trigger SQL and the visible tools by hand
(toolkit/domains/airline/schema.sql, tests/data/library/schema.sql + domain.yaml,
tests/data/carrental/schema.sql), not copied from the code's output.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.envs import load_env
from toolkit.flows.logigen.analysis import analyze
from toolkit.flows.logigen.explorer import DomainView
from toolkit.flows.logigen.reach import Reach

DATA = Path(__file__).resolve().parents[2] / "data"


def _reach(env_ref: dict) -> Reach:
    env = load_env(env_ref)
    try:
        return Reach(analyze(env), DomainView(env))
    finally:
        env.close()


def test_airline_impossible_rules_by_hand():
    imp = _reach({"backend": "sqlite", "id": "airline"}).impossible()
    # INSERT checks on the call's own arguments: passenger_limit (NEW.passenger_count),
    # new_reservation_active (NEW.status); immutable columns (their only writer, update_*, is
    # rejected by a `NEW.c IS NOT OLD.c` rule): insurance_at_booking_only, owner_fixed,
    # passenger_count_fixed, membership_fixed; email_format reads nothing but NEW.email, which
    # every update_customer passes through; payment_method has no visible writer
    # (payment_method_active reads its status; payment_method_owner its user_id and
    # reservation.user_id, which owner_fixed freezes)
    assert set(imp) == {"passenger_limit", "new_reservation_active", "insurance_at_booking_only", "owner_fixed",
                        "passenger_count_fixed", "membership_fixed", "email_format", "payment_method_active",
                        "payment_method_owner"}
    assert "NEW.passenger_count" in imp["passenger_limit"]
    assert "owner_fixed rejects every change" in imp["owner_fixed"]
    assert "every write of it passes this same check" in imp["email_format"]
    assert "payment_method.user_id: no visible tool writes it" in imp["payment_method_owner"]
    assert "reservation.user_id: only update_reservation writes it and owner_fixed" in imp["payment_method_owner"]
    # what stays searchable reads something a visible write changes: reservation.cabin
    # (basic_economy_no_flight_change), reservation.status (reservation_active, via a cancel),
    # flight_cabin.seats_available (seat_availability, through the AFTER triggers of bookings)
    for rule in ("basic_economy_no_flight_change", "reservation_active", "seat_availability", "bag_limit",
                 "insufficient_balance", "one_certificate_per_reservation"):
        assert rule not in imp


def test_library_and_carrental_by_hand():
    lib = _reach({"backend": "sqlite", "path": str(DATA / "library")}).impossible()
    # member.status: update_member is hidden (tools.yaml hide "*_member"); new_loan_active: NEW.status
    assert set(lib) == {"member_in_good_standing", "new_loan_active"}
    assert "member.status: no visible tool writes it" in lib["member_in_good_standing"]
    car = _reach({"backend": "sqlite", "path": str(DATA / "carrental")}).impossible()
    # customer.status / car.category / customer.licence_class: nothing writes them; settings.today
    # is read inside a comparison with NEW.start_date; new_rental_booked reads NEW.status.
    # damage_needs_pickup reads rental.status, which update_rental writes: searched (status_flow
    # keeps a picked-up rental in {picked_up, returned}, which the analysis does not follow)
    assert set(car) == {"customer_in_good_standing", "van_licence", "new_rental_booked", "start_not_past"}
    assert "rows of settings" in car["start_not_past"]


def test_a_visible_writer_makes_the_rule_searchable(tmp_path):
    d = tmp_path / "library"
    shutil.copytree(DATA / "library", d)
    y = d / "tools.yaml"
    y.write_text(y.read_text().replace('"*_member", ', ""))  # update_member becomes visible
    r = _reach({"backend": "sqlite", "path": str(d)})
    assert "update_member" in r.view.tools
    assert "member_in_good_standing" not in r.impossible()
    assert r.writers(next(x for rc in r.an.rules["member_in_good_standing"] for x in r.check_movable(rc)[0])) \
        == ["update_member"]


def test_immutability_and_effects_are_read_from_the_triggers():
    r = _reach({"backend": "sqlite", "id": "airline"})
    assert r.fixed[("reservation", "user_id")] == "owner_fixed"
    assert r.fixed[("customer", "membership")] == "membership_fixed"
    assert ("reservation", "cabin") not in r.fixed and ("reservation", "status") not in r.fixed
    # seats move only through the AFTER triggers of insert_reservation / update_reservation
    assert set(r.effect_by[("flight_cabin", "seats_available")]) == {"insert_reservation", "update_reservation"}
    assert ("flight_cabin", "seats_available") not in r.set_by


def test_a_subquery_inside_case_is_read_like_a_top_level_one():
    # retail's qty_range: NEW.qty > CASE (SELECT tier FROM users WHERE user_id = NEW.user_id)
    # WHEN 'vip' THEN 10 ELSE 3 END. It reads users.tier (keyed on the call's user_id), which only
    # update_users writes and tier_locked rejects every change of: no state is one action away.
    # Read as "the rows of users" (the CASE as text) it looked movable (update_users changes a
    # user's name), and the search ran and dropped it.
    r = _reach({"backend": "sqlite", "path": str(DATA / "retail")})
    rc = r.an.rules["qty_range"][0]
    case = next(c.rhs for c in rc.conditions if getattr(c.rhs, "column", None) == "CASE")
    sub = case.parts[0]
    assert (sub.kind, sub.table, sub.column, list(sub.keys)) == ("subquery", "users", "tier", ["user_id"])
    assert case.refs == ["NEW.user_id"]
    imp = r.impossible()
    assert "users.tier: only update_users writes it and tier_locked rejects every change of it" in imp["qty_range"]
    # by hand from retail/schema.sql: card_owner (gift_card.user_id has no writer, orders.user_id
    # is frozen by order_fixed), order_fixed, tier_locked (immutability rules), pending_first
    # (NEW.status only); open_orders_cap counts orders rows, which insert_orders adds
    assert set(imp) == {"qty_range", "card_owner", "order_fixed", "pending_first", "tier_locked"}


def test_a_join_on_primary_keys_reads_the_joined_rows_only():
    # pharmacy's insured_only: (SELECT pa.plan_code FROM dispensing f JOIN prescription r ON
    # r.rx_id = f.rx_id JOIN patient pa ON pa.patient_id = r.patient_id WHERE f.fill_id =
    # NEW.fill_id) = 'self_pay' reads one row per table: f.rx_id (update_dispensing is hidden),
    # r.patient_id (rx_terms_fixed freezes it), pa.plan_code (update_patient is hidden)
    r = _reach({"backend": "sqlite", "path": str(DATA / "pharmacy")})
    from toolkit.flows.logigen.reach import reads

    rc = r.an.rules["insured_only"][0]
    assert {x.label() for x in reads(rc, r.view.tables)} == {"dispensing.rx_id", "prescription.patient_id",
                                                             "patient.plan_code"}
    imp = r.impossible()
    assert {"insured_only", "plan_quantity_limit"} <= set(imp)
    assert "prescription.patient_id: only update_prescription writes it and rx_terms_fixed" in imp["insured_only"]
    # in_stock reads drug.stock through the same kind of join, and a fill's AFTER trigger lowers it
    assert "in_stock" not in imp
    # hotel's extras_per_level selects a CASE over the joined guest's level: the columns the CASE
    # reads count (guest.loyalty_level, read-only), with the booking's guest (frozen) and the
    # booking's extras (a count: inserts move it, so the rule is searched)
    h = _reach({"backend": "sqlite", "path": str(DATA / "hotel")})
    rc = h.an.rules["extras_per_level"][0]
    assert {x.label() for x in reads(rc, h.view.tables)} == {"rows of booking_extra", "booking.guest_id",
                                                             "guest.loyalty_level"}
    assert "extras_per_level" not in h.impossible()
