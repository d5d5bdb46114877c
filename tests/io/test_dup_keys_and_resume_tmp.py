"""Two reader fixes of issue 30: a JSON line naming a key twice is a reject naming the key (it was
silently last-wins), and the temp file of a resume killed while it rewrote a torn .gz is removed
by the next resume (it was left behind)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT, jsonl, make_record, run_cmd

from toolkit.io import read_json_lines
from toolkit.io.resume import _trim_torn_tail, remove_stale_tmp


def test_a_key_named_twice_is_rejected_naming_the_key(tmp_path):
    good = make_record(1, with_traj=False)
    nested = make_record(2, with_traj=False)
    line_nested = json.dumps(nested).replace('"cabin": "economy"}', '"cabin": "economy", "cabin": "business"}', 1)
    assert line_nested.count('"cabin"') == 2
    deep = make_record(3, with_traj=False)
    line_deep = json.dumps(deep).replace('"persona":', '"persona": "x", "persona":', 1)
    lines = [json.dumps(good), '{"id":"a","id":"b"}', line_nested, line_deep,
             '{"id":"q","flow":"logigen","flow":"logigen"}']  # even with equal values
    rej = tmp_path / "rej.jsonl"
    p = run_cmd(["rollout", "--agent", "replay", "--rejects", str(rej)], stdin="\n".join(lines) + "\n")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert [json.loads(x)["id"] for x in p.stdout.splitlines()] == ["rec-0000001"]
    rows = {r["line"]: r for r in map(json.loads, rej.read_text().splitlines())}
    assert sorted(rows) == [2, 3, 4, 5]
    assert rows[2]["field"] == "id" and rows[2]["id"] is None and "duplicate key 'id'" in rows[2]["error"]
    assert rows[3]["field"] == "task.ground_truth.actions.0.arguments.cabin" and rows[3]["id"] == "rec-0000002"
    assert rows[4]["field"] == "task.user_scenario.persona"
    assert rows[5]["field"] == "flow"
    assert "rejected line 2: field id: duplicate key 'id'" in p.stderr
    # the reader of non-record JSON lines (rejects files) says the same
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n{"a": 1, "b": {"c": 1, "c": 2}}\n')
    assert [(n, err) for n, _, err in read_json_lines(str(f))][1][1].startswith("field b.c: duplicate key 'c'")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_stale_resume_tmp_of_a_dead_pid_is_removed_and_a_live_ones_kept(tmp_path):
    out = tmp_path / "out.jsonl.gz"
    recs = [make_record(i) for i in range(6)]
    full = gzip.compress(jsonl(recs[:4]).encode(), mtime=0)
    out.write_bytes(full[:-40])  # torn: the resume rewrites it
    dead = tmp_path / f"out.jsonl.gz.resume-{_dead_pid()}.tmp"
    live = tmp_path / f"out.jsonl.gz.resume-{os.getpid()}.tmp"  # a resume running now (this process)
    other = tmp_path / "other.jsonl.gz.resume-1.tmp"  # another output's: not ours to touch
    for f in (dead, live, other):
        f.write_bytes(b"partial")
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl(recs))
    p = run_cmd(["rollout", "--agent", "replay", "--resume", "-i", str(inp), "-o", str(out)])
    assert p.returncode == 0, p.stderr
    assert not dead.exists() and live.exists() and other.exists()
    assert f"removed 1 temp file(s) of an earlier resume that was killed while rewriting {out}" in p.stderr
    ids = [json.loads(x)["id"] for x in gzip.decompress(out.read_bytes()).decode().splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in recs) and len(set(ids)) == len(ids)
    # the normal path leaves none of its own
    assert sorted(x.name for x in tmp_path.iterdir() if ".resume-" in x.name) == sorted([live.name, other.name])


def test_a_resume_killed_during_the_gz_rewrite_leaves_a_tmp_the_next_resume_removes(tmp_path):
    out = tmp_path / "out.jsonl.gz"
    recs = [make_record(i, pad=20_000) for i in range(3000)]  # ~60 MB decompressed: a rewrite takes a while
    out.write_bytes(gzip.compress(jsonl(recs).encode(), compresslevel=1, mtime=0)[:-100])
    code = f"from toolkit.io.resume import _trim_torn_tail; _trim_torn_tail({str(out)!r})"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = None
    for _attempt in range(3):  # the window is the rewrite: catch it (a loaded machine may need a retry)
        child = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
        tmp = tmp_path / f"out.jsonl.gz.resume-{child.pid}.tmp"
        t0 = time.monotonic()
        while child.poll() is None and not tmp.exists() and time.monotonic() - t0 < 60:
            time.sleep(0.002)
        if child.poll() is None and tmp.exists():
            child.send_signal(signal.SIGKILL)
            child.wait()
            killed = tmp
            break
        child.wait()
        out.write_bytes(gzip.compress(jsonl(recs).encode(), compresslevel=1, mtime=0)[:-100])
    assert killed is not None and killed.exists(), "never caught the rewrite in flight"
    before = out.read_bytes()
    assert remove_stale_tmp(str(out)) == [str(killed)]
    assert not killed.exists() and out.read_bytes() == before  # the output itself untouched by the kill
    _trim_torn_tail(str(out))  # the rewrite, uninterrupted this time: whole lines, no temp file left
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    assert 0 < len(lines) < len(recs) and [json.loads(x)["id"] for x in lines] == [r["id"] for r in recs[:len(lines)]]
    assert not [x for x in tmp_path.iterdir() if ".resume-" in x.name]
