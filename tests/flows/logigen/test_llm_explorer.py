"""LOGIGEN's LLM-facing parts on the loopback scripted server, replies written by hand:
the LLM explorer's goal from an option menu of the goal machinery and a projection that keeps
every executed write; the user-view prompt (policy in, attribution out) and the leak rule on LLM
views; the Architect's token budget and its cut-reply warning; the user simulator's temperature
in the logigen recipe."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

from tests.conftest import jsonl, run_cmd
from tests.flows.logigen.test_tasks import (
    DOMAINS,
    gen,
    replay_rewards,
    validate,
    view_reply,
)
from toolkit.envs import load_env
from toolkit.flows.logigen import options as O
from toolkit.llm.testserver import ScriptedServer

ROOT = Path(__file__).resolve().parents[3]
CLIENT = "You are a customer talking to a service consultant"


def _consultant(path: list[tuple[str, dict]], done_text: str = "All done."):
    def reply(req: dict):
        msgs = req["messages"]
        first = msgs[0].get("content") or ""
        if CLIENT in first:
            return "Hi, I have a few things to sort out." if len(msgs) <= 2 else "Thanks, that is all. ###STOP###"
        if "You write the user's side" in (msgs[-1].get("content") or ""):
            return view_reply(req)
        if "(boundary-adjacent seeding)" in (msgs[-1].get("content") or ""):
            return "no idea"
        done = sum(1 for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
        if done < len(path):
            name, args = path[done]
            return {"tool_calls": [{"name": name, "arguments": args}]}
        return done_text
    return reply


# the Consultant's own path on tests/data/library: a refused renewal (renewal_limit: at most 2),
# then two new loans for member M-2 (plus tier: 3 loans allowed, none active)
PATH = [("query_member", {"member_id": "M-2"}),
        ("update_loan", {"loan_id": 2, "renewals": 3}),
        ("insert_loan", {"member_id": "M-2", "book_id": "B-3"}),
        ("insert_loan", {"member_id": "M-2", "book_id": "B-1"})]


def test_llm_explorer_goal_from_the_option_menu_and_every_write_kept():
    with ScriptedServer(_consultant(PATH)) as srv:
        recs = gen(DOMAINS["library"], n=1, seed=1, explorer="llm", base_url=srv.base_url, model="scripted",
                   max_retries=0, user_view="template", attempts=1)
        reqs = list(srv.requests)
    r = recs[0]
    ex = r.task.extra["exploration"]
    # the goal is one option of the menu O(s_0) the goal machinery drew, and the Client got it
    assert len(ex["menu"]) >= 2 and 0 <= ex["chosen"] < len(ex["menu"]) and ex["goal"] == ex["menu"][ex["chosen"]]
    client = [q for q in reqs if CLIENT in (q["messages"][0].get("content") or "")]
    assert client and all(f"GOAL: {ex['goal']}" in q["messages"][0]["content"] for q in client)
    assert "What to ask for, step by step: Tell the agent what you want" in client[0]["messages"][0]["content"]
    # no attribution note in any prompt the run sent
    assert not any("LOGIGEN" in (m.get("content") or "") for q in reqs for m in q["messages"])
    # every executed write is in the reference path and in the user view: 1 refused + 2 loans
    acts = [(a.name, a.arguments, a.expect_error) for a in r.task.ground_truth.actions]
    assert acts == [("query_member", {"member_id": "M-2"}, None),
                    ("update_loan", {"loan_id": 2, "renewals": 3}, "POLICY_VIOLATION"),
                    ("insert_loan", {"member_id": "M-2", "book_id": "B-3"}, None),
                    ("insert_loan", {"member_id": "M-2", "book_id": "B-1"}, None)]
    instr = r.task.user_scenario.instructions
    items = re.findall(r"(\w+), you want", instr)
    assert items == ["First", "Second", "Third"], instr
    assert "not allowed" in instr.split("Second,")[0]  # the refused request: asked, refused, dropped
    # each loan's book named by its number or by what singles it out (B-3 is Ulysses, B-1 Dune
    # in seed.yaml): the agent looks it up
    second, third = instr.split("Third,")[0].split("Second,")[1], instr.split("Third,")[1]
    assert "book B-3" in second or "title is 'Ulysses'" in second, second
    assert "book B-1" in third or "title is 'Dune'" in third, third
    assert ex["diverged_writes"] == 2 and ex["diverged_violations"] == 1 and ex["executed_writes"] == 3
    assert "diverged" in r.task.complexity["patterns"]
    assert r.task.complexity["violation"]["rule"] == "renewal_limit"
    tgt = r.task.ground_truth.target_state
    assert {(x["member_id"], x["book_id"], x["status"]) for x in tgt["loan"]} >= {("M-2", "B-3", "active"),
                                                                               ("M-2", "B-1", "active")}
    assert all(v.passed for v in validate([r])[0].verdicts)
    assert replay_rewards([r]) == [1.0]


def test_option_menu_options_are_feasible_goals():
    from toolkit.flows.logigen.llm_explorer import option_menu
    from toolkit.flows.logigen.synth import GoalDesigner

    env = load_env(DOMAINS["library"])
    gd = GoalDesigner(env, env.snapshot(), 3, O.GenTaskOptions(max_writes=3))
    try:
        for kind in ("goal", "mismatch", "edge"):
            menu = option_menu(gd, kind, random.Random(kind))
            assert menu, kind
            flags = ["option-menu" in d.patterns for d in menu]
            assert flags == sorted(flags, reverse=True)  # goals with a menu inside come first
            for d in menu:
                # replayed independently: every call behaves as recorded, and the state moves
                e = load_env(dict(DOMAINS["library"], state=d.origin))
                h0 = e.state_hash()
                for a in d.actions:
                    res = e.call(a["name"], copy.deepcopy(a["arguments"]))
                    assert res.ok == (not a.get("expect_error")), (kind, a)
                assert e.state_hash() != h0
                e.close()
                assert d.requests and any(not q.get("identity") for q in d.requests)
    finally:
        gd.close()
        env.close()


def test_follow_episode_keeps_the_plan_then_every_later_write():
    from toolkit.flows.logigen.llm_explorer import follow_episode
    from toolkit.flows.logigen.synth import GoalDesigner

    env = load_env(DOMAINS["library"])
    gd = GoalDesigner(env, env.snapshot(), 3, O.GenTaskOptions(min_writes=2, max_writes=3))
    try:
        goal = next(d for i in range(40) if (d := gd.draft("goal", None, random.Random(i))) is not None
                    and sum(1 for a in d.actions if a["name"].startswith(("insert_", "update_"))) >= 2)
        writes = [k for k, a in enumerate(goal.actions) if a["name"].startswith(("insert_", "update_"))]
        who = next(q for q in goal.requests if q.get("identity"))["known"][0].rsplit(" ", 1)[-1]
        # the episode follows the first planned write, then does something else: one new fine
        executed = goal.actions[:writes[0] + 1] + [{"name": "insert_fine", "arguments": {"member_id": who,
                                                                                         "amount": 2.0}}]
        reqs, pats, rep = follow_episode(gd.gx, goal, goal.origin, executed, random.Random(0))
    finally:
        gd.close()
        env.close()
    wants = [q for q in reqs if not q.get("identity")]
    planned = [q for q in goal.requests if not q.get("identity")]
    assert len(wants) == 2 and wants[0]["text"] == planned[0]["text"] and not wants[0].get("diverged")
    assert wants[1]["diverged"] and "a new fine" in wants[1]["text"] and "2.0" in wants[1]["text"]
    assert rep["followed"] == 1 and rep["diverged_writes"] == 1 and rep["unreached"] == len(writes) - 1
    assert "diverged" in pats


def test_user_view_prompt_sees_the_policy_and_llm_views_pass_the_leak_rule():
    from toolkit.flows.logigen.gentask import view_leaks

    leaking = json.dumps({"instruction": "Please set copies_on_shelf to 4.", "persona": "p", "reason_for_call": "r",
                          "known_info": "k", "unknown_info": "u", "instructions": "i"})
    seen: list[int] = []

    def replies(req: dict) -> str:  # the first view is a good one (this task's values), then two leaking ones
        seen.append(1)
        return view_reply(req) if len(seen) == 1 else leaking

    with ScriptedServer(replies) as srv:
        recs = gen(DOMAINS["library"], n=2, seed=1, base_url=srv.base_url, model="scripted", max_retries=0,
                   attempts=2)
        prompts = [q["messages"][-1]["content"] for q in srv.requests]
    policy = (ROOT / "tests/data/library/policy.md").read_text()
    bullet = next(x for x in policy.splitlines() if "[renewal_limit]" in x).strip()
    assert prompts and all(bullet in p and "Policy the agent follows" in p for p in prompts)
    assert not any("LOGIGEN" in p for p in prompts)
    assert "never say which fields or columns to set" in prompts[0].lower()
    srcs = sorted(r.task.extra["user_view"]["source"] for r in recs)
    assert srcs == ["llm", "template-fallback"]
    fb = next(r for r in recs if r.task.extra["user_view"]["source"] == "template-fallback")
    assert all("copies_on_shelf" in why for why in fb.task.extra["user_view"]["reasons"])
    # the rule itself, on a finished view: clean views pass, a column name or column=value is caught
    from toolkit.flows.logigen.explorer import Draft, probe_goals

    r = recs[0]
    d = Draft(origin=r.env.state, actions=[a.model_dump(exclude_none=True) for a in r.task.ground_truth.actions],
              goals=[], target=r.task.ground_truth.target_state)
    env = load_env(DOMAINS["library"])
    try:
        from toolkit.flows.logigen.explorer import DomainView

        dv = DomainView(env)
        d.goals = probe_goals(dv, d.actions)
        view = {"instruction": r.task.instruction, **r.task.user_scenario.model_dump(exclude_none=True)}
        assert view_leaks(d, view, dv) == []
        assert any("copies_on_shelf" in x for x in view_leaks(d, dict(view, instruction="set copies_on_shelf"), dv))
        assert any(x.startswith("column=value") for x in view_leaks(d, dict(view, known_info="the loan status returned"), dv))
    finally:
        env.close()


def test_prompts_render_without_attribution_notes():
    from toolkit import prompts

    folder = ROOT / "toolkit/prompts/logigen"
    names = sorted({re.sub(r"\.v\d+\.txt$", "", p.name) for p in folder.glob("*.txt")})
    assert len(names) >= 10
    for name in names:
        p = prompts.load(f"logigen/{name}")
        assert "LOGIGEN" in p.text, name  # the attribution stays in the file, as a template comment
        from toolkit.prompts import _variables

        out = p.render(**{v: "X" for v in _variables(p.text)})
        assert "LOGIGEN" not in out and not out.startswith("\n"), name


def test_architect_budget_and_cut_reply_warning(tmp_path, capfd):
    from tests.flows.logigen.test_architect import (
        ANALYZE,
        GOOD_TRIGGERS,
        PASS,
        POLICY,
        TABLES,
        _run,
    )

    cut = {"content": POLICY[:60], "finish_reason": "length"}
    with ScriptedServer([ANALYZE, PASS, cut, POLICY, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS]) as srv:
        out = _run(srv, tmp_path)
        reqs = list(srv.requests)
    checker = [q for q in reqs if "You are the Verifier" in q["messages"][-1]["content"]]
    arch = [q for q in reqs if q not in checker]
    assert len(arch) == 5 and len(checker) == 4
    assert {q["max_tokens"] for q in arch} == {8192} and {q["max_tokens"] for q in checker} == {4096}
    assert out.plan.extra["cut_replies"] == {"architect": 1}
    assert out.plan.extra["max_tokens"] == {"architect": 8192, "checker": 4096}
    assert "architect reply cut at max_tokens (8192; finish_reason=length)" in capfd.readouterr().err
    with ScriptedServer([ANALYZE, PASS, POLICY, PASS, TABLES, PASS, GOOD_TRIGGERS, PASS]) as srv:
        out = _run(srv, tmp_path, architect_max_tokens=3000, max_tokens=700)
        got = {q["max_tokens"] for q in srv.requests}
    assert got == {3000, 700} and out.plan.extra["cut_replies"] == {}


def test_logigen_recipe_user_simulator_at_temperature_one():
    recs = gen(DOMAINS["library"], n=1, seed=1)

    def reply(req):
        sys_ = req["messages"][0].get("content") or ""
        if sys_.startswith("You are playing the role of a customer"):
            return "I'd like a new loan. ###STOP###" if len(req["messages"]) > 3 else "Hi, I need help with a loan."
        return "Sure, done."

    with ScriptedServer(reply) as srv:
        p = run_cmd(["rollout", "--recipe", str(ROOT / "recipes/logigen.yaml"), "--base-url", srv.base_url,
                     "--model", "scripted", "--max-retries", "0", "-n", "1"], jsonl([recs[0].dump()]))
        reqs = list(srv.requests)
    assert p.returncode == 0, p.stderr
    user = [q for q in reqs if (q["messages"][0].get("content") or "").startswith("You are playing the role")]
    agent = [q for q in reqs if q not in user]
    assert user and agent
    assert {q["temperature"] for q in user} == {1.0} and {q["temperature"] for q in agent} == {0.7}


def test_llm_boundary_symbolic_path_draws_goal_chains():
    """With llm_boundary on, the symbolic path's tasks come from the goal machinery too (requests,
    patterns), not from the older probes."""
    with ScriptedServer(_consultant([])) as srv:
        recs = gen(DOMAINS["library"], n=6, seed=2, llm_boundary=True, base_url=srv.base_url, model="scripted",
                   max_retries=0, user_view="template", attempts=1)
    assert len(recs) == 6
    assert all("you want" in r.task.user_scenario.instructions for r in recs)
    assert all(v.passed for r in validate(recs) for v in r.verdicts)
