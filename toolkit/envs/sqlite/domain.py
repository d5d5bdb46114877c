"""A domain as data: its files (domain.yaml, policy, schema/seed SQL or rows, tools.yaml
overrides, references) read into a `DomainSpec`, and the dataclasses of its compiled form
(`CompiledDomain`: tables, triggers, rules, tools, serialized databases, caches)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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

    def tool_texts(self) -> list[str]:
        """Every string of the tools overrides (descriptions, notes): words the domain's author wrote."""
        out: list[str] = []
        todo: list = [self.tools or {}]
        while todo:
            o = todo.pop()
            if isinstance(o, str):
                out.append(o)
            elif isinstance(o, dict):
                todo.extend(reversed(list(o.values())))
            elif isinstance(o, list):
                todo.extend(reversed(o))
        return out


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
    row_memos: dict = field(default_factory=dict)  # keys signature -> {(table, row, refs): row key}
    words: dict = field(default_factory=dict)  # part of a table/column name -> an English word (english.py)
    expansions: dict = field(default_factory=dict)  # abbreviated name part -> the word of the domain's texts
    lock: Any = field(default_factory=threading.Lock)

    # what a process learns while it runs the domain (caches, memos, the lock) is not kept
    # when it is pickled (runtime.compiled_from_path's on-disk cache): a new process starts empty
    _RUNTIME = ("state_cache", "canon_cache", "content_ids", "content_ids_base", "row_memos", "lock")

    def __getstate__(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in self._RUNTIME}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self.state_cache, self.canon_cache, self.content_ids = OrderedDict(), OrderedDict(), {}
        self.content_ids_base, self.row_memos, self.lock = 0, {}, threading.Lock()


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


# the files a domain directory's spec is read from (the first present of each group)
META_FILES = ("domain.yaml", "domain.yml", "domain.json")
POLICY_FILES = ("policy.md", "policy.txt")
SEED_FILES = ("seed.sql", "seed.json", "seed.yaml", "seed.yml")
TOOLS_FILES = ("tools.yaml", "tools.yml", "tools.json")
SPEC_FILES = META_FILES + ("schema.sql",) + POLICY_FILES + SEED_FILES + TOOLS_FILES


def load_domain_spec(path: str | Path) -> DomainSpec:
    """Read a domain directory (its SPEC_FILES) or a single JSON/YAML file into a DomainSpec."""
    p = Path(path)
    if p.is_dir():
        meta: dict = {}
        mp = _first(p, META_FILES)
        if mp:
            meta = _read_structured(mp) or {}
            if not isinstance(meta, dict):
                raise DomainError(f"{mp}: expected a mapping")
        sp = _first(p, ("schema.sql",))
        if sp is None:
            raise DomainError(f"{p}: no schema.sql")
        pp = _first(p, POLICY_FILES)
        seed: Any = None
        seed_p = _first(p, SEED_FILES)
        if seed_p is not None:
            seed = seed_p.read_text(encoding="utf-8") if seed_p.suffix == ".sql" else _read_structured(seed_p)
        tp = _first(p, TOOLS_FILES)
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
