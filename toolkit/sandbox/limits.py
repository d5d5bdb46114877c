"""Sandbox limits: `SandboxLimits`, the operator's limits (the ceiling for everything a record asks
for), their parsing and validation, and the clamping of what data asks for."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from toolkit.io import log, note_for_provenance
from toolkit.sandbox.result import SandboxError


@dataclass
class SandboxLimits:
    cpu_seconds: float = 5
    wall_seconds: float = 10
    memory_mb: int = 512
    file_size_mb: int = 16
    max_processes: int = 32
    network: bool = False
    # the largest database a sqlite environment may hold (PRAGMA max_page_count on its in-memory
    # database: a domain's seed and every write at call time); its SQL at call time gets
    # wall_seconds per tool call (toolkit.envs.sqlite.guard.SqlBudget)
    db_size_mb: int = 256


# ----------------------------------------------------------------------------------------------
# operator limits: the ceiling for everything a record asks for

# the largest value any limit may take (a day, 1 TiB, 4096 processes): larger values are refused
# here rather than overflowing a timeout or an rlimit in the worker
LIMIT_MAX = {"cpu_seconds": 86400.0, "wall_seconds": 86400.0, "memory_mb": 1 << 20,
             "file_size_mb": 1 << 20, "max_processes": 4096, "db_size_mb": 1 << 20}
_INT_LIMITS = ("memory_mb", "file_size_mb", "max_processes", "db_size_mb")
_OPERATOR_LIMITS: SandboxLimits | None = None  # set_operator_limits(); else $TOOLKIT_SANDBOX_LIMITS


def _limit_value(key: str, v: Any) -> float | int:
    """A valid value of a numeric limit, or ValueError saying why not."""
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{key}: expected a number, got {v!r}")
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{key}: expected a positive finite number, got {v!r}")
    if v > LIMIT_MAX[key]:
        raise ValueError(f"{key}: {v!r} is above the maximum {LIMIT_MAX[key]}")
    return max(1, int(v)) if key in _INT_LIMITS else float(v)


def check_limits(limits: SandboxLimits) -> SandboxLimits:
    """`limits` with every value valid (ValueError naming the field otherwise)."""
    out = SandboxLimits()
    for k in LIMIT_MAX:
        setattr(out, k, _limit_value(k, getattr(limits, k)))
    if not isinstance(limits.network, bool):
        raise ValueError(f"network: expected true or false, got {limits.network!r}")
    out.network = limits.network
    return out


def parse_limits(value: Any, base: SandboxLimits | None = None) -> SandboxLimits:
    """Operator limits from a mapping or a JSON object string (`--sandbox-limits`, recipe key
    `sandbox_limits`, env TOOLKIT_SANDBOX_LIMITS): keys of SandboxLimits; unset keys keep `base`
    (default: the built-in defaults). Strict: ValueError on anything invalid."""
    out = SandboxLimits(**asdict(base)) if base is not None else SandboxLimits()
    if value is None or value == "":
        return out
    if isinstance(value, SandboxLimits):
        return check_limits(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"sandbox limits: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"sandbox limits: expected an object like {{\"memory_mb\": 512}}, got {value!r}")
    for k, v in value.items():
        if k == "network":
            if not isinstance(v, bool):
                raise ValueError(f"sandbox limits: network: expected true or false, got {v!r}")
            out.network = v
        elif k in LIMIT_MAX:
            try:
                setattr(out, k, _limit_value(k, v))
            except ValueError as e:
                raise ValueError(f"sandbox limits: {e}") from None
        else:
            raise ValueError(f"sandbox limits: unknown key {k!r} (known: {', '.join(list(LIMIT_MAX) + ['network'])})")
    return out


def operator_limits() -> SandboxLimits:
    """The operator's limits: `set_operator_limits(...)`, else $TOOLKIT_SANDBOX_LIMITS (JSON), else
    the SandboxLimits defaults. Generated code gets these unless a record narrows them."""
    if _OPERATOR_LIMITS is not None:
        return SandboxLimits(**asdict(_OPERATOR_LIMITS))
    try:
        return parse_limits(os.environ.get("TOOLKIT_SANDBOX_LIMITS"))
    except ValueError as e:
        raise SandboxError(f"TOOLKIT_SANDBOX_LIMITS: {e}") from None


def set_operator_limits(value: Any) -> SandboxLimits:
    """Set the operator's limits (`--sandbox-limits`, recipe `sandbox_limits`); None resets to the
    environment / defaults. ValueError on an invalid value."""
    global _OPERATOR_LIMITS
    _OPERATOR_LIMITS = None if value is None else parse_limits(value)
    return operator_limits()


def clamp_limits(requested: Any, operator: SandboxLimits | None = None) -> tuple[SandboxLimits, list[str]]:
    """What data (a record's env config) asked for, held to the operator's limits: a record may
    only narrow them. Returns (the limits to use, one note per value that was not granted as
    asked). Never raises on bad data: an invalid value keeps the operator's."""
    op = operator if operator is not None else operator_limits()
    out = SandboxLimits(**asdict(op))
    notes: list[str] = []
    if requested is None:
        return out, notes
    if isinstance(requested, SandboxLimits):
        requested = asdict(requested)
    if not isinstance(requested, dict):
        return out, [f"limits: expected an object, got {type(requested).__name__}; the operator's limits apply"]
    for k, v in requested.items():
        if k == "network":
            if v is True and not op.network:
                notes.append("network: a record cannot turn network access on (only the operator can); off")
            elif v is False:
                out.network = False
            elif v is not True:
                notes.append(f"network: {_short_repr(v)} is not true/false; the operator's {op.network} applies")
        elif k in LIMIT_MAX:
            opv = getattr(op, k)
            try:
                val = _limit_value(k, v)
            except ValueError:
                notes.append(f"{k}: {_short_repr(v)} is not a valid value; the operator's {opv:g} applies")
                continue
            if val > opv:
                notes.append(f"{k}: {_short_repr(v)} is above the operator's limit; clamped to {opv:g}")
            else:
                setattr(out, k, val)
        else:
            notes.append(f"{_short_repr(k)}: not a sandbox limit; ignored")
    return out, notes


_LOGGED: set[str] = set()  # clamp messages already logged (once per distinct message)


def limits_for_data(requested: Any, backend: str) -> tuple[SandboxLimits, list[str]]:
    """`clamp_limits` for the limits a record's env config asks for (`env.config.limits`): each
    value not granted as asked goes to the record's provenance (`sandbox_clamped`) and, once per
    distinct message, to stderr naming the backend. A `SandboxLimits` object is operator code's:
    checked, not clamped."""
    if isinstance(requested, SandboxLimits):
        return check_limits(requested), []
    limits, notes = clamp_limits(requested)
    for n in notes:
        note_for_provenance("sandbox_clamped", n)
    msg = "; ".join(notes)
    if msg and msg not in _LOGGED:
        _LOGGED.add(msg)
        log(f"{backend} env: sandbox limits asked for by the data were not granted: {msg}")
    return limits, notes


def _short_repr(v: Any, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."
