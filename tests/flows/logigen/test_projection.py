"""The user-view leak check of LOGIGEN's projection (toolkit.flows.logigen.projection)."""

from __future__ import annotations

from pathlib import Path

from toolkit.flows.logigen.projection import leaks, words

DATA = Path(__file__).resolve().parents[2] / "data"


def test_words():
    assert words("update_reservation_") == "update reservation"


def test_leaks_match_whole_terms_only():
    terms = {"tool": ["cancel_order"], "hidden id": ["R-1001", "u2"]}
    assert leaks(["Please cancel my order R-1001."], terms) == ["hidden id 'R-1001'"]
    # a term inside a longer identifier is no leak: R-10012, u23, cancel_order_v2
    assert leaks(["R-10012 and u23 and cancel_order_v2"], terms) == []
    assert leaks(["call cancel_order now", None, ""], terms) == ["tool 'cancel_order'"]


def test_yes_no_enum_values_are_phrased_with_their_attribute():
    """airline's reservation.insurance is a yes/no enum: "passenger count 1, yes" says nothing, so
    the user says "with insurance" / "without insurance" (never "insurance yes": a column followed
    by its enum value), and a change says which way; other enums stay adjectives; a column the
    domain has no words for is never named ("date of birth" is `date_of_birth` with spaces): the
    change is said by its values."""
    from toolkit.envs import load_env
    from toolkit.flows.logigen.explorer import DomainView
    from toolkit.flows.logigen.goals import Phrases
    from toolkit.flows.logigen.projection import forbidden_terms

    env = load_env({"backend": "sqlite", "id": "airline"})
    try:
        say = Phrases(DomainView(env))
        assert say.value("reservation", "insurance", "yes") == "with insurance"
        assert say.value("reservation", "insurance", "no") == "without insurance"
        assert say.value("reservation", "cabin", "business") == "business"
        assert say.change("reservation", "insurance", "no", "yes") == "with insurance (without insurance now)"
        assert say.change("reservation", "cabin", "economy", "business") == "business (now economy)"
        assert say.change("customer", "date_of_birth", "1979-01-30", "1979-01-31") == "1979-01-30 changed to 1979-01-31"
        assert say.row("reservation", {"insurance": "yes", "cabin": "economy"}) == \
            "the economy reservation (with insurance)"
        terms = forbidden_terms(DomainView(env), None, None)
        text = "a new reservation (flight HAT305-2024-05-22, economy, with insurance); " \
               "the reservation: with insurance (without insurance now); customer: 1979-01-30 changed to 1979-01-31"
        assert leaks([text], terms) == []
        assert leaks(["the reservation: insurance yes"], terms)  # the rule the phrasing avoids
        assert leaks(["customer: date of birth 1979-01-31"], terms)  # a column with spaces
        assert leaks(["customer: date_of_birth 1979-01-31"], terms)
    finally:
        env.close()


def test_two_references_to_one_table_keep_their_role():
    # bank's transfer has from_account and to_account, both to account: "account ACC-1" would
    # not say which, and "to account ACC-1" names the column `to_account`; the roles come from the
    # columns' comments ("-- the sending account", "-- the receiving account"); a card's single
    # account_id is just "account"
    from pathlib import Path

    from toolkit.envs import load_env
    from toolkit.flows.logigen.explorer import DomainView
    from toolkit.flows.logigen.phrases import Phrases

    env = load_env({"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "bank")})
    try:
        say = Phrases(DomainView(env))
    finally:
        env.close()
    assert say.value("transfer", "to_account", "ACC-1") == "receiving account ACC-1"
    assert say.value("transfer", "from_account", "ACC-2") == "sending account ACC-2"
    assert say.value("card", "account_id", "ACC-1") == "account ACC-1"
    assert say.row("transfer", {"to_account": "ACC-1"}) == "the transfer with receiving account ACC-1"
    assert say.row("card", {"account_id": "ACC-1"}) == "the card for account ACC-1"
    assert say.change("transfer", "memo", None, "rent") == "memo 'rent' (none now)"
    # "moved to account" would name `to_account`: the change is said another way
    moved = say.change("card", "account_id", "ACC-1", "ACC-2")
    assert "ACC-2" in moved and "ACC-1" in moved and say.w.clean(moved) and not say.w.clean("moved to account ACC-2")

def test_a_stated_number_is_said_in_any_form():
    """A user who says 2500 has said 2500.0 too (a REAL column stores the stated 2500 as 2500.0):
    not a 'target value' leak; a computed number nobody states still is one (courier domain,
    held-out: 2 of 100 tasks were refused by validate-task for their own stated amount)."""
    from toolkit.envs import load_env
    from toolkit.flows.logigen.explorer import DomainView
    from toolkit.flows.logigen.projection import forbidden_terms

    env = load_env({"backend": "sqlite", "path": str(DATA / "courier")})
    try:
        view = DomainView(env)
        origin = env.snapshot()
        table = next(t for t, spec in view.tables.items() if spec.pk and origin.get(t))
        row = dict(origin[table][0])
        col = next(c.name for c in view.tables[table].columns if not c.pk and not c.enum)
        row[col] = 2500.0
        target = dict(origin, **{table: [row] + list(origin[table][1:])})
        said = forbidden_terms(view, origin, target, {"2500"})["target value"]
        unsaid = forbidden_terms(view, origin, target, {"1234"})["target value"]
    finally:
        env.close()
    assert "2500.0" not in said
    assert "2500.0" in unsaid


def test_period_ends_key_formats_and_made_up_keys_read_like_the_desk():
    """A period's two dates are said "starting"/"ending" (two bare "on <date>" would not say which);
    a comment that is only a key's format gives no words; a key made up for a new row has the
    table's own shape, never the column's name, and a raw column name inside a value is banned."""
    from toolkit.envs import load_env
    from toolkit.envs.sqlite.vocab import clean_doc, domain_words
    from toolkit.flows.logigen.explorer import DomainView
    from toolkit.flows.logigen.phrases import Phrases
    from toolkit.flows.logigen.provoke import next_key

    data = Path(__file__).resolve().parents[2] / "data"
    env = load_env({"backend": "sqlite", "path": str(data / "gym")})
    try:
        say = Phrases(DomainView(env))
        w = domain_words(env.domain)
    finally:
        env.close()
    # gym's freeze: `start_d`, `end_d`, and `freeze_id TEXT -- FRZ-yyyy-nnn`
    assert say.value("freeze", "start_d", "2025-06-20") == "starting 2025-06-20"
    assert say.value("freeze", "end_d", "2025-07-04") == "ending 2025-07-04"
    assert say.w.attr("freeze", "freeze_id") is None
    for col, word in (("valid_from", "starting"), ("valid_to", "ending"), ("start_date", "starting"),
                      ("ends_on", "ending"), ("returned_day", "returned"), ("booked_on", "booked")):
        assert (say.w.when(col) or ("",))[0] == word, col
    assert say.w.when("dob_d") is None and say.w.when("start") is None
    assert clean_doc("FRZ-yyyy-nnn") == (None, None) and clean_doc("SR-####") == (None, None)
    assert clean_doc("e-mail address")[0] == "e-mail address" and clean_doc("X-ray type")[0] == "X-ray type"
    assert clean_doc("A-1 priority level")[0] == "priority level"
    # made-up keys
    assert next_key(["SR-6950", "SR-6997", "SR-6996"]) == "SR-6998"
    assert next_key(["B-0042", "B-0007"]) == "B-0043"
    assert next_key(["FRZ-2025-009", "FRZ-2025-010"]) == "FRZ-2025-011"
    assert next_key(["x", "NEW-3", "y"]) == "NEW-4" and next_key([]) == "NEW-1"
    # a raw name banned wherever it stands; its spaced form next to a hyphen is a value's word
    assert w.banned("a new freeze ('freeze_id-probe-6')") and w.banned("member_no: M-1")
    assert not w.banned("a new freeze ('FRZ-2025-011', starting 2025-06-20)")
