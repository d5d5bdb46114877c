"""The JSONL layer at library level (RecordStream) — CLI/subprocess behaviour is in test_cli.py."""
import asyncio
import gzip
import json
import zlib

import pytest

from tests.conftest import jsonl, make_record
from toolkit.io import IdSet, IOOptions, RecordStream, StageError, _trim_torn_tail, shard_of


def run(tmp_path, lines: str, fn, **opts):
    inp = tmp_path / "in.jsonl"
    inp.write_text(lines)
    out = tmp_path / "out.jsonl"
    o = IOOptions(input=str(inp), output=str(out), rejects=str(tmp_path / "rej.jsonl"), **opts)
    s = RecordStream(o, "test")
    s.run(fn)
    outs = [json.loads(l) for l in out.read_text().splitlines()] if out.exists() else []
    rej = tmp_path / "rej.jsonl"
    rejs = [json.loads(l) for l in rej.read_text().splitlines()] if rej.exists() else []
    return s, outs, rejs


def ident(r):
    return r


def test_bad_lines_go_to_rejects_and_good_lines_flow(tmp_path):
    good = make_record(1)
    bad_schema = make_record(2)
    bad_schema["trajectories"][0]["messages"][1]["role"] = "robot"
    lines = "{bad\n" + json.dumps(good) + "\n" + json.dumps(bad_schema) + "\n" + json.dumps(good) + "\n"
    s, outs, rejs = run(tmp_path, lines, ident)
    assert [o["id"] for o in outs] == ["rec-0000001"]
    assert [r["line"] for r in rejs] == [1, 3, 4]
    assert "not JSON" in rejs[0]["error"] and rejs[0]["raw"] == "{bad"
    assert rejs[1]["id"] == "rec-0000002" and rejs[1]["field"].startswith("trajectories.0.messages.1")
    assert "duplicate id" in rejs[2]["error"]
    assert s.exit_code() == 1 and s.summary.rejected == 3 and s.summary.written == 1


def test_stage_errors_reject_only_that_record(tmp_path, records):
    def fn(r):
        if r.id.endswith("5"):
            raise StageError("cannot do this one", field="task")
        return r
    s, outs, rejs = run(tmp_path, jsonl(records[:10]), fn)
    assert len(outs) == 9 and len(rejs) == 1 and rejs[0]["field"] == "task"
    assert rejs[0]["error"] == "cannot do this one"


def test_order_preserved_with_concurrency_and_unordered_mode(tmp_path, records):
    async def slow_first(r):
        n = int(r.id[-2:])
        await asyncio.sleep(0.05 if n % 3 == 0 else 0.0)
        return r
    _, outs, _ = run(tmp_path, jsonl(records), slow_first, concurrency=8)
    assert [o["id"] for o in outs] == [r["id"] for r in records]
    _, outs, _ = run(tmp_path, jsonl(records), slow_first, concurrency=8, unordered=True)
    assert sorted(o["id"] for o in outs) == sorted(r["id"] for r in records)
    assert [o["id"] for o in outs] != [r["id"] for r in records]  # slow ones came later


def test_fan_out_and_drop(tmp_path, records):
    def fn(r):
        n = int(r.id[-2:])
        if n % 2:
            return None
        c = r.model_copy(deep=True)
        c.id = r.id + "-b"
        c.parent_id = r.id
        return [r, c]
    s, outs, _ = run(tmp_path, jsonl(records[:6]), fn)
    assert [o["id"] for o in outs] == ["rec-0000000", "rec-0000000-b", "rec-0000002", "rec-0000002-b",
                                       "rec-0000004", "rec-0000004-b"]
    assert s.summary.dropped == 3


def test_shards_partition_exactly(tmp_path):
    recs = [make_record(i, with_traj=False) for i in range(200)]
    seen = []
    for i in range(4):
        _, outs, _ = run(tmp_path, jsonl(recs), ident, shard=(i, 4))
        seen += [o["id"] for o in outs]
    assert sorted(seen) == sorted(r["id"] for r in recs)
    # stable: independent of process (blake2b), roughly balanced
    assert shard_of("rec-0000001", 4) == shard_of("rec-0000001", 4)
    counts = [sum(1 for r in recs if shard_of(r["id"], 4) == i) for i in range(4)]
    assert min(counts) > 25


def test_limit(tmp_path, records):
    _, outs, _ = run(tmp_path, jsonl(records), ident, limit=3)
    assert len(outs) == 3


def test_resume_skips_done_ids_and_trims_torn_tail(tmp_path, records):
    out = tmp_path / "out.jsonl"
    done = "".join(json.dumps(r) + "\n" for r in records[:5])
    out.write_text(done + '{"id": "rec-0000005", "trunc')  # a kill mid-line
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl(records))
    s = RecordStream(IOOptions(input=str(inp), output=str(out), resume=True), "test")
    s.run(ident)
    ids = [json.loads(l)["id"] for l in out.read_text().splitlines()]
    assert ids == [r["id"] for r in records]
    assert s.summary.skipped_resume == 5


def test_trim_torn_tail_variants(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a":1}\n{"b":')
    _trim_torn_tail(str(p))
    assert p.read_text() == '{"a":1}\n'
    p.write_text('{"b":')
    _trim_torn_tail(str(p))
    assert p.read_text() == ""


@pytest.mark.parametrize("cut", ["no_trailer", "mid_line", "header_only", "second_member_torn"])
def test_resume_gz_trims_a_torn_member(tmp_path, records, cut):
    """A kill leaves a .gz without its end (maybe mid-line): --resume rewrote nothing before and
    raised InputCut from existing_ids; now the whole lines stay, the file reads to the end and
    each id is there once."""
    out = tmp_path / "out.jsonl.gz"
    if cut == "second_member_torn":  # a clean member (an earlier --resume run), then a torn one
        blob = (gzip.compress(jsonl(records[:3]).encode(), mtime=0)
                + gzip.compress(jsonl(records[3:8]).encode(), mtime=0)[:-30])
    else:
        full = gzip.compress(jsonl(records[:8]).encode(), mtime=0)
        blob = {"no_trailer": full[:-8], "mid_line": full[:-60], "header_only": full[:10]}[cut]
    out.write_bytes(blob)
    with pytest.raises(EOFError):  # really torn
        gzip.decompress(blob)
    d, data, rest = zlib.decompressobj(31), b"", blob  # what a reader gets out of it: whole lines
    while rest:
        data += d.decompress(rest)
        rest, d = (d.unused_data, zlib.decompressobj(31)) if d.eof else (b"", d)
    kept = data.count(b"\n")
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl(records))
    s = RecordStream(IOOptions(input=str(inp), output=str(out), resume=True), "test")
    s.run(ident)
    text = gzip.decompress(out.read_bytes()).decode()  # raises on a torn or corrupt file
    ids = [json.loads(l)["id"] for l in text.splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in records) and len(ids) == len(set(ids))
    assert ids[:kept] == [r["id"] for r in records[:kept]]
    assert s.summary.skipped_resume == kept and s.exit_code() == 0


def test_resume_gz_clean_file_is_appended_not_rewritten(tmp_path, records):
    out = tmp_path / "out.jsonl.gz"
    out.write_bytes(gzip.compress(jsonl(records[:4]).encode(), mtime=0))
    before = out.read_bytes()
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl(records))
    RecordStream(IOOptions(input=str(inp), output=str(out), resume=True), "test").run(ident)
    assert out.read_bytes().startswith(before)  # a new member after the old one
    ids = [json.loads(l)["id"] for l in gzip.decompress(out.read_bytes()).decode().splitlines()]
    assert ids == [r["id"] for r in records]


def test_resume_gz_refuses_a_file_that_is_not_gzip(tmp_path, records):
    from toolkit.io import UsageError
    out = tmp_path / "out.jsonl.gz"
    out.write_text(jsonl(records[:2]))
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl(records))
    with pytest.raises(UsageError, match="not gzip data"):
        RecordStream(IOOptions(input=str(inp), output=str(out), resume=True), "test").run(ident)
    assert out.read_text() == jsonl(records[:2])  # untouched


def test_output_record_with_a_lone_surrogate_is_written_escaped(tmp_path, records):
    """A stage that puts a lone surrogate in a field (decoded process output, ...) used to end the
    run (UnicodeEncodeError / PydanticSerializationError); the line is written with its JSON escape."""
    def odd(r):
        r.extra["note"] = "half \udc80 pair"
        return r

    for name in ("out.jsonl", "out.jsonl.gz"):
        inp = tmp_path / "in.jsonl"
        inp.write_text(jsonl(records[:3]))
        out = tmp_path / name
        s = RecordStream(IOOptions(input=str(inp), output=str(out)), "test")
        s.run(odd)
        raw = gzip.decompress(out.read_bytes()) if name.endswith(".gz") else out.read_bytes()
        raw.decode("utf-8")  # valid UTF-8
        lines = [json.loads(l) for l in raw.splitlines()]
        assert [l["id"] for l in lines] == [r["id"] for r in records[:3]]
        assert lines[0]["extra"]["note"] == "half \udc80 pair" and b'"half \\udc80 pair"' in raw
        assert s.exit_code() == 0


def test_rejects_with_lone_surrogates_and_bad_bytes_are_valid_utf8(tmp_path):
    """A lone-surrogate id ended the run with UnicodeEncodeError writing the reject; now the
    rejects file is valid UTF-8 with the surrogate as its JSON escape and bad bytes as \\xNN."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b'{"id":"\\ud800x"}\n{"id":"a-1","flow":"\\udfff"}\n{"id":"b-1","flow":"\xff"}\n'
                    + json.dumps(make_record(1)).encode() + b"\n")
    rej = tmp_path / "rej.jsonl"
    s = RecordStream(IOOptions(input=str(inp), output=str(tmp_path / "out.jsonl"), rejects=str(rej)), "test")
    s.run(ident)
    raw = rej.read_bytes()
    raw.decode("utf-8")
    rejs = [json.loads(x) for x in raw.splitlines()]
    assert [r["line"] for r in rejs] == [1, 2, 3] and s.exit_code() == 1 and s.summary.written == 1
    assert [r["field"] for r in rejs[:2]] == ["id", "flow"]
    assert rejs[0]["id"] == "\ud800x" and rejs[1]["id"] == "a-1"
    assert rejs[2]["raw"] == '{"id":"b-1","flow":"\\xff"}' and "not UTF-8" in rejs[2]["error"]


@pytest.mark.parametrize("line,field", [
    ('{"id":"n-1","trajectories":[{"id":"t","messages":[],"reward":NaN}]}', "trajectories.0.reward"),
    ('{"id":"n-2","trajectories":[{"id":"t","messages":[],"steps":[{"tool_call_id":"c","name":"f","ok":true,'
     '"reward":Infinity}]}]}', "trajectories.0.steps.0.reward"),
    ('{"id":"n-3","verdicts":[{"stage":"v","kind":"rule","passed":true,"score":-Infinity}]}', "verdicts.0.score"),
    ('{"id":"n-4","task":{"ground_truth":{"final_answer":NaN}}}', "task.ground_truth.final_answer"),
    ('{"id":"n-5","extra":{"x":1e400}}', "extra.x"),
    ('{"id":"n-6","extra":{"x":' + "9" * 5000 + '}}', "extra.x"),
])
def test_nonfinite_and_huge_numbers_are_rejects_naming_the_field(tmp_path, line, field):
    """pydantic-core read NaN/Infinity/1e400 and wrote null with exit 0; a 5000-digit integer
    crashed the slow path (ValueError). Both are rejects naming the field."""
    ok = json.dumps(make_record(1))
    s, outs, rejs = run(tmp_path, line + "\n" + ok + "\n", ident)
    assert [o["id"] for o in outs] == ["rec-0000001"]
    assert [(r["line"], r["field"]) for r in rejs] == [(1, field)] and s.exit_code() == 1


def test_nan_as_text_is_fine(tmp_path):
    rec = make_record(1)
    rec["task"]["instruction"] = "NaN and Infinity and 1e400 are words here; 12345678901234567890"
    s, outs, rejs = run(tmp_path, json.dumps(rec) + "\n", ident)
    assert len(outs) == 1 and rejs == [] and s.exit_code() == 0


@pytest.mark.parametrize("depth", [300, 5000])
def test_deep_nesting_is_a_reject_not_a_recursion_error(tmp_path, depth):
    line = '{"id":"d-1","extra":{"x":' + "[" * depth + "]" * depth + "}}"
    s, outs, rejs = run(tmp_path, line + "\n" + json.dumps(make_record(1)) + "\n", ident)
    assert len(outs) == 1 and [r["line"] for r in rejs] == [1] and "nest" in rejs[0]["error"]
    assert s.exit_code() == 1


def test_gzip_in_and_out(tmp_path, records):
    inp = tmp_path / "in.jsonl.gz"
    with gzip.open(inp, "wt") as f:
        f.write(jsonl(records[:4]))
    out = tmp_path / "out.jsonl.gz"
    RecordStream(IOOptions(input=str(inp), output=str(out)), "t").run(ident)
    with gzip.open(out, "rt") as f:
        assert len(f.read().splitlines()) == 4


def test_idset_spills_to_disk_and_stays_exact():
    s = IdSet(spill_at=100)
    for i in range(1000):
        assert s.add(f"id{i}")
    assert s._db is not None and len(s._mem) == 0
    assert "id5" in s and "id999" in s and "id1000" not in s
    assert not s.add("id5")
    assert len(s) == 1000
    s.close()


def test_stage_exception_does_not_stop_batch(tmp_path, records):
    def fn(r):
        if r.id == "rec-0000003":
            raise RuntimeError("boom")
        return r
    s, outs, rejs = run(tmp_path, jsonl(records), fn)
    assert len(outs) == 19 and "RuntimeError: boom" in rejs[0]["error"]


# ---------------------------------------------------------------------------------------------
# bad input at scale: over-long lines, truncated / missing / non-gzip input, BOM


def test_over_long_line_is_rejected_truncated_with_its_length(tmp_path):
    good = [make_record(i) for i in range(3)]
    long_line = json.dumps({"id": "huge", "tags": ["x" * 50_000]})
    lines = json.dumps(good[0]) + "\n" + long_line + "\n" + json.dumps(good[1]) + "\n" + json.dumps(good[2])
    s, outs, rejs = run(tmp_path, lines, ident, max_line_bytes=10_000)
    assert [o["id"] for o in outs] == [g["id"] for g in good]  # the lines around it still flow
    assert len(rejs) == 1 and rejs[0]["line"] == 2
    assert rejs[0]["length"] == len(long_line) and rejs[0]["truncated"] is True
    assert "line too long" in rejs[0]["error"] and str(len(long_line)) in rejs[0]["error"]
    assert len(rejs[0]["raw"]) <= 2048 + 3 and long_line.startswith(rejs[0]["raw"][:-3])
    assert s.exit_code() == 1
    # a line of exactly the cap is fine
    exact = json.dumps(make_record(9))
    (tmp_path / "b").mkdir()
    _, outs, rejs = run(tmp_path / "b", exact + "\n", ident, max_line_bytes=len(exact))
    assert len(outs) == 1 and rejs == []


def test_a_300mb_line_is_rejected_in_bounded_memory(tmp_path):
    """The audit's probe: a 300 MB line took 1.27 GB RSS and went whole into --rejects."""
    import subprocess
    import sys

    inp = tmp_path / "in.jsonl"
    with open(inp, "wb") as f:
        f.write((json.dumps(make_record(1)) + "\n").encode())
        f.write(b'{"id": "huge", "tags": ["')
        chunk = b"x" * (1 << 20)
        for _ in range(300):
            f.write(chunk)
        f.write(b'"]}\n')
        f.write((json.dumps(make_record(2)) + "\n").encode())
    prog = (
        "import json, resource, sys\n"
        "from toolkit.io import IOOptions, RecordStream\n"
        f"o = IOOptions(input={str(inp)!r}, output={str(tmp_path / 'out.jsonl')!r}, "
        f"rejects={str(tmp_path / 'rej.jsonl')!r})\n"
        "s = RecordStream(o, 'test'); s.run(lambda r: r)\n"
        # VmHWM is this process's own peak (ru_maxrss can carry the forking parent's peak over exec)
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
        "peak = int(hwm[0].split()[1]) / 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
        "print(json.dumps({'rss_mb': peak, "
        "'written': s.summary.written, 'rejected': s.summary.rejected}))\n")
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env={"PYTHONPATH": str(__import__("tests.conftest", fromlist=["ROOT"]).ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["written"] == 2 and res["rejected"] == 1
    assert res["rss_mb"] < 400, res  # the default cap is 64 MiB; before: > 1 GB
    rej = json.loads((tmp_path / "rej.jsonl").read_text())
    assert rej["length"] == 300 * (1 << 20) + len(b'{"id": "huge", "tags": [""]}')
    assert (tmp_path / "rej.jsonl").stat().st_size < 10_000


def test_truncated_gzip_keeps_the_records_before_the_cut(tmp_path):
    recs = [make_record(i) for i in range(3000)]
    full = gzip.compress(jsonl(recs).encode())
    inp = tmp_path / "cut.jsonl.gz"
    inp.write_bytes(full[: len(full) // 2])
    out = tmp_path / "out.jsonl"
    o = IOOptions(input=str(inp), output=str(out), rejects=str(tmp_path / "rej.jsonl"))
    s = RecordStream(o, "test")
    s.run(ident)
    outs = [json.loads(x) for x in out.read_text().splitlines()]
    assert 100 < len(outs) < 3000
    assert [x["id"] for x in outs] == [r["id"] for r in recs[: len(outs)]]  # a clean prefix
    rej = [json.loads(x) for x in (tmp_path / "rej.jsonl").read_text().splitlines()]
    assert len(rej) == 1 and rej[0]["cut"] is True and rej[0]["line"] == len(outs) + 1
    assert "truncated or corrupt" in rej[0]["error"] and f"after line {len(outs)}" in rej[0]["error"]
    assert s.exit_code() == 1


def test_missing_or_non_gzip_input_is_a_usage_error(tmp_path):
    from tests.conftest import run_cmd
    from toolkit.io import UsageError

    with pytest.raises(UsageError, match="input file not found"):
        RecordStream(IOOptions(input=str(tmp_path / "nope.jsonl")), "test").run(ident)
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_text(jsonl([make_record(1)]))
    with pytest.raises(UsageError, match="not gzip data"):
        RecordStream(IOOptions(input=str(fake)), "test").run(ident)
    for path, msg in ((tmp_path / "nope.jsonl", "input file not found"), (fake, "not gzip data")):
        p = run_cmd(["verify", "-i", str(path)])
        assert p.returncode == 2 and msg in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and p.stdout == ""


def test_utf8_bom_on_the_first_line_is_accepted(tmp_path):
    recs = [make_record(i) for i in range(2)]
    inp = tmp_path / "bom.jsonl"
    inp.write_bytes(b"\xef\xbb\xbf" + jsonl(recs).encode())
    out = tmp_path / "out.jsonl"
    s = RecordStream(IOOptions(input=str(inp), output=str(out)), "test")
    s.run(ident)
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [r["id"] for r in recs]
    assert s.exit_code() == 0
    # only at the very start: a BOM inside a later line is still a bad line
    inp.write_bytes(jsonl(recs[:1]).encode() + b"\xef\xbb\xbf" + jsonl(recs[1:]).encode())
    s = RecordStream(IOOptions(input=str(inp), output=str(out)), "test")
    s.run(ident)
    assert s.summary.rejected == 1 and s.summary.written == 1
