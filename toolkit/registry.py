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
built on it: `toolkit.stages.registry.strategy`, `toolkit.stages.verify.scorer`,
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
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

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
    ("strategies", "logigen", "toolkit.flows.logigen"),
    ("strategies", "eigendata", "toolkit.flows.eigendata"),
    ("strategies", "astra", "toolkit.flows.astra"),
    ("strategies", "simia", "toolkit.flows.simia"),
    ("strategies", "simulate-env", "toolkit.stages.simulate_env"),
    ("scorers", "core", "toolkit.stages.verify.scorers"),
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
    ("distractors", "core", "toolkit.stages.rollout"),
    ("distractors", "astra", "toolkit.flows.astra.mixing"),
    ("users", "core", "toolkit.stages.users"),
    ("scorers", "bfcl", "toolkit.stages.verify.bfcl"),
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
                  package=_package_of(mod), source=src, meta=dict(meta))
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
    _errors.append(err)
    _log(err.line())


def load(kind: str) -> None:
    """Import every module of `kind`'s group (once): the toolkit's own, then third-party ones."""
    _check_kind(kind)
    if kind in _loaded:
        return
    with _lock:  # another thread waits here until the kind is complete
        if kind in _loaded or _in_progress.get(kind) == threading.get_ident():
            return  # (a module that looks its own kind up while being imported sees a partial table)
        _in_progress[kind] = threading.get_ident()
        try:
            _load(kind)
        finally:
            _loaded.add(kind)
            _in_progress.pop(kind, None)


def _load(kind: str) -> None:
    own = [ep for ep in _own_entry_points() if ep.group == GROUP_PREFIX + kind]
    declared = {ep.value for ep in own}
    for ep in own:
        _import_module(kind, ep.name, ep.value, DISTRIBUTION, "entry-point")
    missing = [(n, m) for k, n, m in BUILTINS if k == kind and m not in declared]
    if missing:
        if not _fallbacks:
            _log(f"toolkit: the installed {DISTRIBUTION} metadata does not declare its built-in plugin modules "
                 f"(an install older than this checkout?): importing them from toolkit.registry.BUILTINS; "
                 f"`pip install -e .` refreshes the entry points")
        for n, m in missing:
            _fallbacks.append((kind, n, m))
            _import_module(kind, n, m, DISTRIBUTION, "builtin-fallback")
    for ep in _third_party_entry_points(kind):
        dist = getattr(ep, "dist", None)
        _import_module(kind, ep.name, ep.value, getattr(dist, "name", None) if dist is not None else None,
                       "entry-point")


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
    return sorted(entries(kind, scope))


def lookup(kind: str, name: str, scope: str | None = None) -> Entry | None:
    """The entry or None (cheap after the first call: for per-record paths)."""
    if kind not in _loaded:
        load(kind)
    return _ENTRIES[kind].get(scope, {}).get(name)


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
    """One line per entry for --help: `name (flow: x) — help`."""
    rows = entries(kind, scope)
    return "\n".join(f"  {n:<{width}} (flow: {rows[n].flow or '-'}) — {rows[n].help}".rstrip(" —")
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

