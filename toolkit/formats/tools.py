"""OpenAI tool schemas in the shapes prompts and chat templates take: the `function` part, the
compact small-context rendering, the tool list of a training row or a GRPO prompt."""

from __future__ import annotations


TOOL_SCHEMAS = ("full", "compact")


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


def prepare_tools(tools: list, mode: str = "full") -> list[dict]:
    """The tool list as the chat template gets it, in SFT rows and in GRPO prompts alike:
    full = the OpenAI schemas as offered; compact = compact_tool (first
    sentence of each description, parameter names/types/enums; ~5x shorter for the sqlite domains)."""
    if mode not in TOOL_SCHEMAS:
        raise ValueError(f"tool_schema must be one of {TOOL_SCHEMAS}")
    out = [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else dict(t) for t in tools]
    if mode == "compact":
        out = [{"type": "function", "function": compact_tool(t)} for t in out]
    return out
