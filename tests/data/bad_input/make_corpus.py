"""Regenerate the bad-input corpus (corpus.jsonl, truncated.jsonl.gz, expected.json) in this folder.

    PYTHONPATH=. python tests/data/bad_input/make_corpus.py

Good lines: the first bundled airline tasks run through `rollout --agent replay` (so every streaming
command has something real to do with them). Bad lines: one or more per kind, interleaved.
expected.json maps each 1-based line number to its kind and what every command must do with it:
"reject" (in --rejects with that line number, never in the output), "accept" (processed) or "skip"
(blank lines: neither; counted in the summary). The 200 MB line is made by the test at run time.
"""
import gzip
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def good_records(n: int = 3) -> list[bytes]:
    env = {"PYTHONPATH": str(ROOT), "PATH": f"{ROOT / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    tasks = subprocess.run([str(ROOT / "bin" / "toolkit"), "tasks", "airline"], capture_output=True, check=True,
                           env=env).stdout.splitlines()[:n]
    out = subprocess.run([str(ROOT / "bin" / "rollout"), "--agent", "replay"], input=b"\n".join(tasks) + b"\n",
                         capture_output=True, check=True, env=env).stdout.splitlines()
    assert len(out) == n
    return [json.dumps(json.loads(x), ensure_ascii=False, separators=(",", ":")).encode() for x in out]


def main() -> None:
    g = good_records(3)
    lines: list[tuple[str, str, bytes, str | None]] = []  # kind, expect, bytes, field expected in the reject

    def add(kind, expect, raw, field=None):
        lines.append((kind, expect, raw, field))

    add("bom_crlf_good", "accept", b"\xef\xbb\xbf" + g[0])  # BOM at the start of the file; CRLF endings below
    add("not_json", "reject", b"{this is not json")
    add("missing_id", "reject", b'{"flow":"custom","tags":[]}', "id")
    add("wrong_type", "reject", b'{"id":"wrong-type-1","tags":"not-a-list"}', "tags")
    add("wrong_type_id", "reject", b'{"id":12345}', "id")
    add("empty", "skip", b"")
    add("duplicate_id", "reject", g[0], "id")
    add("deep_nesting", "reject", b'{"id":"deep-1","extra":{"x":' + b"[" * 1500 + b"]" * 1500 + b"}}")
    add("deep_nesting_300", "reject", b'{"id":"deep-2","extra":{"x":' + b"[" * 300 + b"]" * 300 + b"}}", "extra.x")
    add("huge_int", "reject", b'{"id":"bigint-1","extra":{"n":' + b"7" * 5000 + b"}}", "extra.n")
    add("nan_reward", "reject", b'{"id":"nan-1","trajectories":[{"id":"nan-1-t0","messages":[],"reward":NaN}]}',
        "trajectories.0.reward")
    add("nan_extra", "reject", b'{"id":"nan-2","extra":{"score":NaN}}', "extra.score")
    add("infinity", "reject", b'{"id":"inf-1","verdicts":[{"stage":"verify","kind":"rule","passed":true,'
        b'"score":Infinity}]}', "verdicts.0.score")
    add("neg_infinity", "reject", b'{"id":"inf-2","extra":{"x":[1,-Infinity]}}', "extra.x.1")
    add("float_overflow", "reject", b'{"id":"inf-3","extra":{"x":1e999}}', "extra.x")
    add("whitespace_only", "skip", b"   \t  ")
    add("good", "accept", g[1])
    add("lone_surrogate_id", "reject", b'{"id":"\\ud800abc"}', "id")
    add("lone_surrogate_field", "reject", b'{"id":"sur-2","task":{"instruction":"half \\udc80 a pair"}}',
        "task.instruction")
    add("invalid_utf8", "reject", b'{"id":"utf8-1","task":{"instruction":"\xff\xfe\xc3("}}')
    add("utf8_encoded_surrogate", "reject", b'{"id":"utf8-2","task":{"instruction":"\xed\xa0\x80"}}',
        "task.instruction")
    add("bom_mid_file", "reject", b"\xef\xbb\xbf" + b'{"id":"bom-1"}')  # only the file's first line may
    add("good", "accept", g[2])
    add("json_array", "reject", b'[{"id":"arr-1"}]')
    add("json_scalar_number", "reject", b"42")
    add("json_scalar_string", "reject", b'"rec-1"')
    add("json_null", "reject", b"null")
    add("bad_trajectory_message", "reject", b'{"id":"msg-1","trajectories":[{"id":"msg-1-t0","messages":['
        b'{"role":"user","content":"hi"},{"role":"tool","content":"no call id"}]}]}', "trajectories.0.messages.1")
    add("bad_tool_call_arguments", "reject", b'{"id":"msg-2","trajectories":[{"id":"msg-2-t0","messages":['
        b'{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{not json"}}]}]}]}',
        "trajectories.0.messages.0.tool_calls.0.function.arguments")
    add("control_chars", "reject", b'{"id":"ctl-1","task":{"instruction":"bell \x07 and nul \x00"}}')
    add("one_byte", "reject", b"x")
    add("one_byte_brace", "reject", b"{")
    add("truncated_json", "reject", b'{"id":"torn-1","task":{"instr')
    add("unknown_field", "reject", b'{"id":"unk-1","bogus":1}', "bogus")
    add("bad_id_chars", "reject", b'{"id":"has space"}', "id")
    add("unsupported_schema", "reject", b'{"id":"schema-1","schema":"other/v9"}', "schema")
    add("duplicate_key", "reject", b'{"id":"a","id":"b"}', "id")  # readers disagree on which value wins
    add("duplicate_key_nested", "reject", b'{"id":"dup-2","task":{"instruction":"a","instruction":"b"}}',
        "task.instruction")

    data = b"".join(raw + b"\r\n" for _, _, raw, _ in lines)
    (HERE / "corpus.jsonl").write_bytes(data)
    expected = {"good_ids": [json.loads(x)["id"] for x in g],
                "lines": {str(i): {"kind": k, "expect": e, **({"field": f} if f else {})}
                          for i, (k, e, _, f) in enumerate(lines, 1)}}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    # a .gz cut in the middle of its third record: two whole lines, then the cut
    whole = gzip.compress(g[0] + b"\n" + g[1] + b"\n" + g[2] + b"\n", mtime=0)
    (HERE / "truncated.jsonl.gz").write_bytes(whole[: len(whole) - 200])


if __name__ == "__main__":
    main()
