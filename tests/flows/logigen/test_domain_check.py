"""The deterministic domain check (`toolkit domain check`): passes on sound domains with every rule
provoked by a real call, fails with a reason naming the culprit on broken copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.conftest import run_cmd

from toolkit.domains import domain_path
from toolkit.envs import load_env
from toolkit.flows.logigen.domain_check import check_domain, policy_rule_ids

LIBRARY = Path(__file__).resolve().parents[2] / "data" / "library"
DATA = Path(__file__).resolve().parents[2] / "data"


def _src(name: str) -> Path:
    return DATA / name if (DATA / name).is_dir() else domain_path(name)


# hotel, pharmacy, bank, university: written blind by engineers who never read the generator
@pytest.mark.parametrize("name", ["airline", "clinic", "library", "retail", "carrental", "hotel", "pharmacy",
                                  "bank", "university", "lending", "parking"])
def test_sound_domains_pass_with_every_rule_provoked(name):
    rep = check_domain(_src(name))
    assert rep.ok, rep.reasons
    d = rep.to_dict()
    json.dumps(d)
    policy = (_src(name) / "policy.md").read_text()
    assert set(d["rules"]) == set(policy_rule_ids(policy))
    env = load_env({"backend": "sqlite", "path": str(_src(name))})
    for rule, info in d["rules"].items():
        assert info["provoked"] and info["state_unchanged"] and info["hint_found"], (rule, info)
        if info["state"] != "initial" or info.get("setup"):
            continue
        # replay the reported call independently: the engine must refuse it for that rule
        env.reset()
        h = env.state_hash()
        call = info["call"]
        side = "agent" if call["name"] in env.tool_names("agent") else "user"
        res = env.call(call["name"], call["arguments"], side=side)
        assert not res.ok, (rule, call)
        if info["enforced_by"][0].startswith("trigger"):
            assert res.error["code"] == "POLICY_VIOLATION" and res.error["violated_rule"] == rule
        else:
            assert res.error["code"] == "CONSTRAINT" and rule in res.error["message"]
        assert env.state_hash() == h


def test_a_count_limit_is_provoked_from_one_below_it():
    """tests/data/parking: r_ana holds 2 of the 3 visitor permits a month allows (and no resident is
    at 3 of 3). The provoking call is the fourth, after the third is accepted: the search keeps
    an accepted call and repeats it, instead of dropping the valid third permit."""
    env = load_env({"backend": "sqlite", "path": str(DATA / "parking")})
    try:
        seed = env.snapshot()
        may = [p for p in seed["permits"] if p["permit_kind"] == "visitor" and p["permit_status"] == "active"
               and p["valid_from"].startswith("2025-05")]
        per = {r: sum(p["resident_id"] == r for p in may) for r in {p["resident_id"] for p in may}}
        assert max(per.values()) == 2  # nobody starts at the limit
        info = check_domain(DATA / "parking").to_dict()["rules"]["visitor_monthly_cap"]
        assert info["provoked"] and info["state"].startswith("after: insert_permits"), info
        setup, call = info["setup"], info["call"]
        assert len(setup) == 3 - per[call["arguments"]["resident_id"]]  # the accepted ones up to the limit
        env.reset()
        for c in setup:
            assert env.call(c["name"], dict(c["arguments"])).ok
        h = env.state_hash()
        res = env.call(call["name"], dict(call["arguments"]))
        assert not res.ok and res.error["violated_rule"] == "visitor_monthly_cap" and env.state_hash() == h
    finally:
        env.close()


def _copy(tmp_path: Path, name: str = "airline") -> Path:
    dst = tmp_path / name
    shutil.copytree(_src(name), dst)
    return dst


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_broken_trigger_condition_is_named(tmp_path):
    d = _copy(tmp_path)
    _edit(d / "schema.sql", "WHERE NEW.email NOT LIKE '%_@_%._%';", "WHERE NEW.email NOT LIKE '%';")
    rep = check_domain(d)
    assert not rep.ok
    assert rep.checks["provoked"]["ok"] is False
    assert any("'email_format' was not provoked" in r for r in rep.reasons)
    assert rep.rules["email_format"]["provoked"] is False
    assert rep.rules["membership_fixed"]["provoked"] is True  # the rest is unaffected


def test_trigger_that_does_not_compile(tmp_path):
    d = _copy(tmp_path, "library")
    _edit(d / "schema.sql", "WHERE NEW.renewals > 2", "WHERE NEW.renewals >> > 2")
    rep = check_domain(d)
    assert not rep.ok and list(rep.checks) == ["compile"]
    assert "schema does not compile" in rep.reasons[0]


def test_rule_missing_from_policy_is_named(tmp_path):
    d = _copy(tmp_path)
    _edit(d / "policy.md", "- **[membership_fixed]**", "- ")
    rep = check_domain(d)
    assert not rep.ok
    assert any("rules_in_policy" in r and "'membership_fixed'" in r for r in rep.reasons)


def test_policy_rule_without_enforcement_is_named(tmp_path):
    d = _copy(tmp_path, "library")
    _edit(d / "policy.md", "## Fines", "- **[quiet_hours]** No loans after 20:00.\n\n## Fines")
    rep = check_domain(d)
    assert any("policy_enforced" in r and "'quiet_hours'" in r for r in rep.reasons)


def test_nullable_text_key_is_named(tmp_path):
    d = _copy(tmp_path)
    _edit(d / "schema.sql", "user_id TEXT PRIMARY KEY NOT NULL,", "user_id TEXT PRIMARY KEY,")
    rep = check_domain(d)
    assert not rep.ok
    assert any("pk_not_null" in r and "customer.user_id" in r for r in rep.reasons)


def test_reference_table_write_and_sql_message_are_named(tmp_path):
    d = _copy(tmp_path, "library")
    _edit(d / "tools.yaml", '"*_tier_limit", ', "")
    _edit(d / "schema.sql", "'POLICY_VIOLATION: renewal_limit: a loan can be renewed at most 2 times'",
          "'POLICY_VIOLATION: renewal_limit: NEW.renewals > 2'")
    rep = check_domain(d)
    assert "update_tier_limit writes reference table tier_limit" in "\n".join(rep.warnings)
    assert rep.checks["reference_writes"]["ok"] is True  # a warning unless strict
    assert "'renewal_limit': the message 'NEW.renewals > 2' reads like SQL" in "\n".join(rep.reasons)
    strict = check_domain(d, strict=True)
    assert any("reference_writes" in r and "update_tier_limit" in r for r in strict.reasons)


def test_cli_exit_codes_and_streams(tmp_path):
    ok = run_cmd(["toolkit", "domain", "check", str(LIBRARY)])
    assert ok.returncode == 0, ok.stderr
    rep = json.loads(ok.stdout)
    assert rep["ok"] is True and rep["domain"] == "library"
    assert "PASS" in ok.stderr
    d = _copy(tmp_path, "library")
    _edit(d / "schema.sql", "member_id TEXT PRIMARY KEY NOT NULL,", "member_id TEXT PRIMARY KEY,")
    bad = run_cmd(["toolkit", "domain", "check", str(d)])
    assert bad.returncode == 1
    out = json.loads(bad.stdout)
    assert out["ok"] is False and any("member.member_id" in r for r in out["reasons"])
    assert "FAIL" in bad.stderr and "member.member_id" in bad.stderr
    missing = run_cmd(["toolkit", "domain", "check", str(tmp_path / "nope")])
    assert missing.returncode == 1 and "not found" in json.loads(missing.stdout)["reasons"][0]
    usage = run_cmd(["toolkit", "domain", "check"])
    assert usage.returncode == 2


def test_find_violating_call_one_step_from_a_state():
    from toolkit.flows.logigen.provoke import find_violating_call

    env = load_env({"backend": "sqlite", "path": str(LIBRARY)})
    hit = find_violating_call(env, "loan_limit")
    assert hit is not None and "setup" not in hit and hit["state_unchanged"]
    assert hit["call"]["name"] == "insert_loan" and hit["call"]["arguments"]["member_id"] == "M-1"
    # M-1 one loan below the limit (N-1): no single call violates it; a first loan is needed
    st = env.snapshot()
    st["loan"] = [r for r in st["loan"] if r["loan_id"] != 2]
    hit = find_violating_call(env, "loan_limit", st)
    assert hit is not None and hit["setup"][0]["name"] == "insert_loan"
    assert env.snapshot()["loan"] == st["loan"]  # left in the given state
    # nobody at the limit and no one below it by one: with renewals all at 0 the renewal rule is
    # still one call away (renewals 0 -> 3)
    assert find_violating_call(env, "renewal_limit", st)["call"]["name"] == "update_loan"
    with pytest.raises(KeyError):
        find_violating_call(env, "no_such_rule")


@pytest.mark.parametrize("schema", [
    # no primary key, WITHOUT ROWID composite key, untyped and BLOB columns, a CHECK-only policy
    "CREATE TABLE t (a, b BLOB, c TEXT CONSTRAINT c_short CHECK (length(c) < 5));",
    "CREATE TABLE k (x TEXT NOT NULL, y INTEGER NOT NULL, v INTEGER CONSTRAINT v_pos CHECK (v > 0), "
    "PRIMARY KEY (x, y)) WITHOUT ROWID;",
])
def test_odd_schemas_do_not_crash(schema):
    policy = "- **[c_short]** short\n- **[v_pos]** positive\n"
    seed = {"t": [{"a": 1, "b": None, "c": "ab"}]} if "TABLE t" in schema else {"k": [{"x": "a", "y": 1, "v": 2}]}
    rep = check_domain({"name": "odd", "schema": schema, "policy": policy, "seed": seed})
    assert not any("internal error" in r for r in rep.reasons), rep.reasons
    rule = "c_short" if "TABLE t" in schema else "v_pos"
    assert rep.rules[rule]["provoked"] is True, rep.rules[rule]


def test_rule_only_reachable_through_hidden_tools_is_provoked_with_a_warning(tmp_path):
    d = _copy(tmp_path, "library")
    _edit(d / "schema.sql", "CREATE TRIGGER loan_borrow_rules", """CREATE TRIGGER book_rules
BEFORE UPDATE OF copies_on_shelf ON book
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: shelf_limit: a title has at most 9 copies')
  WHERE NEW.copies_on_shelf > 9;
END;

CREATE TRIGGER loan_borrow_rules""")
    _edit(d / "policy.md", "## Fines", "- **[shelf_limit]** A title has at most 9 copies.\n\n## Fines")
    rep = check_domain(d)
    assert rep.ok, rep.reasons
    assert rep.rules["shelf_limit"]["via_hidden_tool"] is True
    assert rep.rules["shelf_limit"]["call"]["name"] == "update_book"
    assert any("'shelf_limit' is only reachable through hidden tools" in w for w in rep.warnings)


def test_rule_provoked_only_from_a_derived_state_is_a_warning(tmp_path):
    d = _copy(tmp_path, "library")
    _edit(d / "seed.yaml", "  - {loan_id: 3, member_id: M-2, book_id: B-3, renewals: 1, status: returned}\n", "")
    rep = check_domain(d)
    assert rep.ok, rep.reasons
    info = rep.rules["returned_is_final"]
    assert info["provoked"] and info["state"].startswith("derived: loan row") and "status='returned'" in info["state"]
    assert any("'returned_is_final' was provoked only from derived" in w for w in rep.warnings)


def test_insert_update_guard_finds_a_limit_checked_on_one_event_only():
    # clinic: quantity_limit (NEW.quantity > drug.max_quantity) guards INSERT on prescription only,
    # and update_prescription can set quantity: a warning, a failure with strict
    from toolkit.flows.logigen.domain_check import check_domain

    rep = check_domain("clinic")
    warn = [w for w in rep.warnings if w.startswith("insert_update_guard")]
    assert len(warn) == 1 and "quantity_limit" in warn[0] and "update_prescription" in warn[0]
    assert rep.ok
    strict = check_domain("clinic", strict=True)
    assert any("quantity_limit" in r for r in strict.reasons if r.startswith("insert_update_guard"))
    # library: renewal_limit is an UPDATE rule that reads OLD (a transition): no warning
    lib = check_domain(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "library"))
    assert not [w for w in lib.warnings if w.startswith("insert_update_guard")]


def test_a_key_made_of_references_pairs_real_rows():
    # university's enrollment is keyed by (student_id, section_id), both references: an insert
    # template keeps one from an existing row and takes another real value for the other, so
    # time_conflict (a real student's second section in the same slot) is reachable; with made-up
    # keys every template broke a foreign key and 3 of 12 rules were never provoked
    from toolkit.flows.logigen.analysis import analyze
    from toolkit.flows.logigen.provoke import ViolationSearch

    env = load_env({"backend": "sqlite", "path": str(DATA / "university")})
    vs = ViolationSearch(env.domain, analyze(env), env, 100)
    snap = env.snapshot()
    students = {r["student_id"] for r in snap["student"]}
    sections = {r["section_id"] for r in snap["section"]}
    taken = {(r["student_id"], r["section_id"]) for r in snap["enrollment"]}
    tmpls = vs.insert_templates("enrollment")
    assert tmpls
    keys = [(a["student_id"], a["section_id"]) for a in tmpls]
    assert all(s in students and c in sections for s, c in keys)
    assert not set(keys) & taken and len(set(keys)) == len(keys)


def test_a_count_cap_two_calls_away_is_provoked_when_the_repeat_needs_another_plate():
    """A resident at 1 of 3 permits a month: two accepted, the next refused. The same request
    repeated with a new key is first refused by another rule (the plate already holds a permit
    that month), so the repeat takes another plate; without that the search never gets past the
    other rule, and one setup call (the search's second call) is not enough (issue 34's permits
    example)."""
    from toolkit.envs.sqlite import SqliteEnvironment
    from toolkit.flows.logigen.provoke import find_violating_call

    spec = {
        "name": "permits",
        "schema": """
CREATE TABLE resident (resident_id TEXT PRIMARY KEY NOT NULL);
CREATE TABLE permit (
  permit_id TEXT PRIMARY KEY NOT NULL,
  resident_id TEXT NOT NULL REFERENCES resident(resident_id),
  plate TEXT NOT NULL,
  month TEXT NOT NULL
);
CREATE TRIGGER permit_rules BEFORE INSERT ON permit BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_per_plate: a plate holds one permit a month')
  WHERE EXISTS (SELECT 1 FROM permit p WHERE p.plate = NEW.plate AND p.month = NEW.month);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: monthly_cap: at most 3 permits per resident a month')
  WHERE (SELECT COUNT(*) FROM permit p WHERE p.resident_id = NEW.resident_id AND p.month = NEW.month) >= 3;
END;
""",
        "policy": "- **[one_per_plate]** one permit per plate a month\n- **[monthly_cap]** at most 3 a month\n",
        "seed": {"resident": [{"resident_id": "R-1"}, {"resident_id": "R-2"}],
                 "permit": [{"permit_id": "P-001", "resident_id": "R-1", "plate": "AA", "month": "2025-03"},
                            {"permit_id": "P-003", "resident_id": "R-2", "plate": "CC", "month": "2025-03"},
                            {"permit_id": "P-004", "resident_id": "R-2", "plate": "DD", "month": "2025-02"}]},
    }
    env = SqliteEnvironment.from_spec(spec)
    try:
        hit = find_violating_call(env, "monthly_cap")
        assert hit is not None, "not provoked"
        setup, call = hit["setup"], hit["call"]
        assert hit["error"]["violated_rule"] == "monthly_cap"
        who, month = call["arguments"]["resident_id"], call["arguments"]["month"]
        held = [p for p in env.snapshot()["permit"] if p["resident_id"] == who and p["month"] == month]
        # by execution: the setup calls are accepted in turn, then the call is refused by the cap
        env.reset()
        for c in setup:
            assert env.call(c["name"], dict(c["arguments"])).ok, c
        assert len(held) + len(setup) == 3
        assert len({c["arguments"]["plate"] for c in setup}) == len(setup)  # another plate each time
        r = env.call(call["name"], dict(call["arguments"]))
        assert not r.ok and r.error["violated_rule"] == "monthly_cap"
        assert all("probe" not in c["arguments"]["permit_id"] for c in setup + [call])
    finally:
        env.close()
