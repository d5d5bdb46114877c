"""Helpers shared by the tests/test_flow_eigendata*.py files (not a test module)."""

import asyncio
import json

from toolkit.schema import Record

SQLITE_AIRLINE = {"backend": "sqlite", "id": "airline"}


def run_strategy(command: str, cfg: dict, record, strategy: str):
    """Run one registry strategy on one record (a fresh event loop; clients closed after)."""
    from toolkit.stages import strategies

    if isinstance(record, dict):
        record = Record.model_validate(record)
    cfg = dict({"model": "scripted", "max_retries": 0}, **cfg, strategy=strategy)

    async def go():
        fn = strategies.build(command, cfg, None)
        try:
            return await fn(record)
        finally:
            await fn.close()
            from toolkit.llm.client import close_all_clients

            await close_all_clients()

    return asyncio.run(go())


def env_record(rid="env-1", env=None, **kw) -> Record:
    return Record.model_validate(dict({"id": rid, "env": env or SQLITE_AIRLINE}, **kw))


def fn_call(name, args):
    return {"tool_calls": [{"name": name, "arguments": args}]}


def js(obj) -> str:
    return json.dumps(obj)
