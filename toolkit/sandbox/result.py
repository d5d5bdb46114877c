"""What a sandbox call returns (`SandboxResult`) and the sandbox's own errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SandboxResult:
    ok: bool
    value: Any = None
    # e.g. "TimeoutError: wall time 10s exceeded", "MemoryError: ...", or "Type: msg" + short traceback
    error: str | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    killed: str | None = None  # "wall_timeout" | "cpu_limit" | "memory" | signal name
    error_type: str | None = None  # exception class name when the code raised
    isolation: str | None = None  # "namespaces" | "docker" | "none-unsafe": what the code ran under


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code running in it)."""


class SandboxUnavailable(SandboxError):
    """The requested sandbox backend cannot be used on this machine."""
