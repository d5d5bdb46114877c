"""The layer contract of `toolkit/` and its checker (run by tests/test_layers.py, hence by `.ci/run`).

Layers point down (docs/architecture.md): a module may import modules of its own layer or of a
lower one, never of a higher one; and no module takes part in an import cycle. Every import
counts, function-local ones included (they are how upward imports used to hide). The checker
reads the source with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# lowest first; the names are the first component under `toolkit.` ("" is toolkit/__init__.py)
LAYERS: list[tuple[str, ...]] = [
    ("", "registry", "schema", "io", "config", "options", "prompts", "scoring", "formats", "stats", "yieldtable", "diskcache", "aio",
     "cluster", "toolresult"),
    ("envs", "llm", "sandbox", "roles", "domains", "tau2", "quality", "bfcl"),
    ("episodes", "scorers"),  # the engines: episodes (rollout's), scoring (verify's)
    ("stages", "pipeline"),
    ("flows",),
    ("train",),
    ("integrations",),
    ("cli", "doctor"),
]

# The commands' own modules (toolkit.stages.<command>): only the commands' layer and the CLI import
# them. Everything else (flows, train, integrations) uses the engines below the commands
# (toolkit.episodes, toolkit.scorers) and the strategy API (toolkit.stages, .registry, .base).
COMMAND_MODULES = ("toolkit.stages.rollout", "toolkit.stages.verify", "toolkit.stages.simulate_env",
                   "toolkit.stages.eval_tau2", "toolkit.stages.strategies", "toolkit.stages.users")
COMMAND_IMPORTERS = ("stages", "pipeline", "cli")

# Known upward imports allowed for now, each with the reason; the list only shrinks.
IGNORED: dict[tuple[str, str], str] = {
}


# Function-local imports of toolkit modules (imports belong at the top of the module; a function-
# local one is for an optional heavy third-party dependency only). Allowed: the entries below, each
# with its reason, keyed by (importing module, imported module); and, while issue 33's parallel
# branches land, at most MAX_FUNCTION_LOCAL others (the lead lowers it to 0 after the merge).
FUNCTION_LOCAL_ALLOWED: dict[tuple[str, str], str] = {
    ("toolkit.train.grpo.loop", "toolkit.train.grpo.trainer"):
        "ToolkitGRPOTrainer subclasses trl.GRPOTrainer, so importing it loads trl, transformers and torch: "
        "loaded when a run starts, so that `toolkit.train.grpo` (its variants, read for --variant) stays light",
}
MAX_FUNCTION_LOCAL = 18  # after issue 33's merge: logigen (goals, llm_explorer, validate, rules, targeted), stages.registry / make_meter (toolkit.llm: ~0.6 CPU-s off every --help), eigendata make_verifier; only goes down


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported toolkit module (the longest existing module name)
    line: int
    local: bool  # inside a function/class/block (not at module top level)
    in_function: bool = False  # inside a function (def / async def / lambda body)

    def __str__(self) -> str:
        where = "function-local " if self.local else ""
        return f"{self.source}:{self.line} {where}import of {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def scan(root: Path) -> list[Import]:
    """Every import of a `toolkit` module by a module under `root` (the toolkit package dir)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    mods = set(files)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: list[Import] = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        top = {id(n) for n in tree.body}
        in_fn = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    pkg = ".".join(base + ([node.module] if node.module else []))
                else:
                    pkg = node.module or ""
                # `from pkg import sub` imports the submodule; `from pkg import name` the package
                names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in mods else pkg for a in node.names]
            else:
                continue
            for name in dict.fromkeys(names):
                if name == root.name or name.startswith(root.name + "."):
                    target = resolve(name)
                    if target and target != mod:
                        out.append(Import(mod, target, node.lineno, id(node) not in top, id(node) in in_fn))
    return out


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else ""
    for i, names in enumerate(LAYERS):
        if first in names:
            return i
    return None


def _ignored(imp: Import, ignored: dict) -> bool:
    return any(imp.source == s and (imp.target == t or imp.target.startswith(t + ".")) for s, t in ignored)


def upward(imports: list[Import], ignored: dict = IGNORED) -> list[str]:
    errors = []
    for imp in imports:
        a, b = layer_of(imp.source), layer_of(imp.target)
        if a is None:
            errors.append(f"{imp.source} is in no layer (add it to tests/layering.py LAYERS)")
        elif b is None:
            errors.append(f"{imp.target} is in no layer (add it to tests/layering.py LAYERS)")
        elif b > a and not _ignored(imp, ignored):
            errors.append(f"upward import: {imp} (layer {a} {LAYERS[a][0] or 'core'} → layer {b} {LAYERS[b][0]})")
    return sorted(set(errors))


def command_imports(imports: list[Import]) -> list[str]:
    """Imports of a command's own module from outside the commands' layer and the CLI."""
    errors = []
    for imp in imports:
        parts = imp.source.split(".")
        first = parts[1] if len(parts) > 1 else ""
        if first in COMMAND_IMPORTERS:
            continue
        if any(imp.target == m or imp.target.startswith(m + ".") for m in COMMAND_MODULES):
            errors.append(f"command module import: {imp} (use toolkit.episodes / toolkit.scorers, the engines "
                          "below the commands)")
    return sorted(set(errors))


def cycles(imports: list[Import], ignored: dict = IGNORED) -> list[list[str]]:
    """Strongly connected components (> 1 module) of the module import graph. An import of one's
    own ancestor package is left out (Python has already imported it before the module runs)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if _ignored(imp, ignored) or imp.source.startswith(imp.target + "."):
            continue
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """The toolkit subpackage (or top-level module) a module belongs to: toolkit.envs.sqlite.x -> envs."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles among toolkit's subpackages and top-level modules (`envs` ↔ `domains`): strongly
    connected components of the package graph, every import counted (function-local ones too, with
    no ignore list: a package cycle is one even when each module-level edge is allowed)."""
    pkg_imports = [Import("toolkit." + (package_of(i.source) or "_init"), "toolkit." + (package_of(i.target) or "_init"),
                          i.line, i.local) for i in imports if package_of(i.source) != package_of(i.target)]
    return [[c.removeprefix("toolkit.") for c in comp] for comp in cycles(pkg_imports, {})]


def function_local(imports: list[Import], allowed: dict = FUNCTION_LOCAL_ALLOWED) -> list[Import]:
    """The function-local imports of toolkit modules that the allowlist does not name."""
    return [i for i in imports if i.in_function and not _ignored(i, allowed)]


def check(root: Path, ignored: dict = IGNORED) -> list[str]:
    """Every breach of the contract, as readable lines ([] = the contract holds)."""
    imports = scan(root)
    return (upward(imports, ignored) + command_imports(imports)
            + [f"import cycle: {' ↔ '.join(c)}" for c in cycles(imports, ignored)]
            + [f"package cycle: {' ↔ '.join(c)}" for c in package_cycles(imports)])


def stale_ignores(root: Path, ignored: dict = IGNORED) -> list[tuple[str, str]]:
    """Entries of the ignore list that no import uses any more (to be deleted)."""
    imports = scan(root)
    return [k for k in ignored if not any(_ignored(i, {k: ""}) for i in imports)]
