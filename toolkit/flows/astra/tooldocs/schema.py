"""Tool-doc data types and JSON-schema handling shared by every source (OpenAI, MCP, OpenAPI, BFCL).

- `sanitize_name`: the ONE name rule for every source (a valid OpenAI name is kept as is; otherwise
  each run of characters outside ``[a-zA-Z0-9_-]`` becomes ``_``; > 64 characters get a hash tail);
  the original name is kept in `Server.names` for the real call.
- `resolve_refs`: local ``$ref``s inlined; a recursive ``$ref`` is unfolded `RECURSION_DEPTH` times
  and then cut to an open schema of the same type (recorded in `cuts`), never dropped.
- `merge_all_of`: ``allOf`` merged into one schema (properties, required, type) at every depth.
- `flatten_top`: top-level ``oneOf``/``anyOf`` of object schemas → one object whose properties are
  the union and whose required names are those every alternative requires (the widest object JSON
  schema allows as function parameters); nested ``oneOf``/``anyOf`` are kept as they are.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from toolkit.formats.tools import NAME_RE, sanitize_name  # noqa: F401  (one name rule for every source)
JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}
PLACEHOLDERS = {"todo", "tbd", "n/a", "na", "none", "null", "no description", "description",
                "desc", "test", "xxx", "...", "-", "placeholder", "undefined", "fixme"}
MIN_TOOLS = 3
MIN_DESCRIPTION_WORDS = 3
RECURSION_DEPTH = 2   # a recursive $ref is unfolded this many times on one path, then cut


class ToolDocError(ValueError):
    """A document that is no tool doc at all (not a drop: the input is wrong)."""


class Unmappable(ValueError):
    pass


@dataclass
class Drop:
    server: str
    tool: str | None
    reason: str  # too_few_tools | vague_description | unmappable_schema | duplicate_name
    detail: str

    def line(self) -> str:
        where = f"{self.server}/{self.tool}" if self.tool else self.server
        return f"dropped {where}: {self.reason}: {self.detail}"


@dataclass
class Note:
    """A kept tool imported with a loss or a rewrite worth knowing (counted, printed, reported)."""
    server: str
    tool: str | None
    kind: str    # recursion_cut | one_of_flattened | renamed | response_unmapped | outputs_unknown | type_mapped ...
    detail: str

    def line(self) -> str:
        where = f"{self.server}/{self.tool}" if self.tool else self.server
        return f"note {where}: {self.kind}: {self.detail}"


@dataclass
class Server:
    name: str
    tools: list[dict]                       # OpenAI tool schemas
    outputs: dict[str, list[str]] = field(default_factory=dict)   # tool → output field names
    source: str = "openai"                  # openai | mcp | openapi | bfcl | tau2 | sqlite
    domain: str | None = None
    description: str = ""
    env: dict | None = None                 # a real backend ref (tau2 / sqlite), else simulated
    names: dict[str, str] = field(default_factory=dict)        # sanitized name → original (renamed only)
    annotations: dict[str, dict] = field(default_factory=dict)  # tool → MCP annotations (+ title)

    def original(self, name: str) -> str:
        """The name to call the real tool by (the source's own name)."""
        return self.names.get(name, name)

    def env_ref(self, fault_rate: float = 0.2) -> dict:
        if self.env:
            return copy.deepcopy(self.env)
        return {"backend": "simulated", "id": self.name,
                "config": {"tools": copy.deepcopy(self.tools), "fault_rate": fault_rate,
                           "policy": self.description or f"Tools of the {self.name} service."}}

    def record(self, fault_rate: float = 0.2) -> dict:
        """The server as a record line (what `toolkit tools import` prints, gen-plan reads)."""
        astra = {"server": self.name, "source": self.source, "domain": self.domain,
                 "description": self.description, "outputs": self.outputs,
                 "tools": copy.deepcopy(self.tools)}
        if self.names:
            astra["names"] = dict(self.names)
        if self.annotations:
            astra["annotations"] = copy.deepcopy(self.annotations)
        return {"id": f"server-{slug(self.name)}", "flow": "astra", "tags": ["astra", "server"],
                "env": self.env_ref(fault_rate), "extra": {"astra": astra}}


@dataclass
class ImportResult:
    servers: list[Server] = field(default_factory=list)
    drops: list[Drop] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def report(self) -> dict:
        kinds: dict[str, int] = {}
        for n in self.notes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        return {"servers": [{"server": s.name, "tools": len(s.tools), "source": s.source} for s in self.servers],
                "drops": [asdict(d) for d in self.drops], "notes": [asdict(n) for n in self.notes],
                "note_counts": kinds}


def slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")
    return (s or "server")[:200]


# ----------------------------------------------------------------------------------------------
# $ref / allOf / oneOf


def _cut(target: Any, ref: str) -> dict:
    t = target.get("type") if isinstance(target, dict) else None
    out: dict = {"description": f"(recursive {ref.rsplit('/', 1)[-1]}: nested further, cut at depth "
                                f"{RECURSION_DEPTH})"}
    if isinstance(t, str) and t in JSON_TYPES:
        out["type"] = t
    elif isinstance(target, dict) and "properties" in target:
        out["type"] = "object"
    return out


def resolve_refs(node: Any, root: dict, seen: tuple = (), cuts: list | None = None) -> Any:
    """Inline local $refs (#/...). Raises Unmappable on external or missing refs; a recursive ref
    is unfolded RECURSION_DEPTH times on one path and then cut (an open schema of its type)."""
    if isinstance(node, list):
        return [resolve_refs(x, root, seen, cuts) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unmappable(f"$ref {ref!r} is not a local reference")
        cur: Any = root
        for part in ([] if ref in ("#", "#/") else ref[2:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(cur, dict) or part not in cur:
                raise Unmappable(f"$ref {ref!r} does not resolve")
            cur = cur[part]
        if seen.count(ref) >= RECURSION_DEPTH:
            if cuts is not None:
                cuts.append(ref)
            merged: Any = _cut(cur, ref)
        else:
            merged = resolve_refs(cur, root, seen + (ref,), cuts)
        rest = {k: v for k, v in node.items() if k != "$ref"}
        if rest and isinstance(merged, dict):
            merged = {**merged, **resolve_refs(rest, root, seen, cuts)}
        return merged
    return {k: resolve_refs(v, root, seen, cuts) for k, v in node.items()}


def inline(schema: Any, cuts: list | None = None) -> Any:
    """Resolve a schema's own local $refs (pydantic's #/$defs/...) and drop the definitions."""
    if not isinstance(schema, dict):
        return schema
    out = resolve_refs(schema, schema, cuts=cuts)
    for k in ("$defs", "definitions"):
        out.pop(k, None)
    return out


def _types(s: dict) -> set | None:
    t = s.get("type")
    if t is None:
        return None
    return set(t) if isinstance(t, list) else {t}


def merge_all_of(schema: Any) -> Any:
    """Merge every `allOf` (after its parts are merged) into one schema, at any depth."""
    if isinstance(schema, list):
        return [merge_all_of(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: merge_all_of(v) for k, v in schema.items()}
    parts = out.pop("allOf", None)
    if not isinstance(parts, list):
        if parts is not None:
            raise Unmappable("allOf must be a list")
        return out
    merged: dict = {}
    for p in [*parts, {k: v for k, v in out.items()}]:
        if not isinstance(p, dict):
            raise Unmappable("allOf part is not a schema object")
        for k, v in p.items():
            if k == "properties" and isinstance(v, dict):
                props = merged.setdefault("properties", {})
                for name, sub in v.items():
                    if name in props and isinstance(props[name], dict) and isinstance(sub, dict):
                        props[name] = merge_all_of({"allOf": [props[name], sub]})
                    else:
                        props[name] = sub
            elif k == "required" and isinstance(v, list):
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *v]))
            elif k == "type":
                have, new = _types(merged), ({*v} if isinstance(v, list) else {v})
                both = new if have is None else have & new
                if not both:
                    raise Unmappable(f"allOf parts have incompatible types {sorted(map(str, have or []))} "
                                     f"and {sorted(map(str, new))}")
                merged["type"] = next(iter(both)) if len(both) == 1 else sorted(both)
            elif k == "description" and "description" in merged and v != merged["description"]:
                merged["description"] = f"{merged['description']} {v}"
            else:
                merged.setdefault(k, v)
    if "properties" in merged and "type" not in merged:
        merged["type"] = "object"
    return merged


def flatten_top(params: dict) -> tuple[dict, str | None]:
    """Top-level oneOf/anyOf of object schemas → one object (union of properties; required = what
    every alternative requires). Returns (schema, note or None)."""
    t = params.get("type")
    if isinstance(t, list) and "object" in t and set(t) <= {"object", "null"}:
        params = {**params, "type": "object"}   # nullable object (OpenAPI 3.1): the object
    for key in ("oneOf", "anyOf"):
        alts = params.get(key)
        if alts is None:
            continue
        if not isinstance(alts, list) or not alts:
            raise Unmappable(f"top-level {key} must be a non-empty list")
        alts = [merge_all_of(a) for a in alts]
        # a nullable body (`anyOf: [{...}, {type: null}]`): the null alternative is "send nothing"
        alts = [a for a in alts if not (isinstance(a, dict) and a.get("type") == "null")] or alts
        bad = [a for a in alts if not isinstance(a, dict) or a.get("type", "object") != "object"]
        if bad:
            raise Unmappable(f"top-level {key} has a non-object alternative: cannot be one parameters object")
        props: dict = dict(params.get("properties") or {})
        reqs = None
        for a in alts:
            for name, sub in (a.get("properties") or {}).items():
                props.setdefault(name, sub)
            r = set(a.get("required") or [])
            reqs = r if reqs is None else reqs & r
        out = {k: v for k, v in params.items() if k not in (key, "properties", "required")}
        out["type"] = "object"
        out["properties"] = props
        required = list(dict.fromkeys([*(params.get("required") or []),
                                       *[n for n in props if n in (reqs or set())]]))
        if required:
            out["required"] = required
        variants = "; ".join(", ".join(sorted(a.get("required") or [])) or "(none)" for a in alts)
        out["description"] = ((out.get("description") or "") +
                              f" (one of {len(alts)} argument sets; required per set: {variants})").strip()
        return out, f"top-level {key} of {len(alts)} object schemas merged (required: intersection)"
    return params, None


@dataclass
class Item:
    """One tool as read from a source, before the filters: `reason` set = unmappable already."""
    tool: dict                                # OpenAI tool schema (name may still need sanitizing)
    outputs: Any = None                       # output (response) schema, if any
    reason: str | None = None
    original: str | None = None               # the source's own name, when it differs from tool's name
    annotations: dict | None = None           # MCP annotations (+ title)
    notes: list[str] = field(default_factory=list)   # "kind: detail" lines


def make_tool(name: Any, description: Any, params: Any) -> dict:
    return {"type": "function", "function": {"name": name, "description": description if isinstance(description, str)
                                             else "", "parameters": params}}
