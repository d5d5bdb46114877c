"""The ASTRA / EigenData / Simia strategies' options are typed: a bad value of a strategy key is a
usage error (exit 2) naming the key before any record or request, from a recipe, a flag or a library
caller's mapping; an unset key gets the one default of its options model."""

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.flows.astra import options as AO
from toolkit.flows.eigendata import options as EO
from toolkit.flows.simia import options as SO
from toolkit.io import UsageError
from toolkit.options import SimulateEnvOptions
from toolkit.stages import simulate_env, strategies

RECORD = '{"id": "r1", "env": {"backend": "sqlite", "id": "airline"}}\n'


@pytest.mark.parametrize("command,strategy,section,key", [
    (cli.gen_task, "astra", "gen-task:\n  augment: [diversity, bogus]\n", "augment"),
    (cli.gen_plan, "astra", "gen-plan:\n  walks: 0\n", "walks"),
    (cli.gen_task, "astra-qa", "gen-task:\n  max_hops: many\n", "max_hops"),
    (cli.gen_task, "sea", "gen-task:\n  synthesis_max_calls: lots\n", "synthesis_max_calls"),
    (cli.validate_task, "eigendata", "validate-task:\n  validate_mode: sloppy\n", "validate_mode"),
    (cli.repair, "eigendata", "repair:\n  max_rounds: 0\n", "max_rounds"),
    (cli.make_verifier, "eigendata", "make-verifier:\n  verifier_source: oracle\n", "verifier_source"),
    (cli.make_verifier, "astra", "make-verifier:\n  sandbox_memory_mb: -5\n", "sandbox_memory_mb"),
    (cli.validate_task, "simia", "validate-task:\n  seed_trajectory: -1\n", "seed_trajectory"),
    (cli.gen_task, "simia", "gen-task:\n  fault_rate: 2\n", "fault_rate"),
])
def test_a_bad_strategy_value_is_a_usage_error_naming_the_key(tmp_path, command, strategy, section, key):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(section)
    r = CliRunner().invoke(command, ["--strategy", strategy, "--recipe", str(recipe), "--model", "m",
                                     "--base-url", "http://127.0.0.1:9/v1"], input=RECORD)
    assert r.exit_code == 2, r.output
    assert key in r.output and r.stdout == ""


def test_simulate_env_trajectory_options_are_typed(tmp_path):
    r = CliRunner().invoke(cli.simulate_env, ["--mode", "trajectory", "-n", "0", "--model", "m",
                                              "--base-url", "http://127.0.0.1:9/v1"], input=RECORD)
    assert r.exit_code == 2 and "n" in r.output, r.output
    with pytest.raises(UsageError, match="prompt_family"):
        simulate_env.build({"mode": "trajectory", "prompt_family": "sharegpt"}, None)
    assert SimulateEnvOptions.typed({"temperatures": "0.2, 0.9"}).temperatures == [0.2, 0.9]
    assert SimulateEnvOptions().n == 1


def test_library_mapping_is_validated_and_defaults_come_from_the_model():
    with pytest.raises(UsageError, match="synthesis_min_calls"):
        strategies.build("gen-task", {"strategy": "sea", "synthesis_min_calls": "x"}, None)
    with pytest.raises(UsageError, match="augment"):
        strategies.build("gen-task", {"strategy": "astra", "augment": ["diversity", "nope"]}, None)
    # unset keys: the strategy model's defaults (one place), per strategy where they differ
    plan = AO.PlanOptions.of(strategies.typed("gen-plan", {"strategy": "astra"}))
    assert (plan.n, plan.walks, plan.seed, plan.max_candidates) == (5, 24, 0, None)
    tasks = AO.TasksOptions.of(strategies.typed("gen-task", {"strategy": "astra", "augment": ["persona"]}))
    assert (tasks.n, tasks.augment) == (3, ["persona"])
    assert EO.GenPlanOptions.of(strategies.typed("gen-plan", {"strategy": "sea"})).n == 4
    assert EO.GenTaskOptions.of(strategies.typed("gen-task", {"strategy": "eigendata"})).n == 1
    rules = SO.RulesOptions.of(strategies.typed("repair", {"strategy": "rules", "keep_raw": True}))
    assert rules.keep_raw is True and rules.system_prompt is None
