"""The trajectory judge role: an LLM grades one trajectory with a rubric; prompt + strict parse.

Rubrics (prompt files in toolkit/prompts, each citing its paper section):
- `simia`  Simia appendix D reward prompt → {"reasoning", "evidence", "task_success": bool,
           "confidence": 0..1}; reward 1/0 = task_success.
- `sea`    AReaL-SEA "Synthetic Task and Trajectory Evaluation" → TASK QUALITY VERDICT
           ACCEPT/REJECT + TRAJECTORY VERDICT SUCCESS/FAILED + attribution task|trajectory;
           passes when ACCEPT and SUCCESS; reward 1/0.
- `eigendata` EigenData TrajectoryValidationAgent (App. 3.1): five dimensions rated
           Good|Acceptable|Poor, critical issues, PASS|FAIL; the decision rule is applied
           mechanically (any critical issue or any Poor dimension → FAIL: two Poor fail by the paper,
           exactly one Poor is the toolkit's reading of "PASS needs all Good/Acceptable"); the
           model's own PASS/FAIL is overridden (noted) when it contradicts the rule; attribution
           task | trajectory | user_simulator | infrastructure.
- `astra`  ASTRA §2.1.5 seven trajectory-level scores (QU, QP ∈ {0, .5, 1}; TCU, TCP, TCS, TC,
           FA ∈ [0, 1]); reward = their arithmetic mean; passes when reward ≥ threshold. TCS (the
           fraction of tool calls that succeeded) is computed from the trajectory's `steps[].ok`
           when the caller passes the steps (verify does), not asked of the LLM (prompt v2 asks six).

Parsing is strict: the reply must contain one JSON object (optionally in a ``` fence) that
`json.loads` accepts as is, with every required key of the right type and range. A malformed
reply is retried with a new `sample_index` (so a cached bad answer is not replayed), up to
`attempts` times; then the result is a failed judgment with reason "malformed judge output" and
no attribution.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit import prompts, registry
from toolkit.formats.tools import TOOLS_FIT_LADDER, fit_tools_text
from toolkit.io import note_fallback
from toolkit.roles.env_simulator import render_history
from toolkit.roles.reply import MalformedJudgeOutput, extract_json_object
from toolkit.roles.structured import RoleRejected, ask_structured
from toolkit.llm.context import estimate_tokens

RUBRICS = ("simia", "sea", "astra", "eigendata")  # the built-in ones; registry.names("rubrics") has all
ATTRIBUTIONS = ("task", "trajectory", "user_simulator", "infrastructure")
EIGENDATA_DIMS = ("conversation_quality", "function_correctness", "policy_compliance", "intent_alignment",
                  "data_consistency")
RATINGS = ("Good", "Acceptable", "Poor")
CRITICAL = ("function_error", "data_fabrication", "policy_violation", "goal_failure", "deception_miss")
ASTRA_DIMS = ("query_understanding", "query_planning", "tool_context_understanding",
              "tool_context_planning", "tool_call_status", "tool_conciseness", "final_answer_quality")
MALFORMED = "malformed judge output"
# AReaL-SEA prompts 3/4: "<eval_rules_improve>: identify 0-5 items ... to relax, or say that the
# evaluation rules are of high quality" — that answer is zero items, never an item to apply.
_NO_CHANGE = re.compile(r"(\brules?\b[^.;]*\b(is|are)\b[^.;]*\bhigh[- ]quality\b|^(none|n/?a|no (changes?|improvements?|"
                        r"items?)( (are )?(needed|required|proposed))?)\.?$)", re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)]|\(\d+\))\s*")


def improve_items(v: Any, limit: int | None = 5) -> list[str]:
    """The `<eval_rules_improve>` answer as a list of items (SEA prompts 3, 4 and 6): a list is
    kept item by item, a string is split into one item per line (bullets and numbering dropped);
    empty items and "the evaluation rules are of high quality" (zero items) are dropped. More than
    `limit` items raise MalformedJudgeOutput (the prompts ask for 0-5)."""
    if v is None:
        return []
    raw = v if isinstance(v, (list, tuple)) else str(v).splitlines()
    items = []
    for x in raw:
        x = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
        x = _BULLET.sub("", x).strip()
        if x and not _NO_CHANGE.search(x):
            items.append(x)
    if limit is not None and len(items) > limit:
        raise MalformedJudgeOutput(f"eval_rules_improve holds {len(items)} items; at most {limit}")
    return items


@dataclass
class Judgment:
    passed: bool
    score: float
    scores: dict = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    attribution: str | None = None
    malformed: bool = False
    attempts: int = 0
    usage: dict = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0,
                                                 "requests": 0, "cache_hits": 0})
    model: str | None = None
    prompt_id: str | None = None


# ----------------------------------------------------------------------------------------------
# strict parsing


def _need(obj: dict, key: str) -> Any:
    if key not in obj:
        raise MalformedJudgeOutput(f"missing key {key!r}")
    return obj[key]


def _num(obj: dict, key: str, lo: float = 0.0, hi: float = 1.0, allowed: tuple | None = None) -> float:
    v = _need(obj, key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MalformedJudgeOutput(f"{key!r} must be a number, got {type(v).__name__}")
    v = float(v)
    if allowed is not None and v not in allowed:
        raise MalformedJudgeOutput(f"{key!r} must be one of {', '.join(map(str, allowed))}, got {v}")
    if not lo <= v <= hi:
        raise MalformedJudgeOutput(f"{key!r} must be within [{lo}, {hi}], got {v}")
    return v


def _text(obj: dict, key: str, required: bool = False) -> str:
    v = _need(obj, key) if required else obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        v = json.dumps(v, ensure_ascii=False)
    return v


def parse_simia(obj: dict, threshold: float = 0.5) -> Judgment:
    if "task_success" not in obj and "reward" in obj:  # Fig 14 (APIGen-MT): {"reasoning", "reward": 0 or 1}
        r = obj["reward"]
        if isinstance(r, bool) or r not in (0, 1):
            raise MalformedJudgeOutput(f"'reward' must be 0 or 1, got {r!r}")
        obj = dict(obj, task_success=bool(r))
    ok = _need(obj, "task_success")
    if not isinstance(ok, bool):
        raise MalformedJudgeOutput(f"'task_success' must be true or false, got {ok!r}")
    conf = _num(obj, "confidence") if "confidence" in obj else None
    reasons = [r for r in (_text(obj, "reasoning", required=True), _text(obj, "evidence")) if r]
    scores = {"task_success": ok, "confidence": conf}
    return Judgment(passed=ok, score=1.0 if ok else 0.0, scores=scores, reasons=reasons)


def parse_sea(obj: dict, threshold: float = 0.5) -> Judgment:
    tq = str(_need(obj, "task_quality_verdict")).strip().upper()
    tv = str(_need(obj, "trajectory_verdict")).strip().upper()
    if tq not in ("ACCEPT", "REJECT"):
        raise MalformedJudgeOutput(f"'task_quality_verdict' must be ACCEPT or REJECT, got {tq!r}")
    if tv not in ("SUCCESS", "FAILED"):
        raise MalformedJudgeOutput(f"'trajectory_verdict' must be SUCCESS or FAILED, got {tv!r}")
    attr = obj.get("attribution")
    if attr is not None:
        if not isinstance(attr, str) or attr.strip().lower() not in ATTRIBUTIONS:
            raise MalformedJudgeOutput(f"'attribution' must be null or one of {', '.join(ATTRIBUTIONS)}, got {attr!r}")
        attr = attr.strip().lower()
    passed = tq == "ACCEPT" and tv == "SUCCESS"
    if passed:
        attr = None
    elif tq == "REJECT":
        attr = "task"  # a rejected task is the task's fault whatever the trajectory did
    elif attr is None:
        attr = "trajectory"
    reasons = [r for r in (_text(obj, "eval_report"), _text(obj, "thought")) if r]
    if not reasons:
        raise MalformedJudgeOutput("missing 'eval_report'")
    scores = {"task_quality_verdict": tq, "trajectory_verdict": tv,
              "eval_rules_improve": improve_items(obj.get("eval_rules_improve"))}
    return Judgment(passed=passed, score=1.0 if passed else 0.0, scores=scores, reasons=reasons,
                    attribution=attr)


def _critical_category(c: Any) -> str:
    k = str(c or "").strip().lower().replace("-", " ").replace("_", " ")
    k = k.removeprefix("severe ").removeprefix("critical ")
    k = "_".join(k.split())
    k = {"function_errors": "function_error", "policy_violations": "policy_violation",
         "deception": "deception_miss"}.get(k, k)
    if k not in CRITICAL:
        raise MalformedJudgeOutput(f"critical issue category must be one of {', '.join(CRITICAL)}, got {c!r}")
    return k


def parse_eigendata(obj: dict, threshold: float = 0.5) -> Judgment:
    vs = _need(obj, "validation_summary")
    if not isinstance(vs, dict):
        raise MalformedJudgeOutput("'validation_summary' must be an object")
    ratings: dict[str, str] = {}
    for d in EIGENDATA_DIMS:
        dim = vs.get(d)
        if not isinstance(dim, dict):
            raise MalformedJudgeOutput(f"validation_summary misses dimension {d!r}")
        r = str(dim.get("rating", "")).strip().capitalize()
        if r not in RATINGS:
            raise MalformedJudgeOutput(f"{d}.rating must be one of {', '.join(RATINGS)}, got {dim.get('rating')!r}")
        ratings[d] = r
    gp = (vs.get("intent_alignment") or {}).get("goal_progress")
    if gp is not None and str(gp).strip().capitalize() not in ("Complete", "Partial", "None"):
        raise MalformedJudgeOutput(f"intent_alignment.goal_progress must be Complete, Partial or None, got {gp!r}")
    crit = obj.get("critical_issues") or []
    if not isinstance(crit, list):
        raise MalformedJudgeOutput("'critical_issues' must be a list")
    cats = []
    for i, c in enumerate(crit):
        if not isinstance(c, dict):
            raise MalformedJudgeOutput(f"critical_issues[{i}] must be an object")
        cats.append(_critical_category(c.get("category")))
    said = str(_need(obj, "validation_result")).strip().upper()
    if said not in ("PASS", "FAIL"):
        raise MalformedJudgeOutput(f"'validation_result' must be PASS or FAIL, got {said!r}")
    attr = obj.get("attribution")
    if attr is not None:
        if not isinstance(attr, str) or attr.strip().lower() not in ATTRIBUTIONS:
            raise MalformedJudgeOutput(f"'attribution' must be null or one of {', '.join(ATTRIBUTIONS)}, got {attr!r}")
        attr = attr.strip().lower()
    n_poor = sum(1 for r in ratings.values() if r == "Poor")
    passed = not cats and n_poor == 0
    reasons: list[str] = []
    if obj.get("failure_reason"):
        reasons.append(_text(obj, "failure_reason"))
    reasons += [f"CRITICAL {cat}: {_text(c, 'description')}" for cat, c in zip(cats, crit)]
    reasons += [f"{d} rated Poor" for d, r in ratings.items() if r == "Poor"]
    if (said == "PASS") != passed:
        reasons.append(f"validation_result {said} overridden by the decision rule ({len(cats)} critical issue(s), "
                       f"{n_poor} Poor dimension(s))")
    notes = [x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
             for x in (obj.get("non_critical_observations") or [])]
    attr = None if passed else (attr or "trajectory")
    scores = {"ratings": ratings, "n_poor": n_poor, "critical": cats, "validation_result": said,
              "goal_progress": gp, "non_critical_observations": notes}
    fc = vs.get("function_correctness") or {}
    for k in ("total_calls", "valid_calls"):
        if isinstance(fc.get(k), int):
            scores[k] = fc[k]
    return Judgment(passed=passed, score=1.0 if passed else 0.0, scores=scores,
                    reasons=reasons or ["all five dimensions Good/Acceptable, no critical issue"], attribution=attr)


def parse_astra(obj: dict, threshold: float = 0.5) -> Judgment:
    """The LLM's dimensions; `tool_call_status` may be absent (computed from the steps by
    `finalize_astra`); the mean is over the dimensions present until then."""
    scores: dict[str, Any] = {}
    for k in ASTRA_DIMS:
        if k == "tool_call_status" and k not in obj:
            continue
        allowed = (0.0, 0.5, 1.0) if k in ("query_understanding", "query_planning") else None
        scores[k] = _num(obj, k, allowed=allowed)
    dims = [k for k in ASTRA_DIMS if k in scores]
    mean = sum(scores[k] for k in dims) / len(dims)
    scores["mean"] = mean
    reasons = [r for r in (_text(obj, "reasoning"),) if r]
    passed = mean >= threshold
    return Judgment(passed=passed, score=mean, scores=scores, reasons=reasons)


def tool_call_status(steps: list[dict]) -> float:
    """ASTRA TCS: the fraction of the agent's tool calls that succeeded (1 with no calls)."""
    calls = [s for s in steps if (s.get("side") or "agent") == "agent"]
    return sum(1 for s in calls if s.get("ok")) / len(calls) if calls else 1.0


def steps_from_messages(messages: list[dict]) -> list[dict]:
    """For a trajectory recorded without steps: one agent step per tool message, failed when its
    content is a JSON object with an "error" key (how every backend reports a failed call)."""
    out = []
    for m in messages:
        if m.get("role") != "tool":
            continue
        ok = True
        try:
            c = json.loads(m.get("content") or "")
            ok = not (isinstance(c, dict) and "error" in c)
        except (TypeError, ValueError):
            pass
        out.append({"side": "agent", "ok": ok, "tool_call_id": m.get("tool_call_id")})
    return out


def finalize_astra(j: Judgment, steps: list[dict], threshold: float = 0.5) -> Judgment:
    """TCS from the executed steps (replacing any LLM estimate, kept as tool_call_status_llm);
    reward = the mean of the seven."""
    if "tool_call_status" in j.scores:
        j.scores["tool_call_status_llm"] = j.scores["tool_call_status"]
    j.scores["tool_call_status"] = tool_call_status(steps)
    j.scores["tool_call_status_source"] = "steps"
    j.score = sum(float(j.scores[k]) for k in ASTRA_DIMS) / len(ASTRA_DIMS)
    j.scores["mean"] = j.score
    j.passed = j.score >= threshold
    return j


def _rubric(name: str) -> "Rubric":
    e = registry.lookup("rubrics", name)
    if e is None:
        raise ValueError(f"unknown judge rubric {name!r}; known: {', '.join(registry.names('rubrics'))}")
    return e.obj


def parse(rubric: str, text: str | None, threshold: float = 0.5) -> Judgment:
    obj = extract_json_object(text)
    return _rubric(rubric).parse(obj, threshold)


# ----------------------------------------------------------------------------------------------
# rubrics: a prompt builder + a strict parser each, registered (kind "rubrics")


@dataclass
class Rubric:
    """`prompt(policy=, task=, messages=, tools=, evaluation_rules=) -> (prompt id, text)`;
    `parse(obj, threshold) -> Judgment` (raise MalformedJudgeOutput on a bad reply)."""

    name: str
    prompt: Callable[..., tuple[str, str]]
    parse: Callable[[dict, float], Judgment]
    # (judgment, the trajectory's steps as dicts, threshold) -> judgment: scores computed from what
    # was executed rather than asked of the LLM (ASTRA's TCS); run when the caller gives the steps
    finalize: Callable[[Judgment, list[dict], float], Judgment] | None = None


def rubric(name: str, *, parse: Callable[[dict, float], Judgment], help: str = "",
           flow: str | None = None,
           finalize: Callable[[Judgment, list[dict], float], Judgment] | None = None) -> Callable:
    """Decorator above a rubric's prompt builder: registers `Rubric(name, prompt, parse, finalize)`."""

    def deco(prompt_fn: Callable[..., tuple[str, str]]) -> Callable[..., tuple[str, str]]:
        registry.register("rubrics", name, Rubric(name, prompt_fn, parse, finalize), help=help, flow=flow,
                          module=prompt_fn.__module__)
        return prompt_fn

    return deco


@rubric("simia", parse=parse_simia, flow="simia", help="Simia appendix D reward: task_success + confidence")
def prompt_simia(*, policy: str, task: str, messages: list[dict], tools: list[dict],
                 evaluation_rules: str = "", fit: int = 0) -> tuple[str, str]:
    p = prompts.load("judge_simia")
    return p.id, p.render(policy=_policy(policy, fit), task=task or "(see the conversation)",
                          history=render_history(messages, HISTORY_FIT[fit]) or "(empty)")


@rubric("sea", parse=parse_sea, help="AReaL-SEA task/trajectory verdicts with attribution")
def prompt_sea(*, policy: str, task: str, messages: list[dict], tools: list[dict],
               evaluation_rules: str = "", fit: int = 0) -> tuple[str, str]:
    p = prompts.load("judge_sea")
    return p.id, p.render(task_description=_policy(policy, fit), env_tools=fit_tools_text(tools, fit, empty="(not given)"),
                          synthetic_task=task or "(see the conversation)",
                          rollout=render_history(messages, HISTORY_FIT[fit]) or "(empty)",
                          eval_rules=evaluation_rules or "(none given: judge task quality and trajectory success "
                                                         "against the policy and the task)")


@rubric("astra", parse=parse_astra, finalize=finalize_astra, flow="astra",
        help="ASTRA 7 trajectory scores (TCS computed from the steps), reward = their mean")
def prompt_astra(*, policy: str, task: str, messages: list[dict], tools: list[dict],
                 evaluation_rules: str = "", fit: int = 0) -> tuple[str, str]:
    p = prompts.load("judge_astra")
    body = [m for m in messages if m.get("role") != "system"]
    traj = json.dumps({"messages": body}, ensure_ascii=False)
    half = HISTORY_FIT[fit] // 2
    if len(traj) > 2 * half:
        traj = traj[:half] + " ...(truncated)... " + traj[-half:]
    return p.id, p.render(task=task or "(the first user message)", tools=fit_tools_text(tools, fit, empty="(not given)"),
                          trajectory=traj)


@rubric("eigendata", parse=parse_eigendata, flow="eigendata",
        help="EigenData five dimensions + critical issues, rule-decided PASS/FAIL")
def prompt_eigendata(*, policy: str, task: str, messages: list[dict], tools: list[dict],
                     evaluation_rules: str = "", fit: int = 0, prompt_version: int | None = None,
                     prompt_dirs: list | None = None) -> tuple[str, str]:
    # the prompt set's pinned TrajectoryValidation version, else its un-evolved newest
    p = prompts.load_for_set("eigendata/trajectory_validation", prompt_version, dirs=prompt_dirs)
    return p.id, p.render(policy=_policy(policy, fit), tools=fit_tools_text(tools, fit, empty="(not given)"),
                          task=task or "(see the conversation)", rubrics=evaluation_rules or "(none given)",
                          history=render_history(messages, HISTORY_FIT[fit]) or "(empty)")


# Fit levels (a prompt that does not fit the judge model's context walks down them): the tools'
# rendering (toolkit.formats.tools.TOOLS_FIT_LADDER), the history's and the policy's character limits.
HISTORY_FIT = (24000, 24000, 16000, 8000, 4000, 2000)
POLICY_FIT = (None, None, None, 6000, 3000, 1500)
FIT_LEVELS = len(TOOLS_FIT_LADDER)


def _policy(policy: str, fit: int) -> str:
    lim = POLICY_FIT[fit]
    if not policy:
        return "(none)"
    if lim is not None and len(policy) > lim:
        return policy[:lim] + "\n...(policy truncated to fit the model's context)"
    return policy


def _takes_fit(fn: Callable) -> bool:
    try:
        return "fit" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def build_prompt(rubric: str, *, policy: str, task: str, messages: list[dict], tools: list[dict],
                 evaluation_rules: str = "", fit: int = 0, prompt_version: int | None = None,
                 prompt_dirs: list | None = None) -> tuple[str, str]:
    """(prompt id, rendered prompt) for one trajectory; `fit` > 0: a shorter rendering (a rubric
    whose prompt builder takes no `fit` keyword always renders in full). `prompt_version` /
    `prompt_dirs` (a prompt set's pin, EigenData) reach only rubrics whose prompt builder takes them."""
    fn = _rubric(rubric).prompt
    extra = {"fit": max(0, min(int(fit), FIT_LEVELS - 1))} if fit and _takes_fit(fn) else {}
    if prompt_version is not None or prompt_dirs:
        extra.update(prompt_version=prompt_version, prompt_dirs=prompt_dirs)
    return fn(policy=policy, task=task, messages=messages, tools=tools, evaluation_rules=evaluation_rules, **extra)


async def fit_judge_prompt(client: Any, rubric: str, build: Callable[[int], tuple[str, str]]) -> tuple[str, str, int]:
    """(prompt id, prompt, level): the first fit level whose prompt fits the client's prompt budget
    (the context minus max_tokens, counted by the server's tokenizer when the estimate is over it);
    level 0 when the context is unknown; the last level when none fits (the client then lowers
    max_tokens or rejects the request with the counts)."""
    budget_fn = getattr(client, "prompt_budget", None)
    budget = await budget_fn() if budget_fn is not None else None
    pid, prompt = build(0)
    if budget is None or not _takes_fit(_rubric(rubric).prompt):
        return pid, prompt, 0
    for level in range(FIT_LEVELS):
        if level:
            pid, prompt = build(level)
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        n = estimate_tokens(msgs)
        if n > budget and getattr(client, "count_tokens", None) is not None:
            n, _by = await client.count_tokens(msgs)
        if n <= budget:
            return pid, prompt, level
    return pid, prompt, FIT_LEVELS - 1


SYSTEM = "You are a strict evaluator of tool-using agent trajectories. Reply with one JSON object only."


async def judge_trajectory(client: Any, rubric: str, *, policy: str, task: str, messages: list[dict],
                           tools: list[dict], evaluation_rules: str = "", attempts: int = 3,
                           threshold: float = 0.5, steps: list[dict] | None = None,
                           prompt_version: int | None = None, prompt_dirs: list | None = None) -> Judgment:
    """Grade one trajectory. Never raises for a bad reply (LLM transport errors do propagate).
    steps: the trajectory's executed steps (dicts with side/ok); a rubric with `finalize` computes
    its execution-based scores from them (ASTRA TCS), or from the tool messages when none are given.
    prompt_version / prompt_dirs: a prompt set's pin (EigenData)."""
    pid, prompt, level = await fit_judge_prompt(
        client, rubric, lambda fit: build_prompt(rubric, policy=policy, task=task, messages=messages, tools=tools,
                                                 evaluation_rules=evaluation_rules, fit=fit,
                                                 prompt_version=prompt_version, prompt_dirs=prompt_dirs))
    if level:
        note_fallback(f"judge ({rubric}): prompt shortened to fit the context")
    fit_note = ({"prompt_fit": {"level": level, "tools": TOOLS_FIT_LADDER[level], "history_chars": HISTORY_FIT[level]}}
                if level else {})
    try:
        got = await ask_structured(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
                                   lambda text: parse(rubric, text, threshold), role=f"judge ({rubric})",
                                   attempts=attempts)
    except RoleRejected as e:
        return Judgment(passed=False, score=0.0, scores={"rubric": rubric, "malformed": True, **fit_note},
                        reasons=[MALFORMED] + e.reasons, attribution=None, malformed=True,
                        attempts=max(1, attempts), usage=e.usage, model=e.model, prompt_id=pid)
    j = got.value
    fin = _rubric(rubric).finalize
    if fin is not None:
        j = fin(j, steps if steps else steps_from_messages(messages), threshold)
        j.scores["steps_source"] = "steps" if steps else "tool_messages"
    j.attempts, j.usage, j.model, j.prompt_id = got.attempts, got.usage, got.model, pid
    j.scores["rubric"] = rubric
    j.scores.update(fit_note)
    return j
