"""Tool-call text protocols and JSON repair.

Models that are served without a native tool parser (the embedded SmolLM2, llama.cpp servers
without a function-calling chat format, vLLM without `--tool-call-parser`) write their tool calls
as text.  This module renders the tool list into a system prompt in the Hermes format and parses
the calls back out of the reply:

    <tool_call>
    {"name": "get_order", "arguments": {"order_id": "W123"}}
    </tool_call>

Also accepted on input: `<function>{"name": ..., "arguments": ...}</function>`,
`<function=get_order>{"order_id": "W123"}</function>` (Llama 3.1 style), Qwen3-Coder's
`<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>` and a reply that
is nothing but a JSON object `{"name": ..., "arguments": {...}}` (optionally in a code fence).

`repair_json` fixes the common breakages of model-written JSON (unescaped inner quotes, trailing
commas, missing closing braces/brackets, single quotes, unquoted keys, Python literals, a missing
opening brace, trailing junk) and raises `ValueError` with a clear message when it can't.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from toolkit.formats.hermes import PLACEHOLDER_CALL, tools_block
from toolkit.formats.tools import render_tool

__all__ = [
    "render_tools_hermes",
    "parse_tool_calls",
    "repair_json",
    "to_hermes_messages",
    "tool_calls_to_text",
    "looks_like_tool_call",
    "new_call_id",
    "example_tool_call",
    "fewshot_messages",
]

# ----------------------------------------------------------------------------------------------
# Rendering


def render_tools_hermes(tools: list[dict], compact: bool | str = False) -> str:
    """System-prompt block describing `tools` and the exact Hermes tool-call format (the same text
    the toolkit chat template writes for training rows: toolkit.formats.hermes). `compact` (True /
    "compact") shrinks each schema (compact_tool), "minimal" further (minimal_tool)."""
    lines = [json.dumps(render_tool(t, compact or "full"), ensure_ascii=False) for t in tools or []]
    return tools_block(lines)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def decoded_call(tc: dict, repair: bool = True) -> tuple[Any, Any]:
    """(name, arguments) of an OpenAI-shaped (or flat {name, arguments}) tool call, the arguments
    decoded from their JSON string (an empty one is {}; repaired when `repair`); a string that does
    not decode is kept as it is."""
    fn = tc.get("function", tc)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            if repair:
                try:
                    args = repair_json(args)
                except ValueError:
                    pass  # keep the raw string
    return fn.get("name"), args


def tool_calls_to_text(tool_calls: list[dict]) -> str:
    """Render OpenAI-shaped tool calls as Hermes `<tool_call>` blocks."""
    blocks = []
    for tc in tool_calls or []:
        name, args = decoded_call(tc)
        blocks.append("<tool_call>\n" + json.dumps({"name": name, "arguments": args},
                                                   ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        out = []
        for part in content:
            if isinstance(part, dict):
                out.append(str(part.get("text", "")))
            else:
                out.append(str(part))
        return "".join(out)
    return str(content)


# The example call shown in the prompt and the few-shot exchange: schematic, never a real tool or
# plausible values (small models copied the old example, a real tool called with "example"
# arguments, verbatim). Copied as it is, it does not parse as a call: `_mk_call` rejects a name
# written as a <placeholder>.
_PLACEHOLDER_RE = re.compile(r"^\s*<[^<>]*>\s*$")


def example_tool_call(tool: dict | None = None) -> dict:
    """The schematic example call ({"name", "arguments"}) the prompt shows; `tool` is ignored (the
    example never names a real tool)."""
    return json.loads(json.dumps(PLACEHOLDER_CALL))


def fewshot_messages(tools: list[dict]) -> list[dict]:
    """One example exchange (user asks for the format, assistant answers with a schematic
    <tool_call>) that teaches small models the format better than instructions alone."""
    return [{"role": "user", "content": "Show the exact format of a function call."},
            {"role": "assistant",
             "content": "<tool_call>\n" + json.dumps(example_tool_call()) + "\n</tool_call>"}]


def to_hermes_messages(messages: list[dict], tools: list[dict] | None = None,
                       fewshot: bool = False, compact: bool = False) -> list[dict]:
    """Rewrite a conversation for a model that only speaks text.

    - the Hermes tool block is appended to the first system message (or a system message is
      inserted) when `tools` is given; with `fewshot`, an example exchange calling the first
      tool follows the system message;
    - assistant `tool_calls` become `<tool_call>` blocks in the assistant content;
    - `tool` messages become a user message holding `<tool_response>` blocks (consecutive tool
      results are merged into one user turn).
    """
    out: list[dict] = []
    block = render_tools_hermes(tools, compact=compact) if tools else None
    placed = block is None
    for m in messages:
        role = m.get("role")
        if role == "system" and not placed:
            out.append({"role": "system", "content": (_content_text(m.get("content")) + "\n\n" + block).strip()})
            placed = True
        elif role == "assistant":
            text = _content_text(m.get("content"))
            calls = m.get("tool_calls") or []
            if calls:
                text = (text + "\n" if text else "") + tool_calls_to_text(calls)
            out.append({"role": "assistant", "content": text})
        elif role in ("tool", "function"):
            name = m.get("name")
            head = f'<tool_response name="{name}">' if name else "<tool_response>"
            piece = f"{head}\n{_content_text(m.get('content'))}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + piece
            else:
                out.append({"role": "user", "content": piece, "_tool_turn": True})
        else:
            out.append({"role": role, "content": _content_text(m.get("content"))})
    if not placed:
        out.insert(0, {"role": "system", "content": block})
    for m in out:
        m.pop("_tool_turn", None)
    if fewshot and tools:
        at = 1 if out and out[0]["role"] == "system" else 0
        out[at:at] = fewshot_messages(tools)
    return out


# ----------------------------------------------------------------------------------------------
# JSON repair


class _Incomplete(Exception):
    pass


_NUM_RE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT_RE = re.compile(r"[A-Za-z_$][\w$\-]*")
_LITERALS = {"true": True, "false": False, "null": None, "True": True, "False": False,
             "None": None}
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n",
            "r": "\r", "t": "\t"}


class _LenientParser:
    """Recursive-descent JSON parser that tolerates the usual LLM breakages."""

    def __init__(self, s: str):
        self.s = s
        self.i = 0
        self.n = len(s)

    # -- helpers
    def ws(self) -> None:
        s, n = self.s, self.n
        while self.i < n:
            c = s[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif s.startswith("//", self.i):
                j = s.find("\n", self.i)
                self.i = n if j < 0 else j + 1
            else:
                break

    def peek_after_ws(self, j: int) -> int:
        s, n = self.s, self.n
        while j < n and s[j] in " \t\r\n":
            j += 1
        return j

    def fail(self, msg: str) -> ValueError:
        lo = max(0, self.i - 30)
        snippet = self.s[lo:self.i + 30]
        return ValueError(f"{msg} at position {self.i} (near {snippet!r})")

    # -- grammar
    def value(self, role: str) -> Any:
        self.ws()
        if self.i >= self.n:
            raise _Incomplete()
        c = self.s[self.i]
        if c == "{":
            return self.obj()
        if c == "[":
            return self.arr()
        if c in "\"'":
            return self.string(c, role)
        m = _NUM_RE.match(self.s, self.i)
        if m and (c.isdigit() or c in "-."):
            self.i = m.end()
            txt = m.group(0)
            try:
                if re.fullmatch(r"-?\d+", txt):
                    return int(txt)
                return float(txt)
            except ValueError:
                raise self.fail(f"bad number {txt!r}") from None
        m = _IDENT_RE.match(self.s, self.i)
        if m and m.group(0) in _LITERALS:
            self.i = m.end()
            return _LITERALS[m.group(0)]
        raise self.fail(f"unexpected character {c!r}")

    def obj(self) -> dict:
        self.i += 1
        out: dict = {}
        while True:
            self.ws()
            if self.i >= self.n:
                return out  # missing closing brace
            c = self.s[self.i]
            if c == "}":
                self.i += 1
                return out
            if c == ",":  # trailing / doubled comma
                self.i += 1
                continue
            if c in "\"'":
                key = self.string(c, "key")
            else:
                m = _IDENT_RE.match(self.s, self.i)
                if not m:
                    raise self.fail(f"expected a key, found {c!r}")
                key = m.group(0)
                self.i = m.end()
            self.ws()
            if self.i >= self.n:
                return out
            if self.s[self.i] == ":":
                self.i += 1
            elif self.s[self.i] == "=":
                self.i += 1
            else:
                raise self.fail(f"expected ':' after key {key!r}")
            try:
                out[key] = self.value("obj")
            except _Incomplete:
                out[key] = None
                return out
            self.ws()
            if self.i >= self.n:
                return out
            c = self.s[self.i]
            if c == ",":
                self.i += 1
            elif c == "}":
                continue
            elif c in "\"'" or _IDENT_RE.match(self.s, self.i):
                continue  # missing comma between members
            elif c == "]":  # mismatched bracket: treat as the end of this object
                self.i += 1
                return out
            else:
                raise self.fail(f"expected ',' or '}}', found {c!r}")

    def arr(self) -> list:
        self.i += 1
        out: list = []
        while True:
            self.ws()
            if self.i >= self.n:
                return out
            c = self.s[self.i]
            if c == "]":
                self.i += 1
                return out
            if c == ",":
                self.i += 1
                continue
            try:
                out.append(self.value("arr"))
            except _Incomplete:
                return out
            self.ws()
            if self.i >= self.n:
                return out
            c = self.s[self.i]
            if c == ",":
                self.i += 1
            elif c == "]":
                continue
            elif c == "}":
                self.i += 1
                return out
            elif c in "\"'{[-" or c.isdigit() or _IDENT_RE.match(self.s, self.i):
                continue  # missing comma
            else:
                raise self.fail(f"expected ',' or ']', found {c!r}")

    def _is_closing(self, j: int, q: str, role: str) -> bool:
        """Is the quote at `j` the end of the string (vs. an unescaped inner quote)?"""
        s, n = self.s, self.n
        k = self.peek_after_ws(j + 1)
        if k >= n:
            return True
        c = s[k]
        if role == "key":
            return c in ":="
        if role == "top":
            return True
        closer = "}" if role == "obj" else "]"
        if c == closer or c in "}]":
            return True
        if c == ",":
            m = self.peek_after_ws(k + 1)
            if m >= n:
                return True
            d = s[m]
            if role == "obj":
                if d in "\"'":
                    end = s.find(d, m + 1)
                    if end < 0:
                        return True
                    return self.peek_after_ws(end + 1) < n and s[self.peek_after_ws(end + 1)] in ":="
                if d in "}":
                    return True
                mi = _IDENT_RE.match(s, m)
                if mi:
                    a = self.peek_after_ws(mi.end())
                    return a < n and s[a] == ":"
                return False
            # array element
            if d in "\"'{[]-" or d.isdigit():
                return True
            mi = _IDENT_RE.match(s, m)
            return bool(mi and mi.group(0) in _LITERALS)
        if c in "\"'" and role == "obj":  # missing comma before the next key?
            end = s.find(c, k + 1)
            if end > 0:
                a = self.peek_after_ws(end + 1)
                return a < n and s[a] == ":"
        return False

    def string(self, q: str, role: str) -> str:
        s, n = self.s, self.n
        self.i += 1
        buf: list[str] = []
        while self.i < n:
            ch = s[self.i]
            if ch == "\\":
                if self.i + 1 >= n:
                    self.i += 1
                    break
                e = s[self.i + 1]
                if e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", s[self.i + 2:self.i + 6] or ""):
                    code = int(s[self.i + 2:self.i + 6], 16)
                    self.i += 6
                    # surrogate pair
                    if 0xD800 <= code < 0xDC00 and s.startswith("\\u", self.i) and \
                            re.fullmatch(r"[0-9a-fA-F]{4}", s[self.i + 2:self.i + 6] or ""):
                        low = int(s[self.i + 2:self.i + 6], 16)
                        if 0xDC00 <= low < 0xE000:
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                            self.i += 6
                    buf.append(chr(code))
                    continue
                if e in _ESCAPES:
                    buf.append(_ESCAPES[e])
                else:  # invalid escape such as "\d": keep it literally
                    buf.append("\\" + e)
                self.i += 2
                continue
            if ch == q:
                if self._is_closing(self.i, q, role):
                    self.i += 1
                    return "".join(buf)
                buf.append(ch)
                self.i += 1
                continue
            buf.append(ch)
            self.i += 1
        if role == "key":
            raise self.fail("unterminated or malformed key string")
        return "".join(buf)  # unterminated value string (truncated output): close it


_FENCE_RE = re.compile(r"^\s*```[\w+-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _strip_fence(s: str) -> str:
    m = _FENCE_RE.match(s)
    if m:
        return m.group(1)
    s2 = s.strip()
    if s2.startswith("```"):  # opening fence without a closing one
        s2 = re.sub(r"^```[\w+-]*\s*", "", s2)
    return s2


def repair_json(s: str) -> Any:
    """Parse `s` as JSON, repairing common LLM breakages; raises ValueError when it can't."""
    if not isinstance(s, str):
        raise ValueError(f"repair_json expects a string, got {type(s).__name__}")
    try:
        return json.loads(s)
    except (ValueError, TypeError):
        pass
    text = _strip_fence(s).strip()
    if not text:
        raise ValueError("cannot repair JSON: the text is empty")
    try:
        return json.loads(text)
    except ValueError:
        pass
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if starts:
        start = min(starts)
        # A leading `"key": value` without the opening brace.
        if start > 0 and re.match(r"\s*[\"']?[A-Za-z_][\w\-]*[\"']?\s*:", text):
            text, start = "{" + text, 0
    elif re.match(r"\s*[\"']?[A-Za-z_][\w\-]*[\"']?\s*:", text):
        text, start = "{" + text, 0
    else:
        raise ValueError(f"cannot repair JSON: no object or array found in {text[:80]!r}")
    p = _LenientParser(text)
    p.i = start
    try:
        out = p.value("top")
    except _Incomplete:
        raise ValueError(f"cannot repair JSON: input ends before any value in {text[:80]!r}") from None
    except ValueError as exc:
        raise ValueError(f"cannot repair JSON: {exc}") from None
    except RecursionError:
        raise ValueError("cannot repair JSON: nesting too deep") from None
    return out


# ----------------------------------------------------------------------------------------------
# Parsing tool calls out of text

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
_FUNCTION_RE = re.compile(
    r"<function(?:=([^>\s]+)|\s+name=[\"']([^\"']+)[\"'])?\s*>(.*?)(?:</function>|(?=<function[=>\s])|\Z)",
    re.DOTALL)
_PARAM_RE = re.compile(r"<parameter=([^>\s]+)\s*>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_TAG_HINT_RE = re.compile(r"<tool_call>|<function[=>\s]")


def looks_like_tool_call(text: str | None) -> bool:
    return bool(text) and bool(_TAG_HINT_RE.search(text))


def _mk_call(name: Any, args: Any) -> dict:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"tool call has no function name (got {name!r})")
    if _PLACEHOLDER_RE.match(name):
        raise ValueError(f"tool call names the prompt's placeholder {name!r} (the schematic example copied), "
                         "not a function")
    if args is None or args == "":
        args = {}
    if isinstance(args, str):
        args = repair_json(args)
    if not isinstance(args, dict):
        raise ValueError(f"arguments of {name!r} must be a JSON object, got {type(args).__name__}")
    return {"id": new_call_id(), "type": "function",
            "function": {"name": name.strip(), "arguments": json.dumps(args, ensure_ascii=False)}}


def call_pairs(obj: Any) -> list[tuple[Any, Any]]:
    """The (name, arguments) pairs of a decoded tool-call JSON value, as written, unchecked: a call
    object in any common shape (OpenAI `{"function": {"name", "arguments"}}`, `{"name"|"function"|
    "tool", "arguments"|"parameters"|"args"|"input"}`, `{"tool_calls": [...]}`) or a list of them.
    ValueError when a call is not a JSON object."""
    if isinstance(obj, list):
        out = []
        for o in obj:
            out.extend(call_pairs(o))
        return out
    if not isinstance(obj, dict):
        raise ValueError(f"tool call must be a JSON object, got {type(obj).__name__}")
    if isinstance(obj.get("tool_calls"), list):
        return call_pairs(obj["tool_calls"])
    if isinstance(obj.get("function"), dict):
        fn = obj["function"]
        return [(fn.get("name"), fn.get("arguments", fn.get("parameters")))]
    name = obj.get("name", obj.get("function", obj.get("tool")))
    for k in ("arguments", "parameters", "args", "input"):
        if k in obj:
            return [(name, obj[k])]
    return [(name, {})]


def _calls_from_obj(obj: Any) -> list[dict]:
    return [_mk_call(name, args) for name, args in call_pairs(obj)]


def _parse_xml_params(body: str) -> dict:
    args = {}
    for m in _PARAM_RE.finditer(body):
        raw = m.group(2).strip()
        try:
            args[m.group(1)] = json.loads(raw)
        except ValueError:
            args[m.group(1)] = raw
    return args


def _parse_function_block(name: str | None, body: str) -> list[dict]:
    body = _strip_fence(body).strip()
    if name:
        if "<parameter=" in body:
            return [_mk_call(name, _parse_xml_params(body))]
        return [_mk_call(name, repair_json(body) if body else {})]
    return _calls_from_obj(repair_json(body))


def _parse_tool_call_body(body: str) -> list[dict]:
    body = body.strip()
    fm = _FUNCTION_RE.search(body)
    if fm and body.lstrip().startswith("<function"):
        calls = []
        for m in _FUNCTION_RE.finditer(body):
            calls.extend(_parse_function_block(m.group(1) or m.group(2), m.group(3)))
        return calls
    return _calls_from_obj(repair_json(_strip_fence(body)))


def parse_tool_calls(text: str | None) -> tuple[str | None, list[dict], str | None]:
    """Extract tool calls from model text.

    Returns `(content, tool_calls, error)`: `content` is the text with the tool-call blocks
    removed (None when nothing is left), `tool_calls` are in OpenAI shape with fresh ids and
    JSON-string arguments, `error` describes every block that looked like a tool call but could
    not be parsed or repaired (None when all were fine).
    """
    if not text:
        return (text or None), [], None
    calls: list[dict] = []
    errors: list[str] = []
    spans: list[tuple[int, int]] = []

    for m in _TOOL_CALL_RE.finditer(text):
        spans.append(m.span())
        body = m.group(1)
        try:
            calls.extend(_parse_tool_call_body(body))
        except ValueError as exc:
            errors.append(f"<tool_call> block {body.strip()[:120]!r}: {exc}")

    if not spans:
        for m in _FUNCTION_RE.finditer(text):
            spans.append(m.span())
            try:
                calls.extend(_parse_function_block(m.group(1) or m.group(2), m.group(3)))
            except ValueError as exc:
                errors.append(f"<function> block {m.group(3).strip()[:120]!r}: {exc}")

    if spans:
        rest, last = [], 0
        for a, b in spans:
            rest.append(text[last:a])
            last = b
        rest.append(text[last:])
        content = "".join(rest).strip()
        # drop stray closing tags left by a model that repeated them
        content = re.sub(r"</?(tool_call|function)>", "", content).strip()
    else:
        content = text.strip()
        # A reply that is nothing but {"name": ..., "arguments": {...}} (optionally fenced).
        bare = _strip_fence(content)
        if bare.startswith("{") and '"name"' in bare and re.search(r'"(arguments|parameters)"', bare):
            try:
                obj = repair_json(bare)
                if isinstance(obj, dict) and "name" in obj and ("arguments" in obj or "parameters" in obj):
                    calls = _calls_from_obj(obj)
                    content = ""
            except ValueError:
                pass
    error = "; ".join(errors) if errors else None
    return (content or None), calls, error
