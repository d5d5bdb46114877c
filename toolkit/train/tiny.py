"""A tiny chat model built offline, for CPU tests and benchmarks (no download).

`build_tiny_model(path)` trains a byte-level BPE tokenizer with `tokenizers` on text rendered from
the bundled domains (a few seconds), sets the toolkit chat template (ChatML + Hermes tool calls
with `{% generation %}` markers, EOS = <|im_end|>) and saves a randomly initialised Qwen2 model
(hidden size 64, 2 layers) next to it. Load it like any checkpoint: `--model PATH`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from toolkit import domains
from toolkit.envs import load_env
from toolkit.formats.hermes import render_hermes
from toolkit.formats.hermes import CHAT_TEMPLATE, SPECIAL_TOKENS


def _corpus() -> list[str]:

    texts: list[str] = []
    for d in domains.list_domains():
        try:
            with load_env({"backend": "sqlite", "id": d}) as env:
                tools = env.tools("agent")
                policy = env.policy() or ""
        except Exception:  # pragma: no cover - a domain that cannot load here
            continue
        for rec in domains.load_tasks(d):
            task = rec.get("task") or {}
            msgs = [{"role": "system", "content": policy[:2000]},
                    {"role": "user", "content": task.get("instruction") or ""}]
            for a in (task.get("ground_truth") or {}).get("actions") or []:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": a["name"], "arguments": a.get("arguments") or {}}}]})
                msgs.append({"role": "tool", "content": json.dumps({"ok": True, "result": a.get("arguments")})})
            msgs.append({"role": "assistant", "content": "Done. Anything else?"})
            texts.append(render_hermes(msgs, tools))
    texts += ["The quick brown fox jumps over the lazy dog. 0123456789 {}[]\":,"] * 4
    return texts


def build_tiny_model(path: str | os.PathLike, vocab_size: int = 1024, hidden_size: int = 64,
                     layers: int = 2, seed: int = 0, heads: int = 4, kv_heads: int = 2) -> str:
    """Build (once) and return the directory of a tiny tokenizer + random Qwen2 model. The default
    head size is 16; vLLM's CPU attention takes 32 and up (`heads=2, kv_heads=1`)."""
    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return str(path)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 additional_special_tokens=[t for t in SPECIAL_TOKENS
                                                            if t not in ("<|im_end|>", "<|endoftext|>")])
    hf.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(hf), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = hf.eos_token_id
    model.generation_config.pad_token_id = hf.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    hf.save_pretrained(tmp)
    os.replace(tmp, path) if not path.exists() or not any(path.iterdir()) else None
    if tmp.exists():  # path existed (empty dir race): move files in
        for f in tmp.iterdir():
            os.replace(f, path / f.name)
        tmp.rmdir()
    return str(path)
