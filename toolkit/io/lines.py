"""Reading lines (stdin or a file, plain or .gz, UTF-8 BOM, the line-length cap, a cut .gz) and
writing records; the messages naming a record's invalid field."""

from __future__ import annotations

import gzip
import json
import os
import sys
from typing import Any, Iterable, Iterator

from pydantic import ValidationError

from toolkit.io.base import UsageError
from toolkit.schema import Record

DEFAULT_MAX_LINE_BYTES = 64 << 20  # --max-line-bytes / recipe `max_line_bytes`
_RAW_HEAD = 2048  # bytes of an over-long line kept in --rejects


class OversizedLine(bytes):
    """The head of a line longer than the cap (the rest was skipped unread); `.length` is the
    line's full length in bytes."""

    length: int = 0


class InputCut(Exception):
    """The input ended in the middle of a compressed stream (truncated or corrupt .gz)."""


# ----------------------------------------------------------------------------------------------
# files


def resolve_env_path(rec: Record, base_dir: str) -> None:
    """A relative `env.path` in a record read from a file is resolved against that file's
    directory (then, if nothing is there, the current directory, as before) and written back as
    an absolute path, so every later stage of a pipe, reading stdin, finds the same environment."""
    env = rec.env
    p = getattr(env, "path", None) if env is not None else None
    if not isinstance(p, str) or not p or os.path.isabs(p):
        return
    cand = os.path.normpath(os.path.join(base_dir, p))
    if os.path.exists(cand):
        env.path = cand


def _is_std(path: str | None) -> bool:
    return path in (None, "", "-")


def check_input(path: str | None) -> None:
    """A clear usage error (exit 2) for an input that cannot be read at all."""
    if _is_std(path):
        return
    p = str(path)
    if not os.path.exists(p):
        raise UsageError(f"input file not found: {p}")
    if os.path.isdir(p):
        raise UsageError(f"input is a directory, not a JSONL file: {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(2)
    except OSError as e:
        raise UsageError(f"cannot read input {p}: {e.strerror or e}") from None
    if p.endswith(".gz") and head and head != b"\x1f\x8b":
        raise UsageError(f"input {p} ends in .gz but is not gzip data (first bytes {head!r}); "
                         "rename it or compress it")


def open_lines(path: str | None, max_line_bytes: int | None = None) -> Iterator[bytes]:
    """Yield raw lines (bytes, newline stripped) from stdin or a file (.gz aware).

    At most `max_line_bytes` (+1) of a line are ever held: a longer line is yielded as an
    `OversizedLine` (its head, with `.length`) and the rest is skipped in 1 MiB steps. A UTF-8
    BOM at the start is dropped. A .gz that ends mid-stream (truncated) or is corrupt raises
    `InputCut` after every complete line before the cut was yielded."""
    import zlib

    cap = int(max_line_bytes or DEFAULT_MAX_LINE_BYTES)
    if _is_std(path):
        f = sys.stdin.buffer
    elif str(path).endswith(".gz"):
        f = gzip.open(path, "rb")
    else:
        f = open(path, "rb")
    first = True
    try:
        while True:
            try:
                line = f.readline(cap + 1)
                if not line:
                    return
                if first:
                    first = False
                    if line.startswith(b"\xef\xbb\xbf"):
                        line = line[3:]
                if len(line) > cap and not line.endswith(b"\n"):
                    n = len(line)
                    tail = line[-2:]
                    while True:
                        more = f.readline(1 << 20)
                        n += len(more)
                        tail = (tail + more)[-2:]
                        if not more or more.endswith(b"\n"):
                            break
                    head = OversizedLine(line[:_RAW_HEAD])
                    # the line's length without its end (\n or \r\n)
                    head.length = n - (0 if not tail.endswith(b"\n") else 2 if tail == b"\r\n" else 1)
                    line = None
                    yield head
                    continue
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                raise InputCut(f"{type(e).__name__}: {e}") from None
            yield line.rstrip(b"\r\n")
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def read_records(path: str | None) -> Iterator[Record]:
    """Convenience for library users/tests: valid records only (raises on a bad line)."""
    for n, raw in enumerate(open_lines(path), 1):
        if raw.strip():
            try:
                yield Record.model_validate_json(raw)
            except ValidationError as e:
                raise ValueError(f"line {n}: {describe_validation_error(e)}") from None


def write_records(path: str, records: Iterable[Record | dict]) -> int:
    n = 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            if isinstance(r, dict):
                r = Record.model_validate(r)
            f.write(dump_line(r))
            n += 1
    return n


def parse_jsonl(text: str, source: str = "<text>") -> list[Any]:
    """The JSON values of a JSONL text (a small file read whole: stage logs, bundled tasks, tool docs),
    blank lines skipped. ValueError `<source>:<line>: not valid JSON: <msg> at char <pos>`."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}:{i}: not valid JSON: {e.msg} at char {e.pos}") from None
    return out


def dump_line(record: Record) -> str:
    return record.model_dump_json(by_alias=True) + "\n"

# ----------------------------------------------------------------------------------------------
# validation messages


def describe_validation_error(e: ValidationError, limit: int = 3) -> str:
    parts = []
    for err in e.errors()[:limit]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(record)"
        parts.append(f"field {loc}: {err.get('msg')}")
    more = len(e.errors()) - limit
    if more > 0:
        parts.append(f"(+{more} more)")
    return "; ".join(parts)


def first_field(e: ValidationError) -> str | None:
    errs = e.errors()
    if not errs:
        return None
    return ".".join(str(x) for x in errs[0].get("loc", ())) or None
