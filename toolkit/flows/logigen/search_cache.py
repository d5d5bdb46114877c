"""The rule search of one domain (rules.RuleCoverage: violation witnesses, boundary states), kept
under $TOOLKIT_HOME/logigen-search/ so a second `gen-task --strategy logigen` on the same domain
does not search again.

The key is a sha256 of everything the search reads: the domain's content (schema, tools, policy,
seed data: the DomainSpec without its path), the input's s_origin (its state hash), the
environment's config, the run's coverage seed, the search's options, and the source of the
modules that compute it (toolkit/flows/logigen and toolkit/envs/sqlite), so an edited domain, a
new seed or a code change misses. An entry holds the search's results AND its progress (the
rules searched so far, the random generator's state): a run that searched only the rules it
needed stores that prefix, a later run resumes it, and every run gets what a cold run of the
same search computes (the rules are searched in one fixed order, each from the generator's state
the previous one left).

Safe to delete; the newest `MAX_ENTRIES` entries are kept. A file is written atomically (temp file, rename); one that does not read back
(bad magic, checksum mismatch, unpickling error, another key, wrong shape) is ignored, counted
(`STATS["corrupt"]`) and reported on stderr, never used. `search_cache: false` (recipe / CLI) or
TOOLKIT_LOGIGEN_SEARCH_CACHE=0 turns it off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import random
from collections import Counter
from pathlib import Path
from typing import Any

from toolkit import home
from toolkit.io import log

FORMAT = 1
MAGIC = b"TKLGSEARCH1\n"
ENV = "TOOLKIT_LOGIGEN_SEARCH_CACHE"
STATS: Counter = Counter()  # hit | miss | corrupt | stored | store_failed | pruned (this process)
MAX_ENTRIES = 256  # the oldest entries beyond it are deleted when one is written
FIELDS = ("violations", "boundaries", "impossible", "dropped", "draws", "errors", "seed", "_two_left")
_CODE_DIRS = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent.parent / "envs" / "sqlite")
_code: list[str] = []


def enabled(option: bool) -> bool:
    return bool(option) and os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def code_version() -> str:
    """sha256 of the source of the modules the search runs (read once per process)."""
    if not _code:
        h = hashlib.sha256()
        for d in _CODE_DIRS:
            for f in sorted(d.glob("*.py")):
                h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        _code.append(h.hexdigest())
    return _code[0]


def search_key(env: Any, rseed: int, options: dict) -> str:
    spec = {k: v for k, v in dataclasses.asdict(env.domain.spec).items() if k != "source"}
    parts = [FORMAT, code_version(), spec, env.state_hash(), env.config, rseed, options]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


def path_of(key: str) -> Path:
    return Path(home()) / "logigen-search" / f"{key[:40]}.pkl"


class _Pickler(pickle.Pickler):
    def __init__(self, f: Any, base: dict):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.base = base

    def persistent_id(self, obj: Any) -> Any:
        return "s_origin" if obj is self.base else None  # s_origin by identity (chains test `is base`)


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: Any, base: dict):
        super().__init__(f)
        self.base = base

    def persistent_load(self, pid: Any) -> Any:
        if pid != "s_origin":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.base


def snapshot(cov: Any, searched: list[str], started: bool) -> dict:
    """What a later run needs to go on from where `cov`'s search is now."""
    return {"fields": {k: getattr(cov, k) for k in FIELDS}, "rng": cov.rng.getstate(), "searched": list(searched),
            "started": started}


def restore(cov: Any, snap: dict) -> None:
    for k in FIELDS:
        setattr(cov, k, snap["fields"][k])
    cov.rng = random.Random()
    cov.rng.setstate(snap["rng"])


def load(key: str, base: dict, rules: list[str]) -> dict | None:
    """The entry of `key` when it reads back whole and fits these rules, else None (counted)."""
    p = path_of(key)
    try:
        raw = p.read_bytes()
    except OSError:
        STATS["miss"] += 1
        return None
    try:
        if not raw.startswith(MAGIC):
            raise ValueError("not a search cache file")
        digest, _, body = raw[len(MAGIC):].partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise ValueError("checksum mismatch")
        snap = _Unpickler(io.BytesIO(body), base).load()
        if not isinstance(snap, dict) or snap.get("key") != key:
            raise ValueError("another key")
        f = snap["fields"]
        if (set(f["violations"]) != set(rules) or set(f["boundaries"]) != set(rules)
                or not set(snap["searched"]) <= set(rules) or not isinstance(snap["started"], bool)):
            raise ValueError("rules differ")
    except Exception as e:  # noqa: BLE001 - any defect: ignored, counted, said
        STATS["corrupt"] += 1
        log(f"gen-task: rule search cache {p} ignored ({type(e).__name__}: {e}); searching again")
        return None
    STATS["hit"] += 1
    return snap


def store(key: str, base: dict, snap: dict) -> None:
    """Write the entry atomically; a cache that cannot be written is no error (counted)."""
    p = path_of(key)
    tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
    try:
        buf = io.BytesIO()
        _Pickler(buf, base).dump({**snap, "key": key})
        body = buf.getvalue()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        os.replace(tmp, p)
        STATS["stored"] += 1
        _prune(p.parent)
    except Exception as e:  # noqa: BLE001 - read-only home, full disk, an unpicklable value
        STATS["store_failed"] += 1
        log(f"gen-task: rule search cache not written ({type(e).__name__}: {e})")
        try:
            tmp.unlink()
        except OSError:
            pass


def _prune(d: Path) -> None:
    """Keep the `MAX_ENTRIES` newest entries (a run per seed and domain adds one)."""
    try:
        files = sorted(d.glob("*.pkl"), key=lambda f: f.stat().st_mtime_ns)
        for f in files[:max(0, len(files) - MAX_ENTRIES)]:
            f.unlink(missing_ok=True)
            STATS["pruned"] += 1
    except OSError:  # another process pruned the same file first
        pass
