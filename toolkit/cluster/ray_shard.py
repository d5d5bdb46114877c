"""Run any streaming command sharded over a Ray cluster, merged back into input order.

    toolkit ray-shard -n 8 -i tasks.jsonl -o out.jsonl -- rollout --agent replay
    toolkit ray-shard -n 8 -i tasks.jsonl --parts-dir out/parts -- bash -c 'rollout ... | verify'

    from toolkit.cluster.ray_shard import run_sharded
    res = run_sharded(["validate-task", "--strategy", "logigen"], lines, nshards=4)

The input's lines are cut into `nshards` contiguous, balanced slices; each slice is one Ray task
that runs the command as a subprocess with the slice on its stdin (so the command needs no shared
filesystem and no `--shard` support) and returns its stdout. Outputs are concatenated in slice
order. Every toolkit command keeps input order (unless `--unordered`) and handles records one at a
time, so the merged output is record for record what one process writes for the whole input
(provenance timestamps aside); a command that looks across records (deduplication in `finish()`,
e.g. gen-task's near-duplicate filter) sees one slice at a time, as with `--shard`.

Rejects: with `rejects=True` each task adds `--rejects FILE` to the command and returns that
file; the `line` numbers are shifted from slice to input line numbers. Resume: with `parts_dir`
each finished slice's output is written to `part-<i>.jsonl` (atomically, via a temporary name)
and a rerun skips the slices whose part exists. Exit codes follow the toolkit's: 0 ok, 1 when a
slice's command reported failures (rejects); a slice that exits >= 2 or dies fails the run
(`ShardError`, naming the slice and its stderr tail) and leaves no part for it.

Where the commands run: each Ray worker's environment (PATH must find the command: install the
toolkit on every node, or pass `env`). Locally (no address), a Ray cluster is started on this
machine, bound to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolkit.io import UsageError, log


class ShardError(RuntimeError):
    pass


@dataclass
class ShardResult:
    output: bytes
    rejects: bytes = b""
    exit_code: int = 0
    shard_codes: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # slices taken from parts_dir (resume)


def split(lines: Sequence[bytes], n: int) -> list[tuple[int, int]]:
    """[start, end) of n contiguous slices whose sizes differ by at most one."""
    if n < 1:
        raise UsageError("the number of shards must be >= 1")
    q, r = divmod(len(lines), n)
    out, start = [], 0
    for i in range(n):
        end = start + q + (1 if i < r else 0)
        out.append((start, end))
        start = end
    return out


def _shift_rejects(data: bytes, offset: int) -> bytes:
    out = []
    for line in data.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if isinstance(rec, dict) and isinstance(rec.get("line"), int):
            rec["line"] += offset
        out.append(json.dumps(rec, ensure_ascii=False).encode())
    return b"".join(x + b"\n" for x in out)


def run_command(command: list[str], data: bytes, env: dict[str, str] | None = None,
                rejects: bool = False) -> tuple[int, bytes, bytes, bytes]:
    """One slice: the command with `data` on stdin → (exit code, stdout, stderr tail, rejects)."""
    with tempfile.TemporaryDirectory(prefix="toolkit-shard-") as tmp:
        cmd = list(command)
        rej = os.path.join(tmp, "rejects.jsonl")
        if rejects:
            cmd += ["--rejects", rej]
        p = subprocess.run(cmd, input=data, capture_output=True, check=False,
                           env={**os.environ, **(env or {})})
        rej_data = b""
        if rejects and os.path.exists(rej):
            with open(rej, "rb") as f:
                rej_data = f.read()
        return p.returncode, p.stdout, p.stderr[-4000:], rej_data


def _write_part(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _check_manifest(parts_dir: str, command: Sequence[str], lines: Sequence[bytes], nshards: int) -> None:
    """parts_dir belongs to one run (command, input, shard count): a rerun of the same run resumes;
    anything else is a usage error instead of silently merging another run's parts."""
    import hashlib

    h = hashlib.sha256()
    for ln in lines:
        h.update(ln)
    want = {"command": list(command), "nshards": nshards, "lines": len(lines), "input_sha256": h.hexdigest()}
    os.makedirs(parts_dir, exist_ok=True)
    path = os.path.join(parts_dir, "manifest.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            have = json.load(f)
        if have != want:
            diff = sorted(k for k in want if have.get(k) != want[k])
            raise UsageError(f"--parts-dir {parts_dir} holds parts of another run ({', '.join(diff)} differ): "
                             "use a new directory or remove it")
        return
    _write_part(path, json.dumps(want).encode())


def run_sharded(command: Sequence[str], lines: Sequence[bytes], nshards: int, *, parts_dir: str | None = None,
                rejects: bool = False, env: dict[str, str] | None = None, cpus_per_shard: float = 1.0) -> ShardResult:
    """Run `command` on `nshards` slices of `lines` as Ray tasks (ray.init must have been called,
    or is called with defaults); return the merged output. `lines` are raw input lines."""
    import ray

    if not command:
        raise UsageError("ray-shard needs a command after --")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, logging_level="WARNING")
    lines = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in lines]
    bounds = split(lines, nshards)
    task = ray.remote(num_cpus=cpus_per_shard, max_retries=0)(run_command)
    parts: dict[int, tuple[bytes, bytes]] = {}
    codes: dict[int, int] = {}
    skipped = []
    if parts_dir:
        _check_manifest(parts_dir, command, lines, nshards)
    pending: dict[Any, int] = {}
    for i, (a, b) in enumerate(bounds):
        part = os.path.join(parts_dir, f"part-{i}.jsonl") if parts_dir else None
        if part and os.path.exists(part):
            with open(part, "rb") as f:
                out = f.read()
            rej_path = os.path.join(parts_dir, f"rejects-{i}.jsonl")
            rej = b""
            if os.path.exists(rej_path):
                with open(rej_path, "rb") as f:
                    rej = f.read()
            parts[i], codes[i] = (out, rej), 0
            skipped.append(i)
            continue
        ref = task.remote(list(command), b"".join(lines[a:b]), env or {}, rejects)
        pending[ref] = i
    if skipped:
        log(f"ray-shard: {len(skipped)} of {nshards} shards already done in {parts_dir}: {skipped}")
    failures = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            i = pending.pop(ref)
            try:
                rc, out, err, rej = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a task that died (worker lost ...)
                failures.append(f"shard {i}: Ray task failed: {e}")
                continue
            codes[i] = rc
            if rc not in (0, 1):
                failures.append(f"shard {i} (input lines {bounds[i][0] + 1}-{bounds[i][1]}): exit {rc}\n"
                                f"{err.decode(errors='replace')}")
                continue
            rej = _shift_rejects(rej, bounds[i][0])
            parts[i] = (out, rej)
            if parts_dir:
                if rej:
                    _write_part(os.path.join(parts_dir, f"rejects-{i}.jsonl"), rej)
                _write_part(os.path.join(parts_dir, f"part-{i}.jsonl"), out)
            n_out = out.count(b"\n")
            log(f"ray-shard: shard {i}/{nshards} done (exit {rc}, {n_out} lines)")
    if failures:
        raise ShardError("; ".join(failures) + (f" (finished shards kept in {parts_dir}: rerun to resume)"
                                                if parts_dir else ""))
    order = range(len(bounds))
    return ShardResult(output=b"".join(parts[i][0] for i in order), rejects=b"".join(parts[i][1] for i in order),
                       exit_code=max(codes.values(), default=0), shard_codes=[codes[i] for i in order],
                       skipped=skipped)


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to the cluster at `address` (or RAY_ADDRESS); without one, start a local cluster on
    127.0.0.1 (num_cpus workers at most)."""
    try:
        import ray
    except ImportError:
        raise UsageError("ray-shard needs ray: pip install 'tooluse-toolkit[cluster]'") from None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, logging_level="WARNING")
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING",
                 _node_ip_address="127.0.0.1")


def read_lines(path: str | None) -> list[bytes]:
    import gzip
    import sys

    if path in (None, "", "-"):
        data = sys.stdin.buffer.read()
    elif path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    return [ln for ln in data.splitlines(keepends=True) if ln.strip()]
