"""A trained HF checkpoint of a llama-architecture model as a GGUF llama.cpp can serve.

`toolkit serve --model CKPT --backend llamacpp` (the CPU default when it applies) serves a base,
SFT or GRPO checkpoint with the same llama.cpp server the embedded default uses, instead of
`transformers serve`: on 2 CPU cores llama.cpp keeps the conversation's KV cache between turns
and runs its own kernels (measured in docs/learn.md), so an evaluation turn re-reads only its new
tokens.

The conversion is the one llama.cpp's `convert_hf_to_gguf.py` does for `LlamaForCausalLM`, for the
tensors only: every metadata key (architecture sizes, tokenizer vocabulary, merges, special
tokens) is copied from a *template* GGUF of the same architecture, the GGUF the checkpoint was
materialized from (`toolkit models materialize`, its marker file names it) or a known model's
GGUF whose sizes equal the checkpoint's config. Fine-tuning changes weights, not the tokenizer or
the shapes, so the template's metadata describes the trained model exactly; the matrices are
written in F16 (default: logits equal the HF model's, Pearson r > 0.9999 per position) or Q8_0
(half the bytes to read per decoded token; r ≈ 0.994, the top-1 token differed at 2 of 33
positions), norms in F32, q/k projections permuted to llama.cpp's rotary layout.

    python -m toolkit.llm.gguf_export CKPT [--out FILE] [--template GGUF] [--type q8_0|f16]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from toolkit import diskcache
from toolkit.llm.models import KNOWN_MODELS, MARKER, ModelError, _gguf_path, known_model

CFG_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size")
GGUF_TYPES = ("f16", "q8_0")


class ExportError(ValueError):
    pass


def _config(ckpt: str) -> dict:
    try:
        with open(os.path.join(ckpt, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ExportError(f"{ckpt}: no readable config.json ({e})") from None


def find_template(ckpt: str) -> str:
    """The GGUF whose metadata describes `ckpt`: its materialization source, else a known model's
    GGUF with the same architecture sizes (the checkpoint was trained from it)."""
    try:
        with open(os.path.join(ckpt, MARKER)) as f:
            src = json.load(f).get("source")
        if src and os.path.isfile(src):
            return src
    except (OSError, ValueError):
        pass
    hf_config = _config(ckpt)
    for name in KNOWN_MODELS:
        try:
            path = _gguf_path(known_model(name))
        except ModelError:
            continue
        if _template_sizes(path) == {k: hf_config.get(k) for k in CFG_KEYS}:
            return path
    raise ExportError(f"{ckpt}: no template GGUF: not materialized by `toolkit models` and its sizes "
                      f"({ {k: hf_config.get(k) for k in CFG_KEYS} }) match no known model")


def _template_sizes(path: str) -> dict:
    arch, _, fields = template_metadata(path)
    meta = {name: value for name, value, _, _ in fields}

    def get(k):
        return meta.get(f"{arch}.{k}")

    vocab = get("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return {"model_type": arch, "hidden_size": get("embedding_length"), "num_hidden_layers": get("block_count"),
            "num_attention_heads": get("attention.head_count"),
            "num_key_value_heads": get("attention.head_count_kv"),
            "intermediate_size": get("feed_forward_length"), "vocab_size": vocab}


def _state_dict(ckpt: str) -> dict:
    from safetensors.torch import load_file  # torch: bf16 checkpoints (numpy has no bfloat16)

    idx = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.isfile(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(ckpt, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise ExportError(f"{ckpt}: no model.safetensors (a safetensors checkpoint is needed)")
    sd: dict = {}
    for fn in files:
        sd.update({k: v.float().numpy() for k, v in load_file(os.path.join(ckpt, fn)).items()})
    return sd


def _permute(w, n_head: int):
    """HF's rotary layout → llama.cpp's (convert_hf_to_gguf's LlamaModel.permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_tensors(sd: dict, hf_config: dict) -> dict:
    """{gguf tensor name: numpy array} from an HF llama state dict (any float dtype)."""
    import numpy as np

    n_head, n_kv = int(hf_config["num_attention_heads"]), int(hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"])
    out = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32) if w.dtype != np.float32 else w
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            out["output.weight"] = w
        elif name.startswith("model.layers."):
            parts = name.split(".")
            i, rest = parts[2], ".".join(parts[3:-1])
            if rest not in _LAYER or parts[-1] != "weight":
                raise ExportError(f"tensor {name}: not a llama weight llama.cpp knows")
            if rest == "self_attn.q_proj":
                w = _permute(w, n_head)
            elif rest == "self_attn.k_proj":
                w = _permute(w, n_kv)
            out[f"blk.{i}.{_LAYER[rest]}.weight"] = w
        elif name.endswith("rotary_emb.inv_freq"):
            continue
        else:
            raise ExportError(f"tensor {name}: not a llama weight llama.cpp knows")
    return out


def export_gguf(ckpt: str, out: str | None = None, template: str | None = None, log=None,
                gguf_type: str | None = None) -> str:
    """Write `ckpt` as a GGUF (default `CKPT/toolkit-<type>.gguf`; reused while newer than the
    checkpoint's weights) and return its path. `gguf_type`: f16 (default; env
    TOOLKIT_SERVE_GGUF_TYPE) or q8_0."""
    ckpt = os.path.abspath(ckpt)
    hf_config = _config(ckpt)
    if hf_config.get("model_type") != "llama":
        raise ExportError(f"{ckpt}: model_type {hf_config.get('model_type')!r}: only llama checkpoints are exported "
                          "(serve others with --backend transformers)")
    gguf_type = (gguf_type or os.environ.get("TOOLKIT_SERVE_GGUF_TYPE") or "f16").lower()
    if gguf_type not in GGUF_TYPES:
        raise ExportError(f"GGUF type {gguf_type!r}: one of {', '.join(GGUF_TYPES)}")
    out = out or os.path.join(ckpt, f"toolkit-{gguf_type}.gguf")
    weights = [os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors")]
    if os.path.isfile(out) and weights and os.path.getmtime(out) >= max(os.path.getmtime(w) for w in weights):
        return out
    template = check_template(template or find_template(ckpt), hf_config)
    t0 = time.monotonic()
    write_gguf(_state_dict(ckpt), hf_config, template, out, gguf_type, what=ckpt)
    if log:
        log(f"gguf: wrote {out} ({os.path.getsize(out) >> 20} MiB, template {os.path.basename(template)}) "
            f"in {time.monotonic() - t0:.1f} s")
    return out


def check_template(template: str, hf_config: dict) -> str:
    """`template` when its architecture sizes are the checkpoint config's (else ExportError)."""
    sizes = _template_sizes(template)
    want = {k: hf_config.get(k) for k in CFG_KEYS}
    if sizes != want:
        raise ExportError(f"template {template} has sizes {sizes}, the checkpoint {want}")
    return template


_TEMPLATES: dict = {}
# ... and on disk between processes ($TOOLKIT_HOME/gguf-templates/, toolkit.diskcache): gguf's reader
# spends ~6 CPU-s on SmolLM2's 49k-token vocabulary and merges, a pickle of the result loads in ~0.03 s
DISK_CACHE_ENV = "TOOLKIT_GGUF_TEMPLATE_CACHE"
DISK_SUBDIR = "gguf-templates"
DISK_MAGIC = b"toolkit-gguf-template/1\n"
DISK_MAX_ENTRIES = 8
DISK_STATS: Counter = Counter()


def _check_metadata(v) -> None:
    arch, names, fields = v
    if not (isinstance(arch, str) and isinstance(names, list) and isinstance(fields, list)
            and all(isinstance(f, tuple) and len(f) == 4 for f in fields)):
        raise ValueError("not (architecture, tensor names, fields)")


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return ""


def template_metadata(template: str) -> tuple[str, list[str], list[tuple]]:
    """(architecture, tensor names in order, [(key, value, value type, array item type)]) of a
    template GGUF, every key a trained model keeps (not the file type or quantization version).
    Parsed once per file version: gguf's reader spends seconds on a 49k-token vocabulary, and GRPO's
    llama.cpp generation exports every step. Kept per process, and on disk under $TOOLKIT_HOME
    (keyed by the file's path, size and mtime, the gguf package's version and this module's code;
    `TOOLKIT_GGUF_TEMPLATE_CACHE=0` turns that off)."""
    import gguf

    st = os.stat(template)
    key = (os.path.abspath(template), st.st_mtime_ns, st.st_size)
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    dkey = hashlib.sha256(repr((key, _gguf_version(), sys.version,
                                diskcache.source_digest((Path(__file__).parent,)))).encode()).hexdigest()
    path = diskcache.path_of(DISK_SUBDIR, dkey)
    on = diskcache.enabled(DISK_CACHE_ENV)
    meta = diskcache.read(path, dkey, DISK_MAGIC, DISK_STATS, "gguf template cache", check=_check_metadata,
                          expect=tuple) if on else None
    if meta is None:
        reader = gguf.GGUFReader(template)
        fields = []
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type",
                                                               "general.quantization_version"):
                continue
            vt = field.types[0]
            sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
            fields.append((field.name, field.contents(), vt, sub))
        meta = (reader.fields["general.architecture"].contents(), [t.name for t in reader.tensors], fields)
        if on:
            diskcache.write(path, dkey, meta, DISK_MAGIC, DISK_STATS, "gguf template cache", DISK_MAX_ENTRIES)
    _TEMPLATES[key] = meta
    return meta


def write_gguf(sd: dict, hf_config: dict, template: str, out: str, gguf_type: str = "f16", what: str = "weights") -> str:
    """Write the HF llama state dict `sd` (numpy arrays or tensors) as `out` (atomically), every
    metadata key copied from `template` (a GGUF of the same architecture and sizes). GRPO's
    llama.cpp generation (`toolkit.train.grpo.generators.LlamaCppGenerator`) calls it with the
    policy's live weights each step; `export_gguf` with a checkpoint's."""
    import gguf
    import gguf.quants
    import numpy as np

    if gguf_type not in GGUF_TYPES:
        raise ExportError(f"GGUF type {gguf_type!r}: one of {', '.join(GGUF_TYPES)}")
    arch, names, fields = template_metadata(template)
    tensors = gguf_tensors(sd, hf_config)
    if hf_config.get("tie_word_embeddings") and "output.weight" not in names:
        tensors.pop("output.weight", None)
    missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
    if missing or extra:
        raise ExportError(f"{what}: tensors do not match the template: missing {missing[:4]}, extra {extra[:4]}")
    tmp = f"{out}.tmp{os.getpid()}"
    writer = gguf.GGUFWriter(tmp, arch=arch)
    for name, value, vt, sub in fields:
        writer.add_key_value(name, value, vt, sub_type=sub)
    q8 = gguf_type == "q8_0"
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_F16)
    Q8 = gguf.GGMLQuantizationType.Q8_0
    for name in names:  # the template's order
        w = tensors[name]
        if w.ndim < 2:
            writer.add_tensor(name, w.astype(np.float32))
        elif q8 and w.shape[-1] % gguf.GGML_QUANT_SIZES[Q8][0] == 0:
            writer.add_tensor(name, gguf.quants.quantize(w.astype(np.float32), Q8), raw_dtype=Q8)
        else:
            writer.add_tensor(name, w.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m toolkit.llm.gguf_export", description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("--out")
    ap.add_argument("--template")
    ap.add_argument("--type", choices=GGUF_TYPES, default=None)
    a = ap.parse_args(argv)
    try:
        print(export_gguf(a.ckpt, a.out, a.template, log=lambda m: print(m, file=sys.stderr), gguf_type=a.type))
    except ExportError as e:
        print(f"gguf_export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
