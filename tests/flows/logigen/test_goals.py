"""The goal explorer's candidate writes (toolkit.flows.logigen.goals.step_candidates): the lazy
form a chain step uses yields exactly the owned candidates of the eager list, and `only` drafts
for the named tools alone; the target-rule re-check gives the same verdict from a target's
database bytes as from its rows."""

from __future__ import annotations

import copy
import random

from tests.flows.logigen.test_labels import ENV
from toolkit.envs import load_env
from toolkit.flows.logigen.goals import GoalExplorer
from toolkit.flows.logigen.validate import target_rule_violations


def _explorer():
    env = load_env(ENV)
    return env, GoalExplorer(env, env.snapshot(), 5)


def test_lazy_candidates_are_the_owned_ones_of_the_eager_list():
    env, gx = _explorer()
    try:
        state = gx.base
        for seed in range(6):
            who = gx._who(state, None, random.Random(seed))
            eager = gx.step_candidates(state, random.Random(seed), set(), {}, {}, who)
            lazy = list(gx.step_candidates(state, random.Random(seed), set(), {}, {}, who, lazy=True))
            assert eager, "the carrental customers have writes to draw"
            # the same drafts (same random state before the shuffle), ownership checked either way
            assert sorted(map(repr, lazy)) == sorted(map(repr, eager))
            assert all(gx.owns(state, p, who) for p in lazy)
    finally:
        gx.close()
        env.close()


def test_only_drafts_for_the_named_tools():
    env, gx = _explorer()
    try:
        names = {td.name for td in gx.writes}
        assert {"insert_rental", "update_rental"} <= names
        got = gx.step_candidates(gx.base, random.Random(1), set(), {}, {}, None, width=2, only={"update_rental"})
        assert got and {p.name for p in got} == {"update_rental"}
    finally:
        gx.close()
        env.close()


def test_target_rule_recheck_from_bytes_matches_the_rows():
    # rental 1 with 7 extras: extras_limit (NEW.extras > 3) broken in the target, found from the
    # target's rows and from its database bytes alike; the untouched origin breaks nothing
    env = load_env(ENV)
    try:
        origin = env.snapshot()
        target = copy.deepcopy(origin)
        row = next(r for r in target["rental"] if r["rental_id"] == 1)
        row["extras"] = 7
        env.reset(target)
        cp = env.checkpoint()
        env.reset()
        by_rows = target_rule_violations(env, origin, target)
        by_bytes = target_rule_violations(env, origin, target, cp)
        assert by_rows == by_bytes and len(by_rows) == 1 and "extras_limit" in by_rows[0]
        assert target_rule_violations(env, origin, origin, None) == []
        assert env.state_hash() == env.initial_state_hash()  # reset after the check
    finally:
        env.close()
