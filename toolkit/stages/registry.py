"""The strategy registry: which flow implements which command.

A flow package (`toolkit/flows/<flow>/`) registers one factory per (command, strategy):

    from toolkit.stages.registry import strategy

    @strategy("gen-task", "logigen", options=GenTaskOptions, help="Set Designer + Explorer + ...")
    def build(opts: GenTaskOptions, ctx: StageContext):
        async def fn(record: Record) -> Record | list[Record] | None: ...
        return fn

The factory receives its own typed options (the `options=` model, defaults filled in; the
command's model when the strategy declares none) and a `StageContext`: the command's whole typed
options (`ctx.opts`: IO keys, LLM keys per role), LLM clients per role, the meter. It returns the per-record function that `toolkit.io.RecordStream` runs: it may return one
record, a list (fan-out: ids must be new and distinct) or None (dropped), and raises
`toolkit.io.StageError` to reject the input line with a reason.

Strategies live in the one registry (`toolkit.registry`, kind "strategies", scope = the command):
flow packages are imported through the `toolkit.strategies` entry points (the toolkit's own
flows included), so a command's `--help` always lists what the registry holds. This module keeps
the strategy-specific helpers (the decorator, `get`, `describe`, `StageContext`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit import registry as _R

ENTRY_POINT_GROUP = "toolkit.strategies"
KIND = "strategies"
StrategyInfo = _R.Entry  # .command, .name, .factory, .help, .flow, .options
# {command: {name: Entry}}: the registry's own strategies table
_REGISTRY: dict[str, dict[str, _R.Entry]] = _R._ENTRIES[KIND]


def strategy(command: str, name: str, help: str = "", flow: str | None = None, options: Any = None) -> Callable:
    """Decorator registering `factory(opts, ctx) -> per-record fn` for `command --strategy name`;
    `options` (a toolkit.options.Options subclass) declares the strategy's recipe keys."""
    return _R.register(KIND, name, help=help, flow=flow, scope=command, options=options)


def load_all() -> None:
    """Import the strategy modules (the `toolkit.strategies` entry points), once."""
    _R.load(KIND)


def names(command: str) -> list[str]:
    return _R.names(KIND, command)


def get(command: str, name: str | None) -> _R.Entry:
    from toolkit.io import UsageError

    if name is not None:  # one strategy: its module alone (the registry manifest), else the full load below
        e = _R.lookup(KIND, name, command)
        if e is not None:
            return e
    known = _R.entries(KIND, command)
    if not known:
        errs = [e.line() for e in _R.errors() if e.kind == KIND]
        raise UsageError(f"{command}: no strategy is registered" + (f" ({'; '.join(errs)})" if errs else ""))
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
    """One line per registered strategy, for --help: `name (flow: x) — help`."""
    return _R.describe(KIND, command)


@dataclass
class StageContext:
    """What a strategy factory gets besides its own options: the command, the command's typed
    options (`opts`, a toolkit.options model), the meter and LLM clients."""

    command: str
    opts: Any
    meter: Any = None
    _clients: dict = field(default_factory=dict)

    def llm(self, role: str | None = None):
        """The LLM client for a role (role-prefixed config keys override plain ones)."""
        from toolkit.llm import llm_config
        from toolkit.llm import get_client

        key = role or ""
        if key not in self._clients:
            self._clients[key] = get_client(llm_config(self.opts, role=role), self.meter)
        return self._clients[key]

    def model_name(self, role: str | None = None) -> str:
        from toolkit.llm import llm_config

        return llm_config(self.opts, role=role).model or "embedded"
