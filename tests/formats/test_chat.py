"""Chat-template shaped messages (toolkit.formats.chat): argument dicts, named tool results."""

from __future__ import annotations

import json

import pytest

from toolkit.formats.chat import arguments_dict, chat_messages
from toolkit.io import StageError


def test_arguments_dict_decodes_once_or_twice():
    assert arguments_dict({"a": 1}, "w") == {"a": 1}
    assert arguments_dict('{"a": 1}', "w") == {"a": 1}
    assert arguments_dict(json.dumps(json.dumps({"a": 1})), "w") == {"a": 1}  # double-encoded
    assert arguments_dict(None, "w") == {} and arguments_dict("", "w") == {}


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", "3"])
def test_arguments_dict_rejects_non_objects_naming_the_field(raw):
    with pytest.raises(StageError) as e:
        arguments_dict(raw, "trajectories[0].messages[2].tool_calls[0].function.arguments")
    assert e.value.field == "trajectories[0].messages[2].tool_calls[0].function.arguments"


def test_chat_messages_shape():
    msgs = [
        {"role": "user", "content": "cancel R1"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "cancel", "arguments": '{"id": "R1"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": {"ok": True}},
        {"role": "assistant", "content": None},
    ]
    out = chat_messages(msgs)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"id": "R1"}
    assert out[2]["name"] == "cancel" and out[2]["content"] == '{"ok": true}'
    assert out[3]["content"] == "" and "tool_calls" not in out[3]
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"id": "R1"}'  # input untouched
    bad = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[]"}}]}]
    with pytest.raises(StageError) as e:
        chat_messages(bad, ti=3)
    assert e.value.field == "trajectories[3].messages[0].tool_calls[0].function.arguments"
