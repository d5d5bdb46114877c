"""The JSONL layer at library level (RecordStream) — CLI/subprocess behaviour is in test_cli.py."""
import asyncio
import gzip
import json

import pytest

from conftest import jsonl, make_record
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
