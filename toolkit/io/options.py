"""The stream options (IOOptions) and the stable --shard partition."""

from __future__ import annotations

import hashlib
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class IOOptions(BaseModel):
    """The stream options of every JSONL command (`RecordStream`): the one model of these keys; the
    commands' options models (`toolkit.options.StreamOpts`) inherit it, library code builds it."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    input: Optional[str] = None  # None or "-" = stdin
    output: Optional[str] = None  # None or "-" = stdout
    rejects: Optional[str] = None
    resume: bool = False
    shard: Optional[str] = Field(None, description="i/n: this process's part of a stable partition by record id")
    limit: Optional[int] = None
    unordered: bool = False
    progress: Optional[bool] = None  # None = auto (TTY)
    concurrency: int = 8
    # longer lines are rejected unread (bounded memory)
    max_line_bytes: int = Field(DEFAULT_MAX_LINE_BYTES, ge=1)
    heartbeat: float = Field(30.0, ge=0)  # seconds between stderr heartbeat lines when progress is off (0 = none)

    @field_validator("shard", mode="before")
    @classmethod
    def _shard(cls, v: Any) -> Any:
        if isinstance(v, (tuple, list)) and len(v) == 2:  # (i, n) from library code
            v = f"{v[0]}/{v[1]}"
        if v not in (None, ""):
            parse_shard(v)  # a usage error naming --shard
        return v or None

    @classmethod
    def for_reading(cls, src: Any) -> "IOOptions":
        """The stream options of a command that reads records and writes none to stdout (sft, grpo):
        the IO keys of `src` (an options model, extra keys included, or a mapping; None = unset),
        with no output and no resume."""
        if isinstance(src, BaseModel):
            src = {**src.model_dump(), **(src.__pydantic_extra__ or {})}
        keys = set(cls.model_fields) - {"output", "resume"}
        return cls.model_validate({k: v for k, v in (src or {}).items() if k in keys and v is not None})

    @property
    def shard_range(self) -> tuple[int, int] | None:
        """(i, n) of --shard, or None."""
        return parse_shard(self.shard)
