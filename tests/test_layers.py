"""The layer contract (tests/layering.py): toolkit's imports point down and form no cycle."""

import shutil
from pathlib import Path

from tests import layering

ROOT = Path(__file__).resolve().parent.parent / "toolkit"


def test_toolkit_imports_point_down_without_cycles():
    assert layering.check(ROOT) == []


def test_ignore_list_has_no_stale_entries():
    assert layering.stale_ignores(ROOT) == []


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "toolkit"
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns("__pycache__", "*.txt", "*.json", "*.sql", "*.md"))
    return dst


def _append(path: Path, text: str) -> int:
    """Append `text` to a module; returns the line number of its first line."""
    old = path.read_text(encoding="utf-8")
    path.write_text(old + ("" if old.endswith("\n") else "\n") + text, encoding="utf-8")
    return old.count("\n") + 1 + (0 if old.endswith("\n") else 1)


def test_planted_function_local_upward_import_fails(tmp_path):
    pkg = _copy(tmp_path)
    assert layering.check(pkg) == []
    line = _append(pkg / "scoring" / "rewards.py",
                   "def _planted():\n    from toolkit.train import sft  # noqa: F401\n") + 1
    errors = layering.check(pkg)
    assert errors[0] == (f"upward import: toolkit.scoring.rewards:{line} function-local import of "
                         "toolkit.train.sft (layer 0 core → layer 5 train)")
    # train imports scoring: the planted edge closes a package cycle too
    assert len(errors) == 2 and errors[1].startswith("package cycle: ") and "scoring" in errors[1] \
        and "train" in errors[1], errors


def test_planted_relative_upward_import_and_cycle_fail(tmp_path):
    pkg = _copy(tmp_path)
    # stages → flows through a relative import: upward (flows sit above stages)
    line = _append(pkg / "stages" / "registry.py", "from ..flows.astra import mixing  # noqa: F401,E402\n")
    # schema ↔ io: same layer, but a cycle
    _append(pkg / "schema.py", "def _planted():\n    import toolkit.io  # noqa: F401\n")
    errors = layering.check(pkg)
    assert f"upward import: toolkit.stages.registry:{line} import of toolkit.flows.astra.mixing " \
           "(layer 3 stages → layer 4 flows)" in errors
    assert any(e.startswith("import cycle: ") and "toolkit.io" in e and "toolkit.schema" in e for e in errors)
    assert "package cycle: io ↔ schema" in errors and "package cycle: flows ↔ stages" in errors
    assert len(errors) == 4, errors


def test_ignored_edge_is_allowed_only_where_listed(tmp_path):
    pkg = _copy(tmp_path)
    # the same kind of import as an ignored one, from another module: reported
    _append(pkg / "stages" / "eval_tau2.py", "def _planted():\n    from toolkit.flows.simia import grounding  # noqa\n")
    errors = layering.check(pkg)
    assert len(errors) == 2 and "toolkit.stages.eval_tau2" in errors[0] and "toolkit.flows.simia.grounding" in errors[0]
    assert errors[1] == "package cycle: flows ↔ stages"


def test_unlisted_package_is_reported(tmp_path):
    pkg = _copy(tmp_path)
    (pkg / "newthing.py").write_text("from toolkit import schema  # noqa: F401\n", encoding="utf-8")
    assert layering.check(pkg) == ["toolkit.newthing is in no layer (add it to tests/layering.py LAYERS)"]


def test_flows_or_train_importing_a_command_module_fails(tmp_path):
    """flows / train / integrations use the engines (toolkit.episodes, toolkit.scorers), never a
    command's module: an import of toolkit.stages.rollout or .verify from them is reported, from the
    CLI it is not."""
    pkg = _copy(tmp_path)
    line = _append(pkg / "flows" / "astra" / "mixing.py", "from toolkit.stages.rollout import build  # noqa\n")
    line2 = _append(pkg / "train" / "grpo" / "episodes.py",
                    "def _planted():\n    from toolkit.stages import verify  # noqa: F401\n") + 1
    _append(pkg / "cli" / "commands.py", "def _fine():\n    from toolkit.stages.verify import Verify  # noqa: F401\n")
    errors = layering.check(pkg)
    assert errors == [
        f"command module import: toolkit.flows.astra.mixing:{line} import of toolkit.stages.rollout (use "
        "toolkit.episodes / toolkit.scorers, the engines below the commands)",
        f"command module import: toolkit.train.grpo.episodes:{line2} function-local import of toolkit.stages.verify "
        "(use toolkit.episodes / toolkit.scorers, the engines below the commands)"], errors


def test_engines_sit_below_the_commands(tmp_path):
    """toolkit.episodes / toolkit.scorers are below toolkit.stages: an engine importing a command is upward."""
    pkg = _copy(tmp_path)
    line = _append(pkg / "scorers" / "engine.py", "from toolkit.stages import base  # noqa: F401,E402\n")
    errors = layering.check(pkg)
    assert errors == [f"upward import: toolkit.scorers.engine:{line} import of toolkit.stages.base "
                      "(layer 2 episodes → layer 3 stages)", "package cycle: scorers ↔ stages"], errors


def test_planted_function_local_package_cycle_fails(tmp_path):
    """envs → domains through a function-local import, while domains imports envs: a package cycle
    (each module-level edge alone is fine: both sit in one layer)."""
    pkg = _copy(tmp_path)
    assert not layering.package_cycles(layering.scan(pkg))
    _append(pkg / "envs" / "python.py", "def _planted():\n    from toolkit.domains import load_tasks  # noqa: F401\n")
    errors = layering.check(pkg)
    assert "package cycle: domains ↔ envs" in errors, errors


def test_package_cycle_through_a_longer_loop_fails(tmp_path):
    pkg = _copy(tmp_path)
    # roles → envs (top) + envs → tau2 (local) + tau2 → roles (local): one three-package cycle
    _append(pkg / "roles" / "judge.py", "from toolkit.envs import base as _b  # noqa: F401,E402\n")
    _append(pkg / "envs" / "python.py", "def _p():\n    import toolkit.tau2  # noqa: F401\n")
    _append(pkg / "tau2" / "__init__.py", "def _q():\n    from toolkit.roles import judge  # noqa: F401\n")
    cyc = layering.package_cycles(layering.scan(pkg))
    assert any({"envs", "roles", "tau2"} <= set(c) for c in cyc), cyc


def test_function_local_toolkit_imports_within_allowance():
    """Imports sit at the top of the module; function-local imports of toolkit modules are only
    those FUNCTION_LOCAL_ALLOWED names (with a reason) plus, until issue 33's branches are merged,
    at most MAX_FUNCTION_LOCAL others."""
    extra = layering.function_local(layering.scan(ROOT))
    assert len(extra) <= layering.MAX_FUNCTION_LOCAL, \
        f"{len(extra)} function-local toolkit imports (allowed {layering.MAX_FUNCTION_LOCAL}):\n" + \
        "\n".join(map(str, extra))
    assert all(reason.strip() for reason in layering.FUNCTION_LOCAL_ALLOWED.values())
    stale = layering.stale_ignores(ROOT, layering.FUNCTION_LOCAL_ALLOWED)
    assert stale == [], f"allowlist entries no import uses any more: {stale}"


def test_planted_function_local_import_is_counted(tmp_path):
    pkg = _copy(tmp_path)
    before = layering.function_local(layering.scan(pkg))
    line = _append(pkg / "io" / "lines.py", "def _planted():\n    from toolkit.io import base  # noqa: F401\n") + 1
    after = layering.function_local(layering.scan(pkg))
    new = [str(i) for i in after if i.source == "toolkit.io.lines" and i.line == line]
    assert len(after) == len(before) + 1 and new == [f"toolkit.io.lines:{line} function-local import of toolkit.io.base"]
    # a top-level import, or one the allowlist names, is not counted
    allowed = {**layering.FUNCTION_LOCAL_ALLOWED, ("toolkit.io.lines", "toolkit.io.base"): "planted"}
    assert len(layering.function_local(layering.scan(pkg), allowed)) == len(before)
