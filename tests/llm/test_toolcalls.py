import json

import pytest

from toolkit.llm.toolcalls import (parse_tool_calls, render_tools_hermes, repair_json,
                                   to_hermes_messages, tool_calls_to_text)

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]


def args_of(call):
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    return json.loads(call["function"]["arguments"])


# ---------------------------------------------------------------------------------------------
# repair_json

@pytest.mark.parametrize("text,expected", [
    ('{"a": 1}', {"a": 1}),
    ('{"a": 1,}', {"a": 1}),                                       # trailing comma
    ('{"a": [1, 2,], "b": {"c": 3,},}', {"a": [1, 2], "b": {"c": 3}}),
    ('{"a": {"b": 1}', {"a": {"b": 1}}),                           # missing closing brace
    ('{"a": [1, {"b": "x"', {"a": [1, {"b": "x"}]}),               # truncated mid-string
    ('{"text": "He said "hi" to me", "n": 2}', {"text": 'He said "hi" to me', "n": 2}),
    ('{"text": "He said "hi", then left", "n": 2}', {"text": 'He said "hi", then left', "n": 2}),
    ("{'name': 'f', 'ok': True, 'x': None}", {"name": "f", "ok": True, "x": None}),  # single quotes
    ("{'q': 'it's fine'}", {"q": "it's fine"}),                   # apostrophe inside single quotes
    ('{name: "f", arguments: {x: 1}}', {"name": "f", "arguments": {"x": 1}}),  # unquoted keys
    ('"name": "f", "arguments": {}}', {"name": "f", "arguments": {}}),        # missing opening brace
    ('```json\n{"a": 1}\n```', {"a": 1}),                           # code fence
    ('{"a": "x"\n "b": 2}', {"a": "x", "b": 2}),                   # missing comma
    ('{"a": "line1\nline2"}', {"a": "line1\nline2"}),              # raw newline in string
    ('{"a": {"b": 1}}}', {"a": {"b": 1}}),                         # extra closing brace
    ('Sure! {"a": 1} hope that helps', {"a": 1}),                  # surrounding prose
])
def test_repair_json(text, expected):
    assert repair_json(text) == expected


@pytest.mark.parametrize("text", ["", "hello world", "<<<>>>", '{"a" 1}', "[1, @]", '{"a": }'])
def test_repair_json_clear_failure(text):
    with pytest.raises(ValueError, match="cannot repair JSON"):
        repair_json(text)


# ---------------------------------------------------------------------------------------------
# parse_tool_calls

def test_hermes_single_call_with_content():
    text = 'Let me check.\n<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1"}}\n</tool_call>'
    content, calls, err = parse_tool_calls(text)
    assert err is None
    assert content == "Let me check."
    assert len(calls) == 1
    assert calls[0]["function"]["name"] == "get_order"
    assert args_of(calls[0]) == {"order_id": "W1"}


def test_hermes_multiple_calls_unique_ids():
    text = ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {"y": 2}}</tool_call>')
    content, calls, err = parse_tool_calls(text)
    assert content is None and err is None
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert [args_of(c) for c in calls] == [{"x": 1}, {"y": 2}]
    assert calls[0]["id"] != calls[1]["id"]


def test_hermes_unclosed_and_broken_json():
    # missing </tool_call>, trailing comma, missing closing braces (max_tokens truncation)
    text = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1",'
    content, calls, err = parse_tool_calls(text)
    assert err is None and content is None
    assert args_of(calls[0]) == {"order_id": "W1"}


def test_hermes_arguments_as_string_and_parameters_key():
    text = ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"name": "b", "parameters": {"y": 2}}</tool_call>')
    _, calls, err = parse_tool_calls(text)
    assert err is None
    assert [args_of(c) for c in calls] == [{"x": 1}, {"y": 2}]


def test_function_tag_formats():
    _, calls, err = parse_tool_calls('<function>{"name": "f", "arguments": {"a": 1}}</function>')
    assert err is None and calls[0]["function"]["name"] == "f" and args_of(calls[0]) == {"a": 1}
    content, calls, err = parse_tool_calls('ok <function=get_order>{"order_id": "W2"}</function>')
    assert err is None and content == "ok"
    assert calls[0]["function"]["name"] == "get_order" and args_of(calls[0]) == {"order_id": "W2"}


def test_qwen_xml_parameters():
    text = ("<tool_call>\n<function=get_order>\n<parameter=order_id>\nW3\n</parameter>\n"
            "<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>")
    _, calls, err = parse_tool_calls(text)
    assert err is None
    assert args_of(calls[0]) == {"order_id": "W3", "n": 2}


def test_bare_json_call():
    _, calls, err = parse_tool_calls('```json\n{"name": "f", "arguments": {"a": 1}}\n```')
    assert err is None and args_of(calls[0]) == {"a": 1}


def test_plain_text_is_not_a_call():
    content, calls, err = parse_tool_calls('The answer is {"name": 1}.')
    assert calls == [] and err is None and content == 'The answer is {"name": 1}.'
    assert parse_tool_calls("") == (None, [], None)
    assert parse_tool_calls(None) == (None, [], None)


def test_garbage_in_tags_is_a_clear_error():
    content, calls, err = parse_tool_calls("<tool_call>I will now call the tool!</tool_call>")
    assert calls == []
    assert err and "<tool_call>" in err and "cannot repair JSON" in err


def test_missing_name_is_an_error():
    _, calls, err = parse_tool_calls('<tool_call>{"arguments": {"a": 1}}</tool_call>')
    assert calls == [] and "no function name" in err


def test_partial_failure_keeps_good_calls():
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
            '<tool_call>nonsense</tool_call>')
    _, calls, err = parse_tool_calls(text)
    assert [c["function"]["name"] for c in calls] == ["a"]
    assert err is not None


# ---------------------------------------------------------------------------------------------
# rendering / conversation conversion

def test_render_tools_hermes():
    block = render_tools_hermes(TOOLS)
    assert "<tools>" in block and "</tools>" in block and "get_order" in block
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in block


def test_roundtrip_render_and_parse():
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "get_order", "arguments": '{"order_id": "W9"}'}}]
    _, parsed, err = parse_tool_calls(tool_calls_to_text(calls))
    assert err is None and args_of(parsed[0]) == {"order_id": "W9"}


def test_to_hermes_messages():
    msgs = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Where is W1?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "W1"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "W2"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"status": "pending"}'},
        {"role": "assistant", "content": "W1 shipped."},
    ]
    out = to_hermes_messages(msgs, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[0]["content"].startswith("You are an agent.") and "<tools>" in out[0]["content"]
    assert out[2]["content"].count("<tool_call>") == 2 and "tool_calls" not in out[2]
    assert out[3]["content"].count("<tool_response>") == 2 and "shipped" in out[3]["content"]
    assert all(set(m) == {"role", "content"} for m in out)
    # no system message: one is inserted
    out = to_hermes_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"]
    # no tools: nothing inserted
    assert to_hermes_messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]


def test_fewshot_example_exchange():
    out = to_hermes_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                             TOOLS, fewshot=True)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    # the example exchange shows the format on a schematic call: copied, it is no call at all
    assert out[2]["content"].startswith("<tool_call>\n{") and "get_order" not in out[1]["content"] + out[2]["content"]
    _, calls, err = parse_tool_calls(out[2]["content"])
    assert calls == [] and "placeholder" in err
    assert out[3]["content"] == "hi"
    # fewshot without tools changes nothing
    assert to_hermes_messages([{"role": "user", "content": "hi"}], None, fewshot=True) == \
        [{"role": "user", "content": "hi"}]


def _example_blocks(text: str) -> list[str]:
    """Every <tool_call>...</tool_call> block in `text` that holds a JSON-looking object."""
    import re

    return [m.group(0) for m in re.finditer(r"<tool_call>\s*\{.*?</tool_call>", text, re.DOTALL)]


def test_prompt_example_is_not_a_copyable_call():
    """The tool prompt's example call (and the few-shot exchange), emitted verbatim by a model, must
    not parse as a call to a real tool, and shows no "example" values (issue 20: small models copied
    the old example, a real tool with "example" arguments)."""
    tools = TOOLS + [{"type": "function", "function": {
        "name": "cancel_order", "parameters": {"type": "object", "properties": {
            "order_id": {"type": "string"}, "reason": {"type": "string", "enum": ["no longer needed"]}},
            "required": ["order_id", "reason"]}}}]
    for compact in (False, True):
        msgs = to_hermes_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                                  tools, fewshot=True, compact=compact)
        prompt = msgs[0]["content"]
        blocks = _example_blocks(prompt) + _example_blocks(msgs[2]["content"])
        assert len(blocks) == 3  # the prompt's format line and example, and the few-shot assistant turn
        assert '"example"' not in prompt and "example" not in msgs[2]["content"]
        for block in blocks:
            assert "get_order" not in block and "cancel_order" not in block
            for reply in (block, "Sure.\n" + block):
                _, calls, err = parse_tool_calls(reply)
                assert calls == [], reply
                assert err is not None  # rejected, and said so
            bare = block.replace("<tool_call>", "").replace("</tool_call>", "")
            content, calls, _ = parse_tool_calls(bare)  # the bare-JSON form: text, not a call
            assert calls == [] and content == bare.strip()
    # a real call in the same shape still parses
    _, calls, err = parse_tool_calls('<tool_call>\n{"name": "get_order", "arguments": {"order_id": "W1"}}\n</tool_call>')
    assert err is None and calls[0]["function"]["name"] == "get_order"
