"""LOGIGEN gen-task (symbolic explorer, Set Designer, user view) and validate-task, on both bundled
domains and two written for the tests (tests/data/library, tests/data/retail): nothing domain-specific.

The acceptance run (-n 50 --seed 7) is checked with independent code: targets are replayed with
verify's state_diff through `rollout --agent replay`, boundary states are probed directly in a
fresh environment, and leaks are searched with the domain's own tool/table names."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from tests.conftest import jsonl, run_cmd

from toolkit import aio
from toolkit.envs import load_env
from toolkit.schema import Record
from toolkit.stages import strategies

LIBRARY = str(Path(__file__).resolve().parents[2] / "data" / "library")
DOMAINS = {"airline": {"backend": "sqlite", "id": "airline"},
           "clinic": {"backend": "sqlite", "id": "clinic"},
           "library": {"backend": "sqlite", "path": LIBRARY},
           # written by another engineer after this code: an unseen domain for the explorer
           "retail": {"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "retail")}}


def gen(env: dict, n: int = 50, seed: int = 7, **cfg) -> list[Record]:
    fn = strategies.build("gen-task", dict({"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": seed},
                                           **cfg), None)
    out = aio.run(fn(Record.model_validate({"id": "dom", "env": env})))
    return out


def validate(recs: list[Record], **cfg) -> list[Record]:
    fn = strategies.build("validate-task", dict({"strategy": "logigen"}, **cfg), None)

    async def go():
        return [await fn(r) for r in recs]

    return [r for r in aio.run(go()) if r is not None]


def replay_rewards(recs: list[Record]) -> list[float]:
    from toolkit.stages.rollout import build as rollout
    from toolkit.stages.verify import build as verify

    ro, ve = rollout({"agent_kind": "replay"}, None), verify({"strategy": ["state_diff"]}, None)

    async def go():
        out = []
        for r in recs:
            r = Record.model_validate(r.dump())
            r.task.ground_truth.target_state = None  # rebuild the target from the actions (expected errors)
            r = await ve(await ro(r))
            out += [t.reward for t in r.trajectories]
        return out

    return aio.run(go())


_CACHE: dict = {}


def generated(name: str) -> list[Record]:
    if name not in _CACHE:
        _CACHE[name] = gen(DOMAINS[name])
    return [Record.model_validate(r.dump()) for r in _CACHE[name]]


@pytest.mark.parametrize("name", list(DOMAINS))
def test_symbolic_acceptance(name):
    recs = generated(name)
    assert len(recs) >= 50
    targets = {r.task.ground_truth.target_state_ref for r in recs}
    assert len(targets) == len(recs)  # distinct targets
    # every task passes validate-task, with every check present
    checked = validate(recs, filter="passed")
    assert len(checked) == len(recs)
    names = {v.name for r in checked for v in r.verdicts if v.stage == "validate-task"}
    assert {"replay", "delta0", "projection", "duplicate", "tags"} <= names
    # oracle replay through rollout | verify state_diff: reward 1.0 everywhere
    assert replay_rewards(recs) == [1.0] * len(recs)
    # >= 20% start with a policy-violating attempt, replayed with its expected error
    viol = [r for r in recs if any(a.expect_error == "POLICY_VIOLATION" for a in r.task.ground_truth.actions)]
    assert len(viol) >= 0.2 * len(recs)
    assert all(r.task.complexity["violation_first"] and r.task.complexity["archetype"] == "Mismatch" for r in viol)
    # every archetype is recorded; complexity and difficulty are filled
    arch = {r.task.complexity["archetype"] for r in recs}
    assert {"Mismatch", "Entangled", "Rookie", "Edge"} <= arch <= {"Mismatch", "Entangled", "Rookie", "Edge", "Direct"}
    assert all(r.task.difficulty in ("L1", "L2", "L3") and "tags" in r.task.complexity for r in recs)
    assert all(r.env.state is not None and r.env.state_ref for r in recs)


@pytest.mark.parametrize("name", list(DOMAINS))
def test_boundary_states_are_one_step_from_a_violation(name):
    recs = [r for r in generated(name) if "boundary" in r.task.complexity]
    assert recs, "no boundary-seeded task"
    for r in recs:
        b = r.task.complexity["boundary"]
        env = load_env(r.env)
        try:
            h0 = env.state_hash()
            # the boundary-crossing step: rejected as a policy violation, state unchanged
            for step in b["crossing"][:-1]:
                assert env.call(step["name"], step["arguments"]).ok
            h1 = env.state_hash()
            last = b["crossing"][-1]
            res = env.call(last["name"], last["arguments"])
            assert res.error and res.error["code"] == "POLICY_VIOLATION", (r.id, res)
            assert res.error["violated_rule"] == b["rule"]
            assert env.state_hash() == h1
            # the seeded state itself passes: the goal at the boundary is accepted
            env.reset()
            assert env.state_hash() == h0
            assert env.call(b["goal"]["name"], b["goal"]["arguments"]).ok
        finally:
            env.close()


def test_boundary_seeded_at_n_minus_1_by_analysis():
    # library renewals: `NEW.renewals > 2` (analysis threshold, boundary 2); or the shelf count
    # `(SELECT copies_on_shelf ...) < 1` seeded at 1 in the state
    recs = [r for r in gen(DOMAINS["library"], n=50, seed=3) if "boundary" in r.task.complexity]
    by = {r.task.complexity["boundary"]["found_by"] for r in recs}
    assert "trigger analysis" in by
    cells = [r for r in recs if r.task.complexity["boundary"]["seeded"].get("by") == "state cell"]
    for r in cells:
        s = r.task.complexity["boundary"]["seeded"]
        row = [x for x in r.env.state[s["table"]] if all(x[k] == v for k, v in s["row"].items())]
        assert len(row) == 1 and row[0][s["column"]] == s["value"]


def test_deterministic_and_seeded():
    a = [r.task.model_dump() for r in gen(DOMAINS["library"], n=12, seed=11)]
    b = [r.task.model_dump() for r in gen(DOMAINS["library"], n=12, seed=11)]
    c = [r.task.model_dump() for r in gen(DOMAINS["library"], n=12, seed=12)]
    assert a == b and a != c


def test_user_view_hides_the_procedure():
    env = load_env(DOMAINS["airline"])
    tools = set(env.domain.tools)
    snake = {t for t in env.domain.tables if "_" in t}
    for r in generated("airline"):
        t = r.task
        text = " ".join(x for x in (t.instruction, t.user_scenario.reason_for_call, t.user_scenario.known_info,
                                    t.user_scenario.instructions) if x)
        words = set(re.findall(r"[A-Za-z_]+", text))
        assert not (words & tools) and not (words & snake), (r.id, words & (tools | snake))
        assert t.instruction.startswith("Hi, I'd like to")  # goal first
        assert t.extra["user_view"]["source"] == "template"


# ---------------------------------------------------------------------------------------------
# validate-task catches broken tasks


def test_validate_task_failures():
    base = generated("library")[:6]
    tampered, zero, leak, cross, untagged = (Record.model_validate(r.dump()) for r in base[1:])
    # target that the actions do not reach
    tbl = next(t for t, rows in tampered.task.ground_truth.target_state.items() if rows)
    tampered.task.ground_truth.target_state[tbl] = tampered.task.ground_truth.target_state[tbl][1:]
    # Δ0 = 0: no writes, target = origin
    zero.task.ground_truth.actions = zero.task.ground_truth.actions[:1]
    zero.task.ground_truth.target_state = copy.deepcopy(zero.env.state)
    zero.task.ground_truth.target_state_ref = None
    leak.task.instruction = "Please call update_loan for me."
    dup = Record.model_validate(dict(base[0].dump(), id="dup-of-0"))
    # a "crossing" that is the (successful) read: no violation
    cross.task.complexity["boundary"] = {"goal": cross.task.ground_truth.actions[-1].model_dump(),
                                         "crossing": [cross.task.ground_truth.actions[0].model_dump()],
                                         "rule": "x"}
    untagged.task.complexity = {}
    untagged.task.difficulty = None
    out = {r.id: r for r in validate([base[0], tampered, zero, leak, dup, cross, untagged])}

    def failed(rid):
        return {v.name: v.reasons for v in out[rid].verdicts if v.stage == "validate-task" and not v.passed}

    assert failed(base[0].id) == {}
    f = failed(tampered.id)
    assert list(f) == ["replay"]
    assert "target_state_ref" in f["replay"][0] or "DIFF" in f["replay"][0]
    assert "delta0" in failed(zero.id) and "DIFF(s_origin, s_target) = 0" in failed(zero.id)["delta0"][0]
    assert list(failed(leak.id)) == ["projection"] and "update_loan" in failed(leak.id)["projection"][0]
    assert list(failed("dup-of-0")) == ["duplicate"] and base[0].id in failed("dup-of-0")["duplicate"][0]
    # the invented boundary also makes the stored labels wrong (an Edge task now): tags fails too
    assert "boundary" in failed(cross.id) and set(failed(cross.id)) <= {"boundary", "tags"}
    assert failed(untagged.id) == {}
    assert out[untagged.id].task.difficulty in ("L1", "L2", "L3") and "tags" in out[untagged.id].task.complexity


def test_cli_pipeline_with_filter_and_rejects(tmp_path):
    rej = tmp_path / "rej.jsonl"
    src = [{"id": "lib", "env": DOMAINS["library"]}, {"id": "bad", "env": {"backend": "python", "path": "x.py"}}]
    r = run_cmd(["gen-task", "--strategy", "logigen", "--explorer", "symbolic", "-n", "5", "--seed", "7",
                 "--rejects", str(rej)], jsonl(src))
    assert r.returncode == 1  # one input rejected
    assert "env.backend" in json.loads(rej.read_text().splitlines()[0])["field"]
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 5 and all(x["parent_id"] == "lib" for x in lines)
    broken = dict(copy.deepcopy(lines[0]), id="broken")
    broken["task"]["instruction"] = "use query_member please"
    r2 = run_cmd(["validate-task", "--strategy", "logigen", "--filter", "passed"], jsonl(lines + [broken]))
    assert r2.returncode == 0, r2.stderr
    kept = [json.loads(x)["id"] for x in r2.stdout.splitlines()]
    assert kept == [x["id"] for x in lines]


# ---------------------------------------------------------------------------------------------
# the LLM writes only the user view (scripted loopback server)


# a vague view: no value of the task in it, so the simulated user could not ask for THIS task
VAGUE_VIEW = json.dumps({"instruction": "Hello, I need a change on my account.",
                         "persona": "A busy member.", "reason_for_call": "wants a change",
                         "known_info": "their name", "unknown_info": "the rules",
                         "instructions": "Ask for the change; stop when done."})


def facts_of(req: dict) -> dict:
    """The facts JSON the user_view prompt carries (toolkit/prompts/logigen/user_view)."""
    text = req["messages"][0]["content"]
    return json.loads(text.split("Facts (JSON):\n", 1)[1].split("\n\nReply with ONE JSON", 1)[0])


def view_reply(req: dict) -> str:
    """What a good LLM writes: the requests and known facts of THIS task, in its own words."""
    f = facts_of(req)
    goals = f.get("goals") or []  # goal-explorer facts (want / fallback / mind_change) or the older requests list
    reqs = f.get("requests") or [g["want"] for g in goals]
    extra = [str(g[k]) for g in goals for k in ("fallback", "mind_change") if g.get(k)]
    if f.get("fallback"):
        extra.append(f["fallback"])
    instr = "Ask to " + "; then ".join(reqs) + ("; if refused, ask to " + "; ".join(extra) if extra else "")
    return json.dumps({"instruction": f"Good morning! I would like to {reqs[0]}.", "persona": "A busy member.",
                       "reason_for_call": "they want to " + "; ".join(reqs),
                       "known_info": "; ".join(f["known"]) or "only the request", "unknown_info": "the library rules",
                       "instructions": instr + ". Stop when done."})


def test_llm_user_view_and_fallback():
    from toolkit.llm.testserver import ScriptedServer

    bad = ["not json at all",
           json.dumps({"instruction": "call update_loan", "persona": "p", "reason_for_call": "r",
                       "known_info": "k", "unknown_info": "u", "instructions": "i"}),
           '{"instruction": "hi", "persona": "p"',  # truncated
           json.dumps({"instruction": "hi"})]  # missing keys
    with ScriptedServer(view_reply) as srv:
        ok = gen(DOMAINS["library"], n=2, seed=1, base_url=srv.base_url, model="scripted", max_retries=0)
        facts = [facts_of(r) for r in srv.requests]
    assert [r.task.extra["user_view"]["source"] for r in ok] == ["llm", "llm"]
    by_instr = {f"Good morning! I would like to {(f.get('requests') or [g['want'] for g in f['goals']])[0]}.": f
                for f in facts}
    assert sorted(r.task.instruction for r in ok) == sorted(by_instr)
    # every concrete value of the task's facts reaches the view the simulated user gets
    import re
    for rec in ok:
        f = by_instr[rec.task.instruction]
        nums = set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])", json.dumps(f)))
        assert nums and all(n in rec.task.user_scenario.known_info + rec.task.user_scenario.instructions
                            for n in nums), (nums, rec.task.user_scenario)
    # a canned vague view is refused (it names nothing of the task) → the template, with the reason
    with ScriptedServer([VAGUE_VIEW]) as srv:
        vague = gen(DOMAINS["library"], n=1, seed=1, base_url=srv.base_url, model="scripted", max_retries=0,
                    attempts=2)
        assert srv.chat_count == 2
    info = vague[0].task.extra["user_view"]
    assert info["source"] == "template-fallback" and all("leaves out the task's value" in x for x in info["reasons"])
    assert ok[0].provenance[-1].strategy == "logigen:symbolic:user-view=llm"
    with ScriptedServer(bad) as srv:
        fb = gen(DOMAINS["library"], n=1, seed=1, base_url=srv.base_url, model="scripted", max_retries=0,
                 attempts=3)
        assert srv.chat_count == 3
    info = fb[0].task.extra["user_view"]
    assert info["source"] == "template-fallback" and len(info["reasons"]) == 3
    assert any("update_loan" in x for x in info["reasons"]) and any("JSON" in x or "json" in x for x in info["reasons"])
    assert fb[0].provenance[-1].strategy == "logigen:symbolic:user-view=template-fallback"
    assert fb[0].task.instruction.startswith("Hi, I'd like to")
    # the fallback is still a valid task
    assert all(v.passed for v in validate(fb)[0].verdicts)


def test_llm_paraphrase_kept_only_when_it_names_no_column():
    """The optional LLM paraphrase (a capable endpoint) on a domain written in a newcomer's style
    (tests/data/lending: plural tables, `due_day`, `returned_day`): a reply that names a column with
    spaces ("due day") or says "a new loans" is refused like a spoiler, retried, and the next, clean
    paraphrase is kept; when every attempt leaks, the template view is used and says why."""
    from toolkit.llm.testserver import ScriptedServer

    lending = {"backend": "sqlite", "path": str(Path(__file__).resolve().parents[2] / "data" / "lending")}
    calls = []

    def leaky_then_clean(req: dict) -> str:
        calls.append(1)
        good = json.loads(view_reply(req))
        if len(calls) == 1:  # every value of the task, but the column's name with spaces
            good["instructions"] += " Mention the due day if the agent asks."
        elif len(calls) == 2:  # the table's name, plural, after "a new"
            good["reason_for_call"] = "they want a new loans record"
        return json.dumps(good)

    with ScriptedServer(leaky_then_clean) as srv:
        ok = gen(lending, n=1, seed=1, base_url=srv.base_url, model="scripted", max_retries=0, attempts=3)
        assert srv.chat_count == 3
    info = ok[0].task.extra["user_view"]
    assert info["source"] == "llm", info
    assert any("due day" in x for x in info["reasons"]) and any("a new loans" in x for x in info["reasons"])
    us = ok[0].task.user_scenario
    text = " ".join([ok[0].task.instruction, us.reason_for_call, us.known_info, us.instructions])
    assert "due day" not in text and "a new loans" not in text
    assert all(v.passed for v in validate(ok)[0].verdicts)
    # every attempt leaks: the template view, with the reasons
    always = []

    def always_leaky(req: dict) -> str:
        always.append(1)
        good = json.loads(view_reply(req))
        good["known_info"] += "; their returned_day is unknown"
        return json.dumps(good)

    with ScriptedServer(always_leaky) as srv:
        fb = gen(lending, n=1, seed=1, base_url=srv.base_url, model="scripted", max_retries=0, attempts=2)
    info = fb[0].task.extra["user_view"]
    assert info["source"] == "template-fallback" and all("returned_day" in x for x in info["reasons"])
    assert all(v.passed for v in validate(fb)[0].verdicts)


# ---------------------------------------------------------------------------------------------
# --explorer llm: Client x Consultant over the real environment (scripted loopback server)


CONSULTANT_PATH = [("query_loan", {"loan_id": 2}),
                   ("update_loan", {"loan_id": 2, "renewals": 3}),  # renewal_limit: at most 2
                   ("insert_loan", {"member_id": "M-2", "book_id": "B-3"})]


def _scripted(req: dict):
    msgs = req["messages"]
    if "You are a customer talking to a service consultant" in (msgs[0].get("content") or ""):
        return "Hi, I'd like some help with my loans." if len(msgs) <= 2 else "Thanks! ###STOP###"
    if "You write the user's side" in (msgs[0].get("content") or ""):
        return view_reply(req)
    done = sum(1 for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
    if done < len(CONSULTANT_PATH):
        name, args = CONSULTANT_PATH[done]
        return {"tool_calls": [{"name": name, "arguments": args}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    return "Your loan of Ulysses is booked; the renewal was not possible (limit of 2)."


def test_llm_explorer_executes_and_keeps_the_violation():
    from toolkit.llm.testserver import ScriptedServer

    with ScriptedServer(_scripted) as srv:
        recs = gen(DOMAINS["library"], n=1, seed=1, explorer="llm", base_url=srv.base_url, model="scripted",
                   max_retries=0, user_view="template")
        assert srv.chat_count >= 5
    assert len(recs) == 1
    r = recs[0]
    acts = [(a.name, a.arguments, a.expect_error) for a in r.task.ground_truth.actions]
    assert acts == [("query_loan", {"loan_id": 2}, None),
                    ("update_loan", {"loan_id": 2, "renewals": 3}, "POLICY_VIOLATION"),
                    ("insert_loan", {"member_id": "M-2", "book_id": "B-3"}, None)]
    assert r.task.complexity["archetype"] == "Mismatch" and r.task.complexity["violation"]["rule"] == "renewal_limit"
    # s_target = the state the episode reached: the new loan and one copy fewer on the shelf
    tgt = r.task.ground_truth.target_state
    assert {"loan_id": 4, "member_id": "M-2", "book_id": "B-3", "renewals": 0, "status": "active"} in tgt["loan"]
    assert next(b for b in tgt["book"] if b["book_id"] == "B-3")["copies_on_shelf"] == 4
    assert r.task.extra["exploration"]["termination"] == "user_stop"
    assert r.provenance[-1].prompt_tokens >= 30  # the consultant's scripted usage is accounted
    assert all(v.passed for v in validate([r])[0].verdicts)
    assert replay_rewards([r]) == [1.0]


def test_validate_task_runs_the_domain_check(tmp_path):
    import shutil

    broken = tmp_path / "library"
    shutil.copytree(LIBRARY, broken)
    pol = (broken / "policy.md").read_text()
    (broken / "policy.md").write_text("\n".join(x for x in pol.splitlines() if "[renewal_limit]" not in x) + "\n")
    recs = generated("library")[:2]
    moved = [Record.model_validate(dict(r.dump(), env=dict(r.env.model_dump(), path=str(broken)))) for r in recs]
    good = validate(recs)
    assert all(v.passed for r in good for v in r.verdicts) and any(v.name == "domain" for v in good[0].verdicts)
    bad = validate(moved)
    dv = [v for r in bad for v in r.verdicts if v.name == "domain"]
    assert len(dv) == 2 and not dv[0].passed and "renewal_limit" in " ".join(dv[0].reasons)
    others = [v for r in bad for v in r.verdicts if v.name != "domain"]
    assert all(v.passed for v in others)  # the tasks themselves still replay
    assert all(v.name != "domain" for v in validate(recs, domain_check=False)[0].verdicts)
