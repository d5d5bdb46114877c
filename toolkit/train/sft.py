"""`sft`: supervised fine-tuning on verified trajectories with TRL's SFTTrainer.

Flow: records (stdin / --input) → `toolkit.train.export` rows (agent view, or the user simulator's
view with `--role user`; `--filter`/`--min-reward` on verify's decisions) → tokenized here with the
model's chat template (`apply_chat_template(messages, tools=..., return_assistant_tokens_mask=True)`)
→ a `datasets.Dataset` of `input_ids` + `assistant_masks` → `trl.SFTTrainer`, which turns the mask
into labels (-100 outside the trained turns).

Why tokenize here instead of letting TRL do it: rows hold heterogeneous nested data (tool-call
argument dicts with different keys, JSON schemas). An Arrow table unifies struct fields across rows
and fills missing keys with null, so a conversational dataset would render
`{"reservation_id": 1003, "user_id": null}`; pre-tokenized rows never go through Arrow as structs.
The loss mask is then exactly what the template's `{% generation %}` markers cover (the assistant
turns, or the user turns for `--role user`); a template without markers is patched with TRL's
`get_training_chat_template` (known families) or replaced with `--chat-template toolkit`.

Settings: every key of the recipe's `sft:` section (and `defaults:`) that is a field of
`trl.SFTConfig` (hence of `transformers.TrainingArguments`: optimizer, schedule, precision,
`deepspeed`, `fsdp`, `accelerator_config`, `save_*`, `report_to` …) is passed through; `lora:` (a
mapping of `peft.LoraConfig` fields, or `--lora`) wraps the model with PEFT. Multi-GPU / multi-node
is `accelerate launch --config_file recipes/cluster/accelerate-*.yaml -m toolkit.cli sft ...`.
Outputs in --output-dir: checkpoints (`checkpoint-N/`), the final model + tokenizer, `metrics.jsonl`
(one JSON object per log step), `run.json` (config, rows, timings).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

from pydantic import BaseModel

from toolkit import registry
from toolkit.formats.rows import export_row
from toolkit.io import IOOptions, RecordStream, UsageError, log
from toolkit.options import SFTOptions
from toolkit.train import export as X
from toolkit.formats.hermes import CHAT_TEMPLATE
from toolkit.train.prefix import prefix_len, shared_forward

# our CLI / stream keys that are never trainer settings
_OURS = {"input", "output", "rejects", "resume", "shard", "limit", "unordered", "progress", "concurrency",
         "recipe", "print_config", "recipe_hash", "model", "role", "filter", "min_reward", "export", "lora",
         "chat_template", "resume_from_checkpoint", "max_rows", "tool_schema", "system_prompt", "merge_lora",
         "model_dtype", "shared_prefix"}


def collect_rows(o: SFTOptions) -> tuple[list[dict], Any]:
    """Read records (rejects with line numbers as every stage does) and return training rows."""
    opts = IOOptions.for_reading(o)
    rows: list[dict] = []

    def fn(record):
        rows.extend(X.record_rows(record, role=o.role, filter=o.filter, min_reward=o.min_reward,
                                  tool_schema=o.tool_schema or "full", system_prompt=o.system_prompt or "keep"))
        return None

    stream = RecordStream(opts, "sft")
    stream.run(fn)
    return rows, stream


def write_export(rows: list[dict], fmt: str, output: str | None) -> None:
    out = sys.stdout if output in (None, "", "-") else open(output, "w", encoding="utf-8")
    try:
        for r in rows:
            out.write(json.dumps(export_row(r, fmt), ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()


# ----------------------------------------------------------------------------------------------
# tokenizer / template


def load_tokenizer(model_path: str, chat_template: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    apply_template(tok, chat_template)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def apply_template(tok, chat_template: str | None) -> None:
    """chat_template: None/"model" = the model's (patched by TRL for assistant masks when it has no
    generation markers), "toolkit" = toolkit.formats.hermes, or a path to a Jinja file."""
    if chat_template in (None, "", "model"):
        if not getattr(tok, "chat_template", None):
            tok.chat_template = CHAT_TEMPLATE
        return
    if chat_template == "toolkit":
        tok.chat_template = CHAT_TEMPLATE
        return
    with open(chat_template, encoding="utf-8") as f:
        tok.chat_template = f.read()


def ensure_generation_markers(tok) -> None:
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if has_generation_markers(tok.chat_template):
        return
    try:
        patched = get_training_chat_template(tok)
    except Exception as e:
        raise UsageError(f"the model's chat template has no {{% generation %}} markers and TRL cannot patch it "
                         f"({e}); use --chat-template toolkit or a template file with the markers") from None
    if patched:
        tok.chat_template = patched


def tokenize_row(tok, row: dict, assistant_only: bool = True, max_length: int | None = None) -> dict:
    out = tok.apply_chat_template(row["messages"], tools=row.get("tools") or None, tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=assistant_only)
    ids = list(out["input_ids"])
    res = {"input_ids": ids}
    if assistant_only:
        res["assistant_masks"] = list(out["assistant_masks"])
    if max_length:
        res = {k: v[:max_length] for k, v in res.items()}
    return res


def trained_text(tok, example: dict) -> str:
    """Decode the tokens that carry loss (for tests and `sft --show-mask`)."""
    mask = example.get("assistant_masks") or [1] * len(example["input_ids"])
    return tok.decode([t for t, m in zip(example["input_ids"], mask) if m])


# ----------------------------------------------------------------------------------------------
# config


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")


def model_dtype(want: str | None, args):
    """The dtype the weights are loaded (and trained, and saved) in. `model_dtype: auto` (default):
    the precision flag's (bf16 → bfloat16 weights, as TRL does, halving memory); `float32` with
    `bf16: true` = mixed precision: fp32 weights and optimizer, bf16 autocast for the matmuls (on
    a CPU with AMX about 2x faster than fp32, measured in docs/learn.md; pure bf16 weights lose
    small updates to rounding)."""
    import torch

    want = want or "auto"
    if want not in MODEL_DTYPES:
        raise ValueError(f"model_dtype must be one of {MODEL_DTYPES}, got {want!r}")
    if want != "auto":
        return getattr(torch, want)
    return torch.bfloat16 if args.bf16 else (torch.float16 if args.fp16 else torch.float32)


def trainer_kwargs(keys: Any, cls, defaults: dict) -> dict:
    """The keys (a mapping, or an options model with its pass-through extras) that are fields of
    `cls` (SFTConfig / TrainingArguments), over our defaults."""
    if isinstance(keys, BaseModel):
        keys = {**keys.model_dump(), **(keys.__pydantic_extra__ or {})}
    names = _field_names(cls)
    kw = dict(defaults)
    for k, v in keys.items():
        if k in names and k not in _OURS and v is not None:
            kw[k] = v
    return kw


def cpu_defaults() -> dict:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_gpu = False
    if has_gpu:
        return {}
    return {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "dataloader_pin_memory": False}


def native_bf16() -> bool:
    """Whether bf16 matmuls run natively here: a GPU, or a CPU with AMX / AVX512-BF16. On other CPUs
    (AVX2 only) torch emulates bf16 and `bf16: true` autocast is many times SLOWER than fp32 (an AMD
    EPYC with AVX2: an SFT step of a 1.8k-token row did not finish in 3 CPU-minutes; fp32 ~10 s)."""
    try:
        import torch
    except Exception:  # pragma: no cover
        return False
    if torch.cuda.is_available():
        return True
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    try:
        return bool(amx() or avx512_bf16())
    except Exception:  # pragma: no cover - a torch build without the probes
        return False


def launched_with(kind: str) -> bool:
    """True when `accelerate launch` set up this process for FSDP / DeepSpeed (its env variables)."""
    var = {"fsdp": "ACCELERATE_USE_FSDP", "deepspeed": "ACCELERATE_USE_DEEPSPEED"}[kind]
    return os.environ.get(var, "").lower() in ("1", "true", "yes")


def cpu_fsdp_state(kw: dict) -> bool:
    """FSDP on CPU processes (gloo): accelerate 1.15 turns `accelerate launch`'s FSDP settings into
    an FSDP state only for accelerator devices (GPU, XPU, NPU ...); with `use_cpu` it sets up plain
    multi-CPU data parallelism and drops the plugin. PyTorch's FSDP2 (`fully_shard`) itself runs on
    CPU with gloo, so on a machine without a GPU, launched for FSDP, we configure the shared
    accelerator state as FSDP ourselves (the plugin from the launcher's FSDP_* variables) and let
    the Trainer use that state (`use_configured_state`). Returns True when it did. Nothing changes
    on a GPU machine: there accelerate sets FSDP up itself."""
    if not launched_with("fsdp") or not kw.get("use_cpu"):
        return False
    import torch.distributed as dist
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = Accelerator(cpu=True).state  # sets up the shared state (gloo process group) once
    if state.distributed_type != DistributedType.MULTI_CPU or not dist.is_initialized():
        return False
    plugin = FullyShardedDataParallelPlugin()  # reads FSDP_VERSION, FSDP_STATE_DICT_TYPE ... from the env
    # every AcceleratorState() copies PartialState's fields, so the type is set on both shared states
    PartialState().distributed_type = DistributedType.FSDP
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    acc = dict(kw.get("accelerator_config") or {})
    acc["use_configured_state"] = True
    kw["accelerator_config"] = acc
    return True


def save_full_model(trainer, out_dir: str) -> None:
    """The final model as one loadable checkpoint, whatever the sharding: FSDP (any state-dict
    type: with SHARDED_STATE_DICT `Trainer.save_model` writes no weights) gathers the full state dict
    (`accelerator.get_state_dict`, a collective: every rank calls it) and the main process writes
    it with `save_pretrained`; DeepSpeed ZeRO-3 goes through `Trainer.save_model`, which gathers
    the 16-bit weights (`zero3_save_16bit_model: true` / `stage3_gather_16bit_weights_on_model_save`);
    one process or DDP: `save_model` as is. LoRA runs save the adapter (see merge_lora)."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        trainer.save_model(out_dir)
        return
    acc = trainer.accelerator
    state_dict = acc.get_state_dict(trainer.model)
    if acc.is_main_process:
        model = acc.unwrap_model(trainer.model)
        model.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
        torch_save_args(trainer, out_dir)
    acc.wait_for_everyone()


def torch_save_args(trainer, out_dir: str) -> None:
    import torch

    torch.save(trainer.args, os.path.join(out_dir, "training_args.bin"))


def merge_lora(out_dir: str, merged_dir: str, tok) -> str:
    """Base model + the LoRA adapter saved in out_dir, merged (`merge_and_unload`) into a plain
    checkpoint in merged_dir that `from_pretrained`, vLLM or llama.cpp's converter load without peft."""
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(out_dir)
    merged = model.merge_and_unload()
    merged.save_pretrained(merged_dir, safe_serialization=True)
    tok.save_pretrained(merged_dir)
    return merged_dir


def lora_config(spec: Any):
    """peft's LoraConfig from the `lora` option (true, or a mapping of LoraConfig fields); None when off."""
    if not spec:
        return None
    from peft import LoraConfig

    kw = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
    if isinstance(spec, dict):
        kw.update(spec)
    return LoraConfig(**kw)


class MetricsJSONL:
    """TrainerCallback: every log → one JSON line in <output_dir>/metrics.jsonl."""

    def __init__(self, path: str, extra: dict | None = None):
        self.path = path
        self.extra = extra or {}
        self.t0 = time.time()

    def __call__(self):  # pragma: no cover - not used
        return self

    def make(self):
        from transformers import TrainerCallback

        outer = self

        class _CB(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):
                if not state.is_world_process_zero or not logs:
                    return
                rec = {"step": state.global_step, "epoch": state.epoch, "time": round(time.time() - outer.t0, 3),
                       **outer.extra, **logs}
                with open(outer.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec, default=float) + "\n")

        return _CB()


def resolve_resume(value: Any, output_dir: str) -> str | bool | None:
    if value in (None, False, "", "no", "none"):
        return None
    if value in (True, "auto", "last", "latest"):
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            log(f"sft: no checkpoint in {output_dir} to resume from; starting fresh")
        return last
    if not os.path.isdir(str(value)):
        raise UsageError(f"--resume-from-checkpoint {value}: not a directory")
    return str(value)


# ----------------------------------------------------------------------------------------------
# the command


def main(opts: SFTOptions | Any) -> int:
    """The sft command: `opts` is its options model (or, for library callers, a mapping of its keys)."""
    o = SFTOptions.typed(opts)
    if o.role not in X.ROLES:
        raise UsageError(f"--role must be one of {', '.join(X.ROLES)}")
    fmt = o.export
    if fmt and fmt not in registry.names("exporters"):
        raise UsageError(f"--export {fmt!r}: unknown format; choose from {', '.join(registry.names('exporters'))}")
    rows, stream = collect_rows(o)
    if fmt:
        write_export(rows, fmt, o.output)
        log(f"sft --export {fmt}: {len(rows)} rows")
        return stream.exit_code()
    if not rows:
        log("sft: no training rows (check --filter / --min-reward and the input)")
        return 1
    model_path = o.model
    out_dir = o.output_dir
    if not model_path:
        raise UsageError("sft needs --model PATH (a local HF checkpoint directory) unless --export is given")
    if not out_dir:
        raise UsageError("sft needs --output-dir DIR")
    if o.merge_lora and not o.lora:
        raise UsageError("--merge-lora needs LoRA training (--lora or a recipe `lora:` section)")
    result = train(rows, o, model_path, out_dir)
    log(f"sft: {json.dumps(result)}")
    return stream.exit_code()


def build_dataset(tok, rows: list[dict], assistant_only: bool, max_length: int | None):
    from datasets import Dataset

    data = [tokenize_row(tok, r, assistant_only, max_length) for r in rows]
    if assistant_only:
        empty = [r["id"] for r, d in zip(rows, data) if 1 not in d["assistant_masks"]]
        if len(empty) == len(rows):
            raise UsageError("no token is trained: the chat template's {% generation %} markers cover nothing "
                             "(or --max-length cuts every trained turn)")
        data = [d for d in data if 1 in d["assistant_masks"]]
    return Dataset.from_list(data)


def train(rows: list[dict], opts: SFTOptions | Any, model_path: str, out_dir: str) -> dict:
    """Train on `rows`; `opts`: sft's options model, or a mapping of its keys and any TRL SFTConfig
    field (library callers, tests)."""
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    o = SFTOptions.typed(opts)
    t0 = time.time()
    tok = load_tokenizer(model_path, o.chat_template)
    assistant_only = o.assistant_only_loss
    if assistant_only:
        ensure_generation_markers(tok)
    ds = build_dataset(tok, rows, assistant_only, o.max_length or None)
    defaults = {"output_dir": out_dir, "report_to": "none", "logging_steps": 1, "save_strategy": "steps",
                "save_steps": 50, "save_total_limit": 2, "num_train_epochs": 2, "learning_rate": 5e-6,
                "per_device_train_batch_size": 1, "max_length": None, **cpu_defaults()}
    kw = trainer_kwargs(o, SFTConfig, defaults)
    kw["output_dir"] = out_dir
    kw["assistant_only_loss"] = False  # the mask is already in the dataset (assistant_masks → labels)
    kw["completion_only_loss"] = False
    kw.setdefault("dataset_num_proc", None)
    fsdp_on_cpu = cpu_fsdp_state(kw)
    lora = lora_config(o.lora)
    args = SFTConfig(**kw)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=model_dtype(o.model_dtype, args))
    os.makedirs(out_dir, exist_ok=True)
    metrics = MetricsJSONL(os.path.join(out_dir, "metrics.jsonl"), {"role": o.role})
    trainer = prefix_sharing(SFTTrainer)(model=model, args=args, train_dataset=ds, processing_class=tok,
                                         peft_config=lora, callbacks=[metrics.make()],
                                         shared_prefix=o.shared_prefix)
    resume = resolve_resume(o.resume_from_checkpoint, out_dir)
    out = trainer.train(resume_from_checkpoint=resume)
    save_full_model(trainer, out_dir)
    main_process = trainer.accelerator.is_main_process
    if main_process:
        tok.save_pretrained(out_dir)
    merged = None
    if o.merge_lora:
        merged = os.path.join(out_dir, "merged")
        if main_process:
            merge_lora(out_dir, merged, tok)
        trainer.accelerator.wait_for_everyone()
    result = {"rows": len(rows), "examples": len(ds), "steps": trainer.state.global_step,
              "train_loss": out.training_loss, "seconds": round(time.time() - t0, 2),
              "resumed_from": resume, "output_dir": out_dir, "merged_dir": merged,
              "sharding": ("fsdp" + ("-cpu" if fsdp_on_cpu else "")) if getattr(trainer, "is_fsdp_enabled", False)
              else ("deepspeed" if getattr(trainer, "is_deepspeed_enabled", False) else None),
              "processes": trainer.accelerator.num_processes}
    if not main_process:
        return result
    with open(os.path.join(out_dir, "run.json"), "w", encoding="utf-8") as f:
        json.dump({"result": result, "config": {k: v for k, v in kw.items() if _jsonable(v)}}, f, indent=2, default=str)
    return result


def prefix_sharing(base: type) -> type:
    """`trl.SFTTrainer` whose fused forward runs the batch rows' common prefix (system prompt, tool
    schemas) once (toolkit.train.prefix: exact; with `per_device_train_batch_size` > 1 a step costs
    about the prefix once plus each row's rest). `shared_prefix`: None = auto (one process, no
    DeepSpeed / FSDP / gradient checkpointing, TRL's default loss), False = off."""
    class _Proxy:
        def __init__(self, model, P):
            self._model, self._P = model, P

        def __getattr__(self, name):
            return getattr(self._model, name)

        def __call__(self, **kw):
            if not kw.get("fused_lm_head"):
                return self._model(**kw)
            rest = {k: v for k, v in kw.items() if k not in ("input_ids", "attention_mask", "labels", "use_cache",
                                                              "fused_lm_head")}
            return shared_forward(self._model, kw["input_ids"], kw["attention_mask"], kw["labels"], self._P, **rest)

    class PrefixSharingSFTTrainer(base):
        def __init__(self, *a, shared_prefix=None, **kw):
            super().__init__(*a, **kw)
            self.shared_prefix = shared_prefix

        def _prefix(self, inputs) -> int:
            if self.shared_prefix is False or self.compute_loss_func is not None or self.label_smoother is not None:
                return 0
            if (self.accelerator.num_processes != 1 or self.is_deepspeed_enabled or self.is_fsdp_enabled
                    or self.args.gradient_checkpointing or "attention_mask" not in inputs or "labels" not in inputs):
                return 0
            labels = inputs["labels"]
            return prefix_len(inputs["input_ids"], inputs["attention_mask"], labels[:, 1:] != -100)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            P = self._prefix(inputs) if self.model.training else 0
            if P:
                model = _Proxy(model, P)
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    return PrefixSharingSFTTrainer


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False
