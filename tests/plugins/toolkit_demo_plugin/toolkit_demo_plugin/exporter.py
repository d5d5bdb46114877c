"""sft --export demo: {"prompt": first user message, "calls": [tool names], "reward"} per row."""

from __future__ import annotations

from toolkit.formats.rows import exporter


@exporter("demo", help="demo plugin: prompt + called tool names")
def to_demo(row: dict) -> dict:
    msgs = row.get("messages") or []
    prompt = next((m.get("content") for m in msgs if m.get("role") == "user"), None)
    calls = [tc["function"]["name"] for m in msgs for tc in (m.get("tool_calls") or [])]
    return {"prompt": prompt, "calls": calls, "reward": (row.get("meta") or {}).get("reward")}
