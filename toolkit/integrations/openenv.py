"""An OpenEnv server (openenv-core 0.3) over the toolkit's task records.

OpenEnv's contract (read from openenv-core 0.3.0): a FastAPI app (`create_fastapi_app(env_factory,
action_cls, observation_cls)`) serves `/health`, stateless HTTP `/reset` and `/step` (a fresh
environment per request) and `/ws`, where each WebSocket connection is a session with its own
environment instance: `{"type": "reset", "data": {...}}` calls `reset(**data)`, `{"type": "step",
"data": action}` calls `step(action)`, and observations come back as `{observation, reward,
done}`. With the generic `Action` class, `{"type": "list_tools"}` and `{"type": "call_tool",
"tool_name", "arguments"}` are routed as MCP actions (RFC 003). `openenv.GenericEnvClient(url)`
drives a session (multi-step episodes need `/ws`).

Here (`toolkit env serve --format openenv`):
- `reset(task_id=ID)` starts a fresh toolkit environment for that task and returns its opening
  messages (system prompt with the policy, the user's request) and its tools;
- `list_tools` returns the environment's tools (OpenAI parameter schemas as `input_schema`) plus
  the end-of-episode tool;
- `call_tool` executes one call (`Episode.call`: a tool-level failure is a structured error in
  `result`, as in rollout), reward 0;
- calling the end-of-episode tool (`done`; `finish`, `submit` or `end_episode` when the domain has
  a tool named `done`) ends the episode: `done=true`, the reward is the toolkit's verify of the
  episode (its optional `message` argument is the final answer the agent gives the user). The
  step rewards sum to the verify reward, which is how verifiers' OpenEnv bridge reads them.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
from openenv.core.env_server.mcp_types import (
    CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation, Tool, ToolError, ToolErrorType)
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State

from toolkit.integrations.core import DEFAULT_STRATEGIES, Episode, Scorer
from toolkit.schema import Record

__all__ = ["END_TOOLS", "TaskObservation", "ToolkitOpenEnv", "make_app", "serve"]

END_TOOLS = ("done", "finish", "submit", "end_episode")


class TaskObservation(Observation):
    """What `reset(task_id=...)` returns: the task and its opening messages and tools."""

    task_id: str
    messages: list[dict]
    tools: list[dict]


class ToolkitOpenEnv(OpenEnvEnvironment):
    """One session's environment; `tasks` and `scorer` are set on the class `make_app` builds."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    tasks: dict[str, Record] = {}
    scorer: Scorer | None = None

    def __init__(self) -> None:
        super().__init__()
        self._episode: Episode | None = None
        self._record: Record | None = None
        self._end_tool = END_TOOLS[0]
        self._done = False
        self._state = State(episode_id=None, step_count=0)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="toolkit", description=f"{len(self.tasks)} toolkit task(s): reset(task_id=...)")

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> TaskObservation:
        rec = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if rec is None:
            known = ", ".join(list(self.tasks)[:5]) + (" ..." if len(self.tasks) > 5 else "")
            raise ValueError(f"reset needs task_id, one of the {len(self.tasks)} served tasks ({known}); got {task_id!r}")
        self.close()
        self._record = rec
        self._episode = Episode(rec, key=episode_id or f"{rec.id}-openenv")
        names = {t["function"]["name"] for t in self._episode.tools}
        self._end_tool = next((n for n in END_TOOLS if n not in names), END_TOOLS[0] + "_episode_now")
        self._done = False
        self._state = State(episode_id=episode_id or rec.id, step_count=0, task_id=rec.id)
        return TaskObservation(task_id=rec.id, messages=self._episode.prompt,
                               tools=self._episode.tools + [self._end_tool_schema()], reward=0.0, done=False)

    def _end_tool_schema(self) -> dict:
        return {"type": "function", "function": {
            "name": self._end_tool,
            "description": "End the episode when the user's request is handled (or cannot be): the environment "
                           "is then verified and the reward returned. Optionally pass the final message to the user.",
            "parameters": {"type": "object", "properties": {"message": {
                "type": "string", "description": "the final answer to the user"}}, "additionalProperties": False}}}

    def _tools(self) -> list[Tool]:
        assert self._episode is not None
        return [Tool(name=t["function"]["name"], description=t["function"].get("description") or "",
                     input_schema=t["function"].get("parameters") or {"type": "object", "properties": {}})
                for t in self._episode.tools + [self._end_tool_schema()]]

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if self._episode is None or self._record is None:
            err = ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message="call reset(task_id=...) first")
            return CallToolObservation(tool_name=getattr(action, "tool_name", ""), error=err, reward=0.0, done=False)
        self._state.step_count += 1
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=self._tools(), reward=0.0, done=self._done)
        if not isinstance(action, CallToolAction):
            raise ValueError(f"unsupported action {type(action).__name__}: use list_tools or call_tool")
        if self._done:
            err = ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message="the episode is over: reset(task_id=...)")
            return CallToolObservation(tool_name=action.tool_name, error=err, reward=0.0, done=True)
        if action.tool_name == self._end_tool:
            msg = action.arguments.get("message") if isinstance(action.arguments, dict) else None
            assert self.scorer is not None
            score = self.scorer.score(self._record, self._episode.calls, prompt=self._episode.prompt,
                                      final_text=msg if isinstance(msg, str) else None)
            self._done = True
            return CallToolObservation(tool_name=action.tool_name, done=True, reward=score.reward,
                                       result={"reward": score.reward, "passed": score.passed, "scores": score.scores})
        c = self._episode.call(action.tool_name, action.arguments)
        return CallToolObservation(tool_name=action.tool_name, result=c.content, reward=0.0, done=False)

    @property
    def state(self) -> State:
        if self._episode is not None:
            self._state.calls = len(self._episode.calls)  # type: ignore[attr-defined]
        return self._state

    def close(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None


def make_app(records: list[Record], strategies: tuple[str, ...] = DEFAULT_STRATEGIES, max_sessions: int = 16,
             **verify_options: Any):
    """The FastAPI app serving `records` (one environment per /ws session, `max_sessions` at once)."""
    env_cls = type("ToolkitTasksEnv", (ToolkitOpenEnv,), {
        "tasks": {r.id: r for r in records}, "scorer": Scorer(strategies, **verify_options), "__module__": __name__})
    return create_fastapi_app(env_cls, Action, Observation, max_concurrent_envs=max_sessions)


def serve(records: list[Record], host: str = "127.0.0.1", port: int = 0, strategies: tuple[str, ...] = DEFAULT_STRATEGIES,
          max_sessions: int = 16, ready: Any = None, **verify_options: Any) -> None:
    """Serve until interrupted; `ready(url)` is called once the socket is bound (port 0: a free one)."""
    import uvicorn

    app = make_app(records, strategies, max_sessions, **verify_options)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections made once `ready` is told wait in the backlog until uvicorn serves them
    bound = sock.getsockname()[1]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}"
    if ready is not None:
        ready(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        sys.stderr.flush()
