"""Constrained decoding of tool calls (`LLMConfig.constrain_tool_calls`), so a small model's call
is always well-formed and names a tool it was offered.

Modes (default `off`):

- `grammar` (hermes text protocol): a GBNF grammar lets the reply be either plain text (which may
  not start with `{` or a code fence and holds no `<`, so nothing in it parses as a call) or one or
  more Hermes blocks `<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>` where N is one of the
  offered tool names and A follows that tool's parameter schema (llama-cpp-python's JSON-schema
  converter; without it, any JSON object). Sent as `grammar` (llama.cpp: llama-cpp-python's server,
  the embedded one, and `llama-server`) and, to other HTTP servers, also as
  `structured_outputs: {"grammar": ...}` (vLLM >= 0.10.2; each server ignores the other's key).
- `json_schema` (hermes text protocol): the reply is one JSON object, either a call
  `{"name": <one of the tools>, "arguments": {...}}` (an `anyOf` with each tool's parameter schema)
  or `{"content": "<plain reply>"}`, which the client unwraps. Sent as OpenAI's
  `response_format: {"type": "json_schema", ...}` (vLLM, llama-server, OpenAI); the embedded
  llama-cpp-python server gets its own `{"type": "json_object", "schema": ...}`.
- `strict` (native protocol): every function tool goes out with `"strict": true` and its parameters
  made strict-compatible the way OpenAI requires (every object closed with
  `additionalProperties: false`, every property required, the optional ones nullable); a null the
  model puts in an optional parameter is dropped again before the call is returned.

With `tool_protocol: auto`, `grammar`/`json_schema` select the hermes protocol and `strict` the
native one; an explicit protocol that contradicts the mode is a ValueError.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

from toolkit.formats.tools import tool_function
from toolkit.io import note_fallback

MODES = ("off", "grammar", "json_schema", "strict")
TEXT_MODES = ("grammar", "json_schema")
SCHEMA_NAME = "tool_call_or_reply"

__all__ = ["MODES", "TEXT_MODES", "call_schema", "drop_strict_nulls", "json_reply_instruction", "protocol_for",
           "request_extras",
           "strict_tools", "tool_grammar", "unoffered_note", "unwrap_json_reply"]


def protocol_for(mode: str, protocol: str) -> str:
    """The tool protocol a constrained client uses (`protocol` as configured: auto|native|hermes)."""
    if mode not in MODES:
        raise ValueError(f"constrain_tool_calls must be one of {', '.join(MODES)}, not {mode!r}")
    if mode in TEXT_MODES:
        if protocol == "native":
            raise ValueError(f"constrain_tool_calls: {mode} constrains the hermes text protocol; "
                             "use strict with tool_protocol native")
        return "hermes"
    if mode == "strict":
        if protocol == "hermes":
            raise ValueError("constrain_tool_calls: strict needs native tools; use grammar or json_schema "
                             "with tool_protocol hermes")
        return "native"
    return protocol


def _tool_specs(tools: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for t in tools or []:
        fn = tool_function(t)
        name = fn.get("name")
        if isinstance(name, str) and name:
            params = fn.get("parameters")
            out.append((name, params if isinstance(params, dict) and params else
                        {"type": "object", "properties": {}}))
    return out


def _hoist_defs(params: dict, prefix: str, defs: dict) -> dict:
    """`params` without its root `$defs` / `definitions`, which move into `defs` under `prefix`ed
    names, its `#/$defs/X` references rewritten to match: nested under `anyOf/.../arguments` a
    tool's local pointers would point at nothing (vLLM: "Pointer '/$defs/FlightInfo' does not
    exist", the tau2 tools)."""
    local = {f"#/{key}/{k}": (prefix + k, v) for key in ("$defs", "definitions")
             if isinstance(params.get(key), dict) for k, v in params[key].items()}
    if not local:
        return params

    def rw(x: Any) -> Any:
        if isinstance(x, list):
            return [rw(v) for v in x]
        if not isinstance(x, dict):
            return x
        return {k: ("#/$defs/" + local[v][0] if k == "$ref" and isinstance(v, str) and v in local else rw(v))
                for k, v in x.items()}

    for new, sub in local.values():
        defs[new] = rw(sub)
    return rw({k: v for k, v in params.items() if k not in ("$defs", "definitions")})


def call_schema(tools: list[dict], with_text: bool = True) -> dict:
    """JSON schema of one call of an offered tool (`anyOf`, one branch per tool: the name as a
    `const`, the arguments as that tool's parameter schema), plus `{"content": str}` when
    `with_text`. The tools' own `$defs` are gathered at the root (`_hoist_defs`)."""
    branches: list[dict] = []
    defs: dict = {}
    for i, (name, params) in enumerate(_tool_specs(tools)):
        branches.append({"type": "object",
                         "properties": {"name": {"const": name}, "arguments": _hoist_defs(params, f"t{i}_", defs)},
                         "required": ["name", "arguments"], "additionalProperties": False})
    if with_text:
        branches.append({"type": "object", "properties": {"content": {"type": "string"}},
                         "required": ["content"], "additionalProperties": False})
    return {"anyOf": branches, **({"$defs": defs} if defs else {})}


def _gbnf_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# A JSON value grammar for when llama-cpp-python's schema converter is not installed.
_GENERIC_JSON = r'''tc-value ::= tc-object | tc-array | tc-string | tc-number | ("true" | "false" | "null") tc-ws
tc-object ::= "{" tc-ws ( tc-string ":" tc-ws tc-value ("," tc-ws tc-string ":" tc-ws tc-value)* )? "}" tc-ws
tc-array ::= "[" tc-ws ( tc-value ("," tc-ws tc-value)* )? "]" tc-ws
tc-string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) )* "\"" tc-ws
tc-number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? tc-ws
tc-ws ::= [ \t\n]{0,20}'''


# Left out of the grammar: annotations, and the bounds whose GBNF expansion is huge (a maxLength of
# 10,000 repeats a rule 10,000 times; llama.cpp refuses such grammars). The tool still checks them.
_ANNOTATIONS = ("description", "title", "examples", "default", "$comment", "deprecated",
                "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern",
                "format", "uniqueItems")
MAX_TOOL_RULES_CHARS = 16_000  # a tool whose argument rules are larger is constrained by name only


def _plain_schema(schema: Any) -> Any:
    """`schema` without annotation keywords (a property that is only a description becomes `{}`,
    any value, which the converter knows, instead of a schema it rejects)."""
    if isinstance(schema, list):
        return [_plain_schema(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _ANNOTATIONS:
            continue
        if k in ("properties", "patternProperties", "$defs", "definitions") and isinstance(v, dict):
            out[k] = {name: _plain_schema(sub) for name, sub in v.items()}
        elif k in ("items", "additionalProperties", "not", "anyOf", "oneOf", "allOf", "prefixItems"):
            out[k] = _plain_schema(v)
        else:
            out[k] = v
    return out


def _call_json_rules(tools: list[dict], use_schema: bool = True) -> tuple[str, str]:
    """(rules, how): GBNF rules defining `tc-json`, one call object of an offered tool (rule
    `tc-json-I` per tool, its name in `tc-json-I-name`); how = "schema" (every tool's arguments
    follow its parameters) or "names" (for some tools only the name is constrained and the arguments
    are any JSON object: llama-cpp-python's converter missing, or a schema it cannot express)."""
    conv = None
    if use_schema:
        try:
            from llama_cpp.llama_grammar import SchemaConverter  # type: ignore

            conv = SchemaConverter(prop_order={"name": 0, "arguments": 1}, allow_fetch=False, dotall=False,
                                   raw_pattern=False)
        except ImportError:
            conv = None
    how = "schema"
    alts, generic = [], []
    for i, (name, params) in enumerate(_tool_specs(tools)):
        rule = f"tc-json-{i}"
        alts.append(rule)
        if conv is not None:
            branch = call_schema([{"type": "function", "function": {"name": name, "parameters": _plain_schema(params)}}],
                                 with_text=False)["anyOf"][0]
            saved = dict(conv._rules)
            try:
                conv.visit(conv.resolve_refs(branch, "tools"), rule)
                added = sum(len(k) + len(v) for k, v in conv._rules.items() if saved.get(k) != v)
                if added <= MAX_TOOL_RULES_CHARS:
                    continue
                conv._rules = saved
            except (ValueError, KeyError, TypeError, AttributeError, NotImplementedError, RecursionError,
                    AssertionError):
                conv._rules = saved  # drop the half-built rules; this tool: names only (counted by the caller)
        how = "names"
        generic.append(f'{rule} ::= "{{" tc-ws "\\"name\\"" tc-ws ":" tc-ws {rule}-name tc-ws "," tc-ws '
                       f'"\\"arguments\\"" tc-ws ":" tc-ws tc-object "}}" tc-ws\n'
                       f'{rule}-name ::= {_gbnf_str(json.dumps(name))}')
    rules = [f"tc-json ::= {' | '.join(alts) if alts else 'tc-object'}"]
    if conv is not None:
        rules.append(conv.format_grammar().strip())
    if generic or not alts:
        rules += generic + [_GENERIC_JSON]
    return "\n".join(rules), how


def tool_grammar(tools: list[dict], use_schema: bool = True) -> str:
    """GBNF: plain text that cannot parse as a call, or Hermes <tool_call> blocks of offered tools."""
    return _grammar(json.dumps(list(tools or []), sort_keys=True, default=str), use_schema)[0]


@functools.lru_cache(maxsize=64)
def _grammar(tools_json: str, use_schema: bool) -> tuple[str, str]:
    rules, how = _call_json_rules(json.loads(tools_json), use_schema)
    head = (
        'root ::= tc-calls | tc-text\n'
        'tc-calls ::= tc-block ("\\n" tc-block)*\n'
        'tc-block ::= "<tool_call>\\n" tc-json "\\n</tool_call>"\n'
        # text: not starting with whitespace, "{" or a fence, and no "<" anywhere (no tags to parse)
        'tc-text ::= [^<{`\\x00-\\x20] [^<]*\n'
    )
    return head + rules.strip() + "\n", how


def request_extras(mode: str, tools: list[dict] | None, embedded: bool) -> dict:
    """Body keys that constrain a hermes-protocol request offering `tools` ({} when none apply)."""
    if not tools or mode not in TEXT_MODES:
        return {}
    if mode == "grammar":
        g, how = _grammar(json.dumps(list(tools), sort_keys=True, default=str), True)
        if how != "schema":
            note_fallback("constrained decoding: some tools' arguments unconstrained (names only)")
        return {"grammar": g} if embedded else {"grammar": g, "structured_outputs": {"grammar": g}}
    schema = _plain_schema(call_schema(tools))  # no annotations/bounds: llama.cpp's converter chokes on both
    if embedded:  # llama-cpp-python's server knows json_object + schema only
        return {"response_format": {"type": "json_object", "schema": schema}}
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": SCHEMA_NAME, "schema": schema}}}


JSON_REPLY_INSTRUCTION = (
    "Reply with exactly one JSON object and nothing else: "
    '{"name": <function-name>, "arguments": <args-json-object>} to call a function, or '
    '{"content": <your reply as a JSON string>} to answer without one.')


def json_reply_instruction(messages: list[dict]) -> list[dict]:
    """json_schema mode: the hermes-rendered messages with the reply format (one JSON object, a call
    or {"content"}) appended to the system message, so the prompt says what the schema enforces."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = (out[0].get("content") or "") + "\n\n" + JSON_REPLY_INSTRUCTION
    else:
        out.insert(0, {"role": "system", "content": JSON_REPLY_INSTRUCTION})
    return out


def unwrap_json_reply(content: str | None) -> str | None:
    """json_schema mode: `{"content": "..."}` -> its text; anything else unchanged (a call object
    is parsed as a bare call by toolkit.llm.toolcalls.parse_tool_calls)."""
    if not content or not content.lstrip().startswith("{"):
        return content
    try:
        obj = json.loads(content)
    except ValueError:
        return content
    if isinstance(obj, dict) and set(obj) == {"content"} and isinstance(obj["content"], str):
        return obj["content"]
    return content


def _strict_schema(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    s = dict(schema)
    for key in ("items", "additionalItems"):
        if isinstance(s.get(key), dict):
            s[key] = _strict_schema(s[key])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(s.get(key), list):
            s[key] = [_strict_schema(x) for x in s[key]]
    props = s.get("properties")
    if s.get("type") == "object" or isinstance(props, dict):
        props = dict(props or {})
        required = set(s.get("required") or [])
        for k, v in list(props.items()):
            v = _strict_schema(v)
            if k not in required and isinstance(v, dict):
                t = v.get("type")
                if isinstance(t, str) and t != "null":
                    v = {**v, "type": [t, "null"]}
                elif isinstance(t, list) and "null" not in t:
                    v = {**v, "type": [*t, "null"]}
                elif t is None:
                    v = {"anyOf": [v, {"type": "null"}]}
            props[k] = v
        s["properties"] = props
        s["required"] = list(props)
        s["additionalProperties"] = False
    return s


def strict_tools(tools: list[dict]) -> list[dict]:
    """The tools as OpenAI strict function tools (`"strict": true`, strict-compatible parameters)."""
    out = []
    for t in tools or []:
        fn = copy.deepcopy(tool_function(t))
        fn["parameters"] = _strict_schema(fn.get("parameters") or {"type": "object", "properties": {}})
        fn["strict"] = True
        out.append({"type": "function", "function": fn})
    return out


def drop_strict_nulls(name: str | None, args: dict, tools: list[dict] | None) -> dict:
    """Drop the nulls a strict tool forced into parameters the original schema left optional."""
    for tname, params in _tool_specs(tools or []):
        if tname == name:
            required = set(params.get("required") or [])
            return {k: v for k, v in args.items() if v is not None or k in required}
    return args


def unoffered_note(mode: str, calls: list[dict], tools: list[dict] | None) -> str | None:
    """A parse-error note when a constrained reply still calls a tool that was not offered (a
    server that ignored the constraint); the calls themselves are kept, to be rejected downstream
    as unknown tools exactly as without constraints."""
    if mode == "off" or not tools:
        return None
    names = {n for n, _ in _tool_specs(tools)}
    bad = [c.get("function", {}).get("name") for c in calls if c.get("function", {}).get("name") not in names]
    if not bad:
        return None
    return (f"constrained decoding ({mode}) was on, yet the reply calls {', '.join(repr(b) for b in bad)}, "
            "not an offered tool: the server did not apply the constraint")
