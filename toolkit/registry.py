"""One registry for every pluggable kind; built-ins and third-party packages register the same way.

Kinds (entry-point group `toolkit.<kind>`):

    strategies   per-command strategies (gen-plan, gen-task, validate-task, repair, reflect,
                 make-verifier; scope = the command; `simulate-env:mode` = simulate-env --mode)
    scorers      verify --strategy scorers
    backends     environment backends (record.env.backend)
    domains      environment domains (scope = the backend: bundled sqlite directories, tau2 domains)
    rubrics      judge rubrics (verify --judge-rubric)
    variants     GRPO variants (grpo --variant): presets of GRPOOptions
    exporters    training-row export formats (sft --export)
    distractors  distractor-tool sources (rollout --distractor-mode)

How something gets registered: a module calls `register(kind, name, obj, ...)` (or a decorator
built on it: `toolkit.stages.registry.strategy`, `toolkit.scorers.scorer`,
`toolkit.envs.register_backend`, ...) at import. A package makes its modules known by
declaring them as entry points, one group per kind, each value a *module* (never `module:attr`):

    [project.entry-points."toolkit.scorers"]
    my_scorers = "my_package.scorers"        # importing it registers its scorers

The toolkit declares its own modules the same way in its pyproject.toml; `BUILTINS` below is the
same list (a test keeps the two equal). Loading is lazy and happens once per kind: the first
lookup of a kind imports every module of its group. A module that fails to import is recorded
(`errors()`, `toolkit plugins`) and reported on stderr once; it never breaks the CLI. When the
installed metadata of the toolkit itself lacks a built-in module (an install older than the
checkout: entry points are written at `pip install` time), the module is imported from
`BUILTINS` instead, with one stderr line saying so (and `source: "builtin-fallback"` in
`toolkit plugins`).

This module imports nothing from the toolkit: every layer may register and look up.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from toolkit import __version__, home

DISTRIBUTION = "tooluse-toolkit"
GROUP_PREFIX = "toolkit."

KINDS: dict[str, str] = {
    "strategies": "per-command strategies (scope: the command)",
    "scorers": "verify --strategy scorers",
    "backends": "environment backends (record.env.backend)",
    "domains": "environment domains (scope: the backend)",
    "rubrics": "judge rubrics (verify --judge-rubric)",
    "variants": "GRPO variants (grpo --variant)",
    "exporters": "training-row export formats (sft --export)",
    "distractors": "distractor-tool sources (rollout --distractor-mode)",
    "users": "user simulators (rollout --user-simulator)",
}

_SINGULAR = {"strategies": "strategy", "scorers": "verify scorer", "backends": "environment backend",
             "domains": "domain", "rubrics": "judge rubric", "variants": "GRPO variant",
             "exporters": "export format", "distractors": "distractor source", "users": "user simulator"}

# (kind, entry-point name, module): the toolkit's own plugin modules. pyproject.toml declares
# exactly these under [project.entry-points."toolkit.<kind>"] (tests/test_plugins.py checks).
BUILTINS: tuple[tuple[str, str, str], ...] = (
    ("strategies", "logigen-plan", "toolkit.flows.logigen.architect"),
    ("strategies", "logigen-task", "toolkit.flows.logigen.gentask"),
    ("strategies", "logigen-validate", "toolkit.flows.logigen.validate"),
    ("strategies", "eigendata-plan", "toolkit.flows.eigendata.gen_plan"),
    ("strategies", "eigendata-task", "toolkit.flows.eigendata.gen_task"),
    ("strategies", "eigendata-validate", "toolkit.flows.eigendata.validate_task"),
    ("strategies", "eigendata-verifier", "toolkit.flows.eigendata.make_verifier"),
    ("strategies", "eigendata-repair", "toolkit.flows.eigendata.repair"),
    ("strategies", "eigendata-reflect", "toolkit.flows.eigendata.reflect"),
    ("strategies", "astra-plan", "toolkit.flows.astra.plan"),
    ("strategies", "astra-task", "toolkit.flows.astra.tasks"),
    ("strategies", "astra-qa", "toolkit.flows.astra.qa"),
    ("strategies", "astra-validate", "toolkit.flows.astra.validate"),
    ("strategies", "astra-verifier", "toolkit.flows.astra.envsynth"),
    ("strategies", "simia-validate", "toolkit.flows.simia.prefilter"),
    ("strategies", "simia-task", "toolkit.flows.simia.rl"),
    ("strategies", "simia-repair", "toolkit.flows.simia.rules"),
    ("strategies", "simia-simulate", "toolkit.flows.simia.simulate"),
    ("strategies", "simulate-env", "toolkit.stages.simulate_env"),
    ("scorers", "core", "toolkit.scorers.builtin"),
    ("scorers", "simia", "toolkit.flows.simia.grounding"),
    ("backends", "sqlite", "toolkit.envs.sqlite"),
    ("backends", "python", "toolkit.envs.python"),
    ("backends", "simulated", "toolkit.envs.simulated"),
    ("backends", "tau2", "toolkit.envs.tau2"),
    ("backends", "mcp", "toolkit.envs.mcp"),
    ("domains", "bundled", "toolkit.domains"),
    ("domains", "tau2", "toolkit.envs.tau2"),
    ("rubrics", "core", "toolkit.roles.judge"),
    ("variants", "core", "toolkit.train.grpo.options"),
    ("exporters", "core", "toolkit.formats.rows"),
    ("distractors", "core", "toolkit.episodes.distractors"),
    ("distractors", "astra", "toolkit.flows.astra.mixing"),
    ("users", "core", "toolkit.episodes.users"),
    ("scorers", "bfcl", "toolkit.scorers.bfcl"),
)


@dataclass
class Entry:
    """One registered item. `obj` is what the kind expects (a factory, a scorer function, a preset ...)."""

    kind: str
    name: str
    obj: Any
    help: str = ""
    flow: str | None = None      # the flow it belongs to ("core" for the toolkit's own stages)
    scope: str | None = None     # strategies: the command; domains: the backend
    module: str | None = None    # where it was registered
    package: str | None = None   # the distribution that provides it
    source: str = "import"       # "entry-point" | "builtin-fallback" | "import" (registered by a direct import)
    meta: dict = field(default_factory=dict)
    origin: str | None = None    # the module whose top-level code registered it
    loaded_by: str | None = None  # the entry-point module being imported then (None: a direct import)

    # compatibility with toolkit.stages.registry.StrategyInfo
    @property
    def factory(self) -> Any:
        return self.obj

    @property
    def command(self) -> str | None:
        return self.scope

    @property
    def options(self) -> Any:
        """strategies: the toolkit.options.Options subclass declaring the strategy's keys (or None)."""
        return self.meta.get("options")

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "scope": self.scope, "flow": self.flow,
                "package": self.package, "module": self.module, "source": self.source, "help": self.help,
                **({"meta": _plain(self.meta)} if self.meta else {})}


@dataclass
class LoadError:
    kind: str
    entry_point: str
    module: str
    package: str | None
    error: str

    def line(self) -> str:
        pkg = f" ({self.package})" if self.package else ""
        return (f"toolkit: plugin {GROUP_PREFIX}{self.kind}:{self.entry_point} = {self.module}{pkg} "
                f"failed to load: {self.error}")


class UnknownEntry(LookupError):
    """No such name registered for a kind (the message lists the registered ones)."""


# kind -> scope -> name -> Entry. The strategies table is shared with toolkit.stages.registry._REGISTRY.
_ENTRIES: dict[str, dict[str | None, dict[str, Entry]]] = {k: {} for k in KINDS}
_loaded: set[str] = set()
_in_progress: dict[str, int] = {}  # kind -> id of the thread importing its modules
_errors: list[LoadError] = []
_fallbacks: list[tuple[str, str, str]] = []   # (kind, name, module) imported from BUILTINS
_conflicts: list[str] = []
_lock = threading.RLock()
_loading: list[tuple[str, str, str | None]] = []  # stack of (source, module, package) being imported
_own_eps_cache: list = []
_all_eps_cache: list = []
_fallback_logged: list[bool] = []
_replayed_errors: list[LoadError] = []              # errors shown from a manifest (not from an import)
_replayed_fallbacks: list[tuple[str, str, str]] = []


def _log(msg: str) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.stderr.flush()


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")


@functools.lru_cache(maxsize=1)
def _top_level_dists() -> dict:
    try:
        from importlib.metadata import packages_distributions

        return packages_distributions()
    except Exception:  # pragma: no cover - broken metadata
        return {}


def _package_of(module: str | None) -> str | None:
    """The distribution that provides `module` (None for a module no installed package owns)."""
    if not module:
        return None
    top = module.split(".")[0]
    if top == "toolkit":
        return DISTRIBUTION
    dists = _top_level_dists().get(top)
    if dists:
        return dists[0]
    return _loading[-1][2] if _loading else None


def _flow_of(module: str | None) -> str | None:
    if not module:
        return None
    parts = module.split(".")
    if parts[0] == "toolkit":
        return parts[2] if len(parts) > 2 and parts[1] == "flows" else "core"
    return parts[0]


def register(kind: str, name: str, obj: Any = None, *, help: str = "", flow: str | None = None,
             scope: str | None = None, module: str | None = None, **meta: Any) -> Any:
    """Register `obj` as `name` of `kind` (in `scope` for scoped kinds); returns obj.

    Without obj it is a decorator: `@register("exporters", "csv", help=...)` above the function.
    flow defaults to the registering module's flow (toolkit.flows.<flow>.*), "core" for other
    toolkit modules, else the plugin's top-level package name. Extra keywords land in `meta`.
    A later registration of the same name replaces the earlier one (noted when the package differs).
    """
    _check_kind(kind)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind}: a registered name must be a non-empty string (got {name!r})")
    caller = module or sys._getframe(1).f_globals.get("__name__")

    def add(o: Any) -> Any:
        # functions and classes carry their module; any other object (a preset dict, a rubric
        # instance) belongs to the module that registers it
        mod = module or (o.__module__ if inspect.isfunction(o) or inspect.isclass(o) or inspect.ismethod(o)
                         else caller)
        src = _loading[-1][0] if _loading else "import"
        e = Entry(kind=kind, name=name, obj=o, help=help, flow=flow or _flow_of(mod), scope=scope, module=mod,
                  package=_package_of(mod), source=src, meta=dict(meta),
                  origin=_importing_module(), loaded_by=_loading[-1][1] if _loading else None)
        # no lock here: registration runs inside imports (a lock taken here and in load() could
        # deadlock against the import lock of a module another thread is importing)
        table = _ENTRIES[kind].setdefault(scope, {})
        old = table.get(name)
        if old is not None and old.package != e.package:
            _conflicts.append(f"{kind} {name!r}" + (f" ({scope})" if scope else "")
                              + f": {e.package or e.module} replaces {old.package or old.module}")
        table[name] = e
        return o

    if obj is None:
        return add
    return add(obj)


def _importing_module() -> str | None:
    """The module whose top-level code is running (the nearest `<module>` frame): who registers."""
    f = sys._getframe(2)
    for _ in range(64):
        if f is None:
            return None
        if f.f_code.co_name == "<module>":
            return f.f_globals.get("__name__")
        f = f.f_back
    return None


def unregister(kind: str, name: str, scope: str | None = None) -> None:
    """Remove one entry (tests)."""
    with _lock:
        _ENTRIES[kind].get(scope, {}).pop(name, None)


# ----------------------------------------------------------------------------------------------
# loading


def _own_entry_points() -> list:
    """The toolkit distribution's own `toolkit.*` entry points (empty when it is not installed)."""
    if not _own_eps_cache:
        eps: list = []
        try:
            from importlib.metadata import PackageNotFoundError, distribution

            try:
                eps = [ep for ep in distribution(DISTRIBUTION).entry_points if ep.group.startswith(GROUP_PREFIX)]
            except PackageNotFoundError:
                eps = []
        except Exception as e:  # pragma: no cover - unreadable metadata
            _log(f"toolkit: cannot read the {DISTRIBUTION} metadata ({type(e).__name__}: {e})")
        _own_eps_cache.append(eps)
    return _own_eps_cache[0]


def _third_party_entry_points(kind: str) -> list:
    """Entry points of `toolkit.<kind>` from every other installed distribution."""
    if not _all_eps_cache:  # one scan of the installed metadata per process, for every kind
        by_group: dict[str, list] = {}
        try:
            from importlib.metadata import entry_points

            eps = entry_points()  # (.groups / .select: the same on python 3.10-3.13)
            for group in eps.groups:
                if group.startswith(GROUP_PREFIX):
                    by_group[group] = list(eps.select(group=group))
        except Exception as e:  # pragma: no cover - unreadable metadata
            _log(f"toolkit: cannot read the installed entry points ({type(e).__name__}: {e})")
        _all_eps_cache.append(by_group)
    out = []
    for ep in _all_eps_cache[0].get(GROUP_PREFIX + kind, []):
        dist = getattr(ep, "dist", None)
        dname = getattr(dist, "name", None) if dist is not None else None
        if dname is not None and _norm(dname) == _norm(DISTRIBUTION):
            continue  # the toolkit's own: handled by _own_entry_points (one copy of the metadata)
        out.append(ep)
    return out


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _import_module(kind: str, ep_name: str, module: str, package: str | None, source: str) -> None:
    if ":" in module:
        _record_error(kind, ep_name, module, package,
                      "an entry point value must be a module (its import registers), not module:attr")
        return
    _loading.append((source, module, package))
    try:
        importlib.import_module(module)
    except Exception as e:  # a broken plugin must not break the CLI
        _record_error(kind, ep_name, module, package, f"{type(e).__name__}: {e}")
    finally:
        _loading.pop()


def _record_error(kind: str, ep_name: str, module: str, package: str | None, error: str) -> None:
    if package == DISTRIBUTION and module not in {m for _, _, m in BUILTINS}:
        error += f" (the installed {DISTRIBUTION} metadata names a module this checkout lacks: `pip install -e .`)"
    err = LoadError(kind, ep_name, module, package, error)
    if any(vars(x) == vars(err) for x in _errors):
        return  # already recorded (and reported) in this process: from the manifest, or a second lookup
    _errors.append(err)
    _log(err.line())


def _log_fallback_once() -> None:
    if not _fallback_logged:
        _fallback_logged.append(True)
        _log(f"toolkit: the installed {DISTRIBUTION} metadata does not declare its built-in plugin modules "
             f"(an install older than this checkout?): importing them from toolkit.registry.BUILTINS; "
             f"`pip install -e .` refreshes the entry points")


def load(kind: str) -> None:
    """Import every module of `kind`'s group (once): the toolkit's own, then third-party ones; then
    write the kind's manifest."""
    _check_kind(kind)
    if kind in _loaded:
        return
    with _lock:  # another thread waits here until the kind is complete
        if kind in _loaded or _in_progress.get(kind) == threading.get_ident():
            return  # (a module that looks its own kind up while being imported sees a partial table)
        _in_progress[kind] = threading.get_ident()
        eps = None
        try:
            # what the manifest replayed is replaced by what this load finds
            _errors[:] = [e for e in _errors if not (e.kind == kind and e in _replayed_errors)]
            _fallbacks[:] = [f for f in _fallbacks if not (f[0] == kind and f in _replayed_fallbacks)]
            eps = _load(kind)
        finally:
            _loaded.add(kind)
            _in_progress.pop(kind, None)
        _manifest_write(kind, eps)


def _load(kind: str) -> list[tuple[str, str, str | None, str]]:
    """Import the kind's modules; the (entry-point name, module, package, source) of each."""
    eps: list[tuple[str, str, str | None, str]] = []
    own = [ep for ep in _own_entry_points() if ep.group == GROUP_PREFIX + kind]
    declared = {ep.value for ep in own}
    for ep in own:
        eps.append((ep.name, ep.value, DISTRIBUTION, "entry-point"))
        _import_module(kind, ep.name, ep.value, DISTRIBUTION, "entry-point")
    missing = [(n, m) for k, n, m in BUILTINS if k == kind and m not in declared]
    if missing:
        _log_fallback_once()
        for n, m in missing:
            _fallbacks.append((kind, n, m))
            eps.append((n, m, DISTRIBUTION, "builtin-fallback"))
            _import_module(kind, n, m, DISTRIBUTION, "builtin-fallback")
    for ep in _third_party_entry_points(kind):
        dist = getattr(ep, "dist", None)
        pkg = getattr(dist, "name", None) if dist is not None else None
        eps.append((ep.name, ep.value, pkg, "entry-point"))
        _import_module(kind, ep.name, ep.value, pkg, "entry-point")
    return eps


# ----------------------------------------------------------------------------------------------
# the manifest: names, help and providers of each kind without importing the plugin modules

MANIFEST_FORMAT = 1
CACHE_ENV = "TOOLKIT_REGISTRY_CACHE"  # 0/off/false/no: no manifest (always the full load)
_manifest_state: dict = {}            # "data": the file's content ({} when absent/unreadable), "path"
_manifest_kinds: dict[str, dict | None] = {}  # kind -> its verified record (None: stale or absent)
_tree_sigs: dict[str, str] = {}
_OWN_EGG = DISTRIBUTION.replace("-", "_") + "."  # tooluse_toolkit.egg-info (a checkout's) / -0.1.0.dist-info


def _manifest_on() -> bool:
    return os.environ.get(CACHE_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def _manifest_path() -> str:
    """$TOOLKIT_HOME/registry/<install>.json: one file per interpreter prefix and toolkit checkout
    (two venvs or two checkouts never overwrite each other's)."""
    if "path" not in _manifest_state:
        import hashlib

        here = os.path.dirname(os.path.abspath(__file__))
        key = hashlib.sha256(f"{sys.prefix}\0{os.path.realpath(sys.executable)}\0{here}".encode()).hexdigest()[:20]
        _manifest_state["path"] = os.path.join(home(), "registry", f"{key}.json")
    return _manifest_state["path"]


def _digest(parts: list) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _installed_signature() -> str:
    """Python, the toolkit's version and location, and every distribution on sys.path that could
    declare entry points: its metadata directory's name (name and version) and its
    entry_points.txt's size and mtime (the toolkit's own: its content's sha256, since every
    editable reinstall rewrites it, mostly unchanged). Nothing is parsed or imported."""
    import hashlib

    parts: list = [MANIFEST_FORMAT, sys.version, __version__, os.path.dirname(os.path.abspath(__file__))]
    for d in sys.path:
        try:
            with os.scandir(d or ".") as it:
                metas = sorted(x.name for x in it if x.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue  # a zip, a missing directory, a path hook
        if not metas:
            continue
        rows = []
        for m in metas:
            f = os.path.join(d or ".", m, "entry_points.txt")
            try:
                if _norm(m).startswith(_norm(DISTRIBUTION) + "-") or m.startswith(_OWN_EGG):
                    # the toolkit's own: every `pip install -e .` rewrites it (the checkout's
                    # egg-info too), mostly unchanged: its content decides, not its mtime
                    with open(f, "rb") as fh:
                        rows.append([m, hashlib.sha256(fh.read()).hexdigest()])
                else:
                    st = os.stat(f)
                    rows.append([m, st.st_size, st.st_mtime_ns])
            except OSError:
                rows.append([m])
        parts.append([os.path.abspath(d or "."), rows])
    return _digest(parts)


def _tree_signature(root: str) -> str:
    """Every file under a plugin package's directory (or the module file): relative name, size, mtime."""
    if root not in _tree_sigs:
        rows: list = []
        if os.path.isfile(root):
            st = os.stat(root)
            rows.append([os.path.basename(root), st.st_size, st.st_mtime_ns])
        else:
            stack = [root]
            while stack:
                d = stack.pop()
                try:
                    with os.scandir(d) as it:
                        for x in it:
                            if x.is_dir(follow_symlinks=False):
                                if x.name != "__pycache__" and not x.name.startswith("."):
                                    stack.append(x.path)
                            elif not x.name.endswith((".pyc", ".pyo")):
                                st = x.stat()
                                rows.append([os.path.relpath(x.path, root), st.st_size, st.st_mtime_ns])
                except OSError:
                    rows.append([os.path.relpath(d, root), None])
            rows.sort()
        _tree_sigs[root] = _digest([root, rows])
    return _tree_sigs[root]


def _fingerprint(roots: list[str]) -> str:
    return _digest([_installed_signature(), [_tree_signature(r) for r in sorted(roots)]])


def _package_root(module: str) -> str | None:
    """The directory of `module`'s top-level package (its file for a plain module), without importing."""
    top = module.split(".")[0]
    m = sys.modules.get(top)
    paths = list(getattr(m, "__path__", None) or []) if m is not None else []
    if paths:
        return os.path.abspath(paths[0])
    f = getattr(m, "__file__", None) if m is not None else None
    if f:
        return os.path.abspath(f)
    try:
        import importlib.util

        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return os.path.abspath(next(iter(spec.submodule_search_locations)))
    return os.path.abspath(spec.origin) if spec.origin and os.path.exists(spec.origin) else None


def _provider(e: Entry, eps: list[tuple[str, str, str | None, str]]) -> tuple | None:
    """The entry point of the kind whose import registers `e`: the one whose module is, or is a
    package above, the module that registered it (else the one being imported then); None for a
    run-time registration or one made by another kind's module."""
    for cand in (e.origin, e.loaded_by):
        best = None
        for ep in eps:
            mod = ep[1]
            if cand and (cand == mod or cand.startswith(mod + ".")) and (best is None or len(mod) > len(best[1])):
                best = ep
        if best is not None:
            return best
    return None


def _manifest_write(kind: str, eps: list | None) -> None:
    """Record the fully loaded kind (never raises: a cache that cannot be written is no error)."""
    if eps is None or not _manifest_on():
        return
    try:
        rows = []
        for scope in sorted(_ENTRIES[kind], key=lambda x: x or ""):
            for name, e in sorted(_ENTRIES[kind][scope].items()):
                ep = _provider(e, eps)
                if ep is not None:
                    rows.append({"scope": scope, "name": name, "help": e.help, "flow": e.flow,
                                 "ep": list(ep)})
        roots = sorted({r for ep in eps if ":" not in ep[1] for r in [_package_root(ep[1])] if r})
        rec = {"fingerprint": _fingerprint(roots), "roots": roots, "eps": [list(x) for x in eps],
               "entries": rows, "errors": [vars(x) for x in _errors if x.kind == kind],
               "fallbacks": [list(f) for f in _fallbacks if f[0] == kind]}
        _manifest_kinds[kind] = rec
        _manifest_store("kinds", kind, rec)
    except Exception:  # a plugin with odd metadata: just no cache
        pass


def _manifest_store(section: str, key: str, rec: dict) -> None:
    """Set data[section][key] = rec in the manifest file (atomically; never raises)."""
    tmp = None
    try:
        path = _manifest_path()
        data = _manifest_read()
        data = {k: dict(v) for k, v in data.items() if isinstance(v, dict)} if data.get("format") == MANIFEST_FORMAT else {}
        data.setdefault(section, {})[key] = rec
        data["format"] = MANIFEST_FORMAT  # type: ignore[assignment]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
        _manifest_state["data"] = data
    except Exception:  # read-only home, full disk: no cache, no error
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def cached(name: str, compute: Any) -> Any:
    """`compute()` (a JSON value derived from the toolkit's own code, e.g. --help's option defaults),
    kept in the manifest with the fingerprint of the install and the toolkit's files: a process
    whose fingerprint matches reads it instead of importing what computes it. A value that does
    not survive JSON unchanged is returned and not kept."""
    if not _manifest_on():
        return compute()
    toolkit_root = os.path.dirname(os.path.abspath(__file__))
    try:
        fp = _fingerprint([toolkit_root])
        data = _manifest_read()
        rec = (data.get("values") or {}).get(name) if data.get("format") == MANIFEST_FORMAT else None
        if isinstance(rec, dict) and rec.get("fingerprint") == fp and "value" in rec:
            return rec["value"]
    except Exception:  # a malformed manifest: compute
        fp = None
    value = compute()
    try:
        if fp is not None and json.loads(json.dumps(value)) == value:
            _manifest_store("values", name, {"fingerprint": fp, "value": value})
    except (TypeError, ValueError):
        pass
    return value


def _manifest_read() -> dict:
    if "data" not in _manifest_state:
        data: dict = {}
        try:
            with open(_manifest_path(), encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict):
                data = {}
        except Exception:  # absent, unreadable, corrupt: as if there were none
            data = {}
        _manifest_state["data"] = data
    return _manifest_state["data"]


def _manifest(kind: str) -> dict | None:
    """The kind's manifest record when it is still true for this install, else None."""
    if kind in _manifest_kinds:
        return _manifest_kinds[kind]
    rec = None
    if _manifest_on():
        try:
            data = _manifest_read()
            cand = (data.get("kinds") or {}).get(kind) if data.get("format") == MANIFEST_FORMAT else None
            if (isinstance(cand, dict) and isinstance(cand.get("entries"), list)
                    and all(_row_ok(r) for r in cand["entries"])
                    and cand.get("fingerprint") == _fingerprint([str(r) for r in cand.get("roots") or []])):
                rec = cand
                _replay(kind, rec)
        except Exception:  # a malformed record: a full load instead
            rec = None
    _manifest_kinds[kind] = rec
    return rec


def _row_ok(r: Any) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("help"), str)
            and isinstance(r.get("scope"), (str, type(None))) and isinstance(r.get("flow"), (str, type(None)))
            and isinstance(r.get("ep"), list) and len(r["ep"]) == 4 and isinstance(r["ep"][1], str))


def _replay(kind: str, rec: dict) -> None:
    """The kind's load errors and built-in fallbacks, reported as the full load would."""
    fbs = [tuple(f) for f in rec.get("fallbacks") or []]
    errs = [LoadError(**e) for e in rec.get("errors") or []]
    if fbs:
        _log_fallback_once()
    for f in fbs:
        if f not in _fallbacks:
            _fallbacks.append(f)  # type: ignore[arg-type]
            _replayed_fallbacks.append(f)  # type: ignore[arg-type]
    for err in errs:
        if not any(vars(x) == vars(err) for x in _errors):
            _errors.append(err)
            _replayed_errors.append(err)
            _log(err.line())


def _manifest_rows(kind: str, scope: str | None) -> dict[str, dict] | None:
    """{name: manifest row} of a kind's scope, or None when the manifest cannot answer."""
    rec = _manifest(kind)
    if rec is None:
        return None
    return {r["name"]: r for r in rec["entries"] if r.get("scope") == scope}


def load_all() -> None:
    for kind in KINDS:
        load(kind)


# ----------------------------------------------------------------------------------------------
# lookups


def entries(kind: str, scope: str | None = None) -> dict[str, Entry]:
    """{name: Entry} of a kind (in a scope), loading the kind first."""
    load(kind)
    return dict(_ENTRIES[kind].get(scope, {}))


def all_entries(kind: str) -> list[Entry]:
    """Every entry of a kind across scopes, sorted by (scope, name) (used by report())."""
    load(kind)
    return [e for s in sorted(_ENTRIES[kind], key=lambda x: x or "") for _, e in sorted(_ENTRIES[kind][s].items())]


def names(kind: str, scope: str | None = None) -> list[str]:
    """Registered names of a kind (in a scope): from the manifest when it is current (no plugin
    module imported), else after the full load."""
    _check_kind(kind)
    if kind not in _loaded:
        rows = _manifest_rows(kind, scope)
        if rows is not None:
            return sorted(set(rows) | set(_ENTRIES[kind].get(scope, {})))
    return sorted(entries(kind, scope))


def lookup(kind: str, name: str, scope: str | None = None) -> Entry | None:
    """The entry or None (cheap after the first call: for per-record paths). Before the kind is
    fully loaded, a current manifest names the one module to import."""
    if kind not in _loaded and _in_progress.get(kind) != threading.get_ident():
        e = _manifest_lookup(kind, name, scope)
        if e is not None:
            return e
        load(kind)
    return _ENTRIES[kind].get(scope, {}).get(name)


def _manifest_lookup(kind: str, name: str, scope: str | None) -> Entry | None:
    _check_kind(kind)
    rows = _manifest_rows(kind, scope)
    if rows is None:
        return None
    row = rows.get(name)
    if row is None:  # no plugin registers it: a run-time registration, or unknown (the full load says)
        return _ENTRIES[kind].get(scope, {}).get(name)
    ep_name, module, package, source = row["ep"]
    with _lock:
        if kind not in _loaded:
            _import_module(kind, ep_name, module, package, source)
    return _ENTRIES[kind].get(scope, {}).get(name)  # None: the module no longer registers it


def get(kind: str, name: str, scope: str | None = None, what: str | None = None) -> Entry:
    """The entry; UnknownEntry naming the registered ones (and any load errors of the kind) when absent."""
    e = lookup(kind, name, scope)
    if e is None:
        known = names(kind, scope)
        errs = [x.line() for x in _errors if x.kind == kind]
        what = what or _SINGULAR.get(kind, kind)
        raise UnknownEntry(f"unknown {what} {name!r}; registered: "
                           f"{', '.join(known) or '(none)'}" + (f" (load errors: {'; '.join(errs)})" if errs else ""))
    return e


def describe(kind: str, scope: str | None = None, width: int = 12) -> str:
    """One line per entry for --help: `name (flow: x) — help` (from the manifest when current)."""
    _check_kind(kind)
    rows: dict[str, Any] | None = _manifest_rows(kind, scope) if kind not in _loaded else None
    if rows is None:
        rows = {n: {"flow": e.flow, "help": e.help} for n, e in entries(kind, scope).items()}
    else:
        rows = dict(rows) | {n: {"flow": e.flow, "help": e.help} for n, e in _ENTRIES[kind].get(scope, {}).items()}
    return "\n".join(f"  {n:<{width}} (flow: {rows[n]['flow'] or '-'}) — {rows[n]['help']}".rstrip(" —")
                     for n in sorted(rows)) or "  (none registered)"


def errors() -> list[LoadError]:
    return list(_errors)


def report() -> dict:
    """Everything `toolkit plugins --json` prints (loads every kind)."""
    load_all()
    return {"kinds": {k: [e.as_dict() for e in all_entries(k)] for k in KINDS},
            "errors": [vars(e) | {"line": e.line()} for e in _errors],
            "builtin_fallback": [{"kind": k, "name": n, "module": m} for k, n, m in _fallbacks],
            "conflicts": list(_conflicts)}

