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
              "config": {"exclude_keys": [...], "hide": [...], "limits": {"wall_seconds": 2}}
              (limits may only narrow the operator's: wall_seconds per tool call's SQL,
              db_size_mb for the database; toolkit.sandbox.limits)

Domain layout (docs/adding-a-domain.md): policy.md, schema.sql (tables + triggers), seed.sql or
seed.json/seed.yaml, optional tools.yaml (overrides), domain.yaml (name, description,
exclude_keys), tasks.jsonl (record lines; not read by the environment).

Safety: identifiers in generated SQL come only from the compiled schema, never from arguments;
every value is a bound parameter; arguments are validated against the generated JSON schema
(names, types, enums, string length <= MAX_STRING, query limit <= MAX_QUERY_LIMIT) before any SQL
runs; an authorizer refuses DDL, ATTACH, PRAGMA and load_extension on the environment's
connection. The domain's own SQL (schema.sql, seed.sql, triggers: possibly LLM-written) compiles
under an allow-list authorizer (`_DomainGuard`, docs/sandbox.md). Every statement runs under a time
budget (`SqlBudget`, a progress handler: 30 s per domain text at compile time, the operator's
`wall_seconds` per tool call at run time, triggers included: a runaway trigger is a TIMEOUT error
and the call is rolled back) and a database size cap (`db_size_mb`, PRAGMA max_page_count: a seed
or a write beyond it is an error). Tool-level failures never raise: they come back as structured
errors.

Modules (each one idea; this package re-exports what callers import and registers the backend):

- `domain.py`   the domain as data: DomainSpec read from files/mappings, the compiled dataclasses
- `sqltext.py`  reading SQL text: comments, identifiers, enums, docs, trigger parsing
- `guard.py`    the SQL sandbox: compile-time allow-list authorizer, run-time deny list, time budget, size cap
- `tools.py`    the generated query_/insert_/update_ tools, their limits and descriptions
- `compiler.py` DDL -> tables, triggers, rules, seed, state keys, write sets (`build_domain`)
- `runtime.py`  SqliteEnvironment, `compile_domain` (build + seeded-state hash), the domain cache
- `errors.py`   SQLite errors of a call -> structured tool errors (POLICY_VIOLATION, CONSTRAINT, TIMEOUT ...)
"""

from __future__ import annotations

from toolkit.envs.base import BackendCapabilities, register_backend
from toolkit.envs.sqlite.compiler import build_domain, state_keys_for
from toolkit.envs.sqlite.domain import (
    Column,
    CompiledDomain,
    DomainError,
    DomainSpec,
    Table,
    ToolDef,
    TriggerInfo,
    load_domain_spec,
    spec_from_dict,
)
from toolkit.envs.sqlite.runtime import SqliteEnvironment, compile_domain, compiled_from_path
from toolkit.envs.sqlite.sqltext import _split_comments, parse_trigger, qident
from toolkit.envs.sqlite.tools import (
    DEFAULT_QUERY_LIMIT,
    MAX_IN_ITEMS,
    MAX_OFFSET,
    MAX_QUERY_LIMIT,
    MAX_STRING,
    QUERY_CONTROL_PARAMS,
    QUERY_OPS,
)

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
# also importable from here, as before the split (not in __all__, as before): the other public
# names of the former module, and `_split_comments` (used by toolkit.flows.logigen)
_REEXPORTED = (Column, Table, ToolDef, TriggerInfo, build_domain, compiled_from_path, parse_trigger,
               qident, spec_from_dict, state_keys_for, DEFAULT_QUERY_LIMIT, MAX_IN_ITEMS, MAX_OFFSET,
               QUERY_CONTROL_PARAMS, _split_comments)


def _factory(ref: dict) -> SqliteEnvironment:
    return SqliteEnvironment.from_ref(ref)


register_backend("sqlite", _factory, doc="LOGIGEN hard-compiled policy environment (SQLite tables + triggers)",
                 capabilities=BackendCapabilities(deterministic=True, policy_errors=True, relational=True))
