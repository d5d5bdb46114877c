"""Checksummed pickle files under $TOOLKIT_HOME: the one way the toolkit keeps a computed value
between processes (the compiled sqlite domains, LOGIGEN's rule search).

A file is `magic + sha256(body) + "\\n" + body`, the body a pickle of {"key": key, "value": value};
it is written atomically (temp file, rename) and a directory keeps its newest `max_entries`
files. A file that does not read back whole (another magic, a checksum mismatch, an unpickling
error, another key, a value the caller's `check` refuses) is ignored, counted (`stats["corrupt"]`)
and said on stderr, never used; a cache that cannot be written is no error (counted,
`stats["store_failed"]`). The checksum catches corruption, not tampering: the directory is the
user's own, trusted like their virtual environment. Every cache has an environment variable that
turns it off (0/off/false/no). Safe to delete.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolkit import home
from toolkit.io import log

OFF = ("0", "off", "false", "no")


def enabled(env: str, option: bool = True) -> bool:
    """`option` and the environment variable `env` not set to 0/off/false/no."""
    return bool(option) and os.environ.get(env, "1").strip().lower() not in OFF


@functools.lru_cache(maxsize=None)
def source_digest(dirs: tuple[Path, ...]) -> str:
    """sha256 of the names and content of the `*.py` files in `dirs` (the code a cached value
    depends on: any edit misses); read once per process."""
    h = hashlib.sha256()
    for d in dirs:
        for f in sorted(d.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def path_of(subdir: str, key: str) -> Path:
    return Path(home()) / subdir / f"{key[:40]}.pkl"


def read(path: Path, key: str, magic: bytes, stats: Counter, what: str,
         unpickler: Callable[[io.BytesIO], pickle.Unpickler] | None = None,
         check: Callable[[Any], None] | None = None, expect: type | None = None) -> Any | None:
    """The value stored under `key` at `path`, or None: absent (stats["miss"]) or defective
    (stats["corrupt"], said on stderr as `what ... ignored`). A value that is no `expect`, or
    that `check` raises on, is defective too."""
    try:
        raw = path.read_bytes()
    except OSError:
        stats["miss"] += 1
        return None
    try:
        if not raw.startswith(magic):
            raise ValueError("not a cache file of this kind")
        digest, _, body = raw[len(magic):].partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise ValueError("checksum mismatch")
        rec = (unpickler(io.BytesIO(body)) if unpickler else pickle.Unpickler(io.BytesIO(body))).load()
        if not isinstance(rec, dict) or rec.get("key") != key or "value" not in rec:
            raise ValueError("another key")
        if expect is not None and not isinstance(rec["value"], expect):
            raise ValueError(f"not a {expect.__name__}: {type(rec['value']).__name__}")
        if check is not None:
            check(rec["value"])
    except Exception as e:  # noqa: BLE001 - any defect: ignored, counted, said
        stats["corrupt"] += 1
        log(f"{what} {path} ignored ({type(e).__name__}: {e}); computing it again")
        return None
    stats["hit"] += 1
    return rec["value"]


def write(path: Path, key: str, value: Any, magic: bytes, stats: Counter, what: str, max_entries: int,
          pickler: Callable[[io.BytesIO], pickle.Pickler] | None = None) -> None:
    """Store `value` under `key` at `path` atomically, then keep the directory's newest
    `max_entries` files."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        buf = io.BytesIO()
        (pickler(buf) if pickler else pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)).dump(
            {"key": key, "value": value})
        body = buf.getvalue()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(magic + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        os.replace(tmp, path)
        stats["stored"] += 1
        prune(path.parent, max_entries, stats)
    except Exception as e:  # noqa: BLE001 - read-only home, full disk, an unpicklable value
        stats["store_failed"] += 1
        log(f"{what} not written ({type(e).__name__}: {e})")
        try:
            tmp.unlink()
        except OSError:
            pass


def prune(d: Path, max_entries: int, stats: Counter) -> None:
    """Keep the `max_entries` newest `*.pkl` files of `d`."""
    try:
        files = sorted(d.glob("*.pkl"), key=lambda f: f.stat().st_mtime_ns)
        for f in files[:max(0, len(files) - max_entries)]:
            f.unlink(missing_ok=True)
            stats["pruned"] += 1
    except OSError:  # another process pruned the same file first
        pass
