"""User-facing phrasing of LOGIGEN goals: rows, values and changes in the user's words (enum values
as adjectives, a yes/no value as "with/without <attribute>", a date with what it dates), never a
column name next to its value or a procedure (the leak rule: projection.forbidden_terms)."""

from __future__ import annotations

from typing import Any

from toolkit.flows.logigen.explorer import DomainView, _is_date


def words(ident: Any) -> str:
    return str(ident).replace("_", " ").strip()


_YES_NO = ({"yes", "no"}, {"true", "false"}, {"y", "n"})


def _yes(c: Any, v: Any) -> bool | None:
    """For a two-valued yes/no enum column, whether `v` is its yes; else None (such a value alone,
    "passenger count 1, yes", says nothing: the phrase is "with insurance" / "without insurance")."""
    if c is None or not c.enum or len(c.enum) != 2:
        return None
    low = {str(x).lower() for x in c.enum}
    if low not in _YES_NO:
        return None
    return str(v).lower() in ("yes", "true", "y")


class Phrases:
    """User-facing phrasing of rows and values: what the user wants, never which column to set."""

    def __init__(self, view: DomainView):
        self.view = view

    def value(self, table: str, col: str, v: Any, *, attr: bool = True) -> str:
        view = self.view
        c = view.tables[table].colmap.get(col)
        fk = view.fk(table, col)
        if fk:
            return f"{self.ref_noun(table, col)} {v}"
        yes = _yes(c, v)
        if yes is not None:
            return f"{'with' if yes else 'without'} {words(col)}"
        if c is not None and c.enum:
            return words(v)  # an adjective, never "<column> <value>"
        if _is_date(v):
            return f"on {v}" if attr else str(v)
        if isinstance(v, bool) or (c is not None and c.json_type == "boolean"):
            return f"{'with' if v else 'without'} {words(col)}"
        return f"{words(col)} {v}" if attr else str(v)

    def has_role(self, table: str, col: str) -> bool:
        """Whether the reference `col` shares its target table with another reference of `table`
        (a transfer's from_account and to_account): then its own name says which one it is."""
        to = (self.view.fk(table, col) or {}).get("table")
        return sum((self.view.fk(table, c.name) or {}).get("table") == to for c in self.view.tables[table].columns) > 1

    def ref_noun(self, table: str, col: str) -> str:
        """What a reference is called: the table it points to ("account"), or its own name when it
        has a role ("from account", "to account")."""
        return words(col) if self.has_role(table, col) else words((self.view.fk(table, col) or {}).get("table"))

    def value_of_key(self, table: str, v: Any) -> str:
        return f"their {words(table)} number is {v}"

    def row(self, table: str, filters: dict) -> str:
        """"the booked rental for car SP-808 on 2025-06-04": enum values as adjectives, references
        and dates after the noun, never a column name next to its value."""
        view = self.view
        t = view.tables[table]
        adj, rest = [], []
        for k, v in filters.items():
            c = t.colmap.get(k)
            if _yes(c, v) is not None:
                rest.append(self.value(table, k, v))
            elif c is not None and c.enum and not view.fk(table, k):
                adj.append(words(v))
            elif view.fk(table, k):
                # "the transfer to account ACC-30022" where a table has two references to one table
                rest.append(self.value(table, k, v) if self.has_role(table, k) else f"for {self.value(table, k, v)}")
            else:
                rest.append(self.value(table, k, v) if _is_date(v) else f"with {self.value(table, k, v)}")
        return " ".join(["the"] + adj + [words(table)] + rest)

    def change(self, table: str, col: str, old: Any, new: Any) -> str:
        view = self.view
        c = view.tables[table].colmap.get(col)
        fk = view.fk(table, col)
        if fk:
            return f"moved to {self.ref_noun(table, col)} {new} (instead of {old})"
        yes = _yes(c, new)
        if yes is not None:
            return f"{'with' if yes else 'without'} {words(col)} (not as now)"
        if c is not None and c.enum:
            return f"{words(new)} (it is {words(old)} now)"
        if _is_date(new):  # "date of birth 1979-01-31 instead of ...": the date says which one
            return f"{words(col)} {new} instead of {old}"
        if isinstance(new, (int, float)) and not isinstance(new, bool):
            return f"{words(col)} {new} instead of {old}"
        if old is None:
            return f"{words(col)} '{new}' (none now)"
        return f"{words(col)} '{new}' instead of '{old}'"
