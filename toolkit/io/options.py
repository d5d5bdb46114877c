"""The stream options (IOOptions) and the stable --shard partition."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from toolkit.io.base import UsageError
from toolkit.io.lines import DEFAULT_MAX_LINE_BYTES


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
    heartbeat: float = 30.0  # seconds between heartbeat lines when progress is off (0 = none)

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
            heartbeat=float(30.0 if cfg.get("heartbeat") is None else cfg["heartbeat"]),
        )
