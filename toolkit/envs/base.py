"""The Environment protocol every backend implements, plus canonical state hashing and DIFF.

An environment is rebuilt from the `env` field of a record (an `EnvRef`-shaped dict) with
`load_env(ref)`. Backends register themselves by name with `register_backend`.

Contract
--------
- `tools(side)`      OpenAI function schemas (`{"type": "function", "function": {...}}`); side is
                     "agent" or "user" (dual-control domains such as tau2 telecom have user tools).
- `policy()`         the domain policy / wiki text shown to the agent.
- `reset(state)`     restore the initial state (or the given state dict).
- `call(name, args)` -> ToolResult: a success payload or a structured error
                     {code, message, violated_rule, hint}; never raises for tool-level failures.
- `acall(...)`       async variant; defaults to running `call` (backends that need an LLM override it).
- `snapshot()`       canonical JSON-able state: {table: [row dicts]}.
- `state_hash()`     sha256 of the canonical dump of snapshot().
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

# ----------------------------------------------------------------------------------------------
# Tool results


@dataclass
class ToolResult:
    ok: bool
    content: Any = None
    error: dict | None = None  # {code, message, violated_rule, hint}

    @classmethod
    def success(cls, content: Any) -> "ToolResult":
        return cls(ok=True, content=content)

    @classmethod
    def fail(cls, code: str, message: str, violated_rule: str | None = None,
             hint: str | None = None) -> "ToolResult":
        return cls(ok=False, error={"code": code, "message": message,
                                    "violated_rule": violated_rule, "hint": hint})

    @property
    def is_policy_violation(self) -> bool:
        return (not self.ok) and bool(self.error) and self.error.get("code") == "POLICY_VIOLATION"

    def to_content(self) -> str:
        """The string placed in the `tool` message content."""
        if self.ok:
            if isinstance(self.content, str):
                return self.content
            return json.dumps(self.content, ensure_ascii=False, sort_keys=True, default=str)
        return json.dumps({"error": self.error}, ensure_ascii=False, sort_keys=True)


# ----------------------------------------------------------------------------------------------
# Canonical state


def _canon_value(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return repr(v)
        if v.is_integer():
            return int(v)
        return float(repr(round(v, 9)))
    if isinstance(v, dict):
        return {str(k): _canon_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canon_value(x) for x in v]
    return v


def _row_key(row: Any) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonicalize(state: dict) -> dict:
    """Normalize a state: floats formatted, key order sorted (at dump), rows sorted per table."""
    out: dict = {}
    for table in sorted(state):
        rows = state[table]
        if isinstance(rows, list):
            crow = [_canon_value(r) for r in rows]
            crow.sort(key=_row_key)
            out[table] = crow
        else:
            out[table] = _canon_value(rows)
    return out


def canonical_dump(state: dict) -> str:
    return json.dumps(canonicalize(state), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)


def state_hash(state: dict) -> str:
    return "sha256:" + hashlib.sha256(canonical_dump(state).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------------
# DIFF (LOGIGEN): sum over tables of |rows(T,a) symmetric-difference rows(T,b)|

DEFAULT_EXCLUDE_KEYS = ("created_at", "updated_at", "timestamp", "rowid")


def _project(rows: Iterable[dict], exclude: set[str]) -> list[str]:
    out = []
    for r in rows:
        if isinstance(r, dict):
            r = {k: _canon_value(v) for k, v in r.items() if k not in exclude}
        out.append(_row_key(r))
    return out


def diff(a: dict, b: dict, exclude_keys: Iterable[str] = DEFAULT_EXCLUDE_KEYS,
         tables: Iterable[str] | None = None) -> dict:
    """Per-table symmetric-difference counts between two states (multiset semantics).

    Returns {"total": int, "tables": {table: {"only_a": n, "only_b": n}}} (tables with 0 omitted).
    """
    from collections import Counter

    exclude = set(exclude_keys)
    names = set(tables) if tables is not None else (set(a) | set(b))
    per: dict[str, dict[str, int]] = {}
    total = 0
    for t in sorted(names):
        ca = Counter(_project(a.get(t, []) or [], exclude))
        cb = Counter(_project(b.get(t, []) or [], exclude))
        only_a = sum((ca - cb).values())
        only_b = sum((cb - ca).values())
        if only_a or only_b:
            per[t] = {"only_a": only_a, "only_b": only_b}
            total += only_a + only_b
    return {"total": total, "tables": per}


# ----------------------------------------------------------------------------------------------
# The protocol


class Environment:
    """Base class for environment backends (see module docstring for the contract)."""

    backend: str = "base"

    def tools(self, side: str = "agent") -> list[dict]:
        raise NotImplementedError

    def policy(self) -> str:
        return ""

    def reset(self, state: dict | None = None) -> None:
        raise NotImplementedError

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        raise NotImplementedError

    async def acall(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        return self.call(name, args, side=side)

    def snapshot(self) -> dict:
        raise NotImplementedError

    def state_hash(self) -> str:
        return state_hash(self.snapshot())

    def close(self) -> None:
        pass

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class BackendInfo:
    name: str
    factory: Callable[[dict], Environment]
    doc: str = ""
    extra: dict = field(default_factory=dict)


_BACKENDS: dict[str, BackendInfo] = {}


def register_backend(name: str, factory: Callable[[dict], Environment], doc: str = "") -> None:
    _BACKENDS[name] = BackendInfo(name, factory, doc)


def backends() -> dict[str, BackendInfo]:
    return dict(_BACKENDS)


def load_env(ref: dict | Any) -> Environment:
    """Build an Environment from a record's `env` field (dict or pydantic model)."""
    if hasattr(ref, "model_dump"):
        ref = ref.model_dump(exclude_none=True)
    backend = (ref or {}).get("backend")
    if backend not in _BACKENDS:
        # import the built-in backends lazily so registration happens
        from toolkit import envs as _envs  # noqa: F401

        _envs.import_builtin_backends()
    if backend not in _BACKENDS:
        raise KeyError(f"unknown environment backend {backend!r}; known: {sorted(_BACKENDS)}")
    return _BACKENDS[backend].factory(ref)
