"""toolkit.integrations.trl in a real `trl.GRPOTrainer`: `dataset(tasks)` + `environment_factory(tasks)`
as is, one `train()` step whose tool calls TRL's own tool loop parses and executes on the
environment, and whose reward (the environment's `get_reward`: the toolkit's verify) TRL logs:
1.0 when the model's calls are the reference actions, 0.0 when it makes none.

The model is the tiny random Qwen2 of the tests with TRL's Qwen2.5 chat template (TRL does not
recognise the toolkit's Hermes template); its sampled ids are replaced by scripted completions
(`ScriptedGRPOTrainer._generate_single_turn`), everything else is TRL's. The training step runs
on the two small python environments (two tool sets: TRL's dict form), whose prompts are a few
hundred tokens: an airline prompt with its tool schemas is ~16k tokens of the tiny tokenizer, and
one such step took 700 s on 2 busy cores (it passed: rewards/AirlineEnv/mean 1.0). The airline and
hotel classes are exercised below without the trainer (the methods TRL calls, their schemas)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("trl", reason="needs trl (extra `train`)")
pytest.importorskip("datasets", reason="needs datasets")

from tests.integrations.fixtures import (  # noqa: E402
    HOTEL_TASKS, PYTHON_TASKS, airline_tasks, final_message, oracle, records)


def _scripted_trainer_cls():
    from trl import GRPOTrainer

    class ScriptedGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer whose model "samples" scripted text: for the task found in the
        prompt, the next reference action as a Qwen2.5 tool call, then a final message."""

        script: dict = {}
        mode = "oracle"

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            out = []
            for ids in prompt_ids:
                text = self.processing_class.decode(ids)
                rec = next(r for opening, r in self.script.items() if opening in text)
                done = text.count("<tool_response>")
                calls = oracle(rec) if self.mode == "oracle" else []
                if done < len(calls):
                    name, args = calls[done]
                    reply = "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call><|im_end|>"
                else:
                    reply = (final_message(rec) if self.mode == "oracle" else "I cannot help.") + "<|im_end|>"
                out.append(self.processing_class.encode(reply, add_special_tokens=False))
            return out, None

    return ScriptedGRPOTrainer


@pytest.fixture(scope="module")
def tokenizer_and_model(tiny_model):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = qwen2_5_chat_template  # a template TRL recognises (same <tool_call> format)
    return tok, tiny_model


def _train(tasks, tok, model_dir, out, mode: str, n: int):
    import torch
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from toolkit.integrations.trl import dataset, environment_factory

    from toolkit.episodes.text import opening_message

    cls = _scripted_trainer_cls()
    cls.script = {opening_message(r): r for r in records(tasks)}
    cls.mode = mode
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = GRPOConfig(output_dir=str(out), max_steps=1, per_device_train_batch_size=n, num_generations=2,
                      max_completion_length=512, logging_steps=1, report_to="none", use_cpu=True,
                      learning_rate=1e-5, save_strategy="no", bf16=False, shuffle_dataset=False)
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    trainer = cls(model=model, args=args, processing_class=tok, train_dataset=dataset(tasks),
                  environment_factory=environment_factory(tasks))
    trainer.train()
    return trainer, trainer.state.log_history[0]


def test_factory_shapes(tmp_path):
    from toolkit.integrations.trl import dataset, environment_factory

    air = airline_tasks(tmp_path)
    one = environment_factory(air)
    assert isinstance(one, type) and one.__name__ == "AirlineEnv"
    ds = dataset(air)
    assert ds.column_names == ["prompt", "task_id"] and len(ds) == 6
    assert ds[0]["prompt"][1]["content"] == records(air)[0].task.instruction
    env = one()
    env.reset(**ds[0])
    rec = records(air)[0]
    for name, args in oracle(rec):
        assert "error" not in json.loads(getattr(env, name)(**args))
    assert env.get_reward() == 1.0
    env.reset(**ds[0])
    assert env.get_reward() == 0.0
    with pytest.raises(KeyError, match="task_id"):
        env.reset(task_id="nope")

    both = tmp_path / "both.jsonl"
    both.write_text(air.read_text() + HOTEL_TASKS.read_text().replace(
        '"../hotel"', json.dumps(str(HOTEL_TASKS.parent.parent / "hotel"))))
    many = environment_factory(both)
    assert sorted(many) == ["airline", "hotel"] and many["hotel"].__name__ == "HotelEnv"
    ds2 = dataset(both)
    assert ds2.column_names == ["prompt", "task_id", "environment"]
    assert ds2["environment"] == ["airline"] * 6 + ["hotel"] * 3


def test_schemas_come_from_the_environment(tmp_path):
    from transformers.utils import get_json_schema

    from toolkit.envs import load_env
    from toolkit.integrations.trl import environment_factory

    cls = environment_factory(HOTEL_TASKS)
    with load_env({"backend": "sqlite", "path": str(HOTEL_TASKS.parent.parent / "hotel")}) as env:
        tools = {t["function"]["name"]: t["function"] for t in env.tools("agent")}
    methods = {n for n in dir(cls) if not n.startswith("_") and n not in ("reset", "get_reward")}
    assert methods == set(tools)
    for name, f in tools.items():
        got = get_json_schema(getattr(cls, name))
        got = got.get("function", got)  # transformers 5.x wraps it as {"type": "function", "function": {...}}
        assert got["name"] == name and got["description"] == f["description"].strip()
        assert set(got["parameters"]["properties"]) == set(f["parameters"]["properties"])
        assert set(got["parameters"].get("required", [])) == set(f["parameters"].get("required", []))
        for p, ps in f["parameters"]["properties"].items():
            gp = got["parameters"]["properties"][p]
            if "enum" in ps:
                assert [v for v in gp["enum"] if v is not None] == [v for v in ps["enum"] if v is not None], (name, p)
            if ps.get("type") in ("string", "integer", "number", "boolean"):
                assert gp["type"] == ps["type"], (name, p, gp)


@pytest.mark.parametrize("mode,expected", [("oracle", 1.0), ("nothing", 0.0)])
def test_grpo_train_step_rewards(tmp_path, tokenizer_and_model, mode, expected):
    tok, model_dir = tokenizer_and_model
    trainer, log = _train(PYTHON_TASKS, tok, model_dir, tmp_path / "out", mode, n=4)
    # both environments (dict form) were used, each rollout scored by its environment's get_reward
    assert log["rewards/PantryEnv/mean"] == expected and log["rewards/OrdersDeskEnv/mean"] == expected, log
    assert log["reward"] == expected and trainer.state.global_step == 1 and "loss" in log
    if mode == "oracle":
        assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0, log
    else:
        assert log["tools/call_frequency"] == 0.0, log
