"""The run summary (one stderr line, the stage log $TOOLKIT_STAGE_LOG), drop / fallback / warning
reasons, the TTY progress line and, when progress is off, the heartbeat line."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from toolkit.io.base import log
from toolkit.io.provenance import note_for_provenance


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
    fallback_reasons: dict = field(default_factory=dict)  # a cheaper/other path taken (note_fallback)
    warning_reasons: dict = field(default_factory=dict)  # e.g. replies cut at max_tokens (note_warning)
    in_flight: int = 0  # records being processed now (the heartbeat shows it)

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
        for name, reasons in (("fallbacks", self.fallback_reasons), ("warnings", self.warning_reasons)):
            if reasons:
                top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
                s += f", {name} {sum(reasons.values())} (" + "; ".join(f"{k}: {v}" for k, v in top) + \
                     ("; ..." if len(reasons) > 3 else "") + ")"
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
        if self.fallback_reasons:
            d["fallback_reasons"] = dict(self.fallback_reasons)
        if self.warning_reasons:
            d["warning_reasons"] = dict(self.warning_reasons)
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


def note_fallback(reason: str, n: int = 1) -> None:
    """A stage (or the LLM client) took a fallback path: counted in the summary line, the stage log
    (`fallback_reasons`, the yield table's `fallbacks` column) and marked in the provenance of the
    record being processed (`provenance[].fallbacks`). Never silent."""
    if _ACTIVE:
        d = _ACTIVE[-1].fallback_reasons
        d[reason] = d.get(reason, 0) + n
    note_for_provenance("fallbacks", reason)


def note_warning(reason: str, n: int = 1, *, log_first: bool = True) -> None:
    """Something the operator should know about that changed no path (a reply cut at max_tokens):
    counted in the summary line and the stage log (`warning_reasons`); logged once per reason."""
    if _ACTIVE:
        d = _ACTIVE[-1].warning_reasons
        first = reason not in d
        d[reason] = d.get(reason, 0) + n
        if first and log_first:
            log(f"{_ACTIVE[-1].command}: warning: {reason}")
    elif log_first:
        log(f"warning: {reason}")


# LLM requests waiting for an answer (the client registers each one; the heartbeat reports them)
_WAITING: dict[int, float] = {}
_WAITING_LOCK = threading.Lock()
_WAIT_SEQ = [0]


def llm_wait_begin() -> int:
    with _WAITING_LOCK:
        _WAIT_SEQ[0] += 1
        _WAITING[_WAIT_SEQ[0]] = time.monotonic()
        return _WAIT_SEQ[0]


def llm_wait_end(token: int) -> None:
    with _WAITING_LOCK:
        _WAITING.pop(token, None)


def llm_waiting() -> tuple[int, float]:
    """(LLM requests waiting now, age in seconds of the oldest)."""
    with _WAITING_LOCK:
        if not _WAITING:
            return 0, 0.0
        return len(_WAITING), time.monotonic() - min(_WAITING.values())


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


HEARTBEAT_DEFAULT_S = 30.0


def heartbeat_line(label: str, s: Summary) -> str:
    n, age = llm_waiting()
    done = s.written + s.rejected + s.dropped
    line = (f"{label}: heartbeat {s.seconds():.0f}s: read {s.read}, done {done} (written {s.written}, "
            f"rejected {s.rejected}, filtered {s.dropped}), in flight {s.in_flight}, "
            f"llm requests waiting {n}" + (f" (oldest {age:.0f}s)" if n else ""))
    if s.meter is not None and hasattr(s.meter, "snapshot"):
        m = s.meter.snapshot()
        line += f", llm requests done {m.get('requests', 0)}"
        if m.get("retries") or m.get("errors"):
            line += f", retries {m.get('retries', 0)}, failed {m.get('errors', 0)}"
    return line


class Progress:
    """The TTY progress line; when it is off (stderr not a terminal: scripts, CI, Slurm logs) a
    heartbeat line every `heartbeat` seconds instead (0 = none), so a stage waiting on a slow model
    is never silent."""

    def __init__(self, enabled: bool | None, label: str, heartbeat: float | None = HEARTBEAT_DEFAULT_S):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.label = label
        self._last = 0.0
        self.heartbeat = float(HEARTBEAT_DEFAULT_S if heartbeat is None else heartbeat)
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, s: Summary) -> None:
        """Start the heartbeat thread (only when the progress line is off)."""
        if self.enabled or self.heartbeat <= 0 or self._thread is not None:
            return
        self._stop = threading.Event()

        def beat(stop: threading.Event = self._stop) -> None:
            while not stop.wait(self.heartbeat):
                log(heartbeat_line(self.label, s))

        self._thread = threading.Thread(target=beat, name="toolkit-heartbeat", daemon=True)
        self._thread.start()

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
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            self._thread = None
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
