"""The sqlite backend: tool generation, queries, transactions, error mapping, hostile inputs, reset."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import yaml

from toolkit.envs import backends, load_env
from toolkit.envs.sqlite import (
    MAX_QUERY_LIMIT,
    MAX_STRING,
    DomainError,
    SqliteEnvironment,
    parse_trigger,
)

TINY = {
    "name": "tiny",
    "description": "a shop with one policy rule",
    "policy": "# Shop\n- **[stock_positive]** An order needs enough stock;\n  check the item first.\n",
    "schema": """
CREATE TABLE item ( -- items for sale
  item_id INTEGER PRIMARY KEY,
  sku TEXT NOT NULL UNIQUE, -- stock keeping unit
  stock INTEGER NOT NULL CHECK (stock >= 0),
  price REAL NOT NULL DEFAULT 1.0,
  color TEXT CHECK (color IN ('red', 'blue')),
  active BOOLEAN NOT NULL DEFAULT 1
);
CREATE TABLE purchase ( -- orders
  purchase_id INTEGER PRIMARY KEY,
  item_id INTEGER NOT NULL REFERENCES item(item_id),
  qty INTEGER NOT NULL,
  note TEXT
);
CREATE TABLE log (log_id INTEGER PRIMARY KEY, msg TEXT);
CREATE TABLE pair (a TEXT NOT NULL, b INTEGER NOT NULL, v TEXT, PRIMARY KEY (a, b));
CREATE TABLE nokey (x TEXT);
CREATE TRIGGER purchase_rules BEFORE INSERT ON purchase BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: stock_positive: not enough stock for this order')
  WHERE (SELECT stock FROM item WHERE item_id = NEW.item_id) < NEW.qty;
  SELECT RAISE(ABORT, 'Custom message without the format') WHERE NEW.note = 'custom';
END;
CREATE TRIGGER purchase_after AFTER INSERT ON purchase BEGIN
  -- stock goes down and a log line is written
  UPDATE item SET stock = stock - NEW.qty WHERE item_id = NEW.item_id;
  INSERT INTO log (msg) VALUES ('sold ' || NEW.qty);
  SELECT RAISE(FAIL, 'POLICY_VIOLATION: late_check: rejected after side effects') WHERE NEW.note = 'fail';
  SELECT RAISE(ROLLBACK, 'POLICY_VIOLATION: late_rollback: rolled back') WHERE NEW.note = 'rollback';
  INSERT INTO item (sku, stock) SELECT NULL, 1 WHERE NEW.note = 'null';
END;
""",
    "seed": {"item": [{"item_id": 1, "sku": "A", "stock": 5, "color": "red"},
                      {"item_id": 2, "sku": "B", "stock": 0, "active": False},
                      {"item_id": 3, "sku": "C'; DROP TABLE item; --", "stock": 7, "price": 2.5}],
             "pair": [{"a": "x", "b": 1, "v": "one"}]},
    "tools": {"hide": ["update_log"], "readonly": ["item.price"],
              "tools": {"insert_log": {"hidden": True},
                        "query_item": {"side": "both"},
                        "query_log": {"description": "Read the journal."},
                        "insert_purchase": {"description_append": "Extra note."}}},
    "exclude_keys": ["log_id"],
}


@pytest.fixture(scope="module")
def tiny_dom():
    return SqliteEnvironment.from_spec(TINY).domain


@pytest.fixture
def tiny(tiny_dom):
    env = SqliteEnvironment(tiny_dom)
    yield env
    env.close()


@pytest.fixture
def air():
    env = load_env({"backend": "sqlite", "id": "airline"})
    yield env
    env.close()


def master(env):
    return env.schema_sql()


# ---------------------------------------------------------------------------------------------
# loading


def test_registered_and_refs(tmp_path):
    assert "sqlite" in backends()
    env = load_env({"backend": "sqlite", "id": "clinic"})
    assert env.backend == "sqlite" and env.name == "clinic"
    # single YAML / JSON file with the same keys
    y = tmp_path / "tiny.yaml"
    y.write_text(yaml.safe_dump(TINY))
    j = tmp_path / "tiny.json"
    j.write_text(json.dumps(TINY))
    ey = load_env({"backend": "sqlite", "path": str(y)})
    ej = load_env({"backend": "sqlite", "path": str(j)})
    assert ey.state_hash() == ej.state_hash()
    assert ey.tool_names() == ej.tool_names()
    # directory layout
    d = tmp_path / "shop"
    d.mkdir()
    (d / "schema.sql").write_text(TINY["schema"])
    (d / "policy.md").write_text(TINY["policy"])
    (d / "seed.json").write_text(json.dumps(TINY["seed"]))
    (d / "tools.yaml").write_text(yaml.safe_dump(TINY["tools"]))
    (d / "domain.yaml").write_text(yaml.safe_dump({"name": "shop", "exclude_keys": ["log_id"]}))
    ed = load_env({"backend": "sqlite", "path": str(d)})
    assert ed.name == "shop" and ed.state_hash() == ey.state_hash() and "log_id" in ed.exclude_keys
    # pydantic EnvRef works too
    from toolkit.schema import EnvRef

    assert load_env(EnvRef(backend="sqlite", id="airline")).name == "airline"
    with pytest.raises(DomainError):
        load_env({"backend": "sqlite", "id": "nope"})
    with pytest.raises(DomainError):
        load_env({"backend": "sqlite", "path": str(tmp_path / "missing")})
    with pytest.raises(DomainError):
        load_env({"backend": "sqlite"})
    for e in (env, ey, ej, ed):
        e.close()


@pytest.mark.parametrize("bad,msg", [
    ({"schema": "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT"}, "does not compile"),
    ({"schema": "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT);", "seed": "INSERT INTO nope VALUES (1);"}, "seed"),
    ({"schema": "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT);", "seed": {"t": [{"zzz": 1}]}}, "unknown columns"),
    ({"schema": "CREATE TABLE t (a INTEGER PRIMARY KEY, \"limit\" INTEGER);"}, "reserved"),
    ({"schema": "CREATE TABLE t (a INTEGER PRIMARY KEY);", "tools": {"tools": {"query_zzz": {}}}}, "unknown tool"),
    ({"schema": "CREATE TABLE t (a INTEGER PRIMARY KEY);", "tools": {"readonly": ["t.zzz"]}}, "readonly"),
    ({"schema": "CREATE TABLE p (id INTEGER PRIMARY KEY); CREATE TABLE c (id INTEGER PRIMARY KEY, p INTEGER REFERENCES p(id));",
      "seed": {"c": [{"id": 1, "p": 9}]}}, "foreign-key"),
    ({"schema": ""}, "schema"),
])
def test_domain_errors(bad, msg):
    with pytest.raises(DomainError, match=msg):
        SqliteEnvironment.from_spec(bad)


def test_initial_state_validation(tiny_dom):
    with pytest.raises(DomainError, match="unknown table"):
        SqliteEnvironment(tiny_dom, state={"zzz": []})
    with pytest.raises(DomainError, match="foreign-key"):
        SqliteEnvironment(tiny_dom, state={"purchase": [{"purchase_id": 1, "item_id": 9, "qty": 1}]})
    with pytest.raises(DomainError, match="non-scalar"):
        SqliteEnvironment(tiny_dom, state={"log": [{"log_id": 1, "msg": {"x": 1}}]})


def test_initial_state_rows_in_batches_keep_order_and_name_the_refused_row(tiny_dom):
    """Rows go in as batches of the same columns: a mixed state loads exactly (order, defaults,
    empty rows, booleans), and a refused row deep in a batch is named, with the first error first."""
    items = [{"item_id": i, "sku": f"s{i}", "stock": i} for i in range(1, 6)]
    items.append({"sku": "auto", "stock": 7, "price": 2.5, "active": False})  # no key: rowid 6
    items.append({"item_id": 9, "stock": 0, "sku": "z", "color": "red"})  # another column order
    st = {"item": items, "log": [{}, {}, {"msg": "x"}]}
    env = SqliteEnvironment(tiny_dom, state=st)
    try:
        snap = env.snapshot()
        assert [r["sku"] for r in snap["item"]] == ["s1", "s2", "s3", "s4", "s5", "auto", "z"]
        auto = next(r for r in snap["item"] if r["sku"] == "auto")
        assert auto["item_id"] == 6 and auto["price"] == 2.5 and auto["active"] in (0, False)
        assert [r["msg"] for r in snap["log"]] == [None, None, "x"] and [r["log_id"] for r in snap["log"]] == [1, 2, 3]
    finally:
        env.close()
    dup = [{"item_id": i, "sku": "same" if i in (2, 4) else f"s{i}", "stock": 1} for i in range(1, 7)]
    with pytest.raises(DomainError, match=r"item\[3\] rejected: UNIQUE"):
        SqliteEnvironment(tiny_dom, state={"item": dup})
    neg = [{"item_id": i, "sku": f"s{i}", "stock": -1 if i == 5 else 1} for i in range(1, 8)]
    with pytest.raises(DomainError, match=r"item\[4\] rejected: CHECK"):
        SqliteEnvironment(tiny_dom, state={"item": neg})
    # a refusal before a malformed row is the error reported (rows are taken in order)
    first = [{"item_id": 1, "sku": "a", "stock": 1}, {"item_id": 2, "sku": "a", "stock": 1},
             {"item_id": 3, "sku": "c", "stock": {"x": 1}}]
    with pytest.raises(DomainError, match=r"item\[1\] rejected: UNIQUE"):
        SqliteEnvironment(tiny_dom, state={"item": first})
    with pytest.raises(DomainError, match=r"item\[1\] has a non-scalar"):
        SqliteEnvironment(tiny_dom, state={"item": first[:1] + first[2:]})


# ---------------------------------------------------------------------------------------------
# tools


def test_tool_generation(tiny):
    names = tiny.tool_names()
    assert "query_item" in names and "insert_item" in names and "update_item" in names
    assert "insert_log" not in names and "update_log" not in names and "query_log" in names
    assert "update_nokey" not in names  # no primary key -> no update tool
    assert not any(n.startswith("delete_") for n in names)
    assert tiny.tool_names("user") == ["query_item"]
    tools = {t["function"]["name"]: t["function"] for t in tiny.tools()}
    for f in tools.values():
        assert f["parameters"]["type"] == "object" and f["parameters"]["additionalProperties"] is False
    ins = tools["insert_item"]
    assert ins["parameters"]["required"] == ["sku", "stock"]
    assert "price" not in ins["parameters"]["properties"]  # readonly
    assert ins["parameters"]["properties"]["color"]["enum"] == ["red", "blue", None]
    assert ins["parameters"]["properties"]["active"]["type"] == "boolean"
    assert "stock keeping unit" in ins["parameters"]["properties"]["sku"]["description"]
    up = tools["update_pair"]
    assert up["parameters"]["required"] == ["a", "b"]
    d = tools["insert_purchase"]["description"]
    assert "Preconditions" in d and "[stock_positive] not enough stock" in d
    assert "[late_check]" in d and "Custom message without the format" in d
    assert "Side effects" in d and "stock goes down" in d and "updates item" in d and "inserts into log" in d
    assert d.endswith("Extra note.")
    assert tools["query_log"]["description"] == "Read the journal."
    q = tools["query_item"]["parameters"]["properties"]
    assert set(q) >= {"order_by", "order", "limit", "offset", "sku"}
    assert q["limit"]["maximum"] == MAX_QUERY_LIMIT
    # tools() hands out copies
    tiny.tools()[0]["function"]["name"] = "x"
    assert tiny.tools()[0]["function"]["name"] != "x"
    # policy hint joins continuation lines
    assert tiny.rules["stock_positive"]["hint"] == "An order needs enough stock; check the item first."


def test_parse_trigger_fields():
    t = parse_trigger("t1", "res", """CREATE TRIGGER t1 BEFORE UPDATE OF a, "b" ON res
        WHEN NEW.a <> OLD.a BEGIN
        -- it's a note with a quote
        SELECT RAISE(ABORT, 'POLICY_VIOLATION: r_1: can''t do: that') WHERE 1;
        UPDATE other SET x = 'INSERT INTO fake' WHERE 1;
        END""")
    assert (t.timing, t.event, t.columns) == ("BEFORE", "UPDATE", ["a", "b"])
    assert t.when == "NEW.a <> OLD.a"
    assert t.rules == [("r_1", "can't do: that")]
    assert t.writes == [("updates", "other")]
    assert t.notes == ["it's a note with a quote"]


# ---------------------------------------------------------------------------------------------
# queries


def test_query_filters_order_limit(air):
    q = lambda **a: air.call("query_flight_cabin", a)
    r = q(flight_id="HAT170-2024-05-20")
    assert r.ok and r.content["count"] == 3 and not r.content["truncated"]
    r = q(seats_available={"op": ">=", "value": 9}, order_by="seats_available", order="desc")
    assert [x["seats_available"] for x in r.content["rows"]] == [10, 9]
    r = q(cabin={"op": "in", "value": ["business"]}, price={"op": "<", "value": 400})
    assert sorted(x["flight_id"] for x in r.content["rows"]) == ["HAT201-2024-05-18", "HAT601-2024-05-19"]
    r = q(limit=2)
    assert r.content["count"] == 2 and r.content["truncated"]
    r2 = q(limit=2, offset=2)
    assert r2.content["rows"][0] != r.content["rows"][0]
    r = q(flight_id={"op": "like", "value": "HAT30%"}, cabin="economy")
    assert r.content["count"] == 2
    r = q(cabin={"op": "!=", "value": "economy"}, flight_id="HAT170-2024-05-20")
    assert {x["cabin"] for x in r.content["rows"]} == {"basic_economy", "business"}
    assert air.call("query_customer", {"date_of_birth": None}).content["count"] == 0
    assert air.call("query_payment_method", {"balance": None}).content["count"] == 6
    assert air.call("query_payment_method", {"balance": {"op": "!=", "value": None}}).content["count"] == 7
    assert air.call("query_payment_method", {"balance": 250.0}).content["rows"][0]["payment_id"] == "gift_card_7791"
    assert air.call("query_reservation", {"order": "desc", "limit": 1}).content["rows"][0]["reservation_id"] == 1008
    # args as a JSON string (as in OpenAI tool calls)
    assert air.call("query_customer", '{"user_id": "mia_li_3668"}').content["count"] == 1


def test_query_boolean_and_composite(tiny):
    assert tiny.call("query_item", {"active": False}).content["rows"][0]["sku"] == "B"
    r = tiny.call("update_pair", {"a": "x", "b": 1, "v": "uno"})
    assert r.ok and r.content == {"a": "x", "b": 1, "v": "uno"}
    assert tiny.call("update_pair", {"a": "x", "b": 2, "v": "dos"}).error["code"] == "NOT_FOUND"
    r = tiny.call("insert_pair", {"a": "y", "b": 2})
    assert r.ok and r.content == {"a": "y", "b": 2, "v": None}
    assert tiny.call("insert_nokey", {"x": "q"}).ok


# ---------------------------------------------------------------------------------------------
# writes, transactions, error mapping


def test_insert_returns_row_after_side_effects(tiny):
    r = tiny.call("insert_purchase", {"item_id": 1, "qty": 2})
    assert r.ok and r.content == {"purchase_id": 1, "item_id": 1, "qty": 2, "note": None}
    assert tiny.call("query_item", {"item_id": 1}).content["rows"][0]["stock"] == 3
    assert tiny.snapshot()["log"] == [{"log_id": 1, "msg": "sold 2"}]


@pytest.mark.parametrize("note,rule", [("fail", "late_check"), ("rollback", "late_rollback")])
def test_failed_write_after_side_effects_leaves_state_unchanged(tiny, note, rule):
    h = tiny.state_hash()
    r = tiny.call("insert_purchase", {"item_id": 1, "qty": 2, "note": note})
    assert r.error["code"] == "POLICY_VIOLATION" and r.error["violated_rule"] == rule
    assert tiny.state_hash() == h
    # the connection is still usable and not stuck in a transaction
    assert tiny.call("insert_purchase", {"item_id": 1, "qty": 1}).ok
    assert not tiny._conn.in_transaction


def test_error_codes(tiny, air):
    h = tiny.state_hash()
    r = tiny.call("insert_purchase", {"item_id": 1, "qty": 99})
    assert (r.error["code"], r.error["violated_rule"]) == ("POLICY_VIOLATION", "stock_positive")
    assert "enough stock" in r.error["hint"]
    r = tiny.call("insert_purchase", {"item_id": 1, "qty": 1, "note": "custom"})
    assert (r.error["code"], r.error["violated_rule"]) == ("POLICY_VIOLATION", "purchase_rules")
    r = tiny.call("insert_purchase", {"item_id": 42, "qty": 1})
    assert (r.error["code"], r.error["violated_rule"]) == ("CONSTRAINT", "FOREIGN KEY")
    assert "item.item_id" in r.error["hint"]
    r = tiny.call("insert_item", {"sku": "A", "stock": 1})
    assert (r.error["code"], r.error["violated_rule"]) == ("CONSTRAINT", "UNIQUE item.sku")
    r = tiny.call("insert_item", {"sku": "Z", "stock": -1})
    assert (r.error["code"], r.error["violated_rule"]) == ("CONSTRAINT", "CHECK stock >= 0")
    r = tiny.call("insert_purchase", {"item_id": 1, "qty": 1, "note": "null"})
    assert (r.error["code"], r.error["violated_rule"]) == ("CONSTRAINT", "NOT NULL item.sku")
    r = tiny.call("update_item", {"item_id": 99, "stock": 1})
    assert r.error["code"] == "NOT_FOUND"
    r = tiny.call("update_item", {"item_id": 1})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "nothing to change" in r.error["message"]
    r = tiny.call("update_item", {"stock": 1})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "primary key" in r.error["message"]
    r = tiny.call("insert_item", {"stock": 1})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "sku" in r.error["message"]
    r = tiny.call("insert_item", {"sku": "Q", "stock": 1, "price": 3})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "maintained automatically" in r.error["message"]
    r = tiny.call("insert_item", {"sku": "Q", "stock": 1, "color": "green"})
    assert r.error["code"] == "INVALID_ARGUMENTS" and "red, blue" in r.error["hint"]
    r = tiny.call("insert_log", {"msg": "x"})
    assert r.error["code"] == "UNKNOWN_TOOL"
    r = tiny.call("query_itme", {})
    assert r.error["code"] == "UNKNOWN_TOOL" and "query_item" in r.error["hint"]
    assert tiny.call("query_purchase", {}, side="user").error["code"] == "UNKNOWN_TOOL"
    assert tiny.state_hash() == h
    for res in (r, air.call("nope", {})):
        assert json.loads(res.to_content())["error"]["code"] == "UNKNOWN_TOOL"


# ---------------------------------------------------------------------------------------------
# hostile inputs: structured errors, schema unchanged, never a crash

INJECT = ["'; DROP TABLE reservation; --", "\" OR 1=1 --", "Robert'); DROP TABLE customer;--",
          "1; DELETE FROM payment", "x' UNION SELECT sql FROM sqlite_master --", "\x00", "\ud800"]


def test_hostile_values_in_filters_are_plain_data(air):
    schema0, h0 = master(air), air.state_hash()
    for s in INJECT:
        r = air.call("query_reservation", {"user_id": s})
        assert (r.ok and r.content["count"] == 0) or r.error["code"] == "INVALID_ARGUMENTS"
        r = air.call("query_customer", {"email": {"op": "like", "value": s}})
        assert r.ok or r.error["code"] == "INVALID_ARGUMENTS"
        r = air.call("update_customer", {"user_id": s, "email": "a@b.co"})
        assert not r.ok and r.error["code"] in ("NOT_FOUND", "INVALID_ARGUMENTS")
    assert master(air) == schema0 and air.state_hash() == h0


def test_hostile_values_are_stored_literally(tiny):
    schema0 = master(tiny)
    for i, s in enumerate(INJECT[:5]):
        r = tiny.call("insert_item", {"sku": s, "stock": 1})
        if s == TINY["seed"]["item"][2]["sku"]:
            assert r.error["code"] == "CONSTRAINT"
            continue
        assert r.ok and r.content["sku"] == s
        assert tiny.call("query_item", {"sku": s}).content["rows"][0]["sku"] == s
    r = tiny.call("insert_item", {"sku": "\ud800", "stock": 1})
    assert r.error["code"] == "INVALID_ARGUMENTS"
    assert master(tiny) == schema0
    assert {"item", "purchase", "log", "pair", "nokey"} <= set(tiny.snapshot())


HOSTILE_ARGS = [
    {"status; DROP TABLE reservation; --": "x"},
    {"\"status\"": "active"},
    {"1=1) OR (1": 1},
    {"reservation_id": 1001, "status = 'cancelled' WHERE 1=1; --": "x"},
    {"reservation_id": "1001; DROP TABLE payment"},
    {"reservation_id": 1001, "total_bags": "3"},
    {"reservation_id": 1001, "total_bags": 2.5},
    {"reservation_id": 1001, "total_bags": True},
    {"reservation_id": 1001, "total_bags": 2 ** 70},
    {"reservation_id": 1001, "total_bags": float("nan")},
    {"reservation_id": 1001, "total_bags": [1, 2]},
    {"reservation_id": 1001, "total_bags": {"op": "=", "value": 1}},
    {"reservation_id": 1001, "status": {"$ne": None}},
    {"reservation_id": 1001, "status": None},
    {"reservation_id": 1001, "cabin": "x" * 1_000_000},
    {"reservation_id": 1001, "cabin": "first'; DROP TABLE reservation; --"},
    {"reservation_id": None, "status": "cancelled"},
    {"x" * 1_000_000: 1},
]


@pytest.mark.parametrize("args", HOSTILE_ARGS, ids=range(len(HOSTILE_ARGS)))
def test_hostile_update_arguments(air, args):
    schema0, h0 = master(air), air.state_hash()
    r = air.call("update_reservation", args)
    assert not r.ok and r.error["code"] == "INVALID_ARGUMENTS", r.error
    assert len(r.error["message"]) < 1000 and len(r.error["hint"] or "") < 2000
    assert master(air) == schema0 and air.state_hash() == h0


QUERY_HOSTILE = [
    {"order_by": "reservation_id; DROP TABLE reservation"},
    {"order_by": "reservation_id", "order": "desc; DROP TABLE x"},
    {"order_by": ["status"]},
    {"limit": "10; DROP TABLE x"}, {"limit": -1}, {"limit": 10 ** 9}, {"limit": True}, {"limit": 2.5},
    {"offset": -5}, {"offset": "0"},
    {"status": {"op": "; DROP TABLE x", "value": 1}},
    {"status": {"op": "=", "value": {"nested": [1, {"deeper": 2}]}}},
    {"status": {"op": "in", "value": "active"}},
    {"status": {"op": "in", "value": list(range(1000))}},
    {"status": {"op": "in", "value": []}},
    {"status": {"op": ">", "value": None}},
    {"status": {"op": "=", "value": 1, "extra": 2}},
    {"status": {"op": "like", "value": 5}},
    {"passenger_count": "1 OR 1=1"},
    {"sqlite_master": 1},
    {"rowid": 1},
]


@pytest.mark.parametrize("args", QUERY_HOSTILE, ids=range(len(QUERY_HOSTILE)))
def test_hostile_query_arguments(air, args):
    schema0 = master(air)
    r = air.call("query_reservation", args)
    assert not r.ok and r.error["code"] == "INVALID_ARGUMENTS", (args, r)
    assert master(air) == schema0


def test_hostile_tool_names_and_arg_containers(air):
    schema0 = master(air)
    for name in ["query_reservation; DROP TABLE reservation", "x" * 1_000_000, "", None, 42, "delete_reservation",
                 "insert_audit_log", "update_flight_cabin", "query_sqlite_master"]:
        r = air.call(name, {})
        assert r.error["code"] == "UNKNOWN_TOOL" and len(r.error["message"]) < 500
    for args in ([1, 2], "not json", "[1]", 5, "{" * 10000, b"bytes"):
        r = air.call("query_reservation", args)
        assert r.error["code"] == "INVALID_ARGUMENTS", (args, r)
    assert air.call("query_reservation", None).ok
    assert air.call("query_reservation", {"cabin": "x" * (MAX_STRING + 1)}).error["code"] == "INVALID_ARGUMENTS"
    assert master(air) == schema0


def test_fuzz_never_crashes(air):
    rng = random.Random(7)
    names = air.tool_names() + ["nope", "insert_audit_log"]
    cols = ["reservation_id", "user_id", "status", "total_bags", "cabin", "payment_id", "amount", "email",
            "order_by", "limit", "'; DROP TABLE x; --", "purpose", "flight_id", "offset", "order"]
    vals = [None, 0, 1, -1, 1001, 2 ** 63, 1.5, float("inf"), "", "active", "cancelled", "1001", "'; DROP TABLE payment; --",
            "%", [1], {"op": "=", "value": "active"}, {"op": "in", "value": [1001, 1002]}, True, "x" * 20_000,
            "mia_li_3668", "gift_card_7791", "baggage", 50]
    schema0 = master(air)
    for i in range(400):
        if i % 50 == 0:
            air.reset()
        args = {rng.choice(cols): rng.choice(vals) for _ in range(rng.randint(0, 4))}
        h = air.state_hash()
        r = air.call(rng.choice(names), args)
        assert set(r.error or {}) <= {"code", "message", "violated_rule", "hint"}
        if not r.ok:
            assert r.error["code"] in {"POLICY_VIOLATION", "CONSTRAINT", "NOT_FOUND", "INVALID_ARGUMENTS", "UNKNOWN_TOOL"}, r.error
            assert air.state_hash() == h
        json.loads(r.to_content()) if not r.ok else None
    assert master(air) == schema0


# ---------------------------------------------------------------------------------------------
# state: reset, inline states, independence, diff


def test_reset_and_states(air):
    h0 = air.state_hash()
    assert air.initial_state_hash() == h0
    s0 = air.snapshot()
    assert air.call("update_reservation", {"reservation_id": 1003, "status": "cancelled"}).ok
    s1 = air.snapshot()
    assert air.state_hash() != h0
    air.reset()
    assert air.state_hash() == h0
    air.reset(s1)  # snapshot -> state round trip
    assert air.state_hash() == air.hash_state(s1)
    assert air.diff(s1)["total"] == 0
    air.reset()
    d = air.diff(s0, s1)
    # reservation 2, flight_cabin 2, payment_method 2 (certificate refunded), audit_log 3 new rows,
    # payment: the 2 refunds + the 2 charges of 1003, which reference the (changed) reservation
    # by content, on both sides (2 + 4)
    assert d["total"] == 15 and d["tables"]["payment"] == {"only_a": 2, "only_b": 4}
    assert air.diff(s0, s1)["tables"]["audit_log"] == {"only_a": 0, "only_b": 3}
    # inline initial state in the ref replaces the seed
    small = {"clock": [{"clock_id": 1, "today": "2024-05-15"}],
             "customer": [{"user_id": "u1", "first_name": "A", "last_name": "B", "email": "a@b.co", "membership": "gold"}]}
    e2 = load_env({"backend": "sqlite", "id": "airline", "state": small, "config": {"exclude_keys": ["email"]}})
    try:
        snap = e2.snapshot()
        assert snap["customer"][0]["user_id"] == "u1" and snap["reservation"] == []
        assert "email" in e2.exclude_keys and "log_id" in e2.exclude_keys
        assert e2.initial_state_hash() == e2.hash_state(snap)
        assert e2.call("update_customer", {"user_id": "u1", "email": "z@y.co"}).ok
        assert e2.diff(snap)["total"] == 0  # email excluded by config
        e2.reset()
        assert e2.state_hash() == e2.hash_state(snap)
        # triggers are active after an inline state load
        r = e2.call("update_customer", {"user_id": "u1", "membership": "regular"})
        assert r.error["violated_rule"] == "membership_fixed"
    finally:
        e2.close()


def test_two_envs_are_independent():
    ref = {"backend": "sqlite", "id": "airline"}
    a, b = load_env(ref), load_env(ref)
    try:
        assert a.call("update_reservation", {"reservation_id": 1003, "status": "cancelled"}).ok
        assert a.state_hash() != b.state_hash()
        assert b.call("query_reservation", {"reservation_id": 1003}).content["rows"][0]["status"] == "active"
        b.reset()
        assert a.call("query_reservation", {"reservation_id": 1003}).content["rows"][0]["status"] == "cancelled"
    finally:
        a.close()
        b.close()


def test_acall_and_config_hide():
    env = load_env({"backend": "sqlite", "id": "airline", "config": {"hide": ["insert_*"]}})
    try:
        assert not any(n.startswith("insert_") for n in env.tool_names())
        assert env.call("insert_payment", {}).error["code"] == "UNKNOWN_TOOL"
        r = asyncio.run(env.acall("query_customer", {"user_id": "mia_li_3668"}))
        assert r.ok and r.content["count"] == 1
    finally:
        env.close()


def test_authorizer_blocks_ddl_on_env_connection(air):
    import sqlite3

    with pytest.raises(sqlite3.DatabaseError):
        air._conn.execute("DROP TABLE reservation")
    with pytest.raises(sqlite3.DatabaseError):
        air._conn.execute("ATTACH DATABASE ':memory:' AS x")
    air.reset()  # deserialize still works with the authorizer installed
    assert air.call("query_reservation", {"limit": 1}).ok


def test_cached_state_hash_tracks_every_change():
    """state_hash() is cached; it must always equal the hash of a fresh snapshot."""
    from toolkit.domains import load_tasks
    from toolkit.scoring.state import state_hash

    for rec in load_tasks("airline"):
        env = load_env(rec["env"])

        def fresh_hash(snap, env=env):
            return state_hash(snap, env.state_keys())
        seen = [env.state_hash()]
        assert seen[0] == fresh_hash(env.snapshot())
        for a in rec["task"]["ground_truth"]["actions"]:
            env.call(a["name"], a["arguments"])
            assert env.state_hash() == fresh_hash(env.snapshot())
        env.call("update_customer", {"user_id": "no-such-user", "name": "x"})  # failed write
        assert env.state_hash() == fresh_hash(env.snapshot())
        env.reset()
        assert env.state_hash() == seen[0]
        env.close()


def test_restored_checkpoint_reuses_its_canonical_form_and_still_tracks_changes():
    """restore(cp) of a checkpoint taken while the hash was known reuses the canonical form
    (nothing re-read); the hash after restoring, and after writes made on the restored state,
    must still equal the hash of a fresh snapshot, for every checkpoint restored in any order."""
    from toolkit.domains import load_tasks
    from toolkit.scoring.state import state_hash

    rec = next(iter(load_tasks("airline")))
    env = load_env(rec["env"])

    def fresh():
        return state_hash(env.snapshot(), env.state_keys())

    h0 = env.state_hash()
    cps = [(env.checkpoint(), h0)]
    for a in rec["task"]["ground_truth"]["actions"]:
        env.call(a["name"], a["arguments"])
        env.state_hash()
        cps.append((env.checkpoint(), fresh()))
    assert len({h for _, h in cps}) > 1  # the path changes the state
    for cp, h in reversed(cps):
        env.restore(cp)
        assert env.state_hash() == h == fresh()
    # a write on a restored state is seen (the reused canonical form is not stale)
    env.restore(cps[0][0])
    a = rec["task"]["ground_truth"]["actions"][-1]
    env.call(a["name"], a["arguments"])
    assert env.state_hash() == fresh()
    # a checkpoint taken without a known hash: hashed after restore, then reused
    cp = env.checkpoint()
    env.restore(cps[0][0])
    env.restore(cp)
    assert env.state_hash() == fresh()
    env.restore(cps[0][0])
    assert env.state_hash() == h0
    env.restore(cp)
    assert env.state_hash() == fresh()
    env.close()


def test_package_split_keeps_the_module_surface_and_registration():
    """envs/sqlite.py became the package envs/sqlite/ (issue 18, one idea per file): every name the
    former module offered is still importable from `toolkit.envs.sqlite`, the backend is registered
    by importing the package (its registry entry still names that module), and no part of the
    package is over ~800 lines (the former file held 1,747)."""
    import importlib
    from pathlib import Path

    from toolkit import registry

    S = importlib.import_module("toolkit.envs.sqlite")
    former = ["MAX_STRING", "MAX_QUERY_LIMIT", "DEFAULT_QUERY_LIMIT", "MAX_OFFSET", "MAX_IN_ITEMS",
              "QUERY_CONTROL_PARAMS", "QUERY_OPS", "DomainError", "DomainSpec", "Column", "Table",
              "TriggerInfo", "ToolDef", "CompiledDomain", "load_domain_spec", "spec_from_dict",
              "parse_trigger", "qident", "state_keys_for", "compile_domain", "compiled_from_path",
              "SqliteEnvironment", "_split_comments"]
    assert [n for n in former if not hasattr(S, n)] == []
    assert sorted(S.__all__) == sorted(["MAX_QUERY_LIMIT", "MAX_STRING", "QUERY_OPS", "CompiledDomain", "DomainError",
                                        "DomainSpec", "SqliteEnvironment", "compile_domain", "load_domain_spec"])
    assert (S.MAX_STRING, S.MAX_QUERY_LIMIT, S.DEFAULT_QUERY_LIMIT) == (10_000, 200, 50)
    e = registry.lookup("backends", "sqlite")
    assert e is not None and e.module == "toolkit.envs.sqlite" and e.flow == "core"
    env = e.obj({"backend": "sqlite", "id": "airline"})
    try:
        assert isinstance(env, S.SqliteEnvironment) and env.domain.initial_hash == env.state_hash() != ""
    finally:
        env.close()
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in Path(S.__file__).parent.glob("*.py")}
    assert {"domain.py", "sqltext.py", "guard.py", "tools.py", "compiler.py", "runtime.py"} <= set(sizes)
    assert {n: k for n, k in sizes.items() if k > 800} == {}


def test_checkpoint_restore_and_snapshot_shortcuts_stay_exact():
    """restore() skipped and checkpoint() returning the loaded bytes while nothing was written,
    snapshot() reusing the rows canonical() read, snapshot_loadable() bytes reused by reset():
    after every step the environment's answers equal a direct read of its database."""
    import sqlite3

    from toolkit.domains import load_tasks
    from toolkit.scoring.state import state_hash

    def read(conn, dom):
        out = {}
        for t in dom.tables.values():
            order = ", ".join(f'"{k}"' for k in t.pk) if t.pk else "rowid"
            out[t.name] = [tuple(r) for r in conn.execute(f'SELECT * FROM "{t.name}" ORDER BY {order}')]
        return out

    def rows_of(snap):
        return {t: [tuple(r.values()) for r in rows] for t, rows in snap.items()}

    rng = random.Random(5)
    calls = [a for rec in load_tasks("airline") for a in rec["task"]["ground_truth"]["actions"]]
    calls += [{"name": "update_reservation", "arguments": {"reservation_id": 1003, "status": "cancelled"}},
              {"name": "update_customer", "arguments": {"user_id": "nobody", "membership": "gold"}}]
    env = load_env({"backend": "sqlite", "id": "airline"})
    dom = env.domain
    cps = [(env.checkpoint(), read(env._conn, dom))]
    try:
        for step in range(120):
            x = rng.random()
            if x < 0.45:
                a = rng.choice(calls)
                env.call(a["name"], a["arguments"])
            elif x < 0.65:
                cps.append((env.checkpoint(), read(env._conn, dom)))
            elif x < 0.9:
                cp, want = rng.choice(cps)
                env.restore(cp)
                if rng.random() < 0.5:
                    env.restore(cp)  # twice: the second is skipped
                assert read(env._conn, dom) == want, step
            else:
                st = env.snapshot_loadable()
                other = SqliteEnvironment(dom)
                try:
                    other.reset(st)
                    assert read(other._conn, dom) == read(env._conn, dom), step
                finally:
                    other.close()
            if rng.random() < 0.5:
                env.state_hash()  # canonical() current: the next snapshot reuses its rows
            live = read(env._conn, dom)
            snap = env.snapshot()
            assert rows_of(snap) == live, step
            assert env.state_hash() == state_hash(snap, env.state_keys()), step
            cp = env.checkpoint()
            plain = sqlite3.connect(":memory:")
            plain.deserialize(cp)
            assert read(plain, dom) == live, step
            plain.close()
    finally:
        env.close()
