"""The input check behind the fast path: which lines may hold what pydantic-core lets through
(NaN/Infinity, numbers overflowing to inf, a key named twice in one object), the strict re-parse
that names the field, the texts a bad line is rejected with, and `read_json_lines` (JSON lines
that are not records: rejects files)."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, Iterator

import jiter

from toolkit.io.lines import InputCut, OversizedLine, check_input, dump_line, open_lines
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


def _strict_object(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):  # a key named twice: its value is marked (the first repeated key)
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                d[k] = _Bad(f"duplicate key {_short_key(k)} in one JSON object (readers disagree on which "
                            "value wins: pydantic and json keep the last, others the first)")
                break
            seen.add(k)
    return d


def _short_key(k: str) -> str:
    return repr(k) if len(k) <= 60 else repr(k[:60]) + "..."


def strict_loads(raw: bytes | str) -> Any:
    """json.loads that marks NaN/Infinity, numbers overflowing to inf, over-long integers and a key
    repeated in one object as `_Bad` (see `find_bad`).
    Raises ValueError (not JSON, bad UTF-8) or RecursionError (nesting too deep)."""
    return json.loads(raw, parse_constant=_strict_constant, parse_int=_strict_int, parse_float=_strict_float,
                      object_pairs_hook=_strict_object)


def has_duplicate_keys(raw: bytes) -> bool:
    """Does some object of this (valid JSON) line name a key twice? jiter (pydantic's own parser,
    in Rust) parses the line once with `catch_duplicate_keys`: the fast path's only extra pass."""
    try:
        jiter.from_json(raw, catch_duplicate_keys=True, cache_mode="none")
    except ValueError as e:
        return "duplicate key" in str(e)
    return False


def find_bad(obj: Any, surrogates: bool = True) -> tuple[str, str] | None:
    """(field path, reason) of the first `_Bad` in a `strict_loads` result, or (with `surrogates`)
    of the first lone surrogate (iterative: no recursion)."""
    stack: list[tuple[tuple, Any]] = [((), obj)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, _Bad):
            return ".".join(str(p) for p in path) or "(record)", x.why
        if not surrogates:
            if isinstance(x, dict):
                stack.extend(((*path, k), v) for k, v in reversed(list(x.items())))
            elif isinstance(x, list):
                stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(x))))
            continue
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


def read_json_lines(path: str | None, max_line_bytes: int | None = None) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value, None) for each JSON line of a file that is not a record stream (a
    rejects file), (line number, None, reason) for a bad one: the record reader's line reader
    (stdin or a file, .gz, the BOM, the line cap; a cut .gz ends with one bad "line" after the
    last whole one) and strict parse (no exception escapes for any content; blank lines are
    skipped; a lone surrogate escape, which rejects files hold for the lines they quote, is JSON
    and is kept). UsageError when the file cannot be read at all."""
    check_input(path)
    lineno = 0
    lines = open_lines(path, max_line_bytes)
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except InputCut as cut:
            yield lineno + 1, None, f"input cut after line {lineno}: truncated or corrupt ({cut})"
            return
        lineno += 1
        if isinstance(raw, OversizedLine):
            yield lineno, None, f"line too long: {raw.length} bytes"
            continue
        if not raw.strip():
            continue
        try:
            obj = strict_loads(raw)
            bad = find_bad(obj, surrogates=False)
        except (ValueError, RecursionError) as e:
            yield lineno, None, _json_error(e)
            continue
        if bad is not None:
            yield lineno, None, f"field {bad[0]}: {bad[1]}"
            continue
        yield lineno, obj, None


def _text(raw: bytes | str) -> str:
    """A line as text for --rejects/logs: invalid UTF-8 bytes kept visible as \\xNN."""
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
