"""The registry manifest (toolkit.registry): names and --help sections without importing plugin
modules, one module imported per lookup, and a cache that is never trusted when it could be wrong
(a plugin file or an installed distribution changed, a corrupt file). Every case runs fresh
processes with a private TOOLKIT_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from toolkit import registry

ROOT = Path(__file__).resolve().parent.parent
STREAMING = ("gen-plan", "gen-task", "validate-task", "rollout", "verify", "repair", "reflect", "simulate-env",
             "make-verifier", "eval-tau2")


def _env(home: Path, *extra_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    env["TOOLKIT_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, extra_path)])
    return env


def _py(code: str, env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=180, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p


# what a process reports about the registry: every kind's scopes, names and describe() text, and
# whether it got there without the full load
PROBE = """
import json, sys
from toolkit import registry
scopes = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
out = {}
for kind, ss in (scopes or {}).items():
    for s in ss:
        out[f"{kind}/{s}"] = {"names": registry.names(kind, s), "describe": registry.describe(kind, s)}
print(json.dumps({"rows": out, "loaded": sorted(registry._loaded),
                  "flows": sorted(m for m in sys.modules if m.startswith("toolkit.flows")),
                  "errors": [e.line() for e in registry.errors()]}))
"""


def _probe(env: dict, scopes: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(scopes)], capture_output=True, text=True,
                       env=env, timeout=180, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout) | {"stderr": p.stderr}


def _full(env: dict) -> tuple[dict, dict]:
    """(scopes of every kind, {kind/scope: names + describe}) after the full load (writes the manifest)."""
    p = _py("""
        import json
        from toolkit import registry
        registry.load_all()
        scopes = {k: sorted({e.scope for e in registry.all_entries(k)}, key=lambda s: s or "") for k in registry.KINDS}
        rows = {f"{k}/{s}": {"names": registry.names(k, s), "describe": registry.describe(k, s)}
                for k, ss in scopes.items() for s in ss}
        print(json.dumps([scopes, rows]))
        """, env)
    scopes, rows = json.loads(p.stdout)
    return scopes, rows


def test_manifest_answers_like_the_full_load_for_every_kind_and_scope(tmp_path):
    env = _env(tmp_path / "home")
    scopes, full = _full(env)
    assert sum(len(v) for v in scopes.values()) >= len(registry.KINDS)  # strategies alone has 7 scopes
    assert list((tmp_path / "home" / "registry").glob("*.json"))
    warm = _probe(env, scopes)
    assert warm["rows"] == full
    assert warm["loaded"] == [] and warm["flows"] == []  # answered without importing a plugin module


def test_cold_and_disabled_manifest_do_the_full_load(tmp_path):
    env = _env(tmp_path / "home")
    cold = _probe(env, {"strategies": ["gen-task"]})
    assert cold["loaded"] == ["strategies"] and "toolkit.flows.logigen" in cold["flows"]
    off = _probe(env | {"TOOLKIT_REGISTRY_CACHE": "0"}, {"strategies": ["gen-task"]})
    assert off["loaded"] == ["strategies"] and off["rows"] == cold["rows"]
    warm = _probe(env, {"strategies": ["gen-task"]})
    assert warm["loaded"] == [] and warm["rows"] == cold["rows"]


def test_a_lookup_imports_only_the_module_that_registers_the_entry(tmp_path):
    env = _env(tmp_path / "home")
    _full(env)
    p = _py("""
        import json, sys
        from toolkit import registry
        e = registry.get("strategies", "logigen", "gen-task")
        flows = sorted({m.split(".")[2] for m in sys.modules if m.startswith("toolkit.flows.")})
        loaded = sorted(registry._loaded)
        try:
            registry.get("strategies", "no-such", "gen-task")
        except registry.UnknownEntry as err:
            msg = str(err)
        print(json.dumps([e.flow, callable(e.factory), flows, loaded, sorted(registry._loaded), msg]))
        """, env)
    flow, has_factory, flows, loaded, loaded_after, msg = json.loads(p.stdout)
    assert flow == "logigen" and has_factory
    assert flows == ["logigen"] and loaded == []  # eigendata, astra, simia not imported
    # an unknown name: the full load answers, naming every registered one
    assert loaded_after == ["strategies"] and "registered: astra, astra-qa, eigendata, logigen" in msg


def _fake_plugin(where: Path, module: str, body: str, dist: str = "tk-fake-plugin", version: str = "1.0",
                 group: str = "toolkit.exporters", ep: str = "fake") -> None:
    """A distribution on PYTHONPATH: its package and a dist-info declaring one entry point."""
    pkg = where / module
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    di = where / f"{dist.replace('-', '_')}-{version}.dist-info"
    di.mkdir(exist_ok=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (di / "entry_points.txt").write_text(f"[{group}]\n{ep} = {module}\n")


def _bump(path: Path) -> None:
    """A new mtime a test cannot miss (file systems with coarse timestamps)."""
    t = time.time() + 5
    os.utime(path, (t, t))


def test_a_changed_plugin_file_or_entry_point_makes_the_manifest_stale(tmp_path):
    plug = tmp_path / "plugins"
    _fake_plugin(plug, "tkfake_plugin", """
        from toolkit import registry
        registry.register("exporters", "fake-a", lambda row: row, help="first version")
        """)
    env = _env(tmp_path / "home", plug)
    probe = {"exporters": [None]}
    first = _probe(env, probe)
    assert "fake-a" in first["rows"]["exporters/None"]["names"] and first["loaded"] == ["exporters"]
    warm = _probe(env, probe)
    assert warm["loaded"] == [] and warm["rows"] == first["rows"]  # the manifest answered

    # the plugin's code changes: the manifest is not used, the new name shows
    init = plug / "tkfake_plugin" / "__init__.py"
    init.write_text(init.read_text().replace('"fake-a"', '"fake-b"').replace("first version", "second version"))
    _bump(init)
    after = _probe(env, probe)
    assert after["loaded"] == ["exporters"]
    assert "fake-b" in after["rows"]["exporters/None"]["names"]
    assert "fake-a" not in after["rows"]["exporters/None"]["names"]
    assert "second version" in after["rows"]["exporters/None"]["describe"]
    assert _probe(env, probe)["loaded"] == []  # rewritten: warm again

    # another distribution declares an entry point of the group: stale again
    _fake_plugin(plug, "tkfake_other", """
        from toolkit import registry
        registry.register("exporters", "fake-c", lambda row: row, help="another plugin")
        """, dist="tk-fake-other")
    again = _probe(env, probe)
    assert again["loaded"] == ["exporters"] and "fake-c" in again["rows"]["exporters/None"]["names"]
    # and a new version of an installed one (its dist-info is replaced)
    (plug / "tk_fake_other-1.0.dist-info" / "METADATA").rename(plug / "METADATA.tmp")
    (plug / "tk_fake_other-1.0.dist-info").rename(plug / "tk_fake_other-1.1.dist-info")
    (plug / "METADATA.tmp").rename(plug / "tk_fake_other-1.1.dist-info" / "METADATA")
    assert _probe(env, probe)["loaded"] == ["exporters"]


def test_a_broken_plugin_is_reported_from_the_manifest_too(tmp_path):
    plug = tmp_path / "plugins"
    _fake_plugin(plug, "tkfake_broken", "raise ImportError('needs a package that is not installed')\n",
                 dist="tk-fake-broken", ep="broken")
    env = _env(tmp_path / "home", plug)
    cold = _probe(env, {"exporters": [None]})
    line = "toolkit: plugin toolkit.exporters:broken = tkfake_broken (tk-fake-broken) failed to load"
    assert cold["loaded"] == ["exporters"] and line in cold["stderr"] and any(line in e for e in cold["errors"])
    warm = _probe(env, {"exporters": [None]})
    assert warm["loaded"] == []
    assert warm["stderr"].count(line) == 1 and any(line in e for e in warm["errors"])
    # `toolkit plugins` (the full load) reports it once, with the reason
    p = subprocess.run([sys.executable, str(ROOT / "bin" / "toolkit"), "plugins", "--json"], capture_output=True,
                       text=True, env=env, timeout=180, cwd=ROOT)
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and p.stderr.count(line) == 1
    assert [(e["entry_point"], e["package"]) for e in rep["errors"]] == [("broken", "tk-fake-broken")]


@pytest.mark.parametrize("garbage", ["{not json", json.dumps([1, 2]),
                                     json.dumps({"format": 1, "kinds": {"exporters": {"fingerprint": 3}}}),
                                     json.dumps({"format": 1, "kinds": {"exporters": "x"}, "values": 5})])
def test_a_corrupt_manifest_is_ignored_and_rewritten(tmp_path, garbage):
    env = _env(tmp_path / "home")
    path = Path(_py("from toolkit import registry; print(registry._manifest_path())", env).stdout.strip())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(garbage)
    p = _probe(env, {"exporters": [None]})
    assert p["loaded"] == ["exporters"] and {"chat", "openai", "sharegpt", "hermes"} <= set(p["rows"]["exporters/None"]["names"])
    data = json.loads(path.read_text())
    assert data["format"] == registry.MANIFEST_FORMAT and "exporters" in data["kinds"]
    assert _probe(env, {"exporters": [None]})["loaded"] == []
    # a record whose fingerprint holds but whose rows are malformed: ignored too
    data["kinds"]["exporters"]["entries"][0].pop("ep")
    path.write_text(json.dumps(data))
    assert _probe(env, {"exporters": [None]})["loaded"] == ["exporters"]
    # --help with the corrupt file is no crash either
    path.write_text(garbage)
    r = subprocess.run([sys.executable, str(ROOT / "bin" / "sft"), "--help"], capture_output=True, text=True,
                       env=env, timeout=180, cwd=ROOT)
    assert r.returncode == 0 and "hermes" in r.stdout, r.stderr


def test_entries_registered_at_run_time_show_and_are_never_written(tmp_path):
    env = _env(tmp_path / "home")
    _full(env)
    p = _py("""
        import json
        from toolkit import registry
        registry.register("exporters", "dyn-x", lambda row: row, help="registered at run time")
        row = [registry.names("exporters"), registry.describe("exporters"), sorted(registry._loaded),
               registry.lookup("exporters", "dyn-x").help, sorted(registry._loaded)]
        registry.load("exporters")  # the full load writes the manifest again
        print(json.dumps(row + [registry.names("exporters")]))
        """, env)
    names, text, loaded, help_, loaded2, after = json.loads(p.stdout)
    assert "dyn-x" in names and "chat" in names and "registered at run time" in text
    assert loaded == [] and loaded2 == [] and help_ == "registered at run time"
    assert "dyn-x" in after
    fresh = _probe(env, {"exporters": [None]})
    assert fresh["loaded"] == [] and "dyn-x" not in fresh["rows"]["exporters/None"]["names"]


def test_every_builtin_entry_is_registered_by_its_kinds_module_or_a_module_below_it():
    """What lets any process write a true manifest: the module that registers each built-in entry
    is one of its kind's entry-point modules or inside one, whatever was imported first."""
    p = _py("""
        import json
        from toolkit import registry
        registry.load_all()
        mods = {k: [m for kk, _, m in registry.BUILTINS if kk == k] for k in registry.KINDS}
        bad = [(k, e.scope, e.name, e.origin) for k in registry.KINDS for e in registry.all_entries(k)
               if not any(e.origin == m or (e.origin or "").startswith(m + ".") for m in mods[k])]
        print(json.dumps(bad))
        """, _env(Path("/nonexistent-toolkit-home")) | {"TOOLKIT_REGISTRY_CACHE": "0"})
    assert json.loads(p.stdout) == []


def test_help_of_every_streaming_command_imports_no_flow_when_the_manifest_is_warm(tmp_path):
    env = _env(tmp_path / "home")
    code = ("import sys, json\n"
            "name = sys.argv[1]\n"
            "sys.argv = [name, '--help']\n"
            "from toolkit import cli\n"
            "try:\n"
            "    getattr(cli, name.replace('-', '_') + '_main')()\n"
            "except SystemExit:\n"
            "    pass\n"
            "heavy = ('toolkit.flows', 'toolkit.io', 'toolkit.stages', 'pydantic', 'jinja2', 'yaml', 'openai')\n"
            "print('@@' + json.dumps(sorted({m for m in sys.modules if m.startswith(heavy)})))\n")
    cold = {}
    for cmd in STREAMING:
        outs = []
        for _ in range(2):  # cold (fills the manifest), then warm
            p = subprocess.run([sys.executable, "-c", code, cmd], capture_output=True, text=True, env=env,
                               timeout=180, cwd=ROOT)
            assert p.returncode == 0, p.stderr
            help_text, _, mods = p.stdout.rpartition("@@")
            assert "Usage:" in help_text and ("--input" in help_text or cmd == "eval-tau2")
            outs.append((help_text, json.loads(mods)))
        assert outs[0][0] == outs[1][0], cmd  # the same --help, cold or warm
        assert outs[1][1] == [], (cmd, outs[1][1])
        cold[cmd] = outs[0][1]
    # the control: the first command's cold --help did import the flows (and the models' defaults)
    assert "toolkit.flows.logigen" in cold["gen-plan"] and "pydantic" in cold["gen-plan"]


RUN = ("import sys, json\n"
       "sys.argv = ['gen-task'] + sys.argv[1:]\n"
       "from toolkit import cli\n"
       "code = 0\n"
       "try:\n"
       "    cli.gen_task_main()\n"
       "except SystemExit as e:\n"
       "    code = e.code\n"
       "sys.stderr.write('@@' + json.dumps([code, sorted({m.split('.')[2] for m in sys.modules\n"
       "                                            if m.startswith('toolkit.flows.')}),\n"
       "                                    sorted(m for m in sys.modules if m.startswith('toolkit.'))]))\n")


def _gen_task(env: dict, *args: str, stdin: str = "") -> tuple[int, list[str], str, str]:
    p = subprocess.run([sys.executable, "-c", RUN, *args], input=stdin, capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    err, _, tail = p.stderr.rpartition("@@")
    code, flows, mods = json.loads(tail)
    MODULES[:] = mods
    return code, flows, p.stdout, err


MODULES: list[str] = []  # the toolkit modules the last _gen_task imported


def test_a_strategy_command_imports_only_the_chosen_strategys_flow(tmp_path):
    env = _env(tmp_path / "home")
    _full(env)
    args = ("--strategy", "logigen", "--explorer", "symbolic", "-n", "1", "--seed", "3")
    domain = json.dumps({"id": "d", "env": {"backend": "sqlite", "id": "clinic"}}) + "\n"
    code, flows, out, err = _gen_task(env, *args, stdin=domain)
    assert code == 0 and flows == ["logigen"], err
    # gen-task's module and what it uses, not gen-plan's (architect), and no LLM client for a
    # symbolic run (LLMError comes from toolkit.llm.base)
    assert "toolkit.flows.logigen.gentask" in MODULES and "toolkit.flows.logigen.architect" not in MODULES
    assert "toolkit.llm.base" in MODULES and "toolkit.llm.client" not in MODULES, MODULES
    task = json.loads(out.splitlines()[0])
    assert task["flow"] == "logigen" and task["task"]["instruction"]
    # the same record as with the manifest off (every flow imported, the model with every strategy's keys)
    code2, flows2, out2, _ = _gen_task(env | {"TOOLKIT_REGISTRY_CACHE": "0"}, *args, stdin=domain)
    assert code2 == 0 and {"astra", "eigendata", "logigen", "simia"} <= set(flows2)
    strip = lambda s: [{**json.loads(x), "provenance": None} for x in s.splitlines()]  # noqa: E731  (times differ)
    assert strip(out) == strip(out2)

    # a recipe that sets another strategy's key (astra's `augment`): validated as before, by the
    # model with every strategy's keys
    recipe = tmp_path / "r.yaml"
    recipe.write_text("gen-task:\n  augment: [persona]\n")  # a valid axis: a bad one is a usage error (typed)
    code, flows, _, err = _gen_task(env, *args, "--recipe", str(recipe))
    assert code == 0 and "astra" in flows, err
    # a bad value is the same usage error either way
    recipe.write_text("gen-task:\n  max_writes: many\n")
    code, _, _, err = _gen_task(env, *args, "--recipe", str(recipe))
    code2, _, _, err2 = _gen_task(env | {"TOOLKIT_REGISTRY_CACHE": "0"}, *args, "--recipe", str(recipe))
    assert code == code2 == 2 and "max_writes" in err and err == err2


def test_a_reinstall_of_the_toolkit_itself_keeps_the_manifest(tmp_path, monkeypatch):
    """`pip install -e .` rewrites the toolkit's own entry_points.txt (site-packages and the
    checkout's egg-info), mostly unchanged: its content decides, not its mtime. Another
    distribution's rewritten file still makes the manifest stale (its mtime decides)."""
    site = tmp_path / "site"
    own = site / f"{registry.DISTRIBUTION.replace('-', '_')}-0.1.0.dist-info"
    egg = site / f"{registry.DISTRIBUTION.replace('-', '_')}.egg-info"
    other = site / "tk_other-1.0.dist-info"
    for d in (own, egg, other):
        d.mkdir(parents=True)
        (d / "entry_points.txt").write_text("[toolkit.exporters]\nx = some.module\n")
    monkeypatch.setattr(sys, "path", [str(site)])

    def sig() -> str:
        registry._installed_signature.cache_clear()
        return registry._installed_signature()

    try:
        s0 = sig()
        for d in (own, egg):
            f = d / "entry_points.txt"
            f.write_text(f.read_text())  # rewritten, same content
            os.utime(f, ns=(f.stat().st_mtime_ns + 10**9,) * 2)
        assert sig() == s0
        (own / "entry_points.txt").write_text("[toolkit.exporters]\ny = another.module\n")
        s1 = sig()
        assert s1 != s0
        f = other / "entry_points.txt"
        os.utime(f, ns=(f.stat().st_mtime_ns + 10**9,) * 2)
        assert sig() != s1
    finally:
        registry._installed_signature.cache_clear()
