"""Shared by the integration tests: task files (the bundled airline tasks; hotel tasks on the
test-only domain in tests/data/hotel, a path-based environment; two inline python environments)
and a scripted agent that replays a task's reference actions as tool calls (the oracle) or does
nothing."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from toolkit.schema import Record

DATA = Path(__file__).resolve().parents[1] / "data"
HOTEL_TASKS = DATA / "integrations" / "hotel_tasks.jsonl"
# two small python environments (tools run in the sandbox), short prompts for the training test
PYTHON_TASKS = DATA / "integrations" / "python_tasks.jsonl"


def airline_tasks(dest: Path) -> Path:
    """The bundled airline tasks as a task file (what `toolkit tasks airline` prints)."""
    from toolkit import domains

    p = Path(dest) / "airline.jsonl"
    p.write_text("".join(Record.model_validate(r).model_dump_json(by_alias=True) + "\n"
                         for r in domains.load_tasks("airline")), encoding="utf-8")
    return p


def records(path: Path) -> list[Record]:
    from toolkit.integrations.core import read_task_records

    return list(read_task_records(str(path)))


def oracle(record: Record) -> list[tuple[str, dict]]:
    return [(a.name, dict(a.arguments)) for a in record.task.ground_truth.actions]


def final_message(record: Record) -> str:
    """The oracle's last words: every communicate_info item (what read-only tasks need)."""
    info = record.task.ground_truth.communicate_info or []
    return "Done. " + " ".join(info) if info else "Done."


class ScriptedAgent:
    """A chat-completions reply function (toolkit.llm.testserver.ScriptedServer) for a set of
    tasks: it finds the task by its opening user message and, in `oracle` mode, answers with the
    next reference action as a tool call (counting the tool results so far), then the final
    message; in `nothing` mode it only answers in text."""

    def __init__(self, recs: list[Record], mode: str = "oracle"):
        from toolkit.episodes.text import opening_message

        self.by_text = {opening_message(r): r for r in recs}
        self.mode = mode
        self.modes: dict[str, str] = {}  # per task id, over `mode` (episodes of several tasks at once)
        self.seen: list[str] = []  # task ids, one per request

    def task_of(self, messages: list[dict]) -> Record:
        for m in messages:
            if m.get("role") == "user":
                text = m.get("content")
                if isinstance(text, list):
                    text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
                for opening, rec in self.by_text.items():
                    if opening in (text or ""):
                        return rec
        raise AssertionError(f"no task's opening message in the request: {json.dumps(messages)[:500]}")

    def __call__(self, req: dict) -> dict:
        msgs = req.get("messages") or []
        rec = self.task_of(msgs)
        self.seen.append(rec.id)
        done = sum(1 for m in msgs if m.get("role") == "tool")
        mode = self.modes.get(rec.id, self.mode)
        calls = oracle(rec) if mode == "oracle" else []
        if done < len(calls):
            name, args = calls[done]
            return {"tool_calls": [{"id": "call_" + uuid.uuid4().hex[:8], "name": name, "arguments": args}]}
        return {"content": final_message(rec) if mode == "oracle" else "Sorry, I cannot help with that."}
