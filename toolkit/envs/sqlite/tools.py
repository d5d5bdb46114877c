"""The generated tools of a compiled domain: per table `query_<t>`, `insert_<t>`, `update_<t>`
(OpenAI function schemas with argument limits), their descriptions (preconditions from BEFORE
triggers, side effects from AFTER triggers), the tools.yaml overrides (hide, side, text), and the
validation of a call's arguments against them (`check_keys`, `check_value`)."""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from toolkit.envs.sqlite.domain import Column, DomainError, DomainSpec, Table, ToolDef, TriggerInfo
from toolkit.envs.sqlite.sqltext import _PV_RE, _short, qident

MAX_STRING = 10_000  # longest string argument accepted (characters)
MAX_QUERY_LIMIT = 200  # largest `limit` of a query_* call
DEFAULT_QUERY_LIMIT = 50
MAX_OFFSET = 1_000_000
MAX_IN_ITEMS = 100
QUERY_CONTROL_PARAMS = ("order_by", "order", "limit", "offset")
QUERY_OPS = ("=", "!=", "<", "<=", ">", ">=", "like", "in")

_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 63 - 1


class _ArgError(Exception):
    """A tool call's arguments are refused (INVALID_ARGUMENTS, with a hint)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint


def check_keys(table: Table, args: dict, allowed: list[str], tool: str) -> None:
    """_ArgError unless every argument name is one of `allowed` (saying why a column is not)."""
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


def check_value(c: Column, v: Any, tool: str, nullable: bool, enforce_enum: bool = True) -> Any:
    """`v` as SQLite stores it for column `c` (JSON type, 64-bit range, MAX_STRING, enum), else _ArgError."""
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


def query_sql(t: Table, args: dict) -> tuple[str, list, int, int]:
    """The SELECT of a `query_<table>` call with these arguments: (sql, parameters, limit,
    offset); the statement takes `limit + 1` and `offset` as its last two parameters (one row more
    than the limit says whether the result was truncated). Raises _ArgError on a bad argument."""
    tool = f"query_{t.name}"
    allowed = [c.name for c in t.columns] + list(QUERY_CONTROL_PARAMS)
    check_keys(t, args, allowed, tool)
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
            vals = [check_value(c, x, tool, nullable=False, enforce_enum=False) for x in value]
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
            v = check_value(c, value, tool, nullable=False, enforce_enum=False)
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
    return sql, params, limit, offset


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
