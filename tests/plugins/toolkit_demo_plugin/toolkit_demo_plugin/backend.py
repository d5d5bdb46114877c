"""Environment backend `demo-counter`: one table `counter` with a single row {"value": int}.

Tools: add(n) (n in 1..10, else a structured error), read(). Ref: {"backend": "demo-counter",
"id": "counter", "config": {"start": int}}."""

from __future__ import annotations

from toolkit.envs import Environment, ToolResult, register_backend

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add n (1..10) to the counter.",
                                      "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                     "required": ["n"]}}},
    {"type": "function", "function": {"name": "read", "description": "Read the counter.",
                                      "parameters": {"type": "object", "properties": {}}}},
]


class CounterEnvironment(Environment):
    backend = "demo-counter"

    def __init__(self, ref: dict):
        self.start = int((ref.get("config") or {}).get("start", 0))
        self.value = self.start

    def tools(self, side: str = "agent") -> list[dict]:
        return TOOLS if side == "agent" else []

    def policy(self) -> str:
        return "You operate a counter. Only add numbers from 1 to 10."

    def reset(self, state: dict | None = None) -> None:
        self.value = int(state["counter"][0]["value"]) if state else self.start

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        if name == "read":
            return ToolResult.success({"value": self.value})
        if name == "add":
            n = args.get("n")
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 10:
                return ToolResult.fail("POLICY_VIOLATION", f"n must be an integer from 1 to 10 (got {n!r})",
                                       violated_rule="R1")
            self.value += n
            return ToolResult.success({"value": self.value})
        return ToolResult.fail("UNKNOWN_TOOL", f"no tool {name!r}")

    def snapshot(self) -> dict:
        return {"counter": [{"value": self.value}]}


register_backend("demo-counter", CounterEnvironment, doc="demo plugin: a counter with add(n) / read()")
