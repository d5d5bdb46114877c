"""Compiling a domain: execute its DDL under the SQL sandbox, introspect tables and triggers, load
the seed (or an inline initial state), derive the policy rules, the state keys and each tool's
write set, and generate the tools. `compile_domain` (runtime.py) adds the seeded state's hash."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3

from toolkit.envs.sqlite.domain import (
    Column,
    CompiledDomain,
    DomainError,
    DomainSpec,
    Table,
    ToolDef,
    TriggerInfo,
)
from toolkit.envs.sqlite.english import expansion, is_word
from toolkit.envs.sqlite.guard import _DomainGuard, _harden, cap_size, is_full, too_big
from toolkit.envs.sqlite.sqltext import (
    _json_type,
    _parse_enum_checks,
    _split_comments,
    _table_docs,
    parse_trigger,
    qident,
)
from toolkit.envs.sqlite.tools import QUERY_CONTROL_PARAMS, _build_tools
from toolkit.sandbox.limits import operator_limits
from toolkit.scoring.state import DEFAULT_EXCLUDE_KEYS, Ref, StateKeys

_STATE_CACHE_SIZE = 64


def _introspect_tables(conn: sqlite3.Connection, readonly: set[str]) -> dict[str, Table]:
    tables: dict[str, Table] = {}
    rows = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
    ).fetchall()
    for tname, tsql in rows:
        info = conn.execute(f"PRAGMA table_info({qident(tname)})").fetchall()
        code, _ = _split_comments(tsql or "")
        enums = _parse_enum_checks(code)
        without_rowid = bool(re.search(r"\)\s*WITHOUT\s+ROWID\s*;?\s*$", code, re.IGNORECASE))
        pk_cols = sorted([r for r in info if r[5]], key=lambda r: r[5])
        cols: list[Column] = []
        for cid, cname, ctype, notnull, dflt, pk in info:
            c = Column(name=cname, decl_type=ctype or "", json_type=_json_type(ctype or ""),
                       notnull=bool(notnull), default=dflt, pk=int(pk))
            c.rowid_alias = (len(pk_cols) == 1 and pk and (ctype or "").upper() == "INTEGER"
                             and not without_rowid)
            c.enum = enums.get(cname)
            c.readonly = f"{tname}.{cname}" in readonly
            cols.append(c)
        fks = [{"column": r[3], "table": r[2], "to": r[4], "on_update": r[5], "on_delete": r[6]}
               for r in conn.execute(f"PRAGMA foreign_key_list({qident(tname)})").fetchall()]
        tdoc, cdocs = _table_docs(tsql or "", {c.name for c in cols})
        for c in cols:
            c.doc = cdocs.get(c.name, "")
        tables[tname] = Table(name=tname, columns=cols, pk=[r[1] for r in pk_cols],
                              without_rowid=without_rowid, fks=fks, doc=tdoc, sql=tsql or "")
    return tables


def _insert_rows(conn: sqlite3.Connection, tables: dict[str, Table], data: dict, what: str) -> None:
    """Insert `data` ({table: [rows]}) in its order. Each row is checked (a mapping, known columns,
    scalar values); consecutive rows of a table with the same columns go in as one executemany (a
    state of a few hundred rows is loaded for every injected origin and every inline state a stage
    replays on). A batch SQLite refuses is rolled back to a savepoint and inserted a row at a time,
    so the error names the row; errors come in row order, as when every row was its own INSERT."""
    if not isinstance(data, dict):
        raise DomainError(f"{what}: expected a mapping {{table: [rows]}}")
    sqls: dict[tuple, str] = {}
    for tname, rows in data.items():
        t = tables.get(tname)
        if t is None:
            raise DomainError(f"{what}: unknown table {tname!r}; tables: {sorted(tables)}")
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise DomainError(f"{what}: table {tname!r} must map to a list of rows")
        colmap = t.colmap
        batch: list[tuple[int, list]] = []
        names: tuple = ()
        for i, row in enumerate(rows):
            problem = None
            if not isinstance(row, dict):
                problem = f"{what}: {tname}[{i}] is not a mapping"
            elif bad := [k for k in row if k not in colmap]:
                problem = f"{what}: {tname}[{i}] unknown columns {bad}; columns: {list(colmap)}"
            else:
                vals = [int(v) if isinstance(v, bool) else v for v in row.values()]
                odd = next((v for v in vals if not (v is None or isinstance(v, (int, float, str, bytes)))), None)
                if odd is not None:
                    problem = f"{what}: {tname}[{i}] has a non-scalar value {str(odd)[:80]!r}"
            if problem is not None:
                if batch:  # the rows before it first: a refusal among them is the first error
                    _insert_batch(conn, tname, colmap, names, batch, sqls, what)
                raise DomainError(problem)
            cols = tuple(row)
            if cols != names and batch:
                _insert_batch(conn, tname, colmap, names, batch, sqls, what)
                batch = []
            names = cols
            batch.append((i, vals))
        if batch:
            _insert_batch(conn, tname, colmap, names, batch, sqls, what)


def _insert_batch(conn: sqlite3.Connection, tname: str, colmap: dict, names: tuple, batch: list[tuple[int, list]],
                  sqls: dict, what: str) -> None:
    """Rows [(index, values)] of `tname` with the columns `names`: one executemany, or, when SQLite
    refuses one of them, a row at a time after rolling the batch back."""
    sql = sqls.get((tname, names))
    if sql is None:
        sql = sqls[(tname, names)] = (
            f"INSERT INTO {qident(tname)} ({', '.join(qident(colmap[n].name) for n in names)}) "
            f"VALUES ({', '.join('?' * len(names))})" if names else f"INSERT INTO {qident(tname)} DEFAULT VALUES")
    if len(batch) > 1:
        conn.execute("SAVEPOINT toolkit_rows")
        before = conn.total_changes
        try:
            conn.executemany(sql, [vals for _, vals in batch])
        except sqlite3.Error as e:
            # the rows before the refused one went in (one change each: no triggers while loading)
            i = batch[min(max(0, conn.total_changes - before), len(batch) - 1)][0]
            try:
                conn.execute("ROLLBACK TO toolkit_rows")
                conn.execute("RELEASE toolkit_rows")
            except sqlite3.Error:  # SQLITE_FULL can end the whole transaction: nothing to replay
                if is_full(e):
                    raise DomainError(too_big(what, f"{tname}[{i}]", operator_limits().db_size_mb)) from None
                raise DomainError(f"{what}: {tname}[{i}] rejected: {e}") from None
        else:
            conn.execute("RELEASE toolkit_rows")
            return
    for i, vals in batch:
        try:
            conn.execute(sql, vals)
        except sqlite3.Error as e:
            if is_full(e):
                raise DomainError(too_big(what, f"{tname}[{i}]", operator_limits().db_size_mb)) from None
            raise DomainError(f"{what}: {tname}[{i}] rejected: {e}") from None


def _check_fks(conn: sqlite3.Connection, what: str) -> None:
    bad = conn.execute("PRAGMA foreign_key_check").fetchall()
    if bad:
        tbl, rowid, parent, _ = bad[0]
        raise DomainError(f"{what}: {len(bad)} foreign-key violation(s), e.g. {tbl} rowid {rowid} -> {parent}")


def _state_key(state: dict) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True, ensure_ascii=False, default=str)
                          .encode("utf-8")).hexdigest()


def _remember_state_bytes(dom: CompiledDomain, state: dict, data: bytes) -> None:
    """Let a later `_load_state_bytes(dom, state)` return `data` (a serialized DB holding exactly
    `state`, e.g. the checkpoint `state` was snapshotted from) instead of rebuilding it."""
    key = _state_key(state)
    with dom.lock:
        dom.state_cache[key] = data
        dom.state_cache.move_to_end(key)
        while len(dom.state_cache) > _STATE_CACHE_SIZE:
            dom.state_cache.popitem(last=False)


def _load_state_bytes(dom: CompiledDomain, state: dict) -> bytes:
    """Serialized DB holding `state` (triggers silenced while loading, re-created after)."""
    key = _state_key(state)
    with dom.lock:
        hit = dom.state_cache.get(key)
        if hit is not None:
            dom.state_cache.move_to_end(key)
            return hit
    conn = sqlite3.connect(":memory:", isolation_level=None)
    _harden(conn)
    mb = operator_limits().db_size_mb
    try:
        conn.deserialize(dom.tables_only)
        cap_size(conn, mb)  # an inline state is data: the operator's size cap holds
        conn.execute("BEGIN")
        _insert_rows(conn, dom.tables, state, "initial state")
        conn.execute("COMMIT")
        _check_fks(conn, "initial state")
        guard = _DomainGuard(conn, mb)
        for sql in dom.trigger_sql:
            guard.run(dom.spec.name, "trigger", sql, "trigger does not compile", script=False)
        data = conn.serialize()
    finally:
        conn.close()
    with dom.lock:
        dom.state_cache[key] = data
        while len(dom.state_cache) > _STATE_CACHE_SIZE:
            dom.state_cache.popitem(last=False)
    return data


def _write_sets(tables: dict[str, Table], triggers: list[TriggerInfo], tools: dict[str, ToolDef]) -> dict:
    """{tool: frozenset of the tables a call may write}: the tool's table, then, to a fixpoint, the
    tables written by triggers on written tables and the tables whose foreign keys point at a
    written table (ON DELETE/UPDATE actions). None when a trigger writes a table name that is not
    in the schema as parsed (then every table is re-read after a write)."""
    by_table: dict[str, set[str]] = {}
    for trg in triggers:
        for _verb, t in trg.writes:
            if t not in tables:
                return {name: None for name in tools}
            by_table.setdefault(trg.table, set()).add(t)
    fk_in: dict[str, set[str]] = {}
    for t in tables.values():
        for fk in t.fks:  # only referential actions write the referencing table
            if str(fk.get("on_update", "")).upper() not in ("", "NO ACTION", "RESTRICT") or \
                    str(fk.get("on_delete", "")).upper() not in ("", "NO ACTION", "RESTRICT"):
                fk_in.setdefault(fk["table"], set()).add(t.name)
    out: dict[str, frozenset | None] = {}
    for name, td in tools.items():
        if td.kind == "query":
            out[name] = frozenset()
            continue
        seen: set[str] = set()
        todo = [td.table]
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            todo.extend(by_table.get(t, ()))
            todo.extend(fk_in.get(t, ()))
        out[name] = frozenset(seen)
    return out


def state_keys_for(spec: DomainSpec, tables: dict[str, Table], declared: tuple[str, ...] = ()) -> StateKeys:
    """Technical keys decided from the schema (toolkit.scoring.state "Canonical state"):

    - technical columns: every rowid alias (a column declared INTEGER PRIMARY KEY, with or without
      AUTOINCREMENT: SQLite assigns it in creation order) and every declared technical column
      (`exclude_keys` in domain.yaml / the env config: a bare name for every table, or
      `table.column`);
    - references: every foreign key to a technical column (REFERENCES t(col), or REFERENCES t to a
      rowid-alias primary key), plus the `references` declared in domain.yaml for columns that hold
      a technical key without a FOREIGN KEY clause, e.g.
          references:
            - {column: audit_log.entity_id, to: reservation.reservation_id}
            - {column: log.entity_id, to: rx.rx_id, when: {entity: prescription}}
      Such columns are compared by the referenced row's content.
    """
    keys = StateKeys().with_exclude(declared)
    tech: dict[str, set[str]] = {t: set(c) for t, c in keys.technical.items()}
    for t in tables.values():
        for c in t.columns:
            if c.rowid_alias:
                tech.setdefault(t.name, set()).add(c.name)

    def is_tech(table: str, col: str) -> bool:
        return col in keys.exclude or col in tech.get(table, ())

    refs: dict[str, list[Ref]] = {}
    for t in tables.values():
        for fk in t.fks:
            to_t = fk["table"]
            to_c = fk.get("to")
            if to_t not in tables:
                continue
            if not to_c:
                pk = tables[to_t].pk
                if len(pk) != 1:
                    continue
                to_c = pk[0]
            if is_tech(to_t, to_c) and not is_tech(t.name, fk["column"]):
                refs.setdefault(t.name, []).append(Ref(fk["column"], to_t, to_c))
    for i, d in enumerate(spec.references or []):
        what = f"{spec.name}: references[{i}]"
        if not isinstance(d, dict) or not isinstance(d.get("column"), str) or not isinstance(d.get("to"), str):
            raise DomainError(f"{what}: expected {{column: table.column, to: table.column, when: {{col: value}}}}")
        ft, _, fc = d["column"].partition(".")
        tt, _, tc = d["to"].partition(".")
        if ft not in tables or fc not in tables[ft].colmap:
            raise DomainError(f"{what}: unknown column {d['column']!r} (use table.column)")
        if tt not in tables or tc not in tables[tt].colmap:
            raise DomainError(f"{what}: unknown column {d['to']!r} (use table.column)")
        if not is_tech(tt, tc):
            raise DomainError(f"{what}: {d['to']} is not a technical key (a rowid alias or a declared "
                              "technical column); a reference to a business key needs no declaration")
        when = d.get("when") or {}
        if not isinstance(when, dict) or any(k not in tables[ft].colmap for k in when):
            raise DomainError(f"{what}: `when` must map columns of {ft} to values")
        refs.setdefault(ft, []).append(Ref(fc, tt, tc, tuple(sorted(when.items()))))
    return StateKeys(keys.exclude, tech, refs)


def build_domain(spec: DomainSpec) -> CompiledDomain:
    """Execute the DDL, introspect tables and triggers, load the seed, generate the tools.

    `initial_hash` is left empty: `compile_domain` (runtime.py) fills it by reading the seeded
    state through the environment.

    Raises DomainError with a readable message when anything does not compile (this is LOGIGEN's
    "physical executability" check for an Architect-generated schema).
    """
    ov = spec.tools or {}
    readonly = {str(x) for x in (ov.get("readonly") or [])}
    conn = sqlite3.connect(":memory:", isolation_level=None)
    # the domain's SQL runs under the SQL sandbox: allow-list authorizer, 30 s per text, and the
    # operator's database size cap (a seed of huge blobs is an error, not GBs of memory)
    guard = _DomainGuard(conn, operator_limits().db_size_mb)
    try:
        guard.run(spec.name, "schema.sql", spec.schema_sql, "schema does not compile")
        trig_rows = conn.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type='trigger' ORDER BY rowid").fetchall()
        for (tname, _, _) in trig_rows:
            conn.execute(f"DROP TRIGGER {qident(tname)}")
        tables = _introspect_tables(conn, readonly)
        if not tables:
            raise DomainError(f"{spec.name}: the schema defines no tables")
        for t in tables.values():
            clash = [c.name for c in t.columns if c.name in QUERY_CONTROL_PARAMS]
            if clash:
                raise DomainError(f"{spec.name}: table {t.name!r} has column(s) {clash} whose names are reserved "
                                  f"for query parameters {QUERY_CONTROL_PARAMS}; rename them")
        for r in readonly:
            tn, _, cn = r.partition(".")
            if tn not in tables or cn not in tables[tn].colmap:
                raise DomainError(f"{spec.name}: tools.readonly names unknown column {r!r} (use table.column)")
        tables_only = conn.serialize()
        # seed rows go in with triggers absent (a seed is a state, not a sequence of agent writes)
        if isinstance(spec.seed, str):
            guard.run(spec.name, "seed", spec.seed, "seed does not load")
        elif spec.seed:
            conn.execute("BEGIN")
            try:
                _insert_rows(conn, tables, spec.seed, f"{spec.name} seed")
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        _check_fks(conn, f"{spec.name} seed")
        trigger_sql: list[str] = []
        triggers: list[TriggerInfo] = []
        for (tname, tbl, tsql) in trig_rows:
            guard.run(spec.name, f"trigger {tname}", tsql, f"trigger {tname} does not compile", script=False)
            trigger_sql.append(tsql)
            triggers.append(parse_trigger(tname, tbl, tsql))
        pristine = conn.serialize()
    finally:
        conn.close()

    rules: dict[str, dict] = {}
    for trg in triggers:
        for rule, msg in trg.rules:
            r = rules.setdefault(rule, {"rule": rule, "message": msg, "triggers": [], "tables": [],
                                        "hint": _policy_hint(spec.policy, rule)})
            if trg.name not in r["triggers"]:
                r["triggers"].append(trg.name)
            if trg.table not in r["tables"]:
                r["tables"].append(trg.table)
    tools = _build_tools(spec, tables, triggers, rules)
    excl = tuple(dict.fromkeys(list(DEFAULT_EXCLUDE_KEYS) + [str(k) for k in spec.exclude_keys]))
    dom = CompiledDomain(spec=spec, tables=tables, triggers=triggers, rules=rules, tools=tools,
                         trigger_sql=trigger_sql, tables_only=tables_only, pristine=pristine,
                         exclude_keys=excl, initial_hash="")
    dom.keys = state_keys_for(spec, tables, excl)
    dom.write_sets = _write_sets(tables, triggers, tools)
    # judged once here (kept in the on-disk domain cache): a later run's phrasing never loads the list
    dom.words = {w: is_word(w) for t in tables.values() for n in [t.name, *(c.name for c in t.columns)]
                 for w in n.lower().split("_") if w}
    dom.expansions = _expansions(spec, tables, dom.words)
    return dom


def _expansions(spec: DomainSpec, tables: dict, judged: dict) -> dict[str, str]:
    """{abbreviated part of a table or column name: the word of the domain's own texts it stands
    for} (english.expansion: `inv` -> "invoice" where the policy speaks of invoices): the words the
    phrasing uses for a domain whose names are abbreviations."""
    texts = [spec.policy or "", spec.description or "", *spec.tool_texts()]
    texts += [x.doc or "" for t in tables.values() for x in [t, *t.columns]]
    tokens = {w.lower() for w in re.findall(r"[A-Za-z]{2,}", "\n".join(texts))}
    out = {}
    for part, ok in judged.items():
        if not ok:
            e = expansion(part, tokens)
            if e is not None:
                out[part] = e
    return out


def _policy_hint(policy: str, rule: str) -> str | None:
    """The policy entry of the rule (e.g. '- **[seat_availability]** ...'), cleaned.

    An entry is the matching line plus its indented continuation lines. The rule's own bullet
    (`[rule]` at the start of a list item) wins; then any line with `[rule]`; only then the first
    line that mentions the id (a mention in an introduction or another rule is not the rule).
    """
    if not policy:
        return None
    rx = re.compile(r"(?<![\w-])" + re.escape(rule) + r"(?![\w-])")
    own = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+(?:\*\*|__)?\[" + re.escape(rule) + r"\]")
    bracket = re.compile(r"\[" + re.escape(rule) + r"\]")
    lines = policy.splitlines()
    order = ([i for i, ln in enumerate(lines) if own.search(ln)]
             + [i for i, ln in enumerate(lines) if bracket.search(ln)]
             + [i for i, ln in enumerate(lines) if rx.search(ln)])
    for i in order:
        line = lines[i]
        parts = [line.strip()]
        for nxt in lines[i + 1:]:
            if not nxt.strip() or not nxt[:1].isspace() or re.match(r"\s*([-*+]|\d+\.)\s", nxt):
                break
            parts.append(nxt.strip())
        text = " ".join(parts)
        text = re.sub(r"\*\*|__|`", "", text).lstrip("-*+> ").strip()
        text = re.sub(r"^\d+\.\s+", "", text)
        text = re.sub(r"^\[" + re.escape(rule) + r"\]\s*:?\s*", "", text)
        return text[:600] if text else None
    return None
