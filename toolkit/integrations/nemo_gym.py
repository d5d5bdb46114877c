"""NeMo Gym rows (nemo-gym 0.7): one `BaseRunRequest` per task.

NeMo Gym's contract (read from nemo-gym 0.7.0, `nemo_gym.base_resources_server.BaseRunRequest`):
a row holds `responses_create_params`, the OpenAI Responses-API request the agent starts from —
`input` (messages) and `tools` in the Responses shape `{"type": "function", "name",
"description", "parameters", "strict"}` (not the chat-completions `{"function": {...}}` shape);
other keys of the row ride along to the resources server that verifies it.

Here (`toolkit env export --format nemo-gym`): `input` is the agent's system prompt (the policy)
and the task's opening user message, `tools` the environment's agent tools (`strict: false`: the
toolkit's schemas have optional parameters, which OpenAI's strict mode does not allow),
`parallel_tool_calls: false` (rollout executes one call at a time). The row also carries `id`,
`task_id` and `toolkit_task`: the record without trajectories (env ref, task, ground truth), what
a resources server needs to rebuild the environment and run the toolkit's verify
(`toolkit.integrations.core.Episode` / `Scorer`). `agent_ref` is added when given.
"""

from __future__ import annotations

from typing import Any

from toolkit.integrations.core import group_toolsets
from toolkit.schema import Record

__all__ = ["responses_tool", "rows"]


def responses_tool(tool: dict) -> dict:
    """An OpenAI chat-completions function tool in the Responses-API shape."""
    f = tool["function"]
    return {"type": "function", "name": f["name"], "description": f.get("description") or "",
            "parameters": f.get("parameters") or {"type": "object", "properties": {}}, "strict": False}


def rows(records: list[Record], agent_ref: str | None = None) -> list[dict[str, Any]]:
    """One row per record, in the records' order."""
    sets = group_toolsets(records)
    of = {r.id: ts for ts in sets for r in ts.records}
    tools = {ts.key: [responses_tool(t) for t in ts.tools] for ts in sets}
    out = []
    for r in records:
        ts = of[r.id]
        row: dict[str, Any] = {
            "id": r.id,
            "task_id": r.id,
            "responses_create_params": {"input": ts.prompt(r), "tools": tools[ts.key], "parallel_tool_calls": False},
            "toolkit_task": r.model_dump(mode="json", by_alias=True, exclude_none=True,
                                         exclude={"trajectories", "verdicts", "provenance"}),
        }
        if agent_ref:
            row["agent_ref"] = {"type": "responses_api_agents", "name": agent_ref}
        out.append(row)
    return out
