"""A server being imported (`Pending`: its items before the checks) and `finish`, which sanitizes,
normalizes and filters it into a `Server`: shared by every source (tool docs, real environments)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from toolkit.flows.astra.tooldocs.checks import description_fields, normalize_parameters, schema_fields, vague
from toolkit.flows.astra.tooldocs.schema import (
    MIN_TOOLS,
    Drop,
    ImportResult,
    Item,
    Note,
    Server,
    ToolDocError,
    Unmappable,
    make_tool,
    sanitize_name,
)


def openai_items(items: Iterable[Any]) -> list[Item]:
    out = []
    for t in items:
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict):
            fn = t["function"]
        elif isinstance(t, dict) and "name" in t:
            fn = t
        else:
            raise ToolDocError(f"not an OpenAI function schema: {json.dumps(t)[:120]}")
        params = fn.get("parameters", fn.get("inputSchema"))
        out.append(Item(make_tool(fn.get("name"), fn.get("description"), params),
                        fn.get("outputSchema") or fn.get("x-output-schema")))
    return out


@dataclass
class Pending:
    name: str
    source: str
    description: str = ""
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # server-level notes


def _note(res: ImportResult, server: str, tool: str | None, line: str) -> None:
    kind, _, detail = line.partition(": ")
    res.notes.append(Note(server, tool, kind, detail))


def finish(pend: Pending, res: ImportResult, min_tools: int | None, min_words: int,
           env: dict | None = None, domain: str | None = None, outputs_hint: dict | None = None,
           filters: bool = True) -> Server | None:
    """Sanitize names, normalize and check schemas, apply the filters; the kept server (or None)."""
    if min_tools is None:
        min_tools = 1 if pend.source == "bfcl" else MIN_TOOLS
    if not filters:
        min_tools = 0
    for line in pend.notes:
        _note(res, pend.name, None, line)
    if not pend.items and pend.notes:
        return None   # nothing offered (noted above), nothing dropped
    kept: list[dict] = []
    outputs: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    annotations: dict[str, dict] = {}
    seen: dict[str, str] = {}
    vocab = {k for it in pend.items
             for k in ((((it.tool.get("function") or {}).get("parameters") or {}).get("properties") or {})
                       if isinstance(((it.tool.get("function") or {}).get("parameters") or {}), dict) else {})}
    for it in pend.items:
        fn = it.tool["function"]
        raw = fn.get("name")
        if not isinstance(raw, str) or not raw.strip():
            res.drops.append(Drop(pend.name, repr(raw), "unmappable_schema", f"tool name {raw!r} is not a name"))
            continue
        original = it.original or raw
        name = sanitize_name(raw)
        fn["name"] = name
        reason = it.reason
        extra_notes: list[str] = []
        if reason is None:
            try:
                fn["parameters"], extra_notes = normalize_parameters(fn.get("parameters"))
            except Unmappable as e:
                reason = str(e)
        if reason is not None:
            res.drops.append(Drop(pend.name, name, "unmappable_schema", reason))
            continue
        why = vague(fn.get("description"), name, min_words) if filters else None
        if why:
            res.drops.append(Drop(pend.name, name, "vague_description", why))
            continue
        if name in seen:
            res.drops.append(Drop(pend.name, name, "duplicate_name",
                                  f"a tool with this name was kept earlier (from {seen[name]!r})"
                                  + (f"; this one is {original!r}" if original != name else "")))
            continue
        seen[name] = original
        fn["description"] = " ".join((fn.get("description") or "").split())
        kept.append(it.tool)
        if original != name:
            names[name] = original
            _note(res, pend.name, name, f"renamed: {original!r} → {name!r} (the original is kept for the call)")
        if it.annotations:
            annotations[name] = it.annotations
        for line in it.notes + extra_notes:
            _note(res, pend.name, name, line)
        fields = schema_fields(it.outputs) if it.outputs else []
        fields += (outputs_hint or {}).get(name, []) + (outputs_hint or {}).get(original, [])
        fields += description_fields(fn["description"], vocab)
        outputs[name] = list(dict.fromkeys(fields))
    if len(kept) < min_tools:
        res.drops.append(Drop(pend.name, None, "too_few_tools",
                              f"{len(kept)} usable tool(s) (< {min_tools})" +
                              (f": {', '.join(t['function']['name'] for t in kept)}" if kept else "")))
        return None
    if not kept:
        return None
    unknown = [n for n, f in outputs.items() if not f]
    if unknown:
        _note(res, pend.name, None, f"outputs_unknown: {len(unknown)} tool(s) with no known output fields "
              f"(chain references to them are only 'unverified'): {', '.join(unknown[:10])}"
              + (" ..." if len(unknown) > 10 else ""))
    server = Server(pend.name, kept, outputs, pend.source, domain, pend.description, env, names, annotations)
    res.servers.append(server)
    return server
