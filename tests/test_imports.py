"""Every module of the toolkit package imports (issue 18: "every module has a test that imports it").

The module list comes from the files under toolkit/ (not from pkgutil, which would have to import a
package to see inside it), so a module that cannot be imported still shows up as a failing case.
Only a module whose *optional* dependency is missing skips, with the dependency named.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "toolkit"

# Extras (pyproject.toml [project.optional-dependencies]); a missing one skips, anything else fails.
OPTIONAL = {"torch", "trl", "transformers", "peft", "accelerate", "datasets", "tokenizers",
            "llama_cpp", "tau2", "vllm", "docker", "matplotlib",
            "verifiers", "openenv"}  # extra `integrations` (toolkit.integrations.verifiers / .openenv)


def toolkit_modules() -> list[str]:
    names = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts[-1] == "__main__":  # `python -m` entry points run rather than import (side effects)
            continue
        if all(p.isidentifier() for p in parts):
            names.append(".".join(parts))
    return names


MODULES = toolkit_modules()


def test_module_list_covers_the_package():
    # A few modules from each layer, and no duplicates: the walk sees the whole tree.
    for name in ("toolkit", "toolkit.schema", "toolkit.io", "toolkit.envs.sqlite",
                 "toolkit.flows.logigen.sqlexpr", "toolkit.train.grpo.loss", "toolkit.tau2.paper"):
        assert name in MODULES, name
    assert len(MODULES) == len(set(MODULES)) > 60


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root in OPTIONAL:
            pytest.skip(f"{name} needs the optional dependency {root!r}")
        raise
    assert module.__name__ == name
    assert Path(module.__file__).resolve().is_relative_to(PKG)
