"""`gen-task --strategy logigen --explorer llm`: the Client x Consultant episode (LOGIGEN §3.5).

Menu and goal selection: the option menu O(s_0) is drawn by the goal machinery of the symbolic
path (goals.py through synth.GoalDesigner, used read-only): up to `menu_size` (3) feasible goals of
the wanted kind (a plain goal chain, a violation-first chain, a boundary chain at N-1), each
executed from its s_origin, so every option is reachable; options whose insert picks from an
option menu of its own ("the one with the lowest price that can be used") come first. The Client
commits to one of them (a seeded choice, recorded with the menu in `task.extra.exploration`).
The episode then runs through toolkit.episodes.loop.run_episode: the Client is the user
simulator (prompt logigen/client, given the goal's steps and what the user knows), the
Consultant is the agent (the policy plus prompt logigen/consultant) over the real sqlite
environment. Afterwards:
- s_target = the state the episode actually reached;
- reference actions = the Consultant's executed calls: successes, and POLICY_VIOLATION attempts
  kept with `expect_error` (other failed calls changed nothing and are dropped);
- the user's requests (what the user view is written from) follow the episode, not the plan:
  the planned requests up to the first divergence, then EVERY executed write after it, phrased
  by the same goal machinery (`plan_write`, the state before that write) and marked `diverged`
  (a refused write stays as a request the user makes and drops when refused); a write that cannot
  be phrased rejects the episode with its reason; planned requests that were never carried out are
  left out (counted in `exploration.unreached`);
- the path is re-executed from s_origin and must reach the same state (DIFF 0), else the
  episode is discarded; an episode that changed nothing (Δ0 = 0) is discarded too.
Role models: `client_model`/`client_base_url` and `consultant_model`/`consultant_base_url`
override --model/--base-url (recipe keys or TOOLKIT_* env).
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

from toolkit import prompts
from toolkit.envs.sqlite import SqliteEnvironment
from toolkit.flows.logigen import options as O
from toolkit.flows.logigen import projection as P
from toolkit.flows.logigen.explorer import (
    POLICY_VIOLATION,
    WRITE_KINDS,
    Draft,
    Probe,
    canonical_state,
    execute,
    probe_goals,
)
from toolkit.flows.logigen.validate import target_rule_violations
from toolkit.io import log
from toolkit.schema import Record


class _ConsultantEnv:
    """The environment as the Consultant sees it: the policy plus the Consultant's instructions."""

    def __init__(self, env: Any, extra: str):
        self._env, self._extra = env, extra

    def policy(self) -> str:
        return (self._env.policy() or "") + "\n" + self._extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def _usage_dict(u: Any) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "cost": u.cost,
            "requests": u.requests, "cache_hits": u.cache_hits}


# ----------------------------------------------------------------------------------------------
# menu and goal selection


def edge_goal(gx: Any, b: Any, origin: dict, rng: random.Random, want: int) -> Draft | None:
    """A boundary goal chain from a verified (LLM) boundary seed: the goal at the limit first,
    phrased and continued by the goal machinery (as synth.GoalDesigner does for its own seeds)."""
    acts, req, pats, _ = gx.plan_write(b.goal, origin, rng, {}, 0.0, 0.7)
    if b.arg == b.goal.column and b.goal.kind == "update":
        req = gx.at_limit(req, b, origin)
        pats = pats + ["at-limit"]
    first = [{"call": b.goal.call(), "read": acts[0] if acts else None, "request": req,
              "patterns": pats + ["boundary"]}]
    d = gx.chain(rng, origin, max(want, 1), first=first)
    if d is not None:
        d.boundary = copy.deepcopy(b)
    return d


def option_menu(gd: Any, kind: str, rng: random.Random, size: int = O.GenTaskOptions.model_fields["menu_size"].default,
                llm_edges: list | None = None) -> list[Draft]:
    """O(s_0): up to `size` distinct feasible goals of `kind` (goal | mismatch | edge) drawn by the
    goal machinery; goals with an option menu inside come first."""
    out: list[Draft] = []
    seen: set = set()
    for j in range(size * 3):
        if len(out) >= size:
            break
        r = random.Random(f"{rng.random()}:{j}")
        if kind == "edge" and llm_edges and j % 2 == 0:
            b, origin = llm_edges[r.randrange(len(llm_edges))]
            d = edge_goal(gd.gx, b, origin, r, r.choice(gd.writes))
        else:
            d = gd.draft(kind, None, r)
        if d is None:
            continue
        key = tuple((a["name"], repr(sorted(a["arguments"].items()))) for a in d.actions)
        if key in seen:
            continue
        seen.add(key)
        out.append(d)
    out.sort(key=lambda d: "option-menu" not in d.patterns)
    return out


def _write_calls(view: Any, actions: list[dict]) -> list[dict]:
    return [a for a in actions if (td := view.tools.get(a["name"])) is not None and td.kind in WRITE_KINDS]


def _same(a: dict, b: dict) -> bool:
    return (a["name"] == b["name"] and a["arguments"] == b["arguments"]
            and bool(a.get("expect_error")) == bool(b.get("expect_error")))


def follow_episode(gx: Any, goal: Draft, origin: dict, actions: list[dict], rng: random.Random
                   ) -> tuple[list[dict], list[str], dict]:
    """(requests, patterns, report) for the executed `actions`: the goal's requests up to the first
    divergence, then every executed write after it phrased by the goal machinery (none dropped).
    Raises ValueError naming the write that cannot be phrased."""
    view = gx.view
    planned = _write_calls(view, goal.actions)
    done = _write_calls(view, actions)
    j = 0
    while j < len(planned) and j < len(done) and _same(planned[j], done[j]):
        j += 1
    ident = [r for r in goal.requests if r.get("identity")]
    wants = [r for r in goal.requests if not r.get("identity")]
    # the goal's requests map one to one, in order, to its write-tool calls (goals.GoalExplorer.chain)
    requests = ident + [copy.deepcopy(r) for r in wants[:j]]
    patterns = set(goal.patterns) if j == len(planned) == len(done) else set()
    report = {"planned_writes": len(planned), "executed_writes": len(done), "followed": j,
              "diverged_writes": 0, "diverged_violations": 0,
              "unreached": max(0, len(planned) - j)}
    if j < len(done):
        patterns.add("diverged")
    # the state before each executed write after the divergence: replay the prefix

    env = SqliteEnvironment(gx.env_base.domain, state=origin, config=gx.env_base.config)
    try:
        k = 0
        created: dict[str, list] = {}
        for a in actions:
            td = view.tools.get(a["name"])
            is_write = td is not None and td.kind in WRITE_KINDS
            state = env.snapshot() if is_write and k >= j else None
            res = env.call(a["name"], copy.deepcopy(a["arguments"]))
            if not is_write:
                continue
            if res.ok and td.kind == "insert" and isinstance(res.content, dict):
                t = view.tables[td.table]
                if all(c in res.content for c in t.pk):
                    created.setdefault(t.name, []).append(tuple(res.content.get(c) for c in t.pk))
            if k >= j:
                p = Probe(a["name"], copy.deepcopy(a["arguments"]), td.kind, td.table, ok=not a.get("expect_error"))
                try:
                    _, req, pats, _ = gx.plan_write(p, state, rng, created, 0.0, 1.0)
                except Exception as e:  # noqa: BLE001 - a write the goal machinery cannot phrase
                    raise ValueError(f"write {k} ({a['name']}) after the divergence cannot be phrased as "
                                     f"a goal: {type(e).__name__}: {e}") from None
                if not req.get("text"):
                    raise ValueError(f"write {k} ({a['name']}) after the divergence cannot be phrased as a goal")
                req["diverged"] = True
                if a.get("expect_error"):
                    # a refused request stays in the view: the user asks, is refused, and goes on
                    req["violates"] = (res.error or {}).get("violated_rule") or POLICY_VIOLATION
                    req["fallback"] = "drop this request and go on with the rest"
                    pats = list(pats) + ["violation-first" if not requests[len(ident):] else "violation",
                                         "refusal-accepted"]
                    report["diverged_violations"] += 1
                else:
                    report["diverged_writes"] += 1
                requests.append(req)
                patterns.update(pats)
            k += 1
    finally:
        env.close()
    return requests, sorted(patterns), report


# ----------------------------------------------------------------------------------------------
# one episode


async def explore_once(gd: Any, i: int, kind: str, record: Any, ctx: Any, opts: O.GenTaskOptions,
                       llm_edges: list | None = None) -> Draft | None:
    from toolkit.episodes.agents import LLMAgent
    from toolkit.episodes.loop import EpisodeLimits, run_episode
    from toolkit.episodes.users import LLMUser
    from toolkit.scorers import trajectory_calls

    rng = random.Random(f"{gd.seed}:llm:{i}")
    menu = option_menu(gd, kind, rng, opts.menu_size, llm_edges)
    if not menu:
        return None
    pick = rng.randrange(len(menu)) if len(menu) > 1 and rng.random() < 0.3 else 0
    goal = menu[pick]
    origin = goal.origin
    view = gd.view
    gv = P.goal_view(P.goal_facts(goal))
    client_prompt = prompts.load("logigen/client").render(goal=gv["reason_for_call"], steps=gv["instructions"],
                                                          known=gv["known_info"])
    consultant_extra = prompts.load("logigen/consultant").render()
    env = SqliteEnvironment(gd.env.domain, state=origin, config=gd.env.config)
    try:
        limits = EpisodeLimits(max_turns=opts.max_turns, max_tool_errors=opts.max_tool_errors)
        agent = LLMAgent(ctx.llm("consultant"), sample_index=i)
        user = LLMUser(ctx.llm("client"), scenario=gv["reason_for_call"], sample_index=i, system_prompt=client_prompt)
        tmp = Record(id=f"{record.id}-explore{i}", env=record.env)
        traj = await run_episode(tmp, _ConsultantEnv(env, consultant_extra), agent, user, f"{tmp.id}-t0", limits,
                                 agent_model=ctx.model_name("consultant"), user_model=ctx.model_name("client"),
                                 first_message="simulate")
        reached = env.snapshot()
    finally:
        env.close()
    actions: list[dict] = []
    for c in trajectory_calls(traj):
        if c.side != "agent" or c.args is None or c.ok is None or c.name not in view.tools:
            continue
        if c.ok:
            actions.append({"name": c.name, "arguments": c.args})
        elif c.error_code == POLICY_VIOLATION and view.tools[c.name].kind in WRITE_KINDS:
            actions.append({"name": c.name, "arguments": c.args, "expect_error": POLICY_VIOLATION})
    goals = probe_goals(view, actions)
    # violation first: a refused write before the first successful one (the user's planned
    # violating request, or one the episode made instead; either way the view asks for it)
    first_viol = None
    for a in actions:
        td = view.tools[a["name"]]
        if td.kind not in WRITE_KINDS:
            continue
        if a.get("expect_error"):
            first_viol = a
        break
    attempt = None
    if first_viol is not None and goals:
        td = view.tools[first_viol["name"]]
        attempt = Probe(first_viol["name"], copy.deepcopy(first_viol["arguments"]), td.kind, td.table,
                        code=POLICY_VIOLATION)
    draft = Draft(origin=origin, actions=actions, goals=goals, attempt=attempt, archetype=goal.archetype,
                  usage=_usage_dict(traj.usage),
                  exploration={"turns": sum(1 for m in traj.messages if m.role == "assistant"),
                               "termination": traj.termination, "calls": len(traj.steps),
                               "goal": gv["reason_for_call"], "kind": kind,
                               "menu": [P.goal_view(P.goal_facts(d))["reason_for_call"] for d in menu],
                               "chosen": pick, "error": traj.error})
    draft.seeded = copy.deepcopy(goal.seeded)
    if goal.boundary is not None and any(g.sig() == goal.boundary.goal.sig() for g in goals):
        draft.boundary = goal.boundary
    if not goals:
        return draft  # nothing written: the caller counts it and drops it
    try:
        draft.requests, draft.patterns, rep = follow_episode(gd.gx, goal, origin, actions, rng)
    except ValueError as e:
        draft.exploration["error"] = str(e)
        draft.goals = []
        return draft
    draft.exploration.update(rep)
    try:
        draft.target, draft.results = execute(gd.env, draft.origin, actions)
    except ValueError as e:
        draft.exploration["error"] = f"the executed path does not replay: {e}"
        draft.goals = []
        return draft
    if draft.attempt is not None:
        k = next(n for n, a in enumerate(actions) if a.get("expect_error"))
        draft.attempt.rule = draft.results[k].get("rule")
        draft.attempt.message = draft.results[k].get("message")
    if gd.env.diff(draft.target, reached)["total"] != 0:
        draft.exploration["error"] = "replaying the executed calls does not reach the episode's final state"
        draft.goals = []
    return draft


def pick_kind(gd: Any, made: int, made_viol: int, made_edge: int, llm_edges: list | None = None) -> str:
    """mismatch for `violation_share`, edge for `boundary_share` of the tasks, else a plain goal."""
    k = made + 1
    if made_viol < math.ceil(gd.violation_share * k) and gd.any_violation():
        return "mismatch"
    if made_edge < math.ceil(gd.boundary_share * k) and (llm_edges or gd.edge_rules(1)):  # lazy search
        return "edge"
    return "goal"


async def llm_drafts(gd: Any, opts: O.GenTaskOptions, ctx: Any, record: Any,
                     llm_edges: list | None = None) -> tuple[list[Draft], dict]:
    """(drafts, dropped {reason: count}): `opts.n` episodes that reached a new state, out of at most
    n x min(max_tries, llm_tries) tried."""
    n = opts.n
    drafts: list[Draft] = []
    seen: set[str] = set()
    made_viol = made_edge = 0
    dropped: dict[str, int] = {}
    budget = n * max(1, min(opts.max_tries, opts.llm_tries))
    for i in range(budget):
        if len(drafts) >= n:
            break
        kind = pick_kind(gd, len(drafts), made_viol, made_edge, llm_edges)
        d = await explore_once(gd, i, kind, record, ctx, opts, llm_edges)
        if d is None:
            dropped["no goal in the option menu"] = dropped.get("no goal in the option menu", 0) + 1
            continue
        if not d.goals:
            why = (d.exploration.get("error") or "the episode wrote nothing")[:80]
            dropped[why] = dropped.get(why, 0) + 1
            continue
        if gd.env.diff(d.origin, d.target)["total"] == 0:
            dropped["delta0 = 0"] = dropped.get("delta0 = 0", 0) + 1
            continue
        key = gd.env.hash_state(d.target)
        if key in seen:
            dropped["duplicate target"] = dropped.get("duplicate target", 0) + 1
            continue
        seen.add(key)
        drafts.append(d)
        made_viol += d.attempt is not None
        made_edge += d.boundary is not None
    if dropped:
        log(f"gen-task: {record.id}: llm explorer dropped " + ", ".join(f"{v} ({k})" for k, v in dropped.items()))
    return drafts, dropped


def llm_edge_drafts(gd: Any, edges: list, k: int, seed: int) -> tuple[list[Draft], dict]:
    """Symbolic path with `llm_boundary`: up to `k` boundary goal chains from verified LLM seeds
    [(Boundary, s_origin)], each executed from its s_origin; one that does not replay, changes
    nothing or whose target breaks a rule is dropped and counted. (drafts, dropped by reason)"""
    out: list[Draft] = []
    dropped: dict[str, int] = {}
    env = gd.env
    for j, (b, origin) in enumerate(edges[:max(0, k)]):
        rng = random.Random(f"{seed}:llm-edge:{j}")
        d = edge_goal(gd.gx, b, origin, rng, rng.choice(gd.writes))
        why = None
        if d is None:
            why = "no goal chain from the seed"
        else:
            d.origin = canonical_state(env, d.origin)
            try:
                d.target, d.results = execute(env, d.origin, d.actions)
            except ValueError:
                why = "does not replay"
            else:
                d.goals = probe_goals(gd.view, d.actions)
                if env.diff(d.origin, d.target)["total"] == 0:
                    why = "changes nothing"
                elif target_rule_violations(env, d.origin, d.target):
                    why = "target breaks a rule"
        if why:
            dropped[why] = dropped.get(why, 0) + 1
            continue
        out.append(d)
    return out, dropped
