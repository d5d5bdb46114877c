"""Records → training rows (toolkit.train.export) and `sft --export`."""

import json

import pytest

from tests.conftest import jsonl, requires_train, run_cmd
from toolkit.io import StageError
from toolkit.schema import Record, Verdict
from toolkit.formats.rows import export_row
from toolkit.train import export as X
from toolkit.formats.hermes import render_hermes


def dual_control_record() -> Record:
    """An agent turn, a user-side tool call (name="user") with its result, and a final reply."""
    return Record.model_validate({
        "id": "dc-1", "flow": "eigendata", "env": {"backend": "sqlite", "id": "airline"},
        "task": {"instruction": "My phone has no signal.",
                 "user_scenario": {"persona": "Ann", "reason_for_call": "no signal"}},
        "trajectories": [{
            "id": "dc-1-t0", "reward": 1.0, "scores": {"verify": {"passed": True}},
            "tools": [{"type": "function", "function": {"name": "check_line", "description": "Check a line.",
                                                        "parameters": {"type": "object", "properties": {
                                                            "line_id": {"type": "integer"}}}}}],
            "messages": [
                {"role": "system", "content": "You are a telecom agent."},
                {"role": "user", "content": "My phone has no signal."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "check_line", "arguments": json.dumps({"line_id": 7})}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"status\": \"suspended\"}"},
                {"role": "assistant", "content": "Please toggle airplane mode."},
                {"role": "assistant", "name": "user", "content": None, "tool_calls": [
                    {"id": "u1", "type": "function",
                     "function": {"name": "toggle_airplane_mode", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "u1", "content": "airplane mode off"},
                {"role": "user", "content": "Done, it works now. ###STOP###"},
            ]}],
    })


def test_agent_rows_dicts_and_dual_control_dropped():
    row = X.record_rows(dual_control_record())[0]
    msgs = row["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"line_id": 7}
    assert msgs[3]["name"] == "check_line"
    assert not any(m.get("name") == "user" for m in msgs)
    assert "airplane mode off" not in json.dumps(msgs)
    assert row["tools"][0]["function"]["name"] == "check_line"
    text = render_hermes(msgs, row["tools"])
    assert '{"name": "check_line", "arguments": {"line_id": 7}}' in text
    assert '"arguments": "' not in text  # never double-encoded


def test_user_rows_flip_like_the_simulator():
    row = X.record_rows(dual_control_record(), role="user")[0]
    msgs = row["messages"]
    roles = [m["role"] for m in msgs]
    # system(user-sim prompt), the user opens (assistant), agent text -> user, user-side tool call + result,
    # the user's last message (assistant); the agent's own tool traffic is gone
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert msgs[1]["content"] == "Hi! How can I help you today?"
    assert msgs[2]["content"] == "My phone has no signal."
    assert msgs[3]["content"] == "Please toggle airplane mode."
    assert msgs[4]["tool_calls"][0]["function"] == {"name": "toggle_airplane_mode", "arguments": {}}
    assert msgs[6]["content"].endswith("###STOP###")
    assert "Persona: Ann" in msgs[0]["content"]
    assert "check_line" not in json.dumps(msgs)


def test_filters_on_verdicts_and_reward():
    rec = dual_control_record()
    assert len(X.record_rows(rec, filter="passed")) == 1
    assert X.record_rows(rec, filter="failed") == []
    assert X.record_rows(rec, min_reward=1.5) == []
    rec.trajectories[0].scores = {}
    assert X.record_rows(rec, filter="passed") == []  # never verified: neither passed nor failed
    rec.verdicts = [Verdict(stage="verify", kind="state_diff", name="state_diff", passed=False,
                            trajectory_id="dc-1-t0")]
    assert len(X.record_rows(rec, filter="failed")) == 1


def test_bad_arguments_reject_naming_the_field():
    rec = dual_control_record()
    rec.trajectories[0].messages[2].tool_calls[0].function.arguments = "{not json"
    with pytest.raises(StageError) as e:
        X.record_rows(rec)
    assert e.value.field == "trajectories[0].messages[2].tool_calls[0].function.arguments"
    # a string that was double-encoded upstream is decoded back to a dict
    rec.trajectories[0].messages[2].tool_calls[0].function.arguments = json.dumps(json.dumps({"line_id": 7}))
    assert X.record_rows(rec)[0]["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"line_id": 7}


def test_formats():
    row = X.record_rows(dual_control_record())[0]
    oa = export_row(row, "openai")
    assert json.loads(oa["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {"line_id": 7}
    assert row["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"line_id": 7}  # not mutated
    sg = export_row(row, "sharegpt")
    assert [c["from"] for c in sg["conversations"]] == ["human", "function_call", "observation", "gpt", "human"]
    assert json.loads(sg["conversations"][1]["value"]) == {"name": "check_line", "arguments": {"line_id": 7}}
    assert sg["system"] == "You are a telecom agent."
    assert json.loads(sg["tools"])[0]["name"] == "check_line"
    he = export_row(row, "hermes")["text"]
    assert he.startswith("<|im_start|>system\nYou are a telecom agent.\n\n# Tools")
    assert "<tool_response>\n{\"status\": \"suspended\"}\n</tool_response><|im_end|>" in he


def test_sft_export_cli_on_verified_records(verified_airline):
    stdin = jsonl([r.model_dump(mode="json", by_alias=True) for r in verified_airline])
    p = run_cmd(["sft", "--export", "openai", "--filter", "passed"], stdin=stdin)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(rows) == len(verified_airline)
    for r in rows:
        for m in r["messages"]:
            for tc in m.get("tool_calls") or []:
                assert isinstance(json.loads(tc["function"]["arguments"]), dict)
    p = run_cmd(["sft", "--export", "hermes", "--filter", "failed"], stdin=stdin)
    assert p.returncode == 0 and p.stdout == ""
    p = run_cmd(["sft", "--export", "chat"], stdin=stdin + "{not json\n")
    assert p.returncode == 1 and "line 7" in p.stderr


@requires_train
def test_hermes_export_equals_the_chat_template(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    for role in ("assistant", "user"):
        row = X.record_rows(dual_control_record(), role=role)[0]
        assert export_row(row, "hermes")["text"] == tok.apply_chat_template(
            row["messages"], tools=row["tools"] or None, tokenize=False)
