"""The compiled sqlite domain kept between processes (runtime.compiled_from_path's disk cache,
toolkit.diskcache): a second process reads the domain instead of compiling it, and it is the
same domain; an edited file, other operator limits or a code change miss; a damaged file is
ignored, counted and rewritten; the cache can be turned off."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.envs.sqlite import runtime as R
from toolkit.envs.sqlite.domain import CompiledDomain
from toolkit.sandbox.limits import set_operator_limits

ROOT = Path(__file__).resolve().parents[2]
GYM = ROOT / "tests" / "data" / "gym"


@pytest.fixture
def dom_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(R.DISK_CACHE_ENV, raising=False)
    R.DISK_STATS.clear()
    R._DOMAIN_CACHE.clear()
    d = tmp_path / "gym"
    shutil.copytree(GYM, d)
    yield d
    R._DOMAIN_CACHE.clear()
    set_operator_limits(None)


def entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "home" / R.DISK_SUBDIR).glob("*.pkl"))


def fresh(d: Path) -> CompiledDomain:
    """What a new process gets: the in-process cache emptied first."""
    R._DOMAIN_CACHE.clear()
    return R.compiled_from_path(d)


def behaviour(dom: CompiledDomain) -> dict:
    """What an agent and a scorer see of the domain: tools, initial state and its hash, and the
    outcome of a write and of a refused write."""
    env = R.SqliteEnvironment(dom)
    try:
        env.reset()
        snap = env.snapshot()
        tools = sorted(t["function"]["name"] for t in env.tools())
        h0 = env.state_hash()
        outs = []
        for name, schema in sorted(dom.tools.items()):
            if schema.kind == "update":
                tbl = dom.tables[schema.table]
                row = snap[schema.table][0] if snap.get(schema.table) else None
                if row is None:
                    continue
                args = {k: row[k] for k in tbl.pk}
                r = env.call(name, args)  # nothing to change: an error or a no-op, either way the same
                outs.append((name, r.ok, json.dumps(r.content, sort_keys=True, default=str)[:200],
                             (r.error or {}).get("code")))
        return {"tools": tools, "h0": h0, "initial_hash": dom.initial_hash, "outs": outs,
                "state": json.dumps(snap, sort_keys=True, default=str), "rules": sorted(dom.rules)}
    finally:
        env.close()


def test_second_process_reads_the_same_domain(dom_dir, tmp_path):
    cold = fresh(dom_dir)
    assert R.DISK_STATS["miss"] == 1 and R.DISK_STATS["stored"] == 1 and len(entries(tmp_path)) == 1
    warm = fresh(dom_dir)
    assert R.DISK_STATS["hit"] == 1 and warm is not cold
    b = behaviour(cold)
    assert b["outs"] and b["tools"] and b["rules"]  # something to compare
    assert behaviour(warm) == b
    # what a process learnt running the domain stays with it: the read domain starts empty
    assert cold.state_cache or cold.canon_cache  # (the cold one ran, above)
    again = fresh(dom_dir)
    assert not again.state_cache and not again.canon_cache and not again.row_memos and again.content_ids == {}
    assert again.lock is not warm.lock and again.lock.acquire(blocking=False)
    again.lock.release()


def test_a_new_process_uses_the_file(dom_dir, tmp_path):
    fresh(dom_dir)
    code = ("import sys, json; from toolkit.envs.sqlite import runtime as R; d = R.compiled_from_path(sys.argv[1]); "
            "print(json.dumps([dict(R.DISK_STATS), d.initial_hash]))")
    p = subprocess.run([sys.executable, "-c", code, str(dom_dir)], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "TOOLKIT_HOME": str(tmp_path / "home")}, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    stats, h = json.loads(p.stdout)
    assert stats == {"hit": 1} and h == fresh(dom_dir).initial_hash


def test_an_edited_domain_or_other_limits_miss(dom_dir, tmp_path):
    base = fresh(dom_dir)
    pol = dom_dir / "policy.md"
    pol.write_text(pol.read_text() + "\n- One more sentence nobody reads.\n")
    edited = fresh(dom_dir)
    assert R.DISK_STATS["miss"] == 2 and len(entries(tmp_path)) == 2
    assert edited.spec.policy != base.spec.policy
    set_operator_limits({"db_size_mb": 64})
    fresh(dom_dir)
    assert R.DISK_STATS["miss"] == 3 and len(entries(tmp_path)) == 3
    set_operator_limits(None)  # back to the first key
    fresh(dom_dir)
    assert R.DISK_STATS["hit"] == 1
    # a file the spec is not read from (tasks, notes, a large data file) is not part of the key
    (dom_dir / "tasks.jsonl").write_text('{"id": "t1"}\n' * 1000)
    fresh(dom_dir)
    assert R.DISK_STATS["hit"] == 2 and len(entries(tmp_path)) == 3


def test_a_damaged_file_is_ignored_counted_and_rewritten(dom_dir, tmp_path, capsys):
    cold = fresh(dom_dir)
    (f,) = entries(tmp_path)
    raw = bytearray(f.read_bytes())
    raw[-10] ^= 0xFF
    f.write_bytes(bytes(raw))
    again = fresh(dom_dir)
    assert R.DISK_STATS["corrupt"] == 1 and R.DISK_STATS["hit"] == 0
    assert "sqlite domain cache" in capsys.readouterr().err
    assert behaviour(again) == behaviour(cold)
    fresh(dom_dir)
    assert R.DISK_STATS["hit"] == 1  # rewritten whole
    for junk in (b"", b"junk", R.DISK_MAGIC + b"0" * 64 + b"\nnot a pickle"):
        f.write_bytes(junk)
        fresh(dom_dir)
    assert R.DISK_STATS["corrupt"] == 4


def test_a_valid_file_of_another_kind_is_refused(dom_dir, tmp_path):
    fresh(dom_dir)
    (f,) = entries(tmp_path)
    key = R._disk_key(dom_dir.resolve())
    # a well-formed entry under the right key that holds something else than a domain
    R.diskcache.write(f, key, {"not": "a domain"}, R.DISK_MAGIC, R.DISK_STATS, "test", 10)
    dom = fresh(dom_dir)
    assert isinstance(dom, CompiledDomain) and R.DISK_STATS["corrupt"] == 1


def test_off(dom_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(R.DISK_CACHE_ENV, "0")
    fresh(dom_dir)
    fresh(dom_dir)
    assert entries(tmp_path) == [] and not R.DISK_STATS
