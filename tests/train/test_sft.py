"""`sft` with TRL's SFTTrainer on the tiny offline model: loss mask, training, resume, LoRA, CLI."""

import json
import os


from tests.conftest import jsonl, requires_train, run_cmd
from toolkit.train import export as X

pytestmark = requires_train

CPU = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "report_to": "none",
       "logging_steps": 1, "lr_scheduler_type": "constant", "per_device_train_batch_size": 1}


def expected_trained_text(messages: list[dict]) -> str:
    """What the {% generation %} spans cover, written by hand: for each assistant message its
    content, its tool calls as <tool_call> JSON blocks, and the end-of-turn token."""
    out = []
    for m in messages:
        if m["role"] != "assistant":
            continue
        parts = [m.get("content") or ""]
        for k, tc in enumerate(m.get("tool_calls") or []):
            sep = "\n" if (m.get("content") or k > 0) else ""
            parts.append(sep + "<tool_call>\n" + json.dumps(
                {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}, ensure_ascii=False)
                + "\n</tool_call>")
        out.append("".join(parts) + "<|im_end|>")
    return "".join(out)


def test_loss_mask_is_exactly_the_assistant_turns(tiny_model, verified_airline):
    from toolkit.train import sft

    tok = sft.load_tokenizer(tiny_model)
    n = 0
    for rec in verified_airline:
        for row in X.record_rows(rec, filter="passed"):
            ex = sft.tokenize_row(tok, row)
            got = sft.trained_text(tok, ex)
            assert got == expected_trained_text(row["messages"])
            assert "<tool_response>" not in got and row["messages"][1]["content"] not in got
            n += 1
    assert n == len(verified_airline)
    # one concrete turn by hand: task 001 cancels reservation 1003 with dict arguments
    row = X.record_rows(verified_airline[0])[0]
    got = sft.trained_text(tok, sft.tokenize_row(tok, row))
    assert got.startswith('<tool_call>\n{"name": "update_reservation", "arguments": '
                          '{"reservation_id": 1003, "status": "cancelled"}}\n</tool_call><|im_end|>')


def test_loss_mask_role_user_is_exactly_the_user_turns(tiny_model, verified_airline):
    from toolkit.train import sft

    tok = sft.load_tokenizer(tiny_model)
    rec = verified_airline[0]
    row = X.record_rows(rec, role="user")[0]
    got = sft.trained_text(tok, sft.tokenize_row(tok, row))
    user_turns = [m.content for m in rec.trajectories[0].messages if m.role == "user"]
    assert user_turns and got == "".join(u + "<|im_end|>" for u in user_turns)
    agent_texts = [m.content for m in rec.trajectories[0].messages if m.role == "assistant" and m.content]
    assert all(a not in got for a in agent_texts)


def _metrics(path):
    with open(os.path.join(path, "metrics.jsonl")) as f:
        return [json.loads(x) for x in f]


def test_sft_cli_runs_steps_and_resumes(tiny_model, verified_airline, tmp_path):
    from toolkit.train import sft

    recipe = tmp_path / "r.yaml"
    recipe.write_text("sft:\n  save_steps: 2\n  learning_rate: 0.001\n  logging_steps: 1\n"
                      "  lr_scheduler_type: constant\n  per_device_train_batch_size: 2\n  report_to: none\n")
    out = tmp_path / "ckpt"
    stdin = jsonl([r.model_dump(mode="json", by_alias=True) for r in verified_airline])
    p = run_cmd(["sft", "--model", tiny_model, "--output-dir", str(out), "--recipe", str(recipe), "--max-steps", "2",
                 "--filter", "passed", "--limit", "4", "--tool-schema", "compact", "--system-prompt", "drop"],
                stdin=stdin, env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (out / "checkpoint-2").is_dir() and (out / "model.safetensors").exists()
    m = _metrics(out)
    assert [x["step"] for x in m if "loss" in x] == [1, 2]
    assert all(x["role"] == "assistant" for x in m)
    run = json.loads((out / "run.json").read_text())
    assert run["result"]["rows"] == 4 and run["config"]["per_device_train_batch_size"] == 2  # recipe reached SFTConfig
    # resume: two more steps continue from checkpoint-2 (step numbers continue, optimizer state reloaded)
    rows = [r for rec in verified_airline[:4] for r in X.record_rows(rec, tool_schema="compact", system_prompt="drop")]
    res = sft.train(rows, {**CPU, "max_steps": 4, "save_steps": 2, "learning_rate": 1e-3,
                           "per_device_train_batch_size": 2, "resume_from_checkpoint": "auto"}, tiny_model, str(out))
    assert res["resumed_from"].endswith("checkpoint-2") and res["steps"] == 4
    assert [x["step"] for x in _metrics(out) if "loss" in x] == [1, 2, 3, 4]
    assert (out / "checkpoint-4").is_dir()


def _short_rows():
    from tests.train.test_export import dual_control_record

    return X.record_rows(dual_control_record()) * 8


def test_loss_decreases_on_a_repeated_batch(tiny_model, tmp_path):
    from toolkit.train import sft

    res = sft.train(_short_rows(), {**CPU, "max_steps": 12, "learning_rate": 3e-3, "save_strategy": "no"},
                    tiny_model, str(tmp_path / "o"))
    losses = [x["loss"] for x in _metrics(tmp_path / "o") if "loss" in x]
    assert res["steps"] == 12 and len(losses) == 12
    assert losses[-1] < 0.7 * losses[0], losses


def test_lora_and_user_role(tiny_model, tmp_path):
    from tests.train.test_export import dual_control_record
    from toolkit.train import sft

    rows = X.record_rows(dual_control_record(), role="user") * 4
    res = sft.train(rows, {**CPU, "max_steps": 3, "learning_rate": 3e-3, "save_strategy": "no", "lora": {"r": 4},
                           "role": "user"}, tiny_model, str(tmp_path / "lora"))
    assert res["steps"] == 3
    cfg = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["peft_type"] == "LORA"
    assert all(x["role"] == "user" for x in _metrics(tmp_path / "lora"))


def test_usage_errors(tmp_path):
    p = run_cmd(["sft"], stdin=jsonl([]))
    assert p.returncode == 1 and "no training rows" in p.stderr
    from tests.train.test_export import dual_control_record

    p = run_cmd(["sft", "--output-dir", str(tmp_path)], stdin=jsonl([dual_control_record().model_dump(mode="json", by_alias=True)]))
    assert p.returncode == 2 and "--model PATH" in p.stderr


def test_flow_recipes_sections_are_real_settings():
    """Every key of each flow recipe's sft: / grpo: section reaches a real setting (no silent typos)."""
    import dataclasses

    import yaml
    from trl import SFTConfig

    from tests.conftest import ROOT
    from toolkit.train import sft
    from toolkit.train.grpo import GRPOOptions

    sft_fields = {f.name for f in dataclasses.fields(SFTConfig)} | sft._OURS | {"assistant_only_loss"}
    grpo_fields = set(GRPOOptions.model_fields) | {"use_cpu", "accelerator", "lora", "chat_template", "require",
                                                   "diff_exclude", "model_dtype"}
    # the LLM roles grpo runs (user simulator, judge): `<role>_<llm option>` keys reach their clients
    from toolkit.options import CORE_ROLES, LLMOpts

    grpo_fields |= {f"{role}_{k}" for role in CORE_ROLES["grpo"] for k in LLMOpts.model_fields}
    for flow in ("logigen", "eigendata", "astra", "simia"):
        recipe = yaml.safe_load((ROOT / "recipes" / f"{flow}.yaml").read_text())
        assert set(recipe["sft"]) <= sft_fields, (flow, set(recipe["sft"]) - sft_fields)
        assert set(recipe["grpo"]) <= grpo_fields, (flow, set(recipe["grpo"]) - grpo_fields)
        o = GRPOOptions.from_config(recipe["grpo"])
        assert o.variant == recipe["grpo"]["variant"]
        kw = sft.trainer_kwargs(recipe["sft"], SFTConfig, {"output_dir": "x", "report_to": "none", **sft.cpu_defaults()})
        kw.update(sft.cpu_defaults())
        SFTConfig(**kw)  # constructs: every value has the right type


def test_shared_prefix_steps_equal_the_per_row_forward(tiny_model, verified_airline, tmp_path, monkeypatch):
    """With 4 rows per step, the rows' common prefix (tool schemas) is forwarded once
    (toolkit.train.prefix, on by default in one process): the same losses and weights as the per-row
    forward (shared_prefix: false)."""
    import torch
    from safetensors.torch import load_file

    from toolkit.train import prefix, sft

    rows = [x for r in verified_airline[:8] for x in X.record_rows(r, filter="passed", tool_schema="minimal",
                                                                   system_prompt="drop")]
    calls = []
    real = prefix.prefix_cache
    monkeypatch.setattr(prefix, "prefix_cache", lambda *a: calls.append(a[1].shape) or real(*a))
    out = {}
    for mode in (None, False):
        d = tmp_path / str(mode)
        sft.train(rows, {**CPU, "max_steps": 2, "learning_rate": 1e-3, "save_strategy": "no", "seed": 3,
                         "per_device_train_batch_size": 4, "shared_prefix": mode}, tiny_model, str(d))
        out[mode] = ([x["loss"] for x in _metrics(d) if "loss" in x], load_file(d / "model.safetensors"))
        if mode is None:
            assert len(calls) == 2 and all(s[1] >= 64 for s in calls), calls  # one prefix forward per step
    (l1, w1), (l0, w0) = out[None], out[False]
    assert len(calls) == 2 and len(l1) == 2 and all(abs(a - b) < 1e-4 * max(1.0, abs(b)) for a, b in zip(l1, l0))
    assert all(torch.allclose(w1[k], w0[k], atol=1e-5) for k in w0)
