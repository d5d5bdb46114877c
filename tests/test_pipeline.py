"""toolkit.pipeline: the in-process chain of stage objects gives the records the CLI pipe writes
(`gen-task | validate-task | rollout --agent replay | verify`, each a subprocess), provenance
times aside; and the stage protocol's pieces (finish for batch stages, close, counts)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.conftest import BIN, jsonl, run_cmd

from toolkit.io import IOOptions, RecordStream, StageError
from toolkit.pipeline import GenTask, Pipeline, Verify
from toolkit.schema import Record

LIBRARY = str(Path(__file__).parent / "data" / "library")
SRC = [{"id": "lib", "env": {"backend": "sqlite", "path": LIBRARY}},
       {"id": "air", "env": {"backend": "sqlite", "id": "airline"}}]


def _strip_times(rec: dict) -> dict:
    for p in rec.get("provenance", []):
        assert p.pop("time")  # the only field that differs between two runs
    return rec


def test_cli_pipe_and_in_process_chain_give_identical_records(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text(jsonl(SRC))
    cmd = (f"{BIN}/gen-task --strategy logigen --explorer symbolic -n 4 --seed 7 < {src}"
           f" | {BIN}/validate-task --strategy logigen"
           f" | {BIN}/rollout --agent replay -n 2"
           f" | {BIN}/verify --strategy state_diff --strategy actions")
    r = run_cmd(["bash", "-c", "set -o pipefail; " + cmd], timeout=300)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: some trajectory failed verification
    piped = [_strip_times(json.loads(x)) for x in r.stdout.splitlines()]
    assert len(piped) == 8

    # the chain in one fresh process (like each command of the pipe: provenance records process state
    # such as the sandbox isolation used, which other tests in this pytest process change)
    r2 = run_cmd(["python", "-c", CHAIN, str(src)], timeout=300)
    assert r2.returncode == 0, r2.stderr[-3000:]
    mine = [_strip_times(json.loads(x)) for x in r2.stdout.splitlines()]
    assert [m["id"] for m in mine] == [p["id"] for p in piped]
    assert mine == piped
    reports = json.loads(r2.stderr.strip().splitlines()[-1])
    assert [rep["name"] for rep in reports] == ["gen-task", "validate-task", "rollout", "verify"]
    assert reports[0]["read"] == 2 and reports[0]["written"] == 8
    assert reports[3]["counts"]["trajectories"] == 16


CHAIN = """
import dataclasses, json, sys
from toolkit.options import RolloutOptions, VerifyOptions
from toolkit.pipeline import GenTask, Pipeline, Rollout, ValidateTask, Verify
from toolkit.schema import Record

records = [Record.model_validate_json(x) for x in open(sys.argv[1])]
pipe = Pipeline([GenTask(strategy="logigen", explorer="symbolic", n=4, seed=7),
                 ValidateTask(strategy="logigen"),
                 Rollout(RolloutOptions(agent_kind="replay", n=2)),
                 Verify(VerifyOptions(strategy=["state_diff", "actions"]))])
for r in pipe.run(records):
    print(r.model_dump_json(by_alias=True))
print(json.dumps([dataclasses.asdict(x) for x in pipe.reports]), file=sys.stderr)
"""


class _Batch:
    """A hand-written Stage: drops odd ids, rejects 'bad', emits one summary record at finish."""

    command = "batch"

    def __init__(self):
        self.seen: list[str] = []
        self.closed = 0

    def process(self, record: Record):
        if record.id == "bad":
            raise StageError("bad record", field="id")
        self.seen.append(record.id)
        return None if int(record.id[1:]) % 2 else record

    async def finish(self):
        return [Record(id="summary", extra={"seen": list(self.seen)})]

    def close(self):
        self.closed += 1

    @property
    def counts(self):
        return {"seen": len(self.seen)}


def test_stage_protocol_runs_in_record_stream_and_pipeline(tmp_path):
    recs = [Record(id=f"r{i}") for i in range(5)] + [Record(id="bad")]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(r.model_dump_json() + "\n" for r in recs))
    outp = tmp_path / "out.jsonl"
    st = _Batch()
    stream = RecordStream(IOOptions(input=str(inp), output=str(outp)), "batch")
    s = stream.run_stage(st)
    written = [json.loads(x)["id"] for x in outp.read_text().splitlines()]
    assert written == ["r0", "r2", "r4", "summary"]
    assert (s.read, s.rejected, s.dropped, st.closed, s.counts) == (6, 1, 2, 1, {"seen": 5})
    assert stream.exit_code() == 1

    st2 = _Batch()
    p = Pipeline([st2])
    out = p.run(recs)
    assert [r.id for r in out] == ["r0", "r2", "r4", "summary"] and out[-1].extra["seen"] == [f"r{i}" for i in range(5)]
    assert (p.reports[0].rejected, p.reports[0].dropped, st2.closed) == (1, 2, 1)


def test_stage_objects_take_typed_options_or_keywords():
    v = Verify(strategy="state_diff,actions", lambda_err=0.3)
    assert v.opts.strategy == ["state_diff", "actions"] and v.opts.lambda_err == 0.3
    v2 = Verify(v.opts, filter="passed")
    assert v2.opts.filter == "passed" and v2.opts.lambda_err == 0.3
    g = GenTask(strategy="logigen")
    assert g.opts.max_tries == 8 and g.opts.violation_share == 0.3  # the strategy's own defaults
    assert asyncio.run(_closed(g)) is None


async def _closed(stage):
    r = stage.close()
    if asyncio.iscoroutine(r):
        await r
    return None
