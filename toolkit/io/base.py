"""The two exceptions every command meets (UsageError: exit 2; StageError: one record rejected)
and `log` (everything human goes to stderr)."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.stderr.flush()


class UsageError(Exception):
    """Bad invocation (exit code 2)."""


class StageError(Exception):
    """Raised by a stage for one record: the record goes to rejects with this message."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field
