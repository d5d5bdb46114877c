"""The input check behind the fast path: which lines may hold what pydantic-core lets through
(NaN/Infinity, numbers overflowing to inf), the strict re-parse that names the field, and the
texts a bad line is rejected with."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from toolkit.io.lines import dump_line
from toolkit.schema import Record

# ----------------------------------------------------------------------------------------------
# what pydantic-core's JSON parser lets through into free-form fields but a record must not carry:
# NaN/Infinity (not JSON) and numbers that overflow to inf (1e400); pydantic would write them back
# as null. The slow path (bad lines only) parses with json.loads, which also names the field of an
# integer over Python's int-str limit, a lone surrogate or a value nested too deep.

_MAX_INT_DIGITS = (getattr(sys, "get_int_max_str_digits", lambda: 0)() or 4300)  # 0 = unlimited: keep 4300
# A float overflows to inf only with an exponent of 3+ digits (1e400) or 200+ digits before it
# (an exponent <= 99 then can reach 1e308). One translate (digits -> "0", "E" -> "e", JSON's
# number ends -> ",", "+" dropped) and a few substring searches find the lines that may hold one;
# only those are parsed again (cost: docs/performance.md, "The input check ...").
_NUM_TR = bytes.maketrans(b"123456789E]} \t\r\n", b"000000000e,,,,,,")
_LONG_RUN = b"0" * 200


_SURROGATE = re.compile("[\ud800-\udfff]")


class _Bad:
    """Marks a value the strict reader refuses, found later with its path (the field)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def _strict_int(s: str) -> Any:
    digits = len(s.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        return _Bad(f"integer of {digits} digits (more than {_MAX_INT_DIGITS}, Python's int limit)")
    return int(s)


def _strict_float(s: str) -> Any:
    f = float(s)
    if math.isinf(f):
        return _Bad(f"{s[:40]}{'...' if len(s) > 40 else ''} overflows to infinity (not a finite number)")
    return f


def _strict_constant(c: str) -> Any:
    return _Bad(f"{c} is not a JSON number (NaN/Infinity are refused; the record schema wants finite numbers)")


def strict_loads(raw: bytes | str) -> Any:
    """json.loads that marks NaN/Infinity, numbers overflowing to inf and over-long integers as `_Bad` (see `find_bad`).
    Raises ValueError (not JSON, bad UTF-8) or RecursionError (nesting too deep)."""
    return json.loads(raw, parse_constant=_strict_constant, parse_int=_strict_int, parse_float=_strict_float)


def find_bad(obj: Any) -> tuple[str, str] | None:
    """(field path, reason) of the first `_Bad` in a `strict_loads` result (iterative: no recursion)."""
    stack: list[tuple[tuple, Any]] = [((), obj)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, _Bad):
            return ".".join(str(p) for p in path) or "(record)", x.why
        if isinstance(x, str):
            m = _SURROGATE.search(x)
            if m:
                return (".".join(str(p) for p in path) or "(record)",
                        f"lone surrogate \\u{ord(m.group()):04x} in a string (not valid Unicode)")
        elif isinstance(x, dict):
            for k in x:
                if _SURROGATE.search(k):
                    return ".".join(str(p) for p in path) or "(record)", "lone surrogate in a key (not valid Unicode)"
            stack.extend(((*path, k), v) for k, v in reversed(list(x.items())))
        elif isinstance(x, list):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(x))))
    return None


_PARSE_DEPTH = 200  # pydantic-core's JSON recursion limit (json.loads gives up near 1000)


def _too_deep(obj: Any, limit: int = _PARSE_DEPTH - 10) -> tuple[str, str] | None:
    """(field, reason) for a value nested too deep for the fast parser: the field is the path
    down to the first container that is more than a few levels deep (iterative walk)."""
    stack: list[tuple[tuple, Any]] = [((), obj)]
    while stack:
        path, x = stack.pop()
        if len(path) >= limit:
            return (".".join(str(p) for p in path[:2]) or "(record)",
                    f"nested deeper than {_PARSE_DEPTH - 10} levels (the reader's recursion limit)")
        if isinstance(x, dict):
            stack.extend(((*path, k), v) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend(((*path, i), v) for i, v in enumerate(x))
    return None


def _maybe_unsafe(raw: bytes) -> bool:
    """Could this line hold NaN/Infinity or a number that overflows? (No false negatives; a hex
    hash or a word like "NaN" in a string only costs a second parse.)"""
    if b"NaN" in raw or b"Infinity" in raw:
        return True
    t = raw.translate(_NUM_TR, b"+")  # "e+400" -> "e000"
    if _LONG_RUN in t:
        return True
    i = t.find(b"e000")
    while i >= 0:
        j = i + 4
        while j < len(t) and t[j] == 48:  # the rest of the exponent's digits
            j += 1
        if j == len(t) or t[j] == 44:  # then the number's end: a number, not letters of a hash
            return True
        i = t.find(b"e000", j)
    return False


def _json_error(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "not JSON this toolkit reads: nesting too deep (recursion limit)"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8: {e.reason} at byte {e.start}"
    return f"not JSON: {e}"


def _dump_escaped(record: Record) -> str:
    """`dump_line`, except that a record holding a lone surrogate (pydantic refuses to encode it)
    is written with it as its JSON escape \\udXXX (the same line `dump_line` would give otherwise)."""
    try:
        return dump_line(record)
    except Exception as e:  # pydantic's PydanticSerializationError wraps the UnicodeEncodeError
        if "surrogate" not in str(e):
            raise
    text = json.dumps(record.model_dump(mode="json", by_alias=True), ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False)
    return text.encode("utf-8", "backslashreplace").decode("utf-8") + "\n"


def _json_kind(obj: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number" if isinstance(obj, (int, float, _Bad)) else type(obj).__name__)


def _text(raw: bytes | str) -> str:
    """A line as text for --rejects/logs: invalid UTF-8 bytes kept visible as \\xNN."""
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
