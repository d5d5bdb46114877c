"""The Environment protocol every backend implements (canonical state hashing and DIFF live in
`toolkit.scoring.state`).

An environment is rebuilt from the `env` field of a record (an `EnvRef`-shaped dict) with
`load_env(ref)`. Backends register themselves by name with `register_backend`.

Contract
--------
- `tools(side)`      OpenAI function schemas (`{"type": "function", "function": {...}}`); side is
                     "agent" or "user" (dual-control domains such as tau2 telecom have user tools).
- `policy()`         the domain policy / wiki text shown to the agent.
- `reset(state)`     restore the initial state (or the given state dict).
- `call(name, args)` -> ToolResult: a success payload or a structured error
                     {code, message, violated_rule, hint}; never raises for tool-level failures.
- `acall(...)`       async variant; defaults to running `call` (backends that need an LLM override it).
- `snapshot()`       canonical JSON-able state: {table: [row dicts]}.
- `write_tools()`    names of the tools that may write, or None when the backend does not know.
- `state_hash()`     sha256 of the canonical form of snapshot() (see "Canonical state" below);
                     equal hashes <=> DIFF 0 under the env's `state_keys()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit.scoring.state import StateKeys, state_hash

from toolkit import registry
from toolkit.toolresult import ToolResult

# ----------------------------------------------------------------------------------------------
# The protocol


class Environment:
    """Base class for environment backends (see module docstring for the contract)."""

    backend: str = "base"

    def tools(self, side: str = "agent") -> list[dict]:
        raise NotImplementedError

    def policy(self) -> str:
        return ""

    def reset(self, state: dict | None = None) -> None:
        raise NotImplementedError

    def call(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        raise NotImplementedError

    async def acall(self, name: str, args: dict, side: str = "agent") -> ToolResult:
        return self.call(name, args, side=side)

    def snapshot(self) -> dict:
        raise NotImplementedError

    def write_tools(self) -> set[str] | None:
        """Names of the tools (either side) that may change the state, when the backend knows
        (sqlite: its insert_/update_ tools; tau2: the WRITE tools); None when it does not say
        (the actions scorer then goes by the tool name, docs/scoring.md)."""
        return None

    def state_keys(self) -> StateKeys:
        """Technical columns and references of this environment's tables (see StateKeys)."""
        return StateKeys(exclude=getattr(self, "exclude_keys", ()) or ())

    def hash_state(self, state: dict) -> str:
        """The hash `state_hash()` would give if the environment were in `state`."""
        return state_hash(state, self.state_keys())

    def state_hash(self) -> str:
        return state_hash(self.snapshot(), self.state_keys())

    def begin_episode(self, key: str) -> None:
        """Called by the episode engine (`run_episode`) before the first message with the episode's
        key: the record id and the sample index (rollout `<record>-t<k>`, GRPO `<record>-s<step>-g<k>`).
        Backends with per-episode randomness (the simulated backend's fault injection) key it on
        this, so samples of one task differ and every plan of one server is drawn afresh."""

    def close(self) -> None:
        pass

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class BackendInfo:
    name: str
    factory: Callable[[dict], Environment]
    doc: str = ""
    extra: dict = field(default_factory=dict)


def register_backend(name: str, factory: Callable[[dict], Environment], doc: str = "", **meta: Any) -> None:
    """Register an environment backend: `load_env({"backend": name, ...})` calls `factory(ref)`.

    A thin spelling of `toolkit.registry.register("backends", name, factory, help=doc)`; a plugin
    module doing this is listed under the `toolkit.backends` entry-point group."""
    registry.register("backends", name, factory, help=doc, **meta)


def backends() -> dict[str, BackendInfo]:
    return {n: BackendInfo(n, e.obj, e.help, dict(e.meta)) for n, e in registry.entries("backends").items()}


def load_env(ref: dict | Any) -> Environment:
    """Build an Environment from a record's `env` field (dict or pydantic model)."""
    if hasattr(ref, "model_dump"):
        ref = ref.model_dump(exclude_none=True)
    backend = (ref or {}).get("backend")
    e = registry.lookup("backends", backend) if isinstance(backend, str) else None
    if e is None:
        raise KeyError(f"unknown environment backend {backend!r}; known: {registry.names('backends')}")
    return e.obj(ref)
