"""`gen-plan --strategy astra` (ASTRA A1 + A2): tool docs → server → (task, chain) pairs → graph →
biased random walks → query + dependency check → one plan record per kept chain (`plan.tool_chain`).

Reads : server records (`toolkit tools import`), records carrying raw docs in `extra.tool_docs`, or
        any record whose env has tools (tau2 / sqlite / simulated / python).
Writes: plan records: id `<server id>-chain<k>`, parent_id = the server record, env = the server's
        env, plan.tool_chain, plan.synthesis_plan = the query, plan.extra = {query, arguments,
        bindings, weight, unverified}; extra.astra carries the server (tools, outputs) for gen-task.
Graph : with --out-dir, `<server>.graph.json` (nodes, weighted edges, every walk with its verdict),
        `<server>.graph.dot` and `<server>.graph.png` (graphviz or matplotlib when installed).

Recipe keys (gen-plan section): chain_pairs (8), walks (24), walk_min_len (2), walk_max_len (4),
acyclic (true), max_candidates (2 × n), strict_outputs (false), min_tools (3),
min_description_words (3); -n = plans per server (5); --seed seeds the walks.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from toolkit.io import StageError, add_provenance, log
from toolkit.formats.tools import tools_text
from toolkit.schema import Plan, Record
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.astra import options as O
from toolkit import prompts
from toolkit.flows.astra import chains as CH, tooldocs as TD
from toolkit.flows.astra.tooldocs import slug
from toolkit.roles.structured import Malformed, RoleRejected, ask_prompt, new_usage, parse_json_object
from toolkit.schema import EnvRef


def parse_pairs(known: set[str], max_len: int):
    def parse(text: str | None) -> list[dict]:
        obj = parse_json_object(text, required=("pairs",))
        pairs = obj["pairs"]
        if not isinstance(pairs, list) or not pairs:
            raise Malformed("'pairs' must be a non-empty list")
        out = []
        for i, p in enumerate(pairs):
            if not isinstance(p, dict) or not isinstance(p.get("task"), str) or not p["task"].strip():
                raise Malformed(f"pairs[{i}].task must be a non-empty string")
            ch = p.get("chain")
            if not isinstance(ch, list) or not ch or not all(isinstance(x, str) for x in ch):
                raise Malformed(f"pairs[{i}].chain must be a non-empty list of tool names")
            unknown = [x for x in ch if x not in known]
            if unknown:
                raise Malformed(f"pairs[{i}].chain uses unknown tool(s) {unknown}")
            if len(ch) > max_len * 2:
                raise Malformed(f"pairs[{i}].chain has {len(ch)} calls (> {max_len * 2})")
            out.append({"task": p["task"].strip(), "chain": ch})
        return out

    return parse


def parse_query(chain: list[str]):
    def parse(text: str | None) -> dict:
        obj = parse_json_object(text, required=("valid", "query"))
        if not isinstance(obj["valid"], bool):
            raise Malformed(f"'valid' must be true or false, got {obj['valid']!r}")
        if not isinstance(obj["query"], str):
            raise Malformed("'query' must be a string")
        if not obj["valid"]:
            return {"valid": False, "query": "", "arguments": []}
        if not obj["query"].strip():
            raise Malformed("'query' is empty although valid is true")
        args = obj.get("arguments")
        if not isinstance(args, list) or len(args) != len(chain):
            raise Malformed(f"'arguments' must list one item per call ({len(chain)})")
        for i, (a, name) in enumerate(zip(args, chain)):
            if not isinstance(a, dict) or a.get("tool") != name or not isinstance(a.get("args", {}), dict):
                raise Malformed(f"arguments[{i}] must be {{\"tool\": {name!r}, \"args\": {{...}}}}")
        return {"valid": True, "query": obj["query"].strip(), "arguments": args}

    return parse


def candidate_walks(graph, n_walks: int, max_len: int, *, min_len: int = 2, seed: int = 0,
                    acyclic: bool = True) -> list[list[str]]:
    """ASTRA §2.1.2: "we sample candidate tool-chains by performing length-bounded random walks on Ĝ
    (biased by w) ... The resulting walks constitute our final candidate chains": the walks in the
    order they were sampled (a random sample, biased by w through each step), never re-ranked by
    weight; gen-plan tries the first `max_candidates` of them."""
    return CH.random_walks(graph, n_walks, max_len, min_len=min_len, seed=seed, acyclic=acyclic)


@strategy("gen-plan", "astra", options=O.PlanOptions, help="ASTRA: tool docs → chain graph → random walks → verified plan.tool_chain")
def build(opts: O.PlanOptions, ctx: StageContext):
    n_plans, n_pairs, n_walks = opts.n, opts.chain_pairs, opts.walks
    min_len, max_len, acyclic = opts.walk_min_len, opts.walk_max_len, opts.acyclic
    max_cand = opts.max_candidates or 2 * n_plans
    strict_outputs, attempts, seed = opts.strict_outputs, opts.attempts, opts.seed
    out_dir = ctx.opts.out_dir  # a gen-plan flag (--out-dir)
    min_tools, min_words = opts.min_tools, opts.min_description_words
    p_synth, p_query = prompts.load("astra/chain_synth"), prompts.load("astra/chain_query")

    async def fn(record: Record):
        try:
            server, drops = TD.server_from_record(record, min_tools=min_tools, min_description_words=min_words)
        except TD.ToolDocError as e:
            raise StageError(str(e), field="extra.tool_docs") from None
        for d in drops:
            log(f"gen-plan astra {record.id}: {d.line()}")
        if server is None:
            raise StageError("no usable server: " + "; ".join(d.line() for d in drops), field="extra.tool_docs")
        client = ctx.llm()
        usage = new_usage()
        tools_txt = tools_text(server.tools, unwrap=False, indent=1)
        scenery = server.description or f"The {server.name} service."
        known = {t["function"]["name"] for t in server.tools}
        # 1. LLM: (task, chain) pairs
        try:
            got = await ask_prompt(client, p_synth.render(tools=tools_txt, scenery=scenery, n=n_pairs, max_len=max_len),
                                   parse_pairs(known, max_len), usage=usage, role="astra chain synthesizer",
                                   attempts=attempts)
        except RoleRejected as e:
            raise StageError(str(e), field="plan.tool_chain") from None
        pairs = got.value
        # 2. graph + walks
        graph = CH.build_graph([p["chain"] for p in pairs], nodes=sorted(known))
        walks = candidate_walks(graph, n_walks, max_len, min_len=min_len, seed=seed, acyclic=acyclic)
        report: list[dict] = []
        plans: list[Record] = []
        for w in walks[:max_cand]:
            if len(plans) >= n_plans:
                break
            row: dict[str, Any] = {"chain": w, "weight": CH.walk_weight(graph, w)}
            try:
                q = await ask_prompt(client, p_query.render(tools=tools_txt, scenery=scenery, chain=json.dumps(w)),
                                     parse_query(w), usage=usage, role="astra chain query", attempts=attempts,
                                     sample_index=len(report) * attempts)
            except RoleRejected as e:
                row.update(kept=False, reasons=[str(e)])
                report.append(row)
                continue
            if not q.value["valid"]:
                row.update(kept=False, reasons=["LLM: chain is not a meaningful task (valid=false)"])
                report.append(row)
                continue
            chk = CH.verify_chain(w, server.tools, server.outputs, q.value["query"], q.value["arguments"],
                                  strict_outputs=strict_outputs)
            row.update(kept=chk.ok, reasons=chk.reasons, query=q.value["query"], unverified=chk.unverified)
            report.append(row)
            if not chk.ok:
                continue
            k = len(plans)
            rec = Record(id=f"{record.id}-chain{k}", parent_id=record.id, flow="astra",
                         tags=list(dict.fromkeys(list(record.tags) + ["astra", "plan"])),
                         env=copy.deepcopy(record.env) if record.env else None,
                         plan=Plan(id=f"{record.id}-chain{k}", tool_chain=w, synthesis_plan=q.value["query"],
                                   prompt_set="astra", prompt_version=p_query.id,
                                   extra={"query": q.value["query"], "arguments": q.value["arguments"],
                                          "bindings": chk.bindings, "weight": row["weight"],
                                          "unverified": chk.unverified}),
                         extra={"astra": server.record()["extra"]["astra"]})
            if rec.env is None:
                rec.env = EnvRef.model_validate(server.env_ref())
            plans.append(rec)
        for row in report:
            if not row["kept"]:
                log(f"gen-plan astra {record.id}: chain {row['chain']} rejected: {'; '.join(row['reasons'])}")
        if out_dir:
            _export(out_dir, server.name, graph, report, pairs)
        if not plans:
            raise StageError(f"no chain passed ({len(report)} candidate(s) from {len(walks)} walk(s)); "
                             + " | ".join("; ".join(r["reasons"])[:200] for r in report[:3]),
                             field="plan.tool_chain")
        share = {k: (v / len(plans) if isinstance(v, (int, float)) else v) for k, v in usage.items()}
        for rec in plans:
            add_provenance(rec, "gen-plan", strategy="astra", model=ctx.model_name(),
                           recipe_hash=opts.recipe_hash, usage=share)
        return plans

    return fn


def _export(out_dir: str, server: str, graph, report: list[dict], pairs: list[dict]) -> None:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    base = str(d / f"{slug(server)}.graph")
    doc = CH.export_json(graph, walks=report, server=server)
    doc["pairs"] = pairs
    Path(base + ".json").write_text(json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")
    Path(base + ".dot").write_text(CH.export_dot(graph, server, [r["chain"] for r in report if r["kept"]]),
                                        encoding="utf-8")
    try:
        CH.export_png(graph, base + ".png", server)
    except Exception as e:  # pragma: no cover - rendering is best effort
        log(f"gen-plan astra: PNG rendering failed: {e}")
