"""`make-verifier --strategy astra` (ASTRA B3 + B4, §2.2.3–2.2.4): QA instance → executable
`python` environment whose tools answer the sub-questions, with the F1 reward as its verifier.

Per tool node (q_i, a_i, d_i) — non-tool leaves (task.extra.astra_needs_tool from validate-task)
are skipped:
  1–2. tool document (LLM; OpenAI function schema, complexity-scaled: extra optional params,
       richer enums) — validated like imported tool docs;
  3.   invocation statement (LLM) — must name the tool and validate against its parameters;
  4.   implementation (LLM, Example Prompt 4: {"analysis", "function"});
  5.   checks: static (compiles, defines the tool's function with the document's parameters,
       imports only standard-library modules and none of the process/network ones), then the
       invocation runs in the sandbox (`toolkit.sandbox`, wall/CPU/memory limits); success iff the
       result contains a_i (`toolkit.scoring.rewards.contains_answer`, the same test the F1 reward
       uses). Otherwise back to step 3, at most `impl_attempts` (3) times; a node that never
       succeeds fails the record.
Merging (B4): the LLM groups homogeneous sub-questions; per group a seeded random member is the
  base, every other member is inserted by the LLM (extended data + its call statement), and after
  EACH insertion every invocation of the group is re-executed in the sandbox and must still return
  its answer; an insertion that breaks one is retried (`merge_attempts`, 2) and otherwise left as
  its own tool (reported).
Directory form (`--out-dir DIR` / recipe key `out_dir`): each generated environment is written to
  DIR/<env id>/ in the python backend's layout (tools.json, tools.py, policy.md, state.json,
  config.json with the sandbox limits) and env = {"backend": "python", "id", "path": that directory}
  with no inline config (the directory is the single copy; a relative DIR stays relative, resolved
  by `rollout` against the --input file's directory, then the current directory).

Writes: env = {"backend": "python", "config": {"tools", "source", "limits"}}; task.ground_truth:
  actions = the invocations (replayable by `rollout --agent replay`), sub_questions = the tool
  nodes with their tool name (non-tool leaves move to ground_truth.extra.non_tool_sub_questions),
  communicate_info = [final answer]; verifier.spec = "f1"; a make-verifier verdict `astra_env`
  (passed, or failed with every attempt's reason — the record is kept for `--filter failed`).
Recipe keys (make-verifier section): impl_attempts, merge_attempts, merge (true), sandbox_wall_seconds (5),
  sandbox_cpu_seconds (5), sandbox_memory_mb (512), seed, out_dir.
"""

from __future__ import annotations

import ast
import json
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from toolkit.envs import backend_capabilities
from toolkit.io import StageError, add_provenance
from toolkit.schema import Action, EnvRef, Record, SubQuestion, Verdict, Verifier
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.astra import options as O
from toolkit import prompts
from toolkit.envs.python import PythonEnvironment, validate_arguments
from toolkit.flows.astra.tooldocs import NAME_RE, Unmappable, check_parameters, vague
from toolkit.flows.astra.validate import necessity_violations
from toolkit.roles.structured import Malformed, RoleRejected, ask_prompt, new_usage, parse_json_object
from toolkit.sandbox import SandboxLimits, operator_limits
from toolkit.scoring.rewards import contains_answer

# standard-library modules a generated tool may not import (processes, network, files, native code)
DENIED_MODULES = frozenset({
    "os", "sys", "subprocess", "socket", "ssl", "http", "urllib", "ftplib", "smtplib", "telnetlib",
    "asyncio", "multiprocessing", "threading", "concurrent", "ctypes", "shutil", "signal", "pty",
    "importlib", "pickle", "marshal", "builtins", "resource", "select", "selectors", "mmap", "tempfile",
    "pathlib", "io", "glob", "webbrowser", "xmlrpc", "socketserver", "code", "codeop", "gc", "inspect",
})


def stdlib_modules() -> frozenset:
    return frozenset(getattr(sys, "stdlib_module_names", ())) or frozenset(sys.builtin_module_names)


def check_source(src: str, name: str, params: dict) -> list[str]:
    """Static checks of a generated implementation (before anything runs)."""
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        return [f"does not compile: {e.msg} (line {e.lineno})"]
    probs: list[str] = []
    std = stdlib_modules()
    for node in ast.walk(tree):
        mods: list[str] = []
        if isinstance(node, ast.Import):
            mods = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                probs.append("relative import")
            mods = [(node.module or "").split(".")[0]]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "__import__", "eval", "exec", "open", "compile"):
            probs.append(f"calls {node.func.id}()")
        for m in mods:
            if m not in std:
                probs.append(f"imports {m!r}, which is not a Python 3 built-in (standard-library) module")
            elif m in DENIED_MODULES:
                probs.append(f"imports {m!r} (process / file / network access is not allowed in a tool)")
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if name not in fns:
        probs.append(f"defines no top-level function {name!r}")
        return probs
    f = fns[name]
    names = [a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs]
    props = list((params.get("properties") or {}))
    missing = [p for p in props if p not in names and f.args.kwarg is None]
    if missing:
        probs.append(f"{name}() lacks the document's parameter(s) {missing}")
    n_def = len(f.args.defaults)
    positional = f.args.posonlyargs + f.args.args
    no_default = [a.arg for a in positional[:len(positional) - n_def]]
    no_default += [a.arg for a, d in zip(f.args.kwonlyargs, f.args.kw_defaults) if d is None]
    required = set(params.get("required") or [])
    extra_req = [a for a in no_default if a not in required]
    if extra_req:
        probs.append(f"{name}() requires {extra_req}, which the document does not require")
    return probs


def wrapper_source(outer: str, inner: str, src: str) -> str:
    """A python-backend tool `outer(state, **kw)` that runs the generated `inner(**kw)` in its own
    namespace (so every generated function keeps its verbatim name and signature)."""
    return (f"\n__tk_src_{outer} = {src!r}\n\n"
            f"def {outer}(__tk_state, **kw):\n"
            f"    __tk_ns = {{'__name__': 'tool_{outer}'}}\n"
            f"    exec(__tk_src_{outer}, __tk_ns)\n"
            f"    return __tk_ns[{inner!r}](**kw)\n")


@dataclass
class Tool:
    name: str                 # the env's tool name
    inner: str                # the generated function's own name
    spec: dict                # OpenAI function (name = self.name)
    src: str
    members: list[int] = field(default_factory=list)   # node indices answered by this tool
    calls: dict[int, dict] = field(default_factory=dict)  # node → arguments

    def schema(self) -> dict:
        return {"type": "function", "function": dict(self.spec, name=self.name)}


def run_calls(tools: list[Tool], checks: list[tuple[str, dict, Any]], limits: dict) -> list[str]:
    """Execute each (tool, arguments, expected answer) in the sandbox; [] when all contain their answer."""
    source = "".join(wrapper_source(t.name, t.inner, t.src) for t in tools)
    # the operator's flags (sandbox_wall_seconds ...): a SandboxLimits is not clamped like data
    lim = SandboxLimits(**{**vars(operator_limits()), **limits})
    env = PythonEnvironment(tools=[t.schema() for t in tools], source=source, limits=lim)
    probs = []
    for name, args, ans in checks:
        res = env.call(name, args)
        if not res.ok:
            err = res.error or {}
            probs.append(f"{name}({json.dumps(args, ensure_ascii=False)}): {err.get('code')}: "
                         f"{(err.get('message') or '')[:300]}")
        elif not contains_answer(res.to_content(), ans):
            probs.append(f"{name}({json.dumps(args, ensure_ascii=False)}) returned "
                         f"{res.to_content()[:300]!r}, which does not contain the answer {ans!r}")
    return probs


# ----------------------------------------------------------------------------------------------
# parsers


def parse_doc(text: str | None) -> dict:
    obj = parse_json_object(text, required=("name", "description", "parameters"))
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name) or not name.isidentifier():
        raise Malformed(f"tool name {name!r} must be a Python identifier")
    why = vague(obj.get("description"), name)
    if why:
        raise Malformed(f"description: {why}")
    try:
        params = check_parameters(obj.get("parameters"))
    except Unmappable as e:
        raise Malformed(f"parameters: {e}") from None
    bad = [k for k in params.get("properties", {}) if not str(k).isidentifier()]
    if bad:
        raise Malformed(f"parameter names must be Python identifiers: {bad}")
    return {"name": name, "description": obj["description"], "parameters": params}


def parse_call(spec: dict):
    def parse(text: str | None) -> dict:
        obj = parse_json_object(text, required=("name", "arguments"))
        if obj["name"] != spec["name"]:
            raise Malformed(f"the call names {obj['name']!r}, the tool is {spec['name']!r}")
        if not isinstance(obj["arguments"], dict):
            raise Malformed("arguments must be an object")
        prob = validate_arguments(spec["parameters"], obj["arguments"])
        if prob:
            raise Malformed(f"call does not fit the tool document: {prob}")
        return obj["arguments"]

    return parse


def parse_function(text: str | None) -> str:
    obj = parse_json_object(text, required=("function",))
    src = obj["function"]
    if not isinstance(src, str) or not src.strip():
        raise Malformed("'function' must be the code as a string")
    return src


def parse_groups(tool_nodes: list[int]):
    def parse(text: str | None) -> list[list[int]]:
        obj = parse_json_object(text, required=("groups",))
        gs = obj["groups"]
        if not isinstance(gs, list):
            raise Malformed("'groups' must be a list of index lists")
        seen: set[int] = set()
        out = []
        for g in gs:
            if not isinstance(g, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in g):
                raise Malformed(f"group {g!r} is not a list of indices")
            if len(g) < 2:
                continue
            bad = [i for k, i in enumerate(g) if i not in tool_nodes or i in seen or i in g[:k]]
            if bad:
                raise Malformed(f"group {g}: indices {bad} are unknown, non-tool or repeated")
            seen |= set(g)
            out.append(list(g))
        return out

    return parse


def parse_merge(spec: dict):
    call_parse = parse_call(spec)

    def parse(text: str | None) -> tuple[str, dict]:
        obj = parse_json_object(text, required=("function", "call"))
        if not isinstance(obj["function"], str) or not obj["function"].strip():
            raise Malformed("'function' must be the code as a string")
        if not isinstance(obj["call"], dict):
            raise Malformed("'call' must be an object {name, arguments}")
        return obj["function"], call_parse(json.dumps(obj["call"]))

    return parse


# ----------------------------------------------------------------------------------------------
# the strategy


@strategy("make-verifier", "astra", options=O.EnvSynthOptions, help="ASTRA pipeline B: QA instance → sandbox-checked python env + F1 verifier")
def build(o: O.EnvSynthOptions, ctx: StageContext):
    attempts, impl_attempts, merge_attempts, do_merge = o.attempts, o.impl_attempts, o.merge_attempts, o.merge
    limits = {"wall_seconds": o.sandbox_wall_seconds, "cpu_seconds": o.sandbox_cpu_seconds,
              "memory_mb": o.sandbox_memory_mb}
    seed = o.seed
    out_dir = o.out_dir
    P = {k: prompts.load(f"astra/{k}") for k in ("tool_doc", "invocation", "implementation", "homogeneous", "merge")}

    async def ask(prompt: str, parse, role: str, usage: dict, k: int = 0):
        got = await ask_prompt(ctx.llm(), prompt, parse, usage=usage, role=role, attempts=attempts,
                               sample_index=k * attempts)
        return got.value

    async def synth_node(i: int, sq: SubQuestion, deps: dict, usage: dict, log: list[str]) -> Tool | None:
        try:
            spec = await ask(P["tool_doc"].render(question=sq.q, answer=json.dumps(sq.a, ensure_ascii=False),
                                                  deps=json.dumps(deps, ensure_ascii=False)),
                             parse_doc, "astra tool document", usage)
        except RoleRejected as e:
            log.append(f"node {i}: tool document: {e}")
            return None
        doc = json.dumps(spec, ensure_ascii=False, indent=1)
        for k in range(impl_attempts):
            try:
                args = await ask(P["invocation"].render(document=doc, question=sq.q,
                                                        deps=json.dumps(deps, ensure_ascii=False)),
                                 parse_call(spec), "astra invocation", usage, k)
                call_stmt = f"{spec['name']}(**{json.dumps(args, ensure_ascii=False)})"
                src = await ask(P["implementation"].render(
                    document=doc, pairs=json.dumps([{"question": sq.q, "answer": sq.a}], ensure_ascii=False),
                    call_statement=call_stmt), parse_function, "astra implementation", usage, k)
            except RoleRejected as e:
                log.append(f"node {i} attempt {k + 1}: {e}")
                continue
            probs = check_source(src, spec["name"], spec["parameters"])
            if not probs:
                tool = Tool(spec["name"], spec["name"], spec, src, [i], {i: args})
                probs = run_calls([tool], [(tool.name, args, sq.a)], limits)
                if not probs:
                    return tool
            log.append(f"node {i} attempt {k + 1}: " + "; ".join(probs))
        return None

    async def merge_group(group: list[Tool], sqs: list, usage: dict, log: list[str], rng) -> list[Tool]:
        base = group[rng.randrange(len(group))]
        rest = [t for t in group if t is not base]
        kept = [base]
        for other in rest:
            i = other.members[0]
            merged = False
            for k in range(merge_attempts):
                existing = [{"call": {"name": base.name, "arguments": base.calls[j]}, "answer": sqs[j].a}
                            for j in base.members]
                try:
                    src, args = await ask(P["merge"].render(
                        document=json.dumps(base.spec, ensure_ascii=False, indent=1), function=base.src,
                        existing=json.dumps(existing, ensure_ascii=False, indent=1),
                        pair=json.dumps({"question": sqs[i].q, "answer": sqs[i].a}, ensure_ascii=False)),
                        parse_merge(base.spec), "astra merge", usage, k)
                except RoleRejected as e:
                    log.append(f"merge node {i} into {base.name} attempt {k + 1}: {e}")
                    continue
                probs = check_source(src, base.inner, base.spec["parameters"])
                if not probs:
                    trial = Tool(base.name, base.inner, base.spec, src, base.members + [i], {**base.calls, i: args})
                    # re-run EVERY invocation of the group after the insertion
                    probs = run_calls([trial], [(trial.name, trial.calls[j], sqs[j].a) for j in trial.members], limits)
                if probs:
                    log.append(f"merge node {i} into {base.name} attempt {k + 1}: " + "; ".join(probs))
                    continue
                base.src, base.members, base.calls = trial.src, trial.members, trial.calls
                merged = True
                break
            if not merged:
                log.append(f"node {i} kept as its own tool {other.name} (merge failed)")
                kept.append(other)
        return kept

    async def fn(record: Record) -> Record:
        gt = record.task.ground_truth if record.task else None
        if gt is None or not gt.sub_questions:
            raise StageError("make-verifier astra needs task.ground_truth.sub_questions (gen-task --strategy "
                             "astra-qa)", field="task.ground_truth.sub_questions")
        sqs = list(gt.sub_questions)
        need = (record.task.extra or {}).get("astra_needs_tool") or [True] * len(sqs)
        if len(need) != len(sqs):
            raise StageError("task.extra.astra_needs_tool does not match the sub-questions",
                             field="task.extra.astra_needs_tool")

        bad = necessity_violations(sqs, need)
        if bad:
            raise StageError("tool-necessity rule broken (run validate-task --strategy astra --filter passed "
                             "first): " + "; ".join(bad), field="task.ground_truth.sub_questions")
        usage = new_usage()
        log: list[str] = []
        tools: list[Tool] = []
        tool_nodes = [i for i, n in enumerate(need) if n]
        failed = False
        for i in tool_nodes:
            deps = {sqs[j].q: sqs[j].a for j in sqs[i].d}
            t = await synth_node(i, sqs[i], deps, usage, log)
            if t is None:
                failed = True
                log.append(f"node {i} failed after {impl_attempts} attempt(s): {sqs[i].q}")
                break
            tools.append(t)
        n_merged = 0
        if not failed and do_merge and len(tools) >= 2:
            try:
                groups = await ask(P["homogeneous"].render(nodes="\n".join(
                    json.dumps({"index": t.members[0], "q": sqs[t.members[0]].q, "tool": t.name}, ensure_ascii=False)
                    for t in tools)), parse_groups(tool_nodes), "astra homogeneous grouping", usage)
            except RoleRejected as e:
                log.append(f"grouping skipped: {e}")
                groups = []
            rng = random.Random(f"{seed}:{record.id}")
            by_node = {t.members[0]: t for t in tools}
            out: list[Tool] = []
            grouped = {i for g in groups for i in g}
            for g in groups:
                kept = await merge_group([by_node[i] for i in g], sqs, usage, log, rng)
                n_merged += len(g) - len(kept)
                out += kept
            out += [t for t in tools if t.members[0] not in grouped]
            tools = sorted(out, key=lambda t: min(t.members))
        if failed:
            record.verdicts.append(Verdict(stage="make-verifier", kind="verifier", name="astra_env", passed=False,
                                           reasons=log[-8:], scores={"attempt_log": log}))
        else:
            _finish(record, tools, sqs, need, limits, log, n_merged)
            if out_dir and record.env is not None and backend_capabilities(record.env.backend).code_tools:
                write_env_dir(record, out_dir)
        add_provenance(record, "make-verifier", strategy="astra", model=ctx.model_name(),
                       recipe_hash=o.recipe_hash, usage=usage)
        return record

    return fn


def _finish(record: Record, tools: list[Tool], sqs: list, need: list[bool], limits: dict,
            log: list[str], n_merged: int) -> None:
    # unique env tool names (two unmerged nodes may have chosen the same name)
    used: set[str] = set()
    for t in tools:
        name, k = t.name, 2
        while name in used:
            name, k = f"{t.name}_{k}", k + 1
        t.name = name
        used.add(name)
    owner = {i: t for t in tools for i in t.members}
    keep = [i for i, n in enumerate(need) if n]
    # final self-test: the assembled environment answers every invocation
    probs = run_calls(tools, [(owner[i].name, owner[i].calls[i], sqs[i].a) for i in keep], limits)
    if probs:
        log += [f"final self-test: {p}" for p in probs]
        record.verdicts.append(Verdict(stage="make-verifier", kind="verifier", name="astra_env", passed=False,
                                       reasons=probs, scores={"attempt_log": log}))
        return
    new_index = {old: new for new, old in enumerate(keep)}
    gt = record.task.ground_truth
    gt.extra["non_tool_sub_questions"] = [sqs[i].model_dump() for i, n in enumerate(need) if not n]
    gt.extra["decomposition"] = [s.model_dump() for s in sqs]
    gt.sub_questions = [SubQuestion(q=sqs[i].q, a=sqs[i].a, d=[new_index[j] for j in sqs[i].d if j in new_index],
                                    tool=owner[i].name) for i in keep]
    gt.actions = [Action(name=owner[i].name, arguments=owner[i].calls[i]) for i in keep]
    if gt.final_answer is not None:
        gt.communicate_info = [str(gt.final_answer)]
    source = "".join(wrapper_source(t.name, t.inner, t.src) for t in tools)
    record.env = EnvRef(backend="python", id=f"astra-qa-{record.id}"[:200],
                        config={"tools": [t.schema() for t in tools], "source": source, "limits": dict(limits),
                                "policy": "Answer the user's question with the tools."},
                        state={})
    record.verifier = Verifier(spec="f1", self_test={"passed": True, "invocations": len(keep),
                                                     "tools": len(tools), "merged": n_merged})
    record.verdicts.append(Verdict(stage="make-verifier", kind="verifier", name="astra_env", passed=True,
                                   score=1.0, scores={"tools": len(tools), "tool_nodes": len(keep),
                                                      "merged": n_merged, "attempt_log": log},
                                   reasons=[x for x in log if "kept as its own tool" in x]))
    record.tags = list(dict.fromkeys(list(record.tags) + ["astra", "qa-env"]))


def env_dir_name(env_id: str) -> str:
    """A file-system-safe directory name for an environment id."""
    import re

    name = re.sub(r"[^A-Za-z0-9._-]+", "_", env_id or "env").strip("._") or "env"
    return name[:120]


def write_env_dir(record: Record, out_dir: str) -> str:
    """Move record.env's inline python config to `out_dir/<env id>/` (the python backend's directory
    layout) and point env.path at it; returns the directory."""
    import os
    import tempfile
    from pathlib import Path

    env = record.env
    env_config = dict(env.config or {})  # the generated environment (data, not options)
    base = Path(out_dir)
    d = base / env_dir_name(env.id or record.id)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=base))
    try:
        (tmp / "tools.json").write_text(json.dumps(env_config.get("tools", []), indent=1, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
        (tmp / "tools.py").write_text(env_config.get("source", ""), encoding="utf-8")
        (tmp / "policy.md").write_text(env_config.get("policy", ""), encoding="utf-8")
        (tmp / "state.json").write_text(json.dumps(env.state or {}, ensure_ascii=False) + "\n", encoding="utf-8")
        rest = {k: v for k, v in env_config.items() if k not in ("tools", "source", "policy", "user_tools")}
        (tmp / "config.json").write_text(json.dumps(rest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        if d.exists():  # a re-run replaces the previous environment of the same id
            import shutil

            shutil.rmtree(d)
        os.replace(tmp, d)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record.env = EnvRef(backend="python", id=env.id, path=str(d))
    return str(d)
