"""The run summary (one stderr line, the stage log $TOOLKIT_STAGE_LOG), drop reasons and the TTY progress line."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from toolkit.io.base import log


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
