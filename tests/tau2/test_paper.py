"""Published τ²-bench numbers as data (toolkit.tau2.paper) and our summary beside them."""

from __future__ import annotations

from toolkit.tau2.paper import PAPER_NUMBERS, compare_paper, load_paper_numbers

CSV = """model,domain,metric,value,source,ref,note
A-7B,retail,pass^1,41.5,EigenData,T1,
B-8B,retail,pass^1,50.25,ASTRA,T1,avg of 3
"""


def test_load_paper_numbers(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(CSV)
    rows = load_paper_numbers(p)
    assert rows[0] == {"model": "A-7B", "domain": "retail", "metric": "pass^1", "source": "EigenData",
                       "ref": "T1", "value": 41.5}
    assert rows[1]["value"] == 50.25 and rows[1]["note"] == "avg of 3"


def test_bundled_numbers_are_percentages():
    assert PAPER_NUMBERS and all(0.0 <= r["value"] <= 100.0 for r in PAPER_NUMBERS)
    assert {"retail", "airline"} <= {r["domain"] for r in PAPER_NUMBERS}


def test_compare_paper_puts_ours_first_then_theirs_best_first():
    summary = {"k": 1, "domains": {"retail": {"pass^1": 0.5, "pass@1": 0.5}}}
    text = compare_paper(summary, metrics=["pass^1"])
    lines = text.splitlines()
    assert lines[0] == "retail pass^1: ours 50.0"
    # "    <model, may hold spaces>  <value>  [<ref>]"
    theirs = [float(line.rsplit("[", 1)[0].split()[-1]) for line in lines[1:]]
    assert theirs == sorted(theirs, reverse=True) and len(theirs) >= 1
