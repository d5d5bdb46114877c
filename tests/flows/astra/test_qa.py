"""ASTRA pipeline B with a scripted LLM: QA synthesis → validation (before code) → sandbox-checked
python environments (with homogeneous merging) → replay → F1."""

import json

import pytest
from click.testing import CliRunner

from toolkit import cli
from toolkit.flows.astra import envsynth as ES
from toolkit.llm.testserver import ScriptedServer

# --------------------------------------------------------------------------------------------
# a hand-written instance: two homogeneous lookups and a non-tool leaf that combines them

QA_REPLY = json.dumps([
    {"scenario_type": "Parallel Multi-Hop",
     "main_question": "How many degrees warmer is Paris than Berlin today?",
     "final_answer": "4 degrees",
     "decomposition_trace": [
         {"_uuid": 1, "hop_level": 1, "sub_question": "What is the temperature in Paris today?",
          "is_parallel": True, "dependency": None, "sub_answer": "18"},
         {"_uuid": 2, "hop_level": 1, "sub_question": "What is the temperature in Berlin today?",
          "is_parallel": True, "dependency": None, "sub_answer": "14"},
         {"_uuid": 3, "hop_level": 2, "sub_question": "What is the difference between 18 and 14 degrees?",
          "is_parallel": False, "dependency": [1, 2], "sub_answer": "4 degrees"}]},
    {"scenario_type": "Multi-Hop", "main_question": "Broken?", "final_answer": "x",
     "decomposition_trace": [
         {"_uuid": 1, "hop_level": 1, "sub_question": "First?", "is_parallel": False, "dependency": 2,
          "sub_answer": "a"},
         {"_uuid": 2, "hop_level": 2, "sub_question": "Second?", "is_parallel": False, "dependency": None,
          "sub_answer": "b"}]},
])


def run_cmd(cmd, args, stdin, srv):
    r = CliRunner().invoke(cmd, [*args, "--base-url", srv.base_url, "--model", "scripted"], input=stdin)
    return r, [json.loads(x) for x in r.stdout.splitlines()]


def test_gen_task_astra_qa():
    src = {"id": "kb1", "extra": {"domain": "weather", "corpus": "Paris 18C, Berlin 14C", "max_hops": 3}}
    with ScriptedServer(['[{"scenario_type": "Single-Hop", "main_question": "trunc', QA_REPLY]) as srv:
        r, out = run_cmd(cli.gen_task, ["--strategy", "astra-qa", "-n", "2"], json.dumps(src) + "\n", srv)
        assert srv.chat_count == 2  # the truncated reply was retried
    assert r.exit_code == 0, r.output
    assert len(out) == 1 and "depends on 2, a later step" in r.stderr
    t = out[0]["task"]
    assert out[0]["id"] == "kb1-qa0" and out[0]["parent_id"] == "kb1"
    assert t["instruction"] == "How many degrees warmer is Paris than Berlin today?"
    assert t["ground_truth"]["final_answer"] == "4 degrees"
    assert [(s["q"][:30], s["a"], s["d"]) for s in t["ground_truth"]["sub_questions"]] == [
        ("What is the temperature in Par", "18", []), ("What is the temperature in Ber", "14", []),
        ("What is the difference between", "4 degrees", [0, 1])]
    assert t["complexity"] == {"scenario_type": "Parallel Multi-Hop", "hops": 2, "sub_questions": 3}


def test_gen_task_astra_qa_all_malformed_rejects(tmp_path):
    bad = ['not json', '[{"scenario_type": "Triple-Hop", "main_question": "q", "final_answer": "a", '
           '"decomposition_trace": [{"_uuid": 1, "sub_question": "s", "sub_answer": "a"}]}]', '{"x": 1}']
    with ScriptedServer(bad) as srv:
        r, out = run_cmd(cli.gen_task, ["--strategy", "astra-qa"], json.dumps({"id": "k"}) + "\n", srv)
    assert r.exit_code == 1 and out == []
    assert "scenario_type must be one of" in r.stderr


# --------------------------------------------------------------------------------------------
# validate-task --strategy astra


def qa_record(needs_leaf_dep=False):
    sqs = [{"q": "What is the temperature in Paris today?", "a": "18", "d": []},
           {"q": "What is the temperature in Berlin today?", "a": "14", "d": []},
           {"q": "What is the difference between 18 and 14 degrees?", "a": "4 degrees", "d": [0, 1]}]
    if needs_leaf_dep:  # a 4th node depends on the non-tool node 2
        sqs.append({"q": "Which city should I visit given that difference?", "a": "Paris", "d": [2]})
    return {"id": "qa1", "flow": "astra",
            "task": {"instruction": "How many degrees warmer is Paris than Berlin today?",
                     "ground_truth": {"final_answer": "4 degrees", "sub_questions": sqs}}}


def necessity(*flags):
    return json.dumps({"sub_questions": [{"index": i, "needs_tool": f, "category": "retrieval" if f else "comparison"}
                                         for i, f in enumerate(flags)]})


def qs_reply(nodes, tc=1):
    return json.dumps({"nodes": [{"index": i, "dc": a, "sa": b, "sr": c} for i, (a, b, c) in enumerate(nodes)],
                       "tc": tc, "reasoning": "fine"})


def test_non_tool_non_leaf_filtered_before_qs():
    rec = qa_record(needs_leaf_dep=True)
    with ScriptedServer([necessity(True, True, False, True)]) as srv:
        r, out = run_cmd(cli.validate_task, ["--strategy", "astra", "--filter", "passed"], json.dumps(rec) + "\n", srv)
        assert srv.chat_count == 1  # no QS call was paid for
    assert r.exit_code == 0 and out == []
    with ScriptedServer([necessity(True, True, False, True)]) as srv:
        r, out = run_cmd(cli.validate_task, ["--strategy", "astra"], json.dumps(rec) + "\n", srv)
    (v,) = out[0]["verdicts"]
    assert v["name"] == "astra_tool_necessity" and not v["passed"]
    assert v["reasons"] == ["sub-question 2 needs no tool but is not a leaf (others depend on it): "
                            "What is the difference between 18 and 14 degrees?"]


def test_qs_scores_and_cutoff():
    rec = qa_record()
    good = qs_reply([(1, 1, 1), (1, 1, 1), (1, 1, 1)])
    with ScriptedServer([necessity(True, True, False), good]) as srv:
        r, out = run_cmd(cli.validate_task, ["--strategy", "astra", "--filter", "passed"], json.dumps(rec) + "\n", srv)
    assert len(out) == 1
    qs = [v for v in out[0]["verdicts"] if v["name"] == "astra_qs"][0]
    assert qs["passed"] and qs["score"] == 1.0
    assert out[0]["task"]["extra"]["astra_needs_tool"] == [True, True, False]
    # DC = 2/3, SA = 1, SR = 1, TC = 1 → QS = (2/3 + 3) / 4 = 11/12
    partial = qs_reply([(1, 1, 1), (0, 1, 1), (1, 1, 1)])
    with ScriptedServer([necessity(True, True, False), partial] * 2) as srv:
        _, out = run_cmd(cli.validate_task, ["--strategy", "astra"], json.dumps(rec) + "\n", srv)
        qs = [v for v in out[0]["verdicts"] if v["name"] == "astra_qs"][0]
        assert qs["score"] == pytest.approx(11 / 12) and not qs["passed"]  # default cut-off 1.0
        assert "sub-question 1: dc = 0" in qs["reasons"]
        rf = CliRunner().invoke(cli.validate_task, ["--strategy", "astra", "--base-url", srv.base_url,
                                                    "--model", "s", "--min-qs", "0.9"], input=json.dumps(rec) + "\n")
    qs = [v for v in json.loads(rf.stdout)["verdicts"] if v["name"] == "astra_qs"][0]
    assert qs["passed"]  # 0.9167 ≥ 0.9


def test_qs_malformed_gives_failed_verdict():
    rec = qa_record()
    bad = ['{"nodes": [{"index": 0, "dc": 2, "sa": 1, "sr": 1}], "tc": 1}',   # wrong count and value
           qs_reply([(1, 1, 1)] * 3, tc="yes"), "```json\n{\"nodes\": ["]
    with ScriptedServer([necessity(True, True, False)] + bad) as srv:
        _, out = run_cmd(cli.validate_task, ["--strategy", "astra"], json.dumps(rec) + "\n", srv)
    qs = [v for v in out[0]["verdicts"] if v["name"] == "astra_qs"][0]
    assert not qs["passed"] and qs["reasons"][0] == "malformed QS output" and len(qs["reasons"]) == 4


def test_pipeline_a_task_scores():
    rec = {"id": "t1", "task": {"instruction": "Find my Groceries note and tag it urgent."},
           "env": {"backend": "simulated", "config": {"tools": []}}}
    ok = json.dumps({"question_quality": 4, "scenario_realism": 5, "tool_necessity": 3, "reasoning": "r"})
    with ScriptedServer(['{"question_quality": "high"}', ok, ok]) as srv:
        _, out = run_cmd(cli.validate_task, ["--strategy", "astra"], json.dumps(rec) + "\n", srv)
        v = out[0]["verdicts"][0]
        assert v["name"] == "astra_task_scores" and v["passed"]
        assert (v["scores"]["qq"], v["scores"]["sr"], v["scores"]["tn"]) == (4, 5, 3)
        r = CliRunner().invoke(cli.validate_task, ["--strategy", "astra", "--base-url", srv.base_url, "--model", "s",
                                                   "--theta-tn", "4"], input=json.dumps(rec) + "\n")
    v = json.loads(r.stdout)["verdicts"][0]
    assert not v["passed"] and v["reasons"] == ["S_tn 3 < theta_tn 4"]


# --------------------------------------------------------------------------------------------
# make-verifier --strategy astra

DOC_PARIS = {"name": "get_temperature", "description": "Get today's temperature of a city; returns city and temperature_c.",
             "parameters": {"type": "object", "properties": {
                 "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                 "required": ["city"]}}
DOC_BERLIN = dict(DOC_PARIS, name="city_temperature")

IMPL = '''
def {name}(city, unit="celsius"):
    """Today's temperature (toy data)."""
    data = {data}
    if not isinstance(city, str):
        return {{"error": "city must be a string"}}
    if unit not in ("celsius", "fahrenheit"):
        return {{"error": "unit must be celsius or fahrenheit"}}
    if city not in data:
        return {{"error": "unknown city " + city}}
    t = data[city]
    if unit == "fahrenheit":
        t = round(t * 9 / 5 + 32)
    return {{"city": city, "temperature_c": t, "condition": "clear"}}
'''


def impl(name, data):
    return json.dumps({"analysis": "lookup table", "function": IMPL.format(name=name, data=json.dumps(data))})


def scripted(overrides=None):
    """Replies keyed by the prompt; `overrides` maps a prompt kind to a list of replies used in order."""
    overrides = {k: list(v) for k, v in (overrides or {}).items()}
    calls = []

    def reply(req):
        text = req["messages"][-1]["content"]
        berlin = "Berlin" in text.split("Sub-question:")[-1] if "Sub-question:" in text else "Berlin" in text
        if text.startswith("Write the API tool"):
            kind, default = "doc", json.dumps(DOC_BERLIN if berlin else DOC_PARIS)
        elif text.startswith("Write the call statement"):
            name = "city_temperature" if berlin else "get_temperature"
            kind, default = "call", json.dumps({"name": name, "arguments": {"city": "Berlin" if berlin else "Paris"}})
        elif text.startswith("Implement a function"):
            berlin = "Berlin" in text.split("Question-Answer Pairs:")[-1]
            kind = "impl"
            default = impl("city_temperature", {"Berlin": 14}) if berlin else impl("get_temperature", {"Paris": 18})
        elif text.startswith("Group homogeneous"):
            kind, default = "groups", json.dumps({"groups": [[0, 1]]})
        elif text.startswith("Extend an existing"):
            base = "city_temperature" if "def city_temperature" in text else "get_temperature"
            new_city = "Paris" if base == "city_temperature" else "Berlin"
            kind = "merge"
            default = json.dumps({"analysis": "add a row", "call": {"name": base, "arguments": {"city": new_city}},
                                  "function": IMPL.format(name=base, data=json.dumps({"Paris": 18, "Berlin": 14}))})
        else:
            raise AssertionError(text[:200])
        calls.append(kind)
        if overrides.get(kind):
            return overrides[kind].pop(0)
        return default

    return reply, calls


def validated_record():
    rec = qa_record()
    rec["task"]["extra"] = {"astra_needs_tool": [True, True, False]}
    return rec


def make_env(overrides=None, extra_args=()):
    reply, calls = scripted(overrides)
    with ScriptedServer(reply) as srv:
        r, out = run_cmd(cli.make_verifier, ["--strategy", "astra", *extra_args], json.dumps(validated_record()) + "\n",
                         srv)
    assert r.exit_code == 0, r.output
    return out[0], calls


@pytest.fixture(scope="module")
def env_record():
    rec, calls = make_env()
    return rec, calls


def test_make_verifier_builds_merged_env(env_record):
    rec, calls = env_record
    v = [x for x in rec["verdicts"] if x["name"] == "astra_env"][0]
    assert v["passed"], v
    assert v["scores"]["merged"] == 1 and v["scores"]["tools"] == 1
    assert calls.count("merge") == 1 and calls.count("groups") == 1
    env = rec["env"]
    assert env["backend"] == "python" and len(env["config"]["tools"]) == 1
    gt = rec["task"]["ground_truth"]
    name = env["config"]["tools"][0]["function"]["name"]
    assert [s["tool"] for s in gt["sub_questions"]] == [name, name]
    assert [a["arguments"]["city"] for a in gt["actions"]] == ["Paris", "Berlin"]
    assert gt["extra"]["non_tool_sub_questions"][0]["a"] == "4 degrees"
    assert rec["verifier"]["spec"] == "f1"
    # both invocations still return their answers from the merged tool, run through the real backend
    from toolkit.envs import load_env
    e = load_env(env)
    assert json.loads(e.call(name, {"city": "Paris"}).to_content())["temperature_c"] == 18
    assert json.loads(e.call(name, {"city": "Berlin"}).to_content())["temperature_c"] == 14
    assert e.call(name, {"city": "Rome"}).to_content() == '{"error": "unknown city Rome"}'


def test_replay_scores_f1_one_and_extra_calls_lower(env_record):
    rec, _ = env_record
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay"], input=json.dumps(rec) + "\n")
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.verify, ["--strategy", "f1"], input=r.stdout)
    out = json.loads(r.stdout)
    v = [x for x in out["verdicts"] if x["kind"] == "f1"][0]
    assert v["passed"] and v["score"] == pytest.approx(1.0)
    assert (v["scores"]["n"], v["scores"]["n_hat"], v["scores"]["c"]) == (2, 2, 2)
    # one extra (repeated) call: n = 2, n̂ = 2, c = 3 → r = 1, p = 2/3, F1 = 2·(2/3)·1 / (2/3 + 1) = 0.8
    rec2 = json.loads(json.dumps(rec))
    acts = rec2["task"]["ground_truth"]["actions"]
    acts.insert(1, dict(acts[0]))
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay"], input=json.dumps(rec2) + "\n")
    r = CliRunner().invoke(cli.verify, ["--strategy", "f1"], input=r.stdout)
    v = [x for x in json.loads(r.stdout)["verdicts"] if x["kind"] == "f1"][0]
    assert v["scores"]["c"] == 3 and v["score"] == pytest.approx(0.8)
    # two extra calls: p = 2/4, F1 = 2·0.5·1 / 1.5 = 2/3
    acts.insert(1, dict(acts[0]))
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay"], input=json.dumps(rec2) + "\n")
    r = CliRunner().invoke(cli.verify, ["--strategy", "f1"], input=r.stdout)
    v = [x for x in json.loads(r.stdout)["verdicts"] if x["kind"] == "f1"][0]
    assert v["scores"]["c"] == 4 and v["score"] == pytest.approx(2 / 3)


WRONG = json.dumps({"analysis": "x", "function": IMPL.format(name="get_temperature", data='{"Paris": 21}')})
IMPORTS = json.dumps({"analysis": "x", "function": "import requests\n" + IMPL.format(name="get_temperature",
                                                                                    data='{"Paris": 18}')})
LOOPS = json.dumps({"analysis": "x", "function": "def get_temperature(city, unit='celsius'):\n"
                                                  "    while True:\n        pass\n"})


@pytest.mark.parametrize("bad,why", [
    (WRONG, "does not contain the answer '18'"),
    (IMPORTS, "imports 'requests', which is not a Python 3 built-in"),
    (LOOPS, "TIMEOUT"),
])
def test_bad_implementations_rejected_within_limits(bad, why):
    rec, calls = make_env({"impl": [bad, bad]}, ["--recipe", _recipe()])
    v = [x for x in rec["verdicts"] if x["name"] == "astra_env"][0]
    assert not v["passed"] and rec["env"] is None
    assert calls.count("impl") == 2  # impl_attempts = 2, then the node fails
    assert any(why in x for x in v["scores"]["attempt_log"]), v["scores"]["attempt_log"]
    assert "node 0 failed after 2 attempt(s)" in v["reasons"][-1]


def test_bad_then_good_implementation_passes():
    rec, calls = make_env({"impl": [IMPORTS]}, ["--recipe", _recipe()])
    v = [x for x in rec["verdicts"] if x["name"] == "astra_env"][0]
    assert v["passed"] and calls.count("impl") == 3  # node 0 twice, node 1 once


def test_merge_that_breaks_an_invocation_is_not_kept():
    broken = json.dumps({"analysis": "x", "call": {"name": "get_temperature", "arguments": {"city": "Berlin"}},
                         "function": IMPL.format(name="get_temperature", data='{"Berlin": 14}')})  # lost Paris
    broken2 = broken.replace("get_temperature", "city_temperature").replace("Berlin", "Paris").replace("14", "18")
    rec, calls = make_env({"merge": [broken, broken2, broken, broken2]}, ["--recipe", _recipe()])
    v = [x for x in rec["verdicts"] if x["name"] == "astra_env"][0]
    assert v["passed"] and v["scores"]["merged"] == 0 and v["scores"]["tools"] == 2
    assert any("does not contain the answer" in x for x in v["scores"]["attempt_log"])
    from toolkit.envs import load_env
    e = load_env(rec["env"])
    for a, sq in zip(rec["task"]["ground_truth"]["actions"], rec["task"]["ground_truth"]["sub_questions"]):
        assert sq["a"] in e.call(a["name"], a["arguments"]).to_content()


_RECIPE = None


def _recipe():
    global _RECIPE
    if _RECIPE is None:
        import tempfile
        fd = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        fd.write("make-verifier:\n  impl_attempts: 2\n  merge_attempts: 2\n  sandbox_wall_seconds: 1\n"
                 "  sandbox_cpu_seconds: 1\n")
        fd.close()
        _RECIPE = fd.name
    return _RECIPE


def test_check_source_rules():
    params = DOC_PARIS["parameters"]
    assert ES.check_source(IMPL.format(name="get_temperature", data="{}"), "get_temperature", params) == []
    assert "defines no top-level function" in ES.check_source("def other(city): pass", "get_temperature", params)[0]
    assert "lacks the document's parameter(s) ['unit']" in ES.check_source(
        "def get_temperature(city): pass", "get_temperature", params)[0]
    assert "imports 'os'" in ES.check_source("import os\ndef get_temperature(city, unit=1): pass",
                                             "get_temperature", params)[0]
    assert ES.check_source("import math, json\ndef get_temperature(city, unit=1): pass", "get_temperature", params) == []
    assert "calls open()" in ES.check_source("def get_temperature(city, unit=1):\n    return open('x')",
                                             "get_temperature", params)[0]


def test_make_verifier_malformed_replies_are_retried():
    bad_doc = json.dumps(dict(DOC_PARIS, name="get temperature"))                    # not an identifier
    bad_call = json.dumps({"name": "get_temperature", "arguments": {"town": "Paris"}})  # unknown argument
    bad_impl = json.dumps({"analysis": "forgot the code"})                              # no "function"
    bad_groups = json.dumps({"groups": [[0, 0]]})                                       # repeated index
    rec, calls = make_env({"doc": [bad_doc], "call": [bad_call], "impl": [bad_impl], "groups": [bad_groups]})
    v = [x for x in rec["verdicts"] if x["name"] == "astra_env"][0]
    assert v["passed"] and v["scores"]["merged"] == 1
    assert calls.count("doc") == 3 and calls.count("call") == 3 and calls.count("impl") == 3
    assert calls.count("groups") == 2


def test_role_parsers_reject_contract_breaks():
    from toolkit.flows.astra.plan import parse_query
    from toolkit.flows.astra.validate import parse_necessity
    from toolkit.roles.structured import Malformed

    pq = parse_query(["a", "b"])
    assert pq('{"valid": false, "query": ""}') == {"valid": False, "query": "", "arguments": []}
    for bad, why in [('{"valid": "yes", "query": "q"}', "'valid' must be true or false"),
                     ('{"valid": true, "query": ""}', "query' is empty"),
                     ('{"valid": true, "query": "q", "arguments": [{"tool": "a", "args": {}}]}', "one item per call"),
                     ('{"valid": true, "query": "q", "arguments": [{"tool": "a"}, {"tool": "c", "args": {}}]}',
                      "arguments[1] must be"),
                     ('{"valid": true}', "missing key 'query'")]:
        with pytest.raises(Malformed, match=why.replace("[", r"\[").replace("]", r"\]")):
            pq(bad)
    pn = parse_necessity(2)
    assert pn(necessity(True, False)) == ([True, False], ["retrieval", "comparison"])
    with pytest.raises(Malformed, match="must list all 2"):
        pn(necessity(True))
    with pytest.raises(Malformed, match="needs_tool must be true or false"):
        pn('{"sub_questions": [{"index": 0, "needs_tool": "yes"}, {"index": 1, "needs_tool": true}]}')
