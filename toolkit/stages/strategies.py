"""What every registry-driven command shares: pick the strategy, build its per-record function,
apply `--filter` on this command's verdicts, close LLM clients at the end.

Used by gen-plan, gen-task, validate-task, repair, reflect and make-verifier; the flows fill the
registry (`toolkit.stages.registry`). A batch strategy (reflect) gives its per-record fn a
`finish()` (async or not) returning records made from the whole input; they are written after
the per-record outputs (toolkit.io.RecordStream calls it once the input is exhausted).
"""

from __future__ import annotations

import inspect
from typing import Any

from toolkit.schema import Record
from toolkit.stages import make_meter  # noqa: F401  (re-exported for the CLI)
from toolkit.stages.registry import StageContext, get


def passed_here(record: Record, command: str) -> bool | None:
    """True/False when the record carries verdicts from `command` (all must pass); None when none."""
    vs = [v for v in record.verdicts if v.stage == command]
    if not vs:
        return None
    return all(v.passed for v in vs)


def build(command: str, cfg: dict, meter: Any):
    info = get(command, cfg.get("strategy"))
    cfg = dict(cfg, strategy=info.name)
    ctx = StageContext(command=command, cfg=cfg, meter=meter)
    fn = info.factory(cfg, ctx)
    filt = cfg.get("filter") or "all"

    def keep(rec: Record) -> bool:
        if filt == "all":
            return True
        ok = passed_here(rec, command)
        kept = bool(ok) if filt == "passed" else ok is False
        if not kept:
            from toolkit.io import note_drop

            failing = [v.name or v.kind for v in rec.verdicts if v.stage == command and not v.passed]
            note_drop(f"{command} {failing[0]}: failed" if failing else f"{command}: no verdict" if ok is None
                      else f"{command}: passed (--filter failed)")
        return kept

    def filtered(out):
        if out is None or filt == "all":
            return out
        if isinstance(out, list):
            return [r for r in out if keep(r)] or None
        return out if keep(out) else None

    async def run(record: Record):
        out = fn(record)
        if hasattr(out, "__await__"):
            out = await out
        return filtered(out)

    if inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn) and getattr(fn, "finish", None) is None:
        def run_sync(record: Record):
            out = fn(record)
            if hasattr(out, "__await__"):
                if hasattr(out, "close"):
                    out.close()
                raise TypeError(f"strategy {info.name!r} is a plain function but returned an awaitable; "
                                "declare it `async def`")
            return filtered(out)

        run.sync = run_sync  # type: ignore[attr-defined]

    async def aclose() -> None:
        closer = getattr(fn, "aclose", None)
        if closer is not None:
            await closer()

    run.aclose = aclose  # type: ignore[attr-defined]
    if getattr(fn, "finish", None) is not None:  # a batch strategy: `async finish() -> list[Record]`
        run.finish = fn.finish  # type: ignore[attr-defined]
    return run


def stream_fn(run):
    """What RecordStream should run for a `build` result: its plain-function twin `run.sync` when the
    strategy is synchronous (rule-only, no LLM: simia rules, ...), so the stream takes its
    synchronous path instead of one asyncio task per record (that machinery costs ~50 us a record,
    about the simia rules' own cost: bench/simia_rules_bench.py); else `run`. `build` keeps
    returning the async fn (callers that `await fn(record)`)."""
    sync = getattr(run, "sync", None)
    if sync is None:
        return run
    sync.aclose = run.aclose  # type: ignore[attr-defined]
    return sync
