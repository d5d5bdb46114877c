"""`ToolResult`: what a tool call returns (a success payload or a structured error), shared by the
environments (`toolkit.envs`, which re-exports it) and the roles that play a tool (the simulated
environment's LLM, `toolkit.roles.env_simulator`): it sits below both."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolResult:
    ok: bool
    content: Any = None
    error: dict | None = None  # {code, message, violated_rule, hint}

    @classmethod
    def success(cls, content: Any) -> "ToolResult":
        return cls(ok=True, content=content)

    @classmethod
    def fail(cls, code: str, message: str, violated_rule: str | None = None,
             hint: str | None = None) -> "ToolResult":
        return cls(ok=False, error={"code": code, "message": message,
                                    "violated_rule": violated_rule, "hint": hint})

    @property
    def is_policy_violation(self) -> bool:
        return (not self.ok) and bool(self.error) and self.error.get("code") == "POLICY_VIOLATION"

    def to_content(self) -> str:
        """The string placed in the `tool` message content."""
        if self.ok:
            if isinstance(self.content, str):
                return self.content
            return json.dumps(self.content, ensure_ascii=False, sort_keys=True, default=str)
        return json.dumps({"error": self.error}, ensure_ascii=False, sort_keys=True)
