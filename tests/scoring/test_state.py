"""DIFF and the state hash are one canonical form, independent of creation order (issue 8)."""

from __future__ import annotations

import hashlib
import json

import pytest

from toolkit.domains import load_tasks
from toolkit.envs import load_env
from toolkit.scoring.state import StateKeys, diff, state_hash
from toolkit.envs.sqlite import DomainError, SqliteEnvironment
from toolkit.scoring.rewards import TargetIndex, state_diff

BOOK_A = ("insert_reservation", {"user_id": "mia_li_3668", "flight_id": "HAT172-2024-05-20",
                                 "cabin": "economy", "passenger_count": 1})
BOOK_B = ("insert_reservation", {"user_id": "omar_davis_3817", "flight_id": "HAT172-2024-05-20",
                                 "cabin": "business", "passenger_count": 2})


def _book(env, first, second):
    """Book two reservations in the given order and pay each one with its owner's credit card."""
    for name, args in (first, second):
        r = env.call(name, args)
        assert r.ok, r.error
    rows = env.call("query_reservation", {"status": "active"}).content["rows"]
    new = {r["user_id"]: r["reservation_id"] for r in rows if r["flight_id"] == "HAT172-2024-05-20"}
    pm = {r["user_id"]: r["payment_id"] for r in env.call("query_payment_method", {"kind": "credit_card"}).content["rows"]}
    for user in sorted(new):
        r = env.call("insert_payment", {"reservation_id": new[user], "payment_id": pm[user],
                                        "purpose": "booking", "amount": 100})
        assert r.ok, r.error
    return new


def test_two_orders_of_the_same_bookings_give_diff_0():
    e1 = load_env({"backend": "sqlite", "id": "airline"})
    e2 = load_env({"backend": "sqlite", "id": "airline"})
    try:
        ids1 = _book(e1, BOOK_A, BOOK_B)
        ids2 = _book(e2, BOOK_B, BOOK_A)
        assert ids1 != ids2  # the reservation ids really differ (creation order)
        s1, s2 = e1.snapshot(), e2.snapshot()
        assert s1 != s2
        assert e1.diff(s1, s2)["total"] == 0
        assert e1.state_hash() == e2.state_hash() == e1.hash_state(s2)
        assert TargetIndex(s2, keys=e1.state_keys()).diff(s1) == 0
        assert TargetIndex(s2, keys=e1.state_keys()).diff_canonical(e1.canonical()) == 0
        # without the schema's technical keys the same states differ (what DIFF did before)
        assert diff(s1, s2, exclude_keys=["payment_tx_id", "log_id"])["total"] > 0
        # a real difference still counts: cancel one booking in e2 only
        r = e2.call("update_reservation", {"reservation_id": ids2["omar_davis_3817"], "status": "cancelled"})
        assert r.ok, r.error
        assert e1.diff(s1, e2.snapshot())["total"] > 0 and e1.state_hash() != e2.state_hash()
    finally:
        e1.close()
        e2.close()


def test_technical_keys_are_decided_from_the_schema():
    env = load_env({"backend": "sqlite", "id": "airline"})
    try:
        k = env.state_keys()
        assert k.technical["reservation"] == {"reservation_id"}
        assert k.technical["payment"] == {"payment_tx_id"} and k.technical["audit_log"] == {"log_id"}
        assert "customer" not in k.technical and "flight" not in k.technical  # TEXT keys are business keys
        refs = {(t, r.column, r.to_table) for t, rs in k.refs.items() for r in rs}
        assert refs == {("payment", "reservation_id", "reservation"), ("audit_log", "entity_id", "reservation")}
    finally:
        env.close()


AUTO = {
    "name": "auto",
    "schema": ("CREATE TABLE item (item_id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
               "timestamp TEXT);\n"
               "CREATE TABLE tag (tag_id INTEGER PRIMARY KEY, item_id INTEGER REFERENCES item(item_id), "
               "label TEXT, stamp TEXT);\n"),
    "seed": {"item": [], "tag": []},
    "exclude_keys": ["tag.stamp"],
}


def test_autoincrement_fk_by_content_and_business_timestamp():
    e1 = SqliteEnvironment.from_spec(AUTO)
    e2 = SqliteEnvironment.from_spec(AUTO)
    try:
        for env, order in ((e1, ("a", "b")), (e2, ("b", "a"))):
            for name in order:
                assert env.call("insert_item", {"name": name, "timestamp": "t1"}).ok
            items = {r["name"]: r["item_id"] for r in env.call("query_item", {}).content["rows"]}
            assert env.call("insert_tag", {"item_id": items["a"], "label": "red", "stamp": str(order)}).ok
        assert e1.state_hash() == e2.state_hash()
        assert e1.diff(e2.snapshot())["total"] == 0
        # the tag points at item "a" in both; pointing it at "b" instead is a difference
        s = e2.snapshot()
        b_id = next(r["item_id"] for r in s["item"] if r["name"] == "b")
        s["tag"][0]["item_id"] = b_id
        assert e1.diff(s)["total"] == 2
        # a business column named `timestamp` is compared (only declared columns are excluded)
        assert e1.call("update_item", {"item_id": 1, "timestamp": "t2"}).ok
        assert e1.diff(e2.snapshot())["total"] > 0
    finally:
        e1.close()
        e2.close()


def test_one_canonicalization_for_hash_and_diff():
    pairs = [({"t": [{"v": True}]}, {"t": [{"v": 1}]}),
             ({"t": [{"v": 2.0000000001}]}, {"t": [{"v": 2}]}),
             ({"t": [{"v": 0.1 + 0.2}]}, {"t": [{"v": 0.3}]}),
             ({"t": [{"v": 2.0}], "u": []}, {"t": [{"v": 2}]})]
    for a, b in pairs:
        assert state_diff(a, b) == 0 and state_hash(a) == state_hash(b), (a, b)
    different = [({"t": [{"v": 2.5}]}, {"t": [{"v": 2}]}), ({"t": [{"v": "1"}]}, {"t": [{"v": 1}]}),
                 ({"t": [{"timestamp": "x"}]}, {"t": [{"timestamp": "y"}]})]
    for a, b in different:
        assert state_diff(a, b) > 0 and state_hash(a) != state_hash(b), (a, b)


def test_declared_reference_errors():
    bad = dict(AUTO, references=[{"column": "tag.label", "to": "item.name"}])
    with pytest.raises(DomainError, match="not a technical key"):
        SqliteEnvironment.from_spec(bad)
    with pytest.raises(DomainError, match="unknown column"):
        SqliteEnvironment.from_spec(dict(AUTO, references=[{"column": "tag.nope", "to": "item.item_id"}]))


def _hand_hash(state: dict) -> str:
    """The documented canonical form of the airline domain, written out by hand: drop the rowid
    aliases, replace payment.reservation_id and audit_log.entity_id by the reservation's row."""
    tech = {"clock": {"clock_id"}, "reservation": {"reservation_id"}, "payment": {"payment_tx_id"},
            "audit_log": {"log_id"}}

    def cell(v):
        if isinstance(v, float):
            r = round(v, 9)
            return int(r) if r.is_integer() else r
        return v

    def key(t, row, res_keys):
        obj = {k: cell(v) for k, v in row.items() if k not in tech.get(t, ())}
        if t == "payment":
            obj["reservation_id"] = {"$ref": "reservation", "row": res_keys[int(row["reservation_id"])]}
        if t == "audit_log" and row["entity_id"] is not None:
            obj["entity_id"] = {"$ref": "reservation", "row": res_keys[int(row["entity_id"])]}
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    res_keys = {r["reservation_id"]: key("reservation", r, {}) for r in state["reservation"]}
    digests = {}
    for t in sorted(state):
        if state[t]:
            keys = sorted(key(t, r, res_keys) for r in state[t])
            digests[t] = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    blob = json.dumps(digests, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


@pytest.mark.parametrize("rec", load_tasks("airline"), ids=lambda r: r["id"])
def test_stored_airline_target_hashes_match_a_hand_written_canonical_form(rec):
    gt = rec["task"]["ground_truth"]
    assert gt["target_state_ref"] == _hand_hash(gt["target_state"])


def test_canonical_fast_path_equals_snapshot_path():
    for rec in load_tasks("airline") + load_tasks("clinic"):
        env = load_env(rec["env"])
        keys = env.state_keys()
        try:
            for a in rec["task"]["ground_truth"]["actions"] + [{"name": "update_customer", "arguments": {"user_id": "x"}}]:
                env.call(a["name"], a["arguments"])
                snap = env.snapshot()
                assert env.state_hash() == state_hash(snap, keys)
                fast = {t: sorted(tc.keys) for t, tc in env.canonical().items()}
                from toolkit.scoring.state import CanonicalState

                cs = CanonicalState(snap, keys)
                assert fast == {t: sorted(cs.table(t).keys) for t in snap}
        finally:
            env.close()


def test_keys_json_roundtrip_is_stable():
    k = StateKeys(["a"], {"t": {"id"}}, {})
    assert k.with_exclude(["t.x"]).to_json()["technical"] == {"t": ["id", "x"]}


def test_incremental_canonical_matches_snapshot_on_random_calls():
    """The incremental canonical form (write sets, per-content cache, kept reset state) always
    equals the canonical form of a fresh snapshot, across successful, refused and invalid calls."""
    import random

    from toolkit.scoring.state import CanonicalState

    rng = random.Random(3)
    calls = [a for rec in load_tasks("airline") for a in rec["task"]["ground_truth"]["actions"]]
    calls += [{"name": "insert_payment", "arguments": {"reservation_id": 1009, "payment_id": "gift_card_1180",
                                                       "purpose": "booking", "amount": 40}},
              {"name": "update_customer", "arguments": {"user_id": "mia_li_3668", "membership": "regular"}},
              {"name": "update_reservation", "arguments": {"reservation_id": 1003, "status": "cancelled"}},
              {"name": "query_flight", "arguments": {"status": "available"}},
              {"name": "no_such_tool", "arguments": {}}]
    env = load_env({"backend": "sqlite", "id": "airline"})
    keys = env.state_keys()
    try:
        for step in range(150):
            if rng.random() < 0.15:
                env.reset()
            a = rng.choice(calls)
            env.call(a["name"], a["arguments"])
            if rng.random() < 0.7:
                snap = env.snapshot()
                cs = CanonicalState(snap, keys)
                assert {t: sorted(tc.keys) for t, tc in env.canonical().items()} == \
                       {t: sorted(cs.table(t).keys) for t in snap}, step
                assert env.state_hash() == state_hash(snap, keys)
    finally:
        env.close()


def test_records_hashed_by_older_versions_still_verify():
    """state_ref / target_state_ref written before the one canonical form (stored in the bundled
    tasks.jsonl of the previous commit) are still accepted."""
    import asyncio

    from toolkit.scoring.state import legacy_state_hash
    from toolkit.schema import Record
    from toolkit.stages.verify import build

    rec = load_tasks("airline")[0]
    env = load_env(rec["env"])
    try:
        legacy_init = legacy_state_hash(env.snapshot())
    finally:
        env.close()
    gt = rec["task"]["ground_truth"]
    # the values the bundled task carried before this change
    assert legacy_init == "sha256:7f3ce90386ddcfed6e645c3c3c53fc9d68f296f138b62de33d91fdc880a79ca8"
    old = json.loads(json.dumps(rec))
    old["env"]["state_ref"] = legacy_init
    old["task"]["ground_truth"]["target_state_ref"] = legacy_state_hash(gt["target_state"])
    assert legacy_state_hash(gt["target_state"]) == \
        "sha256:9cc00fc56949cae41443b177784d68d9c40dbba8c80af2868ff09018a7241a78"
    old["trajectories"] = [{"id": "t", "messages": [{"role": "user", "content": "x"}]}]
    out = asyncio.run(build({"strategy": ["state_diff"]}, None)(Record.model_validate(old)))
    assert out.trajectories[0].scores["state_diff"]["delta0"] > 0


TREE = {
    "name": "tree",
    "schema": ("CREATE TABLE node (node_id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES node(node_id), "
               "label TEXT NOT NULL);\n"
               "CREATE TABLE tag (tag_id INTEGER PRIMARY KEY, node_id INTEGER REFERENCES node(node_id), t TEXT);\n"),
    "seed": {"node": [], "tag": []},
}


def test_reference_cycles_are_order_independent():
    """A self-reference (parent_id) is on a cycle: not resolved, and the canonical form is the same
    whichever table is computed first (dict path, env path)."""
    from toolkit.scoring.state import CanonicalState

    env = SqliteEnvironment.from_spec(TREE)
    try:
        for label, parent in (("root", None), ("a", 1), ("b", 1)):
            args = {"label": label} if parent is None else {"label": label, "parent_id": parent}
            assert env.call("insert_node", args).ok
        assert env.call("insert_tag", {"node_id": 2, "t": "x"}).ok
        keys = env.state_keys()
        assert ("node", next(iter(keys.refs["node"]))) in keys.cyclic and not any(t == "tag" for t, _ in keys.cyclic)
        snap = env.snapshot()
        one = CanonicalState(snap, keys)
        first_tag = sorted(one.table("tag").keys), sorted(one.table("node").keys)
        two = CanonicalState(snap, keys)
        node_keys = sorted(two.table("node").keys)
        first_node = sorted(two.table("tag").keys), node_keys
        assert first_tag == first_node
        assert env.state_hash() == state_hash(snap, keys)
        # the tag still points at node "a" by content
        ref = json.loads(first_tag[0][0])["node_id"]
        assert json.loads(ref["row"]) == {"label": "a", "parent_id": {"$ref": "node"}}
    finally:
        env.close()


def test_row_memo_gives_the_canonical_form_of_no_memo():
    """CanonicalState's optional row memo (shared across states) returns exactly the row keys
    computed without it: a referencing row whose referenced row changed gets a new key, and equal
    cells of another type (1 / 1.0 / True) give the same key as computed from scratch."""
    import copy

    from toolkit.scoring.state import CanonicalState

    env = load_env({"backend": "sqlite", "id": "airline"})
    try:
        keys = env.state_keys()
        a = env.snapshot()
    finally:
        env.close()
    pay = a["payment"][0]
    res = next(r for r in a["reservation"] if r["reservation_id"] == pay["reservation_id"])
    b = copy.deepcopy(a)
    rb = next(r for r in b["reservation"] if r["reservation_id"] == pay["reservation_id"])
    rb["passenger_count"] = res["passenger_count"] + 1  # the payment's reservation changes
    c = copy.deepcopy(a)
    c["reservation"] = [dict(r, passenger_count=float(r["passenger_count"])) for r in c["reservation"]]
    memo: dict = {}
    for st in (a, b, c, a, b):
        plain = CanonicalState(st, keys)
        memoed = CanonicalState(st, keys, memo)
        for t in st:
            assert memoed.table(t).keys == plain.table(t).keys, t
    assert memo  # the memo was used
    pa = CanonicalState(a, keys, memo).table("payment").keys
    pb = CanonicalState(b, keys, memo).table("payment").keys
    assert pa != pb  # the reference resolves to the changed reservation's key
    assert CanonicalState(c, keys, memo).table("reservation").keys == CanonicalState(a, keys).table("reservation").keys
