"""repair --strategy rules: scripted synthesizer texts (good and malformed) → simulate-env --mode trajectory
→ the rule post-process; kept trajectories validate and render in a Qwen2.5 chat template with tools."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import requires_train
from tests.flows.simia.fixtures import EXPECTED, GOOD, POLICY, REPLIES, SEED, TOOLS

from toolkit import cli
from toolkit.envs.python import validate_arguments
from toolkit.flows.simia import format as F
from toolkit.flows.simia.rules import Dropped, clean_messages, tool_index
from toolkit.io import StageError
from toolkit.llm.testserver import ScriptedServer
from toolkit.schema import Record
from toolkit.formats.rows import export_row
from toolkit.train import export as X

NAMES = list(EXPECTED)
TEMPS = [round(0.05 * i, 2) for i in range(len(NAMES))]  # one pass per reply, keyed by its temperature
QWEN25 = (Path(__file__).resolve().parents[2] / "qwen25_template.jinja").read_text()  # Qwen2.5-Instruct's chat template


def chat_rows(rec):
    """The training rows `sft` trains on (toolkit.train.export): OpenAI messages, dict arguments."""
    return X.record_rows(Record.model_validate(rec))


def expected_call(tc):
    """The Hermes block a chat template must write for a native call whose arguments are a JSON string."""
    return ("<tool_call>\n" + json.dumps({"name": tc["function"]["name"],
                                          "arguments": json.loads(tc["function"]["arguments"])}, ensure_ascii=False)
            + "\n</tool_call>")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simia")
    recipe = tmp / "r.yaml"
    recipe.write_text("simulate-env:\n  temperatures: " + json.dumps(TEMPS) + "\n")
    by_temp = {t: REPLIES[n] for t, n in zip(TEMPS, NAMES)}
    with ScriptedServer(lambda req: by_temp[req["temperature"]]) as srv:
        r = CliRunner().invoke(cli.simulate_env, ["--mode", "trajectory", "-n", str(len(NAMES)), "--recipe", str(recipe),
                                                  "--base-url", srv.base_url, "--model", "scripted"],
                               input=json.dumps(SEED) + "\n")
    assert r.exit_code == 0, r.output
    sims = r.stdout
    rej = tmp / "rej.jsonl"
    r2 = CliRunner().invoke(cli.repair, ["--strategy", "rules", "--rejects", str(rej)], input=sims)
    kept = {json.loads(x)["id"]: json.loads(x) for x in r2.stdout.splitlines()}
    rejects = {json.loads(x)["id"]: json.loads(x) for x in rej.read_text().splitlines()} if rej.exists() else {}
    return r2, kept, rejects


def test_each_reply_is_repaired_or_dropped_with_the_right_reason(pipeline):
    r, kept, rejects = pipeline
    assert r.exit_code == 1  # some lines were rejected
    for k, name in enumerate(NAMES):
        rid = f"seed-1-sim{k}"
        outcome, what = EXPECTED[name]
        if outcome == "kept":
            assert rid in kept, (name, rejects.get(rid))
            t = kept[rid]["trajectories"][0]
            assert t["extra"]["simia"]["fixes"] == what, name
            v = [x for x in kept[rid]["verdicts"] if x["name"] == "simia_rules"]
            assert len(v) == 1 and v[0]["passed"] and v[0]["stage"] == "repair"
        else:
            assert rid not in kept and rid in rejects, name
            assert rejects[rid]["error"].startswith(what + ":"), (name, rejects[rid]["error"])


def test_kept_trajectories_validate_against_the_schema(pipeline):
    _, kept, _ = pipeline
    assert len(kept) == sum(1 for o, _ in EXPECTED.values() if o == "kept")
    for rid, rec in kept.items():
        Record.model_validate(rec)  # the record schema
        t = rec["trajectories"][0]
        assert t["messages"][0] == {"role": "system", "content": POLICY, "tool_calls": None, "tool_call_id": None,
                                    "name": None, "reasoning_content": None}
        assert [m["role"] for m in t["messages"]].count("system") == 1
        assert "raw" not in t["extra"]["simia"] and t["error"] is None
        params = tool_index(TOOLS)
        calls = [tc for m in t["messages"] for tc in (m["tool_calls"] or [])]
        assert calls
        for tc in calls:
            assert validate_arguments(params[tc["function"]["name"]], json.loads(tc["function"]["arguments"])) is None
    quoted = kept[f"seed-1-sim{NAMES.index('UNESCAPED_QUOTES')}"]["trajectories"][0]
    args = json.loads(quoted["messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert args == {"reservation_id": 'R5 "moved"'}


@requires_train
@pytest.mark.parametrize("template", ["toolkit", "qwen2.5"])
def test_kept_trajectories_load_in_the_chat_template_with_tools(pipeline, tiny_model, template):
    """kept records → toolkit.train.export rows → tokenizer.apply_chat_template(messages, tools=tools):
    the toolkit's own template (the tiny tokenizer's) and Qwen2.5's (tests/qwen25_template.jinja)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    kw = {"chat_template": QWEN25} if template == "qwen2.5" else {}
    _, kept, _ = pipeline
    rendered = 0
    for rid, rec in kept.items():
        t = rec["trajectories"][0]
        [row] = chat_rows(rec)
        calls = [tc for m in t["messages"] for tc in (m["tool_calls"] or [])]
        row_calls = [tc for m in row["messages"] for tc in (m.get("tool_calls") or [])]
        assert [tc["function"]["arguments"] for tc in row_calls] == \
            [json.loads(tc["function"]["arguments"]) for tc in calls]  # dicts, decoded once
        assert row["tools"] == TOOLS
        text = tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False, **kw)
        system, body = text.split("<|im_end|>\n", 1)
        assert system.startswith("<|im_start|>system\n" + POLICY + "\n\n# Tools"), rid
        assert json.dumps(TOOLS[1], ensure_ascii=False) in system  # the tool list, as offered
        assert body.count("<tool_call>") == len(calls), rid
        for tc in calls:
            assert expected_call(tc) in body, (rid, tc)
        assert '"arguments": "' not in body  # not double-encoded
        assert body.count("<tool_response>") == sum(m["role"] == "tool" for m in t["messages"])
        assert "<function>" not in text and text.endswith("<|im_end|>\n")
        rendered += 1
    assert rendered == sum(1 for o, _ in EXPECTED.values() if o == "kept")
    good = tok.apply_chat_template(chat_rows(kept["seed-1-sim0"])[0]["messages"], tools=TOOLS, tokenize=False, **kw)
    assert '<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R9"}}\n</tool_call>' in good
    quoted = tok.apply_chat_template(chat_rows(kept[f"seed-1-sim{NAMES.index('UNESCAPED_QUOTES')}"])[0]["messages"],
                                     tools=TOOLS, tokenize=False, **kw)
    assert '{"name": "get_reservation", "arguments": {"reservation_id": "R5 \\"moved\\""}}' in quoted


def chatml(turns):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)


def test_hermes_export_is_the_training_export(pipeline):
    """format.to_hermes and `sft --export hermes` (toolkit.train.export → template.render_hermes)
    are one implementation: the simia turns framed in ChatML are the exporter's text."""
    _, kept, _ = pipeline
    for rid, rec in kept.items():
        t = rec["trajectories"][0]
        msgs = [{k: v for k, v in m.items() if v is not None} for m in t["messages"]]
        hermes = F.to_hermes(msgs, TOOLS)
        [row] = chat_rows(rec)
        assert chatml(hermes) == export_row(row, "hermes")["text"], rid
    t = kept["seed-1-sim0"]["trajectories"][0]
    msgs = [{k: v for k, v in m.items() if v is not None} for m in t["messages"]]
    hermes = F.to_hermes(msgs, TOOLS)
    assert all(set(m) == {"role", "content"} for m in hermes)
    assert [m["role"] for m in hermes] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert hermes[0]["content"].startswith(POLICY + "\n\n# Tools\n")
    assert msgs[2]["content"].startswith("<think>")  # the synthesizer's reasoning stays before the call
    assert hermes[2]["content"] == msgs[2]["content"] + \
        '\n<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R9"}}\n</tool_call>'
    assert hermes[3]["content"] == "<tool_response>\n" + msgs[3]["content"] + "\n</tool_response>"
    assert '{"name": "cancel_reservation", "arguments": {"reservation_id": "R9", "reason": "other"}}' in hermes[4]["content"]
    # and back: the native form is recovered (ids renumbered)
    back = F.to_native(hermes)
    assert [m["role"] for m in back] == [m["role"] for m in msgs]
    assert [tc["function"] for m in back for tc in m.get("tool_calls") or []] == \
        [tc["function"] for m in msgs for tc in m.get("tool_calls") or []]


def test_hermes_export_merges_parallel_results_and_rejects_bad_arguments():
    msgs = [{"role": "user", "content": "both?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_reservation", "arguments": '{"reservation_id": "R1"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_reservation", "arguments": {"reservation_id": "R2"}}}]},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": "two"},
            {"role": "assistant", "content": "Done."}]
    assert F.to_hermes(msgs) == [
        {"role": "user", "content": "both?"},
        {"role": "assistant", "content": 'Checking.\n<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R1"}}'
                                         '\n</tool_call>\n<tool_call>\n{"name": "get_reservation", "arguments": '
                                         '{"reservation_id": "R2"}}\n</tool_call>'},
        {"role": "user", "content": "<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>"},
        {"role": "assistant", "content": "Done."}]
    msgs[1]["tool_calls"][0]["function"]["arguments"] = '["R1"]'
    with pytest.raises(StageError) as e:
        F.to_hermes(msgs)
    assert e.value.field == "trajectories[0].messages[1].tool_calls[0].function.arguments"


@requires_train
def test_hermes_export_equals_the_tokenizer_rendering(pipeline, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    _, kept, _ = pipeline
    for rid, rec in kept.items():
        msgs = [{k: v for k, v in m.items() if v is not None} for m in rec["trajectories"][0]["messages"]]
        [row] = chat_rows(rec)
        assert chatml(F.to_hermes(msgs, TOOLS)) == tok.apply_chat_template(row["messages"], tools=TOOLS, tokenize=False)


def test_system_prompt_replaced_by_the_deployments(tmp_path):
    sim = {"messages": [], "extra": {"simia": {"raw": GOOD, "system": POLICY}}}
    msgs, fixes = clean_messages(sim, tool_index(TOOLS), system_prompt="DEPLOYED PROMPT")
    assert msgs[0] == {"role": "system", "content": "DEPLOYED PROMPT"} and fixes == ["system_replaced"]
    rec = {"id": "x", "trajectories": [{"id": "x-t0", "tools": TOOLS, **sim}]}
    recipe = tmp_path / "r.yaml"
    (tmp_path / "sys.txt").write_text("FROM FILE")
    recipe.write_text(f"repair:\n  system_prompt_file: {tmp_path / 'sys.txt'}\n")
    r = CliRunner().invoke(cli.repair, ["--strategy", "rules", "--recipe", str(recipe)], input=json.dumps(rec) + "\n")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["trajectories"][0]["messages"][0]["content"] == "FROM FILE"


def test_native_hermes_text_trajectory_is_normalized():
    traj = {"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "status of R1?"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_reservation", "arguments": {"reservation_id": "R1"}}\n</tool_call>'},
        {"role": "user", "content": '<tool_response>\n{"status": "confirmed"}\n</tool_response>'},
        {"role": "assistant", "content": "Confirmed."}]}
    msgs, fixes = clean_messages(traj, tool_index(TOOLS))
    assert fixes == ["hermes_to_native"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "get_reservation", "arguments": '{"reservation_id": "R1"}'}
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "name": "get_reservation", "content": '{"status": "confirmed"}'}


def test_multi_trajectory_record_keeps_the_good_ones():
    bad = {"id": "t-bad", "messages": [], "tools": TOOLS, "extra": {"simia": {"raw": REPLIES["UNKNOWN_TOOL"]}}}
    good = {"id": "t-good", "messages": [], "tools": TOOLS, "extra": {"simia": {"raw": GOOD}}}
    r = CliRunner().invoke(cli.repair, ["--strategy", "rules"],
                           input=json.dumps({"id": "m", "trajectories": [bad, good]}) + "\n")
    assert r.exit_code == 0
    rec = json.loads(r.stdout)
    assert [t["id"] for t in rec["trajectories"]] == ["t-good"]
    v = {x["trajectory_id"]: x for x in rec["verdicts"]}
    assert not v["t-bad"]["passed"] and v["t-bad"]["scores"]["dropped"] == "unknown_tool"
    assert v["t-good"]["passed"]


def test_clean_messages_raises_dropped_with_rule():
    with pytest.raises(Dropped) as e:
        clean_messages({"messages": [], "extra": {"simia": {"raw": REPLIES["SCHEMA_VIOLATION"]}}}, tool_index(TOOLS))
    assert e.value.rule == "schema_violation" and "reason" in e.value.detail


def test_the_cli_runs_the_rule_strategy_as_a_plain_function():
    """repair --strategy rules is synchronous: the CLI hands RecordStream its plain-function twin
    (no asyncio task per record); the async fn `strategies.build` returns still works and agrees."""
    import asyncio
    import inspect

    from toolkit.stages import strategies

    parts = strategies.build("repair", {"strategy": "rules"}, None)
    run = parts.process
    assert inspect.iscoroutinefunction(run)  # the registry contract for callers that await
    sync = parts.sync
    assert sync is not None and not inspect.iscoroutinefunction(sync)
    cli_fn = strategies.Repair({"strategy": "rules"}).process  # what the CLI hands RecordStream
    assert inspect.isfunction(cli_fn) and not inspect.iscoroutinefunction(cli_fn)
    rec = {"id": "m", "trajectories": [{"id": "t", "messages": [], "tools": TOOLS, "extra": {"simia": {"raw": GOOD, "system": POLICY}}}]}
    a, b = sync(Record.model_validate(rec)), asyncio.run(run(Record.model_validate(rec)))
    for x in (a, b):
        x.provenance = []
    assert a.model_dump() == b.model_dump() and a.trajectories[0].messages[0].content == POLICY
    with pytest.raises(StageError):
        sync(Record.model_validate({"id": "e", "trajectories": [dict(rec["trajectories"][0], extra={
            "simia": {"raw": REPLIES["UNKNOWN_TOOL"]}})]}))
    prefilter = strategies.build("validate-task", {"strategy": "simia", "model": "scripted"}, None)
    assert prefilter.sync is None  # an LLM strategy stays async
