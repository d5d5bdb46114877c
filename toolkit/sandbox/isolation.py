"""Which isolation generated code runs under: the names, the process default
(`set_default_isolation`, $TOOLKIT_SANDBOX_ISOLATION) and what actually ran (`used_isolation`)."""

from __future__ import annotations

import os

ISOLATIONS = ("namespaces", "docker", "none-unsafe")


def normalize_isolation(name: str | None) -> str:
    """"namespaces" | "docker" | "none-unsafe" ("auto" and "" mean "namespaces": never a silent
    downgrade). "none" is refused: running generated code unisolated must be spelled out."""
    n = (name or "namespaces").strip().lower()
    if n in ("auto", "namespaces", "ns", "process"):
        return "namespaces"
    if n in ("docker", "none-unsafe"):
        return n
    if n in ("none", "off", "no"):
        raise ValueError(f"sandbox isolation {name!r}: to run generated code WITHOUT kernel isolation "
                         "say so explicitly with 'none-unsafe'")
    raise ValueError(f"unknown sandbox isolation {name!r}; use {'|'.join(ISOLATIONS)}")


_DEFAULT_ISOLATION: str | None = None  # set_default_isolation(); else $TOOLKIT_SANDBOX_ISOLATION
_USED: set[str] = set()


def _default_isolation() -> str:
    return normalize_isolation(_DEFAULT_ISOLATION or os.environ.get("TOOLKIT_SANDBOX_ISOLATION")
                               or "namespaces")


def set_default_isolation(name: str | None) -> str:
    """The isolation generated code runs under (`--sandbox-isolation`, recipe `sandbox_isolation`):
    "namespaces" (default), "docker" (the docker backend) or "none-unsafe" (explicit opt-out)."""
    global _DEFAULT_ISOLATION
    _DEFAULT_ISOLATION = normalize_isolation(name) if name else None
    return _default_isolation()


def _note_used(isolation: str) -> None:
    _USED.add(isolation)


def used_isolation() -> str | None:
    """The isolation(s) generated code actually ran under in this process ("" joined), or None."""
    return ",".join(sorted(_USED)) or None
