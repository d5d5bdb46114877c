"""LLM-written / user-supplied domain SQL never touches the host (issue 17, hole 1).

A domain's schema.sql, seed.sql and triggers compile under an allow-list SQLite authorizer
(toolkit.envs.sqlite.guard._DomainGuard): ATTACH / VACUUM INTO / load_extension / file PRAGMAs are
refused with an error naming the text and the statement, and nothing is created on the host.
The environment's own connection (where LLM-written trigger bodies run at call time) refuses
load_extension too. The Architect's check-fix loop gets the refusal back as a fixable error.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from tests.conftest import run_cmd
from tests.flows.logigen.test_architect import ANALYZE, GOOD_TRIGGERS, PASS, POLICY, TABLES, _prompts, _run

from toolkit.envs.sqlite import DomainError, DomainSpec, SqliteEnvironment, compile_domain
from toolkit.llm.testserver import ScriptedServer

LIBRARY = Path(__file__).resolve().parents[1] / "data" / "library"
BASE = "CREATE TABLE item (item_id TEXT PRIMARY KEY NOT NULL, qty INTEGER NOT NULL);\n"


def _hostile(target: Path) -> list[tuple[str, str, str]]:
    """(where, text, what the refusal names) for each way SQL could reach a file."""
    t = str(target)
    return [
        ("schema", f"ATTACH DATABASE '{t}' AS p;\nCREATE TABLE p.stolen(x);\nDETACH DATABASE p;\n" + BASE, "ATTACH"),
        ("schema", BASE + f"ATTACH DATABASE 'file:{t}?mode=rwc' AS p;", "ATTACH"),
        ("schema", BASE + f"VACUUM INTO '{t}';", "VACUUM INTO"),
        ("schema", BASE + "SELECT load_extension('/nonexistent/evil.so');", "load_extension"),
        ("schema", BASE + "PRAGMA journal_mode = WAL;", "PRAGMA journal_mode"),
        ("schema", BASE + f"PRAGMA temp_store_directory = '{target.parent}';", "PRAGMA temp_store_directory"),
        ("schema", BASE + "PRAGMA writable_schema = ON;", "PRAGMA writable_schema"),
        ("schema", BASE + "CREATE VIRTUAL TABLE docs USING fts5(body);", "CREATE VIRTUAL TABLE"),
        ("seed", f"INSERT INTO item VALUES ('a', 1);\nATTACH DATABASE '{t}' AS p;\nCREATE TABLE p.x(y);", "ATTACH"),
        ("seed", f"INSERT INTO item VALUES ('a', 1); VACUUM INTO '{t}';", "VACUUM INTO"),
        ("trigger", BASE + "CREATE TRIGGER item_ins AFTER INSERT ON item BEGIN\n"
                           "  SELECT load_extension('/nonexistent/evil.so');\nEND;", "load_extension"),
    ]


@pytest.mark.parametrize("case", range(11))
def test_hostile_domain_sql_is_refused_and_touches_nothing(tmp_path, case):
    target = tmp_path / "PWNED.db"
    where, text, names = _hostile(target)[case]
    if where == "seed":
        spec = DomainSpec(name="evil", schema_sql=BASE, seed=text)
    else:
        spec = DomainSpec(name="evil", schema_sql=text)
    with pytest.raises(DomainError) as ei:
        compile_domain(spec)
    msg = str(ei.value)
    assert "refused by the SQL sandbox" in msg and names in msg, msg
    assert msg.startswith("evil: " + ("seed" if where == "seed" else "schema.sql")), msg
    assert "statement " in msg and "line " in msg  # names the statement
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no journal, no -wal, nothing


def test_refusal_names_the_statement_and_line():
    sql = BASE + "\n-- a comment; with a semicolon\nINSERT INTO item VALUES ('x;y', 2);\nPRAGMA mmap_size = 1;\n"
    with pytest.raises(DomainError) as ei:
        compile_domain(DomainSpec(name="d", schema_sql=sql))
    assert "statement 3, line 5: PRAGMA mmap_size = 1;" in str(ei.value)


def test_harmless_pragmas_and_normal_ddl_still_compile():
    sql = ("PRAGMA foreign_keys = ON;\n" + BASE
           + "CREATE TABLE log (log_id INTEGER PRIMARY KEY, what TEXT NOT NULL);\n"
           "CREATE INDEX item_qty ON item(qty);\nCREATE VIEW low AS SELECT * FROM item WHERE qty < 2;\n"
           "DROP VIEW low;\nCREATE TRIGGER item_log AFTER INSERT ON item BEGIN\n"
           "  INSERT INTO log (what) VALUES (upper(NEW.item_id));\nEND;\n")
    seed = ("BEGIN; WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3)\n"
            "INSERT INTO item SELECT 'i' || i, i FROM n; COMMIT;")
    dom = compile_domain(DomainSpec(name="ok", schema_sql=sql, seed=seed))
    env = SqliteEnvironment(dom)
    assert [r["qty"] for r in env.snapshot()["item"]] == [1, 2, 3]
    r = env.call("insert_item", {"item_id": "z", "qty": 1})
    assert r.ok and env.snapshot()["log"][-1]["what"] == "Z"  # the trigger ran under the runtime authorizer


def test_runtime_connection_refuses_extensions_and_attach():
    dom = compile_domain(DomainSpec(name="ok", schema_sql=BASE))
    env = SqliteEnvironment(dom)
    # evaluate_sql runs LLM-written trigger conditions (toolkit.flows.logigen.analysis)
    with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
        env.evaluate_sql("SELECT load_extension('/nonexistent/evil.so')")
    with pytest.raises(sqlite3.DatabaseError):
        env._conn.execute("ATTACH DATABASE ':memory:' AS p")
    # a trigger body that reached the database without the compile check (hand-made bytes) is
    # refused when the tool call that fires it is prepared
    raw = sqlite3.connect(":memory:")
    raw.executescript(BASE + "CREATE TRIGGER item_ins AFTER INSERT ON item BEGIN "
                             "SELECT load_extension('/nonexistent/evil.so'); END;")
    dom.pristine = raw.serialize()
    env = SqliteEnvironment(dom)
    r = env.call("insert_item", {"item_id": "a", "qty": 1})
    assert not r.ok and "not authorized to use function: load_extension" in r.error["message"]
    assert env.snapshot()["item"] == []


def test_domain_check_cli_refuses_a_hostile_schema(tmp_path):
    d = tmp_path / "library"
    shutil.copytree(LIBRARY, d)
    target = tmp_path / "PWNED.db"
    schema = d / "schema.sql"
    schema.write_text(f"ATTACH DATABASE '{target}' AS p;\nCREATE TABLE p.t(x);\nDETACH DATABASE p;\n"
                      + schema.read_text())
    p = run_cmd(["toolkit", "domain", "check", str(d)])
    assert p.returncode == 1, (p.stdout, p.stderr)
    rep = json.loads(p.stdout)
    assert rep["ok"] is False
    assert "refused by the SQL sandbox" in rep["reasons"][0] and str(target) in rep["reasons"][0]
    assert "refused by the SQL sandbox" in p.stderr
    assert not target.exists()


def test_architect_gets_the_refusal_back_and_fixes_it(tmp_path):
    target = tmp_path / "PWNED.db"
    hostile = TABLES.replace("<tables_sql>\n", f"<tables_sql>\nATTACH DATABASE '{target}' AS p;\n"
                                               "CREATE TABLE p.loot (x TEXT);\n", 1)
    assert hostile != TABLES
    replies = [ANALYZE, PASS, POLICY, PASS, hostile, TABLES, PASS, GOOD_TRIGGERS, PASS]
    with ScriptedServer(replies) as srv:
        out = _run(srv, tmp_path)
        prompts = _prompts(srv)
    assert len(prompts) == 9  # no checker call for the refused draft
    assert "FAILED the checks" in prompts[5] and "refused by the SQL sandbox" in prompts[5]
    assert "ATTACH" in prompts[5]
    plan = out.plan.extra
    assert plan["rounds"]["tables"] == 2
    tab = [r for r in plan["checks"] if r["stage"] == "tables"]
    assert tab[0]["deterministic"]["ok"] is False and tab[1]["deterministic"]["ok"] is True
    assert not target.exists()
    assert "ATTACH" not in (Path(out.env.path) / "schema.sql").read_text()


def test_runaway_or_oversized_seed_is_an_error_not_a_hang_or_a_crash(monkeypatch):
    import toolkit.envs.sqlite.guard as G

    monkeypatch.setattr(G, "_DOMAIN_SQL_SECONDS", 0.5)
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n;"
    with pytest.raises(DomainError, match="seed ran longer than 0.5 s"):
        compile_domain(DomainSpec(name="d", schema_sql=BASE, seed=endless))
    huge = "INSERT INTO item VALUES ('" + "x" * 11_000_000 + "', 1);"
    with pytest.raises(DomainError, match="string or blob too big"):
        compile_domain(DomainSpec(name="d", schema_sql=BASE, seed=huge))
