"""Simia-RL (§2.3, appendix D): task records whose environment is the LLM simulator, so `rollout`
and `grpo` train against it like any other environment. `gen-task --strategy simia`.

One seed record (a curated trajectory) → one task record:
- `env = {"backend": "simulated", "config": {policy, tools, reference (the seed as a transcript),
  reference_trajectory_id, human: true, grounding_env (the seed's real env ref, when it has one)}}`
  — tool calls are answered by the environment-feedback prompt (`env_simulator`: tool output or
  error, as JSON), the human side by `simia/env_human` (Fig 13) which ends with `[TERMINATE]`;
- `task.instruction` = the seed's first human message (the episode opens with it), and
  `task.user_scenario.instructions` tells the simulated human to follow the reference flow;
- reward: `verify --strategy judge --judge-rubric simia` (0/1, Fig 12/14; also reads Fig 14's
  `{"reasoning", "reward": 0|1}`).
Recipe keys: `simulator_model` / `simulator_base_url` (stored in env.config as model / base_url;
else the rollout's user model serves the simulator), `fault_rate`.
"""

from __future__ import annotations

from toolkit.flows.simia import transcript as T
from toolkit.envs import backend_capabilities
from toolkit.io import StageError, add_provenance
from toolkit.schema import EnvRef, Record, Task, UserScenario
from toolkit.stages.registry import StageContext, strategy
from toolkit.flows.simia import options as O
from toolkit.flows.simia.prefilter import env_policy, seed_of


def rl_task(record: Record, opts: O.RLOptions) -> Record:
    index = opts.seed_trajectory
    turns, tools, msgs = seed_of(record, index)
    conv = T.to_messages(turns)
    if conv.problems:
        raise StageError("the seed does not parse: " + "; ".join(map(str, conv.problems))[:300], field="trajectories")
    if not tools:
        raise StageError("the seed lists no tools", field="trajectories.0.tools")
    first = next((m["content"] for m in conv.messages if m["role"] == "user"), None)
    if not first:
        raise StageError("the seed has no human message to open the episode with", field="trajectories")
    system = next((t.text for t in turns if t.role == T.SYSTEM), None)
    policy = env_policy(record, msgs or ([{"role": "system", "content": system}] if system else []))
    config = {"policy": policy, "tools": tools, "reference": T.render(conv.messages), "human": True,
              "reference_trajectory_id": record.trajectories[index].id if record.trajectories else None}
    if record.env is not None and not backend_capabilities(record.env.backend).simulated:
        config["grounding_env"] = record.env.model_dump(mode="json", exclude_none=True)
    for dst, value in (("model", opts.simulator_model), ("base_url", opts.simulator_base_url),
                       ("fault_rate", opts.fault_rate)):
        if value is not None:
            config[dst] = value
    return Record(
        id=f"{record.id}-rl", parent_id=record.id, flow="simia", tags=list(dict.fromkeys(list(record.tags) + ["simia-rl"])),
        env=EnvRef(backend="simulated", id=record.env.id if record.env else None, config=config),
        task=Task(instruction=first, user_scenario=UserScenario(
            instructions="You are the human of the reference conversation: pursue the same goal with the same facts; "
                         "say [TERMINATE] when the task is done.")))


@strategy("gen-task", "simia", options=O.RLOptions, help="Simia-RL: one task per seed on the LLM-simulated environment "
                                    "(tool feedback + simulated human + [TERMINATE]); reward = judge --judge-rubric simia")
def build(opts: O.RLOptions, ctx: StageContext):
    def fn(record: Record) -> Record:
        out = rl_task(record, opts)
        add_provenance(out, "gen-task", strategy="simia", recipe_hash=opts.recipe_hash)
        return out

    return fn
