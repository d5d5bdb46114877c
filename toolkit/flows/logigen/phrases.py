"""User-facing phrasing of LOGIGEN goals: rows, values and changes in a person's words, built from
the domain's own words (`toolkit.envs.sqlite.vocab`: table nouns singular and plural, column
meanings from schema comments, the policy and tools.yaml, flags as what they mean). Never a column
name, with or without underscores, next to its value, never "a <plural table>", never a procedure
(the leak rule: projection.forbidden_terms); where the domain gives no words for a column, the
value alone in a generic frame ("45 changed to 52")."""

from __future__ import annotations

from typing import Any

from toolkit.envs.sqlite.vocab import _REL, article, clean_doc, domain_words, words
from toolkit.flows.logigen.explorer import DomainView, _is_date

__all__ = ["Phrases", "words", "article", "_is_date"]

_PREPOSITIONS = ("on", "in", "at", "under", "out", "off", "for", "with", "without", "by", "to", "from", "over",
                 "awaiting", "pending")


def _q(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) and not _is_date(v) else str(v)


class Phrases:
    """User-facing phrasing of rows and values: what the user wants, never which column to set."""

    def __init__(self, view: DomainView):
        self.view = view
        self.w = domain_words(view.domain)
        self._roles: dict = {}
        # the user (the principal's table and key) the phrases are said by: their own references
        # are "my ..." (set per chain by the goal explorer)
        self.me_table: str | None = None
        self.me: Any = None

    def is_me(self, table: str, col: str, v: Any) -> bool:
        fk = self.view.fk(table, col)
        return bool(fk) and self.me is not None and fk.get("table") == self.me_table and v == self.me

    # -- nouns ---------------------------------------------------------------------------------------

    def noun(self, table: str) -> str:
        return self.w.noun(table)

    def nouns(self, table: str) -> str:
        return self.w.nouns(table)

    def a_new(self, table: str) -> str:
        return f"a new {self.noun(table)}"

    def with_a(self, table: str) -> str:
        n = self.noun(table)
        return f"{article(n)} {n}"

    def has_role(self, table: str, col: str) -> bool:
        """Whether the reference `col` shares its target table with another reference of `table`
        (a transfer's from_account and to_account): then its own role says which one it is."""
        to = (self.view.fk(table, col) or {}).get("table")
        return sum((self.view.fk(table, c.name) or {}).get("table") == to for c in self.view.tables[table].columns) > 1

    def ref_noun(self, table: str, col: str) -> str:
        """What a reference is called: the noun of the table it points to ("account"), or its role
        when the table has two references to it ("sending account", from the column's comment)."""
        to = (self.view.fk(table, col) or {}).get("table")
        noun = self.noun(to) if to in self.view.tables else "item"
        if not self.has_role(table, col):
            return noun
        return self._role_names(table, to, noun).get(col, noun)

    def _role_names(self, table: str, to: str, noun: str) -> dict:
        key = (table, to)
        if key in self._roles:
            return self._roles[key]
        cols = [c.name for c in self.view.tables[table].columns if (self.view.fk(table, c.name) or {}).get("table") == to]
        full = {c: clean_doc(self.view.tables[table].colmap[c].doc or "")[0] for c in cols}
        short = {c: (_REL.sub("", x) if x else None) for c, x in full.items()}
        out: dict = {}
        for src in (short, full):
            names = [src[c] for c in cols]
            if all(names) and len({n.lower() for n in names}) == len(names) and all(self.w.clean(n) for n in names):
                out = dict(zip(cols, names))
                break
        if not out:
            ords = ("first", "second", "third", "fourth", "fifth")
            out = {c: f"{ords[i] if i < len(ords) else str(i + 1) + 'th'} {noun}" for i, c in enumerate(cols)}
        self._roles[key] = out
        return out

    # -- one value -------------------------------------------------------------------------------------

    def nameable(self, table: str, col: str) -> bool:
        """Whether a person can name this column's value (a reference, a kind, a flag, a date or a
        number the domain has words for): look-ups and menus use only these."""
        v = self.view
        c = v.tables[table].colmap.get(col)
        if c is None:
            return False
        if v.fk(table, col) or self.w.is_flag(table, col) or c.enum:
            return True
        return self.w.attr(table, col) is not None or self.w.when(col) is not None

    def _num(self, table: str, col: str, v: Any) -> str:
        u = self.w.unit(table, col)
        return f"{v} {u}" if u and isinstance(v, (int, float)) and not isinstance(v, bool) else _q(v)

    @staticmethod
    def _label(attr: str, vtxt: str) -> str:
        return f"{attr} {vtxt}" if " " not in attr else f"{attr}: {vtxt}"

    def _when(self, col: str, v: Any) -> str | None:
        wh = self.w.when(col)
        if wh is None:
            return None
        p, suffix = wh
        if isinstance(v, int) and not isinstance(v, bool) and suffix == "day":
            return f"{p} on day {v}"
        if _is_date(v) or isinstance(v, str):
            return f"{p} {v}" if suffix in ("on", "at") else f"{p} on {v}"
        return None

    def flag_word(self, table: str, col: str, v: Any) -> str:
        yes, no = self.w.flag(table, col)
        return yes if self.w.is_yes(v) else no

    def value(self, table: str, col: str, v: Any, *, attr: bool = True) -> str:
        view = self.view
        c = view.tables[table].colmap.get(col)
        if view.fk(table, col):
            return f"{self.ref_noun(table, col)} {v}"
        if self.w.is_flag(table, col):
            return self.flag_word(table, col, v)
        if c is not None and c.enum:
            return words(v)  # an adjective, never "<column> <value>"
        if not attr:
            return self._num(table, col, v)
        w = self._when(col, v)
        if w:
            return w
        a = self.w.attr(table, col)
        if a:
            return self._label(a, self._num(table, col, v))
        if _is_date(v):
            return f"on {v}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"the number {self._num(table, col, v)}"  # no words for it: the value, said as one
        return self._num(table, col, v)

    def value_of_key(self, table: str, v: Any) -> str:
        n = self.noun(table)
        for s in (f"their {n} number is {v}", f"their {n} reference is {v}", f"their number is {v}"):
            if self.w.clean(s):
                return s
        return f"their number is {v}"

    # -- a row ---------------------------------------------------------------------------------------

    def row(self, table: str, filters: dict) -> str:
        """"the booked rental for car SP-808 on 2025-06-04": kinds as adjectives, references and
        dates after the noun, never a column name next to its value."""
        view = self.view
        t = view.tables[table]
        adj, rest = [], []
        det = "the"
        for k, v in filters.items():
            c = t.colmap.get(k)
            if self.is_me(table, k, v):
                det = "my"  # "my reservation", not "the reservation for member m_cy"
            elif view.fk(table, k):
                # "the transfer to account ACC-30022" where a table has two references to one table
                rest.append(f"with {self.value(table, k, v)}" if self.has_role(table, k) else f"for {self.value(table, k, v)}")
            elif self.w.is_flag(table, k):
                fw = self.flag_word(table, k, v)
                (adj if len(fw.split()) == 1 else rest).append(fw if len(fw.split()) == 1 else f"({fw})")
            elif c is not None and c.enum:
                ww = words(v)
                if ww.split()[0].lower() in _PREPOSITIONS:
                    rest.append(ww)  # "the book in repair", not "the in repair book"
                else:
                    adj.append(ww)
            else:
                w = self._when(k, v)
                a = self.w.attr(table, k)
                if w:
                    rest.append(w)
                elif a:
                    rest.append(f"whose {a} is {self._num(table, k, v)}")
                elif _is_date(v):
                    rest.append(f"on {v}")
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    rest.append(f"with the number {self._num(table, k, v)}")
                else:
                    rest.append(f"with {self._num(table, k, v)}")
        return " ".join([det] + adj + [self.noun(table)] + rest)

    def change(self, table: str, col: str, old: Any, new: Any) -> str:
        view = self.view
        c = view.tables[table].colmap.get(col)
        if view.fk(table, col):
            ref = self.ref_noun(table, col)
            return self._first_clean([f"moved to {ref} {new} (instead of {old})", f"{ref} {new} instead of {old}",
                                      f"now {ref} {new}, not {old}"])
        if self.w.is_flag(table, col):
            return f"{self.flag_word(table, col, new)} ({self.flag_word(table, col, old)} now)"
        if c is not None and c.enum:
            return f"{words(new)} (now {words(old) if old is not None else 'not set'})"
        wh = self.w.when(col)
        w = self._when(col, new)
        if wh and w:
            if old is None:
                return f"{w} (not {wh[0]} yet)"
            was = self._when(col, old) or str(old)
            return f"{w} instead of {was.split(' on ', 1)[-1] if ' on ' in was else old}"
        a = self.w.attr(table, col)
        nv, ov = self._num(table, col, new), self._num(table, col, old)
        if a:
            if old is None:
                return f"{self._label(a, nv)} (none now)"
            return f"{self._label(a, nv)} instead of {ov}"
        if old is None:
            return f"set to {nv} (empty now)"
        if isinstance(old, (int, float)) and not isinstance(old, bool):
            return f"the number {ov} changed to {nv}"
        return f"{ov} changed to {nv}"

    def _first_clean(self, options: list[str]) -> str:
        """The first phrasing that names no column of the domain (a natural phrase can collide
        with a column's words: "moved to account" and a column `to_account`)."""
        return next((o for o in options if self.w.clean(o)), options[-1])

    def preference(self, table: str, col: str, word: str) -> str | None:
        """"the lowest price per night": None when the column has no words (no menu on it)."""
        a = self.w.attr(table, col)
        if not a or self.w.is_flag(table, col):
            return None
        return f"the {word} {a}"
