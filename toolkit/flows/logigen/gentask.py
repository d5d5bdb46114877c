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

Settings (recipe `gen-task:` section or CLI): the command's `explorer` (symbolic | llm; --explorer,
default symbolic) and the keys of `options.GenTaskOptions`, where each key's default, allowed values
and meaning are declared once (n, seed, user_view auto | llm | template, violation_share, max_tries,
max_writes, llm_boundary auto | true | false, llm_boundary_share, llm_inject, ...). `build` resolves
the `auto` values once (`settings`); per input, `generate` draws the drafts (`draw`: the goal
machinery, synth.GoalDesigner; with `llm_boundary`, verified LLM boundary seeds, llm_seeder.py;
with --explorer llm, Client x Consultant episodes, llm_explorer.py), applies the LLM injections
(`llm_inject`), writes the user views under the leak rule (`user_views`) and the records
(`task_record`).
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from toolkit.envs import load_env
from toolkit.flows.logigen import options as O
from toolkit.flows.logigen import projection as P
from toolkit.flows.logigen.labels import analyze_path, facts_from_trace, labels
from toolkit.flows.logigen.llm_explorer import llm_drafts, llm_edge_drafts
from toolkit.flows.logigen.llm_seeder import INJECT_ROLE, ROLE, BaseProbes, SeedReport, inject_llm, seed_boundaries
from toolkit.flows.logigen.set_designer import complexity
from toolkit.flows.logigen.synth import GoalDesigner
from toolkit.io import StageError, UsageError, add_provenance, log
from toolkit.roles.structured import RoleRejected, new_usage
from toolkit.envs import backend_capabilities
from toolkit.schema import Action, GroundTruth, Record, Task, UserScenario, Verifier
from toolkit.stages.registry import StageContext, strategy


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
    """The LLM boundary seeder's probes of one base state (llm_seeder.BaseProbes): the symbolic
    probes, the trigger analysis and the prober the seeder reads (every goal comes from the goal
    machinery, synth.GoalDesigner)."""

    def __init__(self, env: Any, base: dict, seed: int):
        self.env = env
        self.base = base
        self.seed = seed
        self.explorer = BaseProbes(env, base, seed)
        self.view = self.explorer.view

    def close(self) -> None:
        self.explorer.close()


async def project(d: Any, view: Any, env: Any, mode: str, client: Any, attempts: int, policy: str) -> tuple[dict, dict, dict]:
    """(user view, provenance info {"source", "reasons"}, usage)."""
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
    allowed = {str(v) for g in d.goals for v in g.args.values()}
    terms = P.forbidden_terms(dview, d.origin, d.target, allowed)
    return P.leaks([view_.get(k) for k in P.VIEW_KEYS], terms)


def to_record(parent: Record, k: int, d: Any, view_: dict, view_info: dict, explorer: str, seed: int,
              inline_target: bool, env_view: Any) -> Record:
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


# ----------------------------------------------------------------------------------------------
# the strategy: settings -> drafts (the goal machinery, optionally LLM-seeded / LLM-explored) ->
# LLM injections -> user views (the leak rule) -> task records


@dataclass(frozen=True)
class Settings:
    """The options resolved once per run: `auto` values decided, the command's keys read."""

    opts: O.GenTaskOptions
    explorer: Literal["symbolic", "llm"]
    user_view: Literal["llm", "template"]
    llm_boundary: bool


def settings(opts: O.GenTaskOptions, ctx: StageContext | None) -> Settings:
    explorer = getattr(ctx.opts, "explorer", None) if ctx is not None else None
    explorer = explorer or "symbolic"
    mode = opts.user_view
    if mode == "auto":
        configured = ctx is not None and any(getattr(ctx.opts, k, None) for k in
                                             ("model", "base_url", "user_view_model", "user_view_base_url"))
        mode = "llm" if configured else "template"
    lb = opts.llm_boundary
    return Settings(opts=opts, explorer=explorer, user_view=mode,
                    llm_boundary=explorer == "llm" if lb == "auto" else bool(lb))


@dataclass
class Drawn:
    """One input's drafts and what was learnt drawing them."""

    designer: GoalDesigner
    drafts: list
    coverage: dict | None = None
    dropped: dict = field(default_factory=dict)  # drafts rejected before they became tasks, by reason
    seeding: SeedReport | None = None


@strategy("gen-task", "logigen", options=O.GenTaskOptions,
          help="LOGIGEN: Set Designer (boundary seeding, injection, archetypes) + Explorer "
               "(--explorer symbolic|llm, executed targets) + goal-first user view")
def build(opts: O.GenTaskOptions, ctx: StageContext):
    s = settings(opts, ctx)

    async def fn(record: Record) -> list[Record]:
        env = load_sqlite_env(record)
        try:
            return await generate(record, env, s, ctx)
        finally:
            env.close()

    return fn


async def generate(record: Record, env: Any, s: Settings, ctx: StageContext | None) -> list[Record]:
    """The task records of one input (its sqlite environment `env`, open)."""
    o = s.opts
    drawn = await draw(record, env, s, ctx)
    if not drawn.drafts:
        raise StageError(f"no task could be drawn from this domain in {o.n * o.max_tries} tries "
                         "(no successful write found from s_origin?)", field="env")
    rseed = _record_seed(o.seed, record)
    injected = await _llm_injections(drawn.designer, drawn.drafts, ctx, o, rseed, record) if o.llm_inject else {}
    views, kept = await user_views(record, env, drawn, s, ctx)
    out = [task_record(record, k, j, d, pv, drawn, injected, s, ctx) for k, (j, d, pv) in enumerate(kept)]
    fallbacks = sum(1 for _, info, _ in views if info["source"] == "template-fallback")
    if fallbacks:
        log(f"gen-task: {record.id}: {fallbacks}/{len(out)} user views fell back to the template "
            "(malformed or leaking LLM replies; see task.extra.user_view.reasons)")
    if len(out) < o.n:
        log(f"gen-task: {record.id}: {len(out)} distinct tasks of {o.n} wanted after {o.n * o.max_tries} tries")
    return out


def _record_seed(seed: int, record: Record) -> int:
    return zlib.crc32(f"{seed}:{record.id}".encode())


async def draw(record: Record, env: Any, s: Settings, ctx: StageContext | None) -> Drawn:
    """The drafts: the goal designer's (symbolic) or the Client x Consultant episodes' (llm), with
    the LLM boundary seeds when `llm_boundary` is on. The designers are closed when done (their
    views stay usable)."""
    o = s.opts
    base = env.snapshot()
    rseed = _record_seed(o.seed, record)
    designer = GoalDesigner(env, base, rseed, o, s.explorer)
    # the seeder's symbolic probes feed the LLM boundary seeder only (the rules the analysis
    # cannot read); every goal comes from the goal machinery (goals.py)
    seeder = Designer(env, base, rseed) if s.llm_boundary else None
    drawn = Drawn(designer=designer, drafts=[])
    try:
        if seeder is not None:
            drawn.seeding = await _llm_seeding(seeder, ctx, o, env.policy(), record)
        edges = list(drawn.seeding.boundaries) if drawn.seeding is not None else []
        if s.explorer == "symbolic":
            _symbolic_drafts(drawn, edges, o, rseed, record)
        else:
            drawn.drafts, drawn.dropped = await llm_drafts(designer, o, ctx, record, edges)
    finally:
        designer.close()
        if seeder is not None:
            seeder.close()
    return drawn


def _symbolic_drafts(drawn: Drawn, edges: list, o: O.GenTaskOptions, rseed: int, record: Record) -> None:
    """The goal designer's drafts, `llm_boundary_share` of its boundary tasks replaced by goal
    chains from the verified LLM seeds `edges`; the rule coverage report, logged."""
    designer = drawn.designer
    env = designer.env
    drafts = designer.drafts(o.n, o.max_tries)
    if edges:
        k = max(1, math.ceil(o.llm_boundary_share * o.n * designer.boundary_share))
        extra, drawn.dropped = llm_edge_drafts(designer, edges, min(k, len(edges)), rseed)
        seen = {env.hash_state(d.target) for d in drafts}
        extra = [d for d in extra if env.hash_state(d.target) not in seen]
        drafts = drafts[:max(0, o.n - len(extra))] + extra
    drawn.drafts = drafts
    cov = drawn.coverage = designer.coverage(drafts)
    if designer.coverage_on:
        log(f"gen-task: {record.id}: rule coverage: violation-first {cov['violation_covered']}, "
            f"boundary {cov['boundary_covered']}" + _missing_boundary(cov))
    else:  # no rule was planned: listing rules "without a boundary" would mislead
        log(f"gen-task: {record.id}: rule coverage off (rule_coverage: false): violation-first "
            f"{cov['violation_covered']}, boundary {cov['boundary_covered']} as drawn")


async def user_views(record: Record, env: Any, drawn: Drawn, s: Settings,
                     ctx: StageContext | None) -> tuple[list, list]:
    """(every draft's (view, info, usage), the kept [(draft index, draft, (view, info, usage))]):
    the leak rule on every view of an LLM episode and on every LLM-written view: a view that
    names a column, a tool, a hidden id, ... rejects the task (counted in drawn.dropped)."""
    view = drawn.designer.view
    client = ctx.llm("user_view") if s.user_view == "llm" and ctx is not None else None
    views = await asyncio.gather(*(project(d, view, env, s.user_view, client, s.opts.attempts, env.policy())
                                   for d in drawn.drafts))
    kept = []
    for j, (d, pv) in enumerate(zip(drawn.drafts, views)):
        bad = view_leaks(d, pv[0], view) if s.explorer == "llm" or pv[1]["source"] == "llm" else []
        if bad:
            why = "user view leaks: " + ", ".join(b.split(" ", 1)[0] for b in bad[:3])
            drawn.dropped[why] = drawn.dropped.get(why, 0) + 1
            log(f"gen-task: {record.id}: task {j} rejected, its user view reveals " + ", ".join(bad[:5]))
            continue
        kept.append((j, d, pv))
    if not kept:
        raise StageError(f"every drawn task was rejected: {drawn.dropped}", field="env")
    return list(views), kept


def _add(total: dict, usage: dict | None) -> None:
    for key, val in (usage or {}).items():
        total[key] = (total.get(key) or 0) + (val or 0)


def task_record(record: Record, k: int, j: int, d: Any, pv: tuple, drawn: Drawn, injected: dict, s: Settings,
                ctx: StageContext | None) -> Record:
    """The k-th task record (draft j, its user view `pv`); the first carries the run's reports
    (rule coverage, dropped drafts, the LLM boundary seeding and its usage)."""
    v, info, usage = pv
    rec = to_record(record, k, d, v, info, s.explorer, s.opts.seed, s.opts.inline_target, drawn.designer.view)
    src = info["source"]
    if d.exploration:
        rec.task.extra["exploration"] = d.exploration
    if j in injected:
        rec.task.extra["llm_inject"] = injected[j]
    total = dict(usage if src != "template" else {})
    seeding = drawn.seeding if k == 0 else None
    if drawn.coverage is not None and k == 0:
        rec.task.extra["rule_coverage"] = drawn.coverage
    if drawn.dropped and k == 0:
        rec.task.extra["dropped"] = dict(drawn.dropped)  # drafts rejected before they became tasks
    if seeding is not None:
        # the LLM boundary seeding ran once for this input: its report and usage go with the
        # first task (so the yield table counts the requests once)
        rec.task.extra["llm_boundary"] = seeding.summary()
        _add(total, seeding.usage)
    _add(total, d.usage)
    add_provenance(rec, "gen-task", strategy=f"logigen:{s.explorer}:user-view={src}",
                   model=_model(ctx, info, src, s, seeding, injected.get(j, {})),
                   recipe_hash=s.opts.recipe_hash, usage=total or None)
    return rec


def _model(ctx: StageContext | None, info: dict, src: str, s: Settings, seeding: SeedReport | None,
           inject: dict) -> str | None:
    """The provenance model: the user view's, the Consultant's (llm explorer), else the boundary
    seeder's (first task) or the injection designer's when one of them was used."""
    def name(role: str) -> str | None:
        return ctx.model_name(role) if ctx is not None else None

    model = info.get("model") or (name("user_view") if src != "template" else None)
    if s.explorer == "llm":
        model = name("consultant")
    if seeding is not None and seeding.asked and model is None:
        model = seeding.model or name("boundary_seeder")
    if inject.get("applied") and model is None:
        model = name("injection_designer")
    return model


async def _llm_seeding(designer: Designer, ctx: StageContext | None, o: O.GenTaskOptions, policy: str,
                       record: Record) -> SeedReport:
    """The Set Designer's LLM second: boundary seeds for rules the analysis cannot read, each
    verified by execution (llm_seeder.py). Returns the SeedReport."""
    if ctx is None:
        raise UsageError("llm_boundary needs an LLM (run through the CLI, or pass a StageContext)")
    rep = await seed_boundaries(designer.explorer, ctx.llm(ROLE), o, policy)
    if rep.asked:
        summ = rep.summary()
        why = "; ".join(f"{k} x{v}" for k, v in summ["discarded_by_reason"].items())
        log(f"gen-task: {record.id}: LLM boundary seeds: asked {len(rep.asked)} rule(s), "
            f"{len(rep.boundaries)} verified, {len(rep.discarded)} discarded" + (f" ({why})" if why else "")
            + f", {len(rep.rejected)} rejected as malformed")
    return rep


async def _llm_injections(designer: GoalDesigner, drafts: list, ctx: StageContext | None, o: O.GenTaskOptions,
                          rseed: int, record: Record) -> dict[int, dict]:
    """LLM resource injection (distractor / substitute rows) for `llm_inject_share` of the drafts,
    each verified by re-executing the reference path (llm_seeder.inject_llm). {draft index:
    {"applied", "reason"}}; the LLM usage goes into the draft's usage."""
    if ctx is None:
        raise UsageError("llm_inject needs an LLM (run through the CLI, or pass a StageContext)")
    rng = random.Random(f"{rseed}:llm-inject")
    picked = [k for k in range(len(drafts)) if rng.random() < o.llm_inject_share]
    client = ctx.llm(INJECT_ROLE)
    res = await asyncio.gather(*(inject_llm(client, designer.view, designer.env, drafts[k], o.attempts, sample_index=k)
                                 for k in picked))
    out = {}
    for k, r in zip(picked, res):
        d = drafts[k]
        d.usage = dict(d.usage or {})
        _add(d.usage, r["usage"])
        out[k] = {"applied": r["applied"], "reason": r["reason"]}
    if picked:
        applied = sum(1 for r in out.values() if r["applied"])
        log(f"gen-task: {record.id}: LLM injections: {applied}/{len(picked)} verified and applied, "
            f"{len(picked) - applied} discarded")
    return out


__all__ = ["Designer", "Settings", "build", "generate", "load_sqlite_env", "project", "settings", "to_record"]
