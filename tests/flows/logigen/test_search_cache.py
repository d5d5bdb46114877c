"""The lazy rule search and its per-domain cache (synth.GoalDesigner, search_cache.py): a warm
cache gives the cold output, a bad entry is ignored and counted, an edited domain misses, and a
run searches only the violations and boundaries its plan draws."""

from __future__ import annotations

import asyncio
import json
import shutil
import zlib
from pathlib import Path

import pytest

from toolkit.envs import load_env
from toolkit.flows.logigen import search_cache
from toolkit.flows.logigen.synth import GoalDesigner
from toolkit.schema import Record
from toolkit.stages import strategies
from toolkit.flows.logigen import options as O

ROOT = Path(__file__).resolve().parents[3]
CARRENTAL = ROOT / "tests" / "data" / "carrental"
VET = ROOT / "tests" / "data" / "vet"


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("TOOLKIT_HOME", str(h))
    monkeypatch.delenv(search_cache.ENV, raising=False)
    search_cache.STATS.clear()
    return h


def run(domain: Path, n: int, seed: int = 3, **cfg) -> list[str]:
    fn = strategies.build("gen-task", dict({"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": seed},
                                           **cfg), None)
    out = asyncio.run(fn(Record.model_validate({"id": "c", "env": {"backend": "sqlite", "path": str(domain)}})))
    lines = []
    for r in out:
        x = json.loads(r.model_dump_json())
        for p in x.get("provenance") or []:
            p.pop("time", None)
            p.pop("sandbox_isolation", None)
        lines.append(json.dumps(x, sort_keys=True))
    return lines


def entries(home: Path) -> list[Path]:
    return sorted((home / "logigen-search").glob("*.pkl"))


# vet: its appointments and invoices belong to an owner through the pet; a search state and a
# chain state can hold the same appointment row under pets of different owners (a row's owner
# once memoized by the row's content alone made the warm run draw other tasks than the cold one)
@pytest.mark.parametrize("domain,n", [(CARRENTAL, 30), (VET, 40)], ids=["carrental", "vet"])
def test_warm_cache_gives_the_cold_output(home, domain, n):
    cold = run(domain, n, seed=11, search_cache=False)
    assert not entries(home) and search_cache.STATS["hit"] == 0
    first = run(domain, n, seed=11)  # a miss: searched, stored
    assert search_cache.STATS["miss"] == 1 and search_cache.STATS["stored"] == 1 and len(entries(home)) == 1
    warm = run(domain, n, seed=11)  # a hit: nothing searched again
    assert search_cache.STATS["hit"] == 1
    assert first == cold and warm == cold
    # a partial entry (-n 1 searched no boundary) resumes to the same full results
    shutil.rmtree(home / "logigen-search")
    assert len(run(domain, 1, seed=11)) == 1
    hits = search_cache.STATS["hit"]
    assert run(domain, n, seed=11) == cold and search_cache.STATS["hit"] == hits + 1


def test_a_corrupt_entry_is_ignored_and_counted(home, capfd):
    cold = run(CARRENTAL, 12)
    (p,) = entries(home)
    raw = bytearray(p.read_bytes())
    raw[-20] ^= 0xFF  # one flipped byte in the pickled body: the checksum no longer matches
    p.write_bytes(bytes(raw))
    assert run(CARRENTAL, 12) == cold
    assert search_cache.STATS["corrupt"] == 1 and search_cache.STATS["hit"] == 0
    assert "ignored" in capfd.readouterr().err
    assert run(CARRENTAL, 12) == cold and search_cache.STATS["hit"] == 1  # rewritten whole
    for junk in (b"", b"not a cache file", search_cache.MAGIC + b"0" * 64 + b"\n" + b"junk"):
        p.write_bytes(junk)
        assert run(CARRENTAL, 12) == cold
    assert search_cache.STATS["corrupt"] == 4


def test_an_entry_of_another_key_is_not_used(home):
    run(CARRENTAL, 6)
    (p,) = entries(home)
    other = search_cache.path_of("f" * 64)
    shutil.copy(p, other)  # a valid file under the wrong name: its key inside does not match
    assert search_cache.load("f" * 64, {}, []) is None and search_cache.STATS["corrupt"] == 1


def test_an_edited_domain_misses(home, tmp_path):
    d = tmp_path / "carrental"
    shutil.copytree(CARRENTAL, d)
    run(d, 6)
    assert len(entries(home)) == 1 and search_cache.STATS["miss"] == 1
    run(d, 6)
    assert search_cache.STATS["hit"] == 1
    with open(d / "policy.md", "a", encoding="utf-8") as f:
        f.write("\nRenters are greeted by name.\n")
    run(d, 6)
    assert search_cache.STATS["miss"] == 2 and len(entries(home)) == 2
    run(d, 6, seed=4)  # another seed: another search
    assert search_cache.STATS["miss"] == 3


def designer(n: int, plan_only: bool = False, **cfg) -> tuple[GoalDesigner, list]:
    env = load_env({"backend": "sqlite", "path": str(CARRENTAL)})
    g = GoalDesigner(env, env.snapshot(), 11, O.GenTaskOptions(search_cache=False, **cfg))
    try:
        drafts = g.plan(n) if plan_only else g.drafts(n, 8)
    finally:
        g.close()
        env.close()
    return g, drafts


def test_n1_searches_no_boundary_it_does_not_draw(home):
    g, drafts = designer(1)
    assert len(drafts) == 1 and drafts[0].attempt is not None  # the plan's first task: violation-first
    assert g.searched == [] and g.cov.draws == {}
    rep = g.coverage(drafts)
    assert rep["boundary_unsearched"] == g.cov.rules and rep["missing_boundary"] == []
    full, _ = designer(60)
    assert full.searched == full.cov.rules and "boundary_unsearched" not in full.coverage([])
    # a plan one task past the violation-first ones searches up to the first rule with a boundary
    k = sum(1 for ws in full.cov.violations.values() if ws)
    first_edge = next(r for r in full.cov.rules if full.cov.boundaries[r])
    part, plan = designer(k + 1, plan_only=True)
    assert plan[-1] == ("edge", first_edge) and len(plan) == k + 1
    assert part.searched == full.cov.rules[:full.cov.rules.index(first_edge) + 1]
    assert {r: len(b) for r, b in part.cov.boundaries.items() if r in part.searched} == \
        {r: len(b) for r, b in full.cov.boundaries.items() if r in part.searched}


def test_old_entries_are_pruned(home, monkeypatch):
    monkeypatch.setattr(search_cache, "MAX_ENTRIES", 2)
    for seed in (1, 2, 3):
        run(CARRENTAL, 2, seed=seed)
    assert len(entries(home)) == 2 and search_cache.STATS["pruned"] == 1


def test_resume_from_a_partial_boundary_search(home):
    cold = run(CARRENTAL, 30, search_cache=False)
    env = load_env({"backend": "sqlite", "path": str(CARRENTAL)})
    try:  # the designer gen-task builds for record "c", seed 3, whose plan needs one boundary
        g = GoalDesigner(env, env.snapshot(), zlib.crc32(b"3:c"))
        k = len(g.violation_rules())
        g.plan(k + 1)
        g.close()
    finally:
        env.close()
    assert 0 < len(g.searched) < len(g.cov.rules) and search_cache.STATS["stored"] == 1
    assert run(CARRENTAL, 30) == cold and search_cache.STATS["hit"] == 1


def test_n1_runs_no_violation_search_it_does_not_draw(home):
    """carrental: s_origin's probes find no witness for some rules; their own search (the domain
    check's, ~0.1-0.4 CPU-s a rule) runs only when the plan reaches them, and the tasks are those
    of a designer that searched every rule first."""
    lazy, drafts = designer(1)
    none = [r for r in lazy.cov.rules if not lazy.cov.violations[r]]
    assert len(none) >= 2 and lazy.cov.pending[:len(none)] == none  # none searched for one task
    rep = lazy.coverage(drafts)
    assert rep["violation_unsearched"] == lazy.cov.pending and len(drafts) == 1
    env = load_env({"backend": "sqlite", "path": str(CARRENTAL)})
    try:
        eager = GoalDesigner(env, env.snapshot(), 11, O.GenTaskOptions(search_cache=False))
        eager._settle()  # every violation search first (what the designer did before it was lazy)
        assert eager.cov.pending == []
        first = eager.drafts(1, 8)
        eager.close()
    finally:
        env.close()
    assert [d.actions for d in first] == [d.actions for d in drafts]
    assert "violation_unsearched" not in eager.coverage(first)
    # settling a rule runs the pending searches before it, in their order, and no more, and
    # gives the witnesses of the full search; no boundary is searched meanwhile
    full, _ = designer(60)
    assert full.cov.pending == []
    found = next(r for r in none if full.cov.violations[r])  # a rule only its own search finds
    env = load_env({"backend": "sqlite", "path": str(CARRENTAL)})
    try:
        part = GoalDesigner(env, env.snapshot(), 11, O.GenTaskOptions(search_cache=False))
        part._settle(found)
        part.close()
    finally:
        env.close()
    k = lazy.cov.pending.index(found) + 1
    assert part.cov.pending == lazy.cov.pending[k:]
    assert {r: len(part.cov.violations[r]) for r in lazy.cov.pending[:k]} == \
        {r: len(full.cov.violations[r]) for r in lazy.cov.pending[:k]}
    assert part.searched == [] and part.cov.draws == {}


def test_resume_from_a_partial_violation_search(home):
    cold = run(CARRENTAL, 30, search_cache=False)
    one = run(CARRENTAL, 1)  # stores s_origin's witnesses, the rule searches still pending
    assert json.loads(one[0])["task"]["extra"]["rule_coverage"]["violation_unsearched"]
    assert search_cache.STATS["stored"] == 1
    assert run(CARRENTAL, 30) == cold and search_cache.STATS["hit"] == 1 and search_cache.STATS["stored"] == 2
