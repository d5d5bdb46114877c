"""The strategy registry: which flow implements which command.

A flow package (`toolkit/flows/<flow>/`) registers one factory per (command, strategy):

    from toolkit.stages.registry import strategy

    @strategy("gen-task", "logigen", help="Set Designer + Explorer + user-view projection")
    def build(cfg: dict, ctx: StageContext):
        async def fn(record: Record) -> Record | list[Record] | None: ...
        return fn

The factory receives the merged config and a `StageContext` (LLM clients per role, the meter)
and returns the per-record function that `toolkit.io.RecordStream` runs: it may return one
record, a list (fan-out: ids must be new and distinct) or None (dropped), and raises
`toolkit.io.StageError` to reject the input line with a reason.

Flow packages are found by importing `toolkit.flows.<name>` for every built-in flow, then every
`toolkit.strategies` entry point (a user's package adds strategies without forking), so a
command's `--help` always lists what the registry holds.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

BUILTIN_FLOWS = ("logigen", "eigendata", "astra", "simia")
ENTRY_POINT_GROUP = "toolkit.strategies"


@dataclass
class StrategyInfo:
    command: str
    name: str
    factory: Callable[[dict, "StageContext"], Any]
    help: str = ""
    flow: str | None = None
    options: Any = None  # a toolkit.options.Options subclass: the strategy's own keys and defaults


_REGISTRY: dict[str, dict[str, StrategyInfo]] = {}
_loaded = False
_load_errors: list[str] = []


def strategy(command: str, name: str, help: str = "", flow: str | None = None, options: Any = None) -> Callable:
    """Decorator registering `factory(cfg, ctx) -> per-record fn` for `command --strategy name`;
    `options` (a toolkit.options.Options subclass) declares the strategy's recipe keys."""

    def deco(factory: Callable) -> Callable:
        fl = flow or (factory.__module__.split(".")[2] if factory.__module__.startswith("toolkit.flows.") else None)
        _REGISTRY.setdefault(command, {})[name] = StrategyInfo(command, name, factory, help, fl, options)
        return factory

    return deco


def load_all() -> None:
    """Import the built-in flow packages and the `toolkit.strategies` entry points (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for flow in BUILTIN_FLOWS:
        try:
            importlib.import_module(f"toolkit.flows.{flow}")
        except ImportError as e:  # a flow whose optional dependency is missing
            _load_errors.append(f"toolkit.flows.{flow}: {e}")
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as e:  # pragma: no cover - a broken plugin must not break the CLI
                _load_errors.append(f"entry point {ep.name}: {e}")
    except Exception:  # pragma: no cover
        pass


def names(command: str) -> list[str]:
    load_all()
    return sorted(_REGISTRY.get(command, {}))


def get(command: str, name: str | None) -> StrategyInfo:
    from toolkit.io import UsageError

    load_all()
    known = _REGISTRY.get(command, {})
    if not known:
        raise UsageError(f"{command}: no strategy is registered" +
                         (f" ({'; '.join(_load_errors)})" if _load_errors else ""))
    if name is None:
        if len(known) == 1:
            return next(iter(known.values()))
        raise UsageError(f"{command}: choose --strategy ({', '.join(sorted(known))})")
    if name not in known:
        raise UsageError(f"{command}: unknown strategy {name!r}; registered: {', '.join(sorted(known))}")
    return known[name]


def options_models(command: str) -> tuple:
    """The options models the registered strategies of `command` declare (sorted by strategy)."""
    load_all()
    rows = _REGISTRY.get(command, {})
    return tuple(rows[n].options for n in sorted(rows) if rows[n].options is not None)


def describe(command: str) -> str:
    """One line per registered strategy, for --help."""
    load_all()
    rows = _REGISTRY.get(command, {})
    return "\n".join(f"  {n:<12} {rows[n].help}" for n in sorted(rows)) or "  (none registered)"


@dataclass
class StageContext:
    """What a strategy factory gets besides the config: the command, the meter and LLM clients."""

    command: str
    cfg: dict
    meter: Any = None
    _clients: dict = field(default_factory=dict)

    def llm(self, role: str | None = None):
        """The LLM client for a role (role-prefixed config keys override plain ones)."""
        from toolkit.config import llm_config
        from toolkit.llm import get_client

        key = role or ""
        if key not in self._clients:
            self._clients[key] = get_client(llm_config(self.cfg, role=role), self.meter)
        return self._clients[key]

    def model_name(self, role: str | None = None) -> str:
        from toolkit.config import llm_config

        return llm_config(self.cfg, role=role).model or "embedded"
