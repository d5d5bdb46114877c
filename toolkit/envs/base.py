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


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend is, declared when it registers; core code asks this, never the backend's name.

    deterministic   the same calls from the same state give the same results and states (verify
                    memoizes replays; the environment's own tool kinds decide which calls write)
    replayable      verify can rebuild it from `record.env` and replay a trajectory's calls in it
                    (state_diff, the code verifier's states); False for an LLM-played environment
    simulated       an LLM writes the observations (Simia): they are no ground truth
    policy_errors   its tools refuse policy-violating calls with a POLICY_VIOLATION error
    relational      its state is tables of a compiled domain (LOGIGEN's SQL schema and triggers)
    code_tools      its tools are generated code (ASTRA's python environments)
    """

    deterministic: bool = False
    replayable: bool = True
    simulated: bool = False
    policy_errors: bool = False
    relational: bool = False
    code_tools: bool = False


CAPABILITIES = tuple(BackendCapabilities.__dataclass_fields__)


@dataclass
class BackendInfo:
    name: str
    factory: Callable[[dict], Environment]
    doc: str = ""
    extra: dict = field(default_factory=dict)


def register_backend(name: str, factory: Callable[[dict], Environment], doc: str = "",
                     capabilities: BackendCapabilities | None = None, **meta: Any) -> None:
    """Register an environment backend: `load_env({"backend": name, ...})` calls `factory(ref)`;
    `capabilities` says what it is (BackendCapabilities; default: replayable, nothing else).

    A thin spelling of `toolkit.registry.register("backends", name, factory, help=doc, <capability>=...)`
    (each capability lands in the entry's meta, so `toolkit plugins` lists them); a plugin module
    doing this is listed under the `toolkit.backends` entry-point group."""
    caps = capabilities or BackendCapabilities()
    registry.register("backends", name, factory, help=doc, **{k: getattr(caps, k) for k in CAPABILITIES}, **meta)


def backend_capabilities(backend: str | None) -> BackendCapabilities:
    """The registered capabilities of `backend` (a record's `env.backend`); an unknown backend
    has the defaults (replayable, nothing else: loading it fails with its own error)."""
    e = registry.lookup("backends", backend) if isinstance(backend, str) else None
    if e is None:
        return BackendCapabilities()
    return BackendCapabilities(**{k: bool(e.meta[k]) for k in CAPABILITIES if k in e.meta})


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
