"""`gen-task --strategy astra` (ASTRA A3, §2.1.3): T = T_chain ∪ T_server, then T̃ = T ∪ A(T).

Reads : plan records from `gen-plan --strategy astra` (plan.tool_chain + plan.extra.query) →
        chain-conditioned tasks (the verified query of the chain; no new LLM call), and server
        records (`toolkit tools import`, no plan) → -n server-only tasks (LLM, from the server spec).
Writes: task records: task.instruction, task.extra = {augmentation: none|diversity|complexity|persona,
        origin: chain|server, language}; chain tasks carry ground_truth.must_have_functions = the
        chain (so `verify --strategy f1` can score them). Every task gets one augmented child per
        axis in `augment` (recipe key; default all three), with parent_id = the original task's id.
        An augmentation whose language (dominant Unicode script) differs from the original's is
        dropped and logged (lang(t̃) = lang(t)).
"""

from __future__ import annotations

import copy
import json
import unicodedata
from collections import Counter
from typing import Any

from toolkit.io import StageError, add_provenance, log
from toolkit.schema import GroundTruth, Record, Task
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.astra import options as O
from toolkit import prompts
from toolkit.flows.astra import tooldocs as TD
from toolkit.roles.structured import Malformed, RoleRejected, ask_prompt, new_usage, parse_json_object
from toolkit.schema import Action

AXES = {
    "diversity": "paraphrase it, add preferences or context, with the same intent",
    "complexity": "add requirements: multi-constraint preferences, implicit references or a follow-up, "
                  "with the same core goal",
    "persona": "write it as a different kind of user (novice or expert, concise or verbose)",
}


def script_of(text: str) -> str | None:
    """Dominant script of the letters in `text` (LATIN, CJK, CYRILLIC, ARABIC, ...), None if no letters.
    Hiragana/katakana/hangul count as their own scripts; CJK ideographs as CJK."""
    c: Counter = Counter()
    for ch in text:
        if not ch.isalpha():
            continue
        name = unicodedata.name(ch, "")
        word = name.split(" ")[0] if name else "OTHER"
        if word == "CJK":
            word = "CJK"
        c[word] += 1
    return c.most_common(1)[0][0] if c else None


def same_language(a: str, b: str) -> bool:
    return script_of(a) == script_of(b)


def parse_tasks(n: int):
    def parse(text: str | None) -> list[str]:
        obj = parse_json_object(text, required=("tasks",))
        ts = obj["tasks"]
        if not isinstance(ts, list) or not ts:
            raise Malformed("'tasks' must be a non-empty list")
        out = []
        for i, t in enumerate(ts[:n]):
            if isinstance(t, dict):
                t = t.get("instruction") or t.get("task")
            if not isinstance(t, str) or not t.strip():
                raise Malformed(f"tasks[{i}] must be a non-empty string")
            out.append(" ".join(t.split()))
        return out

    return parse


def parse_augmented(text: str | None) -> str:
    obj = parse_json_object(text, required=("task",))
    if not isinstance(obj["task"], str) or not obj["task"].strip():
        raise Malformed("'task' must be a non-empty string")
    return obj["task"].strip()


@strategy("gen-task", "astra", options=O.TasksOptions, help="ASTRA: chain-conditioned + server-only tasks, 3 augmentations (language kept)")
def build(opts: O.TasksOptions, ctx: StageContext):
    n, attempts, axes = opts.n, opts.attempts, opts.augment
    p_server, p_aug = prompts.load("astra/task_server"), prompts.load("astra/augment")

    async def fn(record: Record):
        usage = new_usage()
        client = ctx.llm()
        base_tasks: list[tuple[str, str]] = []  # (instruction, origin)
        chain = record.plan.tool_chain if record.plan else None
        if chain:
            q = (record.plan.extra or {}).get("query") or record.plan.synthesis_plan
            if not q:
                raise StageError("plan has a tool_chain but no query (plan.extra.query)", field="plan.extra.query")
            base_tasks.append((q, "chain"))
        else:
            try:
                server, drops = TD.server_from_record(record)
            except TD.ToolDocError as e:
                raise StageError(str(e), field="extra.astra") from None
            if server is None:
                raise StageError("no usable server: " + "; ".join(d.line() for d in drops), field="extra.astra")
            try:
                got = await ask_prompt(client, p_server.render(
                    tools=json.dumps(server.tools, ensure_ascii=False, indent=1), n=n,
                    scenery=server.description or f"The {server.name} service."),
                    parse_tasks(n), usage=usage, role="astra server-only tasks", attempts=attempts)
            except RoleRejected as e:
                raise StageError(str(e), field="task.instruction") from None
            base_tasks += [(t, "server") for t in got.value]
        out: list[Record] = []
        for k, (text, origin) in enumerate(base_tasks):
            tid = f"{record.id}-t{k}"
            gt = (GroundTruth(must_have_functions=list(chain),
                              actions=literal_actions(chain, (record.plan.extra or {}).get("arguments")))
                  if chain else None)
            lang = script_of(text)
            orig = Record(id=tid, parent_id=record.id, flow="astra",
                          tags=list(dict.fromkeys(list(record.tags) + ["astra", "task"])),
                          env=copy.deepcopy(record.env), plan=copy.deepcopy(record.plan),
                          task=Task(instruction=text, ground_truth=gt,
                                    extra={"augmentation": "none", "origin": origin, "script": lang}),
                          extra=copy.deepcopy(record.extra))
            out.append(orig)
            for j, axis in enumerate(axes):
                try:
                    got = await ask_prompt(client, p_aug.render(task=text, axis=axis, axis_help=AXES[axis]),
                                           parse_augmented, usage=usage, role=f"astra augmentation ({axis})",
                                           attempts=attempts, sample_index=(k * 7 + j) * attempts)
                except RoleRejected as e:
                    log(f"gen-task astra {tid}: {axis} augmentation dropped: {e}")
                    continue
                if not same_language(got.value, text):
                    log(f"gen-task astra {tid}: {axis} augmentation dropped: language changed "
                        f"({script_of(got.value)} vs {lang})")
                    continue
                child = orig.model_copy(deep=True)
                child.id = f"{tid}-{axis}"
                child.parent_id = tid
                child.task.instruction = got.value
                child.task.extra = dict(child.task.extra, augmentation=axis)
                out.append(child)
        share = {k: (v / len(out) if isinstance(v, (int, float)) else v) for k, v in usage.items()}
        for r in out:
            add_provenance(r, "gen-task", strategy="astra", model=ctx.model_name(),
                           recipe_hash=opts.recipe_hash, usage=share)
        return out

    return fn


def _has_ref(v: Any) -> bool:
    if isinstance(v, str):
        return v.startswith("$")
    if isinstance(v, dict):
        return any(_has_ref(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_ref(x) for x in v)
    return False


def literal_actions(chain: list[str], arguments: Any) -> list:
    """The chain as reference actions when every argument is a literal (no "$k.field" reference to an
    earlier call's output): then `rollout --agent replay` and `verify --strategy state_diff` can
    replay it on a real backend (sqlite, tau2, mcp) — verification by state. [] otherwise."""
    if not isinstance(arguments, list) or len(arguments) != len(chain):
        return []
    out = []
    for name, step in zip(chain, arguments):
        args = step.get("args") if isinstance(step, dict) else None
        if not isinstance(args, dict) or (step.get("tool") not in (None, name)) or _has_ref(args):
            return []
        out.append(Action(name=name, arguments=args))
    return out
