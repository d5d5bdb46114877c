"""A tool's JSON schema as a Python method: a keyword-only signature and a Google-style docstring.

Peers read tools from Python functions: TRL (through transformers' `get_json_schema`: type hints
for the parameter types, the docstring's `Args:` for their descriptions) and MCP servers (the
`mcp` SDK builds the argument model from the signature). `tool_methods(tools, mode)` generates one
method per OpenAI function schema; each forwards its arguments to `self._tool_call(name, args)`
with the tool's original name and argument names (an argument left out is left out, never sent as
null: `update_*` tools tell "unchanged" from "set to null").

Modes:
- "typed"  (TRL) parameter types mapped from the schema: string/integer/number/boolean/null,
           arrays with their item type, objects as dict, enums as Literal, unions; what a Python
           type cannot say (nested object fields, limits) goes into the argument's description
           as its JSON schema.
- "schema" (MCP) every parameter is `Annotated[Any, WithJsonSchema(<its exact JSON schema>)]`:
           the server advertises the toolkit's schema unchanged and leaves validation to the
           environment, which answers a bad argument with its own structured error.

Names: a tool or argument name that is not a Python identifier (or is a keyword) gets a safe
name (`from` → `from_`, `first-name` → `first_name`); the method maps it back before the call.
"""

from __future__ import annotations

import json
import keyword
import re
from typing import Any, Callable

UNSET = type("Unset", (), {"__repr__": lambda self: "<unset>", "__bool__": lambda self: False})()

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_SECTION_RE = re.compile(r"\b(Args|Arguments|Returns|Raises|Yields)\s*:")


def py_name(name: str, taken: set[str] | None = None) -> str:
    """A Python identifier for `name` (unique within `taken`, which it is added to)."""
    out = re.sub(r"\W", "_", name)
    if not out or out[0].isdigit():
        out = "_" + out
    if keyword.iskeyword(out) or out == "self":
        out += "_"
    if out.startswith("_"):  # leading underscores are private in pydantic models and in TRL's tool scan
        out = "a" + out
    if taken is not None:
        base, n = out, 2
        while out in taken:
            out = f"{base}_{n}"
            n += 1
        taken.add(out)
    return out


def _union(parts: list[str]) -> str:
    parts = list(dict.fromkeys(parts))
    if "Any" in parts:
        return "Any"
    return " | ".join(parts)


def py_annotation(schema: Any) -> str:
    """The Python type (as source text) closest to a JSON schema."""
    if not isinstance(schema, dict):
        return "Any"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        vals = schema["enum"]
        if all(v is None or type(v) in (str, int, float, bool) for v in vals):
            lits = [v for v in vals if v is not None]
            parts = [f"Literal[{', '.join(repr(v) for v in lits)}]"] if lits else []
            if None in vals or (isinstance(schema.get("type"), list) and "null" in schema["type"]):
                parts.append("None")
            return _union(parts) if parts else "None"
        return "Any"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _union([py_annotation(s) for s in schema[key]])
    t = schema.get("type")
    if isinstance(t, list):
        return _union([py_annotation({**schema, "type": x}) for x in t]) if t else "Any"
    if t in _SCALARS:
        return _SCALARS[t]
    if t == "array":
        items = schema.get("items")
        return f"list[{py_annotation(items)}]" if isinstance(items, dict) and items else "list"
    if t == "object":
        return "dict"
    return "Any"


def _needs_schema(schema: Any) -> bool:
    """Does the schema say more than its Python type does (nested fields, formats, limits)?"""
    if not isinstance(schema, dict):
        return False
    simple = {"type", "description", "enum", "title", "default", "maxLength", "nullable"}
    if set(schema) - simple - {"items"}:
        return True
    if "items" in schema:
        items = schema["items"]
        return not (isinstance(items, dict) and set(items) <= simple and items.get("type") in _SCALARS)
    return schema.get("type") == "object" or (isinstance(schema.get("type"), list) and "object" in schema["type"])


def _one_line(text: str) -> str:
    return _SECTION_RE.sub(lambda m: f"{m.group(1)} -", " ".join(str(text).split()))


def docstring(tool: dict, params: list[tuple[str, str, dict]]) -> str:
    """Google style: the tool's description, then `Args:` with one line per parameter."""
    f = tool["function"]
    desc = "\n".join(_SECTION_RE.sub(lambda m: f"{m.group(1)} -", line.rstrip()) for line in
                     (f.get("description") or f["name"]).strip().splitlines()).strip() or f["name"]
    lines = [desc]
    if params:
        lines += ["", "Args:"]
        for pyn, _orig, ps in params:
            d = _one_line(ps.get("description") or "") or pyn
            if _needs_schema(ps):
                spec = {k: v for k, v in ps.items() if k != "description"}
                d += " JSON schema: " + json.dumps(spec, ensure_ascii=False, sort_keys=True)
            lines.append(f"    {pyn}: {d}")
    return "\n".join(lines)


def tool_method(tool: dict, mode: str = "typed", method_name: str | None = None) -> Callable:
    """One method `(self, *, <params>) -> str` calling `self._tool_call(<tool name>, <args>)`."""
    if mode not in ("typed", "schema"):
        raise ValueError(f"mode must be 'typed' or 'schema', got {mode!r}")
    f = tool["function"]
    params_schema = f.get("parameters") or {}
    props = params_schema.get("properties") or {}
    required = set(params_schema.get("required") or [])
    taken: set[str] = {"self"}
    params: list[tuple[str, str, dict]] = []
    for orig, ps in props.items():
        params.append((py_name(orig, taken), orig, ps if isinstance(ps, dict) else {}))
    ns: dict[str, Any] = {"Any": Any, "UNSET": UNSET, "SCHEMAS": []}
    from typing import Annotated, Literal

    ns["Literal"], ns["Annotated"] = Literal, Annotated
    if mode == "schema":
        from pydantic import WithJsonSchema

        ns["WithJsonSchema"] = WithJsonSchema
    sig, argmap = [], []
    for i, (pyn, orig, ps) in enumerate(params):
        if mode == "typed":
            ann = py_annotation(ps)
        else:
            ns["SCHEMAS"].append(ps)
            ann = f"Annotated[Any, WithJsonSchema(SCHEMAS[{i}])]"
        sig.append(f"{pyn}: {ann}" + ("" if orig in required else " = UNSET"))
        argmap.append(f"{orig!r}: {pyn}")
    name = method_name or py_name(f["name"])
    src = (f"def {name}(self{', *, ' + ', '.join(sig) if sig else ''}) -> str:\n"
           f"    return self._tool_call({f['name']!r}, {{{', '.join(argmap)}}})\n")
    exec(compile(src, f"<toolkit tool {f['name']}>", "exec", dont_inherit=True), ns)  # noqa: S102 - source built above from names we sanitized
    fn = ns[name]
    fn.__doc__ = docstring(tool, params)
    return fn


def tool_methods(tools: list[dict], mode: str = "typed") -> dict[str, Callable]:
    """{method name: method} for a tool list (method names unique, safe Python identifiers;
    `reset`, `get_reward`, `close` and `step` are left to the environment class)."""
    taken = {"self", "reset", "get_reward", "close", "step", "state"}
    return {(n := py_name(t["function"]["name"], taken)): tool_method(t, mode, n) for t in tools}


def call_arguments(args: dict) -> dict:
    """The arguments a generated method received, without the ones left out."""
    return {k: v for k, v in args.items() if v is not UNSET}
