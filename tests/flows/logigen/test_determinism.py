"""Symbolic LOGIGEN output is a function of (domain, seed, options): the speed caches (scratch
environment pool, checkpoint canonical forms, boundary-verification memo, owner/ref memos) must not
change it, warm or cold, in-process or in a fresh process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CARRENTAL = str(ROOT / "tests" / "data" / "carrental")

_SNIPPET = """
import sys
from tests.flows.logigen.test_determinism import generate_digest
print(generate_digest(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def generate_digest(domain: str, n: int, seed: int) -> str:
    from toolkit.schema import Record
    from toolkit.stages import strategies

    env = {"backend": "sqlite", "path": domain}
    fn = strategies.build("gen-task", {"strategy": "logigen", "explorer": "symbolic", "n": n, "seed": seed}, None)
    out = asyncio.run(fn(Record.model_validate({"id": "det", "env": env})))
    assert len(out) == n
    lines = []
    for r in out:
        x = json.loads(r.model_dump_json())
        for p in x.get("provenance") or []:
            p.pop("time", None)  # differs by construction
            # process-wide: set once any sandboxed code ran in this process (an earlier test in the
            # same pytest process), never in the fresh subprocess below; not part of the tasks
            p.pop("sandbox_isolation", None)
        lines.append(json.dumps(x, sort_keys=True))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_same_seed_same_tasks_cold_warm_and_in_a_fresh_process():
    first = generate_digest(CARRENTAL, 10, 7)
    warm = generate_digest(CARRENTAL, 10, 7)  # the per-thread scratch environment and caches are warm now
    assert warm == first
    p = subprocess.run([sys.executable, "-c", _SNIPPET, CARRENTAL, "10", "7"], capture_output=True, text=True,
                       cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600, check=True)
    assert p.stdout.strip().splitlines()[-1] == first
    assert generate_digest(CARRENTAL, 10, 8) != first  # the digest does see the seed
