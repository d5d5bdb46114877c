"""SQLite request cache for LLM calls.

Key: sha256 of the canonical JSON of everything that determines the reply (model, messages,
tools, tool protocol, sampling params incl. seed, and an optional `sample_index`).  Values are
ChatResult dicts.  The database runs in WAL mode with a busy timeout, so several processes may
read and write the same file at once; within a process one connection is shared under a lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from typing import Any

__all__ = ["ResponseCache", "cache_key", "canonical_json", "CACHE_VERSION"]

CACHE_VERSION = 1


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def cache_key(payload: dict) -> str:
    return hashlib.sha256(canonical_json({"v": CACHE_VERSION, **payload}).encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, path: str):
        self.path = os.path.abspath(os.path.expanduser(path))
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False,
                                     isolation_level=None)
        with self._lock:
            self._conn.execute("PRAGMA busy_timeout=60000")
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:  # pragma: no cover - e.g. a read-only or network FS
                pass
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                "model TEXT, created REAL)")
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM responses WHERE key=?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: dict, model: str | None = None) -> None:
        data = json.dumps(value, ensure_ascii=False, default=str)
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO responses (key, value, model, created) "
                               "VALUES (?, ?, ?, ?)", (key, data, model, time.time()))

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error:  # pragma: no cover
                pass


_OPEN: dict[str, ResponseCache] = {}
_OPEN_LOCK = threading.Lock()


def open_cache(path: str) -> ResponseCache:
    """One ResponseCache per file per process."""
    full = os.path.abspath(os.path.expanduser(path))
    with _OPEN_LOCK:
        c = _OPEN.get(full)
        if c is None:
            c = _OPEN[full] = ResponseCache(full)
        return c
