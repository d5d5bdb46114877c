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

Safe to delete; the newest `MAX_ENTRIES` entries are kept. The file format, its checks and what
happens to a file that does not read back (ignored, counted in `STATS["corrupt"]`, said on
stderr, never used) are toolkit.diskcache's. `search_cache: false` (recipe / CLI) or
TOOLKIT_LOGIGEN_SEARCH_CACHE=0 turns it off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import random
from collections import Counter
from pathlib import Path
from typing import Any

from toolkit import diskcache

FORMAT = 3
MAGIC = b"TKLGSEARCH3\n"
ENV = "TOOLKIT_LOGIGEN_SEARCH_CACHE"
SUBDIR = "logigen-search"
WHAT = "gen-task: rule search cache"
STATS: Counter = Counter()  # hit | miss | corrupt | stored | store_failed | pruned (this process)
MAX_ENTRIES = 256  # the oldest entries beyond it are deleted when one is written
FIELDS = ("violations", "pending", "stuck", "boundaries", "impossible", "dropped", "draws", "errors", "seed",
          "_two_left")
_CODE_DIRS = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent.parent / "envs" / "sqlite")


def enabled(option: bool) -> bool:
    return diskcache.enabled(ENV, option)


def code_version() -> str:
    """sha256 of the source of the modules the search runs (read once per process)."""
    return diskcache.source_digest(_CODE_DIRS)


def search_key(env: Any, rseed: int, options: dict) -> str:
    spec = {k: v for k, v in dataclasses.asdict(env.domain.spec).items() if k != "source"}
    parts = [FORMAT, code_version(), spec, env.state_hash(), env.config, rseed, options]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


def path_of(key: str) -> Path:
    return diskcache.path_of(SUBDIR, key)


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
    """What a later run needs to go on from where `cov`'s search is now (the violation searches
    still pending, the boundaries searched)."""
    return {"fields": {k: getattr(cov, k) for k in FIELDS}, "rng": cov.rng.getstate(), "searched": list(searched),
            "started": started}


def restore(cov: Any, snap: dict) -> None:
    for k in FIELDS:
        setattr(cov, k, snap["fields"][k])
    cov.rng = random.Random()
    cov.rng.setstate(snap["rng"])


def load(key: str, base: dict, rules: list[str]) -> dict | None:
    """The entry of `key` when it reads back whole and fits these rules, else None (counted)."""
    def check(snap: Any) -> None:
        f = snap["fields"]
        if (set(f["violations"]) != set(rules) or set(f["boundaries"]) != set(rules)
                or not set(snap["searched"]) <= set(rules) or not isinstance(snap["started"], bool)
                or not set(f["pending"]) <= set(rules) or (f["pending"] and snap["searched"])):
            raise ValueError("rules differ")

    return diskcache.read(path_of(key), key, MAGIC, STATS, WHAT, unpickler=lambda f: _Unpickler(f, base),
                          check=check)


def store(key: str, base: dict, snap: dict) -> None:
    """Write the entry atomically; a cache that cannot be written is no error (counted)."""
    diskcache.write(path_of(key), key, snap, MAGIC, STATS, WHAT, MAX_ENTRIES, pickler=lambda f: _Pickler(f, base))
