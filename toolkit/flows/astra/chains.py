"""ASTRA A2 (§2.1.2): tool-chain graph, biased random walks, dependency verification.

Deterministic core (tested exactly; the LLM only proposes (task, chain) pairs and writes queries):

- `build_graph(chains)`: one node per tool, an edge f_i→f_j weighted by how often the pair occurs
  consecutively in the synthesized chains (the paper leaves w unspecified; the count is ours).
- `random_walks(graph, ...)`: seeded, length-bounded walks; the start node is drawn by out-weight,
  each step by edge weight; optional acyclicity; duplicates removed.
- `verify_chain(chain, tools, outputs, task, arguments)`: every required argument of every step
  must be supported by the task (a literal stated in the task text) or by a field an EARLIER step
  returns (a reference ``"$k.field"``, k the 1-based step), checked against the tools' SCHEMAS
  (required lists, enums, JSON types) and their output fields (response schemas, descriptions).
- `export_json`, `export_dot`, `export_png`: the graph a person can look at.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable
from toolkit.envs.python import _type_ok as ok

REF_RE = re.compile(r"^\$(\d+)\.([A-Za-z_][A-Za-z0-9_.\[\]]*)$")


@dataclass
class Graph:
    nodes: list[str]
    weights: dict[tuple[str, str], int] = field(default_factory=dict)

    def successors(self, node: str) -> list[tuple[str, int]]:
        return sorted(((b, w) for (a, b), w in self.weights.items() if a == node), key=lambda x: x[0])

    def out_weight(self, node: str) -> int:
        return sum(w for (a, _), w in self.weights.items() if a == node)

    def to_dict(self) -> dict:
        return {"nodes": list(self.nodes),
                "edges": [{"from": a, "to": b, "weight": w} for (a, b), w in sorted(self.weights.items())]}


def build_graph(chains: Iterable[list[str]], nodes: Iterable[str] = ()) -> Graph:
    """Transition graph: w(f_i→f_j) = number of consecutive (f_i, f_j) occurrences."""
    w: Counter = Counter()
    seen: list[str] = list(dict.fromkeys(nodes))
    for c in chains:
        for t in c:
            if t not in seen:
                seen.append(t)
        for a, b in zip(c, c[1:]):
            w[(a, b)] += 1
    return Graph(seen, dict(w))


def _pick(rng: random.Random, items: list[tuple[str, int]]) -> str:
    total = sum(w for _, w in items)
    x = rng.uniform(0, total)
    acc = 0.0
    for name, wt in items:
        acc += wt
        if x <= acc:
            return name
    return items[-1][0]


def random_walks(graph: Graph, n_walks: int, max_len: int, *, min_len: int = 2, seed: int = 0,
                 acyclic: bool = True, max_tries: int | None = None) -> list[list[str]]:
    """Up to n_walks distinct walks with min_len ≤ length ≤ max_len, biased by edge weights.

    Each try draws a target length uniformly in [min_len, max_len], a start node with probability
    ∝ its out-weight, then successors ∝ edge weight (already visited nodes excluded when acyclic);
    a walk that dead-ends before min_len is discarded."""
    if max_len < 1 or min_len < 1 or min_len > max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    rng = random.Random(seed)
    starts = [(n, graph.out_weight(n)) for n in graph.nodes if graph.out_weight(n) > 0]
    if not starts:
        return []
    out: list[list[str]] = []
    seen: set[tuple] = set()
    for _ in range(max_tries or n_walks * 20):
        if len(out) >= n_walks:
            break
        target = rng.randint(min_len, max_len)
        walk = [_pick(rng, starts)]
        while len(walk) < target:
            succ = [(b, w) for b, w in graph.successors(walk[-1]) if not (acyclic and b in walk)]
            if not succ:
                break
            walk.append(_pick(rng, succ))
        if len(walk) >= min_len and tuple(walk) not in seen:
            seen.add(tuple(walk))
            out.append(walk)
    return out


def walk_weight(graph: Graph, walk: list[str]) -> int:
    return sum(graph.weights.get((a, b), 0) for a, b in zip(walk, walk[1:]))


# ----------------------------------------------------------------------------------------------
# dependency verification


@dataclass
class ChainCheck:
    ok: bool
    reasons: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)  # references to tools with unknown outputs
    bindings: list[dict] = field(default_factory=list)   # per step: arg → "task" | "$k.field"


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[_\-]+", " ", str(s)).lower().split())


def _field_matches(arg: str, field_name: str, producer: str) -> bool:
    """An output field supplies an argument: same name, or `id` of a tool about X for `X_id`."""
    f = field_name.split(".")[-1].split("[")[0]
    if f == arg:
        return True
    if f == "id" and arg.endswith("_id"):
        return arg[:-3] in producer
    return False


def _type_ok(value: Any, spec: dict) -> bool:
    return "type" not in spec or ok(value, spec["type"])


def _schema_of(tools: dict, name: str) -> dict:
    t = tools.get(name) or {}
    fn = t.get("function", t)
    return fn.get("parameters") or {"type": "object", "properties": {}}


def verify_chain(chain: list[str], tools: list[dict] | dict, outputs: dict[str, list[str]],
                 task: str = "", arguments: list[dict] | None = None, *,
                 strict_outputs: bool = False) -> ChainCheck:
    """Check inter-tool dependencies of `chain` against the tool schemas.

    `arguments` (one item per step: {"tool": name, "args": {arg: literal | "$k.field"}}) is how the
    task and the earlier outputs are bound to each step's arguments. Without it, an argument is
    supported when the task text names it or an earlier tool outputs a field of that name.
    A literal must be stated in the task text (strings/numbers, case-insensitive; booleans and
    enum members are choices the task makes and need not be quoted). A reference must point to an
    earlier step and to one of that tool's output fields; when that tool declares no outputs the
    reference is accepted but listed in `unverified` (rejected when strict_outputs)."""
    if isinstance(tools, list):
        tools = {(t.get("function") or t)["name"]: t for t in tools}
    reasons: list[str] = []
    unverified: list[str] = []
    bindings: list[dict] = []
    text = _norm(task)
    raw_text = " ".join(str(task).lower().split())
    if not chain:
        return ChainCheck(False, ["empty chain"])
    for name in chain:
        if name not in tools:
            reasons.append(f"unknown tool {name!r}")
    if reasons:
        return ChainCheck(False, reasons)
    if arguments is not None and len(arguments) != len(chain):
        return ChainCheck(False, [f"arguments has {len(arguments)} step(s), the chain {len(chain)}"])
    for k, name in enumerate(chain, 1):
        params = _schema_of(tools, name)
        props = params.get("properties") or {}
        required = [r for r in params.get("required") or [] if isinstance(r, str)]
        bind: dict = {}
        if arguments is None:
            for r in required:
                src = next((f"${j}.{f}" for j in range(k - 1, 0, -1) for f in outputs.get(chain[j - 1], [])
                            if _field_matches(r, f, chain[j - 1])), None)
                if src is None and (_norm(r) in text or r.lower() in raw_text):
                    src = "task"
                if src is None:
                    reasons.append(f"step {k} {name}: required argument {r!r} is neither stated in the task "
                                   "nor returned by an earlier tool")
                else:
                    bind[r] = src
            bindings.append(bind)
            continue
        step = arguments[k - 1] if isinstance(arguments[k - 1], dict) else {}
        if step.get("tool") != name:
            reasons.append(f"step {k}: arguments are for {step.get('tool')!r}, the chain has {name!r}")
            bindings.append(bind)
            continue
        args = step.get("args") or {}
        if not isinstance(args, dict):
            reasons.append(f"step {k} {name}: args must be an object")
            bindings.append(bind)
            continue
        for r in required:
            if r not in args or args[r] is None or args[r] == "":
                reasons.append(f"step {k} {name}: required argument {r!r} has no value from the task "
                               "or an earlier tool")
        for a, v in args.items():
            spec = props.get(a)
            if spec is None and props and not params.get("additionalProperties", False):
                reasons.append(f"step {k} {name}: unknown argument {a!r}")
                continue
            spec = spec or {}
            m = REF_RE.match(v) if isinstance(v, str) else None
            if m:
                j, fld = int(m.group(1)), m.group(2)
                if not 1 <= j < k:
                    reasons.append(f"step {k} {name}.{a}: {v} does not refer to an earlier step")
                    continue
                prod = chain[j - 1]
                outs = outputs.get(prod) or []
                if not outs:
                    if strict_outputs:
                        reasons.append(f"step {k} {name}.{a}: {v}: {prod} declares no output fields")
                    else:
                        unverified.append(f"step {k} {name}.{a} <- {v}")
                        bind[a] = v
                    continue
                if not any(_field_matches(fld.split(".")[-1].split("[")[0], o, prod) or o == fld for o in outs):
                    reasons.append(f"step {k} {name}.{a}: {v}: {prod} returns no field {fld!r} "
                                   f"(its outputs: {', '.join(outs[:12])})")
                    continue
                bind[a] = v
                continue
            if "enum" in spec and isinstance(spec["enum"], list):
                if v not in spec["enum"]:
                    reasons.append(f"step {k} {name}.{a}: {v!r} is not one of {spec['enum']}")
                else:
                    bind[a] = "task"
                continue
            if not _type_ok(v, spec):
                reasons.append(f"step {k} {name}.{a}: {v!r} is not of type {spec.get('type')}")
                continue
            if isinstance(v, bool) or v is None:
                bind[a] = "task"
                continue
            if isinstance(v, (str, int, float)):
                sv = str(v).lower()
                if isinstance(v, float) and v.is_integer():
                    sv = str(int(v))
                if sv not in raw_text:
                    reasons.append(f"step {k} {name}.{a}: value {v!r} is not stated in the task")
                    continue
                bind[a] = "task"
                continue
            # lists / objects: every scalar inside must be stated in the task
            scalars = list(v) if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else [v]
            missing = [x for x in scalars if isinstance(x, (str, int, float)) and not isinstance(x, bool)
                       and str(x).lower() not in raw_text]
            if missing:
                reasons.append(f"step {k} {name}.{a}: value(s) {missing[:3]!r} are not stated in the task")
            else:
                bind[a] = "task"
        bindings.append(bind)
    return ChainCheck(not reasons, reasons, unverified, bindings)


# ----------------------------------------------------------------------------------------------
# export


def export_json(graph: Graph, walks: list[dict] | None = None, server: str = "") -> dict:
    d = {"server": server, **graph.to_dict()}
    if walks is not None:
        d["walks"] = walks
    return d


def _dot_id(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def export_dot(graph: Graph, server: str = "", highlight: list[list[str]] | None = None) -> str:
    kept = {(a, b) for c in (highlight or []) for a, b in zip(c, c[1:])}
    lines = [f"digraph {_dot_id(server or 'tools')} {{", "  rankdir=LR;", "  node [shape=box, fontname=Helvetica];"]
    for n in graph.nodes:
        lines.append(f"  {_dot_id(n)};")
    for (a, b), w in sorted(graph.weights.items()):
        style = ", color=darkgreen, penwidth=2" if (a, b) in kept else ""
        lines.append(f"  {_dot_id(a)} -> {_dot_id(b)} [label={w}, weight={w}{style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export_png(graph: Graph, path: str, server: str = "") -> bool:
    """Render with graphviz `dot` when on PATH, else matplotlib (circular layout). False when
    neither is available."""
    import shutil
    import subprocess

    if shutil.which("dot"):
        r = subprocess.run(["dot", "-Tpng", "-o", path], input=export_dot(graph, server), text=True,
                           capture_output=True, timeout=60)
        if r.returncode == 0:
            return True
    try:
        import math

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    n = max(1, len(graph.nodes))
    pos = {v: (math.cos(2 * math.pi * i / n), math.sin(2 * math.pi * i / n)) for i, v in enumerate(graph.nodes)}
    fig, ax = plt.subplots(figsize=(8, 8))
    wmax = max(graph.weights.values(), default=1)
    for (a, b), w in graph.weights.items():
        (x1, y1), (x2, y2) = pos[a], pos[b]
        ax.annotate("", xy=(x2, y2), xytext=(x1, y1),
                    arrowprops=dict(arrowstyle="->", lw=0.5 + 2.5 * w / wmax, color="gray",
                                    shrinkA=18, shrinkB=18, connectionstyle="arc3,rad=0.1"))
        ax.text((x1 + x2) / 2, (y1 + y2) / 2, str(w), fontsize=8, color="darkred")
    for v, (x, y) in pos.items():
        ax.text(x, y, v, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc="lightyellow", ec="black"))
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.axis("off")
    ax.set_title(f"tool-chain graph: {server}")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True
