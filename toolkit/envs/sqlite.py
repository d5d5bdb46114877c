"""The sqlite backend: LOGIGEN's hard-compiled policy environment.

A domain is a wiki policy (markdown) compiled into SQLite tables plus BEFORE/AFTER triggers. The
agent acts only through atomic tools generated from the schema -- per table `query_<t>`,
`insert_<t>`, `update_<t>` (no delete: soft-delete through status columns) -- and the database
engine enforces the policy on every write:

- BEFORE triggers `RAISE(ABORT, 'POLICY_VIOLATION: <rule>: <message>')`; the tool returns the
  structured error {code: POLICY_VIOLATION, message, violated_rule: <rule>, hint} and the state is
  left exactly as it was (each write runs in a SAVEPOINT that is rolled back on any error).
- AFTER triggers perform the policy's side effects (inventory, refunds, audit rows...).
- Tool descriptions expose that logic: "Preconditions (enforced)" lists the rules of the BEFORE
  triggers on the tool's table, "Side effects" describes the AFTER triggers and the tables they write.

Env ref (a record's `env` field)::

    {"backend": "sqlite", "id": "airline"}                    # a bundled domain (toolkit/domains)
    {"backend": "sqlite", "path": "my_domain/"}               # a domain directory
    {"backend": "sqlite", "path": "my_domain.yaml"}           # or one JSON/YAML file, same keys
    optional: "state": {table: [rows]}   inline initial state, replaces the seed data
              "config": {"exclude_keys": [...], "hide": [...]}

Domain layout (docs/adding-a-domain.md): policy.md, schema.sql (tables + triggers), seed.sql or
seed.json/seed.yaml, optional tools.yaml (overrides), domain.yaml (name, description,
exclude_keys), tasks.jsonl (record lines; not read by the environment).

Safety: identifiers in generated SQL come only from the compiled schema, never from arguments;
every value is a bound parameter; arguments are validated against the generated JSON schema
(names, types, enums, string length <= MAX_STRING, query limit <= MAX_QUERY_LIMIT) before any SQL
runs; an authorizer refuses DDL, ATTACH, PRAGMA and load_extension on the environment's
connection. The domain's own SQL (schema.sql, seed.sql, triggers: possibly LLM-written) compiles
under an allow-list authorizer (`_DomainGuard`, docs/sandbox.md). Tool-level failures never raise:
they come back as structured errors.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import hashlib
import json
import math
import re
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.scoring.state import (
    DEFAULT_EXCLUDE_KEYS,
    CanonicalState,
    Ref,
    StateKeys,
    TableCanon,
    hash_tables,
    state_hash,
)
from toolkit.envs.base import Environment, ToolResult, register_backend
from toolkit.scoring.state import diff as _state_diff

MAX_STRING = 10_000  # longest string argument accepted (characters)
MAX_QUERY_LIMIT = 200  # largest `limit` of a query_* call
DEFAULT_QUERY_LIMIT = 50
MAX_OFFSET = 1_000_000
MAX_IN_ITEMS = 100
QUERY_CONTROL_PARAMS = ("order_by", "order", "limit", "offset")
QUERY_OPS = ("=", "!=", "<", "<=", ">", ">=", "like", "in")
_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 63 - 1
_STATE_CACHE_SIZE = 64
_CANON_CACHE_SIZE = 4096  # table contents whose canonical keys are kept (per domain)
_SAVEPOINT = "tk_tool_call"

__all__ = [
    "MAX_QUERY_LIMIT",
    "MAX_STRING",
    "QUERY_OPS",
    "CompiledDomain",
    "DomainError",
    "DomainSpec",
    "SqliteEnvironment",
    "compile_domain",
    "load_domain_spec",
]


class DomainError(ValueError):
    """A domain (policy/schema/seed/overrides) or an initial state that cannot be compiled."""


# ----------------------------------------------------------------------------------------------
# Domain spec (files) -> compiled domain (schema introspection, triggers, tools, pristine DB bytes)


@dataclass
class DomainSpec:
    name: str
    schema_sql: str
    policy: str = ""
    description: str = ""
    seed: Any = None  # SQL text, or {table: [row dicts]}
    tools: dict = field(default_factory=dict)  # overrides (tools.yaml)
    exclude_keys: list[str] = field(default_factory=list)  # declared technical columns
    references: list = field(default_factory=list)  # declared references to technical keys
    source: str | None = None


@dataclass
class Column:
    name: str
    decl_type: str
    json_type: str | None  # integer | number | string | boolean | None (any scalar)
    notnull: bool
    default: Any
    pk: int  # 1-based position in the primary key, 0 if not part of it
    rowid_alias: bool = False
    enum: list | None = None
    doc: str = ""
    readonly: bool = False

    @property
    def nullable(self) -> bool:
        return not self.notnull and not self.pk


@dataclass
class Table:
    name: str
    columns: list[Column]
    pk: list[str]
    without_rowid: bool
    fks: list[dict]
    doc: str = ""
    sql: str = ""
    colmap: dict[str, Column] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.colmap = {c.name: c for c in self.columns}
        self.names = tuple(c.name for c in self.columns)
        self.untyped = any(c.json_type is None for c in self.columns)


@dataclass
class TriggerInfo:
    name: str
    table: str
    timing: str  # BEFORE | AFTER | INSTEAD OF
    event: str  # INSERT | UPDATE | DELETE
    columns: list[str]  # UPDATE OF columns ([] = any)
    when: str | None
    rules: list[tuple[str, str]]  # (rule, message) of RAISE('POLICY_VIOLATION: rule: message')
    raw_messages: list[str]  # every RAISE message literal
    writes: list[tuple[str, str]]  # (verb, table): ("updates", "flight_cabin")
    notes: list[str]  # comments inside the trigger
    sql: str


@dataclass
class ToolDef:
    name: str
    kind: str  # query | insert | update
    table: str
    schema: dict  # OpenAI function tool
    side: str = "agent"  # agent | user | both
    hidden: bool = False


@dataclass
class CompiledDomain:
    spec: DomainSpec
    tables: dict[str, Table]
    triggers: list[TriggerInfo]
    rules: dict[str, dict]
    tools: dict[str, ToolDef]
    trigger_sql: list[str]
    tables_only: bytes  # serialized DB: tables and indexes, no rows, no triggers
    pristine: bytes  # serialized DB: schema + triggers + seed rows
    exclude_keys: tuple[str, ...]
    initial_hash: str
    state_cache: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    keys: Any = None  # StateKeys derived from the schema (see state_keys_for)
    canon_cache: OrderedDict = field(default_factory=OrderedDict)  # table content -> TableCanon
    write_sets: dict = field(default_factory=dict)  # tool name -> tables it may write (None: unknown)
    content_ids: dict = field(default_factory=dict)  # (table, rows) -> content id (never reused)
    content_ids_base: int = 0
    lock: Any = field(default_factory=threading.Lock)


def _read_structured(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        return json.loads(text)
    import yaml

    return yaml.safe_load(text)


def _first(d: Path, names: tuple[str, ...]) -> Path | None:
    for n in names:
        p = d / n
        if p.is_file():
            return p
    return None


def load_domain_spec(path: str | Path) -> DomainSpec:
    """Read a domain directory or a single JSON/YAML file into a DomainSpec."""
    p = Path(path)
    if p.is_dir():
        meta: dict = {}
        mp = _first(p, ("domain.yaml", "domain.yml", "domain.json"))
        if mp:
            meta = _read_structured(mp) or {}
            if not isinstance(meta, dict):
                raise DomainError(f"{mp}: expected a mapping")
        sp = _first(p, ("schema.sql",))
        if sp is None:
            raise DomainError(f"{p}: no schema.sql")
        pp = _first(p, ("policy.md", "policy.txt"))
        seed: Any = None
        seed_p = _first(p, ("seed.sql", "seed.json", "seed.yaml", "seed.yml"))
        if seed_p is not None:
            seed = seed_p.read_text(encoding="utf-8") if seed_p.suffix == ".sql" else _read_structured(seed_p)
        tp = _first(p, ("tools.yaml", "tools.yml", "tools.json"))
        tools = (_read_structured(tp) or {}) if tp else {}
        return DomainSpec(
            name=str(meta.get("name") or p.name),
            description=str(meta.get("description") or ""),
            schema_sql=sp.read_text(encoding="utf-8"),
            policy=pp.read_text(encoding="utf-8") if pp else str(meta.get("policy") or ""),
            seed=seed,
            tools=tools if isinstance(tools, dict) else {},
            exclude_keys=list(meta.get("exclude_keys") or []),
            references=list(meta.get("references") or []),
            source=str(p.resolve()),
        )
    if p.is_file():
        if p.suffix.lower() not in (".json", ".yaml", ".yml"):
            raise DomainError(f"{p}: a single-file domain must be .json, .yaml or .yml")
        data = _read_structured(p)
        if not isinstance(data, dict):
            raise DomainError(f"{p}: expected a mapping with keys name, policy, schema, seed, tools")
        spec = spec_from_dict(data, default_name=p.stem)
        spec.source = str(p.resolve())
        return spec
    raise DomainError(f"domain path not found: {p}")


def spec_from_dict(data: dict, default_name: str = "domain") -> DomainSpec:
    """A DomainSpec from one mapping: {name, description, policy, schema, seed, tools, exclude_keys}."""
    schema = data.get("schema") or data.get("schema_sql")
    if not isinstance(schema, str) or not schema.strip():
        raise DomainError("a domain needs `schema`: the DDL text (tables and triggers)")
    tools = data.get("tools") or {}
    return DomainSpec(
        name=str(data.get("name") or default_name),
        description=str(data.get("description") or ""),
        schema_sql=schema,
        policy=str(data.get("policy") or ""),
        seed=data.get("seed"),
        tools=tools if isinstance(tools, dict) else {},
        exclude_keys=list(data.get("exclude_keys") or []),
        references=list(data.get("references") or []),
    )


# -- SQL text helpers (comments, string literals) ----------------------------------------------

_TOKEN_RE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)


def _split_comments(sql: str) -> tuple[str, list[str]]:
    """(sql with comments blanked, [comment texts]); string literals are kept intact."""
    comments: list[str] = []

    def sub(m: re.Match) -> str:
        t = m.group(0)
        if t.startswith("--"):
            comments.append(t[2:].strip())
            return " "
        if t.startswith("/*"):
            comments.append(t[2:].rstrip("/").rstrip("*").strip())
            return " "
        return t

    return _TOKEN_RE.sub(sub, sql), [c for c in comments if c]


def _blank_strings(code: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", code)


def _unquote_ident(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return s[1:-1].replace('""', '"')
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]":
        return s[1:-1]
    if len(s) >= 2 and s[0] == s[-1] == "`":
        return s[1:-1]
    return s


def qident(name: str) -> str:
    """Quote an identifier (only ever applied to names read from the compiled schema)."""
    return '"' + name.replace('"', '""') + '"'


_LITERAL_RE = re.compile(r"'((?:[^']|'')*)'|(-?\d+(?:\.\d+)?)")


def _parse_enum_checks(code: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for m in re.finditer(r"CHECK\s*\(\s*(\"[^\"]+\"|\w+)\s+IN\s*\(([^()]*)\)\s*\)", code, re.IGNORECASE):
        vals: list = []
        for lit in _LITERAL_RE.finditer(m.group(2)):
            if lit.group(1) is not None:
                vals.append(lit.group(1).replace("''", "'"))
            else:
                num = lit.group(2)
                vals.append(float(num) if "." in num else int(num))
        if vals:
            out[_unquote_ident(m.group(1))] = vals
    return out


def _json_type(decl: str) -> str | None:
    d = (decl or "").upper()
    if "INT" in d:
        return "integer"
    if "BOOL" in d:
        return "boolean"
    if any(k in d for k in ("CHAR", "CLOB", "TEXT", "DATE", "TIME", "UUID", "JSON")):
        return "string"
    if any(k in d for k in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
        return "number"
    if not d or "BLOB" in d:
        return None
    return "string"


def _table_docs(sql: str, colnames: set[str]) -> tuple[str, dict[str, str]]:
    """Table doc = comment on the CREATE TABLE line; column doc = trailing comment of its line."""
    lines = sql.splitlines()
    table_doc = ""
    col_docs: dict[str, str] = {}
    for i, line in enumerate(lines):
        code, comments = _split_comments(line)
        if not comments:
            continue
        text = " ".join(comments)
        if i == 0:
            table_doc = text
            continue
        m = re.match(r"\s*(\"[^\"]+\"|\w+)", code)
        if m and _unquote_ident(m.group(1)) in colnames:
            col_docs[_unquote_ident(m.group(1))] = text
    return table_doc, col_docs


_TRIGGER_HEAD = re.compile(
    r"CREATE\s+(?:TEMP(?:ORARY)?\s+)?TRIGGER\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>\"[^\"]+\"|[\w.]+)\s+"
    r"(?P<timing>BEFORE|AFTER|INSTEAD\s+OF)?\s*(?P<event>DELETE|INSERT|UPDATE)"
    r"(?:\s+OF\s+(?P<cols>.+?))?\s+ON\s+(?P<table>\"[^\"]+\"|[\w.]+)(?P<rest>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_RAISE_RE = re.compile(r"RAISE\s*\(\s*(ABORT|FAIL|ROLLBACK|IGNORE)\s*(?:,\s*'((?:[^']|'')*)')?\s*\)", re.IGNORECASE)
_PV_RE = re.compile(r"^\s*POLICY_VIOLATION\s*:\s*([^:]+?)\s*:\s*(.*)$", re.DOTALL)
_WRITE_RES = (
    ("inserts into", re.compile(r"\b(?:INSERT|REPLACE)\s+(?:OR\s+\w+\s+)?INTO\s+(\"[^\"]+\"|\w+)", re.IGNORECASE)),
    ("updates", re.compile(r"\bUPDATE\s+(?:OR\s+\w+\s+)?(\"[^\"]+\"|\w+)\s+SET\b", re.IGNORECASE)),
    ("deletes from", re.compile(r"\bDELETE\s+FROM\s+(\"[^\"]+\"|\w+)", re.IGNORECASE)),
)


def parse_trigger(name: str, table: str, sql: str) -> TriggerInfo:
    code, comments = _split_comments(sql)
    timing, event, cols, when = "BEFORE", "INSERT", [], None
    body = code
    m = _TRIGGER_HEAD.match(code.strip())
    if m:
        timing = re.sub(r"\s+", " ", (m.group("timing") or "BEFORE").upper())
        event = m.group("event").upper()
        if m.group("cols"):
            cols = [_unquote_ident(c) for c in m.group("cols").split(",") if c.strip()]
        rest = m.group("rest")
        rm = re.match(r"\s*(?:FOR\s+EACH\s+ROW\s+)?(?:WHEN\s+(?P<when>.+?)\s+)?BEGIN\b(?P<body>.*)$", rest, re.IGNORECASE | re.DOTALL)
        if rm:
            when = re.sub(r"\s+", " ", rm.group("when")).strip() if rm.group("when") else None
            body = rm.group("body")
    rules: list[tuple[str, str]] = []
    raw: list[str] = []
    for rm2 in _RAISE_RE.finditer(body):
        msg = (rm2.group(2) or "").replace("''", "'")
        if not msg:
            continue
        raw.append(msg)
        pv = _PV_RE.match(msg)
        if pv:
            rules.append((pv.group(1).strip(), pv.group(2).strip()))
    found: list[tuple[int, str, str]] = []
    plain = _blank_strings(body)
    for verb, rx in _WRITE_RES:
        for wm in rx.finditer(plain):
            found.append((wm.start(), verb, _unquote_ident(wm.group(1))))
    writes: list[tuple[str, str]] = []
    for _, verb, tbl in sorted(found):
        if (verb, tbl) not in writes:
            writes.append((verb, tbl))
    return TriggerInfo(name=name, table=table, timing=timing, event=event, columns=cols, when=when,
                       rules=rules, raw_messages=raw, writes=writes, notes=comments, sql=sql)


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
    if not isinstance(data, dict):
        raise DomainError(f"{what}: expected a mapping {{table: [rows]}}")
    for tname, rows in data.items():
        t = tables.get(tname)
        if t is None:
            raise DomainError(f"{what}: unknown table {tname!r}; tables: {sorted(tables)}")
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise DomainError(f"{what}: table {tname!r} must map to a list of rows")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DomainError(f"{what}: {tname}[{i}] is not a mapping")
            bad = [k for k in row if k not in t.colmap]
            if bad:
                raise DomainError(f"{what}: {tname}[{i}] unknown columns {bad}; columns: {list(t.colmap)}")
            if not row:
                conn.execute(f"INSERT INTO {qident(tname)} DEFAULT VALUES")
                continue
            names = list(row)
            vals = [int(v) if isinstance(v, bool) else v for v in row.values()]
            for v in vals:
                if not (v is None or isinstance(v, (int, float, str, bytes))):
                    raise DomainError(f"{what}: {tname}[{i}] has a non-scalar value {str(v)[:80]!r}")
            sql = (f"INSERT INTO {qident(tname)} ({', '.join(qident(t.colmap[n].name) for n in names)}) "
                   f"VALUES ({', '.join('?' * len(names))})")
            try:
                conn.execute(sql, vals)
            except sqlite3.Error as e:
                raise DomainError(f"{what}: {tname}[{i}] rejected: {e}") from None


def _check_fks(conn: sqlite3.Connection, what: str) -> None:
    bad = conn.execute("PRAGMA foreign_key_check").fetchall()
    if bad:
        tbl, rowid, parent, _ = bad[0]
        raise DomainError(f"{what}: {len(bad)} foreign-key violation(s), e.g. {tbl} rowid {rowid} -> {parent}")


def _load_state_bytes(dom: CompiledDomain, state: dict) -> bytes:
    """Serialized DB holding `state` (triggers silenced while loading, re-created after)."""
    key = hashlib.sha256(json.dumps(state, sort_keys=True, ensure_ascii=False, default=str)
                         .encode("utf-8")).hexdigest()
    with dom.lock:
        hit = dom.state_cache.get(key)
        if hit is not None:
            dom.state_cache.move_to_end(key)
            return hit
    conn = sqlite3.connect(":memory:", isolation_level=None)
    _harden(conn)
    try:
        conn.deserialize(dom.tables_only)
        conn.execute("BEGIN")
        _insert_rows(conn, dom.tables, state, "initial state")
        conn.execute("COMMIT")
        _check_fks(conn, "initial state")
        guard = _DomainGuard(conn)
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


# -- the SQL authorizer for domain texts ---------------------------------------------------------
# Every SQL text of a domain (schema.sql, seed.sql, the triggers) may come from an LLM or a user:
# it runs under an allow-list authorizer on an in-memory connection, so it can build tables and
# rows and nothing else (docs/sandbox.md, "LLM-written SQL").


def _codes(*names: str) -> frozenset[int]:
    return frozenset(getattr(sqlite3, n) for n in names if hasattr(sqlite3, n))


_DOMAIN_ALLOW = _codes(
    "SQLITE_CREATE_TABLE", "SQLITE_CREATE_INDEX", "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_VIEW",
    "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_TEMP_INDEX", "SQLITE_CREATE_TEMP_TRIGGER",
    "SQLITE_CREATE_TEMP_VIEW", "SQLITE_DROP_TABLE", "SQLITE_DROP_INDEX", "SQLITE_DROP_TRIGGER",
    "SQLITE_DROP_VIEW", "SQLITE_DROP_TEMP_TABLE", "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_TRIGGER",
    "SQLITE_DROP_TEMP_VIEW", "SQLITE_ALTER_TABLE", "SQLITE_INSERT", "SQLITE_UPDATE", "SQLITE_DELETE",
    "SQLITE_SELECT", "SQLITE_READ", "SQLITE_FUNCTION", "SQLITE_RECURSIVE", "SQLITE_TRANSACTION",
    "SQLITE_SAVEPOINT", "SQLITE_PRAGMA", "SQLITE_REINDEX", "SQLITE_ANALYZE")
# PRAGMAs that neither touch files nor change the engine's safety (the rest are refused)
_SAFE_PRAGMAS = frozenset({
    "foreign_keys", "defer_foreign_keys", "foreign_key_check", "foreign_key_list", "table_info",
    "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "integrity_check",
    "quick_check", "user_version", "application_id", "encoding", "page_count", "freelist_count",
    "data_version"})
# SQL functions that reach outside the database (load_extension is also off at the connection)
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_DENIED_CALL_RE = re.compile(r"\b(load_extension|fts3_tokenizer)\s*\(", re.IGNORECASE)
_MAX_VALUE_BYTES = 10_000_000  # SQLITE_LIMIT_LENGTH: the largest string / blob / row
_DOMAIN_SQL_SECONDS = 30.0  # wall-time budget of one domain SQL text (a runaway recursive seed)


def _harden(conn: sqlite3.Connection) -> None:
    """Connection-level switches that the authorizer cannot express."""
    if hasattr(conn, "enable_load_extension"):
        conn.enable_load_extension(False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)


class _DomainGuard:
    """The allow-list authorizer (and a time budget) around one compile connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.refused: list[tuple[str, str]] = []  # (what, regex locating it in the SQL text)
        self.deadline = float("inf")
        _harden(conn)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)  # as on the environment's connection
        conn.set_authorizer(self._authorize)
        conn.set_progress_handler(self._progress, 10_000)

    def _progress(self) -> int:
        import time

        return 1 if time.monotonic() > self.deadline else 0

    def _refuse(self, what: str, where: str) -> int:
        self.refused.append((what, where))
        return sqlite3.SQLITE_DENY

    def _authorize(self, action: int, a1: Any, a2: Any, db: Any, _trigger: Any) -> int:
        if action == sqlite3.SQLITE_ATTACH:
            return self._refuse(f"ATTACH / VACUUM INTO {a1!r} (a file outside the domain)",
                                r"\b(ATTACH|VACUUM)\b")
        if action == sqlite3.SQLITE_DETACH:
            return self._refuse(f"DETACH {a1!r}", r"\bDETACH\b")
        if action not in _DOMAIN_ALLOW:
            kind = _ACTION_NAMES.get(action, str(action))
            if action == getattr(sqlite3, "SQLITE_CREATE_VTABLE", -1):
                return self._refuse(f"CREATE VIRTUAL TABLE {a1!r} USING {a2!r}", r"\bVIRTUAL\b")
            return self._refuse(f"{kind} {a1 or ''}".strip(), r"\b" + kind.split("_")[0] + r"\b")
        if db is not None and db not in ("main", "temp"):
            return self._refuse(f"a write or read in database {db!r} (only the domain's own database)",
                                re.escape(str(db)))
        if action == sqlite3.SQLITE_PRAGMA and str(a1 or "").lower() not in _SAFE_PRAGMAS:
            return self._refuse(f"PRAGMA {a1}" + (f" = {a2}" if a2 is not None else "")
                                + " (only PRAGMAs that touch no file: " + ", ".join(sorted(_SAFE_PRAGMAS)) + ")",
                                r"\bPRAGMA\b[^;]*\b" + re.escape(str(a1 or "")) + r"\b")
        if action == sqlite3.SQLITE_FUNCTION and str(a2 or "").lower() in _DENIED_FUNCTIONS:
            return self._refuse(f"function {a2}()", r"\b" + re.escape(str(a2)) + r"\s*\(")
        return sqlite3.SQLITE_OK

    def _refusal(self, name: str, what: str, sql: str) -> str:
        refused, where = self.refused[0]
        return (f"{name}: {what} refused by the SQL sandbox: {refused}{_locate(sql, where)}. "
                "A domain's SQL may only CREATE/DROP tables, indexes, triggers and views and read or "
                "write their rows: no ATTACH/DETACH, VACUUM INTO, load_extension or PRAGMAs that touch files")

    def run(self, name: str, what: str, sql: str, failed: str, *, script: bool = True) -> None:
        """Execute one domain SQL text; DomainError naming `what` (schema.sql, seed, triggers) on
        a refusal, `failed` ("schema does not compile") on any other SQLite error."""
        import time

        self.refused.clear()
        # a trigger or view body is authorized only when a statement that uses it is prepared:
        # refuse the out-of-database functions in the text now (the runtime authorizer refuses
        # them again at call time)
        m = _DENIED_CALL_RE.search(sql) and _DENIED_CALL_RE.search(_blank_strings(_split_comments(sql)[0]))
        if m:
            self.refused.append((f"function {m.group(1)}()", r"\b" + m.group(1) + r"\s*\("))
            raise DomainError(self._refusal(name, what, sql))
        self.deadline = time.monotonic() + _DOMAIN_SQL_SECONDS
        try:
            if script:
                self.conn.executescript(sql)
            else:
                self.conn.execute(sql)
        except sqlite3.Error as e:
            if self.refused:
                raise DomainError(self._refusal(name, what, sql)) from None
            if "interrupted" in str(e) and time.monotonic() > self.deadline:
                raise DomainError(f"{name}: {what} ran longer than {_DOMAIN_SQL_SECONDS:g} s "
                                  "(a runaway recursive query?)") from None
            raise DomainError(f"{name}: {failed}: {e}") from None
        finally:
            self.deadline = float("inf")


_ACTION_NAMES = {getattr(sqlite3, n): n[len("SQLITE_"):] for n in (
    "SQLITE_CREATE_VTABLE", "SQLITE_DROP_VTABLE") if hasattr(sqlite3, n)}


def _locate(sql: str, pattern: str) -> str:
    """' (statement N, line L: <text>)' for the first statement of `sql` matching `pattern`."""
    rx = re.compile(pattern, re.IGNORECASE)
    start = line = 0
    n = scanned = 0
    for m in re.finditer(";", sql):
        stmt = sql[start:m.end()]
        scanned += len(stmt)
        if scanned > 50_000_000:  # bounded work on a hostile text (semicolons inside long strings)
            break
        if not sqlite3.complete_statement(stmt):
            continue
        n += 1
        code = _blank_strings(_split_comments(stmt)[0])
        if rx.search(code):
            lead = len(stmt) - len(stmt.lstrip())
            lineno = line + stmt[:lead].count("\n") + 1
            return f" (statement {n}, line {lineno}: {_short(' '.join(stmt.split()), 120)})"
        line += stmt.count("\n")
        start = m.end()
    return ""


def compile_domain(spec: DomainSpec) -> CompiledDomain:
    """Execute the DDL, introspect tables and triggers, load the seed, generate the tools.

    Raises DomainError with a readable message when anything does not compile (this is LOGIGEN's
    "physical executability" check for an Architect-generated schema).
    """
    ov = spec.tools or {}
    readonly = {str(x) for x in (ov.get("readonly") or [])}
    conn = sqlite3.connect(":memory:", isolation_level=None)
    guard = _DomainGuard(conn)
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
    env = SqliteEnvironment(dom)
    try:
        dom.initial_hash = env.state_hash()
    except sqlite3.Error as e:
        raise DomainError(f"{spec.name}: the seeded state cannot be read: {e}") from None
    finally:
        env.close()
    return dom


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


# -- tool generation ----------------------------------------------------------------------------

_OP_SCHEMA = {
    "type": "object",
    "properties": {"op": {"type": "string", "enum": list(QUERY_OPS)},
                   "value": {"description": "a scalar; a list of scalars for op 'in'"}},
    "required": ["op", "value"],
    "additionalProperties": False,
}


def _scalar_schema(c: Column, nullable: bool) -> dict:
    if c.json_type is None:
        s: dict = {"type": ["string", "number", "integer", "boolean"]}
    else:
        s = {"type": c.json_type}
    if c.json_type == "string":
        s["maxLength"] = MAX_STRING
    if c.enum:
        s["enum"] = list(c.enum)
    if nullable:
        s["type"] = (s["type"] if isinstance(s["type"], list) else [s["type"]]) + ["null"]
        if "enum" in s:
            s["enum"] = s["enum"] + [None]
    return s


def _insert_required(c: Column) -> bool:
    """An insert must pass the column: NOT NULL without default, or a primary key that SQLite
    would otherwise fill with NULL (a non-INTEGER PRIMARY KEY accepts NULL unless NOT NULL)."""
    return (not c.readonly and not c.rowid_alias and c.default is None and (c.notnull or bool(c.pk)))


def _col_desc(t: Table, c: Column) -> str:
    parts = []
    if c.doc:
        parts.append(c.doc.rstrip("."))
    if c.pk:
        parts.append("primary key" + (" (assigned automatically when omitted)" if c.rowid_alias else ""))
    for fk in t.fks:
        if fk["column"] == c.name:
            parts.append(f"references {fk['table']}.{fk['to'] or 'rowid'}")
    if c.enum:
        parts.append("one of: " + ", ".join(map(str, c.enum)))
    return "; ".join(parts) or c.name


def _trigger_label(trg: TriggerInfo) -> str:
    if trg.event == "UPDATE" and trg.columns:
        cols = trg.columns
        return "when " + (cols[0] if len(cols) == 1 else ", ".join(cols[:-1]) + " or " + cols[-1]) + " changes"
    return {"INSERT": "on insert", "UPDATE": "on update", "DELETE": "on delete"}[trg.event]


def _describe_effects(trg: TriggerInfo) -> str:
    writes = "; ".join(f"{verb} {tbl}" for verb, tbl in trg.writes)
    note = " ".join(n.rstrip(".") + "." for n in trg.notes if not n.lower().startswith("hint:"))
    text = note.strip() or (writes.capitalize() + "." if writes else "Automatic bookkeeping.")
    if writes and note:
        text += f" (writes: {writes})"
    return f"- {_trigger_label(trg)}: {text}"


def _build_tools(spec: DomainSpec, tables: dict[str, Table], triggers: list[TriggerInfo],
                 rules: dict[str, dict]) -> dict[str, ToolDef]:
    ov = spec.tools or {}
    hide_patterns = [str(x) for x in (ov.get("hide") or [])]
    per_tool = ov.get("tools") or {}
    out: dict[str, ToolDef] = {}
    for t in tables.values():
        pre: dict[str, list[str]] = {"INSERT": [], "UPDATE": []}
        eff: dict[str, list[str]] = {"INSERT": [], "UPDATE": []}
        for trg in triggers:
            if trg.table != t.name or trg.event not in pre:
                continue
            if trg.raw_messages:  # BEFORE triggers mostly; an AFTER trigger's RAISE also rolls back
                for rule, msg in trg.rules:
                    line = f"- [{rule}] {msg}"
                    if trg.event == "UPDATE" and trg.columns:
                        line += f" ({_trigger_label(trg)})"
                    if line not in pre[trg.event]:
                        pre[trg.event].append(line)
                for msg in trg.raw_messages:
                    if not _PV_RE.match(msg):
                        pre[trg.event].append(f"- [{trg.name}] {msg}")
            if trg.writes or (trg.timing != "BEFORE" and trg.notes):
                eff[trg.event].append(_describe_effects(trg))
        tdoc = f" ({t.doc.rstrip('.')})" if t.doc else ""
        auto = [c.name for c in t.columns if c.readonly]

        def logic(event: str, pre: dict = pre, eff: dict = eff) -> str:
            s = ""
            if pre[event]:
                s += ("\nPreconditions (enforced by the database; a violation returns a POLICY_VIOLATION "
                      "error and changes nothing):\n" + "\n".join(pre[event]))
            if eff[event]:
                s += "\nSide effects (performed automatically; do not repeat them):\n" + "\n".join(eff[event])
            return s

        # query
        qprops: dict[str, Any] = {}
        for c in t.columns:
            qprops[c.name] = {"description": "filter: " + _col_desc(t, c) + " (equality, or {op, value})",
                              "anyOf": [_scalar_schema(c, nullable=True), _OP_SCHEMA]}
        colnames = [c.name for c in t.columns]
        qprops["order_by"] = {"type": "string", "enum": colnames, "description": "column to sort by"}
        qprops["order"] = {"type": "string", "enum": ["asc", "desc"], "description": "sort direction (default asc)"}
        qprops["limit"] = {"type": "integer", "minimum": 1, "maximum": MAX_QUERY_LIMIT,
                           "description": f"maximum rows returned (default {DEFAULT_QUERY_LIMIT})"}
        qprops["offset"] = {"type": "integer", "minimum": 0, "description": "rows to skip (default 0)"}
        qdesc = (f"Read rows of table `{t.name}`{tdoc}. Every argument is optional: pass a column name with a "
                 f"value to filter by equality (null matches missing values), or with "
                 f"{{\"op\": one of {', '.join(QUERY_OPS)}, \"value\": ...}} (a list for 'in'; 'like' uses % "
                 f"wildcards); combine filters with AND. order_by/order sort, limit (default "
                 f"{DEFAULT_QUERY_LIMIT}, max {MAX_QUERY_LIMIT}) and offset page. Returns "
                 f"{{\"rows\": [...], \"count\": n, \"truncated\": bool}}. Read-only.")
        _add_tool(out, ToolDef(f"query_{t.name}", "query", t.name, _fn(f"query_{t.name}", qdesc, qprops, [])))

        # insert
        iprops: dict[str, Any] = {}
        required: list[str] = []
        for c in t.columns:
            if c.readonly:
                continue
            iprops[c.name] = {"description": _col_desc(t, c), **_scalar_schema(c, nullable=c.nullable)}
            if _insert_required(c):
                required.append(c.name)
        auto_pk = [c.name for c in t.columns if c.rowid_alias]
        idesc = (f"Create one row in table `{t.name}`{tdoc}."
                 + (f" Required: {', '.join(required)}." if required else "")
                 + (f" {', '.join(auto_pk)} is assigned automatically when omitted." if auto_pk else "")
                 + (f" Maintained automatically (not settable): {', '.join(auto)}." if auto else "")
                 + " Returns the inserted row as stored, after automatic side effects."
                 + logic("INSERT"))
        _add_tool(out, ToolDef(f"insert_{t.name}", "insert", t.name,
                               _fn(f"insert_{t.name}", idesc, iprops, required)))

        # update (needs a primary key)
        if t.pk:
            uprops: dict[str, Any] = {}
            for c in t.columns:
                if c.pk:
                    uprops[c.name] = {"description": "identifies the row: " + _col_desc(t, c),
                                      **_scalar_schema(c, nullable=False)}
                elif not c.readonly:
                    uprops[c.name] = {"description": "new value: " + _col_desc(t, c),
                                      **_scalar_schema(c, nullable=c.nullable)}
            udesc = (f"Change fields of one existing row of table `{t.name}`{tdoc}, identified by "
                     f"{' + '.join(t.pk)}; pass only the fields to change (primary keys cannot change)."
                     + (f" Maintained automatically (not settable): {', '.join(auto)}." if auto else "")
                     + " Returns the updated row, after automatic side effects. No deletes exist: use a status "
                       "field where the policy defines one." + logic("UPDATE"))
            _add_tool(out, ToolDef(f"update_{t.name}", "update", t.name,
                                   _fn(f"update_{t.name}", udesc, uprops, list(t.pk))))

    for name, td in out.items():
        if any(fnmatch.fnmatchcase(name, p) for p in hide_patterns):
            td.hidden = True
    for name, o in per_tool.items():
        td = out.get(name)
        if td is None:
            raise DomainError(f"{spec.name}: tools.yaml overrides unknown tool {name!r}; tools: {sorted(out)}")
        if not isinstance(o, dict):
            raise DomainError(f"{spec.name}: tools.yaml entry {name!r} must be a mapping")
        f = td.schema["function"]
        if "description" in o:
            f["description"] = str(o["description"])
        if "description_append" in o:
            f["description"] = f["description"] + "\n" + str(o["description_append"])
        if "hidden" in o:
            td.hidden = bool(o["hidden"])
        if "side" in o:
            if o["side"] not in ("agent", "user", "both"):
                raise DomainError(f"{spec.name}: tools.yaml {name}.side must be agent, user or both")
            td.side = o["side"]
    return out


def _fn(name: str, desc: str, props: dict, required: list[str]) -> dict:
    params: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


def _add_tool(out: dict, td: ToolDef) -> None:
    out[td.name] = td


# compiled-domain cache: (resolved source, file stamps) -> CompiledDomain
_DOMAIN_CACHE: dict[tuple, CompiledDomain] = {}
_DOMAIN_LOCK = threading.Lock()


def _stamp(p: Path) -> tuple:
    files = sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p]
    return tuple((x.name, x.stat().st_mtime_ns, x.stat().st_size) for x in files)


def compiled_from_path(path: str | Path) -> CompiledDomain:
    p = Path(path).resolve()
    if not p.exists():
        raise DomainError(f"domain path not found: {path}")
    key = (str(p), _stamp(p))
    with _DOMAIN_LOCK:
        dom = _DOMAIN_CACHE.get(key)
    if dom is None:
        dom = compile_domain(load_domain_spec(p))
        with _DOMAIN_LOCK:
            for k in [k for k in _DOMAIN_CACHE if k[0] == key[0]]:
                del _DOMAIN_CACHE[k]
            _DOMAIN_CACHE[key] = dom
    return dom


# ----------------------------------------------------------------------------------------------
# The environment


def _deny_codes() -> frozenset[int]:
    names = [n for n in dir(sqlite3) if n.startswith(("SQLITE_CREATE_", "SQLITE_DROP_"))]
    names += ["SQLITE_ALTER_TABLE", "SQLITE_ATTACH", "SQLITE_DETACH", "SQLITE_PRAGMA", "SQLITE_REINDEX",
              "SQLITE_ANALYZE"]
    return frozenset(getattr(sqlite3, n) for n in names if hasattr(sqlite3, n))


_DENY = _deny_codes()


def _short(v: Any, n: int = 80) -> str:
    s = v if isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[:n] + f"...({len(s)} chars)"


class _ArgError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint


class SqliteEnvironment(Environment):
    """One in-memory SQLite database compiled from a domain; see the module docstring."""

    backend = "sqlite"

    def __init__(self, domain: CompiledDomain, state: dict | None = None, config: dict | None = None):
        self.domain = domain
        self.config = dict(config or {})
        extra = [str(k) for k in (self.config.get("exclude_keys") or [])]
        self.exclude_keys: tuple[str, ...] = tuple(dict.fromkeys(list(domain.exclude_keys) + extra))
        dkeys = domain.keys if domain.keys is not None else StateKeys(domain.exclude_keys)
        self.keys: StateKeys = dkeys.with_exclude(extra) if extra else dkeys
        self._keys_sig = json.dumps(self.keys.to_json(), sort_keys=True)
        self._deps = {t: self._dep_tables(t) for t in domain.tables}
        self._canon_key: Any = None
        self._canon_val: dict[str, TableCanon] = {}
        self._raw: dict[str, tuple] = {}  # table -> rows (as fetched) behind _canon_val
        self._raw_id: dict[str, int] = {}  # table -> content id of those rows (domain-wide)
        self._dirty: set[str] | None = None  # tables to re-read (None: all)
        self._tracked = -1  # total_changes after the last tracked call / canonical()
        self._at_init = False  # the state is the untouched reset() state
        self._init_canon: tuple[dict, dict, dict] | None = None  # (raw, canonical) of the reset() state
        self._hidden_extra = [str(x) for x in (self.config.get("hide") or [])]
        self._initial_state = copy.deepcopy(state) if state is not None else None
        self._init_hash: str | None = None
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False,
                                     cached_statements=512)
        self._lock = threading.RLock()
        self._init_bytes = _load_state_bytes(domain, state) if state is not None else domain.pristine
        self._conn.execute("PRAGMA foreign_keys = ON")  # a connection flag: survives deserialize
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        _harden(self._conn)  # no extensions, no attached databases (trigger bodies are LLM-written)
        self._loading = False
        self._conn.set_authorizer(self._authorize)
        self._load(self._init_bytes)
        self._snap_sql = {t.name: f"SELECT * FROM {qident(t.name)} ORDER BY "
                          + (", ".join(qident(k) for k in t.pk) if t.pk else "rowid")
                          for t in domain.tables.values()}

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_ref(cls, ref: dict) -> SqliteEnvironment:
        if hasattr(ref, "model_dump"):
            ref = ref.model_dump(exclude_none=True)
        ref = dict(ref or {})
        if ref.get("path"):
            dom = compiled_from_path(ref["path"])
        elif ref.get("id"):
            from toolkit.domains import domain_path

            try:
                dom = compiled_from_path(domain_path(str(ref["id"])))
            except KeyError as e:
                raise DomainError(str(e.args[0] if e.args else e)) from None
        else:
            raise DomainError("a sqlite env ref needs `id` (bundled domain) or `path` (directory or JSON/YAML file)")
        return cls(dom, state=ref.get("state"), config=ref.get("config") or {})

    @classmethod
    def from_path(cls, path: str | Path, state: dict | None = None, config: dict | None = None) -> SqliteEnvironment:
        return cls(compiled_from_path(path), state=state, config=config)

    @classmethod
    def from_spec(cls, spec: dict | DomainSpec, state: dict | None = None,
                  config: dict | None = None) -> SqliteEnvironment:
        """Compile an in-memory spec (e.g. an Architect draft) without writing files."""
        if isinstance(spec, dict):
            spec = spec_from_dict(spec)
        return cls(compile_domain(spec), state=state, config=config)

    # -- protocol -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.domain.spec.name

    @property
    def tables(self) -> dict[str, Table]:
        return self.domain.tables

    @property
    def triggers(self) -> list[TriggerInfo]:
        return self.domain.triggers

    @property
    def rules(self) -> dict[str, dict]:
        """{rule: {rule, message, triggers, tables, hint}} for every POLICY_VIOLATION rule."""
        return self.domain.rules

    def _visible(self, td: ToolDef, side: str) -> bool:
        if td.hidden or any(fnmatch.fnmatchcase(td.name, p) for p in self._hidden_extra):
            return False
        return td.side == "both" or td.side == side

    def tools(self, side: str = "agent") -> list[dict]:
        return [copy.deepcopy(td.schema) for td in self.domain.tools.values() if self._visible(td, side)]

    def tool_names(self, side: str = "agent") -> list[str]:
        return [td.name for td in self.domain.tools.values() if self._visible(td, side)]

    def policy(self) -> str:
        return self.domain.spec.policy

    def _authorize(self, action: int, _a1: Any, a2: Any, *_: Any) -> int:
        # runs when a statement is prepared (cached statements are not re-authorized); a trigger
        # body (LLM-written) is authorized with the statement that fires it
        if self._loading:
            return sqlite3.SQLITE_OK
        if action in _DENY:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and a2 is not None and a2.lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _load(self, data: bytes) -> None:
        # deserialize runs an internal ATTACH that the authorizer would refuse; a flag lets it
        # through (toggling set_authorizer instead expires every prepared statement: ~20x slower)
        self._loading = True
        try:
            self._conn.deserialize(data)
            # load the schema now: a write that fails and rolls back as the first statement after
            # deserialize otherwise leaves the connection without a schema ("no such table")
            self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            self._loading = False
            self._gen = getattr(self, "_gen", 0) + 1  # invalidates the cached state hash
        self._at_init = data is self._init_bytes
        if self._at_init and self._init_canon is not None:
            self._raw, self._canon_val = dict(self._init_canon[0]), dict(self._init_canon[1])
            self._raw_id = dict(self._init_canon[2])
            self._dirty = set()
            self._tracked = self._conn.total_changes
            self._canon_key = (self._gen, self._conn.total_changes)
        else:
            self._dirty = None

    def reset(self, state: dict | None = None) -> None:
        with self._lock:
            if state is None:
                self._load(self._init_bytes)
            else:
                self._load(_load_state_bytes(self.domain, state))

    def initial_state_hash(self) -> str:
        """Hash of the state reset() restores (seed, or the ref's inline state)."""
        if self._initial_state is None and not self.config.get("exclude_keys"):
            return self.domain.initial_hash
        if self._init_hash is None:
            self._init_hash = self.hash_state(self._snapshot_of(self._init_bytes))
        return self._init_hash

    def state_keys(self) -> StateKeys:
        """Technical columns and references decided from the schema (`state_keys_for`)."""
        return self.keys

    def hash_state(self, state: dict) -> str:
        return state_hash(state, self.keys)

    def _dep_tables(self, name: str) -> tuple[str, ...]:
        """`name` and every table its references reach (transitively), in a fixed order."""
        out: list[str] = []
        todo = [name]
        while todo:
            t = todo.pop()
            if t in out:
                continue
            out.append(t)
            todo.extend(r.to_table for r in self.keys.refs.get(t, ()))
        return tuple(out)

    def canonical(self) -> dict[str, TableCanon]:
        """{table: TableCanon} of the current state: the canonical form of `snapshot()` under
        `state_keys()` (toolkit.envs.base, toolkit.scoring.state), without building the snapshot.

        Incremental: after a tool call only the tables it may write (`_write_sets`: its table, the
        tables its triggers write, foreign-key dependents) are re-read, as tuples (in C); a table's
        canonical keys are looked up by content (its rows and those of the tables it references)
        in a per-domain cache, so only contents never seen before are canonicalized in Python; the
        reset() state's canonical form is kept. Any write not made through `call()` (or a tool
        with an unknown write set) makes the next call re-read every table. Memoized until the
        state changes (load generation + total_changes)."""
        with self._lock:
            conn = self._conn
            key = (self._gen, conn.total_changes)
            if key == self._canon_key:
                return self._canon_val
            tables = self.domain.tables
            dirty = self._dirty
            if dirty is None or conn.total_changes != self._tracked:
                dirty = set(tables)
            raw = self._raw
            rid = self._raw_id
            dom = self.domain
            intern = dom.content_ids
            for n in dirty:
                rows = tuple(conn.execute(self._snap_sql[n]).fetchall())
                raw[n] = rows
                # a small integer per distinct table content (hashing the rows once per read)
                with dom.lock:
                    cid = intern.get((n, rows))
                    if cid is None:
                        cid = intern[(n, rows)] = len(intern) + 1 + dom.content_ids_base
                        if len(intern) > _CANON_CACHE_SIZE:
                            dom.content_ids_base += len(intern)
                            intern.clear()
                            intern[(n, rows)] = cid
                rid[n] = cid
            cache = dom.canon_cache
            out = dict(self._canon_val)
            for n in tables:
                deps = self._deps[n]
                if n in out and not any(d in dirty for d in deps):
                    continue
                ck = (self._keys_sig, n, tuple(rid[d] for d in deps))
                with dom.lock:
                    tc = cache.get(ck)
                if tc is None:
                    part = {d: self._rows(tables[d], list(raw[d])) for d in deps}
                    tc = CanonicalState(part, self.keys).table(n)
                    with dom.lock:
                        cache[ck] = tc
                        while len(cache) > _CANON_CACHE_SIZE:
                            cache.popitem(last=False)
                out[n] = tc
            self._dirty = set()
            self._tracked = conn.total_changes
            self._canon_key, self._canon_val = key, out
            if self._at_init and self._init_canon is None:
                self._init_canon = (dict(raw), dict(out), dict(rid))
            return out

    def _snapshot_of(self, data: bytes) -> dict:
        tmp = SqliteEnvironment(self.domain)
        try:
            tmp._load(data)
            return tmp.snapshot()
        finally:
            tmp.close()

    def snapshot(self) -> dict:
        out: dict[str, list[dict]] = {}
        with self._lock:
            for t in self.domain.tables.values():
                out[t.name] = self._rows(t, self._conn.execute(self._snap_sql[t.name]).fetchall())
        return out

    def state_hash(self) -> str:
        """Cached until the state changes: every write (triggers included, rolled back or not)
        bumps SQLite's total_changes, and every (re)load bumps the generation."""
        with self._lock:
            key = (getattr(self, "_gen", 0), self._conn.total_changes)
            if key != getattr(self, "_hash_key", None):
                self._hash_val = hash_tables({t: tc.digest for t, tc in sorted(self.canonical().items()) if tc.keys})
                self._hash_key = key
            return self._hash_val

    def diff(self, a: dict, b: dict | None = None) -> dict:
        """DIFF(a, b) with this domain's technical keys; b defaults to the current state."""
        return _state_diff(a, self.snapshot() if b is None else b, keys=self.keys)

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001, S110 - closing twice or from another thread
            pass

    # -- tool calls -----------------------------------------------------------------------------

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        conn = self._conn
        before = conn.total_changes
        try:
            return self._call_safe(name, args, side)
        finally:
            after = conn.total_changes
            if after != before:  # something was written (maybe rolled back): re-read what it may touch
                self._at_init = False
                if self._tracked == before and self._dirty is not None:
                    ws = self.domain.write_sets.get(name) if isinstance(name, str) else None
                    if ws is None:
                        self._dirty = None
                    else:
                        self._dirty |= ws
                        self._tracked = after
                else:
                    self._dirty = None

    def _call_safe(self, name: str, args: dict, side: str) -> ToolResult:
        try:
            return self._call(name, args, side)
        except _ArgError as e:
            return ToolResult.fail("INVALID_ARGUMENTS", e.message, None, e.hint)
        except (UnicodeError, OverflowError) as e:  # e.g. a lone surrogate in a string
            return ToolResult.fail("INVALID_ARGUMENTS", f"{_short(name)}: {_short(str(e), 200)}", None,
                                   "strings must be valid UTF-8 text")
        except Exception as e:  # noqa: BLE001 - never a traceback to the agent
            return ToolResult.fail("INTERNAL", f"{type(e).__name__}: {_short(str(e), 300)}", None,
                                   "unexpected failure; the state was not changed")

    def _call(self, name: Any, args: Any, side: str) -> ToolResult:
        td = self.domain.tools.get(name) if isinstance(name, str) else None
        if td is None or not self._visible(td, side):
            avail = self.tool_names(side)
            close = difflib.get_close_matches(name, avail, n=3) if isinstance(name, str) and len(name) < 200 else []
            hint = (f"did you mean: {', '.join(close)}?" if close else "available tools: " + ", ".join(avail))
            return ToolResult.fail("UNKNOWN_TOOL", f"no tool named {_short(name)} for side {side!r}", None, hint)
        if args is None:
            args = {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                raise _ArgError("arguments are not valid JSON", "pass a JSON object of named arguments")
        if not isinstance(args, dict):
            raise _ArgError(f"arguments must be an object, got {type(args).__name__}",
                            "pass a JSON object of named arguments")
        table = self.domain.tables[td.table]
        with self._lock:
            if td.kind == "query":
                return self._query(table, args)
            if td.kind == "insert":
                return self._insert(table, args)
            return self._update(table, args)

    # -- argument validation --------------------------------------------------------------------

    def _check_keys(self, table: Table, args: dict, allowed: list[str], tool: str) -> None:
        for k in args:
            if not isinstance(k, str) or k not in allowed:
                col = table.colmap.get(k) if isinstance(k, str) else None
                if col is not None and col.readonly:
                    raise _ArgError(f"{tool}: column {k!r} is maintained automatically and cannot be set",
                                    f"valid arguments: {', '.join(allowed)}")
                if col is not None and col.pk:
                    raise _ArgError(f"{tool}: {k!r} is a primary key and cannot be set here",
                                    f"valid arguments: {', '.join(allowed)}")
                raise _ArgError(f"{tool}: unknown argument {_short(k)}", f"valid arguments: {', '.join(allowed)}")

    @staticmethod
    def _value(c: Column, v: Any, tool: str, nullable: bool, enforce_enum: bool = True) -> Any:
        where = f"{tool}: {c.name}"
        if v is None:
            if nullable:
                return None
            raise _ArgError(f"{where} cannot be null", "pass a value" + (f" of type {c.json_type}" if c.json_type else ""))
        t = c.json_type
        if isinstance(v, bool):
            if t == "boolean" or t is None:
                v = int(v)
            else:
                raise _ArgError(f"{where} expects {t}, got boolean", f"pass a {t}")
        elif isinstance(v, int):
            if not (_INT_MIN <= v <= _INT_MAX):
                raise _ArgError(f"{where} is out of the 64-bit integer range", "pass a smaller number")
            if t == "string":
                raise _ArgError(f"{where} expects string, got number", "pass the value as a JSON string")
            if t == "boolean" and v not in (0, 1):
                raise _ArgError(f"{where} expects boolean, got {v}", "pass true or false")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise _ArgError(f"{where} must be a finite number", None)
            if t == "integer":
                if not v.is_integer() or not (_INT_MIN <= v <= _INT_MAX):
                    raise _ArgError(f"{where} expects integer, got {_short(v)}", "pass a whole number")
                v = int(v)
            elif t in ("string", "boolean"):
                raise _ArgError(f"{where} expects {t}, got number", f"pass a {t}")
        elif isinstance(v, str):
            if len(v) > MAX_STRING:
                raise _ArgError(f"{where} is too long ({len(v)} characters, max {MAX_STRING})", "shorten the value")
            if t in ("integer", "number", "boolean"):
                raise _ArgError(f"{where} expects {t}, got string {_short(v, 40)!r}",
                                f"pass a JSON {t}, not a string")
        else:
            raise _ArgError(f"{where} expects a scalar ({t or 'string/number'}), got {type(v).__name__}",
                            "nested objects and lists are not accepted here")
        if enforce_enum and c.enum and v not in c.enum:
            raise _ArgError(f"{where} must be one of {', '.join(map(str, c.enum))}; got {_short(v, 60)!r}",
                            f"allowed values for {c.name}: {', '.join(map(str, c.enum))}")
        return v

    # -- query ----------------------------------------------------------------------------------

    def _query(self, t: Table, args: dict) -> ToolResult:
        tool = f"query_{t.name}"
        allowed = [c.name for c in t.columns] + list(QUERY_CONTROL_PARAMS)
        self._check_keys(t, args, allowed, tool)
        where: list[str] = []
        params: list[Any] = []
        for key, val in args.items():
            if key in QUERY_CONTROL_PARAMS:
                continue
            c = t.colmap[key]
            col = qident(c.name)
            if isinstance(val, dict):
                extra = [k for k in val if k not in ("op", "value")]
                if extra or "op" not in val or "value" not in val:
                    raise _ArgError(f"{tool}: filter on {c.name} must be a value or {{\"op\", \"value\"}}",
                                    f"ops: {', '.join(QUERY_OPS)}")
                op, value = val["op"], val["value"]
                if not isinstance(op, str) or op.lower() not in QUERY_OPS:
                    raise _ArgError(f"{tool}: unknown operator {_short(op, 40)!r} for {c.name}",
                                    f"ops: {', '.join(QUERY_OPS)}")
                op = op.lower()
            else:
                op, value = "=", val
            if op == "in":
                if not isinstance(value, list) or not value or len(value) > MAX_IN_ITEMS:
                    raise _ArgError(f"{tool}: op 'in' on {c.name} needs a list of 1..{MAX_IN_ITEMS} values", None)
                vals = [self._value(c, x, tool, nullable=False, enforce_enum=False) for x in value]
                where.append(f"{col} IN ({', '.join('?' * len(vals))})")
                params.extend(vals)
            elif op == "like":
                if not isinstance(value, str) or len(value) > MAX_STRING:
                    raise _ArgError(f"{tool}: op 'like' on {c.name} needs a string pattern", "e.g. \"%smith%\"")
                where.append(f"{col} LIKE ?")
                params.append(value)
            elif value is None:
                if op not in ("=", "!="):
                    raise _ArgError(f"{tool}: null can only be compared with = or !=", None)
                where.append(f"{col} IS {'NOT ' if op == '!=' else ''}NULL")
            else:
                v = self._value(c, value, tool, nullable=False, enforce_enum=False)
                where.append(f"{col} {'IS NOT' if op == '!=' else op} ?")
                params.append(v)
        order_sql = ", ".join(qident(k) for k in t.pk) if t.pk else "rowid"
        if "order_by" in args:
            ob = args["order_by"]
            if not isinstance(ob, str) or ob not in t.colmap:
                raise _ArgError(f"{tool}: order_by must be a column of {t.name}",
                                f"columns: {', '.join(t.colmap)}")
            direction = args.get("order", "asc")
            if not isinstance(direction, str) or direction.lower() not in ("asc", "desc"):
                raise _ArgError(f"{tool}: order must be 'asc' or 'desc'", None)
            order_sql = f"{qident(t.colmap[ob].name)} {direction.upper()}, {order_sql}"
        elif "order" in args:
            direction = args["order"]
            if not isinstance(direction, str) or direction.lower() not in ("asc", "desc"):
                raise _ArgError(f"{tool}: order must be 'asc' or 'desc'", None)
            if direction.lower() == "desc":
                order_sql = ", ".join(f"{x} DESC" for x in order_sql.split(", "))
        limit = args.get("limit", DEFAULT_QUERY_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not (1 <= limit <= MAX_QUERY_LIMIT):
            raise _ArgError(f"{tool}: limit must be an integer between 1 and {MAX_QUERY_LIMIT}", None)
        offset = args.get("offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or not (0 <= offset <= MAX_OFFSET):
            raise _ArgError(f"{tool}: offset must be an integer between 0 and {MAX_OFFSET}", None)
        sql = (f"SELECT * FROM {qident(t.name)}" + (f" WHERE {' AND '.join(where)}" if where else "")
               + f" ORDER BY {order_sql} LIMIT ? OFFSET ?")
        try:
            rows = self._conn.execute(sql, (*params, limit + 1, offset)).fetchall()
        except sqlite3.Error as e:
            return self._error(e, t, "query")
        truncated = len(rows) > limit
        out = self._rows(t, rows[:limit])
        return ToolResult.success({"rows": out, "count": len(out), "truncated": truncated})

    # -- writes ---------------------------------------------------------------------------------

    @staticmethod
    def _rows(t: Table, rows: list) -> list[dict]:
        names = t.names
        if t.untyped:  # only untyped/BLOB columns can hold bytes
            return [dict(zip(names, map(_jsonable, r))) for r in rows]
        return [dict(zip(names, r)) for r in rows]

    def _fetch_row(self, t: Table, where: str, params: list) -> dict | None:
        r = self._conn.execute(f"SELECT * FROM {qident(t.name)} WHERE {where}", params).fetchone()
        return None if r is None else self._rows(t, [r])[0]

    def _write(self, t: Table, kind: str, fn) -> ToolResult:
        conn = self._conn
        conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            result = fn()
        except Exception as e:
            self._rollback()
            if isinstance(e, sqlite3.Error):
                return self._error(e, t, kind)
            if isinstance(e, (OverflowError, UnicodeError, ValueError)):
                return ToolResult.fail("INVALID_ARGUMENTS", f"{kind}_{t.name}: {_short(str(e), 200)}", None,
                                       "check the argument values")
            raise
        if isinstance(result, ToolResult) and not result.ok:
            self._rollback()
            return result
        conn.execute(f"RELEASE {_SAVEPOINT}")
        return result

    def _rollback(self) -> None:
        conn = self._conn
        if conn.in_transaction:  # RAISE(ROLLBACK) has already ended it
            try:
                conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
                conn.execute(f"RELEASE {_SAVEPOINT}")
            except sqlite3.Error:
                conn.execute("ROLLBACK")

    def _insert(self, t: Table, args: dict) -> ToolResult:
        tool = f"insert_{t.name}"
        allowed = [c.name for c in t.columns if not c.readonly]
        self._check_keys(t, args, allowed, tool)
        names: list[str] = []
        vals: list[Any] = []
        for key, v in args.items():
            c = t.colmap[key]
            names.append(c.name)
            vals.append(self._value(c, v, tool, nullable=c.nullable))
        missing = [c.name for c in t.columns if _insert_required(c) and c.name not in args]
        if missing:
            raise _ArgError(f"{tool}: missing required argument(s): {', '.join(missing)}",
                            f"required: {', '.join(missing)}")
        if names:
            sql = (f"INSERT INTO {qident(t.name)} ({', '.join(qident(n) for n in names)}) "
                   f"VALUES ({', '.join('?' * len(names))})")
        else:
            sql = f"INSERT INTO {qident(t.name)} DEFAULT VALUES"

        def run() -> ToolResult:
            cur = self._conn.execute(sql, vals)
            if cur.rowcount == 0:
                return ToolResult.success({"inserted": None, "note": "the write was ignored by a trigger"})
            if t.without_rowid:
                if not all(k in args for k in t.pk):
                    return ToolResult.success({"inserted": None})
                row = self._fetch_row(t, " AND ".join(f"{qident(k)} = ?" for k in t.pk),
                                      [vals[names.index(k)] for k in t.pk])
            else:
                row = self._fetch_row(t, "rowid = ?", [cur.lastrowid])
            return ToolResult.success(row)

        return self._write(t, "insert", run)

    def _update(self, t: Table, args: dict) -> ToolResult:
        tool = f"update_{t.name}"
        allowed = [c.name for c in t.columns if not c.readonly]
        self._check_keys(t, args, allowed, tool)
        missing = [k for k in t.pk if k not in args]
        if missing:
            raise _ArgError(f"{tool}: missing primary key argument(s): {', '.join(missing)}",
                            f"identify the row with {', '.join(t.pk)}; use query_{t.name} to find it")
        key_vals = [self._value(t.colmap[k], args[k], tool, nullable=False, enforce_enum=False) for k in t.pk]
        sets: list[str] = []
        vals: list[Any] = []
        for key, v in args.items():
            c = t.colmap[key]
            if c.pk:
                continue
            sets.append(f"{qident(c.name)} = ?")
            vals.append(self._value(c, v, tool, nullable=c.nullable))
        if not sets:
            settable = [c.name for c in t.columns if not c.pk and not c.readonly]
            raise _ArgError(f"{tool}: nothing to change", f"pass at least one of: {', '.join(settable)}")
        where = " AND ".join(f"{qident(k)} = ?" for k in t.pk)

        def run() -> ToolResult:
            exists = self._conn.execute(f"SELECT 1 FROM {qident(t.name)} WHERE {where}", key_vals).fetchone()
            if exists is None:
                keys = ", ".join(f"{k}={_short(v, 60) if isinstance(v, str) else v!r}" for k, v in zip(t.pk, key_vals))
                return ToolResult.fail("NOT_FOUND", f"{tool}: no {t.name} row with {keys}", None,
                                       f"use query_{t.name} to find existing rows")
            self._conn.execute(f"UPDATE {qident(t.name)} SET {', '.join(sets)} WHERE {where}", (*vals, *key_vals))
            return ToolResult.success(self._fetch_row(t, where, key_vals))

        return self._write(t, "update", run)

    # -- error translation ----------------------------------------------------------------------

    def _error(self, e: sqlite3.Error, t: Table, kind: str) -> ToolResult:
        msg = str(e)
        tool = f"{kind}_{t.name}"
        pv = _PV_RE.match(msg)
        if pv:
            rule, text = pv.group(1).strip(), pv.group(2).strip()
            info = self.domain.rules.get(rule) or {}
            hint = info.get("hint") or f"see the preconditions in the description of {tool}"
            return ToolResult.fail("POLICY_VIOLATION", text, rule, hint)
        for trg in self.domain.triggers:  # a RAISE message not in the POLICY_VIOLATION format
            if msg in trg.raw_messages:
                return ToolResult.fail("POLICY_VIOLATION", msg, trg.name,
                                       f"see the preconditions in the description of {tool}")
        if isinstance(e, sqlite3.IntegrityError):
            m = re.match(r"(NOT NULL|UNIQUE|CHECK) constraint failed: (.*)$", msg)
            if m:
                kind_c, what = m.group(1), m.group(2).strip()
                if kind_c == "NOT NULL":
                    hint = f"{what} must have a value"
                elif kind_c == "UNIQUE":
                    hint = f"a row with the same {what} already exists; use query_{t.name} to find it"
                else:
                    checks = [c for c in _check_clauses(t.sql) if c == what] or _check_clauses(t.sql)
                    hint = ("the values must satisfy: " + "; ".join(checks)) if checks else \
                        "the value is outside the allowed range"
                return ToolResult.fail("CONSTRAINT", msg, f"{kind_c} {what}", _short(hint, 600))
            if "FOREIGN KEY" in msg:
                refs = [f"{t.name}.{fk['column']} -> {fk['table']}.{fk['to'] or 'rowid'}" for fk in t.fks]
                hint = "a referenced row does not exist" + (f" ({'; '.join(refs)})" if refs else "") + \
                       "; query the referenced table first"
                return ToolResult.fail("CONSTRAINT", msg, "FOREIGN KEY", hint)
            return ToolResult.fail("CONSTRAINT", msg, None, f"see the description of {tool}")
        if isinstance(e, sqlite3.DataError) or "too big" in msg or "too many" in msg:
            return ToolResult.fail("INVALID_ARGUMENTS", msg, None, "check the argument values")
        return ToolResult.fail("EXECUTION_ERROR", msg, None, "the call was rolled back; the state is unchanged")

    def evaluate_sql(self, select_sql: str, params: Any = ()) -> tuple | None:
        """Run one read-only SELECT (e.g. a trigger condition bound to NEW/OLD values, see
        toolkit.flows.logigen.analysis.evaluate) on the current state; returns the first row."""
        if not re.match(r"\s*SELECT\b", select_sql, re.IGNORECASE):
            raise ValueError("evaluate_sql runs a single SELECT")
        with self._lock:
            return self._conn.execute(select_sql, params).fetchone()

    def schema_sql(self) -> str:
        """The current schema (tables, indexes, triggers) as stored in sqlite_master."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        return "\n".join(f"{r[0]} {r[1]} {r[2]}: {r[3]}" for r in rows)


def _check_clauses(sql: str) -> list[str]:
    code, _ = _split_comments(sql)
    out = []
    for m in re.finditer(r"CHECK\s*\(", code, re.IGNORECASE):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        out.append(re.sub(r"\s+", " ", code[m.end():i - 1]).strip())
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        import base64

        return "base64:" + base64.b64encode(v).decode("ascii")
    return v


def _factory(ref: dict) -> SqliteEnvironment:
    return SqliteEnvironment.from_ref(ref)


register_backend("sqlite", _factory, doc="LOGIGEN hard-compiled policy environment (SQLite tables + triggers)")
