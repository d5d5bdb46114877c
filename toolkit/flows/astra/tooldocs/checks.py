"""Schema checks (OpenAI function parameters), the vague-description rule and output fields."""

from __future__ import annotations

import re
from typing import Any

from toolkit.flows.astra.tooldocs.schema import (
    JSON_TYPES,
    MIN_DESCRIPTION_WORDS,
    NAME_RE,
    PLACEHOLDERS,
    RECURSION_DEPTH,
    Unmappable,
    flatten_top,
    inline,
    merge_all_of,
)


def _check_prop(name: str, spec: Any, path: str, top: bool = True) -> None:
    """A property schema. A top-level argument needs a type (or enum/const/composition) so an agent
    knows what to send; nested schemas may be open ({} = any JSON value)."""
    if not isinstance(spec, dict):
        raise Unmappable(f"{path}{name}: property schema must be an object, got {type(spec).__name__}")
    t = spec.get("type")
    if t is None:
        if top and not any(k in spec for k in ("enum", "const", "anyOf", "oneOf", "allOf")):
            raise Unmappable(f"{path}{name}: property has no type, enum or composition")
    else:
        ts = t if isinstance(t, list) else [t]
        bad = [x for x in ts if x not in JSON_TYPES]
        if bad:
            raise Unmappable(f"{path}{name}: unknown type {bad[0]!r}")
    if "enum" in spec and not isinstance(spec["enum"], list):
        raise Unmappable(f"{path}{name}: enum must be a list")
    for key in ("anyOf", "oneOf", "allOf"):
        if key in spec:
            if not isinstance(spec[key], list) or not spec[key]:
                raise Unmappable(f"{path}{name}: {key} must be a non-empty list")
            for i, sub in enumerate(spec[key]):
                _check_prop(f"{name}.{key}[{i}]", sub, path, top=False)
    if (spec.get("type") == "object" or "properties" in spec) and "properties" in spec:
        _check_object(spec, f"{path}{name}.", top=False)
    if spec.get("type") == "array" and "items" in spec:
        if isinstance(spec["items"], dict):
            _check_prop(f"{name}[]", spec["items"], path, top=False)
        else:
            raise Unmappable(f"{path}{name}: items must be one schema object")


def _check_object(params: dict, path: str = "", top: bool = True) -> None:
    props = params.get("properties", {})
    if not isinstance(props, dict):
        raise Unmappable(f"{path}properties must be an object")
    req = params.get("required", [])
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise Unmappable(f"{path}required must be a list of names")
    missing = [r for r in req if r not in props]
    if missing:
        raise Unmappable(f"{path}required names {missing} are not properties")
    for k, v in props.items():
        _check_prop(k, v, path, top)


def check_parameters(params: Any) -> dict:
    """The OpenAI-ready parameters object, or Unmappable with the reason."""
    if params is None:
        return {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise Unmappable(f"parameters must be a JSON-schema object, got {type(params).__name__}")
    for key in ("anyOf", "oneOf", "allOf", "not"):
        if key in params:
            raise Unmappable(f"top-level {key} cannot be mapped to OpenAI function parameters")
    if params.get("type", "object") != "object":
        raise Unmappable(f"parameters must have type 'object', got {params.get('type')!r}")
    out = dict(params)
    out["type"] = "object"
    out.setdefault("properties", {})
    _check_object(out)
    return out


def normalize_parameters(params: Any) -> tuple[dict, list[str]]:
    """Any source's input schema → OpenAI parameters: own $refs inlined (recursion cut), allOf merged,
    a top-level oneOf/anyOf of objects flattened, then checked. Returns (parameters, notes)."""
    notes: list[str] = []
    if params is None:
        return {"type": "object", "properties": {}}, notes
    cuts: list = []
    p = inline(params, cuts)
    if cuts:
        notes.append("recursion_cut: recursive " + ", ".join(sorted(set(cuts))) + f" cut after {RECURSION_DEPTH} levels")
    p = merge_all_of(p)
    if isinstance(p, dict):
        p, flat = flatten_top(p)
        if flat:
            notes.append("one_of_flattened: " + flat)
    return check_parameters(p), notes


def validate_openai_tool(tool: Any) -> list[str]:
    """Problems that make `tool` an invalid OpenAI tool schema ([] when valid)."""
    probs: list[str] = []
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        return ["not {'type': 'function', 'function': {...}}"]
    fn = tool["function"]
    extra = set(fn) - {"name", "description", "parameters", "strict"}
    if extra:
        probs.append(f"unknown function keys {sorted(extra)}")
    if not isinstance(fn.get("name"), str) or not NAME_RE.match(fn["name"]):
        probs.append(f"name {fn.get('name')!r} breaks ^[a-zA-Z0-9_-]{{1,64}}$")
    if not isinstance(fn.get("description", ""), str):
        probs.append("description must be a string")
    try:
        check_parameters(fn.get("parameters"))
    except Unmappable as e:
        probs.append(str(e))
    return probs


def vague(description: Any, name: str, min_words: int = MIN_DESCRIPTION_WORDS) -> str | None:
    """Why a description is too vague, or None."""
    if not isinstance(description, str) or not description.strip():
        return "missing description"
    d = " ".join(description.split())
    low = d.lower().strip(" .!")
    if low in PLACEHOLDERS:
        return f"placeholder description {d!r}"
    if low.replace(" ", "_") == name.lower() or low.replace(" ", "") == name.lower().replace("_", ""):
        return "description only repeats the tool name"
    words = re.findall(r"\w+", d)
    if len(words) < min_words:
        return f"description has {len(words)} word(s) (< {min_words}): {d!r}"
    return None


# ----------------------------------------------------------------------------------------------
# output fields (for the chain dependency check)


def schema_fields(schema: Any, depth: int = 0) -> list[str]:
    """Property names of a (response) schema, recursively through objects and array items."""
    out: list[str] = []
    if not isinstance(schema, dict) or depth > 6:
        return out
    for k, v in (schema.get("properties") or {}).items():
        out.append(k)
        out += schema_fields(v, depth + 1)
    if isinstance(schema.get("items"), dict):
        out += schema_fields(schema["items"], depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            out += schema_fields(sub, depth + 1)
    return list(dict.fromkeys(out))


_RETURNS_RE = re.compile(r"\b(?:returns?|outputs?|responds? with|gives?|yields?|provides?)\b(?P<rest>[^.;\n]*)",
                         re.IGNORECASE)


def description_fields(description: str, vocabulary: set[str] | frozenset = frozenset()) -> list[str]:
    """Output fields a description names after 'returns' / 'outputs' ...: `backticked` names,
    snake_case identifiers, and plain words that are parameter names in the server (`vocabulary`);
    e.g. 'Returns the order_id and status.' → order_id (+ status when some tool takes a status)."""
    out: list[str] = []
    if not description:
        return out
    for m in _RETURNS_RE.finditer(description):
        rest = m.group("rest")
        out += re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", rest)
        out += [w for w in re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", rest)]
        # plain words after 'returns': "returns the status and price" → status, price
        out += [w for w in re.findall(r"\b[a-z][a-z0-9]{2,}\b", rest) if w in vocabulary]
    return list(dict.fromkeys(x.split(".")[-1] for x in out))
