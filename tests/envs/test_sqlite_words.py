"""A one-word column name is said only when it is an English word (toolkit.envs.sqlite.english,
vocab.DomainWords): `amount`, `breed`; never an abbreviation (`nm`, `brd`, `sts`), which is
schema - a user view saying it fails the leak check, and the generator falls back to generic
phrasing. Checked on the vet domain (tests/data/vet), whose columns are abbreviations and carry
no comments."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from toolkit.envs import load_env
from toolkit.envs.sqlite.english import expansion, is_word
from toolkit.envs.sqlite.vocab import domain_words
from toolkit.schema import Record
from toolkit.stages import strategies

VET = Path(__file__).resolve().parents[1] / "data" / "vet"
# vet's one-word columns that are abbreviations, written here by hand (not by is_word); `brd`
# (breed) is left out: it is also a value of the species column ("a brd pet" says the data)
VET_ABBREVIATIONS = ["nm", "sts", "spc", "sx", "typ", "ph", "eml", "fnm", "lnm", "amt", "mthd"]


@pytest.mark.parametrize("w", ["amount", "breed", "status", "notes", "slot", "capacity", "species", "Weight",
                               "colour", "centre", "licence", "cheque", "organise", "analyse", "ok", "id"])
def test_words(w):
    assert is_word(w)


@pytest.mark.parametrize("w", ["nm", "brd", "sts", "ownr", "appt", "inv", "actv", "dy", "cd", "wt", "ph", "x",
                               "", "amt2", "café", "due_day", "q"])
def test_not_words(w):
    assert not is_word(w)


@pytest.fixture(scope="module")
def vet():
    env = load_env({"backend": "sqlite", "path": str(VET)})
    yield env
    env.close()


def test_expansion_from_the_domains_own_words():
    policy = ("Reception books appts, voids invoices and takes payments. Verify the owner. A pet's name, "
              "breed and species; birds and reptiles only with a vet cleared for exotics. Wt > 0.")
    tokens = {t.lower() for t in re.findall(r"[A-Za-z]+", policy)}
    assert expansion("inv", tokens) == "invoice"  # a word it begins
    assert expansion("pmt", tokens) == "payment"  # its letters in order
    assert expansion("ownr", tokens) == "owner"
    assert expansion("nm", tokens) == "name"
    assert expansion("spc", tokens) == "species"
    assert expansion("brd", tokens) is None  # "breed" and "birds": ambiguous
    assert expansion("appt", tokens) is None  # "appts" is no word, "appointment" not in the text
    assert expansion("wt", tokens) is None  # nothing spells it out
    assert expansion("name", tokens) is None  # a word already
    assert expansion("mins", {"minutes"}) == "minute"


def test_vet_abbreviations_have_no_words_and_are_banned(vet):
    w = domain_words(vet.domain)
    # spelled out where the policy says the word (vet's policy: "a pet's name", "invoices", "payments")
    assert w.attr("pet", "nm") == "name" and w.attr("pet", "spc") == "species"
    assert w.noun("pmt") == "payment" and w.nouns("inv") == "invoices" and w.noun("ownr") == "owner"
    assert w.noun("appt") == "appt"  # the policy never says "appointment"
    assert w.attr("pet", "brd") is None and w.attr("appt", "sts") is None  # no word spells them out
    assert w.attr("appt", "notes") == "notes" and w.attr("appt", "slot") == "slot"
    assert w.attr("vet", "max_dy") is None  # not "maximum dy"
    assert w.flag("ownr", "is_actv") == ("with that option", "without that option")  # not "actv"
    assert w.flag("pet", "is_dcsd") == ("deceased", "not deceased")
    assert set(VET_ABBREVIATIONS) <= set(w.abbreviations) and "brd" not in w.abbreviations
    assert w.banned("the pet whose nm is 'Luna'") == ["column 'nm'"]
    assert w.banned("inv INV-25-0751: void (now opn); Sts pending") == ["column 'Sts'"]
    assert not w.banned("the brd pet: 'maine coon' instead of 'siamese'")  # a value of the data
    assert not w.banned("a new appt (pet PT-21150, vet V-04) with notes 'nm-3 stitches'")


def test_vet_user_views_say_no_abbreviated_column():
    fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": 40, "seed": 11,
                                       "search_cache": False}, None)
    out = asyncio.run(fn(Record.model_validate({"id": "v", "env": {"backend": "sqlite", "path": str(VET)}})))
    assert len(out) == 40
    for r in out:
        us = r.task.user_scenario
        text = "\n".join(x for x in [r.task.instruction, us.persona, us.reason_for_call, us.known_info,
                                     us.unknown_info, us.instructions] if x)
        for a in VET_ABBREVIATIONS:
            assert not re.search(r"(?i)(?<![\w-])" + a + r"(?![\w-])", text), (r.id, a, text)
