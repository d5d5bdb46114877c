#!/usr/bin/env python3
"""Merge the part-<i>.jsonl files of a sharded run into the order of the unsharded run.

    python recipes/cluster/merge.py --input tasks.jsonl --parts out/ --nshards 8 > merged.jsonl

`rollout --shard i/n` keeps a hash partition of the ids, so the parts interleave the input. Output
records are put back in the input's order: by the position of their `id` in the input (or of their
`parent_id`, for commands that derive new records), then by their order inside their part. Every
part 0..n-1 must exist (a missing part means a failed array task: exit 1 and name it); rejects
files are concatenated into --rejects-out when given. Standard library only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys


def _open(path: str):
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", required=True, help="the input every shard read")
    ap.add_argument("--parts", required=True, help="directory with part-<i>.jsonl")
    ap.add_argument("--nshards", type=int, required=True)
    ap.add_argument("--rejects-out", help="concatenate rejects-<i>.jsonl here")
    args = ap.parse_args()
    order: dict[str, int] = {}
    with _open(args.input) as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rid = json.loads(line).get("id")
            except (json.JSONDecodeError, AttributeError):
                continue  # the shard that read it rejected it
            if isinstance(rid, str):
                order.setdefault(rid, n)
    missing = [i for i in range(args.nshards) if not os.path.exists(os.path.join(args.parts, f"part-{i}.jsonl"))]
    if missing:
        print(f"merge: missing part(s) {missing} in {args.parts}: rerun those array tasks", file=sys.stderr)
        return 1
    rows: list[tuple[int, int, int, str]] = []
    for i in range(args.nshards):
        with open(os.path.join(args.parts, f"part-{i}.jsonl"), encoding="utf-8") as f:
            for k, line in enumerate(f):
                if not line.strip():
                    continue
                rec = json.loads(line)
                pos = order.get(rec.get("id"), order.get(rec.get("parent_id"), len(order)))
                rows.append((pos, i, k, line if line.endswith("\n") else line + "\n"))
    rows.sort()
    out = sys.stdout
    for *_, line in rows:
        out.write(line)
    if args.rejects_out:
        with open(args.rejects_out, "w", encoding="utf-8") as w:
            for i in range(args.nshards):
                p = os.path.join(args.parts, f"rejects-{i}.jsonl")
                if os.path.exists(p):
                    with open(p, encoding="utf-8") as f:
                        w.write(f.read())
    print(f"merge: {len(rows)} records from {args.nshards} parts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
