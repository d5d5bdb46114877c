"""Reading a domain's SQL text: comments and string literals, identifiers, CHECK (... IN ...)
enums, column types, table/column docs from comments, and trigger parsing (POLICY_VIOLATION
rules, written tables, notes). Also the short-repr helper of error messages."""

from __future__ import annotations

import re
from typing import Any

from toolkit.envs.sqlite.domain import TriggerInfo

_TOKEN_RE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?(?:\*/|$)", re.DOTALL)


def _split_comments(sql: str) -> tuple[str, list[str]]:
    """(sql with comments blanked, [comment texts]); string literals are kept intact."""
    comments: list[str] = []

    def sub(m: re.Match) -> str:
        t = m.group(0)
        if t.startswith("--"):
            comments.append(t[2:].strip())
            return " "
        if t.startswith("/*"):
            comments.append(t[2:].rstrip("/").rstrip("*").strip())
            return " "
        return t

    return _TOKEN_RE.sub(sub, sql), [c for c in comments if c]


def _blank_strings(code: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", code)


def _unquote_ident(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return s[1:-1].replace('""', '"')
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]":
        return s[1:-1]
    if len(s) >= 2 and s[0] == s[-1] == "`":
        return s[1:-1]
    return s


def qident(name: str) -> str:
    """Quote an identifier (only ever applied to names read from the compiled schema)."""
    return '"' + name.replace('"', '""') + '"'


_LITERAL_RE = re.compile(r"'((?:[^']|'')*)'|(-?\d+(?:\.\d+)?)")


def _parse_enum_checks(code: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for m in re.finditer(r"CHECK\s*\(\s*(\"[^\"]+\"|\w+)\s+IN\s*\(([^()]*)\)\s*\)", code, re.IGNORECASE):
        vals: list = []
        for lit in _LITERAL_RE.finditer(m.group(2)):
            if lit.group(1) is not None:
                vals.append(lit.group(1).replace("''", "'"))
            else:
                num = lit.group(2)
                vals.append(float(num) if "." in num else int(num))
        if vals:
            out[_unquote_ident(m.group(1))] = vals
    return out


def _json_type(decl: str) -> str | None:
    d = (decl or "").upper()
    if "INT" in d:
        return "integer"
    if "BOOL" in d:
        return "boolean"
    if any(k in d for k in ("CHAR", "CLOB", "TEXT", "DATE", "TIME", "UUID", "JSON")):
        return "string"
    if any(k in d for k in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
        return "number"
    if not d or "BLOB" in d:
        return None
    return "string"


def _table_docs(sql: str, colnames: set[str]) -> tuple[str, dict[str, str]]:
    """Table doc = comment on the CREATE TABLE line; column doc = trailing comment of its line."""
    lines = sql.splitlines()
    table_doc = ""
    col_docs: dict[str, str] = {}
    for i, line in enumerate(lines):
        code, comments = _split_comments(line)
        if not comments:
            continue
        text = " ".join(comments)
        if i == 0:
            table_doc = text
            continue
        m = re.match(r"\s*(\"[^\"]+\"|\w+)", code)
        if m and _unquote_ident(m.group(1)) in colnames:
            col_docs[_unquote_ident(m.group(1))] = text
    return table_doc, col_docs


_TRIGGER_HEAD = re.compile(
    r"CREATE\s+(?:TEMP(?:ORARY)?\s+)?TRIGGER\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>\"[^\"]+\"|[\w.]+)\s+"
    r"(?P<timing>BEFORE|AFTER|INSTEAD\s+OF)?\s*(?P<event>DELETE|INSERT|UPDATE)"
    r"(?:\s+OF\s+(?P<cols>.+?))?\s+ON\s+(?P<table>\"[^\"]+\"|[\w.]+)(?P<rest>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_RAISE_RE = re.compile(r"RAISE\s*\(\s*(ABORT|FAIL|ROLLBACK|IGNORE)\s*(?:,\s*'((?:[^']|'')*)')?\s*\)", re.IGNORECASE)
_PV_RE = re.compile(r"^\s*POLICY_VIOLATION\s*:\s*([^:]+?)\s*:\s*(.*)$", re.DOTALL)
_WRITE_RES = (
    ("inserts into", re.compile(r"\b(?:INSERT|REPLACE)\s+(?:OR\s+\w+\s+)?INTO\s+(\"[^\"]+\"|\w+)", re.IGNORECASE)),
    ("updates", re.compile(r"\bUPDATE\s+(?:OR\s+\w+\s+)?(\"[^\"]+\"|\w+)\s+SET\b", re.IGNORECASE)),
    ("deletes from", re.compile(r"\bDELETE\s+FROM\s+(\"[^\"]+\"|\w+)", re.IGNORECASE)),
)


def parse_trigger(name: str, table: str, sql: str) -> TriggerInfo:
    code, comments = _split_comments(sql)
    timing, event, cols, when = "BEFORE", "INSERT", [], None
    body = code
    m = _TRIGGER_HEAD.match(code.strip())
    if m:
        timing = re.sub(r"\s+", " ", (m.group("timing") or "BEFORE").upper())
        event = m.group("event").upper()
        if m.group("cols"):
            cols = [_unquote_ident(c) for c in m.group("cols").split(",") if c.strip()]
        rest = m.group("rest")
        rm = re.match(r"\s*(?:FOR\s+EACH\s+ROW\s+)?(?:WHEN\s+(?P<when>.+?)\s+)?BEGIN\b(?P<body>.*)$", rest, re.IGNORECASE | re.DOTALL)
        if rm:
            when = re.sub(r"\s+", " ", rm.group("when")).strip() if rm.group("when") else None
            body = rm.group("body")
    rules: list[tuple[str, str]] = []
    raw: list[str] = []
    for rm2 in _RAISE_RE.finditer(body):
        msg = (rm2.group(2) or "").replace("''", "'")
        if not msg:
            continue
        raw.append(msg)
        pv = _PV_RE.match(msg)
        if pv:
            rules.append((pv.group(1).strip(), pv.group(2).strip()))
    found: list[tuple[int, str, str]] = []
    plain = _blank_strings(body)
    for verb, rx in _WRITE_RES:
        for wm in rx.finditer(plain):
            found.append((wm.start(), verb, _unquote_ident(wm.group(1))))
    writes: list[tuple[str, str]] = []
    for _, verb, tbl in sorted(found):
        if (verb, tbl) not in writes:
            writes.append((verb, tbl))
    return TriggerInfo(name=name, table=table, timing=timing, event=event, columns=cols, when=when,
                       rules=rules, raw_messages=raw, writes=writes, notes=comments, sql=sql)


def _check_clauses(sql: str) -> list[str]:
    code, _ = _split_comments(sql)
    out = []
    for m in re.finditer(r"CHECK\s*\(", code, re.IGNORECASE):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        out.append(re.sub(r"\s+", " ", code[m.end():i - 1]).strip())
    return out


def _short(v: Any, n: int = 80) -> str:
    s = v if isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[:n] + f"...({len(s)} chars)"
