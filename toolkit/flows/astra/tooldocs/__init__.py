"""ASTRA A1 (§2.1.1): tool-doc ingestion → OpenAI tool schemas grouped by server, with filters.

Accepted inputs (auto-detected per document; a file may hold one JSON document, YAML, or JSONL with
one document per line). One public function per source, each returning an `ImportResult`:

- `from_openai`: OpenAI function schemas: ``{"type": "function", "function": {...}}``, a bare
  ``{"name", "description", "parameters"}``, a list of either, or ``{"tools": [...]}`` of either;
- `from_mcp`: MCP ``tools/list`` results: ``{"tools": [{"name", "title"?, "description",
  "inputSchema", "outputSchema"?, "annotations"?}]}`` or the JSON-RPC envelope ``{"jsonrpc": "2.0",
  "result": {"tools": [...]}}``; annotations (and title) are kept in `Server.annotations`;
- `from_openapi`: OpenAPI 3.x documents: one tool per operation (see openapi.py: parameters, JSON /
  form-urlencoded / multipart / raw bodies, allOf, oneOf, recursion cut, 2xx response → outputs);
- `from_bfcl`: BFCL / Gorilla function docs (question-file entries, multi-turn func-doc lines) with
  BFCL's own type map (see bfcl.py);
- `import_env` (envs.py): ``tau2:<domain>`` / ``sqlite:<domain>``, the real environments' tools.

Names: every source goes through the same `sanitize_name`; a renamed tool keeps its original in
`Server.names` (sanitized → original) for the real call, and a note says so.

A document may name its server with a top-level ``"server"`` (or ``"name"``/``info.title`` for
OpenAPI; a BFCL entry is named by its ``id``); otherwise the file stem is used. Every document of one
server is merged.

Filters (each drop carries its reason; nothing is dropped silently):

- a tool whose description is missing or too vague (``vague_description``): empty, fewer than
  ``min_description_words`` words, just the tool name, or a placeholder (``TODO``, ``n/a`` ...);
- a tool whose schema cannot be mapped to the OpenAI format (``unmappable_schema``): parameters
  not an object schema (after allOf merging and oneOf/anyOf flattening), a top-level ``not``, a
  top-level property without a JSON-schema type / enum / composition, an unknown type, an
  external or unresolvable ``$ref``, ``allOf`` parts of incompatible types, a required name that is
  no property, a body property that collides with a parameter twice over, a name that is empty;
- a duplicated tool name within one server (``duplicate_name``, the first one is kept; names are
  compared after sanitizing);
- a server left with fewer than ``min_tools`` tools (``too_few_tools``; default 3, but 1 for BFCL,
  whose entries are test cases rather than services).

Kept tools imported with a loss or a rewrite get a counted `Note` (``recursion_cut``,
``one_of_flattened``, ``renamed``, ``body_argument``, ``response_unmapped``, ``type_mapped``,
``outputs_unknown``), printed on stderr by `toolkit tools import` and listed in ``--report``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from toolkit.flows.astra.tooldocs import bfcl as _bfcl
from toolkit.flows.astra.tooldocs import openapi as _openapi
from toolkit.flows.astra.tooldocs.checks import (  # noqa: F401
    check_parameters,
    description_fields,
    normalize_parameters,
    schema_fields,
    vague,
    validate_openai_tool,
)
from toolkit.flows.astra.tooldocs.envs import (  # noqa: F401
    import_env,
    sqlite_output_fields,
    tau2_output_fields,
)
from toolkit.flows.astra.tooldocs.servers import Pending, finish, openai_items  # noqa: F401
from toolkit.flows.astra.tooldocs.schema import (  # noqa: F401
    JSON_TYPES,
    MIN_DESCRIPTION_WORDS,
    MIN_TOOLS,
    NAME_RE,
    RECURSION_DEPTH,
    Drop,
    ImportResult,
    Item,
    Note,
    Server,
    ToolDocError,
    Unmappable,
    make_tool,
    sanitize_name,
    slug,
)
from toolkit.io import parse_jsonl

SOURCES = ("openai", "mcp", "openapi", "bfcl")

# ----------------------------------------------------------------------------------------------
# per-source items


def mcp_items(tools: Iterable[Any]) -> list[Item]:
    """MCP tools/list entries: inputSchema kept exactly (then normalized as every source's is),
    outputSchema → output fields, annotations (+ title) kept."""
    out = []
    for t in tools:
        if not isinstance(t, dict) or "name" not in t:
            raise ToolDocError(f"not an MCP tool: {json.dumps(t)[:120]}")
        ann = dict(t["annotations"]) if isinstance(t.get("annotations"), dict) else {}
        if isinstance(t.get("title"), str):
            ann.setdefault("title", t["title"])
        desc = t.get("description")
        if not (isinstance(desc, str) and desc.strip()) and isinstance(ann.get("title"), str):
            desc = ann["title"]
        out.append(Item(make_tool(t.get("name"), desc, t.get("inputSchema", t.get("parameters"))),
                        t.get("outputSchema"), annotations=ann or None))
    return out


def detect(doc: Any) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("openapi"), str) and "paths" in doc:
        return "openapi"
    if isinstance(doc, dict) and isinstance(doc.get("swagger"), str):
        raise ToolDocError("Swagger 2.0 documents are not supported (convert to OpenAPI 3 first)")
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict) and "tools" in doc["result"]:
        return "mcp"
    if _bfcl.is_bfcl_entry(doc):
        return "bfcl"
    tools = doc.get("tools") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and "tools" not in doc and ("function" in doc or "name" in doc):
        tools = [doc]
    if isinstance(tools, list):
        if any(isinstance(t, dict) and "inputSchema" in t for t in tools):
            return "mcp"
        if any(_bfcl.is_bfcl_function(t) for t in tools):
            return "bfcl"
        return "openai"
    raise ToolDocError("unrecognized tool document: expected OpenAI tools, an MCP tools/list result, "
                       "an OpenAPI 3 document or BFCL function docs")


def parse_doc(doc: Any, default_server: str, source: str | None = None) -> Pending:
    kind = source or detect(doc)
    if kind not in SOURCES:
        raise ToolDocError(f"unknown tool-doc source {kind!r}; use one of {', '.join(SOURCES)}")
    server = default_server
    if isinstance(doc, dict) and isinstance(doc.get("server"), str) and doc["server"].strip():
        server = doc["server"].strip()
    if kind == "openapi":
        if not (isinstance(doc, dict) and isinstance(doc.get("paths"), dict)):
            raise ToolDocError("not an OpenAPI 3 document (no paths)")
        info = doc.get("info") or {}
        if not (isinstance(doc.get("server"), str) and doc["server"].strip()) and info.get("title"):
            server = str(info["title"]).strip()
        pend = Pending(server, "openapi", str(info.get("description") or ""))
        pend.items += _openapi.operations(doc)
        return pend
    if kind == "bfcl":
        if _bfcl.is_bfcl_entry(doc):
            server = str(doc.get("id") or server)
        pend = Pending(server, "bfcl", "")
        if _bfcl.is_bfcl_entry(doc) and "function" not in doc:
            pend.notes.append(f"no_functions: entry lists no function docs (its functions are BFCL's "
                              f"API classes {doc.get('involved_classes')}: import multi_turn_func_doc/*.json)")
        elif _bfcl.is_bfcl_entry(doc) and not doc.get("function"):
            pend.notes.append("no_functions: entry offers no function (an irrelevance test case)")
        pend.items += _bfcl.items(doc.get("tools") if isinstance(doc, dict) and "tools" in doc else doc)
        return pend
    if kind == "mcp":
        res = doc.get("result") if isinstance(doc, dict) and isinstance(doc.get("result"), dict) else doc
        tools = res.get("tools") if isinstance(res, dict) else res
        if isinstance(res, dict) and isinstance(res.get("server"), str):
            server = res["server"]
        pend = Pending(server, "mcp", str(doc.get("description") or "") if isinstance(doc, dict) else "")
        pend.items += mcp_items(tools if isinstance(tools, list) else [tools])
        return pend
    tools = doc.get("tools") if isinstance(doc, dict) and "tools" in doc else doc
    if isinstance(tools, dict):
        tools = [tools]
    pend = Pending(server, "openai", str(doc.get("description") or "") if isinstance(doc, dict) else "")
    pend.items += openai_items(tools)
    return pend


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

    try:
        return parse_jsonl(text, str(path))
    except ValueError as e:
        raise ToolDocError(str(e)) from None


def import_documents(docs: list[tuple[str, Any]], *, min_tools: int | None = None,
                     min_description_words: int = MIN_DESCRIPTION_WORDS, source: str | None = None,
                     filters: bool = True, result: ImportResult | None = None) -> ImportResult:
    """docs: [(default server name, parsed document)]; documents of one server are merged.
    min_tools None: 3, or 1 for BFCL. source: force one of SOURCES (default: detected per document).
    filters False: no vague-description / min-tools filter (an environment wants every tool)."""
    res = result or ImportResult()
    merged: dict[str, Pending] = {}
    for default, doc in docs:
        pend = parse_doc(doc, default, source)
        if pend.name in merged:
            merged[pend.name].items += pend.items
            merged[pend.name].notes += pend.notes
            merged[pend.name].description = merged[pend.name].description or pend.description
        else:
            merged[pend.name] = pend
    for pend in merged.values():
        finish(pend, res, min_tools, min_description_words, filters=filters)
    return res


def _one(source: str, doc: Any, server: str | None, **kw: Any) -> ImportResult:
    docs = doc if (source == "bfcl" and isinstance(doc, list) and doc and all(_bfcl.is_bfcl_entry(x) for x in doc)) \
        else [doc]
    return import_documents([(server or source, d) for d in docs], source=source, **kw)


def from_openai(doc: Any, server: str | None = None, **kw: Any) -> ImportResult:
    """OpenAI tools (a list, {"tools": [...]}, or one function) → ImportResult (kw: import_documents')."""
    return _one("openai", doc, server, **kw)


def from_mcp(doc: Any, server: str | None = None, **kw: Any) -> ImportResult:
    """An MCP tools/list result (or its `tools` list) → ImportResult; names sanitized with the
    original in `Server.names`, annotations in `Server.annotations`. An environment backend wants
    `filters=False` (every tool the live server lists)."""
    if isinstance(doc, list):
        doc = {"tools": doc}
    return _one("mcp", doc, server, **kw)


def from_openapi(doc: Any, server: str | None = None, **kw: Any) -> ImportResult:
    """An OpenAPI 3.x document (parsed) → ImportResult."""
    return _one("openapi", doc, server, **kw)


def from_bfcl(doc: Any, server: str | None = None, **kw: Any) -> ImportResult:
    """BFCL function docs: one question-file entry, a list of entries (one server each, by id), or
    a list of functions (one server) → ImportResult with BFCL's type map applied."""
    return _one("bfcl", doc, server, **kw)


def import_paths(paths: list[str], **kw: Any) -> ImportResult:
    """Files and `tau2:<domain>` / `sqlite:<domain>` specs → one ImportResult."""
    res = ImportResult()
    docs: list[tuple[str, Any]] = []
    env_kw = {k: v for k, v in kw.items() if k in ("min_tools", "min_description_words")}
    if env_kw.get("min_tools") is None:
        env_kw.pop("min_tools", None)
    for p in paths:
        if re.match(r"^(tau2|sqlite):", p):
            import_env(p, result=res, **env_kw)
            continue
        for doc in load_documents(p):
            docs.append((Path(p).stem, doc))
    if docs:
        import_documents(docs, result=res, **kw)
    return res


def server_from_record(rec: Any, *, min_tools: int | None = MIN_TOOLS,
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
                import_env(f"{env['backend']}:{env['id']}", min_tools=min_tools or MIN_TOOLS,
                           min_description_words=min_description_words, result=res)
                tools = None
            else:
                tools = (env.get("config") or {}).get("tools")
        if tools is not None:
            pend = Pending(name, (astra or {}).get("source") or "openai", (astra or {}).get("description") or "")
            pend.items += openai_items(copy.deepcopy(tools))
            ann = (astra or {}).get("annotations") or {}
            orig = (astra or {}).get("names") or {}
            for it in pend.items:
                n = it.tool["function"].get("name")
                it.original = orig.get(n)
                it.annotations = ann.get(n)
            real = env if env.get("backend") in ("tau2", "sqlite", "python", "mcp") else None
            finish(pend, res, min_tools, min_description_words, env=real,
                   domain=(astra or {}).get("domain"), outputs_hint=(astra or {}).get("outputs"))
        elif not res.servers and not res.drops:
            raise ToolDocError("record has no tools: expected extra.astra.tools (toolkit tools import), "
                               "extra.tool_docs or env with tools")
    return (res.servers[0] if res.servers else None), res.drops
