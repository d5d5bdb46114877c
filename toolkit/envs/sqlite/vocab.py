"""A sqlite domain's own words: what its tables and columns are called in a person's words.

Read from what a domain author already writes, never from a per-domain table in code:

- table nouns: the table's name in words, singular and plural (`loans` -> "loan" / "loans": the
  singular from its key column `loan_id` or the references `loan_id` of other tables, else by
  English inflection; `booking_extra` -> "booking extra");
- column meanings: the column's `--` comment in schema.sql cleaned into a noun phrase
  (`-- price per night in EUR` -> "price per night", unit "EUR"; `-- e.g. G-017`,
  `-- YYYY-MM-DD`, `-- set by the hotel system` say nothing and are dropped), a gloss in the
  policy or in tools.yaml descriptions (`` `due_day` is the day the book must be back``), a
  one-word column name that is an English word (`amount`, `capacity`; english.is_word: not
  `nm`, `brd`, `sts`), or the name's grammar made of words
  (`returned_day` -> "returned on day 41", `num_guests` -> "number of guests"); a flag
  (a 0/1 or yes/no column) as what it means (`-- 1 for a student card` -> "with a student card",
  `is_electric` -> "electric" / "not electric");
- where a domain gives no words, `attr` is None and the caller falls back to generic phrasing
  (the value alone: "45 changed to 52"), never to the column's name.

`banned(text)` is the check the user views must pass (validate-task's projection verdict, `toolkit
stats --quality`, the generator's own phrasing): a multi-word column name, with underscores or
with spaces ("due_day", "due day"), a one-word column name that is no English word ("nm", "sts";
unless the domain also uses it as a value or a table's name), or "a <plural table>" ("a loans",
"a new members"). A one-word column name that is a word ("amount") is not banned by itself.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from toolkit.envs.sqlite.english import is_word

# ---------------------------------------------------------------------------------------------
# English inflection (grammar, not a domain vocabulary)

_IRREGULAR = {"person": "people", "child": "children", "man": "men", "woman": "women", "mouse": "mice",
              "tooth": "teeth", "foot": "feet", "goose": "geese", "datum": "data", "medium": "media",
              "criterion": "criteria", "analysis": "analyses", "index": "indices", "staff": "staff",
              "series": "series", "species": "species", "equipment": "equipment", "information": "information"}
_IRREGULAR_BACK = {v: k for k, v in _IRREGULAR.items() if k != v}
_SINGULAR_S = ("ss", "us", "is", "as", "os")  # status, bonus, analysis, gas, kudos: already singular


def plural(word: str) -> str:
    """The plural of an English noun (the last word of a phrase: "booking extra" -> "booking extras")."""
    if not word:
        return word
    head, _, last = word.rpartition(" ")
    low = last.lower()
    if low in _IRREGULAR:
        out = _IRREGULAR[low]
    elif low in _IRREGULAR_BACK or (low.endswith("s") and not low.endswith(_SINGULAR_S)):
        out = last  # already plural
    elif re.search(r"[^aeiou]y$", low):
        out = last[:-1] + "ies"
    elif re.search(r"(?:s|x|z|ch|sh)$", low):
        out = last + "es"
    else:
        out = last + "s"
    return f"{head} {out}" if head else out


def singular(word: str, hints: tuple[str, ...] = ()) -> str:
    """The singular of an English noun (the last word of a phrase). `hints`: words the domain uses
    for one item (the `loan` of a key column `loan_id`): a hint the word starts with wins."""
    if not word:
        return word
    head, _, last = word.rpartition(" ")
    low = last.lower()
    out = last
    hit = [h for h in hints if h and low.startswith(h.lower()) and len(low) - len(h) in (1, 2, 3)
           and plural(h).lower() == low]
    if hit:
        out = max(hit, key=len)
    elif low in _IRREGULAR_BACK:
        out = _IRREGULAR_BACK[low]
    elif low in _IRREGULAR or not low.endswith("s") or low.endswith(_SINGULAR_S):
        out = last
    elif low.endswith("ies") and len(low) > 4:
        out = last[:-3] + "y"
    elif re.search(r"(?:sses|xes|zes|ches|shes)$", low):
        out = last[:-2]
    else:
        out = last[:-1]
    return f"{head} {out}" if head else out


def article(phrase: str) -> str:
    return "an" if re.match(r"(?i)[aeio]|u(?![nr]i|s[aeiou])", phrase or "") else "a"


def words(ident: Any) -> str:
    return str(ident).replace("_", " ").strip()


# ---------------------------------------------------------------------------------------------
# cleaning a comment into a noun phrase

_UNITS = {"usd", "eur", "gbp", "jpy", "chf", "cad", "aud", "inr", "cny", "sek", "nok", "dkk", "pln",
          "dollars", "euros", "pounds", "cents", "minutes", "hours", "days", "nights", "weeks", "months",
          "years", "km", "kg", "g", "mg", "ml", "l", "%", "percent"}
_FORMAT = re.compile(r"(?i)\b(?:yyyy-mm-dd(?:[ t]hh:mm(?::ss)?)?|yyyy-mm|hh:mm(?::ss)?|iso[- ]?8601|iso date|"
                     r"format\b.*)$|\b(?:yyyy-mm-dd|yyyy-mm|hh:mm)\b")
# comments that say where a value comes from, not what it is
_PROVENANCE = re.compile(r"(?i)^(?:set|maintained|computed|calculated|filled|kept|updated|stored|generated|"
                         r"assigned|written|derived|managed|auto\w*|internal|technical|read[- ]only|"
                         r"not settable|system|deprecated|unused|legacy|todo|fixme|see)\b")
_LEAD = re.compile(r"(?i)^(?:the|a|an|this|its|their|our)\s+")
# a period's two ends: the words before a date suffix (`start_date`, `end_d`), and whole names
_PERIOD_START = {("start",), ("starts",), ("begin",), ("begins",), ("from",)}
_PERIOD_END = {("end",), ("ends",), ("until",), ("to",), ("expiry",), ("expires",)}
_PERIOD_NAMES = {("valid", "from"): "starting", ("valid", "to"): "ending", ("valid", "until"): "ending",
                 ("starts", "on"): "starting", ("ends", "on"): "ending", ("date", "from"): "starting",
                 ("date", "to"): "ending"}
# a key's format written as its comment ("FRZ-yyyy-nnn", "SR-####", "mm/dd"): a mask, not words
_MASK_PART = re.compile(r"[A-Z]{1,6}|\d+|(.)\1+")
_REL = re.compile(r"(?i)\s+(?:that|which|who|whose|where|when|while|if|once|until|as)\s+.*$")
_FLAG_DOC = re.compile(r"(?i)^\s*(?:1|true|yes|y|set|on)\s*(=|:|->|for|marks|when|if|means that|means)\s*(.+)$")
_PARTICIPLES = {"due", "paid", "made", "held", "sent", "done", "born", "given", "taken", "seen", "won", "lost",
                "built", "sold", "bought", "spent", "kept", "left", "begun", "run", "set", "shut", "cut", "put",
                "read", "met", "found", "hired", "fired", "issued", "opened", "closed", "valid"}


# the parts of a name `_grammar` turns into its own words ("number of", "maximum")
_GRAMMAR_WORDS = frozenset({"num", "n", "nb", "no", "count", "total", "qty", "number", "of", "max", "min"})
_ADJECTIVE = re.compile(r"(?:ed|en|ive|al|able|ible|ic|ous|ful|less|ant|ent|ary|ory|ile|ish)$")


def _squash(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip(" .,;:-")


def _is_mask(word: str) -> bool:
    """A code's format ("FRZ-yyyy-nnn", "SR-####", "mm/dd", "G-017"): parts split by - or /, each
    capitals, digits or one character repeated."""
    parts = re.split(r"[-/]", word.strip(".,;"))
    return len(parts) > 1 and all(x and _MASK_PART.fullmatch(x) for x in parts)


def clean_doc(doc: str) -> tuple[str | None, str | None]:
    """(noun phrase, unit) of a column comment: "price per night in EUR" -> ("price per night",
    "EUR"); "e.g. G-017", "YYYY-MM-DD", "set by the hotel system" -> (None, None); "EUR" -> (None,
    "EUR"). The phrase is cut at the first clause break (";", ":", ", ", " - ", "e.g."), keeps at
    most 8 words and drops a leading article."""
    s = str(doc or "").strip()
    if not s:
        return None, None
    s = re.split(r"(?i)(?:^|[\s,;(])(?:e\.g\.|eg\.|i\.e\.|ex\.|for example|such as|like)\s", " " + s)[0]
    s = re.sub(r"\([^)]*\)", " ", s)
    parts = re.split(r";|:|\s[-–—]\s|\. |\s\||,\s", s)
    s = parts[0]
    unit = None
    if len(parts) > 1 and _squash(parts[1]).lower() in _UNITS:  # "price of a permit per month, EUR"
        unit = _squash(parts[1])
    s = _squash(_FORMAT.sub(" ", s))
    s = _squash(" ".join(w for w in s.split() if not _is_mask(w)))
    m = re.search(r"(?i)(?:^|\s)(?:in|as|of)\s+([A-Za-z%]{1,8})$", s)
    if m and m.group(1).lower() in _UNITS:
        unit, s = m.group(1), _squash(s[:m.start()])
    elif s.lower() in _UNITS or (re.fullmatch(r"[A-Z]{3}", s) is not None):
        return None, s
    if not s or _PROVENANCE.match(s) or re.match(r"^[\d\W]", s):
        return None, unit
    s = _LEAD.sub("", s)
    if len(s.split()) > 8 or len(s) < 3 or "_" in s:
        return None, unit
    return s, unit


# ---------------------------------------------------------------------------------------------


class DomainWords:
    """The words of one compiled sqlite domain (see the module doc). Built once per domain
    (`domain_words`)."""

    def __init__(self, dom: Any):
        self.dom = dom
        self.tables = dom.tables
        self._known: dict[str, bool] = dict(getattr(dom, "words", None) or {})
        self._exp: dict[str, str] = dict(getattr(dom, "expansions", None) or {})  # `inv` -> "invoice"
        self._fk: dict[tuple[str, str], dict] = {}
        for t in self.tables.values():
            for fk in t.fks:
                self._fk.setdefault((t.name, fk.get("column")), fk)
        # banned: every multi-word column name, raw and spaced
        self.column_names = sorted({c.name for t in self.tables.values() for c in t.columns if "_" in c.name.strip("_")})
        self.spaced = sorted({words(c).lower() for c in self.column_names} - {""})
        self._nouns: dict[str, tuple[str, str]] = {t: self._noun_of(t) for t in self.tables}
        self.plural_tables = sorted({words(t).lower() for t, (one, many) in self._nouns.items()
                                     if words(t).lower() != one.lower()})
        ban = [re.escape(x).replace(r"\ ", r"[\s_]+") for x in sorted(set(self.spaced) | {c.lower() for c in self.column_names},
                                                                      key=len, reverse=True)]
        self._ban_cols = re.compile(r"(?i)(?<![\w-])(?:" + "|".join(ban) + r")(?![\w-])") if ban else None
        # a raw name (underscores) is schema wherever it stands, inside a value too ("permit_id-7")
        raw = [re.escape(c.lower()) for c in sorted(self.column_names, key=len, reverse=True)]
        self._ban_raw = re.compile(r"(?i)(?<![A-Za-z0-9_])(?:" + "|".join(raw) + r")(?![A-Za-z0-9_])") if raw else None
        # a one-word column name that is no word (`nm`, `brd`, `sts`): schema as well, unless the
        # domain also says the token as a table's noun or as a value (`brd`, a species as well as
        # the breed column) - a person may repeat what the data says
        said = {str(v).lower() for t in self.tables.values() for c in t.columns for v in (c.enum or [])}
        said |= {x.lower() for one, many in self._nouns.values() for x in (one, many)}
        said |= {words(t).lower() for t in self.tables}
        self.abbreviations = sorted({c.name.lower() for t in self.tables.values() for c in t.columns
                                     if re.fullmatch(r"[A-Za-z]{2,}", c.name) and not self.word(c.name)} - said)
        ab = [re.escape(x) for x in sorted(self.abbreviations, key=len, reverse=True)]
        self._ban_abbrev = re.compile(r"(?i)(?<![\w-])(?:" + "|".join(ab) + r")(?![\w-])") if ab else None
        pl = [re.escape(x).replace(r"\ ", r"[\s_]+") for x in sorted(self.plural_tables, key=len, reverse=True)]
        self._ban_plural = (re.compile(r"(?i)\b(?:a|an|one)\s+(?:new\s+|other\s+|single\s+)?(?:" + "|".join(pl) + r")(?![\w-])")
                            if pl else None)
        self._gloss = self._glossary()
        self._attr: dict = {}

    def word(self, token: str) -> bool:
        """english.is_word, answered from the compiled domain's own judgments where it has one
        (the parts of its table and column names) without loading the word list."""
        low = token.lower()
        hit = self._known.get(low)
        if hit is None:
            hit = self._known[low] = is_word(low)
        return hit

    # -- nouns -------------------------------------------------------------------------------------

    def spelled(self, name: str) -> str:
        """A table's or column's name in words, each abbreviation the domain's texts spell out
        replaced by its word (`pmt` -> "payment", `is_dcsd` -> "is deceased")."""
        return " ".join(self._exp.get(p.lower(), p) for p in words(name).split())

    def _noun_of(self, table: str) -> tuple[str, str]:
        t = self.tables[table]
        w = self.spelled(table)
        hints: list[str] = []
        for c in t.pk:  # loan_id in loans
            m = re.match(r"(.+?)_(?:id|no|num|number|code|key|ref)$", c)
            if m:
                hints.append(words(m.group(1)).split()[-1])
        for o in self.tables.values():  # member_id REFERENCES members
            for fk in o.fks:
                if fk.get("table") == table:
                    m = re.match(r"(.+?)_(?:id|no|num|number|code|key|ref)$", str(fk.get("column")))
                    if m:
                        hints.append(words(m.group(1)).split()[-1])
        one = singular(w, tuple(hints))
        if w != words(table):  # spelled out from an abbreviation: the word is singular
            return w, plural(w)
        return one, (w if one != w else plural(one))

    def noun(self, table: str) -> str:
        """One row of the table in words ("loan", "booking extra")."""
        return self._nouns.get(table, (words(table), words(table)))[0]

    def nouns(self, table: str) -> str:
        return self._nouns.get(table, (words(table), words(table)))[1]

    # -- columns -----------------------------------------------------------------------------------

    def _glossary(self) -> dict[str, str]:
        """{column: meaning} from the policy and tools.yaml texts: "`due_day` is the day ...",
        "due_day: the day ...", "due_day (the day ...)"."""
        spec = self.dom.spec
        blob = "\n".join([spec.policy or "", *spec.tool_texts()])
        out: dict[str, str] = {}
        for c in self.column_names:
            if c not in blob:
                continue  # the pattern holds the name literally: nothing to compile (~1 ms each)
            pat = (r"[`*\"']*" + re.escape(c) + r"[`*\"']*\s*(?::|=|—|–|-|\(|\bis\b|\bmeans\b|\bholds\b|\bgives\b|\bstores\b)\s*"
                   r"([^.;\n()]{3,80})")
            m = re.search(pat, blob)
            if m:
                phrase, _ = clean_doc(m.group(1))
                if phrase and self.clean(phrase):
                    out[c] = phrase
        return out

    def _col(self, table: str, col: str) -> Any:
        t = self.tables.get(table)
        return t.colmap.get(col) if t is not None else None

    def is_flag(self, table: str, col: str) -> bool:
        c = self._col(table, col)
        if c is None:
            return False
        if c.json_type == "boolean":
            return True
        low = {str(x).lower() for x in (c.enum or [])}
        return len(low) == 2 and low in ({"0", "1"}, {"yes", "no"}, {"true", "false"}, {"y", "n"})

    def is_yes(self, v: Any) -> bool:
        return str(v).lower() in ("1", "yes", "true", "y", "1.0")

    def flag(self, table: str, col: str) -> tuple[str, str]:
        """(yes, no) phrases of a flag: "with a student card" / "without a student card" (from
        "-- 1 for a student card"), "electric" / "not electric" (`is_electric`), "paid" / "not paid"."""
        key = ("flag", table, col)
        if key in self._attr:
            return self._attr[key]
        c = self._col(table, col)
        out = None
        m = _FLAG_DOC.match(str(getattr(c, "doc", "") or ""))
        if m:
            what, _ = clean_doc(m.group(2))
            if what and self.clean(what):
                if m.group(1).lower() in ("when", "if", "means that", "means"):  # a clause
                    out = (f"where {what}", f"where it is not so that {what}")
                else:  # a thing: "1 for a student card"
                    lead = re.match(r"(?i)(?:a|an|the)\s", m.group(2).strip())
                    ph = (lead.group(0) if lead else "") + what
                    out = (f"with {ph}", f"without {ph}")
        if out is None:
            parts = [self._exp.get(p, p) for p in col.lower().strip("_").split("_")]
            if parts[0] in ("is", "was", "can", "allows", "allow") and len(parts) > 1:
                stem = " ".join(parts[1:])
                out = (stem, f"not {stem}")
            elif parts[0] in ("has", "with", "needs", "requires", "includes") and len(parts) > 1:
                stem = " ".join(parts[1:])
                out = (f"with {stem}", f"without {stem}")
            elif len(parts) == 1 and _ADJECTIVE.search(parts[0]):  # paid, active, electric
                out = (parts[0], f"not {parts[0]}")
            elif len(parts) == 1:  # a thing it has or not: insurance
                out = (f"with {parts[0]}", f"without {parts[0]}")
            if out is not None and not all(self.word(w) for w in (parts[1:] if len(parts) > 1 else parts)):
                out = None  # `is_actv`: "actv" is no word
            if out is None:
                out = ("with that option", "without that option")
        if not (self.clean(out[0]) and self.clean(out[1])):
            out = ("with that option", "without that option")
        self._attr[key] = out
        return out

    def unit(self, table: str, col: str) -> str | None:
        key = ("unit", table, col)
        if key not in self._attr:
            c = self._col(table, col)
            self._attr[key] = clean_doc(getattr(c, "doc", "") or "")[1] if c is not None else None
        return self._attr[key]

    def attr(self, table: str, col: str) -> str | None:
        """The column's meaning as a noun phrase ("price per night", "amount"), or None when the
        domain gives no words for it (see the module doc)."""
        key = (table, col)
        if key in self._attr:
            return self._attr[key]
        c = self._col(table, col)
        out = None
        cands: list[str] = []
        if c is not None:
            phrase, _ = clean_doc(c.doc or "")
            if phrase:
                cands.append(phrase)
                cut = _REL.sub("", phrase)
                if cut != phrase and len(cut.split()) >= 2:
                    cands.insert(0, cut)
        if col in self._gloss:
            cands.append(self._gloss[col])
        if "_" not in col.strip("_") and re.fullmatch(r"[A-Za-z]+", col):
            if self.word(col):
                cands.append(col.lower())  # `amount`, `breed`; never `nm`, `brd`, `sts`
            elif col.lower() in self._exp:
                cands.append(self._exp[col.lower()])  # `nm` -> "name" where the policy says "name"
        cands += self._grammar(col)
        for x in cands:
            if x and self.clean(x):
                out = x
                break
        self._attr[key] = out
        return out

    def _grammar(self, col: str) -> list[str]:
        """Noun phrases from the shape of a multi-word name that are not the name itself:
        `num_guests` / `guest_count` -> "number of guests", `max_loans` -> "maximum loans"."""
        parts = col.lower().strip("_").split("_")
        if len(parts) < 2:
            return []
        out = []
        if parts[0] in ("num", "n", "nb", "no", "count") and len(parts) > 1:
            out.append("number of " + plural(" ".join(parts[1:])))
        if parts[-1] in ("count", "total", "qty") and parts[0] not in ("num", "n", "nb"):
            out.append("number of " + plural(" ".join(parts[:-1])))
        if parts[:2] == ["number", "of"] and len(parts) > 2:
            out.append("count of " + " ".join(parts[2:]))
        if parts[0] in ("max", "min") and len(parts) > 1:
            out.append(("maximum " if parts[0] == "max" else "minimum ") + " ".join(parts[1:]))
        if parts[-1] in ("max", "min"):
            out.append(("maximum " if parts[-1] == "max" else "minimum ") + " ".join(parts[:-1]))
        # "maximum dy" from `max_dy` says the abbreviation: only names made of words
        if out and not all(self.word(p) for p in parts if p not in _GRAMMAR_WORDS):
            return []
        return out

    def when(self, col: str) -> tuple[str, str] | None:
        """(participle, "day"|"date") of a name like `returned_day`, `due_day`, `booked_on`: the
        value said as "returned on day 41", "booked 2025-05-01"; a period's ends (`start_date`,
        `end_d`, `valid_from`, `valid_to`, `starts_on`) as "starting"/"ending"; None for other names."""
        parts = col.lower().strip("_").split("_")
        if tuple(parts) in _PERIOD_NAMES:
            return _PERIOD_NAMES[tuple(parts)], "on"
        if len(parts) < 2 or parts[-1] not in ("day", "date", "on", "at", "time", "dt", "d"):
            return None
        # the two ends of a period (`start_date`, `valid_from`, `end_d`, `valid_until`): "starting
        # 2025-06-20", "ending 2025-07-04" (two bare "on <date>" would not say which is which)
        head = tuple(x for x in parts[:-1] if x != "valid") if parts[-1] != "on" else tuple(parts[:-1])
        if head in _PERIOD_START:
            return "starting", "on"
        if head in _PERIOD_END:
            return "ending", "on"
        if parts[-1] == "d":
            return None
        p = " ".join(parts[:-1])
        last = parts[-2]
        if not (last.endswith("ed") or last in _PARTICIPLES):
            return None
        return p, parts[-1]

    # -- the check ---------------------------------------------------------------------------------

    def banned(self, text: str) -> list[str]:
        """What `text` says that a person would not: a multi-word column name (raw or spaced) and
        "a <plural table>"."""
        found: list[str] = []
        if not text:
            return found
        if self._ban_cols is not None:
            found += [f"column {m.group(0)!r}" for m in self._ban_cols.finditer(text)]
        if self._ban_raw is not None:
            found += [f"column {m.group(0)!r}" for m in self._ban_raw.finditer(text)]
        if self._ban_abbrev is not None:
            found += [f"column {m.group(0)!r}" for m in self._ban_abbrev.finditer(text)]
        if self._ban_plural is not None:
            found += [f"plural table {m.group(0)!r}" for m in self._ban_plural.finditer(text)]
        return list(dict.fromkeys(found))

    def clean(self, phrase: str) -> bool:
        return not self.banned(phrase)

    def patterns(self) -> list[str]:
        """The regular expressions of `banned` (case-insensitive inline flag): for a leak rule that
        stores its terms as text."""
        return [x.pattern for x in (self._ban_cols, self._ban_raw, self._ban_abbrev, self._ban_plural)
                if x is not None]


_CACHE: dict[int, tuple[Any, DomainWords]] = {}
_LOCK = threading.Lock()


def domain_words(dom: Any) -> DomainWords:
    """The DomainWords of a compiled domain, built once (kept while the domain is alive)."""
    hit = _CACHE.get(id(dom))
    if hit is not None and hit[0] is dom:
        return hit[1]
    w = DomainWords(dom)
    with _LOCK:
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[id(dom)] = (dom, w)
    return w
