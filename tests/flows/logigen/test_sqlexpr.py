"""The SQLite expression parser behind the trigger analysis (toolkit.flows.logigen.sqlexpr)."""

from __future__ import annotations

import pytest

from toolkit.flows.logigen.sqlexpr import ParseError, Parser


def test_comparison_and_in_list():
    node = Parser("NEW.qty > 3 AND status IN ('a', 'b')").expr()
    assert node[0] == "AND"
    cmp_, in_ = node[1]
    assert cmp_[:4] == ("CMP", ">", ("COL", "NEW", "qty", "NEW.qty"), ("LIT", 3, "3"))
    assert in_[0] == "IN" and in_[2] == ("COL", None, "status", "status")
    assert [item[1] for item in in_[3][1]] == ["a", "b"]


def test_not_exists_subquery():
    node = Parser("NOT EXISTS (SELECT 1 FROM item i WHERE i.code = NEW.code)").expr()
    assert node[:2] == ("EXISTS", "NOT EXISTS")
    sub = node[2]
    assert sub["tables"] == [("item", "i")]
    assert sub["where"][:4] == ("CMP", "=", ("COL", "i", "code", "i.code"), ("COL", "NEW", "code", "NEW.code"))


def test_or_binds_looser_than_and():
    node = Parser("a = 1 OR b = 2 AND c = 3").expr()
    assert node[0] == "OR"
    assert node[1][0][0] == "CMP" and node[1][1][0] == "AND"


def test_unbalanced_input_is_a_parse_error():
    with pytest.raises(ParseError):
        Parser("(a = 1").expr()


def test_case_with_and_without_a_base_expression():
    node = Parser("NEW.qty > CASE (SELECT tier FROM users WHERE user_id = NEW.user_id) WHEN 'vip' THEN 10 ELSE 3 END").expr()
    assert node[:2] == ("CMP", ">")
    case = node[3]
    assert case[0] == "CASE"
    base, arms, els = case[1], case[2], case[3]
    assert base[0] == "SUB" and base[1]["tables"] == [("users", "users")]
    assert arms == [(("LIT", "vip", "'vip'"), ("LIT", 10, "10"))]
    assert els == ("LIT", 3, "3")
    assert case[-1].startswith("CASE (SELECT tier") and case[-1].endswith("END")
    node = Parser("CASE WHEN NEW.a > 1 THEN 'x' WHEN NEW.a > 0 THEN 'y' END = 'x'").expr()
    case = node[2]
    assert case[0] == "CASE" and case[1] is None and case[3] is None
    assert [a[0][:2] for a in case[2]] == [("CMP", ">"), ("CMP", ">")]


def test_a_case_outside_the_grammar_stays_opaque_text():
    # MATCH is not in the grammar: the CASE is kept as text, and the rest still parses
    node = Parser("CASE WHEN a MATCH b THEN 1 END = 1 AND NEW.x > 2").expr()
    assert node[0] == "AND"
    assert node[1][0][2] == ("OPAQUE", "CASE WHEN a MATCH b THEN 1 END")
    assert node[1][1][:2] == ("CMP", ">")
