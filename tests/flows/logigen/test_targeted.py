"""The targeted boundary (N-1) search and the capped random draws of rules.RuleCoverage.

The goal each rule needs was worked out by hand from the trigger SQL; each found boundary is
re-checked here by executing it in a fresh environment, independently of the search."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from toolkit.envs import load_env
from toolkit.flows.logigen.goals import GoalExplorer
from toolkit.flows.logigen.rules import RuleCoverage

DATA = Path(__file__).resolve().parents[2] / "data"
AIRLINE = {"backend": "sqlite", "id": "airline"}
LIBRARY = {"backend": "sqlite", "path": str(DATA / "library")}
_COV: dict = {}


def coverage(ref: dict, **kw) -> RuleCoverage:
    key = (repr(ref), repr(sorted(kw.items())))
    if key not in _COV:
        env = load_env(ref)
        gx = GoalExplorer(env, env.snapshot(), 7)
        cov = RuleCoverage(gx, random.Random("7:cov"), **kw)
        cov.find_violations()
        cov.find_boundaries()
        _COV[key] = cov
    return _COV[key]


def outcome(ref: dict, state: dict, calls: list[dict]) -> list:
    """Each call's outcome in sequence from `state`: None (ok) or the violated rule / error code."""
    env = load_env(ref)
    try:
        env.reset(state)
        out = []
        for c in calls:
            r = env.call(c["name"], dict(c["arguments"]))
            err = r.error or {}
            out.append(None if r.ok else (err.get("violated_rule") or err.get("code")))
        return out
    finally:
        env.close()


def boundary(ref: dict, rule: str):
    cov = coverage(ref)
    assert cov.boundaries[rule], (rule, cov.dropped.get(rule), cov.draws.get(rule))
    b, origin = cov.boundaries[rule][0]
    goal, nxt = b.crossing
    # N-1, by execution: the next unit alone is not rejected for the rule on S; after the goal it is
    assert outcome(ref, origin, [nxt])[0] != rule
    assert outcome(ref, origin, [goal, nxt]) == [None, rule]
    assert b.seeded["n_minus_1"] is True
    return b, origin, cov


def _row(state: dict, table: str, **key) -> dict:
    (row,) = [r for r in state[table] if all(r[k] == v for k, v in key.items())]
    return row


def test_basic_economy_goal_moves_the_cabin_then_the_flight_change_is_refused():
    # OLD.cabin = 'basic_economy' on a flight change: the goal sets cabin to basic_economy on a
    # reservation, the next unit changes that reservation's flight
    b, origin, cov = boundary(AIRLINE, "basic_economy_no_flight_change")
    goal, nxt = b.crossing
    assert goal["name"] == nxt["name"] == "update_reservation"
    assert goal["arguments"]["cabin"] == "basic_economy"
    rid = goal["arguments"]["reservation_id"]
    assert nxt["arguments"]["reservation_id"] == rid and "flight_id" in nxt["arguments"]
    assert _row(origin, "reservation", reservation_id=rid)["cabin"] != "basic_economy"
    assert b.found_by == "trigger analysis" and b.seeded["search"] == "targeted"
    assert cov.draws["basic_economy_no_flight_change"]["found_by"] == "targeted"
    assert cov.draws["basic_economy_no_flight_change"]["random"] == 0


def test_reservation_active_goal_cancels_then_the_charge_is_refused():
    # (SELECT status FROM reservation WHERE reservation_id = NEW.reservation_id) IS NOT 'active':
    # the goal cancels an active reservation, the next unit charges it
    b, origin, _ = boundary(AIRLINE, "reservation_active")
    goal, nxt = b.crossing
    assert goal["name"] == "update_reservation" and goal["arguments"]["status"] == "cancelled"
    rid = goal["arguments"]["reservation_id"]
    assert nxt["name"] == "insert_payment" and nxt["arguments"]["reservation_id"] == rid
    assert _row(origin, "reservation", reservation_id=rid)["status"] == "active"


def test_seat_availability_goal_takes_the_last_seats():
    # COALESCE((SELECT seats_available FROM flight_cabin ...), 0) < passengers: the goal is a write
    # whose AFTER trigger takes seats of the cabin the next unit needs
    b, origin, _ = boundary(AIRLINE, "seat_availability")
    goal, nxt = b.crossing
    assert b.arg == "flight_cabin.seats_available"

    def cabin_of(call):  # the (flight, cabin) whose seats the call takes
        a = call["arguments"]
        if call["name"] == "insert_reservation":
            return a["flight_id"], a["cabin"]
        row = _row(origin, "reservation", reservation_id=a["reservation_id"])
        return a.get("flight_id", row["flight_id"]), a.get("cabin", row["cabin"])

    assert goal["name"] in ("insert_reservation", "update_reservation")
    assert cabin_of(goal) == cabin_of(nxt)


def test_library_copy_available_seeded_at_one_copy():
    # (SELECT copies_on_shelf FROM book WHERE book_id = NEW.book_id) < 1: S has one copy of the
    # book on the shelf (seeded by the analysis or already so), the goal borrows it
    b, origin, cov = boundary(LIBRARY, "copy_available")
    goal, nxt = b.crossing
    assert goal["name"] == nxt["name"] == "insert_loan"
    book = goal["arguments"]["book_id"]
    assert nxt["arguments"]["book_id"] == book
    assert _row(origin, "book", book_id=book)["copies_on_shelf"] == 1
    assert "member_in_good_standing" in cov.impossible and "member_in_good_standing" not in cov.dropped


def test_report_separates_impossible_from_not_found_and_caps_random_draws():
    cov = coverage(AIRLINE, max_draws=7)
    rep = cov.report()
    imp, dropped = rep["boundary_impossible"], rep["boundary_dropped"]
    assert not set(imp) & set(dropped)
    assert set(imp) | set(dropped) | {r for r, n in rep["boundary"].items() if n} == set(cov.rules)
    for rule, st in rep["boundary_search"]["rules"].items():
        assert st["random"] <= 7
        if st["capped"]:
            assert rule in dropped and "within 7 random draws" in dropped[rule]
    assert rep["boundary_search"]["max_draws"] == 7
    assert "passenger_limit" in imp and "passenger_limit" not in rep["boundary_search"]["rules"]


@pytest.mark.parametrize("draws", [0])
def test_no_random_draws_still_finds_the_targeted_boundaries(draws):
    cov = coverage(AIRLINE, max_draws=draws)
    for rule in ("basic_economy_no_flight_change", "reservation_active", "cancelled_is_final"):
        assert cov.boundaries[rule], rule
    assert all(st["random"] == 0 for st in cov.draws.values())


def test_library_loan_limit_walks_to_one_below_the_tier_limit():
    # (SELECT COUNT(*) FROM loan WHERE member_id = NEW.member_id AND status = 'active') >= the
    # tier's max_loans (standard 2, plus 3): S holds max_loans - 1 active loans of the member
    # (reached by executing loans when needed), the goal is the last one, the next unit one more
    b, origin, cov = boundary(LIBRARY, "loan_limit")
    goal, nxt = b.crossing
    assert goal["name"] == nxt["name"] == "insert_loan"
    member = nxt["arguments"]["member_id"]
    assert goal["arguments"]["member_id"] == member
    tier = _row(origin, "member", member_id=member)["tier"]
    limit = _row(origin, "tier_limit", tier=tier)["max_loans"]
    active = [x for x in origin["loan"] if x["member_id"] == member and x["status"] == "active"]
    assert len(active) == limit - 1
    assert cov.draws["loan_limit"]["found_by"] == "targeted"
    if b.seeded.get("by") == "executed calls":
        # walked up by loans, or down from the limit by one active loan returned
        calls = b.seeded["calls"]
        assert all(c["name"] == "insert_loan" for c in calls) or (
            [c["name"] for c in calls] == ["update_loan"] and set(calls[0]["arguments"]) == {"loan_id", "status"}
            and calls[0]["arguments"]["status"] != "active")


RETAIL = {"backend": "sqlite", "path": str(DATA / "retail")}


def test_retail_open_orders_cap_witness_by_repeating_an_order_then_its_boundary():
    # (SELECT COUNT(*) FROM orders WHERE user_id = NEW.user_id AND status = 'pending') >= 2: no
    # single call from the seed violates it (u1 has no pending order, u2 one), so the witness is
    # an accepted insert_orders repeated until the cap refuses it; its setup calls are s_origin
    cov = coverage(RETAIL)
    wit = next(w for w in cov.violations["open_orders_cap"] if w.seeded.get("found_by") == "repeated call")
    calls = wit.seeded["calls"]
    assert wit.seeded["by"] == "executed calls" and calls
    assert {c["name"] for c in calls} == {wit.call.name} == {"insert_orders"}
    user = wit.call.args["user_id"]
    seed = load_env(RETAIL).snapshot()
    pending = [o for o in seed["orders"] if o["user_id"] == user and o["status"] == "pending"]
    assert len(pending) + len(calls) == 2  # exactly up to the cap, by hand from seed.json
    assert outcome(RETAIL, seed, calls + [wit.call.call()]) == [None] * len(calls) + ["open_orders_cap"]
    # the boundary: one pending order below the cap, the goal is the second, the next unit a third
    b, origin, _ = boundary(RETAIL, "open_orders_cap")
    goal, nxt = b.crossing
    assert goal["name"] == nxt["name"] == "insert_orders"
    who = nxt["arguments"]["user_id"]
    assert len([o for o in origin["orders"] if o["user_id"] == who and o["status"] == "pending"]) == 1


HOTEL = {"backend": "sqlite", "path": str(DATA / "hotel")}


def test_hotel_room_in_service_from_a_booking_already_in_the_closed_room():
    # booking_stay_change: NEW.room_no IS NOT OLD.room_no AND EXISTS (room under maintenance):
    # no call puts a booking into room 201 (its only writer refuses), so the N-1 state has a
    # booking that was in 201 before it closed (a state cell); there moving it back to 201 is a
    # no-op, moving it out is the goal, and then moving it back is refused
    b, origin, _ = boundary(HOTEL, "room_in_service")
    assert b.seeded["by"] == "state cell" and b.seeded["column"] == "room_no" and b.seeded["value"] == "201"
    goal, nxt = b.crossing
    key = b.seeded["row"]
    assert _row(origin, "booking", **key)["room_no"] == "201"
    assert goal["name"] == nxt["name"] == "update_booking"
    assert nxt["arguments"] == {**key, "room_no": "201"} and goal["arguments"]["room_no"] != "201"
    seed = load_env(HOTEL).snapshot()
    assert not [x for x in seed["booking"] if x["room_no"] == "201"]  # by hand: seed.json has none


UNIVERSITY = {"backend": "sqlite", "path": str(DATA / "university")}


def test_university_section_capacity_frees_a_seat_first():
    # (SELECT COUNT(*) FROM enrollment WHERE section_id = NEW.section_id AND status = 'enrolled')
    # >= capacity: every section of the registration term with a seat free has many (seed.json by
    # hand: ECON-101 40209 and MATH-220 40203 are full, the others far from it), so S is reached
    # by one enrolled student dropping a full section: the goal takes the freed seat, the next
    # student is refused
    b, origin, _ = boundary(UNIVERSITY, "section_capacity")
    assert b.seeded["by"] == "executed calls"
    (drop,) = b.seeded["calls"]
    assert drop["name"] == "update_enrollment" and drop["arguments"]["status"] == "dropped"
    goal, nxt = b.crossing
    sec = nxt["arguments"]["section_id"]
    assert goal["arguments"]["section_id"] == sec and goal["arguments"]["student_id"] != nxt["arguments"]["student_id"]
    cap = _row(origin, "section", section_id=sec)["capacity"]
    enrolled = [e for e in origin["enrollment"] if e["section_id"] == sec and e["status"] == "enrolled"]
    assert len(enrolled) == cap - 1


CITYPERMITS = {"backend": "sqlite", "path": str(DATA / "citypermits")}


def test_citypermits_monthly_visitor_cap_the_third_permit_then_the_fourth():
    # (SELECT COUNT(*) FROM permit WHERE resident_id = NEW.resident_id AND kind = 'visitor' AND
    # status <> 'cancelled' AND same month as NEW.valid_from) >= 3. The witness is a 4th March
    # permit for R-0412 (already at 3 in the seed); R-0413 holds 2 (seed.yaml's own comment). The
    # goal is the same request as a new row for the resident at 2 (a new key, another plate: the
    # witness's plate already holds an overlapping permit), the next unit the request itself.
    b, origin, _ = boundary(CITYPERMITS, "visitor_monthly_cap")
    goal, nxt = b.crossing
    assert goal["name"] == nxt["name"] == "insert_permit"
    who = goal["arguments"]["resident_id"]
    assert nxt["arguments"]["resident_id"] == who and goal["arguments"]["kind"] == nxt["arguments"]["kind"] == "visitor"
    assert goal["arguments"]["permit_id"] != nxt["arguments"]["permit_id"]
    month = nxt["arguments"]["valid_from"][:7]
    held = [p for p in origin["permit"] if p["resident_id"] == who and p["kind"] == "visitor"
            and p["status"] != "cancelled" and p["valid_from"][:7] == month]
    assert len(held) == 2  # one below the cap, counted by hand
    # the made-up key has the table's own shape
    assert goal["arguments"]["permit_id"].startswith("P-") and "probe" not in goal["arguments"]["permit_id"]


def test_citypermits_cash_monthly_limit_on_another_residents_permit():
    # round(SUM(cash paid this month by the permit's resident) + NEW.amount, 2) > 150. The witness
    # is a 180.00 cash payment on P-2024-0388, which is paid in full: no amount is accepted there.
    # Moved to another permit: R-0708 paid 130.00 cash in March and owes 30.00 on P-2025-0026
    # (seed.yaml's own comment), so 20 is the most the cap lets through, and then 1 more is refused.
    b, origin, _ = boundary(CITYPERMITS, "cash_monthly_limit")
    goal, nxt = b.crossing
    assert goal["name"] == nxt["name"] == "insert_payment"
    assert goal["arguments"]["permit_id"] == nxt["arguments"]["permit_id"] == "P-2025-0026"
    assert goal["arguments"]["method"] == "cash" and goal["arguments"]["amount"] == 20
    assert nxt["arguments"]["amount"] == 1


def test_citypermits_household_cap_witness_with_the_domain_checks_budget():
    # `toolkit domain check` provokes household_cap after ~2,200 calls (a third resident permit
    # for a resident holding 2: their own free car, their zone, dates from today); the generator's
    # fallback search now has the same budget, so its violation-first task exists too
    cov = coverage(CITYPERMITS)
    assert cov.violations["household_cap"], cov.dropped.get("household_cap")
    wit = cov.violations["household_cap"][0]
    assert outcome(CITYPERMITS, wit.origin, [wit.call.call()]) == ["household_cap"]
    who = wit.call.args["resident_id"]
    held = [p for p in wit.origin["permit"] if p["resident_id"] == who and p["kind"] == "resident"
            and p["status"] in ("pending_payment", "active", "suspended")]
    badge = next(r["has_blue_badge"] for r in wit.origin["resident"] if r["resident_id"] == who)
    assert len(held) == (3 if badge else 2)  # at the cap, counted by hand
