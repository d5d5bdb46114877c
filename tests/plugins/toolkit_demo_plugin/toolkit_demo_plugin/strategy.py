"""gen-task --strategy demo: one counter task per input record {"id", "extra": {"target": int}}:
reach the target from 0 with add(n) calls of at most 10 each."""

from __future__ import annotations

from toolkit.io import StageError
from toolkit.schema import Record
from toolkit.stages.registry import strategy


@strategy("gen-task", "demo", flow="demo", help="counter tasks: reach extra.target with add(n <= 10)")
def build(opts, ctx):
    def fn(record: Record) -> Record:
        target = (record.extra or {}).get("target")
        if not isinstance(target, int) or target < 1:
            raise StageError("demo gen-task needs extra.target, a positive integer", field="extra.target")
        steps, left = [], target
        while left > 0:
            steps.append(min(10, left))
            left -= steps[-1]
        return Record.model_validate({
            "id": f"{record.id}-task", "parent_id": record.id, "flow": "demo",
            "env": {"backend": "demo-counter", "id": "counter", "config": {"start": 0}},
            "task": {"instruction": f"Bring the counter from 0 to {target}.",
                     "ground_truth": {"actions": [{"name": "add", "arguments": {"n": n}} for n in steps]}},
        })

    return fn
