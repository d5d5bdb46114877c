"""`gen-task --strategy logigen`: Set Designer → Explorer → user-view projection.

Input: a record whose `env` points at a sqlite domain ({"backend": "sqlite", "id": "airline"} or
{"backend": "sqlite", "path": "my_domain/"}, optionally with an inline `state`). Output: `-n` task
records per input (default 10), ids `<input id>-lg<k>`, parent_id = the input id, each with
- env: the same domain with `state` = s_origin inline and `state_ref` = its hash;
- task.ground_truth: `actions` = the executed reference path (a violating attempt carries
  `expect_error: POLICY_VIOLATION`), `target_state` (unless `inline_target: false`) and
  `target_state_ref` = the state actually reached;
- task.user_scenario / task.instruction: the user view (projection.py);
- task.complexity: archetype, tags, level, injections, violation, boundary; task.difficulty = level;
- task.extra.user_view: {"source": llm | template | template-fallback, "reasons": [...]};
- the first task's task.extra.dropped: drafts rejected before they became tasks, by reason (an
  LLM episode that does not replay, a user view of an LLM episode or an LLM-written view that
  breaks the leak rule, ...);
- verifier.spec = state_diff.

Settings (recipe `gen-task:` section or CLI): explorer (symbolic | llm; --explorer), n (-n),
seed (--seed), user_view (auto | llm | template; auto = llm when a model or base URL is configured,
else the deterministic template), violation_share (0.3: at least this share of tasks start with a
policy-violating attempt when the domain has one), inject_share (0.5), inline_target (true),
max_tries (8 drafts per wanted task), attempts (--attempts, LLM retries), max_turns (llm explorer),
menu_size (3: goals in the llm explorer's option menu; its goals have 1..max_writes writes, default 3
with --explorer llm), every task drawn by the goal machinery (synth.GoalDesigner),
llm_boundary (auto | true | false; auto = on with --explorer llm: the Set Designer asks the LLM for
boundary seeds of rules the trigger analysis cannot read, verified by execution — llm_seeder.py),
llm_boundary_rules, llm_boundary_max_rules (6), llm_boundary_share (0.5); llm_inject (false: the
LLM proposes distractor / substitute rows for llm_inject_share (0.3) of the tasks, kept only when
the reference path replays unchanged).
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib
from typing import Any

from toolkit.flows.logigen import options as O
from toolkit.flows.logigen.llm_explorer import LLM_MAX_WRITES
from toolkit.envs import backend_capabilities
from toolkit.io import StageError, add_provenance, log
from toolkit.schema import Action, GroundTruth, Record, Task, UserScenario, Verifier
from toolkit.stages.registry import StageContext, strategy


def _bool(v: Any, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    return str(v).lower() in ("1", "true", "yes", "on")


def _missing_boundary(cov: dict) -> str:
    """'; no boundary for a, b (impossible: c, d)': the rules without a boundary task, those the
    trigger analysis shows can have no N-1 state apart."""
    miss = cov.get("missing_boundary") or []
    imp = set(cov.get("boundary_impossible") or {})
    if not miss:
        return ""
    found = [r for r in miss if r not in imp]
    out = f"; no boundary for {', '.join(found)}" if found else ""
    if imp & set(miss):
        out += (f"; {'' if found else 'no boundary for '}{', '.join(r for r in miss if r in imp)}: impossible, "
                "no state can be one action away")
    return out


def load_sqlite_env(record: Record):
    from toolkit.envs import load_env

    if record.env is None:
        raise StageError("the record has no `env`: logigen gen-task needs a sqlite domain", field="env")
    if not backend_capabilities(record.env.backend).relational:
        raise StageError(f"logigen gen-task explores sqlite domains, got backend {record.env.backend!r}",
                         field="env.backend")
    try:
        return load_env(record.env)
    except Exception as e:  # noqa: BLE001 - any failure to build the env is a StageError
        raise StageError(f"cannot build the environment: {type(e).__name__}: {e}", field="env") from None


class Designer:
    """The older symbolic probes of one base state (explorer.SymbolicExplorer): since the goal
    machinery (goals.py) draws every task, they only feed the LLM boundary seeder
    (llm_seeder.seed_boundaries reads the probes, the trigger analysis and the prober)."""

    def __init__(self, env: Any, base: dict, seed: int, cfg: dict):
        from toolkit.flows.logigen.explorer import SymbolicExplorer

        self.env = env
        self.base = base
        self.seed = seed
        self.explorer = SymbolicExplorer(env, base, seed)
        self.view = self.explorer.view

    def close(self) -> None:
        self.explorer.close()


async def project(d: Any, view: Any, env: Any, mode: str, client: Any, attempts: int, policy: str) -> tuple[dict, dict, dict]:
    """(user view, provenance info {"source", "reasons"}, usage)."""
    from toolkit.flows.logigen import projection as P
    from toolkit.roles.structured import RoleRejected, new_usage

    f = P.facts(view, d)
    if mode == "template":
        return P.template_view(f), {"source": "template", "reasons": []}, new_usage()
    allowed = {str(v) for g in d.goals for v in g.args.values()}
    terms = P.forbidden_terms(view, d.origin, d.target, allowed)
    try:
        st = await P.llm_view(client, f, policy, terms, attempts=attempts)
        return st.value, {"source": "llm", "reasons": st.errors, "model": st.model}, st.usage
    except RoleRejected as e:
        return (P.template_view(f), {"source": "template-fallback", "reasons": e.reasons[-3:]}, e.usage)


def view_leaks(d: Any, view_: dict, dview: Any) -> list[str]:
    """The projection's leak rule (projection.leaks) on a finished user view."""
    from toolkit.flows.logigen import projection as P

    allowed = {str(v) for g in d.goals for v in g.args.values()}
    terms = P.forbidden_terms(dview, d.origin, d.target, allowed)
    return P.leaks([view_.get(k) for k in P.VIEW_KEYS], terms)


def to_record(parent: Record, k: int, d: Any, view_: dict, view_info: dict, explorer: str, seed: int,
              inline_target: bool, env_view: Any) -> Record:
    from toolkit.flows.logigen.labels import analyze_path, facts_from_trace, labels
    from toolkit.flows.logigen.set_designer import complexity

    env = env_view.env
    tr = d.trace
    if tr is not None and (tr["origin"] is not d.origin or tr["target"] is not d.target or tr["actions"] != d.actions):
        tr = None  # the draft changed after its traced run: replay it
    if tr is not None:
        tables_changed = tr["tables_changed"]
    else:
        tables_changed = sorted((env.diff(d.origin, d.target) if hasattr(env, "diff") else {"tables": {}})
                                .get("tables", {}))
    cx, level = complexity(d, tables_changed)
    # honest labels: computed from what the task requires (executed), not from how it was drawn
    texts = [view_.get(k) for k in ("instruction", "persona", "reason_for_call", "known_info", "unknown_info",
                                    "instructions")]
    texts = [t for t in texts if t]
    facts = facts_from_trace(tr, texts) if tr is not None else analyze_path(env, d.origin, d.actions, texts)
    lab = labels(facts, d.boundary is not None, d.patterns, d.injections)
    level = lab["level"]
    cx.update(archetype=lab["archetype"], tags=lab["tags"], level=level, writes=facts["writes"],
              read_dependent=facts["read_dependent"], state_dependent=facts["state_dependent"],
              waterfall=facts["waterfall"], actions=facts["actions"], patterns=list(d.patterns))
    if d.seeded:
        cx["seeded"] = d.seeded
    env_ref = parent.env.model_dump(exclude_none=True)
    env_ref["state"] = d.origin
    env_ref["state_ref"] = tr["h_origin"] if tr is not None else env.hash_state(d.origin)
    gt = GroundTruth(actions=[Action(**a) for a in d.actions],
                     target_state=d.target if inline_target else None,
                     target_state_ref=tr["h_target"] if tr is not None else env.hash_state(d.target))
    us = UserScenario(persona=view_["persona"], reason_for_call=view_["reason_for_call"],
                      known_info=view_["known_info"], unknown_info=view_["unknown_info"],
                      instructions=view_["instructions"])
    task = Task(instruction=view_["instruction"], user_scenario=us, ground_truth=gt, difficulty=level,
                complexity=cx, extra={"user_view": view_info, "explorer": explorer, "seed": seed})
    tags = ["logigen", explorer, cx["archetype"]] + (["violation-first"] if d.attempt is not None else []) + \
        (["boundary"] if d.boundary is not None else [])
    return Record(id=f"{parent.id}-lg{k:03d}", parent_id=parent.id, flow="logigen", tags=tags,
                  env=env_ref, plan=parent.plan, task=task, verifier=Verifier(spec="state_diff"))


@strategy("gen-task", "logigen", options=O.GenTaskOptions,
          help="LOGIGEN: Set Designer (boundary seeding, injection, archetypes) + Explorer "
               "(--explorer symbolic|llm, executed targets) + goal-first user view")
def build(cfg: dict, ctx: StageContext):
    explorer = cfg.get("explorer") or "symbolic"
    if explorer not in ("symbolic", "llm"):
        from toolkit.io import UsageError

        raise UsageError(f"--explorer must be symbolic or llm (got {explorer!r})")
    n = int(cfg.get("n") or 10)
    seed = int(cfg.get("seed") or 0)
    attempts = int(cfg.get("attempts") or 3)
    inline_target = _bool(cfg.get("inline_target"), True)
    max_tries = int(cfg.get("max_tries") or 8)
    mode = str(cfg.get("user_view") or "auto")
    if mode == "auto":
        configured = any(cfg.get(k) for k in ("model", "base_url", "user_view_model", "user_view_base_url"))
        mode = "llm" if configured else "template"
    if mode not in ("llm", "template"):
        from toolkit.io import UsageError

        raise UsageError(f"user_view must be auto, llm or template (got {mode!r})")
    lb = cfg.get("llm_boundary")
    llm_boundary = explorer == "llm" if lb is None or str(lb).lower() == "auto" else _bool(lb, False)
    llm_inject = _bool(cfg.get("llm_inject"), False)

    async def fn(record: Record) -> list[Record]:
        env = load_sqlite_env(record)
        try:
            base = env.snapshot()
            rseed = zlib.crc32(f"{seed}:{record.id}".encode())
            coverage = None
            llm_dropped: dict = {}
            from toolkit.flows.logigen.synth import GoalDesigner

            gcfg = cfg if explorer == "symbolic" else dict(cfg, max_writes=cfg.get("max_writes") or LLM_MAX_WRITES)
            designer = GoalDesigner(env, base, rseed, gcfg)
            # the older Designer's symbolic probes only feed the LLM boundary seeder (the rules the
            # analysis cannot read); every goal comes from the goal machinery (goals.py)
            seeder = Designer(env, base, rseed, cfg) if llm_boundary else None
            seeding = None
            try:
                if llm_boundary:
                    seeding = await _llm_seeding(seeder, ctx, cfg, attempts, env.policy(), record)
                edges = list(seeding.boundaries) if seeding is not None else []
                if explorer == "symbolic":
                    drafts = designer.drafts(n, max_tries)
                    if edges:
                        from toolkit.flows.logigen.llm_explorer import llm_edge_drafts

                        share = cfg.get("llm_boundary_share")
                        k = max(1, math.ceil((float(share) if share is not None else 0.5) * n * designer.boundary_share))
                        extra, llm_dropped = llm_edge_drafts(designer, edges, min(k, len(edges)), rseed)
                        seen = {env.hash_state(d.target) for d in drafts}
                        extra = [d for d in extra if env.hash_state(d.target) not in seen]
                        drafts = drafts[:max(0, n - len(extra))] + extra
                    coverage = designer.coverage(drafts)
                    if designer.coverage_on:
                        log(f"gen-task: {record.id}: rule coverage: violation-first {coverage['violation_covered']}, "
                            f"boundary {coverage['boundary_covered']}"
                            + _missing_boundary(coverage))
                    else:  # no rule was planned: listing rules "without a boundary" would mislead
                        log(f"gen-task: {record.id}: rule coverage off (rule_coverage: false): violation-first "
                            f"{coverage['violation_covered']}, boundary {coverage['boundary_covered']} as drawn")
                else:
                    from toolkit.flows.logigen.llm_explorer import llm_drafts

                    drafts, llm_dropped = await llm_drafts(designer, n, max_tries, ctx, cfg, record, edges)
            finally:
                designer.close()
                if seeder is not None:
                    seeder.close()
            if not drafts:
                raise StageError(f"no task could be drawn from this domain in {n * max_tries} tries "
                                 "(no successful write found from s_origin?)", field="env")
            injected = await _llm_injections(designer, drafts, ctx, cfg, attempts, rseed, record) if llm_inject else {}
            client = ctx.llm("user_view") if mode == "llm" else None
            views = await asyncio.gather(*(project(d, designer.view, env, mode, client, attempts, env.policy())
                                           for d in drafts))
            kept = []
            for j, (d, pv) in enumerate(zip(drafts, views)):
                # the leak rule on every view of an LLM episode and on every LLM-written view: a
                # view that names a column, a tool, a hidden id, ... rejects the task (counted)
                bad = view_leaks(d, pv[0], designer.view) if explorer == "llm" or pv[1]["source"] == "llm" else []
                if bad:
                    why = "user view leaks: " + ", ".join(b.split(" ", 1)[0] for b in bad[:3])
                    llm_dropped[why] = llm_dropped.get(why, 0) + 1
                    log(f"gen-task: {record.id}: task {j} rejected, its user view reveals " + ", ".join(bad[:5]))
                    continue
                kept.append((j, d, pv))
            if not kept:
                raise StageError(f"every drawn task was rejected: {llm_dropped}", field="env")
            out = []
            usage_total = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
            for k, (j, d, (v, info, usage)) in enumerate(kept):
                for key in usage_total:
                    usage_total[key] += usage.get(key, 0) or 0
                rec = to_record(record, k, d, v, info, explorer, seed, inline_target, designer.view)
                src = info["source"]
                if d.exploration:
                    rec.task.extra["exploration"] = d.exploration
                if j in injected:
                    rec.task.extra["llm_inject"] = injected[j]
                total = dict(usage if src != "template" else {})
                if coverage is not None and k == 0:
                    rec.task.extra["rule_coverage"] = coverage
                if llm_dropped and k == 0:
                    rec.task.extra["dropped"] = dict(llm_dropped)  # drafts rejected before they became tasks
                if seeding is not None and k == 0:
                    # the LLM boundary seeding ran once for this input: its report and usage go
                    # with the first task (so the yield table counts the requests once)
                    rec.task.extra["llm_boundary"] = seeding.summary()
                    for key_, val in seeding.usage.items():
                        total[key_] = (total.get(key_) or 0) + (val or 0)
                    for key in usage_total:
                        usage_total[key] += seeding.usage.get(key, 0) or 0
                for key_, val in (d.usage or {}).items():
                    total[key_] = (total.get(key_) or 0) + (val or 0)
                for key in usage_total:
                    usage_total[key] += (d.usage or {}).get(key, 0) or 0
                model = info.get("model") or (ctx.model_name("user_view") if src != "template" else None)
                if explorer == "llm":
                    model = ctx.model_name("consultant")
                if seeding is not None and k == 0 and seeding.asked and model is None:
                    model = seeding.model or ctx.model_name("boundary_seeder")
                if injected.get(j, {}).get("applied") and model is None:
                    model = ctx.model_name("injection_designer")
                add_provenance(rec, "gen-task", strategy=f"logigen:{explorer}:user-view={src}",
                               model=model, recipe_hash=cfg.get("recipe_hash"), usage=total or None)
                out.append(rec)
            fallbacks = sum(1 for _, info, _ in views if info["source"] == "template-fallback")
            if fallbacks:
                log(f"gen-task: {record.id}: {fallbacks}/{len(out)} user views fell back to the template "
                    "(malformed or leaking LLM replies; see task.extra.user_view.reasons)")
            if len(out) < n:
                log(f"gen-task: {record.id}: {len(out)} distinct tasks of {n} wanted after {n * max_tries} tries")
            return out
        finally:
            env.close()

    return fn


async def _llm_seeding(designer: Designer, ctx: Any, cfg: dict, attempts: int, policy: str, record: Record):
    """The Set Designer's LLM second: boundary seeds for rules the analysis cannot read, each
    verified by execution (llm_seeder.py). Returns the SeedReport."""
    from toolkit.flows.logigen.llm_seeder import ROLE, seed_boundaries

    if ctx is None:
        from toolkit.io import UsageError

        raise UsageError("llm_boundary needs an LLM (run through the CLI, or pass a StageContext)")
    share = cfg.get("llm_boundary_share")
    designer.explorer.llm_boundary_share = float(share) if share is not None else 0.5
    rep = await seed_boundaries(designer.explorer, ctx.llm(ROLE), cfg, policy, attempts=attempts)
    if rep.asked:
        s = rep.summary()
        why = "; ".join(f"{k} x{v}" for k, v in s["discarded_by_reason"].items())
        log(f"gen-task: {record.id}: LLM boundary seeds: asked {len(rep.asked)} rule(s), "
            f"{len(rep.boundaries)} verified, {len(rep.discarded)} discarded" + (f" ({why})" if why else "")
            + f", {len(rep.rejected)} rejected as malformed")
    return rep


async def _llm_injections(designer: Designer, drafts: list, ctx: Any, cfg: dict, attempts: int, rseed: int,
                          record: Record) -> dict[int, dict]:
    """LLM resource injection (distractor / substitute rows) for `llm_inject_share` of the drafts,
    each verified by re-executing the reference path (llm_seeder.inject_llm). {draft index:
    {"applied", "reason"}}; the LLM usage goes into the draft's usage."""
    from toolkit.flows.logigen.llm_seeder import INJECT_ROLE, inject_llm

    if ctx is None:
        from toolkit.io import UsageError

        raise UsageError("llm_inject needs an LLM (run through the CLI, or pass a StageContext)")
    share = float(cfg.get("llm_inject_share") if cfg.get("llm_inject_share") is not None else 0.3)
    rng = random.Random(f"{rseed}:llm-inject")
    picked = [k for k in range(len(drafts)) if rng.random() < share]
    client = ctx.llm(INJECT_ROLE)
    res = await asyncio.gather(*(inject_llm(client, designer.view, designer.env, drafts[k], attempts, sample_index=k)
                                 for k in picked))
    out = {}
    for k, r in zip(picked, res):
        d = drafts[k]
        d.usage = dict(d.usage or {})
        for key, val in r["usage"].items():
            d.usage[key] = (d.usage.get(key) or 0) + (val or 0)
        out[k] = {"applied": r["applied"], "reason": r["reason"]}
    if picked:
        applied = sum(1 for r in out.values() if r["applied"])
        log(f"gen-task: {record.id}: LLM injections: {applied}/{len(picked)} verified and applied, "
            f"{len(picked) - applied} discarded")
    return out


__all__ = ["Designer", "build", "load_sqlite_env", "project", "to_record"]
