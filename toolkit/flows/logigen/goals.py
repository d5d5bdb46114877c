"""Goal-driven symbolic explorer: tasks whose user has a goal, not a procedure.

A task is a chain of 1-8 writes executed in ONE sqlite environment (each write changes the state
hash), built from the schema and the state only:

- look up -> decide -> act: the user names rows by what they know (their own identities: the
  text keys of the rows they refer to, dates, kinds), the Consultant finds the row with a query and
  writes with the key found in the result; a row the chain itself creates is addressed by the key
  its insert returned;
- option menus: an insert's reference (a car, a doctor, a flight...) is not named by the user; they
  give filters and a preference ("the lowest <attribute> you can offer") and the agent lists the
  options, keeps those the policy accepts (probed by execution) and takes the unique best one;
- a mind change (the user first leans to another option of the menu, then takes the best one);
- violation first (Mismatch): the first request breaks a rule; the correction keeps every
  reference and key (no switching to another customer/row to dodge the rule): another value of
  the same attribute, the largest (smallest) value the rule allows (a trade-off), or the user
  drops that request and goes on with the rest of the goal;
- boundaries (Edge): s_origin is moved to N-1 of a rule (rules.py), the goal is the last allowed
  unit and the chain goes on from there.

Every request is recorded as user-facing facts (`Draft.requests`) from which the projection writes
the user view; nothing here knows a domain.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections import Counter
from datetime import date, timedelta
from typing import Any

from toolkit.flows.logigen.explorer import (
    POLICY_VIOLATION,
    WRITE_KINDS,
    DomainView,
    Draft,
    Probe,
    alt_values,
    copy_args,
    insert_args,
    update_candidates,
)
from toolkit.envs.sqlite.vocab import domain_words
from toolkit.flows.logigen.phrases import Phrases, _is_date
from toolkit.flows.logigen.refusals import Refusals, failure_scopes

MAX_TRIES_PER_STEP = 24


class Walker:
    """One environment probed in place: failed calls roll back by themselves, successful probes
    are undone with a checkpoint (SQLite serialize) instead of rebuilding the state."""

    def __init__(self, env_base: Any, state: dict):
        from toolkit.envs.sqlite import SqliteEnvironment

        self.env = SqliteEnvironment(env_base.domain, state=state, config=env_base.config)
        self.calls = 0

    def close(self) -> None:
        self.env.close()

    def call(self, name: str, args: dict):
        self.calls += 1
        return self.env.call(name, copy_args(args))

    def cp(self) -> bytes:
        return self.env.checkpoint()

    def restore(self, cp: bytes) -> None:
        self.env.restore(cp)

    def snapshot(self) -> dict:
        # the chain's states share the rows of the tables a write left alone (never edited)
        return self.env.snapshot_shared()

    def hash(self) -> str:
        return self.env.state_hash()

    def probe(self, name: str, args: dict) -> Any:
        """Run a call and undo it: the result (ok, error, content)."""
        cp = self.cp()
        r = self.call(name, args)
        if r.ok:
            self.restore(cp)
        return r


class _Bounded(dict):
    """A dict emptied when it reaches `cap` entries (a memo that never grows past it)."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def __setitem__(self, k: Any, v: Any) -> None:
        if len(self) >= self.cap:
            self.clear()
        super().__setitem__(k, v)


_ROW_INDEX: dict = {}


def _row(state: dict, table: str, key: dict) -> dict | None:
    """The first row of `table` whose columns equal `key`'s values. An index per rows list and key
    columns (by identity and length; the entry keeps the list alive: state rows are never edited in
    place) answers the repeated look-ups of a candidate scan; unhashable values scan."""
    rows = state.get(table, [])
    cols = tuple(key)
    ik = (id(rows), len(rows), cols)
    hit = _ROW_INDEX.get(ik)
    if hit is None or hit[0] is not rows:
        idx: dict | None = {}
        try:
            for r in rows:
                kv = tuple([r.get(c) for c in cols])
                # a dict finds a NaN by identity where == says not equal: a row whose key holds a
                # NaN (never stored by SQLite) equals no key, and stays out of the index
                if all(v == v for v in kv):
                    idx.setdefault(kv, r)
        except TypeError:
            idx = None
        if len(_ROW_INDEX) > 4096:
            _ROW_INDEX.clear()
        hit = _ROW_INDEX[ik] = (rows, idx)
    idx = hit[1]
    if idx is not None:
        try:
            return idx.get(tuple(key.values()))
        except TypeError:
            pass
    return next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)


def view_query(view: DomainView) -> dict:
    return view.query_tool


def choose_principal(view: DomainView, policy: str = "") -> str | None:
    """The table of the party the user is (customer, patient, member...): a table the write tools'
    tables reference, with a name-like column, most mentioned in the policy; else the most
    referenced one. Decided from the schema and the policy text only."""
    import re

    refs: dict[str, int] = {}
    for td in view.writes:
        for fk in view.tables[td.table].fks:
            tt = fk.get("table")
            if tt in view.tables and tt != td.table:
                refs[tt] = refs.get(tt, 0) + 1
    if not refs:
        return None
    low = (policy or "").lower()
    vocab = domain_words(view.domain)
    # the party the policy says to verify first ("Verify the owner before acting"): a referenced
    # table named by that word, or by an abbreviation of it (`ownr` for owner), wins outright
    said = {w for w in re.findall(r"\b(?:verify|identify|authenticate)\s+(?:the\s+)?([a-z]+)", low)}
    named_by = sorted(t for t in refs for w in said if _names(t, vocab.noun(t).lower(), w))
    if len(set(named_by)) == 1:
        return named_by[0]

    def score(t: str) -> tuple:
        named = any("name" in c.name for c in view.tables[t].columns if not c.pk)
        one, many = vocab.noun(t).lower(), vocab.nouns(t).lower()
        mentions = len(re.findall(r"\b(?:" + re.escape(many) + "|" + re.escape(one) + r"s?)\b", low))
        return (named, mentions, refs[t], t)

    return max(refs, key=score)


def _names(table: str, noun: str, word: str) -> bool:
    """Whether `word` (a policy's word for a party) names the table: its noun or name, singular or
    plural, or the name is an abbreviation of the word (its letters in order, the first one first)."""
    w = word.rstrip("s")
    for t in (noun, table.lower()):
        t1 = t.rstrip("s")
        if t1 == w:
            return True
        if len(t1) >= 3 and t1[0] == w[:1] and "_" not in t1:
            it = iter(w)
            if all(ch in it for ch in t1):
                return True
    return False


class GoalExplorer:
    """Builds goal chains from a state (see the module doc). One instance per domain input."""

    def __init__(self, env_base: Any, base: dict, seed: int):
        self.env_base = env_base
        self.view = DomainView(env_base)
        self.base = base
        self.seed = seed
        self.say = Phrases(self.view)
        self.walker = Walker(env_base, base)
        self.base_cp = self.walker.cp()
        self.writes = [td for td in self.view.writes]
        try:
            policy = env_base.policy()
        except Exception:  # noqa: BLE001 - a domain without a policy text: schema only
            policy = ""
        self.principal = choose_principal(self.view, policy)
        # how many accepted tasks began with each sequence of write tools (GoalDesigner counts
        # them): a chain step tries a write that starts a rarer sequence first
        self.prefixes: Counter = Counter()
        self._owner_plan: dict = {}  # table -> the references owner_of follows
        self._owner_memo: tuple = (None, {})  # (state, {(table, id(row), depth): (row, len, owner)})
        self._owned: dict = {}
        self._dead = _Bounded(200000)  # (state hash, tool, arguments) of writes that fail there
        self._dead_rows = _Bounded(100000)  # (table, row) refused by a rule that reads only the row (OLD.*)
        try:
            from toolkit.flows.logigen.analysis import analyze
            from toolkit.flows.logigen.reach import _immutable

            from toolkit.flows.logigen.hints import column_hints, row_only_rules

            an = analyze(env_base)
            self._frozen = set(_immutable(an))
            self.hints = column_hints(an)
            self._row_rules = row_only_rules(an)
            # refusals that carry over to other states with the same rows where the rule reads
            self.refusals = Refusals(failure_scopes(an, env_base.domain.tables, env_base.domain.tools))
        except Exception:  # noqa: BLE001 - no analysis: nothing is known frozen, every change is tried
            self._frozen = set()
            self._row_rules = set()
            self.hints = {}
            self.refusals = Refusals({})
        self.pk = None
        if self.principal and len(self.view.tables[self.principal].pk) == 1:
            self.pk = self.view.tables[self.principal].pk[0]
        else:
            self.principal = None

    # -- whose rows ------------------------------------------------------------------------------

    def owner_of(self, state: dict, table: str, row: dict, depth: int = 0) -> Any:
        """The principal key a row belongs to (directly or through up to two references), or None.
        Exact for `state`: a reference to another table is followed to the row it names in this
        state (`_row`'s index per rows list), never to a row of another state with the same
        content, so the answer never depends on which states were asked about before (a run
        resumed from the rule-search cache draws the tasks of a cold run)."""
        if self.principal is None or depth > 2:
            return None
        if table == self.principal:
            return row.get(self.pk)
        # asked again and again about the rows of one state (a candidate scan): a memo for the
        # last state asked about (states are never edited once made), per row object (the entry
        # keeps the row alive, so its id is not reused)
        memo = self._owner_memo
        if memo[0] is not state or len(memo[1]) > 100000:
            memo = self._owner_memo = (state, {})
        k = (table, id(row), depth)
        hit = memo[1].get(k)
        if hit is not None and hit[0] is row and hit[1] == len(row):
            return hit[2]
        out = self._owner_via_refs(state, table, row, depth)
        memo[1][k] = (row, len(row), out)
        return out

    def _owner_via_refs(self, state: dict, table: str, row: dict, depth: int) -> Any:
        for col, tt, to, direct in self._owner_refs(table):
            v = row.get(col)
            if v is None:
                continue
            if direct:
                return v
            ref = _row(state, tt, {to: v})
            if ref is not None:
                o = self.owner_of(state, tt, ref, depth + 1)
                if o is not None:
                    return o
        return None

    def _owner_refs(self, table: str) -> list[tuple[str, str, str, bool]]:
        """(column, referenced table, referenced column, to the principal's table) of `table`'s
        references that `owner_of` follows, in order."""
        hit = self._owner_plan.get(table)
        if hit is None:
            hit = []
            for fk in self.view.tables[table].fks:
                tt, col = fk.get("table"), fk.get("column")
                if tt not in self.view.tables:
                    continue
                if tt == self.principal:
                    hit.append((col, tt, None, True))
                    continue
                rt = self.view.tables[tt]
                hit.append((col, tt, fk.get("to") or (rt.pk[0] if rt.pk else None), False))
            self._owner_plan[table] = hit
        return hit

    def _owned_keys(self, state: dict, table: str, to: str, who: Any) -> list:
        """`to` of the rows of `table` that `who` owns, memoized per rows list (by identity and
        length; the entry keeps the list alive)."""
        rows = state.get(table, [])
        key = (id(rows), len(rows), table, to, who)
        hit = self._owned.get(key)
        if hit is None or hit[0] is not rows:
            if len(self._owned) > 4096:
                self._owned.clear()
            hit = self._owned[key] = (rows, [r.get(to) for r in rows if self.owner_of(state, table, r) == who])
        return list(hit[1])

    def owns(self, state: dict, p: Probe, who: Any) -> bool:
        """The write stays on the principal's own rows and never changes whose they are."""
        if self.principal is None or who is None:
            return True
        t = self.view.tables[p.table]
        if p.kind == "update":
            row = _row(state, p.table, {k: p.args.get(k) for k in t.pk})
            if row is None or self.owner_of(state, p.table, row) != who:
                return False
            if p.table != self.principal and self.view.fk_cols[p.table].isdisjoint(p.args):
                return True  # no reference changes: the row stays whose it was
            new = {**row, **p.args}
            return self.owner_of(state, p.table, new) == who
        return self.owner_of(state, p.table, p.args) == who

    def close(self) -> None:
        self.walker.close()

    @property
    def calls(self) -> int:
        return self.walker.calls

    # -- candidates ------------------------------------------------------------------------------

    def _connected(self, p: Probe, anchors: set, created: dict, state: dict) -> bool:
        if not anchors and not created:
            return True
        t = self.view.tables[p.table]
        if p.kind == "update":
            key = tuple(p.args.get(k) for k in t.pk)
            if key in created.get(p.table, ()):
                return True
            row = _row(state, p.table, {k: p.args[k] for k in t.pk}) or {}
            return any(v in anchors for v in row.values() if isinstance(v, str))
        return any(v in anchors for v in p.args.values() if isinstance(v, str))

    def step_candidates(self, state: dict, rng: random.Random, anchors: set, created: dict,
                        used: dict, who: Any = None, width: int = 1, lazy: bool = False,
                        only: Any = None, hints: bool = False) -> Any:
        """Candidate writes on the principal `who`'s rows; `width` > 1: every tool, more rows and
        insert drafts (the boundary search), 1: a random half of the tools (a chain step).
        `lazy`: an iterator that checks ownership only of the candidates taken (the drafts are
        shuffled first: the same random order of the owned ones). `only`: tool names to draft
        for (the others are not drafted at all)."""
        view = self.view
        out: list[Probe] = []
        owned: dict = {}  # (table, row key) -> owns, for updates that change no reference
        tools = list(self.writes)
        rng.shuffle(tools)
        if only is not None:
            tools = [td for td in tools if td.name in only]
        for td in tools if width > 1 else tools[:max(3, len(tools) // 2)]:
            if td.kind == "update":
                t = view.tables[td.table]
                rows = state.get(td.table) or []
                if who is not None:
                    rows = [r for r in rows if self.owner_of(state, td.table, r) == who]
                ps = update_candidates(view, {**state, td.table: rows}, td, rng, max_rows=4 * width,
                                       hints=self.hints if hints else None) if rows else []
                if rng.random() < 0.3 and len(ps) > 1:
                    # two changes on the same row in one request
                    a, b = rng.sample(ps, 2)
                    if all(a.args[k] == b.args[k] for k in t.pk) and set(a.args) != set(b.args):
                        ps.append(Probe(td.name, {**a.args, **b.args}, "update", td.table, column=a.column))
            else:
                ps = []
                rows = list(state.get(td.table) or [])
                # per call: the anchors among a reference's keys, the latest date of a column and
                # the enum columns depend on the state and the table only, not on the draw
                mine_of: dict = {}
                latest_of: dict = {}
                enum_cols = [c for c in view.tables[td.table].columns if c.enum and not c.pk]
                for _ in range(5 * width):
                    args = insert_args(view, state, td, rng, rng.choice(rows) if rows else None)
                    for k in list(args):
                        fk = view.fk(td.table, k)
                        if not fk:
                            continue
                        if who is not None and fk.get("table") == self.principal:
                            args[k] = who
                            continue
                        if who is not None:
                            # a reference to one of the principal's own rows (their booking, loan...)
                            rt = view.tables.get(fk.get("table"))
                            if rt is not None and any(f.get("table") == self.principal for f in rt.fks):
                                to = fk.get("to") or (rt.pk[0] if rt.pk else None)
                                own = self._owned_keys(state, rt.name, to, who)
                                if own:
                                    args[k] = rng.choice(own)
                                continue
                        mine = mine_of.get(k)
                        if mine is None:
                            refs = view.ref_values(state, fk)
                            mine = mine_of[k] = [a for a in sorted(anchors, key=str) if a in refs]
                        if mine and rng.random() < 0.5:
                            args[k] = rng.choice(mine)
                    for k, x in list(args.items()):
                        if _is_date(x) and rng.random() < 0.6:
                            # a date at or after the latest one of the column (bookings lie ahead)
                            if k not in latest_of:
                                latest_of[k] = max((r.get(k) for r in rows if _is_date(r.get(k))), default=None)
                            latest = latest_of[k] if latest_of[k] is not None else x
                            args[k] = (date.fromisoformat(latest) + timedelta(days=rng.randint(0, 6))).isoformat()
                    enums = [c for c in enum_cols if c.name in args]
                    if enums and rng.random() < 0.5:
                        c = rng.choice(enums)
                        args[c.name] = rng.choice(c.enum)
                    ps.append(Probe(td.name, args, "insert", td.table))
            out += ps
        if lazy:
            rng.shuffle(out)
            return (p for p in out if self._owns_cached(state, p, who, owned))
        out = [p for p in out if self._owns_cached(state, p, who, owned)]
        rng.shuffle(out)
        return out

    def _owns_cached(self, state: dict, p: Probe, who: Any, memo: dict) -> bool:
        """`owns` with the answer for an update that changes no reference kept per row key (it
        depends on the row only: several changes of the same row are asked in a row)."""
        if p.kind != "update" or self.principal is None or who is None or p.table == self.principal:
            return self.owns(state, p, who)
        if not self.view.fk_cols[p.table].isdisjoint(p.args):
            return self.owns(state, p, who)
        try:
            ck = (p.table, tuple([p.args.get(k) for k in self.view.tables[p.table].pk]))
            hit = memo.get(ck)
        except TypeError:
            return self.owns(state, p, who)
        if hit is None:
            hit = memo[ck] = self.owns(state, p, who)
        return hit

    # -- one write with its lookup ---------------------------------------------------------------

    def lookup(self, state: dict, table: str, key: dict, rng: random.Random) -> tuple[dict, str] | None:
        """(query filters, phrase) naming one row by attributes that single it out (never its key)."""
        view = self.view
        t = view.tables[table]
        if table not in view.query_tool:
            return None
        row = _row(state, table, key)
        if row is None:
            return None
        cols = [c.name for c in t.columns if not c.pk and c.name not in view.exclude_keys and not c.readonly
                and row.get(c.name) is not None and not isinstance(row.get(c.name), float)]
        # what a person can name first (references, kinds, attributes the domain has words for),
        # a value said generically ("the loan with the number 45") only when nothing else singles it out
        cols.sort(key=lambda c: (not self.say.nameable(table, c), view.fk(table, c) is None, t.colmap[c].enum is None,
                                 rng.random()))
        rows = state.get(table, [])
        for n in (1, 2, 3):
            for combo in itertools.combinations(cols[:6], n):
                match = [r for r in rows if all(r.get(c) == row.get(c) for c in combo)]
                if len(match) == 1:
                    f = {c: row[c] for c in combo}
                    return f, self.say.row(table, f)
        return None

    def _refs(self, p: Probe, rng: random.Random):
        """(argument, foreign key, referenced table) for the references of `p`, in random order,
        to a table other than the principal's with a query tool and a one-column key."""
        view = self.view
        fks = [k for k in p.args if view.fk(p.table, k)]
        rng.shuffle(fks)
        for k in fks:
            fk = view.fk(p.table, k)
            rt = view.tables.get(fk.get("table"))
            if rt is None or rt.name == self.principal or rt.name not in view.query_tool or len(rt.pk) != 1:
                continue
            yield k, fk, rt

    def menu(self, p: Probe, state: dict, rng: random.Random) -> dict | None:
        """An option menu for one reference of an insert: filters on the referenced table, the
        options the policy accepts (probed), and a preference that picks exactly one of them."""
        view = self.view
        for a, fk, rt in self._refs(p, rng):
            if any(f.get("table") == self.principal for f in rt.fks):
                continue  # options come from shared resources, not from the user's own rows
            to = fk.get("to") or rt.pk[0]
            rows = state.get(rt.name, [])
            nums = [c.name for c in rt.columns if not c.pk and c.json_type in ("integer", "number")
                    and not view.fk(rt.name, c.name) and c.name not in view.exclude_keys
                    and self.say.preference(rt.name, c.name, "lowest") is not None]
            cats = [c.name for c in rt.columns if not c.pk and (c.enum or view.fk(rt.name, c.name))
                    and c.name not in view.exclude_keys]
            if not nums or len(rows) < 3:
                continue
            cur = _row(state, rt.name, {to: p.args[a]}) or {}
            rng.shuffle(cats)
            for fcols in [cats[:1], cats[:2], []]:
                f = {c: cur.get(c) for c in fcols if cur.get(c) is not None}
                matches = [r for r in rows if all(r.get(c) == v for c, v in f.items())]
                if len(matches) < 2 or len(matches) > 12:
                    continue
                ok = []
                for r in matches:
                    res = self.walker.probe(p.name, {**p.args, a: r[to]})
                    if res.ok:
                        ok.append(r)
                if not ok:
                    continue
                for col in sorted(nums, key=lambda _: rng.random()):
                    vals = [r.get(col) for r in ok if isinstance(r.get(col), (int, float))]
                    if len(vals) != len(ok):
                        continue
                    for best, word in ((min(vals), "lowest"), (max(vals), "highest")):
                        pick = [r for r in ok if r.get(col) == best]
                        if len(pick) == 1 and len(matches) >= 2:
                            others = [r for r in matches if r is not pick[0]]
                            return {"arg": a, "table": rt.name, "filters": f, "column": col, "word": word,
                                    "pref": self.say.preference(rt.name, col, word),
                                    "choice": pick[0][to], "options": len(matches), "accepted": len(ok),
                                    "other": others[0][to] if others else None}
        return None

    def _ref_lookup(self, p: Probe, state: dict, rng: random.Random) -> tuple[str, dict, str] | None:
        """(argument, query filters, phrase) for a reference of an insert to a row of another
        table that is not the principal (the user's order a charge goes on): the row named by
        attributes that single it out, so its key comes from the look-up, not from the user."""
        for k, fk, rt in self._refs(p, rng):
            lk = self.lookup(state, rt.name, {fk.get("to") or rt.pk[0]: p.args[k]}, rng)
            if lk is not None:
                return k, lk[0], lk[1]
        return None

    def describe_insert(self, p: Probe, skip: set) -> str:
        view = self.view
        t = view.tables[p.table]
        parts = []
        for k, v in p.args.items():
            c = t.colmap.get(k)
            if k in skip or c is None or k in view.exclude_keys or c.rowid_alias or self.say.is_me(p.table, k, v):
                continue  # the user's own reference: they said who they are
            if c.default is not None and str(c.default).strip("'\"") == str(v):
                continue  # the default: nothing the user has to say
            # a date with what it dates ("arrival date: 2025-09-20")
            parts.append(self.say.value(p.table, k, v))
        return self.say.a_new(p.table) + (f" ({', '.join(parts)})" if parts else "")

    def describe_update(self, p: Probe, state: dict) -> list[str]:
        t = self.view.tables[p.table]
        row = _row(state, p.table, {k: p.args[k] for k in t.pk}) or {}
        return [self.say.change(p.table, k, row.get(k), v) for k, v in p.args.items()
                if k not in t.pk and (row.get(k) != v or not row)]

    # -- the chain -------------------------------------------------------------------------------

    def chain(self, rng: random.Random, origin: dict, want: int, *, first: list[dict] | None = None,
              archetype: str = "Goal", menu_share: float = 0.5, lookup_share: float = 0.6,
              avoid: Any = None, cap: int = 8) -> Draft | None:
        """Execute a chain of `want` writes from `origin` (after the `first` segment: pre-planned
        steps {"call": {...}, "expect_error"?: ..., "request": {...}}) and return the draft.
        `avoid`: sequences of tool names earlier tasks have; a chain that ends on one of them goes
        on by up to 3 writes (at most `cap`) until its sequence is new (a narrow domain repeats its
        few sequences otherwise, and the caller would draw the whole chain again)."""
        w = self.walker
        w.restore(self.base_cp) if origin is self.base else w.env.reset(origin)
        start = w.cp()
        state = w.snapshot()
        actions: list[dict] = []
        requests: list[dict] = []
        patterns: list[str] = []
        anchors: set = set()
        created: dict[str, list] = {}
        used: dict[str, int] = {}
        writes = 0
        who = self._who(state, first, rng)
        self.say.me_table, self.say.me = self.principal, who
        if who is not None and self.principal in view_query(self.view):
            # the Consultant identifies the user first (the identity the policy asks for)
            actions.append({"name": self.view.query_tool[self.principal], "arguments": {self.pk: who}})
            requests.append({"identity": True, "known": [self.say.value_of_key(self.principal, who)]})
        for seg in first or []:
            call = seg["call"]
            if seg.get("read"):
                actions.append(seg["read"])
            h0 = w.hash()
            r = w.call(call["name"], call["arguments"])
            if seg.get("expect_error"):
                if r.ok or (r.error or {}).get("code") != seg["expect_error"]:
                    return None
                actions.append({**copy.deepcopy(call), "expect_error": seg["expect_error"]})
            else:
                if not r.ok or w.hash() == h0:
                    return None
                actions.append(copy.deepcopy(call))
                writes += 1
                self._after_write(call, r, anchors, created, state)
            if seg.get("request"):
                requests.append(seg["request"])
            patterns += seg.get("patterns", [])
            used[call["name"]] = used.get(call["name"], 0) + 1
            state = w.snapshot()
        extra = 0
        while writes < want:
            prefix = tuple(a["name"] for a in actions if not a.get("expect_error") and self._is_write(a["name"]))
            step = self._next_write(state, rng, anchors, created, used, menu_share, lookup_share, who, prefix)
            if step is None and avoid and writes and tuple(a["name"] for a in actions) in avoid:
                # stuck on a sequence an earlier task has: look wider (every tool, more rows)
                # rather than have the whole chain drawn again
                step = self._next_write(state, rng, anchors, created, used, menu_share, lookup_share, who, prefix,
                                        width=2)
            if step is None:
                break
            actions += step["actions"]
            requests.append(step["request"])
            patterns += step.get("patterns", [])
            writes += 1
            state = w.snapshot()
            if (writes == want and avoid and extra < 3 and want < cap
                    and tuple(a["name"] for a in actions) in avoid):
                want += 1
                extra += 1
        if writes == 0:
            return None
        target = state
        w.restore(start)
        d = Draft(origin=origin, actions=actions, goals=[], archetype=archetype, target=target)
        d.requests = requests
        d.patterns = sorted(set(patterns))
        return d

    def at_limit(self, req: dict, b: Any, origin: dict) -> dict:
        """The request of a boundary goal that updates the limited column itself: the user asks
        for it to go as far as the rules allow ("the check in as early as the rules allow"),
        not for the value."""
        p = b.goal
        t = self.view.tables[p.table]
        row = _row(origin, p.table, {k: p.args[k] for k in t.pk}) or {}
        cur, new = row.get(p.column), p.args.get(p.column)
        up = True
        try:
            up = new > cur
        except TypeError:
            pass
        how = ("as late" if up else "as early") if _is_date(new) else ("as high" if up else "as low")
        subject = req["text"].split(": ")[0]
        wh = self.say.w.when(p.column)
        attr = self.say.w.attr(p.table, p.column)
        what = f"{wh[0]} {how}" if wh else f"the {attr} {how}" if attr else f"{how}"
        return {**req, "text": f"{subject}: {what} as the rules allow, exactly up to the limit"}

    def _row_key(self, state: dict, p: Probe) -> Any:
        row = _row(state, p.table, {k: p.args.get(k) for k in self.view.tables[p.table].pk})
        try:
            return (p.table, tuple(sorted(row.items()))) if row is not None else None
        except TypeError:
            return None

    def _own_row(self, table: str, key: dict) -> str:
        """A row named by its key ("booking BK-2041"); the user's own record is "my customer details"."""
        if table == self.principal and list(key.values()) == [self.say.me] and self.say.me is not None:
            return f"my {self.say.noun(table)} details"
        return f"{self.say.noun(table)} {' '.join(str(x) for x in key.values())}"

    def _speak_for(self, state: dict, p: Probe) -> None:
        """The phrases are said by the owner of `p` (their own references read "my ...")."""
        if self.principal is None:
            return
        row = p.args
        if p.kind == "update":
            row = _row(state, p.table, {k: p.args.get(k) for k in self.view.tables[p.table].pk}) or p.args
        self.say.me_table, self.say.me = self.principal, self.owner_of(state, p.table, row)

    def _is_write(self, name: str) -> bool:
        td = self.view.tools.get(name)
        return td is not None and td.kind in WRITE_KINDS

    def count_prefixes(self, actions: list[dict]) -> None:
        """Count the sequences of write tools an accepted task begins with (`_novel_first`)."""
        names = tuple(a["name"] for a in actions if not a.get("expect_error") and self._is_write(a["name"]))
        for i in range(1, len(names) + 1):
            self.prefixes[names[:i]] += 1

    def _after_write(self, call: dict, r: Any, anchors: set, created: dict, state: dict) -> None:
        view = self.view
        td = view.tools[call["name"]]
        t = view.tables[td.table]
        row = r.content if isinstance(r.content, dict) else {}
        if td.kind == "insert" and row and all(k in row for k in t.pk):
            created.setdefault(t.name, []).append(tuple(row.get(k) for k in t.pk))
        src = row or call["arguments"]
        if td.kind == "update":
            src = {**(_row(state, t.name, {k: call["arguments"].get(k) for k in t.pk}) or {}), **call["arguments"]}
        for k, v in src.items():
            if view.fk(t.name, k) and isinstance(v, str):
                anchors.add(v)

    def _who(self, state: dict, first: list[dict] | None, rng: random.Random) -> Any:
        if self.principal is None:
            return None
        if first:
            c = first[0]["call"]
            td = self.view.tools[c["name"]]
            t = self.view.tables[td.table]
            row = c["arguments"]
            if td.kind == "update":
                row = _row(state, td.table, {k: c["arguments"].get(k) for k in t.pk}) or row
            return self.owner_of(state, td.table, row)
        owners = sorted({self.owner_of(state, td.table, r) for td in self.writes
                         for r in state.get(td.table, [])} - {None}, key=str)
        everyone = [r.get(self.pk) for r in state.get(self.principal, [])]
        pool = owners if owners and rng.random() < 0.7 else everyone
        return rng.choice(pool) if pool else None

    def _novel_first(self, cands: Any, prefix: tuple, defer: int = 8) -> Any:
        """`cands` with the writes that continue `prefix` into a sequence of write tools no
        accepted task began with first: up to `defer` others wait, and come last, rarest first
        (a narrow domain's chains would otherwise repeat the same few tool sequences)."""
        if not self.prefixes:
            yield from cands
            return
        waiting: list = []
        for p in cands:
            k = self.prefixes.get(prefix + (p.name,), 0)
            if k and len(waiting) < defer:
                waiting.append((k, len(waiting), p))
                continue
            yield p
        for _, _, p in sorted(waiting, key=lambda x: x[:2]):
            yield p

    def _next_write(self, state: dict, rng: random.Random, anchors: set, created: dict, used: dict,
                    menu_share: float, lookup_share: float, who: Any = None, prefix: tuple = (),
                    width: int = 1) -> dict | None:
        w = self.walker
        h0 = w.hash()
        cp = None
        frozen = self._frozen
        dead_rows = self._dead_rows

        def hopeful(p: Probe) -> bool:
            # never a change of a column a rule freezes (`NEW.c IS NOT OLD.c`: every such call
            # fails), nor an update of a row a rule on the row alone has refused (a returned loan)
            if p.kind == "update" and frozen and p.column is not None and (p.table, p.column) in frozen:
                return False
            return not (p.kind == "update" and dead_rows and self._row_key(state, p) in dead_rows)

        cands = itertools.islice(filter(hopeful, self.step_candidates(state, rng, anchors, created, used, who,
                                                                      lazy=True, width=width, hints=True)),
                                 MAX_TRIES_PER_STEP * width)
        dead = self._dead
        refusals = self.refusals
        ids = w.env.table_ids() if refusals else {}
        for p in self._novel_first(cands, prefix):
            # a write that failed (or changed nothing) on a state with this hash fails again: the
            # outcome of a call depends on the state's content and the arguments only (chains
            # start from the same few states, so most of their failed candidates repeat)
            try:
                dk = (h0, p.name, tuple(sorted(p.args.items())))
                hash(dk)
            except TypeError:
                dk = None
            if dk is not None and dk in dead:
                w.calls += 1
                continue
            # refused by a rule that reads only some arguments and some tables, on a state where
            # those tables held the rows they hold now: refused again (with the same side effects)
            rule = refusals.known(p.name, p.args, ids) if dk is not None else None
            if rule is not None:
                w.calls += 1
                if p.kind == "update" and rule in self._row_rules:
                    dead_rows[self._row_key(state, p)] = True
                dead[dk] = True
                continue
            if cp is None:
                cp = w.cp()
            r = w.call(p.name, p.args)
            if not r.ok:
                rule = (r.error or {}).get("violated_rule")
                if p.kind == "update" and rule in self._row_rules:
                    dead_rows[self._row_key(state, p)] = True  # a rule on the row alone: every update fails
                if dk is not None:
                    dead[dk] = True
                    if rule is not None:
                        refusals.remember(p.name, p.args, rule, ids)
                continue  # a failed write leaves the state as it was
            if w.hash() == h0:
                w.restore(cp)
                if dk is not None:
                    dead[dk] = True
                continue
            first = p
            acts, req, pats, p = self.plan_write(p, state, rng, created, menu_share, lookup_share, walker_moved=cp)
            if p is not first:  # the menu picked another option: write that one instead
                w.restore(cp)
                r = w.call(p.name, p.args)
                if not r.ok:  # probed on this state: cannot happen
                    return None
            acts.append(p.call())
            self._after_write(p.call(), r, anchors, created, state)
            used[p.name] = used.get(p.name, 0) + 1
            return {"actions": acts, "request": req, "patterns": pats}
        return None

    def plan_write(self, p: Probe, state: dict, rng: random.Random, created: dict, menu_share: float,
                   lookup_share: float, walker_moved: bytes | None = None) -> tuple[list[dict], dict, list[str], Probe]:
        """(reads before the write, the user's request, patterns, the write) for a write that
        succeeds on `state`: the user's words never carry a key they could not know.
        `walker_moved`: the checkpoint of `state` when the walker already ran `p` (a menu probes
        its options on `state`, and leaves the walker as it found it)."""
        view = self.view
        t = view.tables[p.table]
        acts: list[dict] = []
        pats: list[str] = []
        req: dict = {"kind": p.kind, "table": p.table}
        self._speak_for(state, p)
        if p.kind == "insert":
            m = ref = None
            if rng.random() < menu_share:
                after = None
                if walker_moved is not None:
                    after = self.walker.cp()
                    self.walker.restore(walker_moved)
                m = self.menu(p, state, rng)
                if after is not None:
                    self.walker.restore(after)
            if m is not None:
                p = Probe(p.name, {**p.args, m["arg"]: m["choice"]}, p.kind, p.table)
                acts.append({"name": view.query_tool[m["table"]], "arguments": dict(m["filters"])})
                what = self.describe_insert(p, skip={m["arg"]})
                filt = ", ".join(self.say.value(m["table"], c, v) for c, v in m["filters"].items())
                req["text"] = (f"{what} with {self.say.with_a(m['table'])}{' (' + filt + ')' if filt else ''}: "
                               f"the one with {m['pref']} that can be used")
                req["menu"] = {k: m[k] for k in ("table", "column", "word", "options", "accepted")}
                pats.append("option-menu")
                if m.get("other") is not None and rng.random() < 0.35:
                    req["mind_change"] = (f"at first lean towards {self.say.noun(m['table'])} {m['other']}, then change "
                                          f"your mind and ask for the one with {m['pref']} instead")
                    pats.append("mind-change")
            else:
                ref = self._ref_lookup(p, state, rng) if rng.random() < lookup_share else None
                if ref is not None:
                    # the row it points to, named by what the user knows of it (look up -> act):
                    # "a new charge (gift card g1, amount 1.0) for the delivered order on 2025-05-20"
                    k, filters, phrase = ref
                    acts.append({"name": view.query_tool[view.fk(p.table, k)["table"]], "arguments": filters})
                    to = f", {self.say.ref_noun(p.table, k)}:" if self.say.has_role(p.table, k) else " for"
                    req["text"] = f"{self.describe_insert(p, skip={k})}{to} {phrase}"
                    pats.append("lookup")
                else:
                    req["text"] = self.describe_insert(p, skip=set())
                    for k, v in p.args.items():
                        fk = view.fk(p.table, k)
                        if fk and fk.get("table") in view.query_tool:
                            rt = view.tables[fk["table"]]
                            acts.append({"name": view.query_tool[rt.name], "arguments": {fk.get("to") or rt.pk[0]: v}})
                            break
            req["known"] = [self.say.value(p.table, k, v) for k, v in p.args.items()
                            if view.fk(p.table, k) and isinstance(v, str) and not (m and k == m["arg"])
                            and not (ref is not None and k == ref[0])]
            return acts, req, pats, p
        key = {k: p.args[k] for k in t.pk}
        mine = tuple(p.args.get(k) for k in t.pk) in created.get(p.table, ())
        changes = self.describe_update(p, state)
        if mine:
            req["text"] = f"for the {self.say.noun(p.table)} just made: " + " and ".join(changes)
            req["known"] = []
            pats.append("uses-created-row")
            return acts, req, pats, p
        lk = self.lookup(state, p.table, key, rng) if p.table != self.principal and (
            rng.random() < lookup_share or any(t.colmap[k].rowid_alias for k in t.pk)) else None
        if lk is not None:
            f, phrase = lk
            acts.append({"name": view.query_tool[p.table], "arguments": f})
            req["text"] = f"{phrase}: " + " and ".join(changes)
            req["known"] = [self.say.value(p.table, k, v) for k, v in f.items()
                            if view.fk(p.table, k) and isinstance(v, str)]
            pats.append("lookup")
        else:
            if p.table in view.query_tool:
                acts.append({"name": view.query_tool[p.table], "arguments": dict(key)})
            ktxt = " ".join(str(v) for v in key.values())
            req["text"] = f"{self._own_row(p.table, key)}: " + " and ".join(changes)
            req["known"] = [f"{self.say.noun(p.table)} {ktxt}"]
        return acts, req, pats, p

    # -- violation first -------------------------------------------------------------------------

    def corrections(self, v: Probe, state: dict, rng: random.Random) -> list[tuple[Probe, str]]:
        """Calls that keep every key and reference of the violating call `v` and change one
        attribute: the value the rule still allows at its limit first (a trade-off), then others."""
        view = self.view
        t = view.tables[v.table]
        out: list[tuple[Probe, str]] = []
        for k, cur in v.args.items():
            c = t.colmap.get(k)
            if c is None or c.pk or view.fk(v.table, k):
                continue
            if c.json_type == "integer" and isinstance(cur, int) and not isinstance(cur, bool):
                for step in (-1, 1):
                    for i in range(1, 25):
                        x = cur + step * i
                        if x < 0:
                            break
                        q = Probe(v.name, {**v.args, k: x}, v.kind, v.table, column=k if v.kind == "update" else None)
                        r = self.walker.probe(q.name, q.args)
                        if r.ok:
                            out.append((q, "limit"))
                            break
                        if (r.error or {}).get("violated_rule") != v.rule:
                            break
            for x in alt_values(view, state, v.table, c, cur, rng, k=6):
                out.append((Probe(v.name, {**v.args, k: x}, v.kind, v.table, column=k if v.kind == "update" else None),
                            "other"))
        return out

    def mismatch_segment(self, v: Probe, origin: dict, rng: random.Random) -> list[dict] | None:
        """[attempt, correction?] for the violating call `v` from `origin` (planned steps for chain)."""
        view = self.view
        w = self.walker
        w.env.reset(origin) if origin is not self.base else w.restore(self.base_cp)
        state = origin
        r = w.call(v.name, v.args)
        if r.ok or (r.error or {}).get("code") != POLICY_VIOLATION or (r.error or {}).get("violated_rule") != v.rule:
            return None
        t = view.tables[v.table]
        read = None
        known: list[str] = []
        self._speak_for(state, v)
        if v.kind == "update":
            key = {k: v.args[k] for k in t.pk}
            lk = self.lookup(state, v.table, key, rng)
            if lk is not None and v.table in view.query_tool:
                read = {"name": view.query_tool[v.table], "arguments": lk[0]}
                who = lk[1]
                known = [self.say.value(v.table, k, x) for k, x in lk[0].items() if view.fk(v.table, k)]
            else:
                who = self._own_row(v.table, key)
                known = [who]
                if v.table in view.query_tool:
                    read = {"name": view.query_tool[v.table], "arguments": dict(key)}
            want = f"{who}: " + " and ".join(self.describe_update(v, state))
        else:
            want = self.describe_insert(v, skip=set())
            known = [self.say.value(v.table, k, x) for k, x in v.args.items() if view.fk(v.table, k) and isinstance(x, str)]
            for k, x in v.args.items():
                fk = view.fk(v.table, k)
                if fk and fk.get("table") in view.query_tool:
                    rt = view.tables[fk["table"]]
                    read = {"name": view.query_tool[rt.name], "arguments": {fk.get("to") or rt.pk[0]: x}}
                    break
        seg = [{"call": v.call(), "expect_error": POLICY_VIOLATION, "read": read,
                "request": {"kind": v.kind, "table": v.table, "text": want, "known": known, "violates": v.rule},
                "patterns": ["violation-first"]}]
        fixes = self.corrections(v, state, rng)
        rng.shuffle(fixes)
        fixes.sort(key=lambda f: f[1] != "limit" if rng.random() < 0.6 else 0)
        for q, how in fixes[:12]:
            cp = w.cp()
            h0 = w.hash()
            rr = w.call(q.name, q.args)
            ok = rr.ok and w.hash() != h0
            w.restore(cp)
            if not ok:
                continue
            if how == "limit":
                fb = "the closest the rules allow (ask the agent what that is)"
                pats = ["trade-off"]
            else:
                fb = " and ".join(self.describe_update(q, state)) if q.kind == "update" else \
                    self.describe_insert(q, skip=set())
                pats = ["correction"]
            seg.append({"call": q.call(), "patterns": pats,
                        "request": {"kind": q.kind, "table": q.table, "fallback_for": len(seg) - 1, "text": fb,
                                    "known": []}})
            return seg
        seg[0]["patterns"].append("refusal-accepted")
        seg[0]["request"]["fallback"] = "drop this request and go on with the rest"
        return seg
