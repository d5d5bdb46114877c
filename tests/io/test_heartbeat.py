"""With progress off (stderr not a TTY), a stage waiting on a slow model prints heartbeat lines:
records done, in flight, LLM requests waiting and the oldest one's age."""

import asyncio
import json
import re

from tests.conftest import jsonl, make_record, run_cmd
from toolkit.io import IOOptions, RecordStream
from toolkit.llm import LLMClient, LLMConfig
from toolkit.llm.testserver import ScriptedServer


def test_stream_heartbeat_reports_waiting_llm_requests(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(jsonl([make_record(i) for i in range(3)]))
    with ScriptedServer(["ok"], delay=1.2) as srv:
        client = LLMClient(LLMConfig(base_url=srv.base_url, model="m", timeout=10))

        async def fn(rec):
            await client.chat([{"role": "user", "content": rec.id}])
            return rec

        opts = IOOptions(input=str(src), output=str(tmp_path / "out.jsonl"), progress=False, heartbeat=0.25,
                         concurrency=3)
        s = RecordStream(opts, "slow-stage").run(fn)
    assert s.written == 3
    err = capsys.readouterr().err
    beats = [ln for ln in err.splitlines() if "heartbeat" in ln]
    assert len(beats) >= 3, err
    assert all(ln.startswith("slow-stage: heartbeat ") for ln in beats)
    waiting = [ln for ln in beats if re.search(r"in flight 3, llm requests waiting 3 \(oldest \d+s\)", ln)]
    assert waiting, beats


def test_no_heartbeat_when_zero(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(jsonl([make_record(0)]))

    async def fn(rec):
        await asyncio.sleep(0.6)
        return rec

    RecordStream(IOOptions(input=str(src), output=str(tmp_path / "o.jsonl"), progress=False, heartbeat=0), "s").run(fn)
    assert "heartbeat" not in capsys.readouterr().err


def test_cli_stage_on_a_slow_server_prints_heartbeats_to_a_pipe(tmp_path):
    rec = make_record(0)
    reply = json.dumps({"reasoning": "ok", "evidence": "e", "task_success": True, "confidence": 0.9})
    with ScriptedServer([reply], delay=1.5) as srv:
        r = run_cmd(["verify", "--strategy", "judge", "--judge-rubric", "simia", "--base-url", srv.base_url,
                     "--model", "m", "--heartbeat", "0.3"], stdin=jsonl([rec]), timeout=120)
    assert r.returncode == 0, r.stderr
    beats = [ln for ln in r.stderr.splitlines() if ": heartbeat " in ln]
    assert beats, r.stderr
    assert any("in flight 1, llm requests waiting 1 (oldest" in ln for ln in beats), beats
