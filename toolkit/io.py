"""Streaming JSONL in/out used by every command.

- reads stdin or --input (plain or .gz), writes stdout or --output (plain or .gz)
- validates each line against the record schema; a bad line (not JSON, wrong schema, duplicate id,
  NaN/Infinity, too deep, invalid UTF-8 ...: no exception while decoding one line escapes) gives
  one stderr message naming line number, id and field, goes whole to --rejects (escaped: always
  valid UTF-8), and never stops the good lines; the run exits 1 when anything was rejected
- --resume skips ids already present in --output (a killed run, rerun, gives each id exactly once;
  a torn last line left by a kill is trimmed first; a torn .gz is rewritten with its whole lines)
- --shard i/n keeps a stable hash partition of ids (blake2b of the id, so every machine agrees)
- --limit N, order-preserving output by default (--unordered emits as completed)
- bounded memory: a window of in-flight records; seen-id sets spill to a temp SQLite file
- progress on stderr when it is a TTY, and a one-line summary at the end
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gzip
import hashlib
import inspect
import io
import json
import math
import os
import re
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Iterable, Iterator, Protocol

from pydantic import ValidationError

from toolkit import __version__
from toolkit.schema import Provenance, Record

# ----------------------------------------------------------------------------------------------
# logging: everything human goes to stderr


# Per-record notes that go into the record's provenance (e.g. sandbox limits the record asked
# for and did not get: "sandbox_clamped"). The stream gives each record its own dict (a context
# variable: set per record task, shared with threads started from it).
_RECORD_NOTES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("toolkit_record_notes", default=None)


def begin_record_notes() -> dict:
    notes: dict = {}
    _RECORD_NOTES.set(notes)
    return notes


def note_for_provenance(kind: str, text: str) -> None:
    """Record `text` under `kind` in the provenance of the record being processed (no-op outside a
    stream)."""
    notes = _RECORD_NOTES.get()
    if notes is not None:
        lst = notes.setdefault(kind, [])
        if text not in lst:
            lst.append(text)


def log(msg: str) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.stderr.flush()


class UsageError(Exception):
    """Bad invocation (exit code 2)."""


# ----------------------------------------------------------------------------------------------
# options


def parse_shard(value: str | None) -> tuple[int, int] | None:
    if value in (None, ""):
        return None
    try:
        i, n = (int(x) for x in str(value).split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like i/n (e.g. 0/4), got {value!r}") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard {value}: need 0 <= i < n")
    return i, n


def shard_of(record_id: str, n: int) -> int:
    h = hashlib.blake2b(record_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") % n


DEFAULT_MAX_LINE_BYTES = 64 << 20  # --max-line-bytes / recipe `max_line_bytes`
_RAW_HEAD = 2048  # bytes of an over-long line kept in --rejects


class OversizedLine(bytes):
    """The head of a line longer than the cap (the rest was skipped unread); `.length` is the
    line's full length in bytes."""

    length: int = 0


class InputCut(Exception):
    """The input ended in the middle of a compressed stream (truncated or corrupt .gz)."""


@dataclass
class IOOptions:
    input: str | None = None  # None or "-" = stdin
    output: str | None = None  # None or "-" = stdout
    rejects: str | None = None
    resume: bool = False
    shard: tuple[int, int] | None = None
    limit: int | None = None
    unordered: bool = False
    progress: bool | None = None  # None = auto (TTY)
    concurrency: int = 8
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES  # longer lines are rejected unread (bounded memory)

    @classmethod
    def from_config(cls, cfg: dict) -> "IOOptions":
        return cls(
            input=cfg.get("input"),
            output=cfg.get("output"),
            rejects=cfg.get("rejects"),
            resume=bool(cfg.get("resume")),
            shard=parse_shard(cfg.get("shard")),
            limit=cfg.get("limit"),
            unordered=bool(cfg.get("unordered")),
            progress=cfg.get("progress"),
            concurrency=int(cfg.get("concurrency") or 8),
            max_line_bytes=int(cfg.get("max_line_bytes") or DEFAULT_MAX_LINE_BYTES),
        )


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


def _trim_torn_tail(path: str) -> None:
    """A SIGKILL mid-write can leave a last line without newline: drop it (it will be redone)."""
    if not os.path.exists(path):
        return
    if path.endswith(".gz"):
        _trim_torn_gz(path)
        return
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # scan back to the previous newline
        pos = size - 1
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            idx = buf.rfind(b"\n")
            if idx >= 0:
                f.truncate(start + idx + 1)
                return
            pos = start
        f.truncate(0)


def _gz_data(path: str, state: dict) -> Iterator[bytes]:
    """Decompressed chunks of a (multi-member) gzip file, as far as it decompresses; afterwards
    `state["clean"]` says whether it ended on a member boundary without an error. zlib directly:
    gzip.GzipFile drops the data it buffered when it hits the torn end."""
    import zlib

    state["clean"] = False
    with open(path, "rb") as f:
        d = zlib.decompressobj(31)
        in_member = False
        while True:
            buf = f.read(1 << 16)
            if not buf:
                break
            while buf:
                if not in_member and not buf.strip(b"\0"):  # zero padding after the last member
                    buf = b""
                    break
                in_member = True
                try:
                    out = d.decompress(buf)
                except zlib.error:
                    return
                if out:
                    yield out
                if d.eof:
                    buf, in_member = d.unused_data, False
                    d = zlib.decompressobj(31)
                else:
                    buf = b""
        state["clean"] = not in_member


def _gz_whole_lines(path: str) -> tuple[bool, int]:
    """(clean, keep): `keep` = decompressed bytes up to the last newline before any torn or corrupt
    end; `clean` = every gzip member is complete and the data ends with a newline (or is empty)."""
    total = keep = 0
    last = b"\n"
    state: dict = {}
    for chunk in _gz_data(path, state):
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = total + nl + 1
        total += len(chunk)
        last = chunk[-1:]
    return bool(state["clean"]) and last == b"\n", keep


def _trim_torn_gz(path: str) -> None:
    """A kill mid-write leaves a .gz whose last member has no end (and maybe a torn line): rewrite
    the file, atomically, with its whole lines only (they stay; the rest is redone), so appending a
    new member gives a file `gzip -dc` reads and each id once. A clean file is left as it is."""
    with open(path, "rb") as f:
        head = f.read(2)
    if len(head) == 2 and head != b"\x1f\x8b":
        raise UsageError(f"--resume: {path} ends in .gz but is not gzip data (first bytes {head!r})")
    clean, keep = _gz_whole_lines(path)
    if clean:
        return
    tmp = f"{path}.resume-{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as raw_out:
            with gzip.GzipFile(fileobj=raw_out, mode="wb", mtime=0) as dst:
                left = keep
                for chunk in _gz_data(path, {}):
                    if left <= 0:
                        break
                    dst.write(chunk[:left])
                    left -= len(chunk)
            raw_out.flush()
            os.fsync(raw_out.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    log(f"resume: {path} ended in a torn gzip member (a killed run); rewrote it with its "
        f"{keep} bytes of whole lines, the rest is redone")


def existing_ids(path: str) -> "IdSet":
    ids = IdSet()
    if _is_std(path) or not os.path.exists(path):
        return ids
    try:
        for raw in open_lines(path):
            if not raw.strip():
                continue
            try:
                rid = json.loads(raw).get("id")
            except (ValueError, RecursionError, AttributeError):
                continue
            if isinstance(rid, str):
                ids.add(rid)
    except InputCut as cut:  # only when the file changed under us: what was read counts
        log(f"resume: {path} is cut ({cut}); ids before the cut are skipped, the rest redone")
    return ids


# ----------------------------------------------------------------------------------------------
# bounded-memory id set


class IdSet:
    """A set of ids by 64-bit digest: in memory up to `spill_at`, then in a temp SQLite file,
    so memory stays flat on inputs of millions of lines."""

    def __init__(self, spill_at: int = 50_000):
        self._mem: set[int] = set()
        self._spill_at = spill_at
        self._db: sqlite3.Connection | None = None
        self._tmp: str | None = None
        self._n = 0

    @staticmethod
    def _key(rid: str) -> int:
        return int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest(), "big", signed=True)

    def __contains__(self, rid: str) -> bool:
        k = self._key(rid)
        if k in self._mem:
            return True
        if self._db is not None:
            return self._db.execute("SELECT 1 FROM ids WHERE k=?", (k,)).fetchone() is not None
        return False

    def add(self, rid: str) -> bool:
        """Add; return False when already present."""
        k = self._key(rid)
        if k in self._mem:
            return False
        if self._db is not None:
            cur = self._db.execute("INSERT OR IGNORE INTO ids(k) VALUES (?)", (k,))
            if cur.rowcount == 0:
                return False
        else:
            self._mem.add(k)
            if len(self._mem) >= self._spill_at:
                self._spill()
        self._n += 1
        return True

    def _spill(self) -> None:
        fd, self._tmp = tempfile.mkstemp(prefix="toolkit-ids-", suffix=".sqlite")
        os.close(fd)
        self._db = sqlite3.connect(self._tmp, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA cache_size=-8000")  # ~8 MB page cache
        self._db.execute("CREATE TABLE ids(k INTEGER PRIMARY KEY) WITHOUT ROWID")
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO ids(k) VALUES (?)", ((k,) for k in self._mem))
        self._db.execute("COMMIT")
        self._mem = set()

    def __len__(self) -> int:
        return self._n

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._tmp and os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __del__(self) -> None:  # pragma: no cover
        with contextlib.suppress(Exception):
            self.close()


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


# ----------------------------------------------------------------------------------------------
# summary & progress


@dataclass
class Summary:
    command: str
    read: int = 0
    written: int = 0
    rejected: int = 0
    skipped_resume: int = 0
    skipped_shard: int = 0
    dropped: int = 0  # a stage returned nothing for a record (e.g. --filter)
    failed: int = 0  # records the stage marked as failing (verify: not passed) — informs exit code
    blank: int = 0  # empty / whitespace-only input lines (skipped, counted)
    started: float = field(default_factory=time.monotonic)
    meter: Any = None  # toolkit.llm Meter, when the command used an LLM
    reject_reasons: dict = field(default_factory=dict)  # reason (field or message shape) -> count
    drop_reasons: dict = field(default_factory=dict)  # why records were filtered out (note_drop)
    verdicts_passed: int = 0  # the written records' verdicts of this command's stage (pass rate)
    verdicts_total: int = 0

    def count_written(self, rec: Any) -> None:
        self.written += 1
        for v in getattr(rec, "verdicts", None) or []:
            if v.stage == self.command:
                self.verdicts_total += 1
                self.verdicts_passed += 1 if v.passed else 0

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        s = (f"{self.command}: read {self.read}, written {self.written}, rejected {self.rejected}")
        if self.skipped_resume:
            s += f", resumed-skip {self.skipped_resume}"
        if self.skipped_shard:
            s += f", other-shards {self.skipped_shard}"
        if self.dropped:
            s += f", filtered {self.dropped}"
        if self.failed:
            s += f", failed {self.failed}"
        if self.blank:
            s += f", blank lines skipped {self.blank}"
        s += f", {self.seconds():.2f}s"
        if self.meter is not None:
            m = self.meter.snapshot() if hasattr(self.meter, "snapshot") else dict(self.meter)
            toks = int(m.get("prompt_tokens", 0)) + int(m.get("completion_tokens", 0))
            s += (f", llm requests {m.get('requests', 0)} (cache hits {m.get('cache_hits', 0)}),"
                  f" tokens {toks}, cost ${float(m.get('cost', 0.0)):.4f}")
        return s

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("command", "read", "written", "rejected", "skipped_resume",
                                             "skipped_shard", "dropped", "failed")}
        d["seconds"] = round(self.seconds(), 3)
        d["reject_reasons"] = dict(self.reject_reasons)
        d["drop_reasons"] = dict(self.drop_reasons)
        if self.verdicts_total:
            d["verdicts"] = {"passed": self.verdicts_passed, "total": self.verdicts_total}
        if self.meter is not None:
            m = self.meter.snapshot() if hasattr(self.meter, "snapshot") else dict(self.meter)
            d["llm"] = {k: m.get(k, 0) for k in ("requests", "cache_hits", "prompt_tokens", "completion_tokens",
                                                 "cost")}
        return d


_ACTIVE: list[Summary] = []  # the running stream's summary (one stream per process)
STAGE_LOG_ENV = "TOOLKIT_STAGE_LOG"
# optional row label (e.g. "verify f1 (replay)") and group (e.g. a pilot iteration) in the stage log
STAGE_LABEL_ENV, STAGE_GROUP_ENV = "TOOLKIT_STAGE_LABEL", "TOOLKIT_STAGE_GROUP"


def note_drop(reason: str, n: int = 1) -> None:
    """A stage records why it filtered a record out (counted in the summary and the stage log)."""
    if _ACTIVE:
        d = _ACTIVE[-1].drop_reasons
        d[reason] = d.get(reason, 0) + n


def _reason_key(error: str, field_: str | None) -> str:
    if field_:
        return f"field {field_}"
    return re.sub(r"\d+", "N", error)[:80]


def _write_stage_log(summary: Summary, extra: dict | None = None) -> None:
    """Append the summary as one JSON line to $TOOLKIT_STAGE_LOG (recipes build yield tables from it;
    see toolkit.yieldtable)."""
    path = os.environ.get(STAGE_LOG_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            tags = {k: os.environ[v] for k, v in (("label", STAGE_LABEL_ENV), ("group", STAGE_GROUP_ENV))
                    if os.environ.get(v)}
            f.write(json.dumps(dict(summary.as_dict(), **tags, **(extra or {})), ensure_ascii=False, default=str)
                    + "\n")
    except OSError as e:  # pragma: no cover
        log(f"{summary.command}: cannot write the stage log {path}: {e}")


class Progress:
    def __init__(self, enabled: bool | None, label: str):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.label = label
        self._last = 0.0

    def update(self, s: Summary, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        rate = s.written / max(s.seconds(), 1e-9)
        sys.stderr.write(f"\r{self.label}: {s.read} read, {s.written} written, {s.rejected} rejected,"
                         f" {rate:.1f} rec/s ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


# ----------------------------------------------------------------------------------------------
# the stream runner

StageResult = Record | list[Record] | None
StageFn = Callable[[Record], "Awaitable[StageResult] | StageResult"]


class Stage(Protocol):
    """What `RecordStream.run_stage` (one process) and `toolkit.pipeline.Pipeline` (a chain in one
    process) run. `process` and `finish` may be `async def` or plain functions."""

    def process(self, record: Record) -> "Awaitable[StageResult] | StageResult":
        """One input record -> a record, a list (fan-out, new distinct ids) or None (dropped);
        raise StageError to reject the record with a reason."""

    def finish(self) -> "Awaitable[list[Record]] | list[Record]":
        """Records made from the whole input (batch stages: reflect); [] for the others (or
        `finish = None`: not a batch stage)."""

    def close(self) -> "Awaitable[None] | None":
        """Release resources (LLM clients ...); called once, after finish."""

    @property
    def counts(self) -> dict:
        """Stage-specific totals for the summary (verify: trajectories, passed)."""


def stage_fn(stage: Stage) -> StageFn:
    """The per-record function RecordStream runs for a Stage (its `finish` attached): synchronous
    when both `process` and `finish` are (no asyncio task per record)."""
    proc, fin = stage.process, getattr(stage, "finish", None)
    if inspect.isfunction(proc) and (fin is None or getattr(proc, "finish", None) is fin):
        return proc  # already what RecordStream runs (no wrapper per record)
    if inspect.iscoroutinefunction(proc) or inspect.iscoroutinefunction(fin):
        async def fn(record: Record) -> StageResult:
            out = proc(record)
            return (await out) if inspect.isawaitable(out) else out
    else:
        def fn(record: Record) -> StageResult:  # type: ignore[misc]
            return proc(record)
    fn.finish = fin  # type: ignore[attr-defined]
    return fn


class StageError(Exception):
    """Raised by a stage for one record: the record goes to rejects with this message."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class _Writer:
    def __init__(self, path: str | None, append: bool):
        self.path = path
        if _is_std(path):
            self.f = sys.stdout
            self._own = False
        else:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            if path.endswith(".gz"):
                self.f = io.TextIOWrapper(gzip.open(path, "ab" if append else "wb"), encoding="utf-8")
            else:
                self.f = open(path, "a" if append else "w", encoding="utf-8")
            self._own = True
        self._last_flush = time.monotonic()

    def write(self, text: str) -> None:
        try:
            self.f.write(text)
        except UnicodeEncodeError:  # a lone surrogate in a field: written as its JSON escape \\udXXX
            self.f.write(text.encode("utf-8", "backslashreplace").decode("utf-8"))
        now = time.monotonic()
        if now - self._last_flush > 0.5:
            self.f.flush()
            self._last_flush = now

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.f.flush()
        if self._own:
            self.f.close()


class RecordStream:
    """Read → validate → (skip/shard/limit) → stage fn (async, bounded concurrency) → write.

    `fn(record)` may be sync or async and returns a Record, a list of Records (fan-out), or None
    (drop). Raising StageError (or any exception) sends the input line to rejects and continues.
    """

    def __init__(self, opts: IOOptions, command: str, meter: Any = None):
        self.opts = opts
        self.command = command
        self.summary = Summary(command=command, meter=meter)
        _ACTIVE.append(self.summary)
        self._rejects_f = None
        self._done: IdSet | None = None  # ids already in --output (--resume)
        self._progress = Progress(opts.progress, command)

    # -- rejects -------------------------------------------------------------------------------
    def reject(self, lineno: int, raw: bytes | str, error: str, rid: str | None = None,
               field: str | None = None, **extra: Any) -> None:
        self.summary.rejected += 1
        key = _reason_key(error, field)
        self.summary.reject_reasons[key] = self.summary.reject_reasons.get(key, 0) + 1
        where = f"line {lineno}" + (f" (id {rid})" if rid else "")
        log(f"{self.command}: rejected {where}: {error}")
        if self.opts.rejects:
            if self._rejects_f is None:  # lone surrogates (from \\udXXX escapes) are written escaped
                self._rejects_f = open(self.opts.rejects, "a", encoding="utf-8", errors="backslashreplace")
            self._rejects_f.write(json.dumps({
                "line": lineno, "id": rid, "field": field, "error": error,
                "command": self.command, "raw": _text(raw), **extra}, ensure_ascii=False) + "\n")
            self._rejects_f.flush()

    # -- input ---------------------------------------------------------------------------------
    def _parsed(self) -> Iterator[tuple[int, bytes, Record]]:
        opts = self.opts
        base_dir = None if _is_std(opts.input) else os.path.dirname(os.path.abspath(str(opts.input)))
        done = self._done if self._done is not None else IdSet()
        self._done = None
        seen = IdSet()
        taken = 0
        check_input(opts.input)
        lineno = 0
        try:
            lines = open_lines(opts.input, opts.max_line_bytes)
            while True:
                try:
                    raw = next(lines)
                except StopIteration:
                    break
                except InputCut as cut:
                    self.reject(lineno + 1, b"", f"input cut after line {lineno}: {opts.input} is "
                                f"truncated or corrupt ({cut}); the {lineno} lines before the cut "
                                "were processed", field=None, cut=True)
                    break
                lineno += 1
                if isinstance(raw, OversizedLine):
                    self.summary.read += 1
                    self.reject(lineno, bytes(raw) + b"...", f"line too long: {raw.length} bytes > "
                                f"max_line_bytes {opts.max_line_bytes} (raw truncated to "
                                f"{len(raw)} bytes)", length=raw.length, truncated=True)
                    continue
                if not raw.strip():
                    self.summary.blank += 1
                    continue
                self.summary.read += 1
                rec = self._decode(lineno, raw)
                if rec is None:
                    continue
                if base_dir is not None:
                    resolve_env_path(rec, base_dir)
                if opts.shard and shard_of(rec.id, opts.shard[1]) != opts.shard[0]:
                    self.summary.skipped_shard += 1
                    continue
                if not seen.add(rec.id):
                    self.reject(lineno, raw, f"duplicate id {rec.id!r} in input", rec.id, "id")
                    continue
                if rec.id in done:
                    self.summary.skipped_resume += 1
                    continue
                if opts.limit is not None and taken >= opts.limit:
                    break
                taken += 1
                yield lineno, raw, rec
        finally:
            seen.close()
            done.close()

    def _decode(self, lineno: int, raw: bytes) -> Record | None:
        """One line → a Record, or None after rejecting it. Never raises: whatever a line holds
        (deep nesting, huge integers, NaN, bad UTF-8, lone surrogates ...) ends as a reject with
        the line number, the field when one can be named, and the reason."""
        try:
            try:  # fast path: parse + validate in pydantic-core
                rec = Record.model_validate_json(raw)
            except ValidationError as e:
                self._explain(lineno, raw, e)
                return None
            if _maybe_unsafe(raw):
                try:
                    bad = find_bad(strict_loads(raw))
                except (ValueError, RecursionError) as je:
                    self.reject(lineno, raw, _json_error(je), rec.id)
                    return None
                if bad is not None:
                    self.reject(lineno, raw, f"field {bad[0]}: {bad[1]}", rec.id, bad[0])
                    return None
            return rec
        except Exception as e:  # noqa: BLE001 - no line may end the run
            self.reject(lineno, raw, f"unreadable line: {type(e).__name__}: {e}")
            return None

    def _explain(self, lineno: int, raw: bytes, e: ValidationError) -> None:
        """Slow path, bad lines only: tell "not JSON" from "wrong schema" and name the field."""
        try:
            obj = strict_loads(raw)
        except (ValueError, RecursionError) as je:
            self.reject(lineno, raw, _json_error(je))
            return
        rid = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None
        if not isinstance(obj, dict):
            self.reject(lineno, raw, f"a line must be a JSON object (a record), got a JSON {_json_kind(obj)}", rid)
            return
        if raw.startswith(b"\xef\xbb\xbf"):
            self.reject(lineno, raw, "a UTF-8 BOM inside the stream (only the first line of a file may "
                        "start with one; concatenated files?)", rid)
            return
        bad = find_bad(obj)
        if bad is None and "recursion limit" in str(e.errors()[0].get("msg", "")):
            bad = _too_deep(obj)
        if bad is not None:
            self.reject(lineno, raw, f"field {bad[0]}: {bad[1]}", rid, bad[0])
            return
        self.reject(lineno, raw, describe_validation_error(e), rid, first_field(e))

    def _write(self, writer: "_Writer", out: Record | list[Record], lineno: int, raw: bytes,
               rid: str | None) -> None:
        """Write a stage's output record(s); one that cannot be serialized is a reject of its
        input line (line 0: records a batch `finish` made), never the end of the run."""
        for r in (out if isinstance(out, list) else [out]):
            try:
                text = _dump_escaped(r)
            except Exception as e:  # noqa: BLE001
                self.reject(lineno, raw, f"output record {getattr(r, 'id', None)!r} cannot be written: "
                            f"{type(e).__name__}: {e}", rid)
                continue
            writer.write(text)
            self.summary.count_written(r)

    # -- run -----------------------------------------------------------------------------------
    def run_stage(self, stage: Stage, concurrency: int | None = None) -> Summary:
        """The one loop over a Stage: process every record, write what finish() returns, close();
        the stage's counts land in summary.counts."""

        async def go() -> Summary:
            try:
                return await self.arun(stage_fn(stage), concurrency)
            finally:
                closed = stage.close()
                if inspect.isawaitable(closed):
                    await closed
                self.summary.counts = dict(getattr(stage, "counts", None) or {})

        return asyncio.run(go())

    def run(self, fn: StageFn, concurrency: int | None = None) -> Summary:
        """Run synchronously (creates an event loop). Returns the summary (also logged)."""
        return asyncio.run(self.arun(fn, concurrency))

    async def arun(self, fn: StageFn, concurrency: int | None = None) -> Summary:
        opts = self.opts
        conc = max(1, int(concurrency or opts.concurrency or 1))
        if opts.resume and not _is_std(opts.output):
            _trim_torn_tail(opts.output)
            self._done = existing_ids(opts.output)  # read before the writer appends to it
        writer = _Writer(opts.output, append=opts.resume)
        is_async = inspect.iscoroutinefunction(fn)
        if not is_async:  # synchronous stages: no tasks, no reordering needed
            return self._run_sync(fn, writer)

        async def call(rec: Record) -> StageResult:
            if is_async:
                return await fn(rec)
            out = fn(rec)
            if inspect.isawaitable(out):
                out = await out
            return out

        window = conc * 2  # in-flight records (bounds memory and the reorder buffer)
        pending: dict[int, asyncio.Task] = {}
        meta: dict[int, tuple[int, bytes, str]] = {}
        next_emit = 0
        seq = 0
        sem = asyncio.Semaphore(conc)

        async def guarded(rec: Record) -> StageResult:
            begin_record_notes()  # this task's own (tasks copy the context)
            async with sem:
                return await call(rec)

        def emit(i: int, task: asyncio.Task) -> None:
            lineno, raw, rid = meta.pop(i)
            exc = task.exception()
            if exc is not None:
                fld = getattr(exc, "field", None)
                msg = str(exc) if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"
                self.reject(lineno, raw, msg, rid, fld)
                return
            out = task.result()
            if out is None:
                self.summary.dropped += 1
                return
            self._write(writer, out, lineno, raw, rid)

        try:
            it = self._parsed()
            exhausted = False
            while True:
                while not exhausted and len(pending) < window:
                    try:
                        lineno, raw, rec = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    pending[seq] = asyncio.ensure_future(guarded(rec))
                    meta[seq] = (lineno, raw, rec.id)
                    seq += 1
                    if len(pending) % 64 == 0:
                        await asyncio.sleep(0)  # let tasks start while we read
                if not pending:
                    break
                if opts.unordered:
                    done, _ = await asyncio.wait(list(pending.values()), return_when=asyncio.FIRST_COMPLETED)
                    for i in [i for i, t in pending.items() if t in done]:
                        emit(i, pending.pop(i))
                else:
                    head = pending[next_emit]
                    if not head.done():
                        await asyncio.wait([head])
                    while next_emit in pending and pending[next_emit].done():
                        emit(next_emit, pending.pop(next_emit))
                        next_emit += 1
                self._progress.update(self.summary)
            finish = getattr(fn, "finish", None)
            if finish is not None:  # batch stages (reflect): records made from the whole input
                outs = finish()
                if inspect.isawaitable(outs):
                    outs = await outs
                self._write(writer, list(outs or []), 0, b"", None)
        finally:
            for t in pending.values():
                t.cancel()
            writer.close()
            if self._rejects_f is not None:
                self._rejects_f.close()
            self._progress.update(self.summary, force=True)
            self._progress.close()
        log(self.summary.line())
        _write_stage_log(self.summary)
        if _ACTIVE and _ACTIVE[-1] is self.summary:
            _ACTIVE.pop()
        return self.summary

    def _run_sync(self, fn: StageFn, writer: "_Writer") -> Summary:
        try:
            for lineno, raw, rec in self._parsed():
                begin_record_notes()
                try:
                    out = fn(rec)
                    if inspect.isawaitable(out):  # a sync wrapper returning a coroutine
                        out = asyncio.get_event_loop().run_until_complete(out)
                except Exception as exc:
                    msg = str(exc) if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"
                    self.reject(lineno, raw, msg, rec.id, getattr(exc, "field", None))
                    continue
                if out is None:
                    self.summary.dropped += 1
                    continue
                self._write(writer, out, lineno, raw, rec.id)
                self._progress.update(self.summary)
            finish = getattr(fn, "finish", None)
            for r in (finish() if finish is not None else None) or []:  # a synchronous batch stage
                writer.write(dump_line(r))
                self.summary.count_written(r)
        finally:
            writer.close()
            if self._rejects_f is not None:
                self._rejects_f.close()
            self._progress.update(self.summary, force=True)
            self._progress.close()
        log(self.summary.line())
        _write_stage_log(self.summary)
        if _ACTIVE and _ACTIVE[-1] is self.summary:
            _ACTIVE.pop()
        return self.summary

    def exit_code(self) -> int:
        return 1 if (self.summary.rejected or self.summary.failed) else 0


# ----------------------------------------------------------------------------------------------
# provenance


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def add_provenance(record: Record, command: str, *, strategy: str | None = None,
                   model: str | None = None, recipe_hash: str | None = None,
                   usage: dict | None = None) -> Record:
    usage = usage or {}
    sbx = sys.modules.get("toolkit.sandbox")  # only when generated code ran in this process
    record.provenance.append(Provenance(
        command=command, version=__version__, strategy=strategy, recipe_hash=recipe_hash,
        model=model, time=now_iso(), cost=float(usage.get("cost", 0.0) or 0.0),
        prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
        completion_tokens=int(usage.get("completion_tokens", 0) or 0),
        sandbox_isolation=sbx.used_isolation() if sbx is not None else None,
        sandbox_clamped=list((_RECORD_NOTES.get() or {}).get("sandbox_clamped") or []) or None))
    return record
