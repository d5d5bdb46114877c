import json

import pytest
from pydantic import ValidationError

from tests.conftest import ROOT, make_record
from toolkit.schema import SCHEMA_VERSION, Record, json_schema


def test_roundtrip_and_version():
    r = Record.model_validate(make_record(1))
    d = r.dump()
    assert d["schema"] == SCHEMA_VERSION
    assert Record.model_validate(d) == r
    # arguments stay a JSON string (OpenAI format) and decode to the dict
    tc = r.trajectories[0].messages[2].tool_calls[0]
    assert json.loads(tc.function.arguments) == {"reservation_id": "R1", "cabin": "economy"}


def test_dict_arguments_are_encoded():
    rec = make_record(2)
    rec["trajectories"][0]["messages"][2]["tool_calls"][0]["function"]["arguments"] = {"a": 1}
    r = Record.model_validate(rec)
    assert r.trajectories[0].messages[2].tool_calls[0].function.args() == {"a": 1}


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.update(bogus=1), "bogus"),
    (lambda r: r["trajectories"][0]["messages"].__setitem__(1, {"role": "robot", "content": "x"}), "role"),
    (lambda r: r["trajectories"][0]["messages"][3].pop("tool_call_id"), "tool_call_id"),
    (lambda r: r["trajectories"][0]["messages"][2]["tool_calls"][0]["function"].__setitem__("arguments", "{not json"), "arguments"),
    (lambda r: r["trajectories"][0]["messages"][2]["tool_calls"][0]["function"].__setitem__("arguments", "[1,2]"), "arguments"),
    (lambda r: r.update(id="has space"), "id"),
    (lambda r: r.update(schema="other.record/v1"), "schema"),
    (lambda r: r["trajectories"][0]["messages"][3].__setitem__("tool_call_id", "call_missing"), "tool_call_id"),
    (lambda r: r["trajectories"].append(dict(r["trajectories"][0])), "duplicate trajectory id"),
])
def test_strict_where_it_matters(mutate, field):
    rec = make_record(3)
    mutate(rec)
    with pytest.raises(ValidationError) as ei:
        Record.model_validate(rec)
    assert field in str(ei.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_numbers_must_be_finite(value):
    """A NaN reward/score/cost was kept and written back as null; the schema refuses it, naming the field."""
    for mutate, field in [
        (lambda r: r["trajectories"][0].__setitem__("reward", value), "trajectories.0.reward"),
        (lambda r: r.__setitem__("verdicts", [{"stage": "verify", "kind": "rule", "passed": True, "score": value}]),
         "verdicts.0.score"),
        (lambda r: r["trajectories"][0].__setitem__("usage", {"cost": value}), "trajectories.0.usage.cost"),
    ]:
        rec = make_record(5)
        mutate(rec)
        with pytest.raises(ValidationError) as ei:
            Record.model_validate(rec)
        assert field in str(ei.value) and "finite" in str(ei.value)


def test_extra_is_free_form():
    rec = make_record(4)
    rec["extra"] = {"my_team": {"anything": [1, 2, {"x": None}]}}
    rec["task"]["extra"] = {"source": "seed-17"}
    r = Record.model_validate(rec)
    assert r.extra["my_team"]["anything"][2] == {"x": None}
    assert r.dump()["task"]["extra"] == {"source": "seed-17"}


def test_checked_in_schema_is_fresh():
    on_disk = json.loads((ROOT / "schemas" / "record.schema.json").read_text())
    assert on_disk == json.loads(json.dumps(json_schema())), "run `toolkit schema export`"


def test_datasets_loads_output(tmp_path):
    datasets = pytest.importorskip("datasets")
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(Record.model_validate(make_record(i)).dump()) + "\n" for i in range(5)))
    ds = datasets.load_dataset("json", data_files=str(p), split="train")
    assert len(ds) == 5
    assert ds[0]["trajectories"][0]["messages"][2]["tool_calls"][0]["function"]["name"] == "update_reservations"
