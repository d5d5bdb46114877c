"""The SQLite expression parser behind the trigger analysis (toolkit.flows.logigen.sqlexpr)."""

from __future__ import annotations

import pytest

from toolkit.flows.logigen.sqlexpr import _ParseError, _Parser


def test_comparison_and_in_list():
    node = _Parser("NEW.qty > 3 AND status IN ('a', 'b')").expr()
    assert node[0] == "AND"
    cmp_, in_ = node[1]
    assert cmp_[:4] == ("CMP", ">", ("COL", "NEW", "qty", "NEW.qty"), ("LIT", 3, "3"))
    assert in_[0] == "IN" and in_[2] == ("COL", None, "status", "status")
    assert [item[1] for item in in_[3][1]] == ["a", "b"]


def test_not_exists_subquery():
    node = _Parser("NOT EXISTS (SELECT 1 FROM item i WHERE i.code = NEW.code)").expr()
    assert node[:2] == ("EXISTS", "NOT EXISTS")
    sub = node[2]
    assert sub["tables"] == [("item", "i")]
    assert sub["where"][:4] == ("CMP", "=", ("COL", "i", "code", "i.code"), ("COL", "NEW", "code", "NEW.code"))


def test_or_binds_looser_than_and():
    node = _Parser("a = 1 OR b = 2 AND c = 3").expr()
    assert node[0] == "OR"
    assert node[1][0][0] == "CMP" and node[1][1][0] == "AND"


def test_unbalanced_input_is_a_parse_error():
    with pytest.raises(_ParseError):
        _Parser("(a = 1").expr()
