"""New principals for a sqlite domain: the learn experiment's RL tasks are drawn on a base state
whose customers (patients, accounts ...) none of the SFT or held-out tasks name, so that a policy
rewarded for the exact end state must copy ids from the conversation instead of recalling the few
it was fine-tuned on (docs/learn.md).

`add_principals(env_ref, k, seed)` returns a state of the domain where the rows of its *principal*
table and every row that depends on them are replaced by `k` clones (or, `keep_original`, added to):

- the principal table: a table the agent can write (an insert/update tool it sees) that is
  referenced by the most foreign keys and references no other writable table (airline: customer;
  clinic: patient);
- a clone of a principal row takes its single-word name-like columns (first name, last name ...)
  from random rows of the table (recombined, never an existing combination), maps the words it
  changed into the key and the other text columns (`mia_li_3668` / `mia.li@example.com` →
  `omar_kim_5120` / `omar.kim@example.com`) and draws the key's digits anew;
- rows that reference a cloned row (payment methods, reservations, their payments ...) are cloned
  with it, recursively, with fresh keys (integers: past the largest; strings: new digits, mapped
  into the row's text, e.g. `credit_card_4421` / `Visa ending 4421` → `credit_card_0937` /
  `Visa ending 0937`) and their references remapped.

Catalogue rows (flights, doctors, drugs ...) are shared. The result loads into the environment
(checked), and is what `gen-task` reads as an inline `env.state`.
"""

from __future__ import annotations

import random
import re
from typing import Any
from toolkit.envs.sqlite import SqliteEnvironment

_WORD = re.compile(r"^[A-Za-z][A-Za-z' -]*$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_DIGITS = re.compile(r"\d+")


def _writable(dom: Any) -> set[str]:
    return {td.table for td in dom.tools.values() if td.kind in ("insert", "update") and not td.hidden}


def _fk_edges(dom: Any) -> list[tuple[str, str, str, str]]:
    """(child table, child column, parent table, parent column) for every foreign key."""
    out = []
    for t in dom.tables.values():
        for fk in t.fks:
            pt = dom.tables.get(fk.get("table"))
            if pt is None:
                continue
            to = fk.get("to") or (pt.pk[0] if len(pt.pk) == 1 else None)
            if to:
                out.append((t.name, fk.get("column"), pt.name, to))
    return out


def principal_table(dom: Any) -> str:
    """The writable table referenced by the most foreign keys that references no writable table."""
    writable = _writable(dom)
    edges = _fk_edges(dom)
    cands = [t for t in writable if len(dom.tables[t].pk) == 1
             and not any(c == t and p in writable and p != t for c, _, p, _ in edges)]
    if not cands:
        raise ValueError("no principal table: no writable table with a one-column key that references no other "
                         "writable table")
    return max(sorted(cands), key=lambda t: sum(1 for _, _, p, _ in edges if p == t))


def _case_like(new: str, old: str) -> str:
    if old.isupper() and len(old) > 1:
        return new.upper()
    if old[:1].isupper():
        return new[:1].upper() + new[1:].lower()
    return new.lower()


def _map_words(text: str, mapping: dict[str, str]) -> str:
    """Replace whole words (letters not adjacent to other letters; digit runs not adjacent to other
    digits) of `mapping` (case-insensitive for words, keeping each occurrence's case)."""
    for old, new in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
        if old.isdigit():
            text = re.sub(rf"(?<!\d){re.escape(old)}(?!\d)", new, text)
        else:
            text = re.sub(rf"(?<![A-Za-z]){re.escape(old)}(?![A-Za-z])", lambda m: _case_like(new, m.group(0)),
                          text, flags=re.IGNORECASE)
    return text


def _new_digits(old: str, rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in old) if len(old) > 1 else str(rng.randint(1, 9))


class _Cloner:
    def __init__(self, dom: Any, state: dict, rng: random.Random):
        self.dom, self.state, self.rng = dom, state, rng
        self.edges = _fk_edges(dom)
        self.taken: dict[str, set] = {t: {r.get(dom.tables[t].pk[0]) for r in rows}
                                      for t, rows in state.items() if len(dom.tables[t].pk) == 1}
        # text columns declared UNIQUE (e-mails ...): a clone must not repeat a value
        self.distinct: dict[str, list[str]] = {t: _unique_cols(dom.tables[t]) for t in state}
        self.used = {t: {c: {r.get(c) for r in rows} for c in self.distinct[t]} for t, rows in state.items()}

    def _string_cols(self, table: str) -> list[str]:
        tt = self.dom.tables[table]
        fkcols = {c for t, c, _, _ in self.edges if t == table}
        return [c.name for c in tt.columns if c.json_type == "string" and not c.enum and c.name not in fkcols]

    def fresh_key(self, table: str, row: dict, mapping: dict[str, str]) -> Any:
        tt = self.dom.tables[table]
        col = tt.colmap[tt.pk[0]]
        old = row.get(col.name)
        taken = self.taken.setdefault(table, set())
        if col.json_type == "integer" or isinstance(old, int):
            new = max([v for v in taken if isinstance(v, int)] + [0]) + 1
        else:
            base = _map_words(str(old), {k: v for k, v in mapping.items() if not k.isdigit()})
            for _ in range(200):
                digits = {d: _new_digits(d, self.rng) for d in _DIGITS.findall(base)}
                new = _map_words(base, digits) if digits else f"{base}_{self.rng.randint(100, 999)}"
                if new not in taken:
                    mapping.update(digits)
                    break
            else:  # pragma: no cover - 200 collisions of random digits
                raise ValueError(f"cannot find a fresh key for {table} like {old!r}")
        taken.add(new)
        return new

    def unique_ok(self, table: str, row: dict) -> bool:
        return all(row.get(c) not in self.used[table][c] for c in self.distinct.get(table, []))

    def commit(self, table: str, row: dict) -> None:
        for c in self.distinct.get(table, []):
            self.used[table][c].add(row.get(c))

    def clone(self, table: str, row: dict, mapping: dict[str, str], remap: dict[tuple[str, Any], Any]) -> dict:
        """A copy of `row` with a fresh key, the words of `mapping` mapped in its text columns and its
        references remapped (`remap[(parent table, old key)] = new key`)."""
        tt = self.dom.tables[table]
        new = dict(row)
        mapping = dict(mapping)
        for _ in range(50):
            key = self.fresh_key(table, row, mapping) if len(tt.pk) == 1 else None
            cand = dict(new)
            for c in self._string_cols(table):
                if isinstance(cand.get(c), str) and c not in tt.pk and not _DATE.match(cand[c]):
                    cand[c] = _map_words(cand[c], mapping)
            if key is not None:
                cand[tt.pk[0]] = key
            for t, c, p, _ in self.edges:
                if t == table and (p, row.get(c)) in remap:
                    cand[c] = remap[(p, row.get(c))]
            if self.unique_ok(table, cand):
                break
            # a distinct column collides (e.g. the same two names twice): new digits, and a suffix
            for c in self.distinct.get(table, []):
                if cand.get(c) in self.used[table][c] and isinstance(cand.get(c), str):
                    mapping[str(row.get(c))] = str(row.get(c))  # keep the mapping stable
                    cand[c] = re.sub(r"(@|$)", lambda m: f"{self.rng.randint(2, 99)}{m.group(1)}", cand[c], count=1)
            if self.unique_ok(table, cand):
                break
        self.commit(table, cand)
        return cand


def add_principals(env_ref: dict, k: int, seed: int = 0, keep_original: bool = False) -> tuple[dict, dict]:
    """(state, info): the domain's base state with its principals replaced by (or, keep_original,
    extended with) `k` clones and everything that depends on them; info names the principal table,
    the clones' keys and the rows cloned per table."""
    env = SqliteEnvironment.from_ref({k_: v for k_, v in env_ref.items() if k_ in ("backend", "id", "path", "config",
                                                                                  "state")})
    try:
        dom = env.domain
        state = env.snapshot()
        ptab = principal_table(dom)
        pkey = dom.tables[ptab].pk[0]
        rng = random.Random(seed)
        cl = _Cloner(dom, state, rng)
        edges = _fk_edges(dom)
        originals = list(state[ptab])
        if not originals:
            raise ValueError(f"principal table {ptab} has no rows to clone")
        words = [c.name for c in dom.tables[ptab].columns if c.json_type == "string" and not c.pk and not c.enum
                 and all(isinstance(r.get(c.name), str) and _WORD.match(r[c.name]) and not _DATE.match(r[c.name])
                         for r in originals)
                 and len({r.get(c.name) for r in originals}) == len(originals) and len(originals) > 1]
        # each name-like column's words, recombined position by position (first and last names of
        # different rows; one column "Kara Singh" / "Ana Lopez" → "Kara Lopez")
        shape = {c: len(str(originals[0][c]).split()) for c in words}
        pools = {c: [sorted({str(r[c]).split()[j] for r in originals if len(str(r[c]).split()) == shape[c]})
                     for j in range(shape[c])] for c in words}

        def draw() -> tuple:
            return tuple(" ".join(rng.choice(pool) for pool in pools[c]) for c in words)

        combos = {tuple(r.get(c) for c in words) for r in originals}
        out = {t: ([] if not keep_original and t in _dependents(ptab, edges, dom) | {ptab} else list(rows))
               for t, rows in state.items()}
        counts: dict[str, int] = {}
        keys = []
        for i in range(k):
            src = originals[i % len(originals)]
            for _ in range(100):  # a name combination no row has yet
                pick = draw()
                if pick not in combos or not words:
                    break
            combos.add(pick)
            mapping: dict[str, str] = {}
            for c, v in zip(words, pick):
                for a, b in zip(str(src.get(c)).split(), str(v).split()):
                    if a.lower() != b.lower():
                        mapping[a] = b
            new = cl.clone(ptab, src, mapping, {})
            for c, v in zip(words, pick):
                new[c] = v
            out[ptab].append(new)
            keys.append(new[pkey])
            counts[ptab] = counts.get(ptab, 0) + 1
            # the rows that depend on the source principal, cloned with it (parents before children)
            remap = {(ptab, src[pkey]): new[pkey]}
            frontier = [(ptab, src[pkey])]
            while frontier:
                parent, old_key = frontier.pop(0)
                for child, col, p, _ in edges:
                    if p != parent or child == parent:
                        continue
                    cpk = dom.tables[child].pk
                    for row in state.get(child, []):
                        if row.get(col) != old_key or (len(cpk) == 1 and (child, row.get(cpk[0])) in remap):
                            continue
                        if any(row.get(c2) is not None and p2 != parent and (p2, row.get(c2)) not in remap
                               and p2 in _dependents(ptab, edges, dom) for _c, c2, p2, _t in edges if _c == child):
                            continue  # it also references a row that is not cloned yet: with that row
                        cr = cl.clone(child, row, mapping, remap)
                        out[child].append(cr)
                        counts[child] = counts.get(child, 0) + 1
                        if len(cpk) == 1:
                            remap[(child, row[cpk[0]])] = cr[cpk[0]]
                            frontier.append((child, row[cpk[0]]))
        check = SqliteEnvironment(dom)
        try:
            check.reset(out)  # the new state loads (keys, references, CHECK constraints)
        finally:
            check.close()
        return out, {"principal_table": ptab, "principals": keys, "rows_cloned": counts,
                     "kept_original": keep_original}
    finally:
        env.close()


def _unique_cols(table: Any) -> list[str]:
    """Text columns of a table declared UNIQUE (on the column, or a one-column UNIQUE (...))."""
    sql = table.sql or ""
    out = []
    for c in table.columns:
        if c.pk or c.json_type != "string":
            continue
        col = re.escape(c.name)
        if (re.search(rf"(^|[(,])\s*[\"`]?{col}[\"`]?\s[^,]*\bUNIQUE\b", sql, re.IGNORECASE | re.MULTILINE)
                or re.search(rf"\bUNIQUE\s*\(\s*[\"`]?{col}[\"`]?\s*\)", sql, re.IGNORECASE)):
            out.append(c.name)
    return out


def _dependents(root: str, edges: list, dom: Any) -> set[str]:
    """Tables whose rows reference the root table, directly or through other dependents."""
    out: set[str] = set()
    frontier = [root]
    while frontier:
        p = frontier.pop()
        for c, _col, pp, _ in edges:
            if pp == p and c not in out and c != root:
                out.add(c)
                frontier.append(c)
    return out
