"""ASTRA A1 (§2.1.1): tool-doc ingestion → OpenAI tool schemas grouped by server, with filters.

Accepted inputs (auto-detected per document; a file may hold one JSON document, or JSONL with one
document per line):

- OpenAI function schemas: ``{"type": "function", "function": {...}}``, a bare ``{"name",
  "description", "parameters"}``, a list of either, or ``{"tools": [...]}`` of either;
- MCP ``tools/list`` results: ``{"tools": [{"name", "description", "inputSchema", "outputSchema"?}]}``
  or the JSON-RPC envelope ``{"jsonrpc": "2.0", "result": {"tools": [...]}}``;
- OpenAPI 3 documents (``{"openapi": "3.x", "paths": {...}}``): one tool per operation; path, query
  and header parameters plus an ``application/json`` request body become the function's
  parameters; local ``$ref``s (``#/components/...``) are resolved; the 2xx JSON response schema
  gives the tool's output fields.

A document may name its server with a top-level ``"server"`` (or ``"name"``/``info.title`` for
OpenAPI); otherwise the file stem is used. Every document of one server is merged.

Filters (each drop carries its reason; nothing is dropped silently):

- a tool whose description is missing or too vague (``vague_description``): empty, fewer than
  ``min_description_words`` words, just the tool name, or a placeholder (``TODO``, ``n/a`` ...);
- a tool whose schema cannot be mapped to the OpenAI format (``unmappable_schema``): parameters
  not an object schema, a property without a JSON-schema type / enum / composition, an unknown
  type, an unresolvable or recursive ``$ref``, a required name that is no property, a name that
  breaks OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``;
- a duplicated tool name within one server (``duplicate_name``, the first one is kept);
- a server left with fewer than ``min_tools`` (3) tools (``too_few_tools``).

τ² domains (``tau2:airline`` ...) and the bundled sqlite domains (``sqlite:airline`` ...) are
importable the same way: their tools come from the real environment (``toolkit.envs``) and the
server record keeps the real backend so `rollout` runs them for real.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}
PLACEHOLDERS = {"todo", "tbd", "n/a", "na", "none", "null", "no description", "description",
                "desc", "test", "xxx", "...", "-", "placeholder", "undefined", "fixme"}
MIN_TOOLS = 3
MIN_DESCRIPTION_WORDS = 3


class ToolDocError(ValueError):
    """A document that is no tool doc at all (not a drop: the input is wrong)."""


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
class Server:
    name: str
    tools: list[dict]                       # OpenAI tool schemas
    outputs: dict[str, list[str]] = field(default_factory=dict)   # tool → output field names
    source: str = "openai"                  # openai | mcp | openapi | tau2 | sqlite
    domain: str | None = None
    description: str = ""
    env: dict | None = None                 # a real backend ref (tau2 / sqlite), else simulated

    def env_ref(self, fault_rate: float = 0.2) -> dict:
        if self.env:
            return copy.deepcopy(self.env)
        return {"backend": "simulated", "id": self.name,
                "config": {"tools": copy.deepcopy(self.tools), "fault_rate": fault_rate,
                           "policy": self.description or f"Tools of the {self.name} service."}}

    def record(self, fault_rate: float = 0.2) -> dict:
        """The server as a record line (what `toolkit tools import` prints, gen-plan reads)."""
        return {"id": f"server-{slug(self.name)}", "flow": "astra", "tags": ["astra", "server"],
                "env": self.env_ref(fault_rate),
                "extra": {"astra": {"server": self.name, "source": self.source, "domain": self.domain,
                                    "description": self.description, "outputs": self.outputs,
                                    "tools": copy.deepcopy(self.tools)}}}


@dataclass
class ImportResult:
    servers: list[Server] = field(default_factory=list)
    drops: list[Drop] = field(default_factory=list)

    def report(self) -> dict:
        return {"servers": [{"server": s.name, "tools": len(s.tools), "source": s.source} for s in self.servers],
                "drops": [asdict(d) for d in self.drops]}


def slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")
    return (s or "server")[:200]


# ----------------------------------------------------------------------------------------------
# schema checks


class Unmappable(ValueError):
    pass


def _resolve(node: Any, root: dict, seen: tuple = ()) -> Any:
    """Inline local $refs (#/...). Raises Unmappable on external, missing or recursive refs."""
    if isinstance(node, list):
        return [_resolve(x, root, seen) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise Unmappable(f"$ref {ref!r} is not a local reference")
        if ref in seen:
            raise Unmappable(f"recursive $ref {ref!r}")
        cur: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(cur, dict) or part not in cur:
                raise Unmappable(f"$ref {ref!r} does not resolve")
            cur = cur[part]
        merged = _resolve(cur, root, seen + (ref,))
        rest = {k: v for k, v in node.items() if k != "$ref"}
        if rest and isinstance(merged, dict):
            merged = {**merged, **_resolve(rest, root, seen)}
        return merged
    return {k: _resolve(v, root, seen) for k, v in node.items()}


def _inline(schema: Any) -> Any:
    """Resolve a schema's own local $refs (pydantic's #/$defs/...) and drop the definitions."""
    if not isinstance(schema, dict):
        return schema
    out = _resolve(schema, schema)
    for k in ("$defs", "definitions"):
        out.pop(k, None)
    return out


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


# ----------------------------------------------------------------------------------------------
# normalizers


def _tool(name: Any, description: Any, params: Any) -> dict:
    return {"type": "function", "function": {"name": name, "description": description if isinstance(description, str)
                                             else "", "parameters": params}}


def _from_openai_items(items: Iterable[Any]) -> list[tuple[dict, Any]]:
    out = []
    for t in items:
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict):
            fn = t["function"]
        elif isinstance(t, dict) and "name" in t:
            fn = t
        else:
            raise ToolDocError(f"not an OpenAI function schema: {json.dumps(t)[:120]}")
        params = fn.get("parameters", fn.get("inputSchema"))
        out.append((_tool(fn.get("name"), fn.get("description"), params),
                    fn.get("outputSchema") or fn.get("x-output-schema")))
    return out


def detect(doc: Any) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("openapi"), str) and "paths" in doc:
        return "openapi"
    if isinstance(doc, dict) and isinstance(doc.get("swagger"), str):
        raise ToolDocError("Swagger 2.0 documents are not supported (convert to OpenAPI 3 first)")
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict) and "tools" in doc["result"]:
        return "mcp"
    tools = doc.get("tools") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and "tools" not in doc and ("function" in doc or "name" in doc):
        tools = [doc]
    if isinstance(tools, list):
        if any(isinstance(t, dict) and "inputSchema" in t for t in tools):
            return "mcp"
        return "openai"
    raise ToolDocError("unrecognized tool document: expected OpenAI tools, an MCP tools/list result "
                       "or an OpenAPI 3 document")


_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def _openapi_ops(doc: dict) -> list[tuple[str, dict | None, str | None]]:
    """[(tool, output schema, unmappable reason)] for every operation of an OpenAPI 3 document."""
    out: list = []
    paths = doc.get("paths") or {}
    if not isinstance(paths, dict):
        raise ToolDocError("OpenAPI paths must be an object")
    for path, item in paths.items():
        if not isinstance(item, dict):
            continue
        common = item.get("parameters") or []
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            raw_name = op.get("operationId") or f"{method}_{path}"
            name = re.sub(r"[^a-zA-Z0-9_-]+", "_", raw_name).strip("_")[:64] or f"{method}_op"
            desc = op.get("description") or op.get("summary") or ""
            if op.get("summary") and op.get("description") and op["summary"] not in op["description"]:
                desc = f"{op['summary']}. {op['description']}"
            try:
                params = _openapi_params(doc, common + (op.get("parameters") or []), op.get("requestBody"))
                outs = _openapi_response(doc, op.get("responses") or {})
                out.append((_tool(name, desc, params), outs, None))
            except Unmappable as e:
                out.append((_tool(name, desc, None), None, str(e)))
    return out


def _openapi_params(doc: dict, params: list, body: Any) -> dict:
    props: dict = {}
    required: list = []
    for p in params:
        p = _resolve(p, doc)
        if not isinstance(p, dict) or "name" not in p:
            raise Unmappable("parameter without a name")
        if p.get("in") not in ("path", "query", "header", "cookie"):
            raise Unmappable(f"parameter {p.get('name')!r} has unknown location {p.get('in')!r}")
        schema = p.get("schema")
        if schema is None and isinstance(p.get("content"), dict):
            schema = next(iter(p["content"].values()), {}).get("schema")
        if not isinstance(schema, dict):
            raise Unmappable(f"parameter {p['name']!r} has no schema")
        schema = dict(schema)
        if p.get("description") and "description" not in schema:
            schema["description"] = p["description"]
        props[p["name"]] = schema
        if p.get("required") or p.get("in") == "path":
            required.append(p["name"])
    if body is not None:
        body = _resolve(body, doc)
        content = (body or {}).get("content") or {}
        js = next((v for k, v in content.items() if k.split(";")[0].strip() in ("application/json", "*/*")
                   or k.endswith("+json")), None)
        if js is None:
            raise Unmappable(f"request body has no JSON content (only {sorted(content)})")
        schema = js.get("schema") or {}
        if schema.get("type", "object") != "object" or not isinstance(schema.get("properties", {}), dict):
            raise Unmappable("JSON request body is not an object schema")
        for k, v in (schema.get("properties") or {}).items():
            if k in props:
                raise Unmappable(f"body property {k!r} collides with a parameter")
            props[k] = v
        required += [r for r in schema.get("required") or [] if r not in required]
    out = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _openapi_response(doc: dict, responses: dict) -> dict | None:
    for code in sorted(responses, key=str):
        if not str(code).startswith("2"):
            continue
        r = _resolve(responses[code], doc)
        content = (r or {}).get("content") or {}
        for k, v in content.items():
            if "json" in k and isinstance(v, dict) and isinstance(v.get("schema"), dict):
                return v["schema"]
    return None


# ----------------------------------------------------------------------------------------------
# import


@dataclass
class _Pending:
    name: str
    source: str
    description: str = ""
    items: list = field(default_factory=list)  # (tool, output schema, unmappable reason or None)


def _parse_doc(doc: Any, default_server: str) -> _Pending:
    kind = detect(doc)
    server = default_server
    if isinstance(doc, dict) and isinstance(doc.get("server"), str) and doc["server"].strip():
        server = doc["server"].strip()
    if kind == "openapi":
        info = doc.get("info") or {}
        if not (isinstance(doc.get("server"), str) and doc["server"].strip()) and info.get("title"):
            server = str(info["title"]).strip()
        pend = _Pending(server, "openapi", str(info.get("description") or ""))
        for tool, outs, reason in _openapi_ops(doc):
            pend.items.append((tool, outs, reason))
        return pend
    if kind == "mcp":
        tools = doc["result"]["tools"] if isinstance(doc.get("result"), dict) else doc["tools"]
        if isinstance(doc.get("result"), dict) and isinstance(doc["result"].get("server"), str):
            server = doc["result"]["server"]
    else:
        tools = doc.get("tools") if isinstance(doc, dict) and "tools" in doc else doc
        if isinstance(tools, dict):
            tools = [tools]
    pend = _Pending(server, kind, str(doc.get("description") or "") if isinstance(doc, dict) else "")
    for tool, outs in _from_openai_items(tools):
        pend.items.append((tool, outs, None))
    return pend


def _finish(pend: _Pending, res: ImportResult, min_tools: int, min_words: int,
            env: dict | None = None, domain: str | None = None, outputs_hint: dict | None = None) -> None:
    kept: list[dict] = []
    outputs: dict[str, list[str]] = {}
    seen: set[str] = set()
    vocab = {k for tool, _, _ in pend.items
             for k in ((((tool.get("function") or {}).get("parameters") or {}).get("properties") or {})
                       if isinstance(((tool.get("function") or {}).get("parameters") or {}), dict) else {})}
    for tool, outs, reason in pend.items:
        fn = tool["function"]
        name = fn.get("name")
        label = name if isinstance(name, str) else repr(name)
        if not isinstance(name, str) or not NAME_RE.match(name):
            res.drops.append(Drop(pend.name, label, "unmappable_schema",
                                  f"name {name!r} breaks OpenAI's ^[a-zA-Z0-9_-]{{1,64}}$"))
            continue
        if reason is None:
            try:
                fn["parameters"] = check_parameters(_inline(fn.get("parameters")))
            except Unmappable as e:
                reason = str(e)
        if reason is not None:
            res.drops.append(Drop(pend.name, name, "unmappable_schema", reason))
            continue
        why = vague(fn.get("description"), name, min_words)
        if why:
            res.drops.append(Drop(pend.name, name, "vague_description", why))
            continue
        if name in seen:
            res.drops.append(Drop(pend.name, name, "duplicate_name", "a tool with this name was kept earlier"))
            continue
        seen.add(name)
        fn["description"] = " ".join(fn["description"].split())
        kept.append(tool)
        fields = schema_fields(outs) if outs else []
        fields += (outputs_hint or {}).get(name, [])
        fields += description_fields(fn["description"], vocab)
        outputs[name] = list(dict.fromkeys(fields))
    if len(kept) < min_tools:
        res.drops.append(Drop(pend.name, None, "too_few_tools",
                              f"{len(kept)} usable tool(s) (< {min_tools})" +
                              (f": {', '.join(t['function']['name'] for t in kept)}" if kept else "")))
        return
    res.servers.append(Server(pend.name, kept, outputs, pend.source, domain, pend.description, env))


def load_documents(path: str | Path) -> list[Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ToolDocError(f"{path}: cannot read: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        pass
    else:  # a list of server documents ({"server", "tools"} / MCP / OpenAPI) is several documents
        if isinstance(doc, list) and doc and all(isinstance(x, dict) and ("tools" in x or "openapi" in x
                                                                         or "result" in x) for x in doc):
            return doc
        return [doc]
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            return [yaml.safe_load(text)]
        except yaml.YAMLError as e:
            raise ToolDocError(f"{path}: not valid YAML: {e}") from None
    from toolkit.io import parse_jsonl

    try:
        return parse_jsonl(text, str(path))
    except ValueError as e:
        raise ToolDocError(str(e)) from None


def import_documents(docs: list[tuple[str, Any]], *, min_tools: int = MIN_TOOLS,
                     min_description_words: int = MIN_DESCRIPTION_WORDS,
                     result: ImportResult | None = None) -> ImportResult:
    """docs: [(default server name, parsed document)]; documents of one server are merged."""
    res = result or ImportResult()
    merged: dict[str, _Pending] = {}
    for default, doc in docs:
        pend = _parse_doc(doc, default)
        if pend.name in merged:
            merged[pend.name].items += pend.items
            merged[pend.name].description = merged[pend.name].description or pend.description
        else:
            merged[pend.name] = pend
    for pend in merged.values():
        _finish(pend, res, min_tools, min_description_words)
    return res


def import_env(spec: str, *, min_tools: int = MIN_TOOLS, min_description_words: int = MIN_DESCRIPTION_WORDS,
               result: ImportResult | None = None) -> ImportResult:
    """`tau2:<domain>` or `sqlite:<domain>`: the real environment's agent tools as one server."""
    from toolkit.envs import load_env

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
    hint = tau2_output_fields(dom) if kind == "tau2" else sqlite_output_fields(dom)
    pend = _Pending(f"{kind}-{dom}", kind, (policy or "")[:2000])
    for tool, outs in _from_openai_items(copy.deepcopy(tools)):
        pend.items.append((tool, outs, None))
    _finish(pend, res, min_tools, min_description_words, env=ref, domain=dom, outputs_hint=hint)
    return res


def tau2_output_fields(domain: str) -> dict[str, list[str]]:
    """Output fields of τ² tools from their return annotations (pydantic models) where given."""
    try:
        from toolkit.envs import tau2 as T

        env = T.new_tau2_environment(domain)
        tk = getattr(env, "tools", None)
        funcs = tk.get_tools() if tk is not None and hasattr(tk, "get_tools") else {}
    except Exception:
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
        except Exception:
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


def sqlite_output_fields(domain: str) -> dict[str, list[str]]:
    """A bundled sqlite domain's query/insert/update tools return rows of their table: the
    table's columns are the tool's output fields."""
    from toolkit.domains import domain_path

    try:
        schema = (domain_path(domain) / "schema.sql").read_text(encoding="utf-8")
    except (KeyError, OSError):
        return {}
    import sqlite3

    con = sqlite3.connect(":memory:")
    try:
        con.executescript(schema)
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        cols = {t: [r[1] for r in con.execute(f"PRAGMA table_info('{t}')")] for t in tables}
    except sqlite3.Error:
        return {}
    finally:
        con.close()
    out: dict[str, list[str]] = {}
    for table, names in cols.items():
        for verb in ("query", "insert", "update", "delete", "get"):
            out[f"{verb}_{table}"] = names
    return out


def import_paths(paths: list[str], **kw: Any) -> ImportResult:
    """Files and `tau2:<domain>` / `sqlite:<domain>` specs → one ImportResult."""
    res = ImportResult()
    docs: list[tuple[str, Any]] = []
    for p in paths:
        if re.match(r"^(tau2|sqlite):", p):
            import_env(p, result=res, **kw)
            continue
        for doc in load_documents(p):
            docs.append((Path(p).stem, doc))
    if docs:
        import_documents(docs, result=res, **kw)
    return res


def server_from_record(rec: Any, *, min_tools: int = MIN_TOOLS,
                       min_description_words: int = MIN_DESCRIPTION_WORDS) -> tuple[Server | None, list[Drop]]:
    """gen-plan's ingest step: a record from `toolkit tools import` (extra.astra), a record with raw
    docs in extra.tool_docs, or any record whose env has tools (τ²/sqlite/simulated/python)."""
    d = rec.model_dump(by_alias=True) if hasattr(rec, "model_dump") else dict(rec)
    extra = d.get("extra") or {}
    res = ImportResult()
    astra = extra.get("astra") if isinstance(extra.get("astra"), dict) else None
    name = (astra or {}).get("server") or d.get("id")
    if extra.get("tool_docs") is not None:
        docs = extra["tool_docs"] if isinstance(extra["tool_docs"], list) else [extra["tool_docs"]]
        import_documents([(name, x) for x in docs], min_tools=min_tools,
                         min_description_words=min_description_words, result=res)
    else:
        env = d.get("env") or {}
        tools = (astra or {}).get("tools")
        if tools is None and env:
            if env.get("backend") in ("tau2", "sqlite") and env.get("id"):
                import_env(f"{env['backend']}:{env['id']}", min_tools=min_tools,
                           min_description_words=min_description_words, result=res)
                tools = None
            else:
                tools = (env.get("config") or {}).get("tools")
        if tools is not None:
            pend = _Pending(name, (astra or {}).get("source") or "openai", (astra or {}).get("description") or "")
            for tool, outs in _from_openai_items(copy.deepcopy(tools)):
                pend.items.append((tool, outs, None))
            real = env if env.get("backend") in ("tau2", "sqlite", "python") else None
            _finish(pend, res, min_tools, min_description_words, env=real,
                    domain=(astra or {}).get("domain"), outputs_hint=(astra or {}).get("outputs"))
        elif not res.servers and not res.drops:
            raise ToolDocError("record has no tools: expected extra.astra.tools (toolkit tools import), "
                               "extra.tool_docs or env with tools")
    return (res.servers[0] if res.servers else None), res.drops
