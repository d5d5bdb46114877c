"""Training rows (`toolkit.train.export`: {"messages", "tools", ...} with dict arguments) in the
formats other stacks read:
    chat      the row itself (HF chat-template ready: dict arguments)
    openai    OpenAI fine-tuning JSONL: {"messages", "tools"}, arguments as JSON strings (the API's
              wire format; do not feed these to a HF chat template)
    sharegpt  LLaMA-Factory ShareGPT: {"conversations": [{"from": human|gpt|function_call|observation,
              "value"}], "system", "tools" (JSON string)}; an assistant turn with text *and* tool
              calls keeps only the calls (ShareGPT alternation), parallel calls are one JSON list
    hermes    {"text": ...} rendered with toolkit.formats.hermes (ChatML + <tool_call> JSON)
"""

from __future__ import annotations

import copy
import json

from toolkit import registry
from toolkit.formats.hermes import render_hermes

FORMATS = ("chat", "openai", "sharegpt", "hermes")  # the built-in ones; registry.names("exporters") has all


def exporter(name: str, help: str = "", flow: str | None = None):
    """Register `fn(row) -> dict` (one output JSONL object per training row) as `sft --export name`."""
    return registry.register("exporters", name, help=help, flow=flow)


@exporter("chat", help="the training row itself (HF chat-template ready: dict arguments)")
def to_chat(row: dict) -> dict:
    return row



@exporter("openai", help="OpenAI fine-tuning JSONL: messages + tools, arguments as JSON strings")
def to_openai(row: dict) -> dict:
    msgs = copy.deepcopy(row["messages"])
    for m in msgs:
        for tc in m.get("tool_calls") or []:
            tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"], ensure_ascii=False)
        if m["role"] == "tool":
            m.pop("name", None)
    out: dict = {"messages": msgs}
    if row.get("tools"):
        out["tools"] = row["tools"]
    return out


@exporter("sharegpt", help="LLaMA-Factory ShareGPT conversations (function_call / observation turns)")
def to_sharegpt(row: dict) -> dict:
    system = ""
    conv: list[dict] = []
    msgs = row["messages"]
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] == "system":
            system = m.get("content") or ""
        elif m["role"] == "user":
            conv.append({"from": "human", "value": m.get("content") or ""})
        elif m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            if calls:
                objs = [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]} for tc in calls]
                conv.append({"from": "function_call",
                             "value": json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)})
            else:
                conv.append({"from": "gpt", "value": m.get("content") or ""})
        elif m["role"] == "tool":
            results = [m.get("content") or ""]
            while i + 1 < len(msgs) and msgs[i + 1]["role"] == "tool":
                i += 1
                results.append(msgs[i].get("content") or "")
            conv.append({"from": "observation",
                         "value": results[0] if len(results) == 1 else json.dumps(results, ensure_ascii=False)})
        i += 1
    out: dict = {"conversations": conv, "system": system}
    if row.get("tools"):
        out["tools"] = json.dumps([t.get("function", t) for t in row["tools"]], ensure_ascii=False)
    return out


@exporter("hermes", help='{"text"} rendered with the toolkit Hermes template (ChatML + <tool_call>)')
def to_hermes(row: dict) -> dict:
    return {"text": render_hermes(row["messages"], row.get("tools") or None)}


def export_row(row: dict, fmt: str) -> dict:
    e = registry.lookup("exporters", fmt)
    if e is None:
        raise ValueError(f"unknown export format {fmt!r}; choose from {', '.join(registry.names('exporters'))}")
    return e.obj(row)
