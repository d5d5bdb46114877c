"""`gen-task --strategy logigen --explorer llm`: the Client x Consultant episode (LOGIGEN §3.5).

The Set Designer prepares s_origin and a goal from the option menu O(s_0) (the symbolic probes:
a successful write, a violating request, a boundary goal). The episode itself runs through
toolkit.stages.rollout.run_episode — the Client is the user simulator (prompt logigen/client,
committed to the goal), the Consultant is the agent (the policy plus prompt logigen/consultant)
over the real sqlite environment. Afterwards:
- s_target = the state the episode actually reached;
- reference actions = the Consultant's executed calls: successes, and POLICY_VIOLATION attempts
  kept with `expect_error` (other failed calls changed nothing and are dropped);
- the path is re-executed from s_origin and must reach the same state (DIFF 0), else the
  episode is discarded; an episode that changed nothing (Δ0 = 0) is discarded too.
Role models: `client_model`/`client_base_url` and `consultant_model`/`consultant_base_url`
override --model/--base-url (recipe keys or TOOLKIT_* env).
"""

from __future__ import annotations

import random
from typing import Any

from toolkit.flows.logigen.explorer import POLICY_VIOLATION, Draft, Probe, execute


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


async def explore_once(designer: Any, i: int, kind: str, record: Any, ctx: Any, cfg: dict) -> Draft | None:
    from toolkit import prompts
    from toolkit.envs.sqlite import SqliteEnvironment
    from toolkit.flows.logigen import projection as P
    from toolkit.schema import Record
    from toolkit.stages.rollout import EpisodeLimits, LLMAgent, LLMUser, run_episode
    from toolkit.stages.verify import trajectory_calls

    rng = random.Random(f"{designer.seed}:llm:{i}")
    seed_draft = getattr(designer.explorer, kind)(rng)
    if seed_draft is None:
        return None
    view = designer.view
    f = P.facts(view, seed_draft)
    tv = P.template_view(f)
    client_prompt = prompts.load("logigen/client").render(goal=tv["reason_for_call"], known=tv["known_info"])
    consultant_extra = prompts.load("logigen/consultant").render()
    env = SqliteEnvironment(designer.env.domain, state=seed_draft.origin, config=designer.env.config)
    try:
        limits = EpisodeLimits(max_turns=int(cfg.get("max_turns") or 12),
                               max_tool_errors=int(cfg.get("max_tool_errors") or 5))
        agent = LLMAgent(ctx.llm("consultant"), sample_index=i)
        user = LLMUser(ctx.llm("client"), scenario=tv["reason_for_call"], sample_index=i, system_prompt=client_prompt)
        tmp = Record(id=f"{record.id}-explore{i}", env=record.env)
        traj = await run_episode(tmp, _ConsultantEnv(env, consultant_extra), agent, user, f"{tmp.id}-t0", limits,
                                 agent_model=ctx.model_name("consultant"), user_model=ctx.model_name("client"),
                                 first_message="simulate")
        reached = env.snapshot()
    finally:
        env.close()
    actions: list[dict] = []
    goals: list[Probe] = []
    attempt = None
    for c in trajectory_calls(traj):
        if c.side != "agent" or c.args is None or c.ok is None:
            continue
        td = view.tools.get(c.name)
        if td is None:
            continue
        if c.ok:
            actions.append({"name": c.name, "arguments": c.args})
            if td.kind in ("insert", "update"):
                goals.append(Probe(c.name, c.args, td.kind, td.table, ok=True,
                                   column=next((k for k in c.args if k not in view.tables[td.table].pk), None)))
        elif c.error_code == POLICY_VIOLATION:
            actions.append({"name": c.name, "arguments": c.args, "expect_error": POLICY_VIOLATION})
            if attempt is None and not goals and td.kind in ("insert", "update"):
                attempt = Probe(c.name, c.args, td.kind, td.table, code=POLICY_VIOLATION)
    draft = Draft(origin=seed_draft.origin, actions=actions, goals=goals, attempt=attempt if goals else None,
                  archetype=("Mismatch" if attempt is not None and goals else
                             "Entangled" if len(goals) > 1 else seed_draft.archetype),
                  usage=_usage_dict(traj.usage),
                  exploration={"turns": sum(1 for m in traj.messages if m.role == "assistant"),
                               "termination": traj.termination, "calls": len(traj.steps),
                               "goal": tv["reason_for_call"], "error": traj.error})
    if seed_draft.boundary is not None and any(g.sig() == seed_draft.boundary.goal.sig() for g in goals):
        draft.boundary = seed_draft.boundary
        draft.archetype = "Edge"
    if not goals:
        return draft  # nothing written: the caller counts it and drops it
    try:
        draft.target, draft.results = execute(designer.env, draft.origin, actions)
    except ValueError as e:
        draft.exploration["error"] = f"the executed path does not replay: {e}"
        draft.goals = []
        return draft
    if draft.attempt is not None:
        i = next(k for k, a in enumerate(actions) if a.get("expect_error"))
        draft.attempt.rule = draft.results[i].get("rule")
        draft.attempt.message = draft.results[i].get("message")
    if designer.env.diff(draft.target, reached)["total"] != 0:
        draft.exploration["error"] = "replaying the executed calls does not reach the episode's final state"
        draft.goals = []
    return draft


async def llm_drafts(designer: Any, n: int, max_tries: int, ctx: Any, cfg: dict, record: Any) -> list[Draft]:
    from toolkit.io import log

    drafts: list[Draft] = []
    seen: set[str] = set()
    made_viol = 0
    dropped: dict[str, int] = {}
    budget = n * max(1, min(max_tries, int(cfg.get("llm_tries") or 3)))
    for i in range(budget):
        if len(drafts) >= n:
            break
        kind = designer.kind(i, len(drafts), made_viol)
        d = await explore_once(designer, i, kind, record, ctx, cfg)
        if d is None:
            continue
        if not d.goals:
            why = (d.exploration.get("error") or "the episode wrote nothing")[:80]
            dropped[why] = dropped.get(why, 0) + 1
            continue
        if designer.env.diff(d.origin, d.target)["total"] == 0:
            dropped["delta0 = 0"] = dropped.get("delta0 = 0", 0) + 1
            continue
        key = designer.env.hash_state(d.target)
        if key in seen:
            dropped["duplicate target"] = dropped.get("duplicate target", 0) + 1
            continue
        seen.add(key)
        drafts.append(d)
        made_viol += d.attempt is not None
    if dropped:
        log(f"gen-task: {record.id}: llm explorer dropped " + ", ".join(f"{v} ({k})" for k, v in dropped.items()))
    return drafts
