"""What every trainer integration shares: the task file read once (`read_tasks`), one episode of a
task against a fresh toolkit environment (`Episode`), and the reward of an episode from the
toolkit's own `verify` (`Scorer`).

An episode is what `rollout` runs, minus the LLM: the peer framework's model decides the calls,
`Episode.call` executes each one exactly as rollout's engine does (an unknown tool or non-object
arguments are structured errors, every call a `Step` with the state hash after it), and
`Scorer.score` builds the trajectory rollout would have written (system + opening user message,
one assistant tool call and its tool result per call, the final text answer) and runs `verify`'s
strategies on it. `state_diff` (the default) replays the calls on a freshly built environment and
compares the final state with the task's target, so the reward never depends on the live
environment the calls ran in.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from toolkit import aio
from toolkit.envs import Environment, ToolResult, backend_capabilities, load_env
from toolkit.episodes.loop import tool_step, unknown_tool
from toolkit.episodes.text import agent_system_prompt, opening_message
from toolkit.io import IOOptions, RecordStream, StageError
from toolkit.options import VerifyOptions
from toolkit.schema import Record, Step, Trajectory
from toolkit.scorers.engine import Verifier
from toolkit.stages import make_meter

DEFAULT_STRATEGIES = ("state_diff",)


class TaskFileError(ValueError):
    """The task file has no usable task (every line rejected, or none at all)."""


# ----------------------------------------------------------------------------------------------
# the task file


def check_task(record: Record, strategies: Iterable[str] = DEFAULT_STRATEGIES) -> None:
    """Raise StageError (naming the field) when `record` cannot be an exported task."""
    if record.env is None:
        raise StageError("field env: a task needs an environment to run its tools in", field="env")
    if not backend_capabilities(record.env.backend).replayable:
        raise StageError(f"field env.backend: {record.env.backend!r} simulates its tools with an LLM; only "
                         "environments that execute tools can be exported", field="env.backend")
    if "state_diff" in strategies:
        gt = record.task.ground_truth if record.task else None
        if gt is None or not (gt.actions or gt.target_state is not None):
            raise StageError("field task.ground_truth: state_diff needs its actions or target_state (the "
                             "reference the final state is compared with)", field="task.ground_truth")


class Tasks(list):
    """The records read from a task file; `rejected` counts the lines left out."""

    rejected: int = 0


def read_tasks(path: str, rejects: str | None = None, strategies: Iterable[str] = DEFAULT_STRATEGIES,
               command: str = "env export") -> Tasks:
    """The task records of a JSONL file (.gz ok), read by the toolkit's stream reader: a bad line
    (not JSON, not a record, duplicate id, no env, no ground truth for the reward) is reported on
    stderr with its line number and field, appended to `rejects` when given, and skipped; a
    relative `env.path` is resolved against the file's directory. TaskFileError when nothing is
    left."""
    strategies = tuple(strategies)
    out = Tasks()

    def keep(rec: Record) -> Record:
        check_task(rec, strategies)
        out.append(rec)
        return rec  # counted as written (to os.devnull): the summary line reads "read N, written K"

    stream = RecordStream(IOOptions(input=path, output=os.devnull, rejects=rejects, progress=False, heartbeat=0),
                          command)
    stream.run(keep)
    out.rejected = stream.summary.rejected
    if not out:
        raise TaskFileError(f"{path}: no usable task record ({stream.summary.rejected} rejected)")
    return out


def read_task_records(path: str, **kw: Any) -> Tasks:
    """`read_tasks` for library callers (the TRL factory): the same reader and rejections."""
    return read_tasks(path, command="toolkit.integrations", **kw)


def toolset_key(record: Record) -> str:
    """Tasks with the same key offer the same tools (the env ref without its initial state and
    the task's own settings): one TRL environment class, one NeMo Gym tool list per key."""
    ref = record.env.model_dump(exclude_none=True) if record.env else {}
    ref.pop("state", None)
    ref.pop("state_ref", None)
    return json.dumps(ref, sort_keys=True, ensure_ascii=False)


def toolset_name(record: Record) -> str:
    """A readable name for the tool set of `record`: its domain / server id, its path's stem, the
    first line of an inline policy (python environments), else the backend."""
    env = record.env
    base = env.id or (os.path.splitext(os.path.basename(env.path.rstrip("/")))[0] if env.path else "")
    policy = (env.config or {}).get("policy")
    if not base and isinstance(policy, str) and policy.strip():
        base = policy.strip().splitlines()[0].lstrip("#").strip()[:40]
    name = "_".join("".join(ch.lower() if ch.isalnum() else " " for ch in base or "").split())
    return name or env.backend


@dataclass
class ToolSet:
    """Tasks that offer the same tools (one `toolset_key`): their name, the tools and the agent's
    system prompt, read from one probe episode."""

    name: str
    key: str
    records: list[Record]
    tools: list[dict]
    system: str

    def prompt(self, record: Record) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": opening_message(record)}]


def group_toolsets(records: list[Record]) -> list[ToolSet]:
    """The records grouped by tool set, in first-seen order, each group probed once (one fresh
    environment: an MCP server is started and stopped for its tools/list)."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(toolset_key(r), []).append(r)
    out: list[ToolSet] = []
    names: set[str] = set()
    for key, recs in groups.items():
        name, n = toolset_name(recs[0]), 2
        while name in names:
            name = f"{toolset_name(recs[0])}_{n}"
            n += 1
        names.add(name)
        with Episode(recs[0]) as ep:
            out.append(ToolSet(name, key, recs, ep.tools, ep.system))
    return out


# ----------------------------------------------------------------------------------------------
# one episode


@dataclass
class ExecutedCall:
    """One tool call of an episode as it ran: what verify replays and what the agent saw."""

    id: str
    name: str
    arguments: Any
    content: str
    ok: bool
    error_code: str | None = None
    state_hash: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ExecutedCall":
        return cls(**{k: d.get(k) for k in ("id", "name", "arguments", "content", "ok", "error_code", "state_hash")})


@dataclass
class Episode:
    """One episode of `record` against a fresh environment (`load_env(record.env)`, reset to the
    record's initial state). `call` executes a tool call and records it; `close` ends the
    environment (an MCP server's process group, a python env's sandbox workers)."""

    record: Record
    key: str | None = None
    env: Environment = field(init=False)
    tools: list[dict] = field(init=False)
    calls: list[ExecutedCall] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.env = load_env(self.record.env)
        try:
            self.env.reset(self.record.env.state if self.record.env.state else None)
            begin = getattr(self.env, "begin_episode", None)
            if callable(begin):
                begin(self.key or self.record.id)
            self.tools = self.env.tools("agent")
            self.system = agent_system_prompt(self.env)
        except BaseException:
            self.env.close()
            raise
        self._valid = {t["function"]["name"] for t in self.tools}
        self._lock = threading.Lock()

    @property
    def prompt(self) -> list[dict]:
        """The opening messages: the agent's system prompt (the policy) and the user's request."""
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": opening_message(self.record)}]

    def _result(self, name: str, arguments: Any) -> ToolResult | None:
        if not isinstance(arguments, dict):
            return ToolResult.fail("INVALID_ARGUMENTS", f"arguments must be a JSON object, got {type(arguments).__name__}",
                                   hint="send arguments as a JSON object")
        if name not in self._valid:
            return unknown_tool(name, self._valid)
        return None

    def _record(self, name: str, arguments: Any, res: ToolResult) -> ExecutedCall:
        tcid = f"call_{len(self.calls)}"
        st = tool_step(self.env, res, name, arguments if isinstance(arguments, dict) else {}, "agent", tcid)
        c = ExecutedCall(id=tcid, name=name, arguments=arguments, content=res.to_content(), ok=res.ok,
                         error_code=st.error_code, state_hash=st.state_hash)
        self.calls.append(c)
        return c

    def call(self, name: str, arguments: Any) -> ExecutedCall:
        """Execute one tool call (never raises for a tool-level failure: the result is a structured
        error, as in rollout)."""
        with self._lock:
            res = self._result(name, arguments)
            if res is None:
                res = self.env.call(name, arguments)
            return self._record(name, arguments, res)

    async def acall(self, name: str, arguments: Any) -> ExecutedCall:
        res = self._result(name, arguments)
        if res is None:
            res = await self.env.acall(name, arguments)
        return self._record(name, arguments, res)

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> "Episode":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def trajectory(record: Record, calls: list[ExecutedCall], traj_id: str, prompt: list[dict] | None = None,
               final_text: str | None = None, tools: list[dict] | None = None) -> Trajectory:
    """The trajectory rollout would have written for these calls: the opening messages, one
    assistant tool call + its tool result per call (a Step each), then the final text answer."""
    messages: list[dict] = list(prompt or [{"role": "user", "content": opening_message(record)}])
    steps: list[Step] = []
    for c in calls:
        args = c.arguments if isinstance(c.arguments, dict) else {}
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(args, ensure_ascii=False)}}]})
        messages.append({"role": "tool", "tool_call_id": c.id, "content": c.content})
        steps.append(Step(tool_call_id=c.id, name=c.name, ok=c.ok, error_code=c.error_code, state_hash=c.state_hash))
    if final_text:
        messages.append({"role": "assistant", "content": final_text})
    return Trajectory(id=traj_id, messages=messages, steps=steps, tools=tools or [], termination="agent_stop",
                      final_state_hash=calls[-1].state_hash if calls else None)


# ----------------------------------------------------------------------------------------------
# the reward


@dataclass
class Score:
    reward: float
    passed: bool
    scores: dict


class Scorer:
    """The toolkit's `verify` for single episodes: `strategies` (default state_diff) and any other
    verify option (`lambda_err`, `diff_exclude`, `judge_rubric` ...). Targets are cached per task
    for the scorer's lifetime, as in one `verify` run."""

    def __init__(self, strategies: Iterable[str] = DEFAULT_STRATEGIES, **verify_options: Any):
        self.options = VerifyOptions.model_validate({**verify_options, "strategy": list(strategies), "filter": "all"})
        self._verifier = Verifier(self.options, make_meter())
        self._lock = threading.Lock()
        self._n = 0

    async def ascore(self, record: Record, calls: list[ExecutedCall], prompt: list[dict] | None = None,
                     final_text: str | None = None) -> Score:
        self._n += 1
        rec = record.model_copy(deep=True)
        rec.trajectories = [trajectory(record, calls, f"{record.id}-e{self._n}", prompt, final_text)]
        rec.verdicts = []
        await self._verifier.score(rec)
        t = rec.trajectories[0]
        reward = float(t.reward) if t.reward is not None else 0.0
        return Score(reward=reward, passed=bool((t.scores.get("verify") or {}).get("passed")), scores=dict(t.scores))

    def score(self, record: Record, calls: list[ExecutedCall], prompt: list[dict] | None = None,
              final_text: str | None = None) -> Score:
        """Synchronous `ascore` (from a thread with no running event loop, or else on a private one)."""
        coro = self.ascore(record, calls, prompt, final_text)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            with self._lock:
                return aio.run(coro)
        box: dict = {}

        def run() -> None:
            try:
                box["v"] = aio.run(coro)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                box["e"] = e

        with self._lock:
            t = threading.Thread(target=run, name="toolkit-verify")
            t.start()
            t.join()
        if "e" in box:
            raise box["e"]
        return box["v"]
