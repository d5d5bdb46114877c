"""The goal explorer's candidate writes (toolkit.flows.logigen.goals.step_candidates): the lazy
form a chain step uses yields exactly the owned candidates of the eager list, and `only` drafts
for the named tools alone; the target-rule re-check gives the same verdict from a target's
database bytes as from its rows."""

from __future__ import annotations

import copy
import random
from pathlib import Path

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


def test_an_insert_names_the_row_it_points_to_by_what_the_user_knows():
    # look up -> act: a charge on order 2 of retail's seed (u1's Mug delivered 2025-05-25). The
    # user describes the order, the agent's query finds it, and its key comes from the result
    from pathlib import Path

    from toolkit.flows.logigen.explorer import Probe

    ref = {"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "retail")}
    env = load_env(ref)
    gx = GoalExplorer(env, env.snapshot(), 5)
    try:
        p = Probe("insert_charge", {"order_id": 2, "card_id": "g1", "amount": 1.0}, "insert", "charge")
        seen = set()
        for seed in range(8):
            acts, req, pats, q = gx.plan_write(p, gx.base, random.Random(seed), {}, 0.0, 1.0)
            assert q is p and "lookup" in pats
            (look,) = acts
            arg, table, key = (("order_id", "orders", 2) if look["name"] == "query_orders"
                               else ("card_id", "gift_card", "g1"))
            assert look["name"] == f"query_{table}" and arg not in look["arguments"]
            res = env.call(look["name"], dict(look["arguments"]))
            assert [r[arg] for r in res.content["rows"]] == [key]  # the filters single out the row
            assert f"{table.replace('_', ' ')} {key}" not in req["text"]
            assert not any(str(key) in k for k in req["known"])
            seen.add(table)
        assert seen == {"orders", "gift_card"}  # either reference may be the looked-up one
        # lookup_share 0: the user names the order by its number, as before
        acts, req, pats, _ = gx.plan_write(p, gx.base, random.Random(0), {}, 0.0, 0.0)
        assert "lookup" not in pats and acts == [{"name": "query_orders", "arguments": {"order_id": 2}}]
        assert "order 2" in req["text"] and "orders" not in req["text"]  # one row of the table `orders`
    finally:
        gx.close()
        env.close()


def test_the_principal_is_the_party_the_policy_says_to_verify():
    """"Always identify the account first" (courier) and "Verify the owner before acting" (vet,
    whose table is `ownr`) pick that party, not the most mentioned or most referenced table; a
    policy that names no party to verify keeps the old rule (citypermits: resident)."""
    from pathlib import Path

    from toolkit.flows.logigen.explorer import DomainView
    from toolkit.flows.logigen.goals import _names, choose_principal

    data = Path(__file__).resolve().parents[2] / "data"
    got = {}
    for name in ("courier", "vet", "citypermits", "gym"):
        env = load_env({"backend": "sqlite", "path": str(data / name)})
        try:
            got[name] = choose_principal(DomainView(env), env.policy())
            # the same domain with the sentence that names the party taken out
            if name in ("courier", "vet"):
                pol = env.policy().replace("identify the account", "look at the request").replace(
                    "Verify the owner", "Look at the request")
                got[name + " without"] = choose_principal(DomainView(env), pol)
        finally:
            env.close()
    assert got == {"courier": "account", "courier without": "shipment", "vet": "ownr", "vet without": "appt",
                   "citypermits": "resident", "gym": "member"}
    # a word names a table by its noun or name, singular or plural, or as an abbreviation of it
    assert _names("ownr", "ownr", "owner") and _names("customers", "customer", "customer")
    assert _names("appt", "appt", "appointments") and not _names("account", "account", "owner")
    assert not _names("user_account", "user account", "users")


def test_goal_chains_without_a_read_are_drawn_again(monkeypatch):
    """synth.READ_TRIES: a goal chain in which no write's key comes from a read is drawn again;
    on gym (-n 40 --seed 3) 2 of 17 goal tasks have none with one try, none with the default."""
    from tests.flows.logigen.test_acceptance import DATA
    from tests.flows.logigen.test_tasks import gen
    from toolkit.flows.logigen import synth

    def reads(tries: int) -> tuple[int, int]:
        monkeypatch.setattr(synth, "READ_TRIES", tries)
        rs = gen({"backend": "sqlite", "path": str(DATA / "gym")}, n=40, seed=3, search_cache=False)
        goal = [r for r in rs if not r.task.complexity.get("violation") and not r.task.complexity.get("boundary")]
        return len(goal), sum(1 for r in goal if synth.READ_PATTERNS & set(r.task.complexity.get("patterns") or []))

    one, default = reads(1), reads(3)
    assert one[0] == default[0] and one[1] < one[0]  # the control: some chain had no read
    assert default[1] == default[0]


def test_a_rows_owner_is_read_in_the_state_asked_about():
    """An appointment belongs to the owner of its pet: the same appointment row (equal content)
    in two states whose pet belongs to different owners has two owners, whatever was asked
    first (a memo by the row's content alone answered the second state with the first's)."""
    env = load_env({"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "vet")})
    gx = GoalExplorer(env, env.snapshot(), 5)
    try:
        assert gx.principal == "ownr"
        a = gx.base
        appt = a["appt"][0]
        pet = next(p for p in a["pet"] if p["pet_id"] == appt["pet_id"])
        other = next(o["own_id"] for o in a["ownr"] if o["own_id"] != pet["own_id"])
        b = {**a, "pet": [dict(p, own_id=other) if p is pet else p for p in a["pet"]],
             "appt": [dict(r) for r in a["appt"]]}  # equal rows, new dicts
        for first, second, want in ((a, b, other), (b, a, pet["own_id"])):
            gx.owner_of(first, "appt", first["appt"][0])
            assert gx.owner_of(second, "appt", second["appt"][0]) == want
    finally:
        gx.close()
        env.close()
