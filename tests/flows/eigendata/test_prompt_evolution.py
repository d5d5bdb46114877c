"""reflect --strategy eigendata writes evolved prompt FILES (EigenData §4.3 prompt evolution):
a batch whose failures are all one category → `eigendata/<role>.v2.txt` in the prompts directory
(never the shipped one) addressing that category, pinned in the plan record with the evidence; the
next gen-task run sends the v2 prompt (checked on the scripted server's request body); the
evaluation-side change reaches the judge through plan.evaluation_rules."""

import json

from click.testing import CliRunner

from tests.flows.eigendata.util import run_strategy
from tests.flows.eigendata.test_gen_task import POOL, intent
from tests.flows.eigendata.test_plan_reflect import batch_record
from toolkit import cli, prompts
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record

RULE = "Only use reservation ids that appear in the database state summary; never invent one."
EVAL_RULE = "REJECT a task whose reservation id is not in the database."


def revision():
    return "<revision>" + json.dumps({"changes": [
        {"role": "user_intent", "operation": "add_constraint", "addresses": "missing_resource", "text": RULE},
        {"role": "trajectory_validation", "operation": "tighten_rule", "addresses": "missing_resource",
         "text": EVAL_RULE}], "rationale": "all failures are missing resources"}) + "</revision>"


def reflect(records, replies, *extra):
    with ScriptedServer(replies) as srv:
        r = CliRunner().invoke(cli.reflect, ["--strategy", "eigendata", "--base-url", srv.base_url,
                                             "--model", "scripted", *extra],
                               input="".join(json.dumps(x) + "\n" for x in records))
    return r


def test_reflect_writes_v2_prompt_files_and_gen_task_sends_them(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLKIT_PROMPTS", raising=False)
    shipped_before = sorted(p.name for p in (prompts.SHIPPED / "eigendata").iterdir())
    recs = [batch_record(i, ok=False, category="missing_resource") for i in range(6)]
    r = reflect(recs, [revision()], "--prompts-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip(), r.output
    [out] = [Record.model_validate_json(x) for x in r.stdout.splitlines()]
    p = out.plan
    assert p.prompt_version == "2"
    ui = tmp_path / "eigendata" / "user_intent.v2.txt"
    tv = tmp_path / "eigendata" / "trajectory_validation.v2.txt"
    assert ui.is_file() and tv.is_file()
    v1 = (prompts.SHIPPED / "eigendata" / "user_intent.v1.txt").read_text()
    text = ui.read_text()
    assert text.startswith(v1.rstrip("\n")) and RULE in text and "addresses missing_resource" in text
    assert EVAL_RULE in tv.read_text() and RULE not in tv.read_text()
    # nothing written next to the shipped prompts
    assert sorted(x.name for x in (prompts.SHIPPED / "eigendata").iterdir()) == shipped_before
    # the plan record pins the new versions and keeps change + evidence
    assert p.extra["prompt_versions"] == {"user_intent": 2, "trajectory_validation": 2}
    assert p.extra["prompts_dir"] == str(tmp_path.resolve())
    assert p.extra["guidance"] == {"user_intent": ["be natural"]}  # the rule lives in the file, not twice
    ref = p.extra["reflections"][-1]
    assert [f["version"] for f in ref["prompt_files"]] == [2, 2]
    assert {f["from"] for f in ref["prompt_files"]} == {"eigendata/user_intent.v1", "eigendata/trajectory_validation.v1"}
    assert ref["evidence"]["categories"] == {"missing_resource": 6}
    assert EVAL_RULE in p.evaluation_rules  # what verify --strategy judge reads
    from toolkit.scorers.builtin import _evaluation_rules
    assert EVAL_RULE in _evaluation_rules(out)

    # the next gen-task run with that plan sends the v2 prompt
    with ScriptedServer([POOL, intent()]) as srv:
        tasks = run_strategy("gen-task", {"base_url": srv.base_url}, out, "eigendata")
        sent = srv.requests[1]["messages"][1]["content"]
    assert RULE in sent and "Rules learned from earlier failures" in sent
    assert len(tasks) == 1 and tasks[0].plan.extra["prompt_versions"]["user_intent"] == 2

    # another prompt set (no pin), run with TOOLKIT_PROMPTS = that dir: EigenData evolves each set
    # separately, so it keeps the shipped v1 (the evolved v2 belongs to env-1-ps0)
    other = out.model_copy(deep=True)
    other.plan.extra.pop("prompt_versions")
    other.plan.extra.pop("prompts_dir")
    other.plan.prompt_set = other.plan.id = "env-1-ps1"
    monkeypatch.setenv("TOOLKIT_PROMPTS", str(tmp_path))
    with ScriptedServer([POOL, intent()]) as srv:
        run_strategy("gen-task", {"base_url": srv.base_url}, other, "eigendata")
        sent = srv.requests[1]["messages"][1]["content"]
    assert RULE not in sent and "Rules learned from earlier failures" not in sent
    assert json.loads((tmp_path / "eigendata" / "user_intent.v2.owner.json").read_text())["prompt_set"] == "env-1-ps0"


def test_prompt_sets_do_not_contaminate_each_other(tmp_path, monkeypatch):
    """AReaL-SEA §4.4: "each stream has an independent reflection loop ... without
    cross-contamination"; EigenData §4.4: evolution loops of different prompt sets run in parallel.
    Set A evolves user_intent to v2; set B (never evolved) then reflects: its user_intent v3 is
    built on the shipped v1, not on A's v2; the judge of a set without a pin reads v1."""
    from tests.flows.eigendata.test_judge import _record, _verify, reply

    monkeypatch.setenv("TOOLKIT_PROMPTS", str(tmp_path))
    r = reflect([batch_record(i, ok=False) for i in range(4)], [revision()], "--prompts-dir", str(tmp_path))
    plan_a = json.loads(r.stdout.splitlines()[0])["plan"]
    assert plan_a["extra"]["prompt_versions"] == {"user_intent": 2, "trajectory_validation": 2}
    b_recs = [batch_record(i, ok=False, ps="env-1-ps1") for i in range(4)]
    only_b = "<revision>" + json.dumps({"changes": [{"role": "user_intent", "operation": "add_constraint",
                                                     "addresses": "missing_resource", "text": "B's own rule."}]}) + "</revision>"
    r = reflect(b_recs, [only_b], "--prompts-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    plan_b = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert plan_b.extra["prompt_versions"] == {"user_intent": 3}
    assert plan_b.extra["reflections"][-1]["prompt_files"][0]["from"] == "eigendata/user_intent.v1"
    v3 = (tmp_path / "eigendata" / "user_intent.v3.txt").read_text()
    assert "B's own rule." in v3 and RULE not in v3
    # the judge: set B has no trajectory_validation pin → v1, although A's v2 is in TOOLKIT_PROMPTS
    rec = _record(1)
    rec.plan = plan_b
    with ScriptedServer([reply()]) as srv:
        _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, rec)
        prompt = srv.requests[0]["messages"][1]["content"]
    assert EVAL_RULE not in prompt and "trajectory_validation.v1 → v2" not in prompt
    # set A's records: the pinned v2, even with TOOLKIT_PROMPTS unset (the pin names the directory)
    monkeypatch.delenv("TOOLKIT_PROMPTS")
    rec.plan = Record.model_validate({"id": "x", "plan": plan_a}).plan
    rec.plan.evaluation_rules = None
    with ScriptedServer([reply()]) as srv:
        _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, rec)
        prompt = srv.requests[0]["messages"][1]["content"]
    assert EVAL_RULE in prompt and "trajectory_validation.v1 → v2" in prompt


def test_second_reflection_builds_v3_on_the_sets_version(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLKIT_PROMPTS", raising=False)
    recs = [batch_record(i, ok=False) for i in range(5)]
    r = reflect(recs, [revision()], "--prompts-dir", str(tmp_path))
    plan2 = json.loads(r.stdout.splitlines()[0])["plan"]
    recs2 = [dict(batch_record(i, ok=False, version="2"), plan=plan2) for i in range(5)]
    second = "<revision>" + json.dumps({"changes": [{"role": "user_intent", "operation": "add_negative_example",
                                                     "addresses": "missing_resource",
                                                     "text": "a request about reservation 9999 {{id}}"}]}) + "</revision>"
    r = reflect(recs2, [second], "--prompts-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    p = Record.model_validate_json(r.stdout.splitlines()[0]).plan
    assert p.prompt_version == "3" and p.extra["prompt_versions"]["user_intent"] == 3
    v3 = (tmp_path / "eigendata" / "user_intent.v3.txt").read_text()
    assert RULE in v3 and "Negative example (do NOT do this): a request about reservation 9999" in v3
    assert "{{id}}" not in v3  # learned text cannot add placeholders the renderer would demand
    assert p.extra["reflections"][-1]["prompt_files"][0]["from"] == "eigendata/user_intent.v2"


def test_prompts_dir_never_the_shipped_folder(monkeypatch):
    monkeypatch.delenv("TOOLKIT_PROMPTS", raising=False)
    recs = [batch_record(i, ok=False) for i in range(3)]
    r = reflect(recs, [revision()], "--prompts-dir", str(prompts.SHIPPED / "eigendata"))
    assert r.exit_code == 2 and "shipped prompts folder" in r.output
    assert not (prompts.SHIPPED / "eigendata" / "user_intent.v2.txt").exists()


def test_judge_gets_the_evaluation_side_change(tmp_path, monkeypatch):
    """verify --strategy judge --judge-rubric eigendata on a record of the evolved prompt set: the
    learned rule arrives through plan.evaluation_rules, and with TOOLKIT_PROMPTS = the prompts dir
    the judge's own prompt is trajectory_validation.v2."""
    from tests.flows.eigendata.test_judge import _record, _verify, reply

    monkeypatch.delenv("TOOLKIT_PROMPTS", raising=False)
    r = reflect([batch_record(i, ok=False) for i in range(4)], [revision()], "--prompts-dir", str(tmp_path))
    plan = json.loads(r.stdout.splitlines()[0])["plan"]
    rec = _record(1)
    rec.plan = Record.model_validate({"id": "x", "plan": plan}).plan
    with ScriptedServer([reply()]) as srv:
        _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, rec)
        prompt = srv.requests[0]["messages"][1]["content"]
    assert EVAL_RULE in prompt and "Rules learned from earlier failures" in prompt  # via evaluation_rules
    assert "(learned from missing_resource failures)" in prompt
    monkeypatch.setenv("TOOLKIT_PROMPTS", str(tmp_path))
    rec.plan.evaluation_rules = None
    with ScriptedServer([reply()]) as srv:
        _verify({"base_url": srv.base_url, "judge_rubric": "eigendata"}, rec)
        prompt = srv.requests[0]["messages"][1]["content"]
    assert EVAL_RULE in prompt and "trajectory_validation.v1 → v2" in prompt  # the v2 prompt file itself
