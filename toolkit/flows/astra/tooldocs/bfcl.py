"""BFCL / Gorilla function docs → OpenAI tools, with BFCL's own type map.

BFCL ships functions as ``{"name", "description", "parameters": {"type": "dict", "properties",
"required"}, "response"?}``: in its question files (``{"id", "question", "function": [...]}`` per
line; one entry = one server named by the entry id, its functions are the whole tool set) and in
``multi_turn_func_doc/*.json`` (one function per line; one file = one API class = one server).
Types are mapped exactly as bfcl-eval maps them before calling an OpenAI model
(``bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI`` applied by
``bfcl_eval.model_handler.utils._cast_to_openai_type``): dict→object, float→number (+ ``format:
float`` and BFCL's " This is a float type value." description suffix), tuple→array, any→string, Java
/ JavaScript names (HashMap, ArrayList, long, double, char, String ...) to their JSON types, and
a missing or unknown type → string (each such mapping is noted). BFCL maps the top level and two
levels of ``items``; here the same map is applied at every depth. Dotted names (``math.factorial``)
are sanitized as every source's are (``math_factorial``, which is also BFCL's own rewrite); the
original is kept for the call.
"""

from __future__ import annotations

import copy
from typing import Any

from toolkit.flows.astra.tooldocs.schema import Item, ToolDocError, make_tool

# bfcl_eval/constants/type_mappings.py (bfcl-eval 2026.3.23), GORILLA_TO_OPENAPI, verbatim
GORILLA_TO_OPENAPI = {
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object",
    "tuple": "array", "any": "string", "byte": "integer", "short": "integer", "long": "integer",
    "double": "number", "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
    "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string", "String": "string",
    "Bigint": "integer",
}


def is_bfcl_function(fn: Any) -> bool:
    return (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("parameters"), dict)
            and fn["parameters"].get("type") == "dict")


def is_bfcl_entry(doc: Any) -> bool:
    """A line of a BFCL question file: {"id", "question", "function": [...]} (or a multi-turn entry
    whose functions come from `involved_classes`)."""
    return isinstance(doc, dict) and "question" in doc and ("function" in doc or "involved_classes" in doc)


def _map_type(spec: dict, path: str, notes: list[str]) -> None:
    t = spec.get("type")
    if t is None:
        if any(k in spec for k in ("enum", "const", "anyOf", "oneOf", "allOf", "$ref")):
            pass
        else:
            spec["type"] = "string"
            notes.append(f"type_mapped: {path}: no type → string (as BFCL maps it)")
    elif isinstance(t, str):
        if t in GORILLA_TO_OPENAPI:
            spec["type"] = GORILLA_TO_OPENAPI[t]
            if t == "float":
                spec["format"] = "float"
                spec["description"] = (spec.get("description") or "") + " This is a float type value."
            elif t in ("any", "Any", "tuple"):
                notes.append(f"type_mapped: {path}: {t!r} → {spec['type']!r} (as BFCL maps it)")
        else:
            spec["type"] = "string"
            notes.append(f"type_mapped: {path}: unknown BFCL type {t!r} → string (as BFCL maps it)")
    if isinstance(spec.get("properties"), dict):
        for k, v in spec["properties"].items():
            if isinstance(v, dict):
                _map_type(v, f"{path}.{k}", notes)
    if isinstance(spec.get("items"), dict):
        _map_type(spec["items"], f"{path}[]", notes)
    if isinstance(spec.get("additionalProperties"), dict):
        _map_type(spec["additionalProperties"], f"{path}{{}}", notes)


def map_parameters(params: Any, notes: list[str]) -> Any:
    """BFCL parameters (type "dict") → a JSON-schema object, BFCL's type map applied throughout."""
    if not isinstance(params, dict):
        return params
    out = copy.deepcopy(params)
    out["type"] = "object"
    props = out.get("properties")
    if isinstance(props, dict):
        for k, v in props.items():
            if isinstance(v, dict):
                _map_type(v, k, notes)
    return out


def items(doc: Any) -> list[Item]:
    """A BFCL entry, one function, or a list of functions → Items (names not sanitized yet)."""
    if is_bfcl_entry(doc):
        fns = doc.get("function") or []
    elif isinstance(doc, list):
        fns = doc
    else:
        fns = [doc]
    if not isinstance(fns, list):
        raise ToolDocError("BFCL 'function' must be a list of function docs")
    out: list[Item] = []
    for fn in fns:
        if not isinstance(fn, dict) or "name" not in fn:
            raise ToolDocError(f"not a BFCL function doc: {str(fn)[:120]}")
        notes: list[str] = []
        params = map_parameters(fn.get("parameters"), notes)
        resp = fn.get("response")
        outs = map_parameters(resp, []) if isinstance(resp, dict) else None
        it = Item(make_tool(fn["name"], fn.get("description"), params), outs, notes=notes)
        out.append(it)
    return out
