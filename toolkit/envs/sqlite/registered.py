"""Where a registered sqlite domain lives: the registry's "domains" entries of scope "sqlite" (the
bundled ones, registered by `toolkit.domains`, and any a plugin registers). Here, below
`toolkit.domains`, so that the sqlite backend finds a domain by name without importing the
package that replays its tasks on the backend."""

from __future__ import annotations

import re
from pathlib import Path

from toolkit import registry

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def list_domains() -> list[str]:
    """Names of the registered sqlite domains (the bundled ones and any a plugin registers)."""
    return registry.names("domains", "sqlite")


def domain_path(name: str) -> Path:
    """Directory of a registered sqlite domain; KeyError (listing the known ones) when there is none."""
    e = registry.lookup("domains", name, "sqlite") if isinstance(name, str) and _NAME_RE.match(name) else None
    if e is None or not (Path(e.obj) / "schema.sql").is_file():
        raise KeyError(f"unknown bundled sqlite domain {str(name)[:80]!r}; known: {list_domains()}")
    return Path(e.obj)
