"""The stream runner: the Stage protocol and RecordStream, the one loop every command runs
(read -> validate -> skip/shard/limit -> stage -> write, bounded in-flight window, rejects)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import inspect
import io
import json
import os
import sys
import time
from typing import Any, Awaitable, Callable, Iterator, Protocol

from pydantic import ValidationError

from toolkit import aio
from toolkit.io.base import StageError, log
from toolkit.io.lines import (InputCut, OversizedLine, _is_std, check_input, describe_validation_error, first_field, open_lines, resolve_env_path)
from toolkit.io.options import IOOptions, shard_of
from toolkit.io.provenance import begin_record_notes, record_notes_scope
from toolkit.io.resume import IdSet, _trim_torn_tail, existing_ids
from toolkit.io.strict import (_dump_escaped, _json_error, _json_kind, _maybe_unsafe, _text, _too_deep, find_bad,
                               has_duplicate_keys, strict_loads)
from toolkit.io.summary import _ACTIVE, Progress, Summary, _reason_key, _write_stage_log
from toolkit.schema import Record

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
    """The per-record function RecordStream runs for a Stage (`run_stage` passes its `finish`
    beside it): synchronous when both `process` and `finish` are (no asyncio task per record)."""
    proc, fin = stage.process, getattr(stage, "finish", None)
    if inspect.isfunction(proc) and (inspect.iscoroutinefunction(proc) or not inspect.iscoroutinefunction(fin)):
        return proc  # already what RecordStream runs (no wrapper per record)
    if inspect.iscoroutinefunction(proc) or inspect.iscoroutinefunction(fin):
        async def fn(record: Record) -> StageResult:
            out = proc(record)
            return (await out) if inspect.isawaitable(out) else out
    else:
        def fn(record: Record) -> StageResult:  # type: ignore[misc]
            return proc(record)
    return fn


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
        self.source: str | None = None  # names the input in reject messages (a reader of several files)
        self._progress = Progress(opts.progress, command, getattr(opts, "heartbeat", None))

    # -- rejects -------------------------------------------------------------------------------
    def reject(self, lineno: int, raw: bytes | str, error: str, rid: str | None = None,
               field: str | None = None, **extra: Any) -> None:
        self.summary.rejected += 1
        key = _reason_key(error, field)
        self.summary.reject_reasons[key] = self.summary.reject_reasons.get(key, 0) + 1
        where = f"line {lineno}" + (f" (id {rid})" if rid else "")
        if self.source is not None:
            where = f"{self.source} {where}"
            extra = {"source": self.source, **extra}
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
        shard = opts.shard_range
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
                if shard and shard_of(rec.id, shard[1]) != shard[0]:
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

    def read(self) -> Iterator[tuple[int, bytes, Record]]:
        """(line number, raw line, record) for every valid record of the input, every bad line
        rejected exactly as `run` rejects it (stderr, --rejects, `summary.rejected` and its
        reasons; a cut .gz keeps the lines before the cut): the reader of commands that write no
        records (`toolkit stats`). The summary is not logged; the rejects file is closed at the end."""
        try:
            yield from self._parsed()
        finally:
            if self._rejects_f is not None:
                self._rejects_f.close()
                self._rejects_f = None
            if _ACTIVE and _ACTIVE[-1] is self.summary:
                _ACTIVE.pop()

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
            if _maybe_unsafe(raw) or has_duplicate_keys(raw):
                try:
                    bad = find_bad(strict_loads(raw))
                except (ValueError, RecursionError) as je:
                    self.reject(lineno, raw, _json_error(je), rec.id)
                    return None
                if bad is not None:  # (the id of a line naming "id" twice is not known)
                    self.reject(lineno, raw, f"field {bad[0]}: {bad[1]}", None if bad[0] == "id" else rec.id, bad[0])
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
                return await self.arun(stage_fn(stage), concurrency, finish=getattr(stage, "finish", None))
            finally:
                closed = stage.close()
                if inspect.isawaitable(closed):
                    await closed
                self.summary.counts = dict(getattr(stage, "counts", None) or {})

        return aio.run(go())

    def run(self, fn: StageFn, concurrency: int | None = None, finish: Callable | None = None) -> Summary:
        """Run synchronously (creates an event loop). Returns the summary (also logged). finish: a
        batch stage's step, run once the input is exhausted (its records are written last)."""
        return aio.run(self.arun(fn, concurrency, finish))

    async def arun(self, fn: StageFn, concurrency: int | None = None, finish: Callable | None = None) -> Summary:
        opts = self.opts
        conc = max(1, int(concurrency or opts.concurrency or 1))
        if opts.resume and not _is_std(opts.output):
            _trim_torn_tail(opts.output)
            self._done = existing_ids(opts.output)  # read before the writer appends to it
        writer = _Writer(opts.output, append=opts.resume)
        self._progress.start(self.summary)
        is_async = inspect.iscoroutinefunction(fn)
        if not is_async:  # synchronous stages: no tasks, no reordering needed
            return self._run_sync(fn, writer, finish)

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
                self.summary.in_flight = len(pending)
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
            if finish is not None:  # batch stages (reflect): records made from the whole input
                outs = finish()
                if inspect.isawaitable(outs):
                    outs = await outs
                self._write(writer, list(outs or []), 0, b"", None)
        finally:
            for t in pending.values():
                t.cancel()
            self._close(writer)
        return self._report()

    def _run_sync(self, fn: StageFn, writer: "_Writer", finish: Callable | None = None) -> Summary:
        with record_notes_scope():
            return self._run_sync_records(fn, writer, finish)

    def _run_sync_records(self, fn: StageFn, writer: "_Writer", finish: Callable | None = None) -> Summary:
        try:
            for lineno, raw, rec in self._parsed():
                begin_record_notes()
                self.summary.in_flight = 1
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
                self.summary.in_flight = 0
                self._progress.update(self.summary)
            self.summary.in_flight = 0
            if finish is not None:  # a synchronous batch stage
                self._write(writer, list(finish() or []), 0, b"", None)
        finally:
            self._close(writer)
        return self._report()

    def _close(self, writer: "_Writer") -> None:
        writer.close()
        if self._rejects_f is not None:
            self._rejects_f.close()
        self._progress.update(self.summary, force=True)
        self._progress.close()

    def _report(self) -> Summary:
        log(self.summary.line())
        _write_stage_log(self.summary)
        if _ACTIVE and _ACTIVE[-1] is self.summary:
            _ACTIVE.pop()
        return self.summary

    def exit_code(self) -> int:
        return 1 if (self.summary.rejected or self.summary.failed) else 0
