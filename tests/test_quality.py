"""`toolkit stats --quality` (toolkit/quality.py): metrics computed by hand on a small task set,
the leak check on a real sqlite domain's columns, the CLI with a baseline gate and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from toolkit.cli import toolkit_group
from toolkit.quality import column_mentions, compute, domain_columns

CARRENTAL = str(Path(__file__).resolve().parent / "data" / "carrental")


def _task(rid: str, actions: list[str], text: str, cx: dict | None = None, verdicts: list | None = None) -> dict:
    return {"id": rid, "env": {"backend": "sqlite", "path": CARRENTAL},
            "task": {"instruction": text, "difficulty": (cx or {}).get("level"),
                     "complexity": cx or {},
                     "ground_truth": {"actions": [{"name": n, "arguments": {}} for n in actions]}},
            "verdicts": verdicts or []}


def _write(path: Path, recs: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_quality_hand_computed(tmp_path):
    recs = [
        # 3 writes (no complexity: counted from non-read actions), a leak: "status cancelled"
        _task("a", ["query_rental", "update_rental", "insert_rental", "update_rental"], "make the status cancelled",
              verdicts=[{"stage": "validate-task", "name": "replay", "kind": "state_diff", "passed": True}]),
        # the same tool sequence: not a distinct signature; 1 write from complexity
        _task("b", ["query_rental", "update_rental", "insert_rental", "update_rental"], "one two three",
              {"archetype": "Rookie", "level": "L1", "writes": 1, "read_dependent": 1},
              verdicts=[{"stage": "validate-task", "name": "replay", "kind": "state_diff", "passed": False}]),
        # a snake_case column in the text: a leak; violation-first with its rule, boundary at N-1
        _task("c", ["insert_rental"], "please set total_price",
              {"archetype": "Mismatch", "level": "L2", "writes": 0, "read_dependent": 0, "violation_first": True,
               "violation": {"rule": "extras_limit"},
               "boundary": {"rule": "open_rental_limit", "seeded": {"n_minus_1": True}}}),
    ]
    q = compute([_write(tmp_path / "t.jsonl", recs)])["total"]
    assert q["tasks"] == 3
    assert q["writes"] == {"n": 3, "mean": round(4 / 3, 3), "p50": 1, "max": 3}
    assert q["share_writes_ge3"] == round(1 / 3, 4)
    assert q["signature_ratio"] == round(2 / 3, 4)
    assert q["read_dependent_share"] == 0.5  # known for b and c only
    assert q["leak_rate"] == round(2 / 3, 4)
    assert q["violation_rules"] == ["extras_limit"] and q["boundary_rules"] == ["open_rental_limit"]
    assert q["boundary_n_minus_1_share"] == 1.0
    assert q["yield_by_stage"] == {"validate-task": 0.5}
    assert q["archetypes"] == {"none": 1, "Rookie": 1, "Mismatch": 1}
    # distinct-2 over the three texts: 4 + 2 + 2 bigrams, all distinct
    assert q["distinct_2"] == 1.0


def test_column_mentions():
    cols = domain_columns({"backend": "sqlite", "path": CARRENTAL})
    assert "total_price" in cols["snake"] and "rental_id" not in cols["snake"]  # keys are not columns to hide
    assert column_mentions("the status: cancelled please", cols) == ["status: cancelled"]
    assert column_mentions("my loyalty is gold", cols) == ["loyalty is gold"]
    assert column_mentions("I want it cancelled; my rental 3", cols) == []
    # a column named with spaces instead of underscores is named all the same
    assert column_mentions("the rental with total price 300", cols) == ["total price"]
    assert domain_columns({"backend": "python", "path": "x.py"}) is None
    # a domain with plural table names: "a new loans", "a books" is the schema talking
    lending = domain_columns({"backend": "sqlite", "path": str(Path(CARRENTAL).parent / "lending")})
    said = column_mentions("a new loans (members m_ana, books b2, due day 20) with a books (on loan)", lending)
    assert {"due day", "a new loans", "a books"} <= set(said), said
    assert column_mentions("a new loan for the book 'Dune', due on day 20; my reservation", lending) == []


def test_cli_quality_gate_and_chart(tmp_path):
    good = [_task(f"g{i}", ["query_rental"] + ["update_rental"] * (i + 3), f"goal number {i} text") for i in range(4)]
    thin = [_task(f"t{i}", ["update_rental"], "same text") for i in range(4)]
    gpath, tpath = _write(tmp_path / "good.jsonl", good), _write(tmp_path / "thin.jsonl", thin)
    r = CliRunner().invoke(toolkit_group, ["stats", "--quality", gpath, "--chart", str(tmp_path / "q.png")])
    assert r.exit_code == 0, r.output
    base = tmp_path / "base.json"
    base.write_text(r.stdout.splitlines()[0])
    assert json.loads(base.read_text())["metrics"]["share_writes_ge3"] == 1.0
    assert (tmp_path / "q.png").stat().st_size > 1000
    same = CliRunner().invoke(toolkit_group, ["stats", "--quality", gpath, "--baseline", str(base),
                                              "--max-drop", "share_writes_ge3=0.05"])
    assert same.exit_code == 0
    worse = CliRunner().invoke(toolkit_group, ["stats", "--quality", tpath, "--baseline", str(base),
                                               "--max-drop", "share_writes_ge3=0.05", "--max-drop",
                                               "near_duplicate_share=0.1"])
    assert worse.exit_code == 1
    out = json.loads(worse.stdout.splitlines()[0])
    assert any(x.startswith("share_writes_ge3: 1 -> 0") for x in out["regressions"])
    assert any(x.startswith("near_duplicate_share: 0 -> 0.75") for x in out["regressions"])
    bad = CliRunner().invoke(toolkit_group, ["stats", "--quality", gpath, "--max-drop", "x=1"])
    assert bad.exit_code == 2
