"""verifiers 0.4 (`verifiers.v1`): the toolkit's tasks as a Taskset whose tools are a per-rollout
MCP Toolset, and the writer of an installable environment package.

verifiers' contract (read from verifiers 0.4.0): an environment id NAME imports the module
`NAME.replace("-", "_")`, whose `__all__` exports one `vf.Taskset` subclass;
`vf.load_environment(vf.resolve_env_config({"taskset": {"id": NAME}, ...}))` builds the `Env`.
A task's `toolsets(config)` are MCP servers launched per rollout as `python -m <module of the
Toolset class>` (`Toolset.run()`); the server fetches the rollout's task data over verifiers'
state channel and gets `setup_task(data)` before it registers its tools. Rewards are `@vf.reward`
methods of the Task; `Env.run_episode(task, ctx)` returns an Episode whose traces carry `.reward`.

Here:
- `ToolkitTaskData`: the record (JSON) rides on the task data, with the verify options;
  `prompt` is the task's opening user message, `system_prompt` the agent prompt with the policy;
- `ToolkitToolset` (this module, run with `python -m toolkit.integrations.verifiers`): one fresh
  toolkit environment per rollout (`Episode`, built with `load_env`: the backend's own
  confinement applies), its tools registered under their toolkit names (no server prefix) with
  their exact JSON schemas; every executed call is pushed to the rollout's shared state;
- `ToolkitTask.verify` (`@vf.reward`): the toolkit's verify of the calls in the shared state and
  the final reply (`state_diff` by default);
The package `toolkit env export --format verifiers` writes (`verifiers_package`) subclasses
`ToolkitTaskset` with its bundled task file.

Offline use: run with the `null` harness and the `subprocess` runtime (the default `bash`
harness and sandbox runtimes are not local). The null harness runs its chat program as a PEP 723
script through `uv` (`uv sync --script`), which installs that script's packages (openai, mcp,
httpx, httpx2, tenacity, certifi) from PyPI into uv's cache the first time: `uv` must be on PATH
(the `integrations` extra installs it) and PyPI reachable once per machine (docs/integrations.md).
"""

from __future__ import annotations

import json
import types
from typing import Any, ClassVar, Iterable

import verifiers.v1 as vf
from verifiers.v1.types import content_text

from toolkit.integrations.core import (
    DEFAULT_STRATEGIES, Episode, ExecutedCall, Scorer, group_toolsets, read_tasks)
from toolkit.integrations.pyfuncs import call_arguments, tool_method
from toolkit.schema import Record

__all__ = ["ToolkitState", "ToolkitTask", "ToolkitTaskData", "ToolkitTaskset", "ToolkitToolset"]


class ToolkitTaskData(vf.TaskData):
    record: dict
    """The toolkit record (env ref, task, ground truth) the episode runs and is verified against."""
    verify: dict = {}
    """verify's options for the reward: {"strategy": [...], other VerifyOptions keys}."""


class ToolkitState(vf.State):
    calls: list[dict] = []
    """Every tool call executed so far (ExecutedCall dicts), pushed by the tool server."""


class ToolkitToolsetConfig(vf.ToolsetConfig):
    pass


class ToolkitToolset(vf.Toolset[ToolkitToolsetConfig, ToolkitState]):
    """One fresh toolkit environment per rollout; its tools under their own names."""

    TOOL_PREFIX: ClassVar[str | None] = None

    def __init__(self, config: ToolkitToolsetConfig) -> None:
        super().__init__(config)
        self._episode: Episode | None = None

    async def setup_task(self, task: Any) -> None:
        rec = Record.model_validate(task.record)
        self._episode = Episode(rec, key=f"{rec.id}-vf")
        self._exit_stack.callback(self._close)  # ends an MCP server's process group with the tool server

    def _close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None

    def register(self, mcp: Any) -> None:
        if self._episode is None:
            raise vf.ToolsetError("the toolkit tool server has no task (setup_task was not called)")
        for t in self._episode.tools:
            fn = types.MethodType(tool_method(t, mode="schema"), self)
            mcp.add_tool(self._with_state(fn), name=t["function"]["name"],
                         description=t["function"].get("description") or t["function"]["name"],
                         structured_output=False)

    def _tool_call(self, name: str, args: dict) -> str:
        assert self._episode is not None
        c = self._episode.call(name, call_arguments(args))
        self.state.calls = [x.to_dict() for x in self._episode.calls]
        return c.content


_SCORERS: dict[str, Scorer] = {}


def _scorer(options: dict) -> Scorer:
    key = json.dumps(options, sort_keys=True)
    if key not in _SCORERS:
        opts = dict(options)
        _SCORERS[key] = Scorer(opts.pop("strategy", None) or DEFAULT_STRATEGIES, **opts)
    return _SCORERS[key]


class ToolkitTask(vf.Task[ToolkitTaskData, ToolkitState, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [ToolkitToolset(ToolkitToolsetConfig())]

    @property
    def key(self) -> str:
        return self.data.id or self.hash

    @vf.reward
    async def verify(self, task: ToolkitTaskData, trace: vf.Trace) -> float:
        """The toolkit's verify of the episode: the executed calls and the final reply."""
        rec = Record.model_validate(task.record)
        calls = [ExecutedCall.from_dict(d) for d in trace.state.calls]
        prompt = ([{"role": "system", "content": task.system_prompt}] if task.system_prompt else []) + [
            {"role": "user", "content": task.prompt_text}]
        replies = trace.assistant_messages
        final = content_text(replies[-1].content).strip() if replies else ""
        score = await _scorer(task.verify).ascore(rec, calls, prompt=prompt, final_text=final or None)
        return score.reward


class ToolkitTaskset(vf.Taskset[ToolkitTask, vf.TasksetConfig]):
    """The tasks of a toolkit task file (`TASKS`); `VERIFY` holds the reward's verify options."""

    TASKS: ClassVar[str] = ""
    VERIFY: ClassVar[dict] = {"strategy": list(DEFAULT_STRATEGIES)}

    def load(self) -> Iterable[ToolkitTask]:
        if not self.TASKS:
            raise vf.TaskError(f"{type(self).__name__}.TASKS names no task file")
        strategies = self.VERIFY.get("strategy") or DEFAULT_STRATEGIES
        records = read_tasks(self.TASKS, strategies=strategies, command="verifiers taskset")
        sets = group_toolsets(records)
        of = {r.id: ts for ts in sets for r in ts.records}
        for rec in records:
            ts = of[rec.id]
            system, user = ts.prompt(rec)
            data = ToolkitTaskData(id=rec.id, name=rec.id, prompt=user["content"], system_prompt=system["content"],
                                   record=rec.model_dump(mode="json", by_alias=True, exclude_none=True),
                                   verify=dict(self.VERIFY))
            yield ToolkitTask(data, self.config.task)


if __name__ == "__main__":  # the per-rollout tool server (`python -m toolkit.integrations.verifiers`)
    ToolkitToolset.run()
