"""What every registry-driven command shares: pick the strategy, build its per-record function,
apply `--filter` on this command's verdicts, close LLM clients at the end.

Used by gen-plan, gen-task, validate-task, repair, reflect and make-verifier; the flows fill the
registry (`toolkit.stages.registry`). A strategy factory returns its per-record function, or
StageParts (toolkit.stages.base) when it has more: a batch strategy (reflect) gives a `finish()`
(async or not) returning records made from the whole input; they are written after the
per-record outputs (toolkit.io.RecordStream calls it once the input is exhausted).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from toolkit import registry as _R
from toolkit.io import UsageError
from toolkit.options import COMMAND_MODELS, model_for
from toolkit.schema import Record
from toolkit.stages.base import FnStage, StageParts, keep
from toolkit.stages.registry import StageContext, get, options_models


def passed_here(record: Record, command: str) -> bool | None:
    """True/False when the record carries verdicts from `command` (all must pass); None when none."""
    vs = [v for v in record.verdicts if v.stage == command]
    if not vs:
        return None
    return all(v.passed for v in vs)


def typed(command: str, opts: Any) -> Any:
    """The command's typed options with the chosen strategy's defaults filled in, from its options
    model or, for library callers, a mapping of its keys (an unknown or ill-typed key is a usage
    error naming it)."""
    if isinstance(opts, Mapping):
        opts = options_model(command).typed(opts)
    return with_strategy_defaults(command, opts)


def build(command: str, opts: Any, meter: Any) -> StageParts:
    """The StageParts of `command --strategy <opts.strategy>` (opts: the command's options model, or
    a mapping of its keys): the strategy's per-record function wrapped with `--filter`, its batch
    `finish` (a factory returning StageParts has one: reflect), a plain-function twin `sync` when
    the strategy is synchronous (rule-only, no LLM: simia rules ...: RecordStream then takes its
    synchronous path instead of one asyncio task per record, which costs ~50 us a record, about
    the simia rules' own cost: bench/simia_rules_bench.py), and the closer."""
    opts = typed(command, opts)
    info = get(command, opts.strategy)
    if opts.strategy != info.name:  # the only registered strategy, chosen by default
        opts = with_strategy_defaults(command, opts.model_copy(update={"strategy": info.name}))
    ctx = StageContext(command=command, opts=opts, meter=meter)
    inner = StageParts.of(info.factory(info.options.of(opts) if info.options is not None else opts, ctx))
    fn = inner.process
    filt = getattr(opts, "filter", None) or "all"

    def kept(rec: Record) -> bool:
        if filt == "all":
            return True
        failing = next((v.name or v.kind for v in rec.verdicts if v.stage == command and not v.passed), None)
        return keep(command, filt, passed_here(rec, command), failing)

    def filtered(out):
        if out is None or filt == "all":
            return out
        if isinstance(out, list):
            return [r for r in out if kept(r)] or None
        return out if kept(out) else None

    async def run(record: Record):
        out = fn(record)
        if hasattr(out, "__await__"):
            out = await out
        return filtered(out)

    sync = None
    if inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn) and inner.finish is None:
        def sync(record: Record):
            out = fn(record)
            if hasattr(out, "__await__"):
                if hasattr(out, "close"):
                    out.close()
                raise TypeError(f"strategy {info.name!r} is a plain function but returned an awaitable; "
                                "declare it `async def`")
            return filtered(out)

    async def close() -> None:
        if inner.close is not None:
            res = inner.close()
            if inspect.isawaitable(res):
                await res

    return StageParts(process=run, sync=sync, finish=inner.finish, close=close, counts=inner.counts,
                      state=inner.state)


# ----------------------------------------------------------------------------------------------
# typed options and stage objects


def options_model(command: str) -> type:
    """The command's options model with every registered strategy's keys (toolkit.options)."""
    return model_for(command, options_models(command))


def with_strategy_defaults(command: str, opts: Any) -> Any:
    """opts with the chosen strategy's own defaults filled in for its keys left unset (the union
    model holds strategy keys as optional: strategies may share a key with different defaults)."""
    try:
        info = get(command, getattr(opts, "strategy", None))
    except Exception:  # no / ambiguous strategy: the build reports it
        return opts
    sm = info.options
    if sm is None:
        return opts
    base = COMMAND_MODELS[command].model_fields  # the command's own fields
    given = {k: getattr(opts, k) for k in sm.model_fields if k in opts.model_fields_set
             and getattr(opts, k) is not None}
    try:
        so = sm.model_validate(given)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err.get("loc", ())) or "?"
        raise UsageError(f"{command} --strategy {info.name}: {key}: {err['msg']} (got {err.get('input')!r})") from None
    update = {k: getattr(so, k) for k in sm.model_fields if k not in base and k not in given}
    return opts.model_copy(update=update) if update else opts


class StrategyStage(FnStage):
    """A registry-driven command (gen-plan ... make-verifier) as a stage object."""

    @classmethod
    def options_model(cls) -> type:
        return options_model(cls.command)

    def __init__(self, opts: Any = None, /, meter: Any = None, **changes: Any):
        super().__init__(opts, meter=meter, **changes)
        self.opts = with_strategy_defaults(self.command, self.opts)

    def model_for(self, opts: Any) -> type:
        """The options' own model when it is this command's and holds every key of the strategy it
        names (the CLI's model narrowed to `--strategy`: no other flow is imported), else the model
        with every registered strategy's keys."""
        m = type(opts)
        name = getattr(opts, "strategy", None)
        if getattr(m, "command", None) == self.command and isinstance(name, str):
            info = _R.lookup("strategies", name, self.command)
            if info is not None and (info.options is None or set(info.options.model_fields) <= set(m.model_fields)):
                return m
        return self.options_model()

    def build(self) -> StageParts:
        return build(self.command, self.opts, self.meter)


class GenPlan(StrategyStage):
    command = "gen-plan"


class GenTask(StrategyStage):
    command = "gen-task"


class ValidateTask(StrategyStage):
    command = "validate-task"


class Repair(StrategyStage):
    command = "repair"


class Reflect(StrategyStage):
    command = "reflect"


class MakeVerifier(StrategyStage):
    command = "make-verifier"


STAGES = {c.command: c for c in (GenPlan, GenTask, ValidateTask, Repair, Reflect, MakeVerifier)}
