"""Fixes of what a user hit adding a sqlite domain by hand: the hint is the rule's own bullet,
insert_* refuses a NULL TEXT primary key, a relative env.path resolves against the input file
and an environment that cannot be built is a reject (exit 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import BIN, run_cmd

from toolkit.envs.sqlite import SqliteEnvironment
from toolkit.flows.logigen.domain_check import check_domain

LIBRARY = Path(__file__).resolve().parents[1] / "data" / "library"

SCHEMA = """
CREATE TABLE item (code TEXT PRIMARY KEY, qty INTEGER NOT NULL);
CREATE TRIGGER item_rules BEFORE INSERT ON item BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: qty_cap: at most 3 units') WHERE NEW.qty > 3;
END;
"""
POLICY = """# Store
Intro: the qty_cap rule below limits orders (see also [qty_cap] in the appendix).

- **[qty_cap]** An item holds at most 3 units.
  Larger orders are split.
- **[other]** Something else that mentions qty_cap in passing.
"""


def test_hint_is_the_rules_own_bullet():
    env = SqliteEnvironment.from_spec({"name": "store", "schema": SCHEMA, "policy": POLICY})
    r = env.call("insert_item", {"code": "a", "qty": 9})
    assert r.error["violated_rule"] == "qty_cap"
    assert r.error["hint"] == "An item holds at most 3 units. Larger orders are split."


def test_insert_refuses_null_text_primary_key():
    env = SqliteEnvironment.from_spec({"name": "store", "schema": SCHEMA, "policy": POLICY})
    h = env.state_hash()
    r = env.call("insert_item", {"qty": 1})
    assert not r.ok and r.error["code"] == "INVALID_ARGUMENTS" and "code" in r.error["message"]
    r = env.call("insert_item", {"code": None, "qty": 1})
    assert not r.ok and r.error["code"] == "INVALID_ARGUMENTS"
    assert env.state_hash() == h
    schema = next(t for t in env.tools() if t["function"]["name"] == "insert_item")["function"]["parameters"]
    assert "code" in schema["required"] and "null" not in json.dumps(schema["properties"]["code"])
    assert env.call("insert_item", {"code": "a", "qty": 1}).ok


def test_hint_fix_seen_by_the_domain_check(tmp_path):
    d = tmp_path / "library"
    shutil.copytree(LIBRARY, d)
    text = (d / "policy.md").read_text()
    (d / "policy.md").write_text(text.replace("## Borrowing",
                                              "Rules such as renewal_limit are enforced.\n\n## Borrowing", 1))
    rep = check_domain(d)
    assert rep.ok, rep.reasons
    assert rep.rules["renewal_limit"]["hint"].startswith("A loan can be renewed at most 2 times")


def _record(path: str) -> dict:
    return {"id": "lib-1", "flow": "logigen", "env": {"backend": "sqlite", "path": path},
            "task": {"instruction": "renew", "ground_truth": {"actions": [
                {"name": "update_loan", "arguments": {"loan_id": 1, "renewals": 1}}]}}}


def test_relative_env_path_resolves_against_the_input_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copytree(LIBRARY, data / "lib")
    inp = data / "tasks.jsonl"
    inp.write_text(json.dumps(_record("lib")) + "\n")
    p = run_cmd([str(BIN / "rollout"), "--agent", "replay", "-i", str(inp)])  # cwd is the repo root
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["env"]["path"] == str(data / "lib")
    assert out["trajectories"][0]["termination"] == "replay_done"


def test_missing_env_is_a_reject_not_exit_0(tmp_path):
    inp = tmp_path / "tasks.jsonl"
    inp.write_text(json.dumps(_record("no_such_domain")) + "\n")
    rej = tmp_path / "rejects.jsonl"
    p = run_cmd([str(BIN / "rollout"), "--agent", "replay", "-i", str(inp), "--rejects", str(rej)])
    assert p.returncode == 1
    assert p.stdout == ""
    line = json.loads(rej.read_text().splitlines()[0])
    assert "environment could not be built" in line["error"] and "input file" in line["error"]
    assert line.get("field") == "env.path"
