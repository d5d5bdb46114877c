"""Typed options (toolkit.options) and the validated merge (toolkit.config.resolve): unknown recipe
keys are usage errors naming the nearest valid key, every key can come from TOOLKIT_<KEY> (typed),
other TOOLKIT_* variables are left alone or warned about, defaults live in the models only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from toolkit import cli
from toolkit.domains import load_tasks
from toolkit.llm.testserver import ScriptedServer
from toolkit.options import COMMAND_MODELS, VerifyOptions

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def _config(cmd, args, env=None):
    r = CliRunner().invoke(cmd, [*args, "--print-config"], env=env)
    return r, (yaml.safe_load(r.stdout) if r.exit_code == 0 else None)


def test_misspelled_recipe_key_is_a_usage_error_naming_the_nearest_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("validate-task:\n  strategy: eigendata\n  validate_max_callz: 5\n")
    r = CliRunner().invoke(cli.validate_task, ["--recipe", str(recipe)], input="")
    assert r.exit_code == 2
    assert "'validate_max_callz'" in r.output and "did you mean 'validate_max_calls'" in r.output
    # the same key spelled right is accepted and typed
    recipe.write_text("validate-task:\n  strategy: eigendata\n  validate_max_calls: '5'\n")
    r, cfg = _config(cli.validate_task, ["--recipe", str(recipe)])
    assert r.exit_code == 0, r.output
    assert cfg["validate_max_calls"] == 5 and cfg["validate_min_calls"] == 1  # the strategy's default


def test_defaults_section_is_checked_against_every_command(tmp_path):
    recipe = tmp_path / "r.yaml"
    # lambda_err is verify's, explorer gen-task's: both fine in defaults: for validate-task
    recipe.write_text("defaults:\n  lambda_err: 0.3\n  explorer: llm\n  temperature: 0.5\n")
    r, cfg = _config(cli.validate_task, ["--recipe", str(recipe)])
    assert r.exit_code == 0, r.output
    assert "lambda_err" not in cfg and cfg["temperature"] == 0.5
    r, cfg = _config(cli.verify, ["--recipe", str(recipe)])
    assert cfg["lambda_err"] == 0.3
    # but a key no command knows is an error, with the nearest key of any command
    recipe.write_text("defaults:\n  lamda_err: 0.3\n")
    r = CliRunner().invoke(cli.rollout, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 2 and "'lamda_err'" in r.output and "'lambda_err'" in r.output
    # and a command section is strict: verify's key under rollout is an error
    recipe.write_text("rollout:\n  lambda_err: 0.3\n")
    r = CliRunner().invoke(cli.rollout, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 2 and "'lambda_err'" in r.output


def test_invalid_values_are_usage_errors_naming_key_and_source(tmp_path):
    r = CliRunner().invoke(cli.verify, ["--print-config"], env={"TOOLKIT_LAMBDA_ERR": "abc"})
    assert r.exit_code == 2 and "lambda_err" in r.output and "TOOLKIT_LAMBDA_ERR" in r.output
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  first_message: sometimes\n")
    r = CliRunner().invoke(cli.rollout, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 2 and "first_message" in r.output and "sometimes" in r.output


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates_for_each_command_section(recipe):
    data = yaml.safe_load(recipe.read_text())
    sections = [s for s in data if s != "defaults"]
    assert sections
    for section in sections:
        r = CliRunner().invoke(cli.COMMANDS[section], ["--recipe", str(recipe), "--print-config"])
        assert r.exit_code == 0, (section, r.output)
        cfg = yaml.safe_load(r.output)
        for k, v in data[section].items():  # every key arrived (lists and scalars as written)
            if cfg.get(k) != v:
                assert isinstance(v, (int, float)) and float(cfg[k]) == float(v), (section, k, cfg.get(k), v)


def test_env_sets_recipe_only_keys_typed():
    env = {"TOOLKIT_VALIDATE_MAX_CALLS": "7", "TOOLKIT_PENALIZE_INVALID_CALLS": "false",
           "TOOLKIT_DIFF_EXCLUDE": '["log"]'}
    r, cfg = _config(cli.validate_task, ["--strategy", "eigendata"], env)
    assert r.exit_code == 0, r.output
    assert cfg["validate_max_calls"] == 7
    r, cfg = _config(cli.verify, [], {**env, "TOOLKIT_STRATEGY": '["state_diff", "actions"]'})
    assert cfg["strategy"] == ["state_diff", "actions"] and cfg["penalize_invalid_calls"] is False
    assert cfg["diff_exclude"] == ["log"]
    r, cfg = _config(cli.reflect, ["--strategy", "eigendata"],
                     {"TOOLKIT_PILOT_CRITERIA": '{"max_infeasibility": 0.1}'})
    assert cfg["pilot_criteria"] == {"max_infeasibility": 0.1}
    # precedence: recipe < env < flag
    r, cfg = _config(cli.verify, ["--lambda-err", "0.5"], {"TOOLKIT_LAMBDA_ERR": "0.2"})
    assert cfg["lambda_err"] == 0.5
    r, cfg = _config(cli.verify, [], {"TOOLKIT_LAMBDA_ERR": "0.2"})
    assert cfg["lambda_err"] == 0.2


def test_env_recipe_only_key_takes_effect_in_the_run():
    """TOOLKIT_PREFILTER_LLM=false (a key no flag sets) turns the simia prefilter's LLM call off."""
    from tests.flows.simia.test_prefilter import COMPLETE as seed
    from tests.flows.simia.test_prefilter import GRADE_OK

    with ScriptedServer([GRADE_OK]) as srv:
        args = ["--strategy", "simia", "--base-url", srv.base_url, "--model", "scripted"]
        CliRunner().invoke(cli.validate_task, args, input=json.dumps(seed) + "\n")
        with_llm = srv.chat_count
        assert with_llm == 1
        CliRunner().invoke(cli.validate_task, args, input=json.dumps(seed) + "\n",
                           env={"TOOLKIT_PREFILTER_LLM": "false"})
        assert srv.chat_count == with_llm


def test_unknown_toolkit_env_warns_and_known_non_option_vars_stay_quiet():
    env = {"TOOLKIT_FOO": "1", "TOOLKIT_LAMBDA_ER": "0.2", "TOOLKIT_HOME": "/tmp/x",
           "TOOLKIT_STAGE_LOG": "/tmp/x.jsonl", "TOOLKIT_EMBEDDED_PORT": "1", "TOOLKIT_PROMPTS": "/tmp/p",
           "TOOLKIT_EXPLORER": "llm"}  # gen-task's key: not rollout's, but not unknown either
    r = CliRunner().invoke(cli.rollout, ["--print-config"], env=env)
    assert r.exit_code == 0, r.output
    assert "TOOLKIT_FOO" in r.stderr and "did you mean TOOLKIT_LAMBDA_ERR" in r.stderr
    for quiet in ("TOOLKIT_HOME", "TOOLKIT_STAGE_LOG", "TOOLKIT_EMBEDDED_PORT", "TOOLKIT_PROMPTS", "TOOLKIT_EXPLORER"):
        assert quiet not in r.stderr


def test_verifier_source_from_env_takes_effect_without_llm_requests():
    task = json.dumps(load_tasks("airline")[0]) + "\n"
    with ScriptedServer(["not a verifier"]) as srv:
        args = ["--strategy", "eigendata", "--base-url", srv.base_url, "--model", "scripted", "--max-retries", "0"]
        r, cfg = _config(cli.make_verifier, args, {"TOOLKIT_VERIFIER_SOURCE": "template"})
        assert cfg["verifier_source"] == "template"
        r = CliRunner().invoke(cli.make_verifier, args, input=task,
                                               env={"TOOLKIT_VERIFIER_SOURCE": "template"})
        assert r.exit_code == 0, r.stderr
        rec = json.loads(r.stdout)
        assert rec["verifier"]["self_test"]["generator"] == "template" and srv.chat_count == 0
        assert rec["provenance"][-1]["command"] == "make-verifier"
        # control: without the variable the LLM path runs (and falls back to the template)
        r = CliRunner().invoke(cli.make_verifier, args, input=task)
        assert srv.chat_count > 0


def test_click_options_are_model_fields_with_the_models_defaults():
    for name, cmd in cli.COMMANDS.items():
        fields = cli.options_model(name).model_fields  # with role-prefixed LLM keys
        assert set(COMMAND_MODELS[name].model_fields) <= set(fields)
        cmd.bind_defaults()  # what every parse (and --help) does first
        for p in cmd.params:
            key = cli.FLAG_KEYS.get(p.name, p.name)
            assert key in fields, (name, key)
            d = fields[key].default
            if d is not None and not isinstance(d, bool):
                assert p.default == (tuple(d) if p.multiple else d), (name, key)
    assert VerifyOptions().lambda_err == 0.1
    assert "[default: 0.1]" in " ".join(CliRunner().invoke(cli.verify, ["--help"]).output.split())


def test_constrain_tool_calls_flag_and_role_key_are_typed(tmp_path):
    r = CliRunner().invoke(cli.rollout, ["--constrain-tool-calls", "grammar", "--print-config"])
    assert r.exit_code == 0 and "constrain_tool_calls: grammar" in r.output
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  agent_constrain_tool_calls: regex\n")
    r = CliRunner().invoke(cli.rollout, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 2 and "agent_constrain_tool_calls" in r.output and "regex" in r.output


def test_grpo_print_config_is_the_effective_configuration(tmp_path):
    """`grpo --print-config` prints what the run would use: model defaults < the variant's preset <
    recipe < env < flags. Every preset trains on-policy; ta-grpo follows LOGIGEN eq. 5 (the turn's
    ratio) and penalizes policy violations only."""
    for variant in ("grpo", "eigendata", "astra", "ta-grpo", "simia"):
        r, cfg = _config(cli.grpo, ["--variant", variant])
        assert r.exit_code == 0, r.output
        assert cfg["variant"] == variant and cfg["max_staleness"] == 0, (variant, cfg)
        assert cfg["num_generations"] == 4 and cfg["learning_rate"] == 1e-6  # model defaults, not null
    _, ta = _config(cli.grpo, ["--variant", "ta-grpo"])
    assert (ta["turn_ratio"], ta["loss_type"], ta["advantage"], ta["penalize_invalid_calls"]) == (
        "turn", "turn", "ta_grpo", False)
    _, ei = _config(cli.grpo, ["--variant", "eigendata"])
    assert (ei["filter"], ei["loss_type"], ei["turn_ratio"]) == ("dynamic", "group_token", "token")
    _, si = _config(cli.grpo, ["--variant", "simia"])
    assert si["verify_strategy"] == ["judge"] and si["judge_rubric"] == "simia" and si["beta"] == 0.001
    # the recipe overrides the preset (and picks the variant), env overrides the recipe, flags env
    recipe = tmp_path / "r.yaml"
    recipe.write_text("grpo:\n  variant: ta-grpo\n  turn_ratio: token\n  penalize_invalid_calls: true\n"
                      "  num_generations: 8\n")
    r, cfg = _config(cli.grpo, ["--recipe", str(recipe)])
    assert (cfg["variant"], cfg["turn_ratio"], cfg["penalize_invalid_calls"], cfg["loss_type"]) == (
        "ta-grpo", "token", True, "turn")
    r, cfg = _config(cli.grpo, ["--recipe", str(recipe), "--max-staleness", "1"], env={"TOOLKIT_NUM_GENERATIONS": "6"})
    assert cfg["max_staleness"] == 1 and cfg["num_generations"] == 6 and cfg["turn_ratio"] == "token"
    r, cfg = _config(cli.grpo, ["--recipe", str(recipe), "--group-size", "3"], env={"TOOLKIT_NUM_GENERATIONS": "6"})
    assert cfg["num_generations"] == 3
    # a variant named on the command line over one in the recipe: its preset, the recipe's own keys kept
    r, cfg = _config(cli.grpo, ["--recipe", str(recipe), "--variant", "astra"])
    assert (cfg["variant"], cfg["filter"], cfg["loss_type"], cfg["turn_ratio"]) == ("astra", "adaptive", "dapo", "token")
    # an unknown variant in a recipe, and a bad value, are usage errors naming the key
    recipe.write_text("grpo:\n  variant: nope\n")
    r = CliRunner().invoke(cli.grpo, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 2 and "unknown variant 'nope'" in r.output and "ta-grpo" in r.output
    recipe.write_text("grpo:\n  turn_ratio: sequence\n")
    r = CliRunner().invoke(cli.grpo, ["--recipe", str(recipe), "--print-config"])
    assert r.exit_code == 2 and "turn_ratio" in r.output


def test_grpo_options_from_a_plain_dict_apply_the_preset_too():
    from toolkit.io import UsageError
    from toolkit.train.grpo import GRPOOptions

    o = GRPOOptions.from_config({"variant": "ta-grpo", "use_cpu": True, "num_generations": 3})
    assert (o.turn_ratio, o.penalize_invalid_calls, o.max_staleness, o.num_generations) == ("turn", False, 0, 3)
    assert GRPOOptions.from_config({"variant": "ta-grpo", "turn_ratio": "token"}).turn_ratio == "token"
    assert GRPOOptions.from_config({}).variant == "grpo"
    with pytest.raises(UsageError, match="unknown variant"):
        GRPOOptions.from_config({"variant": "nope"})
    with pytest.raises(UsageError, match="num_generations"):
        GRPOOptions.from_config({"num_generations": 1})
    with pytest.raises(UsageError, match="colocate"):
        GRPOOptions.from_config({"generation": "vllm", "vllm_mode": "colocate", "max_staleness": 1})


def test_every_toolkit_variable_the_code_reads_is_known():
    """A `TOOLKIT_*` variable the toolkit itself reads (TOOLKIT_VLLM_PYTHON, TOOLKIT_MCP_WORKDIR_ROOTS,
    ...) never draws an "ignoring environment variable: not an option key" warning from a command
    (stderr noise, and output a recipe check parses)."""
    import re as _re
    from pathlib import Path as _Path

    from toolkit.cli.run import all_option_keys
    from toolkit.options import NON_OPTION_ENV, NON_OPTION_ENV_PREFIXES

    root = _Path(__file__).resolve().parent.parent / "toolkit"
    names = {m for p in root.rglob("*.py") for m in _re.findall(r"\bTOOLKIT_([A-Z0-9_]*[A-Z0-9])\b", p.read_text())}
    keys = all_option_keys()
    unknown = sorted(n for n in names if n not in NON_OPTION_ENV and not n.startswith(NON_OPTION_ENV_PREFIXES)
                     and n.lower() not in keys)
    assert names and not unknown, unknown
