"""`validate-task --strategy astra`: ASTRA's task filters, run BEFORE any code is generated.

Pipeline B (records with task.ground_truth.sub_questions, §2.2.2):
  1. tool necessity (LLM labels each sub-question tool / no-tool; the RULE is deterministic):
     a sub-question that needs no tool is allowed only at a leaf (a node no other node depends
     on); an instance with no tool sub-question at all fails too. Verdict `astra_tool_necessity`;
     the labels go to task.extra.astra_needs_tool for make-verifier. When it fails, the QS call is
     skipped (the paper's cost remedy: refine the topology before paying for code).
  2. QS = (DC + SA + SR + TC) / 4 (Eq. 21): the LLM gives dc_i, sa_i, sr_i ∈ {0,1} per node and
     tc ∈ {0,1}; the means and QS are computed here. Verdict `astra_qs`, passed iff QS ≥ min_qs
     (recipe/CLI key `min_qs`, default 1.0).
Pipeline A (tasks without sub-questions, §2.1.3 Eq. 1): S_qq, S_sr, S_tn on a 1–5 scale; passed
  iff S_qq ≥ theta_qq ∧ S_sr ≥ theta_sr ∧ S_tn ≥ theta_tn (defaults 3, 3, 3; scale and thresholds
  are the toolkit's, the paper leaves them open). Verdict `astra_task_scores`.
A role that never answers in format gives a failed verdict with the parse reasons (never a pass).
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.io import add_provenance
from toolkit.schema import Record, Verdict
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.astra import options as O
from toolkit import prompts
from toolkit.envs import load_env
from toolkit.io import StageError
from toolkit.roles.structured import Malformed, RoleRejected, ask_prompt, new_usage, parse_json_object


def leaves(sub_questions: list) -> set[int]:
    deps = {j for s in sub_questions for j in (s.d if hasattr(s, "d") else s.get("d", []))}
    return {i for i in range(len(sub_questions)) if i not in deps}


def necessity_violations(sub_questions: list, needs_tool: list[bool]) -> list[str]:
    """The deterministic rule: non-tool sub-questions only at leaves; at least one tool node."""
    lv = leaves(sub_questions)
    out = []
    for i, need in enumerate(needs_tool):
        if not need and i not in lv:
            q = sub_questions[i].q if hasattr(sub_questions[i], "q") else sub_questions[i]["q"]
            out.append(f"sub-question {i} needs no tool but is not a leaf (others depend on it): {q}")
    if needs_tool and not any(needs_tool):
        out.append("no sub-question needs a tool")
    return out


def qs_from_scores(nodes: list[dict], tc: int) -> dict:
    m = len(nodes)
    dc = sum(n["dc"] for n in nodes) / m
    sa = sum(n["sa"] for n in nodes) / m
    sr = sum(n["sr"] for n in nodes) / m
    return {"dc": dc, "sa": sa, "sr": sr, "tc": float(tc), "qs": (dc + sa + sr + tc) / 4}


def _nodes_text(sqs: list) -> str:
    return "\n".join(json.dumps({"index": i, "q": s.q, "a": s.a, "d": s.d}, ensure_ascii=False)
                     for i, s in enumerate(sqs))


def _binary(v: Any, what: str) -> int:
    if isinstance(v, bool) or v not in (0, 1):
        raise Malformed(f"{what} must be 0 or 1, got {v!r}")
    return int(v)


def parse_necessity(m: int):
    def parse(text: str | None) -> tuple[list[bool], list[str]]:
        obj = parse_json_object(text, required=("sub_questions",))
        items = obj["sub_questions"]
        if not isinstance(items, list) or len(items) != m:
            raise Malformed(f"'sub_questions' must list all {m} sub-questions")
        need: list[bool] = []
        cats: list[str] = []
        for i, it in enumerate(items):
            if not isinstance(it, dict) or it.get("index") != i:
                raise Malformed(f"sub_questions[{i}] must have index {i}")
            if not isinstance(it.get("needs_tool"), bool):
                raise Malformed(f"sub_questions[{i}].needs_tool must be true or false")
            need.append(it["needs_tool"])
            cats.append(str(it.get("category") or ""))
        return need, cats

    return parse


def parse_qs(m: int):
    def parse(text: str | None) -> tuple[list[dict], int, str]:
        obj = parse_json_object(text, required=("nodes", "tc"))
        nodes = obj["nodes"]
        if not isinstance(nodes, list) or len(nodes) != m:
            raise Malformed(f"'nodes' must score all {m} sub-questions")
        out = []
        for i, n in enumerate(nodes):
            if not isinstance(n, dict) or n.get("index") != i:
                raise Malformed(f"nodes[{i}] must have index {i}")
            out.append({k: _binary(n.get(k), f"nodes[{i}].{k}") for k in ("dc", "sa", "sr")})
        return out, _binary(obj["tc"], "tc"), str(obj.get("reasoning") or "")

    return parse


def parse_task_scores(text: str | None) -> dict:
    obj = parse_json_object(text, required=("question_quality", "scenario_realism", "tool_necessity"))
    out = {}
    for key, short in (("question_quality", "qq"), ("scenario_realism", "sr"), ("tool_necessity", "tn")):
        v = obj[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= 5:
            raise Malformed(f"{key} must be an integer 1..5, got {v!r}")
        out[short] = int(v)
    out["reasoning"] = str(obj.get("reasoning") or "")
    return out


def record_tools(record: Record) -> list[dict]:
    astra = (record.extra or {}).get("astra") or {}
    if astra.get("tools"):
        return astra["tools"]
    if record.env is None:
        return []
    env_config = record.env.config or {}  # the record's environment (data, not options)
    if env_config.get("tools"):
        return env_config["tools"]

    try:
        env = load_env(record.env)
    except Exception as e:  # noqa: BLE001 - any backend's failure: the record is rejected with it
        # S_tn (tool necessity) judged against no tools would be a made-up score: reject instead
        raise StageError(f"the environment's tools cannot be loaded for the tool-necessity score "
                         f"({type(e).__name__}: {e})", field="env") from None
    try:
        return env.tools("agent")
    finally:
        close = getattr(env, "close", None)
        if close:
            close()


@strategy("validate-task", "astra", options=O.ValidateOptions, help="ASTRA: tool-necessity rule + QS (QA tasks) or S_qq/S_sr/S_tn (tasks)")
def build(o: O.ValidateOptions, ctx: StageContext):
    attempts = o.attempts
    min_qs = o.min_qs
    th = {"qq": o.theta_qq, "sr": o.theta_sr, "tn": o.theta_tn}
    p_need, p_qs, p_scores = (prompts.load("astra/tool_necessity"), prompts.load("astra/qa_quality"),
                              prompts.load("astra/task_scores"))

    async def ask_or_fail(record: Record, usage: dict, prompt: str, parse, role: str, verdict: str,
                          what: str | None = None):
        """The parsed reply, or None after a failed verdict `verdict` ("malformed <what> output")."""
        try:
            return (await ask_prompt(ctx.llm(), prompt, parse, usage=usage, role=role, attempts=attempts)).value
        except RoleRejected as e:
            what = what or role.removeprefix("astra ")
            record.verdicts.append(Verdict(stage="validate-task", kind="llm", name=verdict, passed=False,
                                           reasons=[f"malformed {what} output"] + e.reasons))
            return None

    async def qa(record: Record, usage: dict) -> None:
        gt = record.task.ground_truth
        sqs = gt.sub_questions
        q0 = record.task.instruction or ""
        got = await ask_or_fail(record, usage, p_need.render(question=q0, nodes=_nodes_text(sqs)),
                                parse_necessity(len(sqs)), "astra tool-necessity", "astra_tool_necessity")
        if got is None:
            return
        need, cats = got
        bad = necessity_violations(sqs, need)
        record.task.extra["astra_needs_tool"] = need
        record.verdicts.append(Verdict(stage="validate-task", kind="llm", name="astra_tool_necessity",
                                       passed=not bad, reasons=bad,
                                       scores={"needs_tool": need, "categories": cats,
                                               "leaves": sorted(leaves(sqs))}))
        if bad:
            return  # filtered before any QS / code-generation cost
        got = await ask_or_fail(record, usage, p_qs.render(
            question=q0, answer=json.dumps(gt.final_answer, ensure_ascii=False), nodes=_nodes_text(sqs)),
            parse_qs(len(sqs)), "astra QS", "astra_qs")
        if got is None:
            return
        nodes, tc, why = got
        sc = qs_from_scores(nodes, tc)
        reasons = [] if sc["qs"] >= min_qs else [f"QS {sc['qs']:.3f} < min_qs {min_qs}"]
        reasons += [f"sub-question {i}: " + ", ".join(k for k in ("dc", "sa", "sr") if not n[k]) + " = 0"
                    for i, n in enumerate(nodes) if not all(n.values())]
        if not tc:
            reasons.append("tc = 0: the sub-questions do not suffice for the main question")
        record.verdicts.append(Verdict(stage="validate-task", kind="llm", name="astra_qs",
                                       passed=sc["qs"] >= min_qs, score=sc["qs"],
                                       scores=dict(sc, per_node=nodes, min_qs=min_qs, reasoning=why),
                                       reasons=reasons))

    async def task_scores(record: Record, usage: dict) -> None:
        text = record.task.instruction if record.task else None
        if not text:
            raise StageError("validate-task astra needs task.instruction", field="task.instruction")
        s = await ask_or_fail(record, usage, p_scores.render(
            tools=json.dumps(record_tools(record), ensure_ascii=False)[:20000], task=text),
            parse_task_scores, "astra task scores", "astra_task_scores", "task-score")
        if s is None:
            return
        low = [f"S_{k} {s[k]} < theta_{k} {th[k]:g}" for k in ("qq", "sr", "tn") if s[k] < th[k]]
        record.verdicts.append(Verdict(stage="validate-task", kind="llm", name="astra_task_scores",
                                       passed=not low, score=min(s[k] / 5 for k in ("qq", "sr", "tn")),
                                       scores={"qq": s["qq"], "sr": s["sr"], "tn": s["tn"], "thresholds": th,
                                               "reasoning": s["reasoning"]}, reasons=low))

    async def fn(record: Record) -> Record:
        usage = new_usage()
        if record.task and record.task.ground_truth and record.task.ground_truth.sub_questions:
            await qa(record, usage)
        else:
            await task_scores(record, usage)
        add_provenance(record, "validate-task", strategy="astra", model=ctx.model_name(),
                       recipe_hash=o.recipe_hash, usage=usage)
        return record

    return fn
