"""Real environments' tools as servers: `tau2:<domain>` and `sqlite:<domain>` (output fields from τ²
return annotations and sqlite table columns)."""

from __future__ import annotations

import copy
from typing import Any

from toolkit.flows.astra.tooldocs.schema import (
    MIN_DESCRIPTION_WORDS,
    MIN_TOOLS,
    ImportResult,
    Note,
    ToolDocError,
)
from toolkit.domains import domain_path
from toolkit.envs import load_env, tau2 as T
from toolkit.flows.astra.tooldocs.servers import Pending, finish, openai_items


def import_env(spec: str, *, min_tools: int = MIN_TOOLS, min_description_words: int = MIN_DESCRIPTION_WORDS,
               result: ImportResult | None = None) -> ImportResult:
    """`tau2:<domain>` or `sqlite:<domain>`: the real environment's agent tools as one server."""
    res = result or ImportResult()
    kind, _, dom = spec.partition(":")
    if kind not in ("tau2", "sqlite") or not dom:
        raise ToolDocError(f"{spec!r}: expected tau2:<domain> or sqlite:<domain>")
    ref = {"backend": kind, "id": dom}
    env = load_env(ref)
    try:
        tools = env.tools("agent")
        policy = env.policy() if hasattr(env, "policy") else ""
    finally:
        close = getattr(env, "close", None)
        if close:
            close()

    problems: list[str] = []
    hint = tau2_output_fields(dom, problems) if kind == "tau2" else sqlite_output_fields(dom, problems)
    name = f"{kind}-{dom}"
    for p in problems:
        res.notes.append(Note(name, None, "outputs_unknown", p))
    pend = Pending(name, kind, (policy or "")[:2000])
    pend.items += openai_items(copy.deepcopy(tools))
    finish(pend, res, min_tools, min_description_words, env=ref, domain=dom, outputs_hint=hint)
    return res


def tau2_output_fields(domain: str, problems: list[str] | None = None) -> dict[str, list[str]]:
    """Output fields of τ² tools from their return annotations (pydantic models) where given. When
    the τ² toolkit cannot be read, {} and the reason appended to `problems` (the caller reports it:
    every output reference to these tools is then only 'unverified')."""
    try:
        env = T.new_tau2_environment(domain)
        tk = getattr(env, "tools", None)
        funcs = tk.get_tools() if tk is not None and hasattr(tk, "get_tools") else {}
    except Exception as e:  # noqa: BLE001 - reported through `problems`, never silent
        if problems is not None:
            problems.append(f"tau2 return annotations unreadable ({type(e).__name__}: {e}); output "
                            "references to these tools are accepted only as 'unverified'")
        return {}
    import inspect
    import typing

    out: dict[str, list[str]] = {}
    for name, tool in (funcs or {}).items():
        fn = getattr(tool, "_func", None) or getattr(tool, "func", None) or getattr(tool, "__wrapped__", None)
        if fn is None:
            continue
        try:
            ret = typing.get_type_hints(fn).get("return")
        except Exception:  # noqa: BLE001 - unresolvable hints: the raw annotation is the next best
            ret = inspect.signature(fn).return_annotation
        out[name] = _model_fields(ret)
    return out


def _model_fields(t: Any, depth: int = 0) -> list[str]:
    import typing

    if t is None or depth > 3:
        return []
    fields = getattr(t, "model_fields", None)
    if isinstance(fields, dict):
        out = list(fields)
        for f in fields.values():
            out += _model_fields(getattr(f, "annotation", None), depth + 1)
        return list(dict.fromkeys(out))
    out = []
    for a in typing.get_args(t):
        out += _model_fields(a, depth + 1)
    return list(dict.fromkeys(out))


def sqlite_output_fields(domain: str, problems: list[str] | None = None) -> dict[str, list[str]]:
    """A bundled sqlite domain's query/insert/update tools return rows of their table: the
    table's columns are the tool's output fields."""
    try:
        schema = (domain_path(domain) / "schema.sql").read_text(encoding="utf-8")
    except (KeyError, OSError) as e:
        if problems is not None:
            problems.append(f"sqlite schema of {domain!r} unreadable ({type(e).__name__}: {e})")
        return {}
    import sqlite3

    con = sqlite3.connect(":memory:")
    try:
        con.executescript(schema)
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        cols = {t: [r[1] for r in con.execute(f"PRAGMA table_info('{t}')")] for t in tables}
    except sqlite3.Error as e:
        if problems is not None:
            problems.append(f"sqlite schema of {domain!r} does not load ({e})")
        return {}
    finally:
        con.close()
    out: dict[str, list[str]] = {}
    for table, names in cols.items():
        for verb in ("query", "insert", "update", "delete", "get"):
            out[f"{verb}_{table}"] = names
    return out
