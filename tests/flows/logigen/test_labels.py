"""Honest labels (toolkit.flows.logigen.labels) on hand-built tasks of the carrental test domain,
whose correct archetype / tags / level are worked out by hand below, and the `tags` verdict of
validate-task that recomputes them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from toolkit.envs import load_env
from toolkit.flows.logigen.labels import (
    analyze_path,
    facts_from_trace,
    labels,
)
from toolkit.flows.logigen.replay import run_traced, waterfall
from toolkit.schema import Record
from toolkit.stages import strategies

ENV = {"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "carrental")}


def facts_of(actions, texts):
    """The facts by replaying (analyze_path, validation's path); the generator's own trace
    (replay.run_traced + facts_from_trace) must give the same facts."""
    env = load_env(ENV)
    try:
        facts = analyze_path(env, None, actions, texts)
        assert facts_from_trace(run_traced(env, env.snapshot(), actions), texts) == facts
        return facts
    finally:
        env.close()


def test_direct_single_write_the_user_names():
    # the user names rental 1 themselves: one write, nothing looked up -> Direct, no tags, L1
    acts = [{"name": "query_rental", "arguments": {"rental_id": 1}},
            {"name": "update_rental", "arguments": {"rental_id": 1, "extras": 2}}]
    f = facts_of(acts, ["Please put 2 extras on my rental 1."])
    assert (f["writes"], f["read_dependent"], f["state_dependent"], f["waterfall"]) == (1, 0, 0, 0)
    assert labels(f, False, [], []) == {"archetype": "Direct", "tags": [], "level": "L1", "points": 0}


def test_rookie_key_found_by_a_look_up():
    # the user only knows their car; rental_id 1 comes from the query's result -> Rookie;
    # one write, no menu: no tags; one point (read dependency) -> L1
    acts = [{"name": "query_rental", "arguments": {"car_id": "SP-404"}},
            {"name": "update_rental", "arguments": {"rental_id": 1, "extras": 2}}]
    f = facts_of(acts, ["I have the VW Polo, car SP-404; please add two extras."])
    assert (f["writes"], f["read_dependent"]) == (1, 1)
    lab = labels(f, False, ["lookup"], [])
    assert (lab["archetype"], lab["tags"], lab["level"]) == ("Rookie", [], "L1")


def test_entangled_chain_with_a_created_row_and_a_waterfall():
    # book a car (the booking marks the car rented: a side effect UPDATING another table's row,
    # a waterfall), then change the new booking, whose id only the insert's result carries.
    # writes 2, read-dependent (6), entangled (the update alone on s_origin finds no rental 6),
    # waterfall -> Entangled; Multi-Step, State-Based, Waterfall; points 3 -> L2
    acts = [{"name": "insert_rental", "arguments": {"customer_id": "C-101", "car_id": "NH-101",
                                                     "start_date": "2025-06-05", "days": 3}},
            {"name": "update_rental", "arguments": {"rental_id": 6, "days": 4}}]
    f = facts_of(acts, ["I am customer C-101: book car NH-101 from 2025-06-05 for 3 days, then make it 4 days."])
    assert (f["writes"], f["read_dependent"], f["state_dependent"], f["waterfall"]) == (2, 1, 1, 1)
    lab = labels(f, False, ["uses-created-row"], [])
    assert lab["archetype"] == "Entangled"
    assert lab["tags"] == ["Multi-Step", "State-Based", "Waterfall"] and lab["level"] == "L2"


def test_mismatch_is_not_adversarial_unless_the_user_insists():
    # 5 extras are refused (extras_limit), 3 accepted; the booking marks the car rented (waterfall)
    acts = [{"name": "insert_rental", "arguments": {"customer_id": "C-101", "car_id": "NH-101",
                                                     "start_date": "2025-06-05", "days": 3, "extras": 5},
             "expect_error": "POLICY_VIOLATION"},
            {"name": "insert_rental", "arguments": {"customer_id": "C-101", "car_id": "NH-101",
                                                     "start_date": "2025-06-05", "days": 3, "extras": 3}}]
    f = facts_of(acts, ["customer C-101, car NH-101 from 2025-06-05, 3 days, 5 extras (else 3)"])
    assert f["violation_first"] and f["writes"] == 1
    lab = labels(f, False, ["violation-first", "correction"], [])
    assert lab["archetype"] == "Mismatch"
    assert lab["tags"] == ["Conditional-Logic", "Waterfall", "Hidden-Constraint"] and lab["level"] == "L2"
    assert "Adversarial" in labels(f, False, ["violation-first", "insist"], [])["tags"]


def test_journal_rows_are_not_a_waterfall():
    env = load_env(ENV)
    try:
        before = env.snapshot()
        after = {k: [dict(r) for r in v] for k, v in before.items()}
        after["ledger"].append({"entry_id": 9, "note": "booked"})          # a journal row appended
        assert not waterfall(env, "rental", before, after)
        after["car"][0]["status"] = "rented"                                  # an existing row updated
        assert waterfall(env, "rental", before, after)
    finally:
        env.close()


def test_an_unchanged_table_is_no_waterfall_even_with_a_repeated_key():
    """Where the two copies of the waterfall test differed: labels.py's compared every row of every
    other table by key, so an unchanged table holding two rows with one key (the last one kept in
    the by-key index) read as an updated row; the kept definition skips unchanged tables."""
    env = load_env(ENV)
    try:
        before = env.snapshot()
        car = before["car"][0]
        twin = dict(car, status="twin-" + str(car.get("status")))  # same key, other values
        before["car"] = [twin] + [dict(r) for r in before["car"]]
        after = {k: [dict(r) for r in v] for k, v in before.items()}
        assert after["car"] == before["car"]
        assert not waterfall(env, "rental", before, after)
        after["car"][1]["status"] = "rented"  # the keyed row itself changes: a waterfall
        assert waterfall(env, "rental", before, after)
    finally:
        env.close()


def test_tags_verdict_recomputes_the_labels():
    fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": 6, "seed": 5}, None)
    recs = asyncio.run(fn(Record.model_validate({"id": "car", "env": ENV})))
    good = recs[0]
    bad = Record.model_validate(good.dump())
    bad.task.complexity["archetype"] = "Edge" if good.task.complexity["archetype"] != "Edge" else "Rookie"
    bad.task.complexity["tags"] = ["Adversarial"]
    bad.task.complexity["level"] = "L3" if good.task.complexity["level"] != "L3" else "L1"
    bad.id = "bad"
    vfn = strategies.build("validate-task", {"strategy": "logigen", "domain_check": False}, None)

    async def go():
        return [await vfn(r) for r in (good, bad)]

    out = asyncio.run(go())
    tags = {r.id: next(v for v in r.verdicts if v.name == "tags") for r in out}
    assert tags[good.id].passed
    assert not tags["bad"].passed
    assert any("archetype" in x for x in tags["bad"].reasons) and any("tags" in x for x in tags["bad"].reasons)


def test_generated_rows_follow_types_and_constraints():
    # realistic volume (set_designer.generate_rows): 200 new rows that load under the schema's
    # constraints (CHECKs, enums, foreign keys), with fresh keys, not copies of existing rows
    import random

    from toolkit.flows.logigen.explorer import DomainView, canonical_state
    from toolkit.flows.logigen.set_designer import generate_rows

    env = load_env(ENV)
    try:
        view = DomainView(env)
        state = env.snapshot()
        rows = generate_rows(view, state, "car", 200, random.Random(3))
        assert len(rows) == 200
        assert len({r["car_id"] for r in rows} | {r["car_id"] for r in state["car"]}) == 200 + len(state["car"])
        assert {r["category"] for r in rows} <= {"compact", "suv", "van"}
        assert {r["branch_id"] for r in rows} <= {b["branch_id"] for b in state["branch"]}
        assert all(r["daily_rate"] > 0 for r in rows)
        old = [{k: v for k, v in r.items() if k != "car_id"} for r in state["car"]]
        assert sum({k: v for k, v in r.items() if k != "car_id"} in old for r in rows) < 5
        loaded = canonical_state(env, dict(state, car=state["car"] + rows))  # constraints hold
        assert len(loaded["car"]) == len(state["car"]) + 200
    finally:
        env.close()


def test_generator_trace_matches_an_independent_replay():
    # every drafted task's trace (one run: hashes, tables changed, label facts) against the
    # independent computations: hash_state of the stored states, DIFF, analyze_path
    from toolkit.flows.logigen.synth import GoalDesigner

    env = load_env(ENV)
    try:
        drafts = GoalDesigner(env, env.snapshot(), 3).drafts(12, 8)
        assert len(drafts) == 12
        steps = 0
        for d in drafts:
            tr = d.trace
            texts = ["customer " + " ".join(str(v) for v in d.actions[0]["arguments"].values())]
            assert facts_from_trace(tr, texts) == analyze_path(env, d.origin, d.actions, texts)
            assert (tr["h_origin"], tr["h_target"]) == (env.hash_state(d.origin), env.hash_state(d.target))
            assert tr["tables_changed"] == sorted(env.diff(d.origin, d.target)["tables"])
            steps += sum(s["write"] for s in tr["steps"])
        assert steps >= 12  # every task writes
    finally:
        env.close()
