"""The one registry (toolkit.registry): entry-point groups, lazy loading, broken plugins, the
built-in fallback, `toolkit plugins`, and a third-party plugin package installed with
`pip install -e` (tests/plugins/toolkit_demo_plugin) whose strategy, backend, scorer and export
format show up in --help and run in a pipeline."""

from __future__ import annotations

import ast
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit import cli, registry

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "tests" / "plugins" / "toolkit_demo_plugin"


def test_pyproject_declares_exactly_the_builtin_modules():
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    declared = {(g.removeprefix("toolkit."), n, m) for g, table in eps.items() if g.startswith("toolkit.")
                for n, m in table.items()}
    assert declared == set(registry.BUILTINS)
    assert {k for k, _, _ in registry.BUILTINS} == set(registry.KINDS)


def test_every_kind_lists_its_builtins_with_flow_and_package():
    rep = registry.report()
    by = {k: {(e["scope"], e["name"]): e for e in rows} for k, rows in rep["kinds"].items()}
    assert {("gen-task", "logigen"), ("gen-plan", "astra"), ("repair", "rules"),
            ("simulate-env:mode", "trajectory"), ("simulate-env:mode", "call")} <= set(by["strategies"])
    assert by["strategies"][("gen-task", "logigen")]["flow"] == "logigen"
    assert by["strategies"][("simulate-env:mode", "trajectory")]["flow"] == "simia"
    assert {n for _, n in by["scorers"]} >= {"state_diff", "actions", "f1", "code", "judge", "tau2", "grounding"}
    assert by["scorers"][(None, "grounding")]["flow"] == "simia"
    assert by["scorers"][(None, "state_diff")]["flow"] == "core"
    assert {n for _, n in by["backends"]} >= {"sqlite", "python", "simulated", "tau2"}
    assert {("sqlite", "airline"), ("sqlite", "clinic"), ("tau2", "telecom")} <= set(by["domains"])
    assert {n for _, n in by["rubrics"]} >= {"sea", "simia", "astra", "eigendata"}
    assert {n for _, n in by["variants"]} >= {"grpo", "eigendata", "astra", "ta-grpo", "simia"}
    assert by["variants"][(None, "ta-grpo")]["flow"] == "logigen"
    assert {n for _, n in by["exporters"]} >= {"chat", "openai", "sharegpt", "hermes"}
    assert {n for _, n in by["distractors"]} >= {"random", "astra-random", "bands"}
    assert by["distractors"][(None, "bands")]["flow"] == "astra"
    for rows in rep["kinds"].values():
        for e in rows:
            if e["module"].startswith("toolkit."):
                assert e["package"] == "tooluse-toolkit", e


def test_toolkit_plugins_command_table_and_json():
    r = CliRunner().invoke(cli.toolkit_group, ["plugins", "--json"])
    rep = json.loads(r.stdout)
    assert r.exit_code == (1 if rep["errors"] else 0)
    assert not [e for e in rep["errors"] if e["package"] == "tooluse-toolkit"]  # every built-in module imports
    assert set(rep["kinds"]) == set(registry.KINDS)
    t = CliRunner().invoke(cli.toolkit_group, ["plugins"])
    for kind in registry.KINDS:
        assert f"{kind} (" in t.stdout
    assert "gen-task: logigen" in t.stdout and "flow=logigen" in t.stdout and "package=tooluse-toolkit" in t.stdout


def test_help_reads_the_registry_and_names_the_flow():
    out = CliRunner().invoke(cli.gen_task, ["--help"]).output
    assert "logigen      (flow: logigen) — LOGIGEN" in out
    out = CliRunner().invoke(cli.verify, ["--help"]).output
    assert "grounding    (flow: simia)" in out and "state_diff   (flow: core)" in out
    assert "eigendata    (flow: eigendata)" in out  # judge rubrics section
    assert "[astra|eigendata|sea|simia]" in out  # --judge-rubric choice
    out = CliRunner().invoke(cli.sft, ["--help"]).output
    assert "[chat|hermes|openai|sharegpt]" in out.replace("\n", "").replace(" ", "")
    out = CliRunner().invoke(cli.grpo, ["--help"]).output
    assert "ta-grpo      (flow: logigen)" in out
    out = CliRunner().invoke(cli.rollout, ["--help"]).output
    assert "bands        (flow: astra)" in out and "sqlite       (flow: core)" in out
    out = CliRunner().invoke(cli.simulate_env, ["--help"]).output
    assert "trajectory   (flow: simia)" in out


def test_a_registered_scorer_runs_in_verify_and_unknown_names_list_the_registered():
    from toolkit import scorers
    from toolkit.io import UsageError

    @scorers.scorer("test-always", verdict_kind="actions", help="always passes")
    def always(s):
        return scorers.Outcome(passed=True, score=0.5, scores={"n_calls": len(s.calls)})

    try:
        rec = {"id": "r1", "trajectories": [{"id": "t0", "messages": [{"role": "user", "content": "hi"}]}]}
        r = CliRunner().invoke(cli.verify, ["--strategy", "test-always"], input=json.dumps(rec) + "\n")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        v = out["verdicts"][0]
        assert (v["name"], v["kind"], v["score"]) == ("test-always", "actions", 0.5)
        assert out["trajectories"][0]["scores"]["test-always"] == {"n_calls": 0}
        with pytest.raises(UsageError, match="test-always"):
            scorers.Plan.of(scorers.verify_options({"strategy": ["nope"]}))
    finally:
        registry.unregister("scorers", "test-always")
    with pytest.raises(ValueError, match="verdict_kind"):
        scorers.scorer("bad-kind", verdict_kind="nonsense")


def test_broken_plugin_module_is_recorded_not_raised(capsys):
    n = len(registry.errors())
    registry._import_module("exporters", "ghost", "toolkit_no_such_module_xyz", "ghost-pkg", "entry-point")
    registry._import_module("exporters", "attr", "toolkit.train.export:to_openai", "ghost-pkg", "entry-point")
    errs = registry.errors()[n:]
    assert [e.entry_point for e in errs] == ["ghost", "attr"]
    assert "ModuleNotFoundError" in errs[0].error and "must be a module" in errs[1].error
    err = capsys.readouterr().err
    assert "toolkit.exporters:ghost = toolkit_no_such_module_xyz (ghost-pkg) failed to load" in err
    registry._errors[n:] = []


def test_fallback_to_builtins_when_the_installed_metadata_lacks_the_groups():
    """An install older than the checkout (no toolkit.* entry points in its metadata): the
    built-in modules are imported from registry.BUILTINS, with one stderr line saying so."""
    code = ("from toolkit import registry\n"
            "registry._own_eps_cache.append([])\n"  # what an old install's metadata gives
            "import json; print(json.dumps(registry.report()))\n")
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(ROOT)
    env["TOOLKIT_REGISTRY_CACHE"] = "0"  # a faked old install must not write (or read) this install's manifest
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert p.stderr.count("does not declare its built-in plugin modules") == 1
    assert {(f["kind"], f["module"]) for f in rep["builtin_fallback"]} == {(k, m) for k, _, m in registry.BUILTINS}
    sources = {e["source"] for rows in rep["kinds"].values() for e in rows if e["package"] == "tooluse-toolkit"}
    assert sources == {"builtin-fallback"}
    assert {e["name"] for e in rep["kinds"]["exporters"]} >= {"chat", "openai", "sharegpt", "hermes"}


def test_loading_is_lazy_per_kind_and_once():
    """Looking up exporters imports the exporters' modules, not the flows; a second lookup imports nothing."""
    code = ("import sys\n"
            "from toolkit import registry\n"
            "assert 'chat' in registry.entries('exporters')\n"  # the full load (names may read the manifest)
            "loaded = set(sys.modules)\n"
            "registry.names('exporters'); registry.entries('exporters')\n"
            "print(sorted(m for m in loaded if m.startswith('toolkit.flows')), sorted(set(sys.modules) - loaded))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[] []"


def test_core_stages_never_import_a_flow():
    bad = []
    for path in sorted((ROOT / "toolkit" / "stages").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}: {m}" for m in mods if m.startswith("toolkit.flows")]
    assert not bad


# ----------------------------------------------------------------------------------------------
# a third-party plugin package, installed with pip install -e


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory):
    """A throwaway venv that sees this interpreter's packages (a .pth line), with the toolkit and
    the demo plugin installed editable (so both carry fresh entry-point metadata)."""
    import importlib.util

    missing = [m for m in ("pip", "setuptools") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} in the test interpreter")
    venv = tmp_path_factory.mktemp("plugin") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    sp = _site_packages(venv)
    assert sp.is_dir()
    ours = [p for p in site.getsitepackages() if os.path.isdir(p)]
    (sp / "_host_packages.pth").write_text("".join(p + "\n" for p in ours))
    p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-build-isolation", "--disable-pip-version-check",
                        "-e", str(ROOT), "-e", str(PLUGIN)],
                       capture_output=True, text=True, timeout=300, env=_env(venv))
    assert p.returncode == 0, p.stdout + p.stderr
    return venv


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TOOLKIT_")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def _run(venv: Path, args: list[str], stdin: str = "", cwd: Path | None = None):
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], input=stdin, capture_output=True, text=True,
                          env=_env(venv), timeout=120, cwd=cwd or venv)


def test_plugin_package_appears_in_help_and_plugins(plugin_venv):
    v = plugin_venv
    r = _run(v, ["gen-task", "--help"])
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no fallback line, no load error for strategies
    assert "demo         (flow: demo) — counter tasks" in r.stdout
    r = _run(v, ["verify", "--help"])
    assert "demo-scorer  (flow: toolkit_demo_plugin) — demo plugin" in r.stdout
    r = _run(v, ["sft", "--help"])
    assert "demo         (flow: toolkit_demo_plugin)" in r.stdout
    r = _run(v, ["rollout", "--help"])
    assert "demo-counter (flow: toolkit_demo_plugin)" in r.stdout
    assert r.returncode == 0 and "toolkit_demo_plugin.broken" in r.stderr  # the broken distractor source

    r = _run(v, ["toolkit", "plugins", "--json"])
    assert r.returncode == 1, r.stderr  # a plugin failed to load
    rep = json.loads(r.stdout)
    ent = {(k, e["scope"], e["name"]): e for k, rows in rep["kinds"].items() for e in rows}
    for key in (("strategies", "gen-task", "demo"), ("scorers", None, "demo-scorer"),
                ("backends", None, "demo-counter"), ("exporters", None, "demo")):
        assert ent[key]["package"] == "toolkit-demo-plugin" and ent[key]["source"] == "entry-point", ent[key]
    # the toolkit's own modules came through its entry points, not the fallback list
    assert rep["builtin_fallback"] == []
    assert {e["source"] for e in ent.values() if e["package"] == "tooluse-toolkit"} == {"entry-point"}
    assert [(e["kind"], e["entry_point"], e["package"]) for e in rep["errors"]] == \
        [("distractors", "broken", "toolkit-demo-plugin")]
    t = _run(v, ["toolkit", "plugins"])
    assert "load errors: 1" in t.stdout and "package=toolkit-demo-plugin" in t.stdout


def test_plugin_package_runs_in_a_pipeline(plugin_venv, tmp_path):
    v = plugin_venv
    seeds = "".join(json.dumps({"id": f"s{t}", "extra": {"target": t}}) + "\n" for t in (13, 4))
    r = _run(v, ["gen-task", "--strategy", "demo"], seeds)
    assert r.returncode == 0, r.stderr
    tasks = [json.loads(x) for x in r.stdout.splitlines()]
    assert [t["env"]["backend"] for t in tasks] == ["demo-counter"] * 2
    assert [[a["arguments"]["n"] for a in t["task"]["ground_truth"]["actions"]] for t in tasks] == [[10, 3], [4]]

    r = _run(v, ["rollout", "--agent", "replay"], r.stdout)
    assert r.returncode == 0, r.stderr
    assert "toolkit_demo_plugin.broken" in r.stderr  # reported, not fatal
    rolled = [json.loads(x) for x in r.stdout.splitlines()]
    # the tool results come from the plugin's counter environment
    last_tool = [m for m in rolled[0]["trajectories"][0]["messages"] if m["role"] == "tool"][-1]
    assert json.loads(last_tool["content"]) == {"value": 13}

    # a trajectory that overshoots: the plugin scorer and state_diff (replayed on the plugin env) fail it
    bad = json.loads(json.dumps(rolled[1]))
    call = next(m for m in bad["trajectories"][0]["messages"] if m.get("tool_calls"))
    call["tool_calls"][0]["function"]["arguments"] = json.dumps({"n": 5})
    bad["id"] = "s4-task-bad"
    inp = "".join(json.dumps(x) + "\n" for x in rolled + [bad])
    r = _run(v, ["verify", "--strategy", "demo-scorer", "--strategy", "state_diff"], inp)
    assert r.returncode == 0, r.stderr
    verified = {x["id"]: x for x in map(json.loads, r.stdout.splitlines())}
    for rid, want in (("s13-task", True), ("s4-task", True), ("s4-task-bad", False)):
        vs = {v_["name"]: v_ for v_ in verified[rid]["verdicts"]}
        assert vs["demo-scorer"]["kind"] == "rule" and vs["demo-scorer"]["passed"] is want, vs
        assert vs["state_diff"]["passed"] is want, vs
    assert verified["s4-task-bad"]["trajectories"][0]["scores"]["demo-scorer"] == {"expected": 4, "reached": 5}

    r = _run(v, ["sft", "--export", "demo", "--filter", "passed"], r.stdout)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows == [{"prompt": "Bring the counter from 0 to 13.", "calls": ["add", "add"], "reward": 1.0},
                    {"prompt": "Bring the counter from 0 to 4.", "calls": ["add"], "reward": 1.0}]
