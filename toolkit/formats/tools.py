"""OpenAI tool schemas in the shapes prompts and chat templates take: the `function` part, the
compact small-context rendering, the tool list of a training row or a GRPO prompt, and the one
tool-list renderer for prompts (`tools_text`, also a filter in prompt templates)."""

from __future__ import annotations

import hashlib
import json
import re

TOOL_SCHEMAS = ("full", "compact", "minimal")


def tool_function(tool: dict) -> dict:
    """The `function` part of an OpenAI tool schema (accepts bare function dicts too)."""
    if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        return tool["function"]
    return tool


def first_sentence(text: str, limit: int = 160) -> str:
    text = " ".join(str(text or "").split())
    cut = text.find(". ")
    text = text[: cut + 1] if 0 <= cut < limit else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compact_tool(tool: dict) -> dict:
    """A small-context rendering of a tool: first sentence of the description and each parameter
    reduced to its type (anyOf → first non-null alternative), enum and required list. Used for
    small embedded models whose context cannot hold logic-exposed tool descriptions."""
    fn = tool_function(tool)
    params = fn.get("parameters") or {}
    props = {}
    for k, v in (params.get("properties") or {}).items():
        v = v if isinstance(v, dict) else {}
        alts = v.get("anyOf") or v.get("oneOf")
        if alts:
            v = next((a for a in alts if isinstance(a, dict) and a.get("type") not in ("null", None)), alts[0])
        t = v.get("type", "string")
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), "string")
        props[k] = {"type": t, **({"enum": v["enum"]} if v.get("enum") else {})}
    out = {"type": "object", "properties": props}
    if params.get("required"):
        out["required"] = params["required"]
    return {"name": fn.get("name"), "description": first_sentence(fn.get("description", "")), "parameters": out}


# Optional sorting/paging controls of query tools (the sqlite backend's QUERY_CONTROL_PARAMS; a
# test keeps them equal): minimal_tool leaves them out when they are optional.
QUERY_CONTROLS = ("order_by", "order", "limit", "offset")


def minimal_tool(tool: dict) -> dict:
    """The smallest rendering a small model still calls correctly: the name, each parameter as
    `name: type` (an enum as its list of non-null values) and the required names; no descriptions,
    no JSON Schema wrapping, no optional sorting/paging controls (QUERY_CONTROLS). A prompt format
    for text (Hermes) prompts, not an OpenAI schema: the environment still validates calls against
    the full schema. Airline's 11 tools: ~2.4k SmolLM2 tokens compact, ~0.7k minimal."""
    c = compact_tool(tool)
    req = set(c["parameters"].get("required") or [])
    params = {k: ([e for e in v["enum"] if e is not None] if v.get("enum") else v.get("type", "string"))
              for k, v in c["parameters"]["properties"].items() if k in req or k not in QUERY_CONTROLS}
    out = {"name": c["name"], "parameters": params}
    if c["parameters"].get("required"):
        out["required"] = c["parameters"]["required"]
    return out


def render_tool(tool: dict, mode: str | bool | None = "full") -> dict:
    """One tool as the Hermes tool block writes it (one JSON line each, training and inference alike):
    full = {"type": "function", "function": {name, description, parameters}}; compact / True =
    compact_tool; minimal = minimal_tool."""
    fn = tool_function(tool)
    if mode in ("minimal",):
        return {"type": "function", "function": minimal_tool(fn)}
    if mode in (True, "compact"):
        return {"type": "function", "function": compact_tool(fn)}
    return {"type": "function", "function": {"name": fn.get("name"), "description": fn.get("description", ""),
                                             "parameters": fn.get("parameters", {"type": "object", "properties": {}})}}


def prepare_tools(tools: list, mode: str = "full") -> list[dict]:
    """The tool list as the chat template gets it, in SFT rows and in GRPO prompts alike:
    full = the OpenAI schemas as offered; compact = compact_tool (first
    sentence of each description, parameter names/types/enums; ~5x shorter for the sqlite domains);
    minimal = minimal_tool (names, types, enums, required; ~4x shorter again)."""
    if mode not in TOOL_SCHEMAS:
        raise ValueError(f"tool_schema must be one of {TOOL_SCHEMAS}")
    out = [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else dict(t) for t in tools]
    if mode in ("compact", "minimal"):
        out = [render_tool(t, mode) for t in out]
    return out


TOOLS_TEXT_STYLES = ("json", "signatures", "params")


def tools_text(tools: list, style: str = "json", *, indent: int | None = None, compact: bool | str = False,
               unwrap: bool = True, limit: int | None = None, empty: str | None = None) -> str:
    """The tool list as prompt text (also the `tools_text` filter of prompt templates):
    json        the schemas as JSON (`unwrap`: the `function` parts; `compact`: compact_tool each,
                "auto" = compact when the full JSON is over 12,000 characters), `indent` as json.dumps
    signatures  one line per tool, `- name(param: type, optional?: type): first sentence`
    params      one line per tool, `- name: required*, optional`
    `limit` cuts the text there and marks it "...(truncated)"; `empty` is the text for no tools."""
    if not tools and empty is not None:
        return empty
    if style == "json":
        fns = [tool_function(t) if unwrap else t for t in tools]
        s = json.dumps(fns, ensure_ascii=False, indent=indent)
        if compact is True or (compact == "auto" and len(s) > 12000):
            s = json.dumps([compact_tool(f) for f in fns], ensure_ascii=False, indent=indent)
    elif style == "signatures":
        lines = []
        for t in tools:
            f = tool_function(t)
            props = (f.get("parameters") or {}).get("properties") or {}
            req = set((f.get("parameters") or {}).get("required") or [])
            ps = ", ".join(f"{k}{'' if k in req else '?'}: {(v or {}).get('type', 'any')}" for k, v in props.items())
            desc = " ".join(str(f.get("description") or "").split()).split(". ")[0][:200]
            lines.append(f"- {f.get('name')}({ps}): {desc}")
        s = "\n".join(lines)
    elif style == "params":
        lines = []
        for t in tools:
            f = tool_function(t)
            params = f.get("parameters") or {}
            req = set(params.get("required") or [])
            lines.append(f"- {f.get('name')}: " + ", ".join(f"{p}{'*' if p in req else ''}"
                                                          for p in params.get("properties") or {}))
        s = "\n".join(lines)
    else:
        raise ValueError(f"tools_text style must be one of {TOOLS_TEXT_STYLES}, got {style!r}")
    if limit is not None and len(s) > limit:
        s = s[:limit] + "\n...(truncated)"
    return s


# The ladder a prompt walks down when it does not fit the model's context (judges): each level is
# shorter than the one before; `fit_tools_text(tools, level)` renders the tools for a level.
TOOLS_FIT_LADDER = ("json", "compact", "signatures", "signatures", "params", "params")


def fit_tools_text(tools: list, level: int = 0, *, empty: str | None = None) -> str:
    """`tools_text` at fit level `level` (0 = the full JSON, indented; then compact JSON, one
    signature line per tool, one parameter line per tool): the one renderer, made shorter."""
    step = TOOLS_FIT_LADDER[max(0, min(int(level), len(TOOLS_FIT_LADDER) - 1))]
    if step == "json":
        return tools_text(tools, indent=1, empty=empty)
    if step == "compact":
        return tools_text(tools, compact=True, empty=empty)
    return tools_text(tools, step, empty=empty)


# --- tool names: one rule for every source (OpenAPI / MCP / BFCL import, live MCP servers) ---
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def sanitize_name(name: str) -> str:
    """One rule for every source: a valid OpenAI name is kept; otherwise runs of characters outside
    [a-zA-Z0-9_-] become '_' (so `math.factorial` → `math_factorial`, as BFCL does, and
    `fs/read.file` → `fs_read_file`), edges trimmed; a name over 64 characters keeps 55 and a hash."""
    if NAME_RE.match(name):
        return name
    s = re.sub(r"[^a-zA-Z0-9_-]+", "_", name).strip("_") or "tool"
    if len(s) > 64:
        s = s[:55] + "_" + hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
    return s


def sanitize_names(names: list[str]) -> dict[str, str]:
    """{original: OpenAI-safe name} by `sanitize_name`; collisions get a numeric suffix (the first
    keeps the plain name)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for n in names:
        s = sanitize_name(n)
        base, k = s, 2
        while s in used:
            suffix = f"_{k}"
            s = base[:64 - len(suffix)] + suffix
            k += 1
        used.add(s)
        out[n] = s
    return out
