"""The toolkit's chat template: Hermes tool calls in a ChatML frame (Qwen2.5 family layout), with
`{% generation %}` markers so TRL's `assistant_only_loss` can mask everything but the trained turns.

It is used
- by `sft --export hermes` (rendered in Python by `render_hermes`, byte-identical to the Jinja
  template through `tokenizer.apply_chat_template`; tests/train/test_export.py checks it),
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
# The schematic example call the tool block shows: placeholders no model can copy as a real call
# (small models copied a concrete example verbatim); `toolkit.llm.toolcalls` refuses a name written
# as a <placeholder>.
PLACEHOLDER_CALL = {"name": "<function-name>", "arguments": {"<parameter-name>": "<value>"}}
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>\n\n"
                "Example (schematic: put a real function name and real values in place of the <...> parts):\n"
                "<tool_call>\n" + json.dumps(PLACEHOLDER_CALL) + "\n</tool_call>\n\n"
                "Use double quotes for all JSON strings. Results of function calls are given back to you "
                "inside <tool_response></tool_response> tags. When you do not need a function, answer "
                "in plain text without any tags.")
# One tool block for inference and training: the agent's prompt at rollout (toolkit.llm.toolcalls
# render_tools_hermes, hermes protocol) and the SFT/GRPO rendering (CHAT_TEMPLATE, render_hermes)
# are the same text, so a model trained on toolkit rows sees at evaluation exactly what it learned.


def tools_block(tool_lines: list[str]) -> str:
    """The Hermes tool block around one JSON line per tool."""
    return TOOLS_HEADER + "".join("\n" + t for t in tool_lines) + TOOLS_FOOTER


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


def hermes_messages(messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
    """The Hermes text export as plain role/content messages: what CHAT_TEMPLATE writes inside each
    ChatML turn. The tool list goes into the system turn (after the system prompt), assistant
    tool calls become `<tool_call>` JSON blocks after the text, consecutive tool results become
    one user turn of `<tool_response>` blocks; later system messages and unknown roles are
    dropped, as the template drops them. Tool-call arguments are written as given (dicts; see the
    module doc). `render_hermes` frames these in ChatML; `toolkit.flows.simia.format.to_hermes`
    returns them for a text-only chat stack."""
    out: list[dict] = []
    sys_text = ""
    if messages and messages[0]["role"] == "system":
        sys_text = messages[0].get("content") or ""
    if tools:
        parts = [sys_text + "\n\n"] if sys_text else []
        parts.append(TOOLS_HEADER)
        parts += ["\n" + _tojson(t) for t in tools]
        parts.append(TOOLS_FOOTER)
        out.append({"role": "system", "content": "".join(parts)})
    elif sys_text:
        out.append({"role": "system", "content": sys_text})
    tool_turn = False
    for m in messages:
        role = m["role"]
        if role == "tool":
            piece = "<tool_response>\n" + (m.get("content") or "") + "\n</tool_response>"
            if tool_turn:
                out[-1]["content"] += "\n" + piece
            else:
                out.append({"role": "user", "content": piece})
            tool_turn = True
            continue
        tool_turn = False
        if role == "user":
            out.append({"role": "user", "content": m.get("content") or ""})
        elif role == "assistant":
            parts = [m["content"]] if m.get("content") else []
            parts += ["<tool_call>\n" + _tojson({"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]})
                      + "\n</tool_call>" for tc in m.get("tool_calls") or []]
            out.append({"role": "assistant", "content": "\n".join(parts)})
    return out


def render_hermes(messages: list[dict], tools: list[dict] | None = None,
                  add_generation_prompt: bool = False) -> str:
    """CHAT_TEMPLATE rendered in Python (no transformers needed): the Hermes text export, i.e.
    `hermes_messages` framed in ChatML turns."""
    out = [IM_START + m["role"] + "\n" + m["content"] + IM_END + "\n" for m in hermes_messages(messages, tools)]
    if add_generation_prompt:
        out.append(IM_START + "assistant\n")
    return "".join(out)
