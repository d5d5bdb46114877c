"""LOGIGEN Set Designer, the LLM second (toolkit/flows/logigen/llm_seeder.py): boundary seeds for
rules the trigger analysis cannot read, proposed by the `boundary_seeder` role on the loopback
ScriptedServer (replies written by hand) and VERIFIED BY EXECUTION before use.

Domain: tests/data/retail. Its `qty_range` limit is `NEW.qty > CASE (SELECT tier ...) WHEN 'vip'
THEN 10 ELSE 3 END` (the vip limit 10 is invisible to the analysis) and `return_window` is
`julianday(today) - julianday(OLD.delivered_on) > 30`. Facts used below, checked by hand in
tests/data/retail/seed.json: today is 2025-06-01; u2 is vip with one pending order; product s1 has
stock 5; order 1 (u1, delivered 2025-04-10) is 52 days past delivery.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path

import pytest

from toolkit.envs import load_env
from toolkit.flows.logigen.options import GenTaskOptions
from toolkit.flows.logigen.gentask import Designer
from toolkit.flows.logigen.llm_seeder import (
    FOUND_BY,
    parse_proposal,
    prompt_for,
    seed_boundaries,
    target_rules,
)
from toolkit.llm.testserver import ScriptedServer
from toolkit.roles.structured import Malformed
from toolkit.schema import Record
from toolkit.stages import strategies
from toolkit.stages.registry import StageContext

RETAIL = {"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "retail")}

# vip limit: stock raised to 10 so the limit (not the stock) is what the 11th unit crosses
QTY_GOOD = {"rule": "qty_range", "set": [{"table": "product", "key": {"sku": "s1"}, "column": "stock", "value": 10}],
            "goal": {"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 10}},
            "crossing": [{"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 11}}],
            "why": "vip customers may order up to 10 units"}
# 30 days after delivery (2025-05-02 -> 2025-06-01) a return is still allowed; one day earlier it is not
RETURN_GOOD = {"rule": "return_window",
               "set": [{"table": "orders", "key": {"order_id": 1}, "column": "delivered_on", "value": "2025-05-02"}],
               "goal": {"name": "update_orders", "arguments": {"order_id": 1, "status": "returned"}},
               "crossing": [{"name": "update_orders", "arguments": {"order_id": 1, "delivered_on": "2025-05-01"}},
                            {"name": "update_orders", "arguments": {"order_id": 1, "status": "returned"}}],
               "why": "the return window closes 30 days after delivery"}
# wrong: with stock 5 the 6th unit is refused for stock (in_stock), not by the quantity limit
QTY_WRONG_RULE = {"rule": "qty_range", "set": [],
                  "goal": {"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 5}},
                  "crossing": [{"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 6}}],
                  "why": "wrong on purpose"}
# wrong: 3 units for a vip are allowed, the crossing step is no violation at all
QTY_NO_VIOLATION = dict(QTY_WRONG_RULE, goal={"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 2}},
                        crossing=[{"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 3}}])
# wrong: order 1 was delivered 52 days ago, the goal itself is already refused
RETURN_GOAL_FAILS = {"rule": "return_window", "set": [],
                     "goal": {"name": "update_orders", "arguments": {"order_id": 1, "status": "returned"}},
                     "crossing": [{"name": "update_orders", "arguments": {"order_id": 1, "status": "returned"}}],
                     "why": "wrong on purpose"}


def _rule_of(req: dict) -> str:
    return re.search(r"^Rule: (\S+)", req["messages"][-1]["content"], re.MULTILINE).group(1)


def scripted(by_rule: dict[str, list[str]]):
    """A reply function: per asked rule, its replies in order (the last one repeats)."""
    seen: dict[str, int] = {}

    def reply(req: dict) -> str:
        rule = _rule_of(req)
        k = seen.get(rule, 0)
        seen[rule] = k + 1
        replies = by_rule.get(rule) or ["I cannot tell."]
        return replies[min(k, len(replies) - 1)]

    return reply


def _ctx(cfg: dict) -> StageContext:
    return StageContext(command="gen-task", opts=strategies.typed("gen-task", dict(cfg, strategy="logigen")))


def _designer():
    env = load_env(RETAIL)
    return env, Designer(env, env.snapshot(), 5)


def _seed(srv: ScriptedServer, rules: list[str], attempts: int = 3):
    env, des = _designer()
    cfg = {"base_url": srv.base_url, "model": "scripted", "max_retries": 0, "llm_boundary_rules": rules}
    ctx = _ctx(cfg)
    try:
        rep = asyncio.run(seed_boundaries(des.explorer, ctx.llm("boundary_seeder"),
                                          GenTaskOptions(llm_boundary_rules=rules, attempts=attempts), env.policy()))
        return rep, des.explorer.llm_boundaries, des.explorer.base
    finally:
        des.close()
        env.close()


def _independent_check(origin: dict, b) -> None:
    """Replay the boundary in a fresh environment without the module's helpers."""
    env = load_env(dict(RETAIL, state=origin))
    try:
        h0 = env.state_hash()
        for step in b.crossing[:-1]:
            assert env.call(step["name"], step["arguments"]).ok
        h1 = env.state_hash()
        last = b.crossing[-1]
        res = env.call(last["name"], last["arguments"])
        assert res.error and res.error["code"] == "POLICY_VIOLATION" and res.error["violated_rule"] == b.rule
        assert env.state_hash() == h1
        env.reset()
        assert env.state_hash() == h0
        assert env.call(b.goal.name, b.goal.args).ok
    finally:
        env.close()


def test_opaque_rules_are_the_ones_asked():
    env, des = _designer()
    try:
        t = dict(target_rules(des.explorer, max_rules=20))
        prompt = prompt_for(des.explorer, "qty_range", env.policy())
    finally:
        des.close()
        env.close()
    assert t["qty_range"].startswith("opaque") and "CASE" in t["qty_range"]
    assert t["return_window"].startswith("opaque") and "julianday" in t["return_window"]
    # open_orders_cap has an analysis threshold (COUNT(*) >= 2): not asked
    assert "open_orders_cap" not in t
    assert list(t)[:2] == ["qty_range", "return_window"]  # opaque rules first
    # the prompt carries the rule, its condition, the tools and the current rows
    assert "Rule: qty_range" in prompt and "WHEN 'vip' THEN 10" in prompt
    assert "insert_orders:" in prompt and '"tier": "vip"' in prompt and '"stock": 5' in prompt


def test_correct_proposals_verify_and_seed_the_state():
    replies = {"qty_range": [json.dumps(QTY_GOOD)], "return_window": ["```json\n" + json.dumps(RETURN_GOOD) + "\n```"]}
    with ScriptedServer(scripted(replies)) as srv:
        rep, pool, base = _seed(srv, ["qty_range", "return_window"])
        assert srv.chat_count == 2
    assert sorted(b.rule for b, _ in pool) == ["qty_range", "return_window"]
    assert not rep.discarded and not rep.rejected
    assert rep.usage["requests"] == 2 and rep.model == "scripted"
    by = {b.rule: (b, o) for b, o in pool}
    b, origin = by["qty_range"]
    assert b.found_by == FOUND_BY and b.seeded["by"] == "state cells (llm)"
    assert b.seeded["cells"] == [{"table": "product", "row": {"sku": "s1"}, "column": "stock", "value": 10, "was": 5}]
    # only the proposed cell moved
    exp = copy.deepcopy(base)
    next(r for r in exp["product"] if r["sku"] == "s1")["stock"] = 10
    assert origin == exp
    _independent_check(origin, b)
    b, origin = by["return_window"]
    assert next(r for r in origin["orders"] if r["order_id"] == 1)["delivered_on"] == "2025-05-02"
    assert len(b.crossing) == 2
    _independent_check(origin, b)


def test_wrong_proposals_are_discarded_with_their_reason():
    replies = {"qty_range": [json.dumps(QTY_WRONG_RULE)], "return_window": [json.dumps(RETURN_GOAL_FAILS)]}
    with ScriptedServer(scripted(replies)) as srv:
        rep, pool, _ = _seed(srv, ["qty_range", "return_window"])
        assert srv.chat_count == 2  # a well-formed but wrong proposal is not retried: it is discarded
    assert pool == []
    reasons = {d["rule"]: d["reason"] for d in rep.discarded}
    assert reasons["qty_range"] == "the crossing step violates in_stock, not qty_range"
    assert "goal update_orders fails on s_origin" in reasons["return_window"]
    s = rep.summary()
    assert s["verified"] == [] and s["discarded"] == 2 and s["rejected"] == 0

    with ScriptedServer(scripted({"qty_range": [json.dumps(QTY_NO_VIOLATION)]})) as srv:
        rep, pool, _ = _seed(srv, ["qty_range"])
    assert pool == [] and "is not a policy violation" in rep.discarded[0]["reason"]


def test_malformed_replies_are_retried_then_rejected():
    bad_table = dict(QTY_GOOD, set=[dict(QTY_GOOD["set"][0], table="products")])
    replies = {"qty_range": ["Sure! Here it is: {\"rule\": \"qty_range\", \"set\": [", json.dumps(bad_table),
                             json.dumps(QTY_GOOD)],
               "return_window": ["no idea", '{"rule": "return_window"}', json.dumps({"rule": "other", "set": [], "goal": {},
                                                                             "crossing": []})]}
    with ScriptedServer(scripted(replies)) as srv:
        rep, pool, _ = _seed(srv, ["qty_range", "return_window"], attempts=3)
        assert srv.chat_count == 6
    # qty_range: two malformed replies, then the correct one verifies (attempt 3)
    assert [b.rule for b, _ in pool] == ["qty_range"] and pool[0][0].seeded["attempts"] == 3
    # return_window: rejected after 3 attempts, each with its reason; never a crash
    assert [r["rule"] for r in rep.rejected] == ["return_window"]
    why = rep.rejected[0]["reasons"]
    assert len(why) == 3 and "no JSON object" in why[0] and "missing key 'set'" in why[1] and "'rule' must be" in why[2]
    assert rep.usage["requests"] == 6


@pytest.mark.parametrize("mutate, expect", [
    (lambda p: p.pop("goal"), "missing key 'goal'"),
    (lambda p: p.update(rule="in_stock"), "'rule' must be 'qty_range'"),
    (lambda p: p["set"][0].update(key={"title": "Mug"}), "primary key (sku)"),
    (lambda p: p["set"][0].update(key={"sku": "s9"}), "no product row"),
    (lambda p: p["set"][0].update(column="colour"), "no column 'colour'"),
    (lambda p: p["set"][0].update(column="sku"), "primary-key column"),
    (lambda p: p["goal"].update(name="delete_orders"), "unknown tool 'delete_orders'"),
    (lambda p: p["goal"].update(name="insert_product"), "unknown tool 'insert_product'"),  # hidden from the agent
    (lambda p: p["goal"].update(name="query_orders", arguments={"order_id": 1}), "not a write tool"),
    (lambda p: p["crossing"][0]["arguments"].update(colour="red"), "no parameter(s) 'colour'"),
    (lambda p: p.update(crossing=[]), "non-empty list"),
])
def test_contract_violations_are_malformed(mutate, expect):
    env, des = _designer()
    try:
        p = copy.deepcopy(QTY_GOOD)
        mutate(p)
        with pytest.raises(Malformed) as ei:
            parse_proposal(json.dumps(p), "qty_range", des.view, des.base)
        assert expect in str(ei.value)
        ok = parse_proposal(json.dumps(QTY_GOOD), "qty_range", des.view, des.base)
        assert ok["goal"]["arguments"]["qty"] == 10
    finally:
        des.close()
        env.close()


def _gen(cfg: dict) -> list[Record]:
    fn = strategies.build("gen-task", cfg, None)
    return asyncio.run(fn(Record.model_validate({"id": "shop", "env": RETAIL})))


def test_gen_task_uses_verified_llm_seeds_and_validates():
    replies = {"qty_range": [json.dumps(QTY_GOOD)], "return_window": [json.dumps(RETURN_GOAL_FAILS)]}
    with ScriptedServer(scripted(replies)) as srv:
        cfg = {"strategy": "logigen", "explorer": "symbolic", "n": 12, "seed": 7, "llm_boundary": True,
               "llm_boundary_rules": "qty_range,return_window,card_balance", "user_view": "template",
               "base_url": srv.base_url, "model": "scripted", "max_retries": 0, "attempts": 2}
        recs = _gen(cfg)
        asked = {_rule_of(r) for r in srv.requests}
    assert asked == {"qty_range", "return_window", "card_balance"}
    rep = recs[0].task.extra["llm_boundary"]
    assert rep["verified"] == ["qty_range"] and rep["discarded"] == 1 and rep["rejected"] == 1
    assert rep["rejected_reasons"]["card_balance"] == [f"attempt {k}: no JSON object in the reply" for k in (1, 2)]
    assert recs[0].provenance[-1].prompt_tokens > 0 and recs[0].provenance[-1].model == "scripted"
    llm = [r for r in recs if (r.task.complexity.get("boundary") or {}).get("found_by") == FOUND_BY]
    assert llm, "no task used the verified LLM seed"
    for r in llm:
        b = r.task.complexity["boundary"]
        assert b["rule"] == "qty_range" and r.task.complexity["archetype"] == "Edge"
        assert next(x for x in r.env.state["product"] if x["sku"] == "s1")["stock"] >= 10
    fn = strategies.build("validate-task", {"strategy": "logigen", "filter": "passed"}, None)

    async def go():
        return [await fn(Record.model_validate(r.dump())) for r in recs]

    checked = [r for r in asyncio.run(go()) if r is not None]
    assert len(checked) == len(recs)
    assert any(v.name == "boundary" and v.passed for r in checked if r.id == llm[0].id for v in r.verdicts)


def test_off_by_default_on_the_symbolic_path():
    with ScriptedServer(scripted({})) as srv:
        cfg = {"strategy": "logigen", "explorer": "symbolic", "n": 8, "seed": 3, "user_view": "template",
               "base_url": srv.base_url, "model": "scripted", "max_retries": 0}
        with_ctx = _gen(cfg)
        auto = _gen(dict(cfg, llm_boundary="auto"))
        assert srv.chat_count == 0
    plain = _gen({"strategy": "logigen", "explorer": "symbolic", "n": 8, "seed": 3})
    assert [r.task.model_dump() for r in with_ctx] == [r.task.model_dump() for r in plain] == \
        [r.task.model_dump() for r in auto]
    assert all("llm_boundary" not in r.task.extra for r in plain)


# ---------------------------------------------------------------------------------------------
# LLM resource injection (role injection_designer): verified by re-executing the reference path

MUG_DISTRACTOR = {"rows": [{"strategy": "distractor", "table": "product", "like": {"sku": "s1"},
                            "row": {"sku": "s9", "title": "Mug", "price": 12, "stock": 5}}]}


def test_llm_injection_verified_or_discarded():
    from toolkit.flows.logigen.explorer import Draft, Probe, execute
    from toolkit.flows.logigen.llm_seeder import (
        inject_llm,
        parse_injection,
        verify_injection,
    )

    env, des = _designer()
    try:
        call = {"name": "insert_orders", "arguments": {"user_id": "u2", "sku": "s1", "qty": 1}}

        def draft():
            d = Draft(origin=copy.deepcopy(des.base), actions=[call],
                      goals=[Probe("insert_orders", dict(call["arguments"]), "insert", "orders", ok=True)])
            d.target, d.results = execute(env, d.origin, d.actions)
            return d

        # a second pending order of u2 makes the reference insert hit open_orders_cap: discarded
        pending = {"rows": [{"strategy": "substitute", "table": "orders", "like": {"order_id": 3},
                             "row": {"order_id": 99, "user_id": "u2", "sku": "s1", "qty": 2, "status": "pending"}}]}
        d = draft()
        state, why = verify_injection(env, d, parse_injection(json.dumps(pending), des.view, d.origin))
        assert state is None and "no longer replays" in why and "POLICY_VIOLATION" in why
        # reusing a key, or a "distractor" identical to its original: discarded
        clash = copy.deepcopy(MUG_DISTRACTOR)
        clash["rows"][0]["row"]["sku"] = "s2"
        assert "reuses an existing key" in verify_injection(env, d, parse_injection(json.dumps(clash), des.view, d.origin))[1]
        same = copy.deepcopy(MUG_DISTRACTOR)
        same["rows"][0]["row"]["price"] = 10
        assert "must differ" in verify_injection(env, d, parse_injection(json.dumps(same), des.view, d.origin))[1]
        # malformed: unknown strategy, then unknown column, then a good reply -> applied on attempt 3
        bad1 = json.dumps({"rows": [dict(MUG_DISTRACTOR["rows"][0], strategy="noise")]})
        bad2 = json.dumps({"rows": [dict(MUG_DISTRACTOR["rows"][0], row={"sku": "s9", "colour": "red"})]})
        with ScriptedServer([bad1, bad2, json.dumps(MUG_DISTRACTOR)]) as srv:
            ctx = _ctx({"base_url": srv.base_url, "model": "m", "max_retries": 0})
            d = draft()
            r = asyncio.run(inject_llm(ctx.llm("injection_designer"), des.view, env, d, attempts=3))
        assert r["applied"] and r["usage"]["requests"] == 3
        assert {"sku": "s9", "title": "Mug", "price": 12.0, "stock": 5} in d.origin["product"]
        assert d.injections == [{"strategy": "distractor", "source": "llm", "count": 1,
                                 "rows": [{"table": "product", "like": {"sku": "s1"}}]}]
        assert next(o for o in d.target["orders"] if o["order_id"] == 5)["user_id"] == "u2"
        with ScriptedServer([bad1]) as srv:
            ctx = _ctx({"base_url": srv.base_url, "model": "m", "max_retries": 0})
            d = draft()
            r = asyncio.run(inject_llm(ctx.llm("injection_designer"), des.view, env, d, attempts=2))
        assert not r["applied"] and r["reason"].startswith("malformed") and "'strategy' must be one of" in r["reason"]
        assert d.origin == des.base and d.injections == []
    finally:
        des.close()
        env.close()


def test_gen_task_llm_inject_option():
    with ScriptedServer([json.dumps(MUG_DISTRACTOR)]) as srv:
        cfg = {"strategy": "logigen", "explorer": "symbolic", "n": 8, "seed": 7, "llm_inject": True,
               "llm_inject_share": 1.0, "inject_share": 0.0, "user_view": "template",
               "base_url": srv.base_url, "model": "scripted", "max_retries": 0}
        recs = _gen(cfg)
        assert srv.chat_count == 8
    applied = [r for r in recs if r.task.extra["llm_inject"]["applied"]]
    assert applied  # the mug distractor fits tasks that do not depend on the number of products
    for r in applied:
        assert any(p["sku"] == "s9" for p in r.env.state["product"])
        assert r.task.complexity["injection"][-1]["source"] == "llm" and "Reasoning" in r.task.complexity["tags"]
    for r in recs:
        if not r.task.extra["llm_inject"]["applied"]:
            assert not any(p["sku"] == "s9" for p in r.env.state["product"])
    fn = strategies.build("validate-task", {"strategy": "logigen", "filter": "passed"}, None)

    async def go():
        return [await fn(Record.model_validate(r.dump())) for r in recs]

    assert len([r for r in asyncio.run(go()) if r is not None]) == len(recs)


def test_on_automatically_with_the_llm_explorer():
    from tests.flows.logigen.test_tasks import DOMAINS, _scripted, gen

    def reply(req):
        if "(boundary-adjacent seeding)" in req["messages"][-1]["content"]:
            return "I do not know."
        return _scripted(req)

    with ScriptedServer(reply) as srv:
        recs = gen(DOMAINS["library"], n=1, seed=1, explorer="llm", base_url=srv.base_url, model="scripted",
                   max_retries=0, user_view="template", attempts=1)
        seeder = [r for r in srv.requests if "(boundary-adjacent seeding)" in r["messages"][-1]["content"]]
    rep = recs[0].task.extra["llm_boundary"]
    assert rep["asked"] and len(seeder) == len(rep["asked"]) == rep["rejected"]
    assert rep["verified"] == [] and recs[0].task.complexity["archetype"] == "Mismatch"
