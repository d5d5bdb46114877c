"""OpenAPI 3.x operations → tools.

Inputs: path, query, header and cookie parameters (``schema`` or ``content``) and the request body:
``application/json`` (or ``*/*``, ``+json``) first, else ``application/x-www-form-urlencoded``, else
``multipart/form-data`` (file fields become strings, marked "file content"), else any other media
type (text, XML, octet-stream) as one string argument ``body``. An object body's properties become
arguments (one that collides with a parameter is renamed ``body_<name>``, noted); a non-object body
(an array, a string) or an open object becomes the single argument ``body``. ``allOf`` is merged,
top-level ``oneOf``/``anyOf`` flattened (see schema.py), recursive ``$ref``s cut at a depth. The 2xx
JSON response schema gives the output fields; a response that cannot be read only loses those
fields (noted), never the tool.
"""

from __future__ import annotations

from typing import Any

from toolkit.flows.astra.tooldocs.schema import (
    Item,
    ToolDocError,
    Unmappable,
    flatten_top,
    make_tool,
    merge_all_of,
    resolve_refs,
    sanitize_name,
)

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def operations(doc: dict) -> list[Item]:
    """One Item per operation of an OpenAPI 3 document (unmappable ones carry their reason)."""
    out: list[Item] = []
    paths = doc.get("paths") or {}
    if not isinstance(paths, dict):
        raise ToolDocError("OpenAPI paths must be an object")
    for path, item in paths.items():
        where = sanitize_name(f"path {path}")
        if not isinstance(item, dict):
            out.append(Item(make_tool(where, "", None), reason=f"path item {path!r} is not an object"))
            continue
        if "$ref" in item:
            try:
                item = resolve_refs(item, doc)
            except Unmappable as e:
                out.append(Item(make_tool(where, "", None), reason=f"path item {path!r}: {e}"))
                continue
        common = item.get("parameters") or []
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            raw_name = op.get("operationId") or f"{method} {path}"
            name = sanitize_name(str(raw_name))
            desc = op.get("description") or op.get("summary") or ""
            if op.get("summary") and op.get("description") and op["summary"] not in op["description"]:
                desc = f"{op['summary']}. {op['description']}"
            original = str(raw_name) if op.get("operationId") else f"{method.upper()} {path}"
            it = Item(make_tool(name, desc, None), original=original if original != name else None)
            try:
                it.tool["function"]["parameters"] = _params(doc, common + (op.get("parameters") or []),
                                                            op.get("requestBody"), it.notes)
            except Unmappable as e:
                it.reason = str(e)
            try:
                it.outputs = _response(doc, op.get("responses") or {}, it.notes)
            except Unmappable as e:
                it.notes.append(f"response_unmapped: no output fields from the response schema: {e}")
            out.append(it)
    return out


def _cut_notes(cuts: list, notes: list[str], where: str) -> None:
    if cuts:
        notes.append(f"recursion_cut: {where}: recursive {', '.join(sorted(set(cuts)))} cut after a depth")


def _pick_media(content: dict) -> tuple[str, Any] | None:
    def base(k: str) -> str:
        return k.split(";")[0].strip().lower()

    for k, v in content.items():
        if base(k) in ("application/json", "*/*") or base(k).endswith("+json"):
            return base(k), v
    for ft in FORM_TYPES:
        for k, v in content.items():
            if base(k) == ft:
                return ft, v
    for k, v in content.items():
        return base(k), v
    return None


def _file_field(spec: Any) -> bool:
    return isinstance(spec, dict) and (spec.get("format") in ("binary", "base64", "byte")
                                       or "contentMediaType" in spec or "contentEncoding" in spec)


def _params(doc: dict, params: list, body: Any, notes: list[str]) -> dict:
    props: dict = {}
    required: list = []
    cuts: list = []
    for p in params:
        p = resolve_refs(p, doc, cuts=cuts)
        if not isinstance(p, dict) or "name" not in p:
            raise Unmappable("parameter without a name")
        if p.get("in") not in ("path", "query", "header", "cookie"):
            raise Unmappable(f"parameter {p.get('name')!r} has unknown location {p.get('in')!r}")
        schema = p.get("schema")
        if schema is None and isinstance(p.get("content"), dict) and p["content"]:
            schema = (next(iter(p["content"].values())) or {}).get("schema")
        if not isinstance(schema, dict):
            raise Unmappable(f"parameter {p['name']!r} has no schema")
        schema = merge_all_of(dict(schema))
        if p.get("description") and "description" not in schema:
            schema["description"] = p["description"]
        props[p["name"]] = schema
        if (p.get("required") or p.get("in") == "path") and p["name"] not in required:
            required.append(p["name"])
    _cut_notes(cuts, notes, "parameters")
    if body is not None:
        cuts = []
        body = resolve_refs(body, doc, cuts=cuts)
        _cut_notes(cuts, notes, "request body")
        content = (body or {}).get("content") or {}
        picked = _pick_media(content) if isinstance(content, dict) else None
        if picked is None:
            raise Unmappable("request body has no content")
        media, mt = picked
        schema = (mt or {}).get("schema") if isinstance(mt, dict) else None
        is_json = media in ("application/json", "*/*") or media.endswith("+json")
        if not isinstance(schema, dict):
            if is_json or media in FORM_TYPES:
                schema = {"type": "object"}
            else:
                schema = {"type": "string"}
        schema = merge_all_of(schema)
        schema, flat = flatten_top(schema)
        if flat:
            notes.append("one_of_flattened: request body: " + flat)
        body_required = bool((body or {}).get("required"))
        is_object = schema.get("type", "object" if "properties" in schema else None) == "object"
        if not (is_json or media in FORM_TYPES) and not is_object:
            schema = {**schema, "type": schema.get("type", "string")}
            schema["description"] = (schema.get("description") or "") + f" (the raw request body, {media})"
            schema["description"] = schema["description"].strip()
        if is_object and isinstance(schema.get("properties"), dict) and schema["properties"]:
            for k, v in schema["properties"].items():
                if media in FORM_TYPES and isinstance(v, dict):
                    v = dict(v)
                    if _file_field(v):
                        v.setdefault("type", "string")
                        v["description"] = ((v.get("description") or "") + " (file content)").strip()
                    elif "type" not in v and not any(c in v for c in ("enum", "const", "anyOf", "oneOf")):
                        v["type"] = "string"   # a form field without a schema type is text
                key = k
                if k in props:
                    key = f"body_{k}"
                    notes.append(f"renamed: body property {k!r} collides with a parameter: sent as {key!r}")
                    if key in props:
                        raise Unmappable(f"body property {k!r} collides with a parameter")
                props[key] = v
                if k in (schema.get("required") or []) and key not in required:
                    required.append(key)
        elif is_object and schema.get("additionalProperties") is False:
            pass   # an object body that admits nothing: no body arguments
        else:
            if "body" in props:
                raise Unmappable("request body argument 'body' collides with a parameter")
            props["body"] = schema
            if body_required:
                required.append("body")
            notes.append(f"body_argument: {media} body ({schema.get('type', 'open')}) sent as one argument 'body'")
    out: dict = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _response(doc: dict, responses: dict, notes: list[str]) -> dict | None:
    for code in sorted(responses, key=str):
        if not str(code).startswith("2"):
            continue
        cuts: list = []
        r = resolve_refs(responses[code], doc, cuts=cuts)
        _cut_notes(cuts, notes, "response")
        content = (r or {}).get("content") or {}
        for k, v in content.items():
            if "json" in k and isinstance(v, dict) and isinstance(v.get("schema"), dict):
                return merge_all_of(v["schema"])
    return None
