"""Issue 21's acceptance, on domains the explorer was never tuned on (tests/data/carrental: a
car-rental counter; tests/data/retail: a web shop with a count cap and a CASE limit;
tests/data/library; tests/data/hotel, tests/data/pharmacy, tests/data/bank and
tests/data/university, written blind by engineers who never read the generator; tests/data/lending
and tests/data/parking, written in a newcomer's style: plural table names, snake_case ids, day
numbers, 0/1 flags, columns without comments, a per-month COUNT and a "sum of payments plus this
one" limit), checked with code independent of the generator: 100 symbolic tasks
each, then
- >= 50% need >= 3 writes (a write = a step that changes the state hash, replayed here);
- >= 25% have a write that depends on an earlier read: one of its argument values appears in an
  earlier tool result of the replay and nowhere in what the user says or knows;
- every trigger rule has >= 1 violation-first task, and >= 1 boundary task unless no state can be
  one action away from it (the rules listed below, decided by hand from the schema);
- 100% of boundary tasks are seeded at N-1: on s_origin the goal succeeds, the rule's next unit
  does not fire before the goal (state rules) and fires right after it;
- distinct action-signature ratio (sequence of tool names) >= 0.8;
- no user view names a column: a snake_case column (keys too) with its underscores or with spaces
  ("due_day", "due day"), or a column followed by one of its enum values; and none says "a
  <plural table>" ("a new loans", "a books"): the user speaks the domain's words, not its schema;
- all 100 replay to reward 1.0 and pass validate-task."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.flows.logigen.test_tasks import gen, replay_rewards, validate
from toolkit.envs import load_env

DATA = Path(__file__).resolve().parents[2] / "data"
CARRENTAL = str(DATA / "carrental")
ENV = {"backend": "sqlite", "path": CARRENTAL}


@dataclass(frozen=True)
class Held:
    """A domain the explorer was not tuned on, and what was decided by hand from its schema and
    tools: its trigger rules, those no state can be one action away from (NO_BOUNDARY), those of
    them the trigger analysis decides without a search, and those searched and not found."""
    name: str
    rules: int
    no_boundary: frozenset | None  # None: not decided by hand (every rule without one is reported)
    impossible: frozenset
    dropped: frozenset

    @property
    def env(self) -> dict:
        return {"backend": "sqlite", "path": str(DATA / self.name)}


# carrental: no visible tool changes a customer's status or licence, and these conditions read
# only the call's own arguments (or a date nobody can change); damage_needs_pickup reads
# rental.status, which update_rental writes, but status_flow only lets a picked-up rental become
# returned (both allowed), which the static analysis does not follow: searched, reported dropped
NO_BOUNDARY = {"customer_in_good_standing", "van_licence", "new_rental_booked", "start_not_past",
               "damage_needs_pickup"}
# retail: card_owner reads gift_card.user_id (no visible writer) and orders.user_id (frozen by
# order_fixed); order_fixed and tier_locked freeze columns; pending_first reads NEW.status only;
# qty_range compares NEW.qty with a CASE on users.tier, which tier_locked freezes
RETAIL_NO = frozenset({"card_owner", "order_fixed", "pending_first", "qty_range", "tier_locked"})
# library: member.status has no visible writer (update_member is hidden); new_loan_active: NEW.status
LIBRARY_NO = frozenset({"member_in_good_standing", "new_loan_active"})
# hotel (written blind by another engineer): new_booking_booked reads NEW.status only;
# booking_guest_fixed freezes guest_id. (room_in_service has an N-1 only from a state where a
# booking already sits in the room under maintenance -- made before the room closed -- seeded by
# a state cell: moving it out is the goal, moving it back is refused.)
HOTEL_NO = frozenset({"new_booking_booked", "booking_guest_fixed"})
# pharmacy (written blind): fill_quantity, rx_not_expired and rx_terms_fixed read only frozen
# prescription terms and the call's arguments; insured_only and plan_quantity_limit read the
# patient's plan (update_patient hidden) through a JOIN on primary keys whose other columns are
# frozen (prescription.patient_id) or unwritable (dispensing.rx_id): all static. in_stock needs two fillable prescriptions of one drug (none: every shared drug has one
# expired, cancelled, refill-less or filled in the last 21 days); controlled_fill_cap: PT-1002 is
# at the cap, PT-1005's second controlled prescription was filled 10 days ago; annual_benefit_cap:
# only PT-1004 is near its cap (465.50 of 500) and no claimable amount fits between 32.82 and
# 34.50 -- searched, reported not found
PHARMACY_STATIC = frozenset({"fill_quantity", "rx_not_expired", "rx_terms_fixed", "insured_only",
                             "plan_quantity_limit"})
PHARMACY_SEARCHED = frozenset({"in_stock", "controlled_fill_cap", "annual_benefit_cap"})
# bank (written blind): account_owner_fixed freezes the owner and type; kyc_pending_limit reads the
# customer's KYC status (read-only) through the account's owner (frozen). The others have an N-1:
# close_zero_balance (a transfer into an empty account, then closing it), transfer_reversal (a
# transfer reversed, then un-reversing it), sufficient_funds (the whole balance sent, then 1 more)
BANK_NO = frozenset({"account_owner_fixed", "kyc_pending_limit"})
# university (written blind): not decided by hand -- its rules are RAISE ... FROM comma joins,
# nested NOT EXISTS and GROUP BY the analysis reads only in part; section_open is static (a
# section's status has no visible writer), the others are searched and most are not found (a
# reached state with a free seat AND two eligible students, or two open sections in one slot a
# student may take, is what their N-1 needs). Every other acceptance item holds.
# lending and parking (issue 34, written like a newcomer's domains): not decided by hand; parking's
# visitor_monthly_cap (at most 3 visitor permits starting in one calendar month; r_ana is seeded at
# 2 of 3) and yearly_payment_cap (the year's payments plus this one at most 400; r_cal has paid 360)
# must get a boundary task (PARKING_BOUNDARY below)
DOMAINS = {
    "lending": Held("lending", 17, None, frozenset({"loan_fixed", "new_loan_open", "new_hold_waiting"}), frozenset()),
    "parking": Held("parking", 13, None, frozenset({"home_zone_only", "permit_terms_fixed", "new_permit_active"}),
                    frozenset()),
    "university": Held("university", 12, None, frozenset({"section_open"}), frozenset()),
    "bank": Held("bank", 12, BANK_NO, BANK_NO, frozenset()),
    "hotel": Held("hotel", 17, HOTEL_NO, HOTEL_NO, frozenset()),
    "pharmacy": Held("pharmacy", 13, PHARMACY_STATIC | PHARMACY_SEARCHED, PHARMACY_STATIC, PHARMACY_SEARCHED),
    "carrental": Held("carrental", 12, frozenset(NO_BOUNDARY), frozenset(NO_BOUNDARY - {"damage_needs_pickup"}),
                      frozenset({"damage_needs_pickup"})),
    "retail": Held("retail", 11, RETAIL_NO, RETAIL_NO, frozenset()),
    "library": Held("library", 7, LIBRARY_NO, LIBRARY_NO, frozenset()),
}

_RECS: dict = {}


def recs(name: str = "carrental"):
    if name not in _RECS:
        _RECS[name] = gen(DOMAINS[name].env, n=100, seed=7)
    return [r.model_copy(deep=True) for r in _RECS[name]]


def _scalars(obj) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*[_scalars(v) for v in obj.values()]) if obj else set()
    if isinstance(obj, list):
        return set().union(*[_scalars(v) for v in obj]) if obj else set()
    return set() if obj is None or isinstance(obj, bool) else {str(obj)}


def user_texts(r) -> str:
    us = r.task.user_scenario
    return "\n".join(x for x in [r.task.instruction, us.persona, us.reason_for_call, us.known_info,
                                 us.unknown_info, us.instructions] if x)


def replay(r):
    """(writes, read-dependent writes) of a task, by executing its actions from s_origin."""
    env = load_env(r.env)
    text = user_texts(r)
    seen: set[str] = set()
    writes = dep = 0
    try:
        for a in r.task.ground_truth.actions:
            h = env.state_hash()
            res = env.call(a.name, copy.deepcopy(a.arguments))
            if res.ok and env.state_hash() != h:
                writes += 1
                if any(str(v) in seen and not re.search(r"(?<![\w.-])" + re.escape(str(v)) + r"(?![\w-])", text)
                       for v in a.arguments.values() if v is not None and not isinstance(v, bool)):
                    dep += 1
            if res.ok:
                seen |= _scalars(res.content)
    finally:
        env.close()
    return writes, dep


NAMES = sorted(DOMAINS)


@pytest.mark.parametrize("name", NAMES)
def test_writes_and_read_dependencies(name):
    rs = recs(name)
    assert len(rs) == 100
    facts = [replay(r) for r in rs]
    assert sum(w >= 3 for w, _ in facts) >= 50
    assert sum(d > 0 for _, d in facts) >= 25


@pytest.mark.parametrize("name", NAMES)
def test_rule_coverage_and_boundaries_at_n_minus_1(name):
    rs = recs(name)
    dom = DOMAINS[name]
    env = load_env(dom.env)
    try:
        schema = env.domain.spec.schema_sql
    finally:
        env.close()
    trigger_rules = set(re.findall(r"POLICY_VIOLATION: (\w+):", schema))
    assert len(trigger_rules) == dom.rules
    viol = {r.task.complexity["violation"]["rule"] for r in rs if r.task.complexity.get("violation")}
    assert viol == trigger_rules
    bnd = [r for r in rs if r.task.complexity.get("boundary")]
    cov = rs[0].task.extra["rule_coverage"]
    with_boundary = {r.task.complexity["boundary"]["rule"] for r in bnd}
    if dom.no_boundary is not None:
        assert with_boundary == trigger_rules - dom.no_boundary
        # the trigger analysis decides the same set without a search (carrental: except
        # damage_needs_pickup, searched and reported as not found)
        assert set(cov["boundary_impossible"]) == dom.impossible
        assert set(cov["boundary_dropped"]) == dom.dropped
    else:  # every rule without a boundary task is reported, with a reason
        assert dom.impossible <= set(cov["boundary_impossible"])
        missing = trigger_rules - with_boundary
        assert missing == set(cov["boundary_impossible"]) | set(cov["boundary_dropped"])
        assert all(cov["boundary_dropped"][x] for x in cov["boundary_dropped"])
    if name == "parking":  # a per-month count and a yearly sum: each at N-1 of its limit
        assert {"visitor_monthly_cap", "yearly_payment_cap"} <= with_boundary
    for r in bnd:
        b = r.task.complexity["boundary"]
        assert b["seeded"].get("n_minus_1") is True, r.id
        goal, crossing = b["goal"], b["crossing"]
        e = load_env(r.env)
        try:
            h0 = e.state_hash()
            last = crossing[-1]
            state_rule = not (goal["name"] == last["name"] and goal["name"].startswith("update_")
                              and set(goal["arguments"]) == set(last["arguments"]))
            if state_rule:  # before the goal, the next unit does not break the rule
                res = e.call(last["name"], copy.deepcopy(last["arguments"]))
                assert res.ok or res.error["violated_rule"] != b["rule"], r.id
                e.reset()
            assert e.state_hash() == h0
            for step in crossing[:-1]:
                assert e.call(step["name"], copy.deepcopy(step["arguments"])).ok, r.id
            h1 = e.state_hash()
            res = e.call(last["name"], copy.deepcopy(last["arguments"]))
            assert not res.ok and res.error["code"] == "POLICY_VIOLATION" and res.error["violated_rule"] == b["rule"]
            assert e.state_hash() == h1
            e.reset()
            assert e.call(goal["name"], copy.deepcopy(goal["arguments"])).ok
        finally:
            e.close()


@pytest.mark.parametrize("name", NAMES)
def test_signatures_and_user_views(name):
    rs = recs(name)
    sigs = {tuple(a.name for a in r.task.ground_truth.actions) for r in rs}
    assert len(sigs) / len(rs) >= 0.8
    env = load_env(DOMAINS[name].env)
    try:
        cols = {c.name: c for t in env.domain.tables.values() for c in t.columns if not c.pk}
        snake = {c.name for t in env.domain.tables.values() for c in t.columns if "_" in c.name}
        tables = list(env.domain.tables)
    finally:
        env.close()
    # a table named in the plural (`loans`, `users`, `settings`): "a loans", "a new users"
    plural = [t.replace("_", " ") for t in tables if t.endswith("s") and not t.endswith(("ss", "us", "is"))]
    for r in rs:
        text = user_texts(r)
        for col in snake:  # with its underscores or with spaces, any case
            spaced = r"[\s_]+".join(map(re.escape, col.split("_")))
            assert not re.search(r"(?i)(?<![\w-])" + spaced + r"(?![\w-])", text), (r.id, col, text)
            # raw, it is schema wherever it stands: inside a value too (a made-up key "permit_id-7")
            assert not re.search(r"(?i)(?<![A-Za-z0-9_])" + re.escape(col) + r"(?![A-Za-z0-9_])", text), (r.id, col, text)
        for t in plural:
            assert not re.search(r"(?i)\b(?:a|an)\s+(?:new\s+)?" + re.escape(t) + r"\b", text), (r.id, t, text)
        for col, c in cols.items():
            if "_" in col:
                assert not re.search(r"(?<![\w-])" + re.escape(col) + r"(?![\w-])", text), (r.id, col)
            for v in c.enum or []:
                for n in {col, col.replace("_", " ")}:
                    for vv in {str(v), str(v).replace("_", " ")}:
                        assert not re.search(r"(?i)\b" + re.escape(n) + r"\W{0,3}" + re.escape(vv) + r"\b", text), \
                            (r.id, n, vv)


@pytest.mark.parametrize("name", NAMES)
def test_replay_and_validate(name):
    rs = recs(name)
    assert replay_rewards(rs) == [1.0] * len(rs)
    checked = validate(rs, filter="passed")
    bad = [(r.id, [v.name for v in r.verdicts if v.stage == "validate-task" and not v.passed]) for r in checked
           if not all(v.passed for v in r.verdicts if v.stage == "validate-task")]
    assert not bad, json.dumps(bad[:5])
    assert len(checked) == len(rs)


@pytest.mark.parametrize("seed", [3])
def test_user_knows_the_identity_and_no_entity_switch(seed):
    # the user's own customer number is in what they know; a violation's correction keeps every
    # reference of the rejected call (no other customer or rental to dodge the rule)
    for r in gen(ENV, n=30, seed=seed):
        acts = r.task.ground_truth.actions
        ids = [a.arguments["customer_id"] for a in acts if a.name == "query_customer"]
        if ids:
            assert ids[0] in r.task.user_scenario.known_info
        for i, a in enumerate(acts):
            if a.expect_error:
                nxt = next((b for b in acts[i + 1:] if b.name == a.name and not b.expect_error), None)
                if nxt is not None and "correction" in (r.task.complexity.get("patterns") or []):
                    for k in ("customer_id", "car_id", "rental_id"):
                        if k in a.arguments:
                            assert nxt.arguments.get(k) == a.arguments[k], r.id
