"""Provenance: the entry each command appends to a record, and the per-record notes that go into it."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from datetime import datetime, timezone

from toolkit import __version__
from toolkit.schema import Provenance, Record


# Per-record notes that go into the record's provenance (e.g. sandbox limits the record asked
# for and did not get: "sandbox_clamped"). The stream gives each record its own dict (a context
# variable: set per record task, shared with threads started from it).
_RECORD_NOTES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("toolkit_record_notes", default=None)


def begin_record_notes() -> dict:
    notes: dict = {}
    _RECORD_NOTES.set(notes)
    return notes


@contextlib.contextmanager
def record_notes_scope():
    """Per-record notes set inside this block do not outlive it (a synchronous stream runs its
    records in the caller's context: without the reset, the last record's notes would reach the
    provenance of whatever the caller builds next)."""
    token = _RECORD_NOTES.set(None)
    try:
        yield
    finally:
        _RECORD_NOTES.reset(token)


def note_for_provenance(kind: str, text: str) -> None:
    """Record `text` under `kind` in the provenance of the record being processed (no-op outside a
    stream)."""
    notes = _RECORD_NOTES.get()
    if notes is not None:
        lst = notes.setdefault(kind, [])
        if text not in lst:
            lst.append(text)


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
        sandbox_clamped=list((_RECORD_NOTES.get() or {}).get("sandbox_clamped") or []) or None,
        fallbacks=list((_RECORD_NOTES.get() or {}).get("fallbacks") or []) or None))
    return record
