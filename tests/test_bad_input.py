"""The bad-input corpus (tests/data/bad_input/) through every streaming command: no line ends a run.

Each command runs in-process (click's CliRunner: the commands' real option parsing, config merge,
RecordStream and strategy code) with offline strategies or the loopback scripted server; one
subprocess run checks the real binary's stderr and the rejects file. Expectations come from
expected.json (written with the corpus by make_corpus.py): every "reject" line is in --rejects with
its line number (and the field where one is named), never in the output; every good line is
processed; blank lines are skipped; the exit code is 1.
"""
import gzip
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from tests.conftest import BIN, ROOT, run_cmd
from toolkit import cli
from toolkit.llm.testserver import ScriptedServer

DATA = ROOT / "tests" / "data" / "bad_input"
EXPECTED = json.loads((DATA / "expected.json").read_text())
GOOD_IDS = EXPECTED["good_ids"]
REJECT_LINES = {int(n): e for n, e in EXPECTED["lines"].items() if e["expect"] == "reject"}
SIM_OK = json.dumps({"success": True, "observation": {"ok": True}})
PROMPT_SET = "<prompt_set>" + json.dumps({
    "focus": "changes", "summary": "reservation changes", "guidance": {"user_intent": ["use reservations that exist"]},
    "evaluation_rules": "The task is feasible. Output [ACCEPT] or [REJECT]."}) + "</prompt_set>"
BIG_LINE = b'{"id":"huge-line-1","extra":{"pad":"' + b"a" * (3 << 20) + b'"}}'  # made at run time
CAP = 1 << 20  # --max-line-bytes for the corpus runs (the default cap: test_200mb_line_with_the_default_cap)

# command -> (click command, args, scripted replies or None, how good ids show in the output)
COMMANDS = {
    "rollout": (cli.rollout, ["--agent", "replay"], None, "same"),
    "verify": (cli.verify, ["--strategy", "state_diff"], None, "same"),
    "repair": (cli.repair, ["--strategy", "rules"], None, "same"),
    "validate-task": (cli.validate_task, ["--strategy", "logigen"], None, "same"),
    "gen-task": (cli.gen_task, ["--strategy", "logigen", "--explorer", "symbolic", "-n", "1"], None, "parent"),
    "make-verifier": (cli.make_verifier, ["--strategy", "eigendata"], None, "same"),
    "simulate-env": (cli.simulate_env, ["--model", "m"], [SIM_OK], "same"),
    "gen-plan": (cli.gen_plan, ["--strategy", "eigendata", "-n", "1", "--model", "m"], [PROMPT_SET], "parent"),
    "reflect": (cli.reflect, ["--strategy", "eigendata", "--model", "m"], ["unused"], "batch"),
}


def test_the_corpus_has_every_kind():
    kinds = {e["kind"] for e in EXPECTED["lines"].values()}
    for k in ("not_json", "missing_id", "wrong_type", "duplicate_id", "deep_nesting", "huge_int", "nan_reward",
              "infinity", "lone_surrogate_id", "lone_surrogate_field", "invalid_utf8", "bom_crlf_good", "empty",
              "whitespace_only", "json_array", "json_scalar_number", "bad_trajectory_message", "control_chars",
              "one_byte", "duplicate_key", "duplicate_key_nested"):
        assert k in kinds, k
    assert (DATA / "corpus.jsonl").read_bytes().count(b"\r\n") == len(EXPECTED["lines"])
    with pytest.raises(EOFError):  # the .gz really is cut
        gzip.decompress((DATA / "truncated.jsonl.gz").read_bytes())


def pending(line: bytes) -> bytes:
    """A good record whose last trajectory ends on its first tool call (what simulate-env answers)."""
    bom = line[:3] if line.startswith(b"\xef\xbb\xbf") else b""
    rec = json.loads(line[len(bom):])
    t = rec["trajectories"][-1]
    k = next(i for i, m in enumerate(t["messages"]) if m["role"] == "assistant" and m.get("tool_calls"))
    t["messages"], t["steps"] = t["messages"][:k + 1], []
    return bom + json.dumps(rec).encode()


def corpus(tmp_path, command: str) -> tuple[str, dict[int, dict]]:
    """The corpus plus a line longer than the cap (made here, not committed); simulate-env gets
    its good records with a pending call."""
    lines = (DATA / "corpus.jsonl").read_bytes().split(b"\r\n")[:-1]
    if command == "simulate-env":
        lines = [pending(x) if EXPECTED["lines"][str(i)]["expect"] == "accept" else x
                 for i, x in enumerate(lines, 1)]
    lines.insert(5, BIG_LINE)  # line 6
    expect = {(n if n < 6 else n + 1): e for n, e in REJECT_LINES.items()}
    expect[6] = {"kind": "long_line", "expect": "reject"}
    p = tmp_path / "corpus.jsonl"
    p.write_bytes(b"".join(x + b"\r\n" for x in lines))
    return str(p), expect


def invoke(command: str, tmp_path, inp: str, extra: list[str] = ()):
    cmd, args, replies, _ = COMMANDS[command]
    rej = tmp_path / f"{command}.rejects.jsonl"
    out = tmp_path / f"{command}.out.jsonl"
    args = list(args) + ["-i", inp, "-o", str(out), "--rejects", str(rej), "--max-line-bytes", str(CAP), *extra]
    if command == "make-verifier":
        (tmp_path / "r.yaml").write_text("make-verifier:\n  verifier_source: template\n")
        args += ["--recipe", str(tmp_path / "r.yaml")]
    if replies is not None:
        with ScriptedServer(replies) as srv:
            r = CliRunner().invoke(cmd, args + ["--base-url", srv.base_url])
    else:
        r = CliRunner().invoke(cmd, args)
    outs = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    rejs = [json.loads(x) for x in rej.read_text().splitlines()] if rej.exists() else []
    return r, outs, rejs


def check_good_out(command: str, outs: list[dict], good: list[str]) -> None:
    how = COMMANDS[command][3]
    if how == "same":
        assert [o["id"] for o in outs] == good
    elif how == "parent":
        assert sorted({o["parent_id"] for o in outs}) == sorted(good) and len(outs) >= len(good)
    # "batch" (reflect) writes records made from the whole input, not one per line


@pytest.mark.parametrize("command", list(COMMANDS))
def test_corpus_through_every_streaming_command(tmp_path, command):
    inp, expect = corpus(tmp_path, command)
    r, outs, rejs = invoke(command, tmp_path, inp)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.stderr
    assert r.exit_code == 1, r.stderr[-2000:]
    by_line = {x["line"]: x for x in rejs}
    assert sorted(by_line) == sorted(expect), r.stderr[-3000:]  # every bad line once, no good one
    assert len(rejs) == len(expect)
    for n, e in expect.items():
        x = by_line[n]
        assert x["error"] and x["command"] == command
        if e.get("field"):
            assert x["field"] == e["field"], (e["kind"], x)
        assert f"line {n}" in r.stderr
    assert by_line[6]["truncated"] is True and by_line[6]["length"] == len(BIG_LINE)
    sur = next(n for n, e in expect.items() if e["kind"] == "lone_surrogate_id")
    assert "lone surrogate" in by_line[sur]["error"]
    check_good_out(command, outs, GOOD_IDS)
    assert f"read {len(expect) + len(GOOD_IDS)}," in r.stderr and "blank lines skipped 2" in r.stderr
    if command == "reflect":  # every good line reached the batch strategy (it filters those without a plan)
        assert f"filtered {len(GOOD_IDS)}" in r.stderr


def good_lines() -> list[bytes]:
    lines = (DATA / "corpus.jsonl").read_bytes().split(b"\r\n")
    return [lines[int(n) - 1].removeprefix(b"\xef\xbb\xbf") for n, e in EXPECTED["lines"].items()
            if e["expect"] == "accept"]


@pytest.mark.parametrize("command", ["rollout", "verify", "repair", "simulate-env", "gen-plan"])
def test_truncated_gz_input(tmp_path, command):
    inp = str(DATA / "truncated.jsonl.gz")
    if command == "simulate-env":  # the same cut, over records with a pending call
        whole = gzip.compress(b"".join(pending(x) + b"\n" for x in good_lines()), mtime=0)
        inp = str(tmp_path / "cut.jsonl.gz")
        with open(inp, "wb") as f:
            f.write(whole[:-200])
    r, outs, rejs = invoke(command, tmp_path, inp)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert [x["line"] for x in rejs] == [3] and rejs[0]["cut"] is True and "truncated" in rejs[0]["error"]
    check_good_out(command, outs, GOOD_IDS[:2])


def test_200mb_line_with_the_default_cap(tmp_path):
    """The real 200 MB line against the default --max-line-bytes (64 MiB): rejected unread past
    the cap, the lines around it flow."""
    g = good_lines()
    inp = tmp_path / "big.jsonl"
    head, chunk, n_chunks = b'{"id":"huge-1","extra":{"pad":"', b"a" * (8 << 20), 25
    length = len(head) + len(chunk) * n_chunks + 3
    with open(inp, "wb") as f:
        f.write(g[0] + b"\n" + head)
        for _ in range(n_chunks):
            f.write(chunk)
        f.write(b'"}}\n' + g[1] + b"\n")
    assert length >= 200 << 20
    rej = tmp_path / "rej.jsonl"
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(cli.rollout, ["--agent", "replay", "-i", str(inp), "-o", str(out), "--rejects", str(rej)])
    os.unlink(inp)
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    rows = [json.loads(x) for x in rej.read_text().splitlines()]
    assert [x["line"] for x in rows] == [2] and rows[0]["length"] == length and rows[0]["truncated"]
    assert len(rows[0]["raw"]) < 4096 and "max_line_bytes 67108864" in rows[0]["error"]
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == GOOD_IDS[:2]


def test_subprocess_rollout_no_traceback_and_rejects_readable(tmp_path):
    """The real binary: stderr has no traceback, --rejects is one JSON object a line (lone
    surrogates and invalid UTF-8 escaped), stdout carries only the good records."""
    inp = tmp_path / "c.jsonl"
    shutil.copy(DATA / "corpus.jsonl", inp)
    rej = tmp_path / "rej.jsonl"
    p = run_cmd([str(BIN / "rollout"), "--agent", "replay", "-i", str(inp), "--rejects", str(rej)])
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert [json.loads(x)["id"] for x in p.stdout.splitlines()] == GOOD_IDS
    raw = rej.read_bytes()
    raw.decode("utf-8")  # strict: whatever the input held, the rejects file is valid UTF-8
    rows = [json.loads(x) for x in raw.splitlines()]
    assert sorted(x["line"] for x in rows) == sorted(REJECT_LINES)
    sur = next(x for x in rows if x["line"] == next(n for n, e in REJECT_LINES.items()
                                                      if e["kind"] == "lone_surrogate_id"))
    assert sur["raw"] == '{"id":"\\ud800abc"}' and sur["field"] == "id"
    utf = next(x for x in rows if x["line"] == next(n for n, e in REJECT_LINES.items() if e["kind"] == "invalid_utf8"))
    assert "\\xff\\xfe" in utf["raw"] and "not UTF-8" in utf["error"]
