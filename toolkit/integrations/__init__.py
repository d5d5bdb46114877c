"""The toolkit's environments in the environment APIs other trainers run (docs/integrations.md).

Each task record (its `env` ref, its opening user message, its ground truth) becomes one task of
the peer framework; every episode runs against a fresh toolkit environment built with `load_env`
(whatever confinement the backend applies: sqlite's authorizer, the python sandbox, the MCP
launcher), and its reward is the toolkit's own `verify` of the episode (`state_diff` by default).

- `core`       what the four share: reading the task file, one `Episode` (fresh environment,
               tool calls executed and recorded as rollout records them), `Scorer` (verify)
- `pyfuncs`    a tool's JSON schema as a Python signature + Google docstring (TRL reads tools
               from type hints and docstrings; MCP servers from signatures)
- `verifiers`  verifiers 0.4 (`verifiers.v1`): Taskset / Task / Toolset base classes, and the
               writer of an installable environment package (`toolkit env export --format verifiers`)
- `openenv`    an OpenEnv (openenv-core 0.3) server: sessions over /ws, list_tools / call_tool
               actions, a `done` tool that ends the episode with the verify reward
               (`toolkit env serve --format openenv`)
- `trl`        `environment_factory(tasks)` and `dataset(tasks)` for TRL's GRPOTrainer
- `nemo_gym`   NeMo Gym rows (`BaseRunRequest`: Responses-API tools)
                (`toolkit env export --format nemo-gym`)

A peer is imported only by the module that serves it, and only when that module is used.
"""
