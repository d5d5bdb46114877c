"""The user-view leak check of LOGIGEN's projection (toolkit.flows.logigen.projection)."""

from __future__ import annotations

from toolkit.flows.logigen.projection import leaks, words


def test_words():
    assert words("update_reservation_") == "update reservation"


def test_leaks_match_whole_terms_only():
    terms = {"tool": ["cancel_order"], "hidden id": ["R-1001", "u2"]}
    assert leaks(["Please cancel my order R-1001."], terms) == ["hidden id 'R-1001'"]
    # a term inside a longer identifier is no leak: R-10012, u23, cancel_order_v2
    assert leaks(["R-10012 and u23 and cancel_order_v2"], terms) == []
    assert leaks(["call cancel_order now", None, ""], terms) == ["tool 'cancel_order'"]
