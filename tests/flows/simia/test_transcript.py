"""The Simia transcript parser (toolkit.flows.simia.transcript): exact outputs on hand-written texts."""

import json

from toolkit.flows.simia import transcript as T

GOOD = """Here is the new conversation:
HUMAN: Hi, what's the status of reservation R7?
FUNCTION_CALL:
<think>
The user asks about R7. I will call the function get_reservation.
</think>
{"name": "get_reservation", "arguments": {"reservation_id": "R7"}}
OBSERVATION: {"reservation_id": "R7", "status": "confirmed"}
ASSISTANT: Reservation R7 is confirmed.
HUMAN: Thanks, bye.
ASSISTANT: Goodbye!
"""


def test_good_text_parses_exactly():
    conv = T.parse(GOOD, id_prefix="c")
    assert conv.ok and conv.fixes == [] and conv.unanswered == []
    assert conv.messages == [
        {"role": "user", "content": "Hi, what's the status of reservation R7?"},
        {"role": "assistant",
         "content": "<think>\nThe user asks about R7. I will call the function get_reservation.\n</think>",
         "tool_calls": [{"id": "c_1", "type": "function",
                         "function": {"name": "get_reservation", "arguments": '{"reservation_id": "R7"}'}}]},
        {"role": "tool", "tool_call_id": "c_1", "name": "get_reservation",
         "content": '{"reservation_id": "R7", "status": "confirmed"}'},
        {"role": "assistant", "content": "Reservation R7 is confirmed."},
        {"role": "user", "content": "Thanks, bye."},
        {"role": "assistant", "content": "Goodbye!"},
    ]


def test_labels_case_bold_gpt_and_fences():
    text = "```\n**Human:** hello\nGPT: hi there\nuser: more\nAssistant: ok\n```"
    conv = T.parse(text)
    assert [(m["role"], m["content"]) for m in conv.messages] == [
        ("user", "hello"), ("assistant", "hi there"), ("user", "more"), ("assistant", "ok")]


def test_sharegpt_json_variant():
    turns = [{"from": "human", "value": "find user u1"},
             {"from": "function_call", "value": '{"name": "find_user", "arguments": {"id": "u1"}}'},
             {"from": "observation", "value": '{"name": "Ann"}'},
             {"from": "gpt", "value": "It is Ann."}]
    conv = T.parse(json.dumps(turns))
    assert conv.ok
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[1]["tool_calls"][0]["function"] == {"name": "find_user", "arguments": '{"id": "u1"}'}
    assert conv.messages[2]["tool_call_id"] == conv.messages[1]["tool_calls"][0]["id"]


def test_chat_json_variant_with_tool_calls():
    msgs = {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "z", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "z", "content": "1"},
        {"role": "assistant", "content": "done"}]}
    conv = T.parse(json.dumps(msgs))
    assert conv.ok
    assert conv.messages[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_hermes_tool_call_inside_assistant_turn():
    text = ('HUMAN: q\nASSISTANT: Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
            'OBSERVATION: 1\nASSISTANT: one')
    conv = T.parse(text)
    assert conv.ok
    assert conv.messages[1]["content"] == "Let me look."
    assert conv.messages[1]["tool_calls"][0]["function"]["name"] == "f"


def test_strict_rejects_and_repair_fixes_unescaped_quotes():
    text = ('HUMAN: note\nFUNCTION_CALL:\n{"name": "add_note", "arguments": {"text": "he said "hi" to me"}}\n'
            'OBSERVATION: ok\nASSISTANT: saved')
    strict = T.parse(text)
    assert [p.rule for p in strict.problems] == ["unparseable_call"]
    fixed = T.parse(text, repair=True)
    assert fixed.ok and fixed.fixes == ["json_repaired"]
    assert json.loads(fixed.messages[1]["tool_calls"][0]["function"]["arguments"]) == {"text": 'he said "hi" to me'}


def test_repair_missing_bracket():
    text = 'HUMAN: q\nFUNCTION_CALL: {"name": "f", "arguments": {"a": [1, 2}\nOBSERVATION: r\nASSISTANT: done'
    fixed = T.parse(text, repair=True)
    assert fixed.ok and fixed.fixes == ["json_repaired"]
    assert json.loads(fixed.messages[1]["tool_calls"][0]["function"]["arguments"]) == {"a": [1, 2]}


def test_function_tag_strict_vs_repair():
    text = 'HUMAN: q\nFUNCTION_CALL: <function>{"name": "f", "arguments": {"a": 1}}</function>\nOBSERVATION: r\nASSISTANT: d'
    assert [p.rule for p in T.parse(text).problems] == ["function_tag"]
    fixed = T.parse(text, repair=True)
    assert fixed.ok and fixed.fixes == ["function_tag"]
    assert fixed.messages[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_system_turn_kept_strict_dropped_on_repair():
    text = "SYSTEM: you are an agent\nHUMAN: hi\nASSISTANT: hello"
    assert T.parse(text).messages[0] == {"role": "system", "content": "you are an agent"}
    fixed = T.parse(text, repair=True)
    assert fixed.fixes == ["system_dropped"] and [m["role"] for m in fixed.messages] == ["user", "assistant"]


def test_orphan_observation_unanswered_call_and_empty():
    c = T.parse("HUMAN: q\nOBSERVATION: stray\nASSISTANT: a")
    assert [p.rule for p in c.problems] == ["orphan_observation"] and c.problems[0].turn == 1
    c = T.parse('HUMAN: q\nFUNCTION_CALL: {"name": "f", "arguments": {}}')
    assert c.ok and c.unanswered == ["call_1"]
    assert [p.rule for p in T.parse("no labels at all").problems] == ["empty"]
    assert [p.rule for p in T.parse("").problems] == ["empty"]


def test_parallel_calls_are_answered_in_order():
    text = ('HUMAN: q\nFUNCTION_CALL: [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]\n'
            'OBSERVATION: one\nOBSERVATION: two\nASSISTANT: d')
    c = T.parse(text)
    assert c.ok
    assert [(m["tool_call_id"], m["name"], m["content"]) for m in c.messages if m["role"] == "tool"] == [
        ("call_1", "f", "one"), ("call_2", "g", "two")]


def test_render_parse_roundtrip():
    conv = T.parse(GOOD, id_prefix="call")
    again = T.parse(T.render(conv.messages), id_prefix="call")
    assert again.messages == conv.messages
    assert T.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == "HUMAN: u"
