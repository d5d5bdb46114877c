"""make-verifier --strategy eigendata: write `evaluate_submission(reference, eval)` per task and
SELF-TEST it in the sandbox before it is trusted.

1. Reference: the first trajectory whose `verify` verdicts all pass (the validated trajectory),
   else the task's `ground_truth.actions`. Its calls are RE-EXECUTED on a fresh environment to get
   the real initial / final states and which calls change the state.
2. Spec (deterministic, verifier_template.spec_from_reference): the reference state delta with
   EXACT / SEMANTIC / SKIP field classes, the key calls (must-have ∩ state-modifying) with critical
   parameters, the reference's policy-refused call count.
3. The LLM (role `verifier`) writes the module from the spec (`verifier_source: llm`, default) or
   the toolkit renders it (`verifier_source: template`).
4. Self-test in the sandbox (the `verify --strategy code` contract: reference = task.ground_truth,
   eval = {messages, tool_calls, initial_state, final_state}): it must PASS the reference and FAIL
   every applicable perturbation of toolkit.flows.eigendata.perturb (each perturbed call list is
   executed for real; the injected policy-refused call is not). A failed self-test is fed back and
   the LLM regenerates, up to `verifier_attempts` (3) sources; then `verifier_fallback: template`
   (default) tries the toolkit's template, `none` gives up.
5. Output: `verifier = {spec: code, source, self_test}` (self_test holds every case's expected and
   observed outcome, the generator and attempts) and a verdict stage make-verifier, kind verifier,
   name self_test (attribution task when no verifier could be validated).
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from typing import Any

from toolkit.flows.eigendata import common as C
from toolkit.flows.eigendata import verifier_template as VT
from toolkit.flows.eigendata.perturb import perturbations
from toolkit.envs import backend_capabilities
from toolkit.io import StageError, add_provenance, log
from toolkit.roles.structured import Malformed, RoleRejected, add_usage, ask_structured, new_usage
from toolkit.schema import Record, Verdict, Verifier
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.eigendata import options as O
from toolkit.flows.eigendata.validate_task import task_text
from toolkit.sandbox import SandboxLimits, run_function
from toolkit.scoring import rewards as R

STAGE = "make-verifier"


# ----------------------------------------------------------------------------------------------
# reference and evaluation inputs (real execution)


def reference_calls(record: Record) -> tuple[list[dict], str]:
    from toolkit.scorers import trajectory_calls

    for t in record.trajectories:
        vs = [v for v in record.verdicts if v.stage == "verify" and v.trajectory_id == t.id]
        if vs and all(v.passed for v in vs):
            calls = [{"name": c.name, "arguments": c.args or {}, "side": c.side} for c in trajectory_calls(t)
                     if c.args is not None]
            return calls, f"trajectory {t.id} (passed verify)"
    gt = record.task.ground_truth if record.task else None
    if gt is not None and gt.actions:
        return [{"name": a.name, "arguments": dict(a.arguments), "side": a.side} for a in gt.actions], \
            "task.ground_truth.actions"
    raise StageError("make-verifier needs a trajectory that passed verify or task.ground_truth.actions",
                     field="trajectories")


def skip_keys(record: Record, env: Any) -> tuple:
    keys = list(R.DEFAULT_EXCLUDE_KEYS) + list(getattr(env, "exclude_keys", ()) or ())
    keys += [str(k) for k in ((record.env.config or {}).get("exclude_keys") or [])]
    return tuple(dict.fromkeys(keys))


def build_eval(env: Any, calls: list[dict], tid: str, unchanged_state: bool = False) -> tuple[dict, list[dict]]:
    """Execute `calls` from the initial state; the eval dict of the code-verifier contract and the
    executed calls (with state_changed / error_code)."""
    env.reset()
    initial = env.snapshot()
    done, tcs = [], []
    for i, c in enumerate(calls):
        if c.get("injected_result") is not None:
            content = json.dumps(c["injected_result"], sort_keys=True)
            r = {"ok": False, "content": content, "error_code": (c["injected_result"].get("error") or {}).get("code"),
                 "state_changed": False}
        else:
            r = C.execute(env, c["name"], c.get("arguments") or {}, side=c.get("side") or "agent")
        done.append(dict(c, ok=r["ok"], error_code=r["error_code"], state_changed=r["state_changed"]))
        tcs.append({"id": f"call_{i + 1}", "name": c["name"], "arguments": c.get("arguments") or {},
                    "side": c.get("side") or "agent", "ok": r["ok"], "result": r["content"]})
    final = initial if unchanged_state else env.snapshot()
    env.reset()
    return {"trajectory_id": tid, "messages": [], "tool_calls": tcs, "initial_state": initial,
            "final_state": final}, done


def policy_codes(env: Any) -> bool:
    """Whether the environment refuses policy-violating calls with a POLICY_VIOLATION error (so a
    verifier's Part 3 can observe refusals): backends registered with `policy_errors` (sqlite domains
    with policy triggers, python envs); not
    τ² (its tools never emit the code) nor simulated environments. An env may say so itself with
    `emits_policy_violations`."""
    v = getattr(env, "emits_policy_violations", None)
    if isinstance(v, bool):
        return v
    if not backend_capabilities(getattr(env, "backend", None)).policy_errors:
        return False
    dom = getattr(env, "domain", None)  # a compiled domain refuses only where it has rules / triggers
    return dom is None or bool(getattr(dom, "rules", None) or getattr(dom, "triggers", None))


def self_test_cases(env: Any, ref_calls: list[dict], must_have: list[str],
                    policy: bool | None = None) -> tuple[list[dict], dict, list[dict]]:
    """[{name, expect, eval | skipped}], the reference eval, the executed reference calls."""
    ref_eval, executed = build_eval(env, ref_calls, "reference")
    cases = [{"name": "reference", "expect": True, "eval": ref_eval}]
    pc = policy_codes(env) if policy is None else policy
    for p in perturbations(executed, must_have, policy_codes=pc):
        if not p.applicable:
            cases.append({"name": p.name, "expect": False, "skipped": p.why})
            continue
        ev, _ = build_eval(env, p.calls, f"perturbed-{p.name}", unchanged_state=p.unchanged_state)
        cases.append({"name": p.name, "expect": False, "eval": ev, "why": p.why})
    return cases, ref_eval, executed


# ----------------------------------------------------------------------------------------------
# running a verifier in the sandbox


def _limits(o: O.MakeVerifierOptions):
    return SandboxLimits(cpu_seconds=o.code_cpu_seconds, wall_seconds=o.code_wall_seconds,
                         memory_mb=o.code_memory_mb)


def run_verifier(source: str, reference: dict, ev: dict, o: O.MakeVerifierOptions) -> dict:
    """{"passed": bool | None, "error": str | None, "value": ...}; passed None = crashed / malformed."""
    res = run_function(source, "evaluate_submission", [reference, ev], None, _limits(o), o.sandbox)
    if not res.ok:
        return {"passed": None, "error": (f"killed ({res.killed}): " if res.killed else "") + str(res.error)}
    v = res.value
    if not isinstance(v, dict) or not isinstance(v.get("overall_pass"), bool):
        return {"passed": None, "error": f"returned no dict with a boolean overall_pass: {C.short(v, 200)}"}
    return {"passed": v["overall_pass"], "error": None, "reward": v.get("reward"),
            "component_scores": v.get("component_scores")}


def self_test(source: str, reference: dict, cases: list[dict], o: O.MakeVerifierOptions) -> dict:
    rows = []
    for c in cases:
        if "skipped" in c:
            rows.append({"case": c["name"], "expect": "fail", "skipped": c["skipped"]})
            continue
        r = run_verifier(source, reference, c["eval"], o)
        ok = r["passed"] is not None and r["passed"] == c["expect"]
        row = {"case": c["name"], "expect": "pass" if c["expect"] else "fail",
               "got": "error" if r["passed"] is None else ("pass" if r["passed"] else "fail"), "ok": ok}
        if r.get("error"):
            row["error"] = r["error"]
        if c.get("why"):
            row["perturbation"] = c["why"]
        if r.get("component_scores") is not None:
            row["component_scores"] = r["component_scores"]
        rows.append(row)
    ran = [r for r in rows if "skipped" not in r]
    negatives = [r for r in ran if r["expect"] == "fail"]
    out = {"passed": bool(ran) and bool(negatives) and all(r["ok"] for r in ran), "cases": rows,
           "n_cases": len(ran), "n_ok": sum(1 for r in ran if r["ok"]), "n_negative": len(negatives)}
    if not negatives:  # passing the reference alone proves nothing: an always-pass verifier would
        out["error"] = ("no perturbation applies (the reference makes no call / changes nothing observable): "
                        "the verifier cannot be tested, so it is not trusted")
    return out


def feedback(st: dict) -> str:
    bad = [r for r in st["cases"] if "skipped" not in r and not r["ok"]]
    if st.get("error"):
        return "\nYour previous verifier could not be tested: " + st["error"] + "\n"
    lines = [f"- case {r['case']}: expected {r['expect']}, got {r['got']}" + (f" ({r['error']})" if r.get("error") else "")
             + (f" [perturbation: {r['perturbation']}]" if r.get("perturbation") else "") for r in bad]
    return "\nYour previous verifier failed its self-test:\n" + "\n".join(lines) + "\nFix it.\n"


# ----------------------------------------------------------------------------------------------
# the LLM writer


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def parse_source(text: str | None) -> str:
    s = text or ""
    m = _FENCE.search(s)
    if m:
        src = m.group(1)
    elif "```" in s:
        raise Malformed("unterminated ``` block (truncated?)")
    elif "def evaluate_submission" in s:
        src = s
    else:
        raise Malformed("no ```python block with the verifier")
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise Malformed(f"the verifier does not compile: {e.msg} (line {e.lineno})") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "evaluate_submission"]
    if not fns:
        raise Malformed("no top-level def evaluate_submission(reference, eval)")
    if len(fns[0].args.args) != 2:
        raise Malformed("evaluate_submission must take exactly (reference, eval)")
    return src


def _policy_part(spec: dict) -> str:
    if spec["policy_check"] == "not_applicable":
        return ("Part 3 - policy compliance: NOT APPLICABLE in this environment (its tools never refuse a call "
                "with POLICY_VIOLATION, so refusals are not observable). Do not count POLICY_VIOLATION results and "
                "do not report a policy score: put one line \"not applicable\" in checks_policy; policy effects show "
                "in the state (Part 1). Policy, for reference:")
    return ("Part 3 - policy compliance: the submission must not have more policy-refused calls (results with "
            f"POLICY_VIOLATION) than the reference ({spec['reference_violations']}); policy rules to respect:")


@strategy("make-verifier", "eigendata", options=O.MakeVerifierOptions, help="EigenData VerificationFunctionAgent + sandbox self-test against automatic perturbations")
def build(o: O.MakeVerifierOptions, ctx: StageContext):
    src_mode, fallback, n_sources, attempts = o.verifier_source, o.verifier_fallback, o.verifier_attempts, o.attempts

    async def fn(record: Record) -> Record:
        if record.task is None:
            raise StageError("record has no task", field="task")
        env = C.load_record_env(record)
        try:
            calls, ref_from = reference_calls(record)
            gt = record.task.ground_truth
            must = list(gt.must_have_functions) if gt else []
            pc = policy_codes(env)
            cases, ref_eval, executed = await asyncio.to_thread(self_test_cases, env, calls, must, pc)
            spec = VT.spec_from_reference(ref_eval["initial_state"], ref_eval["final_state"], executed, must,
                                          skip_keys(record, env), policy_codes=pc)
            policy = C.policy_text(env, 3000)
        finally:
            env.close()
        reference = gt.model_dump(mode="json") if gt else {}
        history: list[dict] = []
        usage = new_usage()
        model = None
        chosen = last = None
        if src_mode == "llm":
            p = C.role_prompt("verification_function", record)
            fb = ""
            for k in range(n_sources):
                text = p.render(skip_keys=", ".join(spec["skip_keys"]) or "(none)",
                                policy_part=_policy_part(spec), overall_rule=(
                                    "Parts 1 and 2 pass" if spec["policy_check"] == "not_applicable"
                                    else "all three parts pass"),
                                reference_violations=spec["reference_violations"], policy=policy,
                                task=task_text(record), delta=json.dumps(spec["delta"], ensure_ascii=False)[:12000],
                                key_calls=json.dumps(spec["key_calls"], ensure_ascii=False), feedback=fb,
                                guidance=C.guidance(record, "verification_function"))
                try:
                    got = await ask_structured(ctx.llm("verifier"), [{"role": "user", "content": text}], parse_source,
                                               role="verification_function", attempts=attempts,
                                               sample_index=k * attempts)
                except RoleRejected as e:
                    add_usage(usage, e.usage)
                    history.append({"generator": "llm", "source_attempt": k + 1, "error": str(e)})
                    continue
                add_usage(usage, got.usage)
                model = got.model
                st = await asyncio.to_thread(self_test, got.value, reference, cases, o)
                history.append({"generator": "llm", "source_attempt": k + 1, "passed": st["passed"],
                                "n_ok": st["n_ok"], "n_cases": st["n_cases"]})
                if st["passed"]:
                    chosen = ("llm", got.value, st)
                    break
                fb = feedback(st)
                last = ("llm", got.value, st)
        fell_back = None
        if chosen is None and (src_mode == "template" or fallback == "template"):
            if src_mode == "llm":  # the LLM's verifiers all failed: visible, counted, in provenance
                why = "; ".join(h.get("error") or f"self-test {h.get('n_ok')}/{h.get('n_cases')}" for h in history)
                fell_back = {"from": "llm", "to": "template", "sources_tried": len(history), "reason": C.short(why, 600)}
                C.note_fallback("make-verifier: llm verifier → template")
                log(f"make-verifier {record.id}: no LLM verifier passed its self-test after {len(history)} "
                    f"source(s) ({C.short(why, 300)}); falling back to the template verifier")
            src = VT.render(spec)
            st = await asyncio.to_thread(self_test, src, reference, cases, o)
            history.append({"generator": "template", "passed": st["passed"], "n_ok": st["n_ok"], "n_cases": st["n_cases"]})
            chosen = ("template", src, st) if st["passed"] else None
            if chosen is None:
                last = ("template", src, st)
        ok = chosen is not None
        gen, source, st = chosen or last or (None, None, {"passed": False, "cases": []})
        record.verifier = Verifier(spec="code", source=source, self_test=dict(
            st, generator=gen, reference=ref_from, history=history, fallback=fell_back, spec_summary={
                "tables": sorted(spec["delta"]), "key_calls": [k["name"] for k in spec["key_calls"]],
                "reference_violations": spec["reference_violations"]}))
        record.verdicts = [v for v in record.verdicts if v.stage != STAGE]
        reasons = [] if ok else ["no verifier passed its self-test: " + ("; ".join(
            f"{r['case']} expected {r['expect']} got {r.get('got')}" for r in st.get("cases", [])
            if "skipped" not in r and not r.get("ok")) or st.get("error") or "no case ran")]
        record.verdicts.append(Verdict(stage=STAGE, kind="verifier", name="self_test", passed=ok,
                                       score=(st.get("n_ok", 0) / st["n_cases"]) if st.get("n_cases") else 0.0,
                                       scores={"generator": gen, "cases": st.get("cases", []), "sources_tried": len(history),
                                               "fallback": fell_back},
                                       reasons=reasons, attribution=None if ok else "task"))
        add_provenance(record, STAGE, strategy="eigendata" + ("+template-fallback" if fell_back else ""), model=model, recipe_hash=o.recipe_hash, usage=usage)
        return record

    return fn
