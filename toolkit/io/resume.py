"""--resume: the ids already in --output (a bounded-memory IdSet) and trimming the torn tail a
killed run leaves (plain or .gz; the temp file of a .gz rewrite that was itself killed is removed
by the next resume)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import sqlite3
import tempfile
from typing import Iterator

from toolkit.io.base import UsageError, log
from toolkit.io.lines import InputCut, _is_std, open_lines


def _tmp_name(path: str, pid: int) -> str:
    return f"{path}.resume-{pid}.tmp"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # another user's process (or a pid this host cannot have: not ours to judge)
    return True


def remove_stale_tmp(path: str) -> list[str]:
    """Remove the `<path>.resume-<pid>.tmp` files left by a resume that was killed while it
    rewrote a torn .gz (its pid is gone); a live pid's file is another resume's, left alone.
    Returns the removed paths."""
    d, base = os.path.split(os.path.abspath(path))
    rx = re.compile(re.escape(base) + r"\.resume-(\d+)\.tmp")
    removed = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    for name in names:
        m = rx.fullmatch(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(d, name))
            removed.append(os.path.join(d, name))
    if removed:
        log(f"resume: removed {len(removed)} temp file(s) of an earlier resume that was killed while "
            f"rewriting {path}: {', '.join(os.path.basename(r) for r in removed)}")
    return removed


def _trim_torn_tail(path: str) -> None:
    """A SIGKILL mid-write can leave a last line without newline: drop it (it will be redone).
    First, the temp files of an earlier resume killed during a .gz rewrite go (`remove_stale_tmp`)."""
    remove_stale_tmp(path)
    if not os.path.exists(path):
        return
    if path.endswith(".gz"):
        _trim_torn_gz(path)
        return
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # scan back to the previous newline
        pos = size - 1
        chunk = 65536
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            idx = buf.rfind(b"\n")
            if idx >= 0:
                f.truncate(start + idx + 1)
                return
            pos = start
        f.truncate(0)


def _gz_data(path: str, state: dict) -> Iterator[bytes]:
    """Decompressed chunks of a (multi-member) gzip file, as far as it decompresses; afterwards
    `state["clean"]` says whether it ended on a member boundary without an error. zlib directly:
    gzip.GzipFile drops the data it buffered when it hits the torn end."""
    import zlib

    state["clean"] = False
    with open(path, "rb") as f:
        d = zlib.decompressobj(31)
        in_member = False
        while True:
            buf = f.read(1 << 16)
            if not buf:
                break
            while buf:
                if not in_member and not buf.strip(b"\0"):  # zero padding after the last member
                    buf = b""
                    break
                in_member = True
                try:
                    out = d.decompress(buf)
                except zlib.error:
                    return
                if out:
                    yield out
                if d.eof:
                    buf, in_member = d.unused_data, False
                    d = zlib.decompressobj(31)
                else:
                    buf = b""
        state["clean"] = not in_member


def _gz_whole_lines(path: str) -> tuple[bool, int]:
    """(clean, keep): `keep` = decompressed bytes up to the last newline before any torn or corrupt
    end; `clean` = every gzip member is complete and the data ends with a newline (or is empty)."""
    total = keep = 0
    last = b"\n"
    state: dict = {}
    for chunk in _gz_data(path, state):
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = total + nl + 1
        total += len(chunk)
        last = chunk[-1:]
    return bool(state["clean"]) and last == b"\n", keep


def _trim_torn_gz(path: str) -> None:
    """A kill mid-write leaves a .gz whose last member has no end (and maybe a torn line): rewrite
    the file, atomically, with its whole lines only (they stay; the rest is redone), so appending a
    new member gives a file `gzip -dc` reads and each id once. A clean file is left as it is."""
    with open(path, "rb") as f:
        head = f.read(2)
    if len(head) == 2 and head != b"\x1f\x8b":
        raise UsageError(f"--resume: {path} ends in .gz but is not gzip data (first bytes {head!r})")
    clean, keep = _gz_whole_lines(path)
    if clean:
        return
    tmp = _tmp_name(path, os.getpid())
    try:
        with open(tmp, "wb") as raw_out:
            with gzip.GzipFile(fileobj=raw_out, mode="wb", mtime=0) as dst:
                left = keep
                for chunk in _gz_data(path, {}):
                    if left <= 0:
                        break
                    dst.write(chunk[:left])
                    left -= len(chunk)
            raw_out.flush()
            os.fsync(raw_out.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    log(f"resume: {path} ended in a torn gzip member (a killed run); rewrote it with its "
        f"{keep} bytes of whole lines, the rest is redone")


def existing_ids(path: str) -> "IdSet":
    ids = IdSet()
    if _is_std(path) or not os.path.exists(path):
        return ids
    try:
        for raw in open_lines(path):
            if not raw.strip():
                continue
            try:
                rid = json.loads(raw).get("id")
            except (ValueError, RecursionError, AttributeError):
                continue
            if isinstance(rid, str):
                ids.add(rid)
    except InputCut as cut:  # only when the file changed under us: what was read counts
        log(f"resume: {path} is cut ({cut}); ids before the cut are skipped, the rest redone")
    return ids


# ----------------------------------------------------------------------------------------------
# bounded-memory id set


class IdSet:
    """A set of ids by 64-bit digest: in memory up to `spill_at`, then in a temp SQLite file,
    so memory stays flat on inputs of millions of lines."""

    def __init__(self, spill_at: int = 50_000):
        self._mem: set[int] = set()
        self._spill_at = spill_at
        self._db: sqlite3.Connection | None = None
        self._tmp: str | None = None
        self._n = 0

    @staticmethod
    def _key(rid: str) -> int:
        return int.from_bytes(hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest(), "big", signed=True)

    def __contains__(self, rid: str) -> bool:
        k = self._key(rid)
        if k in self._mem:
            return True
        if self._db is not None:
            return self._db.execute("SELECT 1 FROM ids WHERE k=?", (k,)).fetchone() is not None
        return False

    def add(self, rid: str) -> bool:
        """Add; return False when already present."""
        k = self._key(rid)
        if k in self._mem:
            return False
        if self._db is not None:
            cur = self._db.execute("INSERT OR IGNORE INTO ids(k) VALUES (?)", (k,))
            if cur.rowcount == 0:
                return False
        else:
            self._mem.add(k)
            if len(self._mem) >= self._spill_at:
                self._spill()
        self._n += 1
        return True

    def _spill(self) -> None:
        fd, self._tmp = tempfile.mkstemp(prefix="toolkit-ids-", suffix=".sqlite")
        os.close(fd)
        self._db = sqlite3.connect(self._tmp, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA cache_size=-8000")  # ~8 MB page cache
        self._db.execute("CREATE TABLE ids(k INTEGER PRIMARY KEY) WITHOUT ROWID")
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO ids(k) VALUES (?)", ((k,) for k in self._mem))
        self._db.execute("COMMIT")
        self._mem = set()

    def __len__(self) -> int:
        return self._n

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._tmp and os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __del__(self) -> None:  # pragma: no cover
        with contextlib.suppress(Exception):
            self.close()
