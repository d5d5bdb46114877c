"""gen-plan --strategy logigen (the Architect) against a scripted LLM on the loopback server.

Replies are written by hand in the prompts' output formats (toolkit/prompts/logigen/architect_*):
a small parking-permit domain (not airline/clinic/library). The acceptance scenario: the first
trigger draft does not compile / lets a violation through, the deterministic check catches it,
the report goes back to the Architect and the second round's fix passes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tests.conftest import BIN, run_cmd

from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record
from toolkit.stages import strategies

BLUEPRINT = {
    "entities": [{"table": "resident", "description": "residents and their zone"},
                 {"table": "permit", "description": "parking permits"}],
    "rules": [
        {"id": "permit_limit", "kind": "threshold", "statement": "a resident holds at most 2 active permits",
         "tables": ["permit"]},
        {"id": "zone_match", "kind": "multi_variable", "statement": "a permit is for the resident's own zone",
         "tables": ["permit", "resident"]},
        {"id": "revoked_final", "kind": "irreversible", "statement": "a revoked permit cannot change",
         "tables": ["permit"]},
    ],
    "side_effects": [{"when": "a permit is issued", "effect": "it is logged"}],
    "boundaries": ["a resident with 2 active permits"],
}
ANALYZE = "Here is the blueprint.\n```json\n" + json.dumps(BLUEPRINT) + "\n```"
POLICY = """<policy>
# Parking desk policy
Today is 2025-01-10.

## Permits
- **[permit_limit]** A resident holds at most 2 active permits.
- **[zone_match]** A permit is issued only for the zone the resident lives in.
- **[revoked_final]** A revoked permit cannot change any more.
- Every new permit is logged automatically.
</policy>"""
TABLES = """<tables_sql>
CREATE TABLE clock (clock_id INTEGER PRIMARY KEY CHECK (clock_id = 1), today TEXT NOT NULL);
CREATE TABLE resident ( -- residents
  resident_id TEXT PRIMARY KEY NOT NULL,
  name TEXT NOT NULL,
  zone TEXT NOT NULL CHECK (zone IN ('A', 'B'))
);
CREATE TABLE permit ( -- parking permits
  permit_id INTEGER PRIMARY KEY,
  resident_id TEXT NOT NULL REFERENCES resident(resident_id),
  zone TEXT NOT NULL CHECK (zone IN ('A', 'B')),
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked'))
);
CREATE TABLE log (log_id INTEGER PRIMARY KEY, what TEXT NOT NULL);
</tables_sql>
<seed_json>
{"clock": [{"clock_id": 1, "today": "2025-01-10"}],
 "resident": [{"resident_id": "R-1", "name": "Ann", "zone": "A"},
              {"resident_id": "R-2", "name": "Ben", "zone": "B"},
              {"resident_id": "R-3", "name": "Cal", "zone": "A"}],
 "permit": [{"permit_id": 1, "resident_id": "R-1", "zone": "A", "status": "active"},
            {"permit_id": 2, "resident_id": "R-1", "zone": "A", "status": "active"},
            {"permit_id": 3, "resident_id": "R-2", "zone": "B", "status": "revoked"},
            {"permit_id": 4, "resident_id": "R-2", "zone": "B", "status": "active"}],
 "log": []}
</seed_json>
<tools_yaml>
hide: ["*_clock", insert_resident, update_resident, "*_log"]
</tools_yaml>"""
GOOD_TRIGGERS = """<triggers_sql>
CREATE TRIGGER permit_insert_rules BEFORE INSERT ON permit BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: permit_limit: a resident holds at most 2 active permits')
  WHERE (SELECT COUNT(*) FROM permit WHERE resident_id = NEW.resident_id AND status = 'active') >= 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: zone_match: a permit is issued only for the zone the resident lives in')
  WHERE NEW.zone IS NOT (SELECT zone FROM resident WHERE resident_id = NEW.resident_id);
END;
CREATE TRIGGER permit_revoked_final BEFORE UPDATE ON permit WHEN OLD.status = 'revoked' BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: revoked_final: a revoked permit cannot change');
END;
CREATE TRIGGER permit_after_insert AFTER INSERT ON permit BEGIN
  -- The new permit is logged
  INSERT INTO log (what) VALUES ('permit ' || NEW.permit_id);
END;
</triggers_sql>"""
# does not compile: a missing closing parenthesis
BROKEN_TRIGGERS = GOOD_TRIGGERS.replace("AND status = 'active') >= 2;", "AND status = 'active' >= 2;")
# compiles, but the limit is 20 instead of 2: the seed's R-1 (2 active permits) gets a third one
LEAKY_TRIGGERS = GOOD_TRIGGERS.replace(">= 2;", ">= 20;")
PASS = json.dumps({"verdict": "PASS", "issues": []})

BRIEF = {"id": "parking-1", "extra": {"brief": {"name": "parking", "description": "A city parking-permit desk."}}}


def _run(srv: ScriptedServer, tmp_path: Path, record: dict = BRIEF, **cfg_over):
    cfg = {"base_url": srv.base_url, "model": "scripted", "max_retries": 0, "out_dir": str(tmp_path / "out"),
           "attempts": 3, **cfg_over}
    fn = strategies.build("gen-plan", dict(cfg, strategy="logigen"), None)
    return asyncio.run(fn(Record.model_validate(record)))


def _prompts(srv: ScriptedServer) -> list[str]:
    return [r["messages"][-1]["content"] for r in srv.requests]


@pytest.mark.parametrize("bad, expect", [
    (BROKEN_TRIGGERS, "schema does not compile"),
    (LEAKY_TRIGGERS, "'permit_limit' was not provoked"),
])
def test_first_trigger_draft_caught_and_second_round_fixes_it(tmp_path, bad, expect):
    replies = [ANALYZE, PASS, POLICY, PASS, TABLES, PASS, bad, GOOD_TRIGGERS, PASS]
    with ScriptedServer(replies) as srv:
        out = _run(srv, tmp_path)
        prompts = _prompts(srv)
    assert len(prompts) == 9  # no checker call for the draft that failed the deterministic check
    # the second trigger prompt carries the structured report and the previous draft
    assert "FAILED the checks" in prompts[7] and expect in prompts[7] and "permit_insert_rules" in prompts[7]
    assert "FAILED" not in prompts[6]
    plan = out.plan.extra
    assert plan["rounds"] == {"analyze": 1, "policy": 1, "tables": 1, "triggers": 2}
    trig = [r for r in plan["checks"] if r["stage"] == "triggers"]
    assert trig[0]["deterministic"]["ok"] is False and any(expect in x for x in trig[0]["deterministic"]["reasons"])
    assert trig[1]["deterministic"]["ok"] is True and trig[1]["semantic"]["verdict"] == "PASS"
    # the record points at a written domain in the documented layout that passes the check alone
    assert out.env.backend == "sqlite" and out.flow == "logigen"
    d = Path(out.env.path)
    for f in ("domain.yaml", "policy.md", "schema.sql", "seed.json", "tools.yaml", "blueprint.json"):
        assert (d / f).is_file(), f
    assert out.plan.policy_id.startswith("parking@") and "[zone_match]" in out.plan.synthesis_plan
    assert set(plan["domain_check"]["rules"]) == {"permit_limit", "zone_match", "revoked_final"}
    assert all(r["provoked"] for r in plan["domain_check"]["rules"].values())
    p = run_cmd(["toolkit", "domain", "check", str(d)])
    assert p.returncode == 0, p.stderr
    from toolkit.envs import load_env

    env = load_env(out.env)
    r = env.call("insert_permit", {"resident_id": "R-1", "zone": "A"})
    assert r.error["violated_rule"] == "permit_limit"
    assert out.provenance[-1].command == "gen-plan" and out.provenance[-1].strategy == "logigen"


def test_semantic_fail_goes_back_with_its_issues(tmp_path):
    fail = json.dumps({"verdict": "FAIL", "issues": [
        {"item": "revoked_final", "problem": "the policy does not say revoked permits stay revoked",
         "fix": "state it"}]})
    replies = [ANALYZE, PASS, POLICY, fail, POLICY, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS]
    with ScriptedServer(replies) as srv:
        out = _run(srv, tmp_path)
        prompts = _prompts(srv)
    assert "revoked permits stay revoked" in prompts[4] and "Previous draft" in prompts[4]
    assert out.plan.extra["rounds"]["policy"] == 2
    assert out.plan.extra["checks"][1]["semantic"]["verdict"] == "FAIL"


def test_malformed_replies_are_retried(tmp_path):
    replies = ["Sure! I will design a great parking domain.",  # no JSON -> retried
               ANALYZE,
               '{"verdict": "MAYBE"}',                        # wrong enum -> retried
               PASS,
               POLICY.replace("</policy>", ""),               # truncated -> retried
               POLICY, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS]
    with ScriptedServer(replies) as srv:
        out = _run(srv, tmp_path)
        assert srv.chat_count == len(replies)
    assert out.plan.extra["rounds"]["triggers"] == 1
    assert out.plan.extra["usage"]["requests"] == len(replies)


def test_malformed_forever_is_a_reject_with_reasons(tmp_path):
    replies = [ANALYZE, PASS, "# Policy without the tags", "<policy>\n- **[x]** y", "no policy at all"]
    with ScriptedServer(replies) as srv, pytest.raises(StageError) as ei:
        _run(srv, tmp_path)
    msg = str(ei.value)
    assert "architect: no reply in the expected format after 3 attempt(s)" in msg
    assert "no <policy> block" in msg and "not closed" in msg


def test_rounds_exhausted_is_a_reject_naming_the_rule(tmp_path):
    replies = [ANALYZE, PASS, POLICY, PASS, TABLES, PASS, LEAKY_TRIGGERS, LEAKY_TRIGGERS]
    with ScriptedServer(replies) as srv, pytest.raises(StageError) as ei:
        _run(srv, tmp_path, max_rounds=2)
    assert "triggers did not pass its checks in 2 round(s)" in str(ei.value)
    assert "permit_limit" in str(ei.value)
    assert not (tmp_path / "out" / "parking-1").exists()


def test_deterministic_stage_checks(tmp_path):
    from toolkit.flows.logigen.architect import (
        check_blueprint,
        check_policy,
        check_tables,
        parse_tables,
    )

    bad_bp = {"entities": [{"table": "t"}], "rules": [{"id": "A-1", "kind": "threshold", "statement": "s"},
                                                    {"id": "b", "kind": "magic", "statement": "s"}]}
    reasons = check_blueprint(bad_bp)
    assert any("'A-1' is not snake_case" in r for r in reasons)
    assert any("kind 'magic'" in r for r in reasons) and any("at least 3" in r for r in reasons)
    pol = "- **[permit_limit]** x\n- **[extra_rule]** y\n- **[permit_limit]** again\n"
    reasons = check_policy(pol, BLUEPRINT)
    assert any("'zone_match' has no" in r for r in reasons)
    assert any("'extra_rule' is not in the blueprint" in r for r in reasons)
    assert any("'permit_limit' is declared 2 times" in r for r in reasons)
    t = parse_tables(TABLES.replace("resident_id TEXT PRIMARY KEY NOT NULL", "resident_id TEXT PRIMARY KEY"))
    assert any("resident.resident_id is a primary key that can be NULL" in r for r in check_tables(t, ""))
    t = parse_tables(TABLES.replace('"resident_id": "R-3"', '"resident_id": "R-3", "color": "red"'))
    assert any("unknown columns" in r for r in check_tables(t, ""))


def test_cli_bad_brief_rejected_and_good_one_written(tmp_path):
    rej = tmp_path / "rej.jsonl"
    lines = json.dumps({"id": "no-brief"}) + "\n" + json.dumps(BRIEF) + "\n"
    replies = [ANALYZE, PASS, POLICY, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS]
    with ScriptedServer(replies) as srv:
        p = run_cmd([str(BIN / "gen-plan"), "--strategy", "logigen", "--base-url", srv.base_url, "--model", "m",
                     "--out-dir", str(tmp_path / "doms"), "--rejects", str(rej)], stdin=lines)
    assert p.returncode == 1  # one reject
    outs = [json.loads(x) for x in p.stdout.splitlines()]
    assert [o["id"] for o in outs] == ["parking-1"]
    assert outs[0]["env"]["path"] == str((tmp_path / "doms" / "parking-1").resolve())
    r = json.loads(rej.read_text().splitlines()[0])
    assert r["field"] == "extra.brief" and "needs extra.brief" in r["error"]


def test_trigger_stage_may_correct_the_seed(tmp_path):
    # with the fix of a broken trigger draft, the Architect also returns a corrected seed (a new
    # resident): the check runs on it and the written domain holds it
    seed = TABLES[TABLES.index("<seed_json>"):TABLES.index("</seed_json>") + 12]
    fixed_seed = seed.replace('{"resident_id": "R-3", "name": "Cal", "zone": "A"}',
                              '{"resident_id": "R-3", "name": "Cal", "zone": "A"}, '
                              '{"resident_id": "R-4", "name": "Dot", "zone": "B"}')
    assert fixed_seed != seed
    replies = [ANALYZE, PASS, POLICY, PASS, TABLES, PASS, BROKEN_TRIGGERS, GOOD_TRIGGERS + "\n" + fixed_seed, PASS]
    with ScriptedServer(replies) as srv:
        out = _run(srv, tmp_path)
        prompts = _prompts(srv)
    assert '"R-3"' in prompts[6]  # the trigger prompt shows the seed
    assert "R-4" in prompts[8]  # the checker sees the corrected seed
    assert out.plan.extra["rounds"]["triggers"] == 2
    written = json.loads((Path(out.env.path) / "seed.json").read_text())
    assert [r["resident_id"] for r in written["resident"]] == ["R-1", "R-2", "R-3", "R-4"]
    bad = GOOD_TRIGGERS + "\n<seed_json>\n{not json\n</seed_json>"
    with ScriptedServer([ANALYZE, PASS, POLICY, PASS, TABLES, PASS, bad, bad, bad]) as srv, \
            pytest.raises(StageError, match="seed_json> is not valid JSON"):
        _run(srv, tmp_path)


def test_brief_with_a_codified_policy_skips_the_policy_stage(tmp_path):
    policy = POLICY.replace("<policy>", "").replace("</policy>", "").strip()
    rec = {"id": "parking-2", "extra": {"brief": {"name": "parking", "description": "desk", "policy": policy}}}
    replies = [ANALYZE, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS]
    with ScriptedServer(replies) as srv:
        out = _run(srv, tmp_path, record=rec)
        prompts = _prompts(srv)
    assert len(prompts) == 6 and "A resident holds at most 2 active permits" in prompts[0]
    assert out.plan.extra["rounds"]["policy"] == 0
    assert (Path(out.env.path) / "policy.md").read_text().strip() == policy
    with pytest.raises(StageError, match="extra.brief.name"):
        _run(srv, tmp_path, record={"id": "x", "extra": {"brief": {"name": "../evil", "description": "d"}}})
