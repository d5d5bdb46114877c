"""TRL's `GRPOTrainer(environment_factory=...)` over the toolkit's task records.

    from trl import GRPOConfig, GRPOTrainer
    from toolkit.integrations.trl import dataset, environment_factory

    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), processing_class=tokenizer,
                          train_dataset=dataset("tasks.jsonl"),
                          environment_factory=environment_factory("tasks.jsonl"))

TRL's contract (trl 1.16, `GRPOTrainer` docstring): the factory takes no argument and returns an
environment whose public methods are the tools (type hints + Google-style docstrings), whose
`reset(**row)` receives the whole dataset row, and whose `get_reward()` scores the finished
rollout (logged as `rewards/<class name>/mean`). Here:

- one class per tool set (a domain, a server), generated from the environment's tool schemas
  (`toolkit.integrations.pyfuncs`, mode "typed"): `AirlineEnv.update_reservation(...)`;
- `reset(task_id=..., ...)` starts a fresh toolkit environment for that task (the previous
  episode's is closed); TRL pools instances and resets them between rollouts;
- a tool method executes the call through `Episode.call` and returns the tool message content
  (a structured `{"error": ...}` for a failed call, as in rollout);
- `get_reward()` is the toolkit's verify of the episode's calls (`state_diff` by default).

`environment_factory` returns the class itself when every task shares one tool set, and a
`{name: class}` dict (TRL's several-environments form) otherwise; `dataset` then adds the
`environment` column naming each row's class. Rows: `prompt` (system prompt with the policy, the
task's opening user message), `task_id`, and `environment` in the dict form.

Chat template: TRL parses tool calls only for chat templates it recognises
(`trl.chat_template_utils.add_response_schema`); the toolkit's Hermes template (SmolLM2, models
trained with `sft`) is not one of them ("Unrecognized chat template"). Its tool calls have the same
`<tool_call>{"name", "arguments"}</tool_call>` form as Qwen2.5's, so set
`tokenizer.chat_template = trl.chat_template_utils.qwen2_5_chat_template` for ChatML models, or
keep a checkpoint's own template when TRL knows it (Qwen2.5/3, Llama 3.1/3.2, ...).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from toolkit.integrations.core import DEFAULT_STRATEGIES, Episode, Score, Scorer, ToolSet, group_toolsets, read_task_records
from toolkit.integrations.pyfuncs import call_arguments, tool_methods
from toolkit.schema import Record

__all__ = ["ToolkitEnvironment", "dataset", "environment_factory", "toolsets"]


class ToolkitEnvironment:
    """Base of the generated environment classes (one per tool set; tools are their methods)."""

    _tasks: dict[str, Record] = {}
    _scorer: Scorer | None = None
    _counter = itertools.count()

    def __init__(self) -> None:
        self._episode: Episode | None = None
        self._record: Record | None = None
        self.last_score: Score | None = None

    def reset(self, **row: Any) -> None:
        """Start a fresh episode of the row's task (`task_id`)."""
        tid = row.get("task_id")
        rec = self._tasks.get(tid) if isinstance(tid, str) else None
        if rec is None:
            raise KeyError(f"{type(self).__name__}.reset: task_id {tid!r} is not among this environment's "
                           f"{len(self._tasks)} tasks (the dataset and the factory must come from the same task file)")
        self._close()
        self._record = rec
        self._episode = Episode(rec, key=f"{rec.id}-trl{next(self._counter)}")
        self.last_score = None
        return None

    def _tool_call(self, name: str, args: dict) -> str:
        if self._episode is None:
            raise RuntimeError(f"{type(self).__name__}: a tool was called before reset()")
        return self._episode.call(name, call_arguments(args)).content

    def get_reward(self) -> float:
        """The toolkit's verify of this episode (state_diff: 1.0 when the final state is the target's)."""
        if self._episode is None or self._record is None:
            raise RuntimeError(f"{type(self).__name__}: get_reward() before reset()")
        assert self._scorer is not None
        self.last_score = self._scorer.score(self._record, self._episode.calls, prompt=self._episode.prompt)
        return self.last_score.reward

    def _close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None

    def __del__(self) -> None:  # an MCP server's process group ends with its environment
        try:
            self._close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _class_name(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p) + "Env"


def environment_class(ts: ToolSet, scorer: Scorer) -> type:
    """The environment class of one tool set: its tools as typed methods."""
    methods = tool_methods(ts.tools, mode="typed")
    attrs: dict[str, Any] = dict(methods)
    attrs.update(_tasks={r.id: r for r in ts.records}, _scorer=scorer,
                 __doc__=f"Toolkit environment {ts.name!r}: {len(ts.records)} task(s), {len(methods)} tool(s).",
                 __module__=__name__)
    return type(_class_name(ts.name), (ToolkitEnvironment,), attrs)


_CACHE: dict[tuple, tuple[list[Record], list[ToolSet]]] = {}


def _read(tasks_path: str | os.PathLike) -> tuple[list[Record], list[ToolSet]]:
    p = os.path.abspath(os.fspath(tasks_path))
    st = os.stat(p)
    key = (p, st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        recs = read_task_records(p)
        _CACHE[key] = (recs, group_toolsets(recs))
    return _CACHE[key]


def toolsets(tasks_path: str | os.PathLike) -> list[ToolSet]:
    """The task file's tool sets (read and probed once per file version in this process)."""
    return _read(tasks_path)[1]


def environment_factory(tasks_path: str | os.PathLike, strategies: tuple[str, ...] = DEFAULT_STRATEGIES,
                        **verify_options: Any) -> type | dict[str, type]:
    """TRL's `environment_factory`: a class (zero-argument factory) when all tasks share one tool
    set, else `{name: class}` with `dataset(...)`'s `environment` column naming the class.
    `strategies` and `verify_options` configure the reward (verify's options)."""
    scorer = Scorer(strategies, **verify_options)
    sets = toolsets(tasks_path)
    classes = {ts.name: environment_class(ts, scorer) for ts in sets}
    return next(iter(classes.values())) if len(classes) == 1 else classes


def dataset(tasks_path: str | os.PathLike):
    """A `datasets.Dataset` with one row per task: `prompt` (conversational: the system prompt
    with the policy and the opening user message), `task_id`, and `environment` when the tasks
    span several tool sets."""
    from datasets import Dataset

    records, sets = _read(tasks_path)
    of = {r.id: ts for ts in sets for r in ts.records}
    rows: dict[str, list] = {"prompt": [], "task_id": []}
    if len(sets) > 1:
        rows["environment"] = []
    for r in records:  # the file's order
        ts = of[r.id]
        rows["prompt"].append(ts.prompt(r))
        rows["task_id"].append(r.id)
        if len(sets) > 1:
            rows["environment"].append(ts.name)
    return Dataset.from_dict(rows)
