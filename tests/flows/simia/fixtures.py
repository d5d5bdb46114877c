"""Hand-written Simia seeds and synthesizer replies (good and malformed), shared by the simia tests."""

import json

TOOLS = [
    {"type": "function", "function": {
        "name": "get_reservation", "description": "Look up a reservation by id",
        "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                       "required": ["reservation_id"]}}},
    {"type": "function", "function": {
        "name": "cancel_reservation", "description": "Cancel a reservation",
        "parameters": {"type": "object", "properties": {
            "reservation_id": {"type": "string"}, "reason": {"type": "string", "enum": ["change_of_plan", "other"]}},
            "required": ["reservation_id", "reason"]}}},
]
POLICY = "You are an airline agent. Look a reservation up before changing it."

SEED = {"id": "seed-1", "flow": "simia", "tags": ["seed"], "trajectories": [{
    "id": "seed-1-t0", "tools": TOOLS, "messages": [
        {"role": "system", "content": POLICY},
        {"role": "user", "content": "Please cancel reservation R1, my plans changed."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_reservation", "arguments": json.dumps({"reservation_id": "R1"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"reservation_id": "R1", "status": "confirmed"})},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {
            "name": "cancel_reservation", "arguments": json.dumps({"reservation_id": "R1", "reason": "change_of_plan"})}}]},
        {"role": "tool", "tool_call_id": "c2", "content": json.dumps({"reservation_id": "R1", "status": "cancelled"})},
        {"role": "assistant", "content": "Reservation R1 is cancelled."},
    ]}]}

GOOD = """HUMAN: Hi, can you cancel reservation R9? Something else came up.
FUNCTION_CALL:
<think>
I must look the reservation up first. I will call the function get_reservation.
</think>
{"name": "get_reservation", "arguments": {"reservation_id": "R9"}}
OBSERVATION: {"reservation_id": "R9", "status": "confirmed"}
FUNCTION_CALL:
{"name": "cancel_reservation", "arguments": {"reservation_id": "R9", "reason": "other"}}
OBSERVATION: {"reservation_id": "R9", "status": "cancelled"}
ASSISTANT: Reservation R9 is cancelled.
"""

SHAREGPT = json.dumps([
    {"from": "human", "value": "What is the status of R4?"},
    {"from": "function_call", "value": "{\"name\": \"get_reservation\", \"arguments\": {\"reservation_id\": \"R4\"}}"},
    {"from": "observation", "value": "{\"reservation_id\": \"R4\", \"status\": \"confirmed\"}"},
    {"from": "gpt", "value": "R4 is confirmed."}])

UNESCAPED_QUOTES = """HUMAN: Cancel R5 please, the note should say "moved".
FUNCTION_CALL:
{"name": "get_reservation", "arguments": {"reservation_id": "R5 "moved""}}
OBSERVATION: {"error": "not found"}
ASSISTANT: I could not find that reservation.
"""

MISSING_BRACKET = """HUMAN: Check R6.
FUNCTION_CALL:
{"name": "get_reservation", "arguments": {"reservation_id": "R6"}
OBSERVATION: {"reservation_id": "R6", "status": "confirmed"}
ASSISTANT: R6 is confirmed.
"""

UNKNOWN_TOOL = """HUMAN: Upgrade R7 to business.
FUNCTION_CALL:
{"name": "upgrade_cabin", "arguments": {"reservation_id": "R7"}}
OBSERVATION: {"ok": true}
ASSISTANT: Done.
"""

FUNCTION_TAG = """HUMAN: Status of R8?
FUNCTION_CALL:
<function>{"name": "get_reservation", "arguments": {"reservation_id": "R8"}}</function>
OBSERVATION: {"reservation_id": "R8", "status": "confirmed"}
ASSISTANT: R8 is confirmed.
"""

SYSTEM_TURN = """SYSTEM: You are a helpful airline assistant.
HUMAN: Is R2 still valid?
FUNCTION_CALL:
{"name": "get_reservation", "arguments": {"reservation_id": "R2"}}
OBSERVATION: {"reservation_id": "R2", "status": "confirmed"}
ASSISTANT: Yes, R2 is confirmed.
"""

SCHEMA_VIOLATION = """HUMAN: Cancel R3.
FUNCTION_CALL:
{"name": "cancel_reservation", "arguments": {"reservation_id": "R3", "reason": "bored"}}
OBSERVATION: {"status": "cancelled"}
ASSISTANT: Cancelled.
"""

UNPARSEABLE = """HUMAN: Cancel R3.
FUNCTION_CALL:
this is not a call at all
OBSERVATION: ok
ASSISTANT: Cancelled.
"""

UNFINISHED = """HUMAN: Check R1.
FUNCTION_CALL:
{"name": "get_reservation", "arguments": {"reservation_id": "R1"}}
"""

# reply -> expected outcome of `repair --strategy rules`: ("kept", [fixes]) or ("dropped", rule)
EXPECTED = {
    "GOOD": ("kept", []),
    "SHAREGPT": ("kept", []),
    "UNESCAPED_QUOTES": ("kept", ["json_repaired"]),
    "MISSING_BRACKET": ("kept", ["json_repaired"]),
    "UNKNOWN_TOOL": ("dropped", "unknown_tool"),
    "FUNCTION_TAG": ("kept", ["function_tag"]),
    "SYSTEM_TURN": ("kept", ["system_dropped"]),
    "SCHEMA_VIOLATION": ("dropped", "schema_violation"),
    "UNPARSEABLE": ("dropped", "unparseable_call"),
    "UNFINISHED": ("dropped", "unanswered_call"),
}
REPLIES = {name: globals()[name] for name in EXPECTED}
