"""The strategy registry and the registry-driven commands (gen-plan ... make-verifier)."""

import json

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.io import StageError
from toolkit.schema import Record, Verdict
from toolkit.stages import registry


@pytest.fixture
def dummy_strategy():
    registry.load_all()  # load the flows first, so restoring leaves them registered
    saved = {k: dict(v) for k, v in registry._REGISTRY.items()}

    @registry.strategy("validate-task", "dummy-test", help="passes ids ending in an even digit")
    def build(cfg, ctx):
        async def fn(rec: Record):
            if rec.id.endswith("bad"):
                raise StageError("bad record", field="task")
            ok = int(rec.id[-1]) % 2 == 0
            rec.verdicts.append(Verdict(stage="validate-task", kind="rule", name="even", passed=ok))
            return rec
        return fn

    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def _lines(n):
    return "".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(n))


def test_help_lists_registered_strategies(dummy_strategy):
    out = CliRunner().invoke(cli.validate_task, ["--help"]).output
    assert "dummy-test" in out and "passes ids ending in an even digit" in out


def test_unknown_strategy_is_a_usage_error(dummy_strategy):
    r = CliRunner().invoke(cli.validate_task, ["--strategy", "nope"], input=_lines(1))
    assert r.exit_code == 2


def test_filter_passed_and_failed(dummy_strategy):
    r = CliRunner().invoke(cli.validate_task, ["--strategy", "dummy-test", "--filter", "passed"], input=_lines(5))
    assert r.exit_code == 0
    ids = [json.loads(x)["id"] for x in r.stdout.splitlines()]
    assert ids == ["r0", "r2", "r4"]
    r = CliRunner().invoke(cli.validate_task, ["--strategy", "dummy-test", "--filter", "failed"], input=_lines(5))
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["r1", "r3"]


def test_stage_error_goes_to_rejects(dummy_strategy, tmp_path):
    rej = tmp_path / "rej.jsonl"
    inp = _lines(2) + json.dumps({"id": "rbad"}) + "\n"
    r = CliRunner().invoke(cli.validate_task, ["--strategy", "dummy-test", "--rejects", str(rej)], input=inp)
    assert r.exit_code == 1
    row = json.loads(rej.read_text().splitlines()[0])
    assert row["id"] == "rbad" and row["field"] == "task" and "bad record" in row["error"]
    assert len(r.stdout.splitlines()) == 2
