"""`gen-task --strategy astra-qa` (ASTRA B1, §2.2.1): Q–A instances with a decomposition DAG.

Reads : a knowledge record: `extra.domain`, `extra.corpus` (text), optional `extra.min_hops` /
        `extra.max_hops` (recipe keys `domain`, `corpus`, `min_hops` (1), `max_hops` (4) are the
        defaults); with `task.instruction` set the mode is question-conditional (decompose that q_0),
        otherwise unconditional (invent q_0 needing about H hops). -n = samples per record (1).
Writes: one task record per instance: task.instruction = main_question,
        task.ground_truth.final_answer, task.ground_truth.sub_questions = [{q, a, d}] (d: 0-based
        indices of the nodes it depends on, always earlier nodes), task.complexity =
        {scenario_type, hops}. Instances that break the contract (unknown scenario, a dependency on
        a missing or later step, a cycle, a scenario/shape mismatch, hops out of range) are dropped
        and logged; a reply with no usable instance is retried, then the input is rejected.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.io import StageError, add_provenance, log
from toolkit.schema import GroundTruth, Record, SubQuestion, Task
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.astra import options as O
from toolkit import prompts
from toolkit.roles.structured import Malformed, RoleRejected, ask_structured

SCENARIOS = ("Single-Hop", "Parallel Single-Hop", "Multi-Hop", "Parallel Multi-Hop")


def _json_any(text: str | None) -> Any:
    s = (text or "").strip()
    if s.startswith("```"):
        s = s.split("\n", 1)[1] if "\n" in s else ""
        s = s.rsplit("```", 1)[0]
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        a = s.find("[")
        b = s.rfind("]")
        if 0 <= a < b:
            try:
                return json.loads(s[a:b + 1])
            except json.JSONDecodeError as e:
                raise Malformed(f"not valid JSON: {e.msg} at char {e.pos}") from None
        raise Malformed("no JSON list in the reply (truncated?)") from None


def instance_from_item(item: Any, min_hops: int, max_hops: int) -> dict:
    """One Prompt-3 item → {instruction, final_answer, sub_questions, complexity}; ValueError why not."""
    if not isinstance(item, dict):
        raise ValueError("item is not an object")
    st = item.get("scenario_type")
    st_norm = " ".join(str(st).split()) if isinstance(st, str) else st
    if st_norm not in SCENARIOS:
        raise ValueError(f"scenario_type must be one of {', '.join(SCENARIOS)}, got {st!r}")
    q0, a0 = item.get("main_question"), item.get("final_answer")
    if not isinstance(q0, str) or not q0.strip():
        raise ValueError("main_question must be a non-empty string")
    if a0 is None or (isinstance(a0, str) and not a0.strip()):
        raise ValueError("final_answer is missing")
    trace = item.get("decomposition_trace")
    if not isinstance(trace, list) or not trace:
        raise ValueError("decomposition_trace must be a non-empty list")
    index: dict[Any, int] = {}
    nodes: list[dict] = []
    for i, n in enumerate(trace):
        if not isinstance(n, dict):
            raise ValueError(f"decomposition_trace[{i}] is not an object")
        uid = n.get("_uuid")
        if not isinstance(uid, (int, str)) or isinstance(uid, bool) or uid in index:
            raise ValueError(f"decomposition_trace[{i}]._uuid missing or duplicated: {uid!r}")
        q, a = n.get("sub_question"), n.get("sub_answer")
        if not isinstance(q, str) or not q.strip():
            raise ValueError(f"decomposition_trace[{i}].sub_question must be a non-empty string")
        if a is None or (isinstance(a, str) and not a.strip()):
            raise ValueError(f"decomposition_trace[{i}].sub_answer is missing")
        dep = n.get("dependency")
        deps = [] if dep is None else (dep if isinstance(dep, list) else [dep])
        d: list[int] = []
        for x in deps:
            if x not in index:
                known = x in [m.get("_uuid") for m in trace if isinstance(m, dict)]
                raise ValueError(f"decomposition_trace[{i}] depends on {x!r}, "
                                 + ("a later step (steps must be listed after their dependencies)" if known
                                    else "which is no step"))
            d.append(index[x])
        index[uid] = i
        nodes.append({"q": q.strip(), "a": a, "d": sorted(set(d))})
    # hops = number of layers (longest dependency path)
    level: list[int] = []
    for n in nodes:
        level.append(1 + max((level[j] for j in n["d"]), default=0))
    hops = max(level)
    has_dep = any(n["d"] for n in nodes)
    if st_norm == "Single-Hop" and len(nodes) != 1:
        raise ValueError(f"Single-Hop needs exactly one sub-question, got {len(nodes)}")
    if st_norm == "Parallel Single-Hop" and (len(nodes) < 2 or has_dep):
        raise ValueError("Parallel Single-Hop needs two or more independent sub-questions")
    if st_norm in ("Multi-Hop", "Parallel Multi-Hop") and not has_dep:
        raise ValueError(f"{st_norm} needs at least one dependency")
    if not min_hops <= hops <= max_hops:
        raise ValueError(f"{hops} hop(s) outside [{min_hops}, {max_hops}]")
    return {"instruction": q0.strip(), "final_answer": a0, "sub_questions": nodes,
            "complexity": {"scenario_type": st_norm, "hops": hops, "sub_questions": len(nodes)}}


def parse_instances(n: int, min_hops: int, max_hops: int):
    def parse(text: str | None) -> tuple[list[dict], list[str]]:
        obj = _json_any(text)
        if isinstance(obj, dict):
            obj = [obj]
        if not isinstance(obj, list) or not obj:
            raise Malformed("expected a JSON list of instances")
        good, bad = [], []
        for i, it in enumerate(obj[:n]):
            try:
                good.append(instance_from_item(it, min_hops, max_hops))
            except ValueError as e:
                bad.append(f"item {i}: {e}")
        if not good:
            raise Malformed("no usable instance: " + "; ".join(bad))
        return good, bad

    return parse


@strategy("gen-task", "astra-qa", options=O.QAOptions, help="ASTRA pipeline B: main question, answer and decomposition DAG")
def build(opts: O.QAOptions, ctx: StageContext):
    n, attempts = opts.n, opts.attempts
    prompt = prompts.load("astra/qa_synth")

    async def fn(record: Record):
        ex = record.extra or {}
        domain = ex.get("domain") or opts.domain
        corpus = ex.get("corpus") or opts.corpus
        min_h = int(ex.get("min_hops") or opts.min_hops)
        max_h = int(ex.get("max_hops") or opts.max_hops)
        if min_h < 1 or max_h < min_h:
            raise StageError(f"need 1 <= min_hops <= max_hops, got {min_h}, {max_h}", field="extra.min_hops")
        q0 = record.task.instruction if record.task and record.task.instruction else None
        block = f"\nMain question to decompose (question-conditional mode; keep it as main_question): {q0}\n" if q0 else ""
        try:
            got = await ask_structured(ctx.llm(), [{"role": "user", "content": prompt.render(
                domain=domain, corpus=corpus or "(none: synthesize specific, realistic data)", min_hops=min_h,
                max_hops=max_h, n=n, question_block=block)}], parse_instances(n, min_h, max_h),
                role="astra QA synthesizer", attempts=attempts)
        except RoleRejected as e:
            raise StageError(str(e), field="task.ground_truth.sub_questions") from None
        insts, bad = got.value
        for b in bad:
            log(f"gen-task astra-qa {record.id}: dropped {b}")
        out = []
        share = {k: (v / len(insts) if isinstance(v, (int, float)) else v) for k, v in got.usage.items()}
        for k, inst in enumerate(insts):
            rec = Record(id=f"{record.id}-qa{k}", parent_id=record.id, flow="astra",
                         tags=list(dict.fromkeys(list(record.tags) + ["astra", "qa"])),
                         task=Task(instruction=inst["instruction"], complexity=inst["complexity"],
                                   ground_truth=GroundTruth(final_answer=inst["final_answer"],
                                                            sub_questions=[SubQuestion(**s) for s in inst["sub_questions"]]),
                                   extra={"domain": domain, "mode": "question" if q0 else "unconditional"}))
            add_provenance(rec, "gen-task", strategy="astra-qa", model=ctx.model_name(),
                           recipe_hash=opts.recipe_hash, usage=share)
            out.append(rec)
        return out

    return fn
