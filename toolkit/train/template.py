"""The toolkit's chat template: Hermes tool calls in a ChatML frame (Qwen2.5 family layout), with
`{% generation %}` markers so TRL's `assistant_only_loss` can mask everything but the trained turns.

It is used
- by `sft --export hermes` (rendered in Python by `render_hermes`, byte-identical to the Jinja
  template through `tokenizer.apply_chat_template`; tests/test_train_export.py checks it),
- as the chat template of a model that has none (`sft/grpo --chat-template toolkit`) and of the
  tiny offline test model,
- by `grpo` to render prompts (whatever template the model has; this one by default when absent).

Tool-call arguments must be dicts: they are written with `tojson`, so a JSON *string* would come out
double-encoded (`"arguments": "{\\"id\\": 1}"`). `toolkit.train.export` converts them.
"""

from __future__ import annotations

import json
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [IM_START, IM_END, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                  "<tools>", "</tools>", "<|endoftext|>"]

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>")

# Jinja for transformers' apply_chat_template (its environment: trim_blocks, lstrip_blocks, and a
# `tojson` that is json.dumps(ensure_ascii=False)). Every literal newline is written as '\n' in an
# expression so the whitespace is exactly what render_hermes produces.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(sys='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.sys = messages[0]['content'] or '' -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.sys -%}{{- ns.sys + '\\n\\n' -}}{%- endif -%}"
    "{{- '" + TOOLS_HEADER.replace("\n", "\\n") + "' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '" + TOOLS_FOOTER.replace("\n", "\\n") + "<|im_end|>\\n' -}}"
    "{%- elif ns.sys -%}"
    "{{- '<|im_start|>system\\n' + ns.sys + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{- '<|im_start|>user\\n' + (m['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{{- m['content'] or '' -}}"
    "{%- for tc in (m['tool_calls'] or []) -%}"
    "{%- if m['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n' + ({'name': tc['function']['name'], 'arguments': tc['function']['arguments']} | tojson) + '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + (m['content'] or '') + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _tojson(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def render_hermes(messages: list[dict], tools: list[dict] | None = None,
                  add_generation_prompt: bool = False) -> str:
    """CHAT_TEMPLATE rendered in Python (no transformers needed): the Hermes text export."""
    out: list[str] = []
    sys_text = ""
    if messages and messages[0]["role"] == "system":
        sys_text = messages[0].get("content") or ""
    if tools:
        out.append(IM_START + "system\n")
        if sys_text:
            out.append(sys_text + "\n\n")
        out.append(TOOLS_HEADER)
        for t in tools:
            out.append("\n" + _tojson(t))
        out.append(TOOLS_FOOTER + IM_END + "\n")
    elif sys_text:
        out.append(IM_START + "system\n" + sys_text + IM_END + "\n")
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "user":
            out.append(IM_START + "user\n" + (m.get("content") or "") + IM_END + "\n")
        elif role == "assistant":
            out.append(IM_START + "assistant\n" + (m.get("content") or ""))
            for k, tc in enumerate(m.get("tool_calls") or []):
                if m.get("content") or k > 0:
                    out.append("\n")
                out.append("<tool_call>\n" + _tojson({"name": tc["function"]["name"],
                                                      "arguments": tc["function"]["arguments"]})
                           + "\n</tool_call>")
            out.append(IM_END + "\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append(IM_START + "user")
            out.append("\n<tool_response>\n" + (m.get("content") or "") + "\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                out.append(IM_END + "\n")
    if add_generation_prompt:
        out.append(IM_START + "assistant\n")
    return "".join(out)
