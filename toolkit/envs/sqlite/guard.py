"""The SQL sandbox of the sqlite backend (docs/sandbox.md, "LLM-written SQL").

- `_DomainGuard`: the allow-list authorizer (and a time budget) under which a domain's own SQL
  (schema.sql, seed.sql, triggers) runs at compile time; a refusal is a DomainError naming the
  statement and line.
- `_DENY` / `_DENIED_FUNCTIONS`: what the environment's connection refuses at run time (DDL,
  ATTACH, PRAGMA, out-of-database functions); `_harden`: the connection switches the
  authorizer cannot express (no extensions, no attached databases).
- `SqlBudget`: the time budget (a progress handler) every statement runs under, at compile time
  (30 s per domain text) and at call time (the operator's `wall_seconds` per tool call);
  `cap_size`: the database size cap (PRAGMA max_page_count, the operator's `db_size_mb`).
"""

from __future__ import annotations

import contextlib
import math
import re
import sqlite3
import time
from typing import Any, Iterator

from toolkit.envs.sqlite.domain import DomainError
from toolkit.envs.sqlite.sqltext import _blank_strings, _short, _split_comments

# -- the SQL authorizer for domain texts ---------------------------------------------------------
# Every SQL text of a domain (schema.sql, seed.sql, the triggers) may come from an LLM or a user:
# it runs under an allow-list authorizer on an in-memory connection, so it can build tables and
# rows and nothing else (docs/sandbox.md, "LLM-written SQL").


def _codes(*names: str) -> frozenset[int]:
    return frozenset(getattr(sqlite3, n) for n in names if hasattr(sqlite3, n))


_DOMAIN_ALLOW = _codes(
    "SQLITE_CREATE_TABLE", "SQLITE_CREATE_INDEX", "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_VIEW",
    "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_TEMP_INDEX", "SQLITE_CREATE_TEMP_TRIGGER",
    "SQLITE_CREATE_TEMP_VIEW", "SQLITE_DROP_TABLE", "SQLITE_DROP_INDEX", "SQLITE_DROP_TRIGGER",
    "SQLITE_DROP_VIEW", "SQLITE_DROP_TEMP_TABLE", "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_TRIGGER",
    "SQLITE_DROP_TEMP_VIEW", "SQLITE_ALTER_TABLE", "SQLITE_INSERT", "SQLITE_UPDATE", "SQLITE_DELETE",
    "SQLITE_SELECT", "SQLITE_READ", "SQLITE_FUNCTION", "SQLITE_RECURSIVE", "SQLITE_TRANSACTION",
    "SQLITE_SAVEPOINT", "SQLITE_PRAGMA", "SQLITE_REINDEX", "SQLITE_ANALYZE")
# PRAGMAs that neither touch files nor change the engine's safety (the rest are refused)
_SAFE_PRAGMAS = frozenset({
    "foreign_keys", "defer_foreign_keys", "foreign_key_check", "foreign_key_list", "table_info",
    "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "integrity_check",
    "quick_check", "user_version", "application_id", "encoding", "page_count", "freelist_count",
    "data_version"})
# SQL functions that reach outside the database (load_extension is also off at the connection)
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_DENIED_CALL_RE = re.compile(r"\b(load_extension|fts3_tokenizer)\s*\(", re.IGNORECASE)
_MAX_VALUE_BYTES = 10_000_000  # SQLITE_LIMIT_LENGTH: the largest string / blob / row
_DOMAIN_SQL_SECONDS = 30.0  # wall-time budget of one domain SQL text (a runaway recursive seed)
_PROGRESS_OPS = 100  # SQLite VM instructions between two looks at the clock (a write call: 200-800)


class SqlBudget:
    """A wall-time budget on a connection's statements: SQLite's progress handler looks at the
    clock every `_PROGRESS_OPS` VM instructions (triggers and CTEs included) and interrupts the
    running statement once the deadline is past (sqlite3.OperationalError "interrupted"; SQLite
    then rolls back the open transaction). One mechanism for the domain's SQL at compile time
    (`_DomainGuard`) and every statement at call time (`SqliteEnvironment`).

    `cap_deadline` (set by the environment around a write while its database has no size cap
    yet, see `SqliteEnvironment._write`; in this thread's CPU seconds, so a busy machine does not
    trip it) interrupts that write too once it is past (`wants_cap`): the write gets the cap put
    in place and runs again."""

    __slots__ = ("deadline", "cap_deadline", "cap_wall", "expired", "seconds", "wants_cap")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.deadline = math.inf
        self.cap_deadline = math.inf
        # the monotonic time at which cap_deadline can first be past: a thread spends at most
        # as much CPU as wall time, so the (costlier) CPU clock is read only after it
        self.cap_wall = math.inf
        self.seconds = math.inf
        self.expired = False  # the last budget ran out (the handler interrupted a statement)
        self.wants_cap = False  # the handler interrupted a write to put the size cap in place
        conn.set_progress_handler(self._check, _PROGRESS_OPS)

    def _check(self) -> int:
        now = time.monotonic()
        if now > self.deadline:
            self.expired = True
            return 1
        if self.cap_deadline != math.inf and now > self.cap_wall and time.thread_time() > self.cap_deadline:
            self.wants_cap = True
            return 1
        return 0

    def start(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = self.wants_cap = False
        self.deadline = time.monotonic() + seconds

    def stop(self) -> None:
        """No budget until the next start()."""
        self.deadline = math.inf

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No budget inside (a rollback after an interrupt must run); the same deadline after."""
        saved = self.deadline, self.cap_deadline
        self.deadline = self.cap_deadline = math.inf
        try:
            yield
        finally:
            self.deadline, self.cap_deadline = saved

    def interrupted(self, e: BaseException) -> bool:
        """`e` is the interrupt of a statement that ran out of this budget."""
        return self.expired and _is_interrupt(e)

    def cap_wanted(self, e: BaseException) -> bool:
        """`e` is the interrupt of a write that ran long before the size cap was in place."""
        return self.wants_cap and not self.expired and _is_interrupt(e)


def _is_interrupt(e: BaseException) -> bool:
    return isinstance(e, sqlite3.OperationalError) and "interrupted" in str(e)


def max_pages(mb: int, page_size: int) -> int:
    return max(1, (int(mb) << 20) // int(page_size or 4096))


def cap_size(conn: sqlite3.Connection, mb: int) -> None:
    """At most `mb` MB in the connection's main database (PRAGMA max_page_count; a write beyond it
    fails with SQLITE_FULL "database or disk is full"). Per connection and reset by deserialize();
    after a deserialize this PRAGMA also makes SQLite parse the schema again (~0.5 ms on airline)."""
    page = conn.execute("PRAGMA page_size").fetchone()[0] or 4096
    conn.execute(f"PRAGMA max_page_count = {max_pages(mb, page)}")


def is_full(e: BaseException) -> bool:
    """`e` is SQLite's "database or disk is full" (the size cap was reached)."""
    return isinstance(e, sqlite3.OperationalError) and (
        getattr(e, "sqlite_errorname", "") == "SQLITE_FULL" or "database or disk is full" in str(e))


def _harden(conn: sqlite3.Connection) -> None:
    """Connection-level switches that the authorizer cannot express."""
    if hasattr(conn, "enable_load_extension"):
        conn.enable_load_extension(False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)


class _DomainGuard:
    """The allow-list authorizer (and a time budget) around one compile connection."""

    def __init__(self, conn: sqlite3.Connection, db_size_mb: int) -> None:
        self.conn = conn
        self.refused: list[tuple[str, str]] = []  # (what, regex locating it in the SQL text)
        self.db_size_mb = int(db_size_mb)
        _harden(conn)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)  # as on the environment's connection
        cap_size(conn, self.db_size_mb)  # before the authorizer (which refuses this PRAGMA)
        conn.set_authorizer(self._authorize)
        self.budget = SqlBudget(conn)

    def _refuse(self, what: str, where: str) -> int:
        self.refused.append((what, where))
        return sqlite3.SQLITE_DENY

    def _authorize(self, action: int, a1: Any, a2: Any, db: Any, _trigger: Any) -> int:
        if action == sqlite3.SQLITE_ATTACH:
            return self._refuse(f"ATTACH / VACUUM INTO {a1!r} (a file outside the domain)",
                                r"\b(ATTACH|VACUUM)\b")
        if action == sqlite3.SQLITE_DETACH:
            return self._refuse(f"DETACH {a1!r}", r"\bDETACH\b")
        if action not in _DOMAIN_ALLOW:
            kind = _ACTION_NAMES.get(action, str(action))
            if action == getattr(sqlite3, "SQLITE_CREATE_VTABLE", -1):
                return self._refuse(f"CREATE VIRTUAL TABLE {a1!r} USING {a2!r}", r"\bVIRTUAL\b")
            return self._refuse(f"{kind} {a1 or ''}".strip(), r"\b" + kind.split("_")[0] + r"\b")
        if db is not None and db not in ("main", "temp"):
            return self._refuse(f"a write or read in database {db!r} (only the domain's own database)",
                                re.escape(str(db)))
        if action == sqlite3.SQLITE_PRAGMA and str(a1 or "").lower() not in _SAFE_PRAGMAS:
            return self._refuse(f"PRAGMA {a1}" + (f" = {a2}" if a2 is not None else "")
                                + " (only PRAGMAs that touch no file: " + ", ".join(sorted(_SAFE_PRAGMAS)) + ")",
                                r"\bPRAGMA\b[^;]*\b" + re.escape(str(a1 or "")) + r"\b")
        if action == sqlite3.SQLITE_FUNCTION and str(a2 or "").lower() in _DENIED_FUNCTIONS:
            return self._refuse(f"function {a2}()", r"\b" + re.escape(str(a2)) + r"\s*\(")
        return sqlite3.SQLITE_OK

    def _refusal(self, name: str, what: str, sql: str) -> str:
        refused, where = self.refused[0]
        return (f"{name}: {what} refused by the SQL sandbox: {refused}{_locate(sql, where)}. "
                "A domain's SQL may only CREATE/DROP tables, indexes, triggers and views and read or "
                "write their rows: no ATTACH/DETACH, VACUUM INTO, load_extension or PRAGMAs that touch files")

    def run(self, name: str, what: str, sql: str, failed: str, *, script: bool = True) -> None:
        """Execute one domain SQL text; DomainError naming `what` (schema.sql, seed, triggers) on
        a refusal, `failed` ("schema does not compile") on any other SQLite error."""
        self.refused.clear()
        # a trigger or view body is authorized only when a statement that uses it is prepared:
        # refuse the out-of-database functions in the text now (the runtime authorizer refuses
        # them again at call time)
        m = _DENIED_CALL_RE.search(sql) and _DENIED_CALL_RE.search(_blank_strings(_split_comments(sql)[0]))
        if m:
            self.refused.append((f"function {m.group(1)}()", r"\b" + m.group(1) + r"\s*\("))
            raise DomainError(self._refusal(name, what, sql))
        self.budget.start(_DOMAIN_SQL_SECONDS)
        try:
            if script:
                self.conn.executescript(sql)
            else:
                self.conn.execute(sql)
        except sqlite3.Error as e:
            if self.refused:
                raise DomainError(self._refusal(name, what, sql)) from None
            if self.budget.interrupted(e):
                raise DomainError(f"{name}: {what} ran longer than {_DOMAIN_SQL_SECONDS:g} s "
                                  "(a runaway recursive query?)") from None
            if is_full(e):
                raise DomainError(too_big(name, what, self.db_size_mb)) from None
            raise DomainError(f"{name}: {failed}: {e}") from None
        finally:
            self.budget.stop()


def too_big(name: str, what: str, mb: int) -> str:
    return (f"{name}: {what} makes the database larger than {mb} MB (the operator's db_size_mb "
            "limit: --sandbox-limits '{\"db_size_mb\": N}')")


_ACTION_NAMES = {getattr(sqlite3, n): n[len("SQLITE_"):] for n in (
    "SQLITE_CREATE_VTABLE", "SQLITE_DROP_VTABLE") if hasattr(sqlite3, n)}


def _locate(sql: str, pattern: str) -> str:
    """' (statement N, line L: <text>)' for the first statement of `sql` matching `pattern`."""
    rx = re.compile(pattern, re.IGNORECASE)
    start = line = 0
    n = scanned = 0
    for m in re.finditer(";", sql):
        stmt = sql[start:m.end()]
        scanned += len(stmt)
        if scanned > 50_000_000:  # bounded work on a hostile text (semicolons inside long strings)
            break
        if not sqlite3.complete_statement(stmt):
            continue
        n += 1
        code = _blank_strings(_split_comments(stmt)[0])
        if rx.search(code):
            lead = len(stmt) - len(stmt.lstrip())
            lineno = line + stmt[:lead].count("\n") + 1
            return f" (statement {n}, line {lineno}: {_short(' '.join(stmt.split()), 120)})"
        line += stmt.count("\n")
        start = m.end()
    return ""


def _deny_codes() -> frozenset[int]:
    names = [n for n in dir(sqlite3) if n.startswith(("SQLITE_CREATE_", "SQLITE_DROP_"))]
    names += ["SQLITE_ALTER_TABLE", "SQLITE_ATTACH", "SQLITE_DETACH", "SQLITE_PRAGMA", "SQLITE_REINDEX",
              "SQLITE_ANALYZE"]
    return frozenset(getattr(sqlite3, n) for n in names if hasattr(sqlite3, n))


_DENY = _deny_codes()
