"""Whether a token is an English word: a one-word column name (`amount`, `breed`) is a word a
person can say; an abbreviation (`nm`, `brd`, `sts`, `ownr`) is schema, and a user must not be
made to say it (vocab.DomainWords).

The list (`english_words.txt.gz`: lowercase words of 2-24 letters, one per line, sorted) is
derived from the English word-frequency dictionary of pyspellchecker 0.9.1 (MIT License,
Copyright (c) 2018-2021 Tyler Barrus), which is built from the OpenSubtitles word frequencies
and filtered against dictionaries. It is shipped with the toolkit rather than read from the
package at run time, so that the generator's phrasing (and with it its output) never changes
with a dependency's update, and it loads in ~20 ms (the package's own file takes ~150 ms).
Rebuild it with `python -m toolkit.envs.sqlite.english build` (needs pyspellchecker installed).
"""

from __future__ import annotations

import gzip
import re
import sys
import threading
from pathlib import Path

_FILE = Path(__file__).with_name("english_words.txt.gz")
_WORDS: frozenset[str] | None = None
_LOCK = threading.Lock()
# no vowel (y counted as one): not a word, decided without loading the list ("nm", "brd", "sts")
_NO_VOWEL = re.compile(r"[^aeiouy]+")


def _words() -> frozenset[str]:
    global _WORDS
    if _WORDS is None:
        with _LOCK:
            if _WORDS is None:
                with gzip.open(_FILE, "rt", encoding="ascii") as f:
                    _WORDS = frozenset(f.read().split("\n"))
    return _WORDS


# British spellings the list (American) lacks, as rewrites to the American form: colour, centre,
# defence, organise, analyse, cheque, programme, kerb
_BRITISH = [(re.compile(p), r) for p, r in (
    (r"our(s|ed|ing|able|ite|ites)?$", r"or\1"), (r"([^aeiou])re(s|d)?$", r"\1er\2"), (r"ence(s)?$", r"ense\1"),
    (r"is(e|es|ed|ing|ation|ations)$", r"iz\1"), (r"ys(e|es|ed|ing)$", r"yz\1"), (r"ogue(s)?$", r"og\1"),
    (r"mme(s)?$", r"m\1"), (r"que(s)?$", r"ck\1"), (r"^kerb", "curb"), (r"our", "or"))]


# the list's two-letter entries are mostly abbreviations ("dy", "cd", "wt"): these are the words
_TWO = frozenset("ad ah am an as at aw ax ay be bi by do ex go ha he hi ho id if in is it lo ma me mi my no of "
                 "oh ok on or ow ox pa pi re so to uh um up us we ye yo".split())


def is_word(token: str) -> bool:
    """`token` (any case) is an English word of two letters or more (British spellings too)."""
    w = str(token).lower()
    if len(w) < 2 or not w.isascii() or not w.isalpha() or _NO_VOWEL.fullmatch(w):
        return False
    if len(w) == 2:
        return w in _TWO
    words = _words()
    if w in words:
        return True
    return any(w2 != w and w2 in words for w2 in (p.sub(r, w) for p, r in _BRITISH))


# function words: never what an abbreviation stands for ("wt" is not "with")
_FUNCTION = frozenset("""about above after again against also among and any are because been before being below
between both but can could did does doing done down during each either else every few for from further had has
have having her here hers him his how into its just may might more most much must neither never nor not now off
once only onto other others our out over own per same shall she should since some such than that the their them
then there these they this those through thus too under until upon very via was were what when where whether which
while who whom whose why will with within without would yet you your except besides beyond despite inside
outside toward towards across along around behind beside near though although unless whereas already always
often""".split())


def _subsequence(short: str, long: str) -> bool:
    it = iter(long)
    return all(ch in it for ch in short)


def expansion(abbrev: str, tokens: set[str]) -> str | None:
    """The word of the domain's own texts (`tokens`: their lowercase words) that the abbreviation
    `abbrev` (no word itself) stands for, or None when none or more than one fits: a word the
    abbreviation begins ("inv" -> "invoice"), else a word holding its letters in order from the
    same first letter ("pmt" -> "payment", "ownr" -> "owner"; "brd" with both "breed" and
    "birds" in the texts: None). `tokens` are compared in the singular (a trailing -s, -es, -ies)."""
    a = abbrev.lower()
    if len(a) < 2 or is_word(a):
        return None
    cands = set()
    for t in tokens:
        if len(t) <= len(a) or t[0] != a[0] or t in _FUNCTION or not is_word(t):
            continue
        ones = [t[:-3] + "y"] if t.endswith("ies") else [t[:-2], t[:-1]] if t.endswith("es") else \
            [t[:-1]] if t.endswith("s") and not t.endswith(("ss", "us", "is")) else []
        cands.add((next((o for o in ones if len(o) > len(a) and is_word(o)), t), t))
    for fits in (lambda w: w.startswith(a), lambda w: _subsequence(a, w)):
        hit = {one for one, t in cands if fits(one) or fits(t)}
        if hit:
            return hit.pop() if len(hit) == 1 else None
    return None


def build(out: Path = _FILE) -> int:
    """Write the list from the installed pyspellchecker's English dictionary; the word count."""
    import json
    from importlib import resources

    src = resources.files("spellchecker") / "resources" / "en.json.gz"
    with src.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        freq = json.load(f)
    words = sorted(w for w in freq if re.fullmatch(r"[a-z]{2,24}", w))
    # mtime 0: the same bytes on every rebuild
    with open(out, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write("\n".join(words).encode("ascii"))
    return len(words)


if __name__ == "__main__":  # pragma: no cover - a maintainer's rebuild
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m toolkit.envs.sqlite.english build")
    print(f"{build()} words -> {_FILE}", file=sys.stderr)
