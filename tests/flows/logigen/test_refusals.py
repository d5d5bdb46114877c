"""Refusals remembered by what the rule reads (refusals.failure_scopes, refusals.Refusals):
a call a rule refused is skipped on a state where the rule's tables hold the same rows and the
call passes the same values of the arguments the rule names. The scopes below were read off the
trigger SQL by hand; the memo is checked against real calls on real SQLite states."""

from __future__ import annotations

import random
from pathlib import Path

from toolkit.envs import load_env
from toolkit.envs.sqlite import SqliteEnvironment
from toolkit.flows.logigen.analysis import analyze
from toolkit.flows.logigen.explorer import Probe
from toolkit.flows.logigen.goals import GoalExplorer
from toolkit.flows.logigen.refusals import failure_scopes

DATA = Path(__file__).resolve().parents[2] / "data"

SCHEMA = """
CREATE TABLE settings (id INTEGER PRIMARY KEY, today TEXT NOT NULL);
CREATE TABLE member (member_id TEXT PRIMARY KEY, status TEXT NOT NULL, credit INTEGER NOT NULL);
CREATE TABLE item (item_id TEXT PRIMARY KEY, member_id TEXT NOT NULL REFERENCES member(member_id),
  qty INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'open', made TEXT);
CREATE TABLE log (log_id INTEGER PRIMARY KEY, member_id TEXT, note TEXT);
CREATE VIEW open_items AS SELECT * FROM item WHERE state = 'open';
CREATE TRIGGER item_ins BEFORE INSERT ON item BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: qty_cap: at most 5') WHERE NEW.qty > 5;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: member_active: active members only')
    WHERE (SELECT status FROM member WHERE member_id = NEW.member_id) <> 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: open_cap: at most 2 open items')
    WHERE (SELECT COUNT(*) FROM open_items WHERE member_id = NEW.member_id) >= 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: not_in_past: no date before today')
    WHERE NEW.made < date('now');
END;
CREATE TRIGGER item_upd BEFORE UPDATE ON item BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: closed_final: a closed item stays closed')
    WHERE OLD.state = 'closed';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: credit_needed: qty within credit')
    WHERE NEW.qty > (SELECT credit FROM member WHERE member_id = OLD.member_id);
END;
CREATE TRIGGER log_item AFTER INSERT ON item BEGIN
  UPDATE member SET credit = credit - NEW.qty WHERE member_id = NEW.member_id;
END;
CREATE TRIGGER item_after AFTER INSERT ON item BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: after_cap: credit spent')
    WHERE (SELECT credit FROM member WHERE member_id = NEW.member_id) < 1;
END;
CREATE TRIGGER item_requalify AFTER UPDATE OF qty ON item BEGIN
  UPDATE member SET credit = credit + OLD.qty - NEW.qty WHERE member_id = NEW.member_id;
END;
CREATE TRIGGER member_upd BEFORE UPDATE ON member BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_debt: credit cannot go below 0') WHERE NEW.credit < 0;
END;
"""
POLICY = "- [after_cap] s\n- [qty_cap] q\n- [member_active] a\n- [open_cap] o\n- [not_in_past] p\n- [closed_final] c\n" \
         "- [credit_needed] n\n- [no_debt] d\n"
SEED = {"settings": [{"id": 1, "today": "2026-01-01"}],
        "member": [{"member_id": "m1", "status": "active", "credit": 9},
                   {"member_id": "m2", "status": "frozen", "credit": 9}],
        "item": [{"item_id": "i1", "member_id": "m1", "qty": 1, "state": "closed", "made": None}]}


def _env():
    return SqliteEnvironment.from_spec({"name": "refusals", "schema": SCHEMA, "policy": POLICY, "seed": SEED})


def test_scopes_by_hand():
    env = _env()
    sc = failure_scopes(analyze(env), env.domain.tables, env.domain.tools)
    # arguments only; the member row by key; the rows of the row's own table and its key (UPDATE)
    assert sc[("insert_item", "qty_cap")] == ((), ("qty",))
    assert sc[("insert_item", "member_active")] == (("member",), ("member_id",))
    assert sc[("update_item", "closed_final")] == (("item",), ("item_id",))
    assert sc[("update_item", "credit_needed")] == (("item", "member"), ("item_id", "qty"))
    # a view (open_cap), a date('now') condition (not_in_past) and a rule reached only through
    # insert_item's AFTER trigger (no_debt: its NEW.credit comes from the item, not the member
    # table it guards) are never remembered
    assert ("insert_item", "open_cap") not in sc and ("insert_item", "not_in_past") not in sc
    assert ("insert_item", "no_debt") not in sc
    # update_item reaches no_debt (an UPDATE check) through its AFTER trigger: not on its table;
    # an AFTER check (after_cap) sees the member row the AFTER trigger before it changed
    assert ("update_item", "no_debt") not in sc and ("insert_item", "after_cap") not in sc
    # update_member reaches no_debt directly, BEFORE, on its own table
    assert sc[("update_member", "no_debt")] == (("member",), ("credit", "member_id"))


def test_a_before_trigger_that_writes_disables_its_table():
    env = SqliteEnvironment.from_spec({"name": "w", "policy": "- [cap] c", "schema": """
        CREATE TABLE t (id TEXT PRIMARY KEY, v INTEGER NOT NULL);
        CREATE TABLE audit (n INTEGER PRIMARY KEY, v INTEGER);
        CREATE TRIGGER t_ins BEFORE INSERT ON t BEGIN
          INSERT INTO audit (v) VALUES (NEW.v);
          SELECT RAISE(ABORT, 'POLICY_VIOLATION: cap: v at most (rows of audit)')
            WHERE NEW.v > (SELECT COUNT(*) FROM audit);
        END;"""})
    assert failure_scopes(analyze(env), env.domain.tables, env.domain.tools) == {}


def test_the_memo_follows_the_tables_and_arguments_the_rule_reads():
    env = _env()
    gx = GoalExplorer(env, env.snapshot(), 0)
    w = gx.walker
    big = Probe("insert_item", {"item_id": "x1", "member_id": "m1", "qty": 7}, "insert", "item")
    ids = w.env.table_ids()
    r = w.call(big.name, big.args)
    assert r.error["violated_rule"] == "qty_cap"
    gx.refusals.remember(big.name, big.args, "qty_cap", ids)
    # another fresh key, another member: qty_cap reads only NEW.qty
    other = Probe("insert_item", {"item_id": "x2", "member_id": "m2", "qty": 7}, "insert", "item")
    assert gx.refusals.known(other.name, other.args, ids) == "qty_cap"
    assert gx.refusals.known("insert_item", {**other.args, "qty": 5}, ids) is None
    frozen = Probe("insert_item", {"item_id": "x3", "member_id": "m2", "qty": 1}, "insert", "item")
    r = w.call(frozen.name, frozen.args)
    assert r.error["violated_rule"] == "member_active"
    gx.refusals.remember(frozen.name, frozen.args, "member_active", ids)
    assert gx.refusals.known("insert_item", {**frozen.args, "item_id": "x9"}, ids) == "member_active"
    # the member table changes (m1 inserts an item: the AFTER trigger spends credit): not known there
    assert w.call("insert_item", {"item_id": "ok1", "member_id": "m1", "qty": 1}).ok
    ids2 = w.env.table_ids()
    assert ids2["member"] != ids["member"] and ids2["settings"] == ids["settings"]
    assert gx.refusals.known(frozen.name, frozen.args, ids2) is None
    assert gx.refusals.known(other.name, other.args, ids2) == "qty_cap"  # reads no table
    # a refusal the memo may not keep (a view) is not remembered
    gx.refusals.remember(frozen.name, frozen.args, "open_cap", ids2)
    assert gx.refusals.known(frozen.name, frozen.args, ids2) is None


def _check_chains(env_ref: dict, n: int, seed: int) -> tuple[int, int]:
    """Draw goal chains with every remembered refusal checked by running the call it skips:
    (skips checked, skips whose call passed)."""
    env = load_env(env_ref)
    gx = GoalExplorer(env, env.snapshot(), seed)
    w = gx.walker
    seen = {"hits": 0, "passed": 0}
    known = gx.refusals.known

    def checked(name, args, ids):
        rule = known(name, args, ids)
        if rule is not None:
            seen["hits"] += 1
            cp = w.cp()
            r = w.call(name, args)
            if r.ok:
                seen["passed"] += 1
                w.restore(cp)
        return rule

    gx.refusals.known = checked
    for i in range(n):
        gx.chain(random.Random(f"{seed}:{i}"), gx.base, 3)
    env.close()
    return seen["hits"], seen["passed"]


def test_every_skipped_call_would_have_been_refused():
    for d in ("citypermits", "gym"):
        hits, passed = _check_chains({"backend": "sqlite", "path": str(DATA / d)}, 25, 3)
        assert hits > 20 and passed == 0, (d, hits, passed)
