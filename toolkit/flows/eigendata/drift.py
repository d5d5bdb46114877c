"""Drift monitoring for large runs (EigenData Phase 3): audit a deterministic sample of a batch,
compare its metrics with the pilot baseline, and on drift print a marker record and exit 1 so a
job script can pause generation and re-enter the pilot loop.

    python -m toolkit.flows.eigendata.drift --baseline BASE.json [--audit-rate 0.1] < batch.jsonl
    python -m toolkit.flows.eigendata.drift --write-baseline BASE.json < pilot_batch.jsonl

stdout: one record (toolkit.record/v1) `drift-<sha>` tagged drift|no-drift with extra.metrics,
extra.baseline, extra.drift (signals, new categories, thresholds). Exit 0 no drift, 1 drift,
2 usage. Thresholds: metrics.DRIFT_DEFAULTS (toolkit defaults; the paper gives none), override
with --threshold key=value.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from toolkit.flows.eigendata import metrics as M
from toolkit.schema import Record


def _records(stream):
    out = []
    for i, line in enumerate(stream, 1):
        if line.strip():
            try:
                out.append(Record.model_validate_json(line))
            except Exception as e:
                print(f"drift: line {i}: {str(e).splitlines()[0]}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolkit.flows.eigendata.drift", description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline")
    ap.add_argument("--write-baseline")
    ap.add_argument("--audit-rate", type=float, default=1.0)
    ap.add_argument("--threshold", action="append", default=[], metavar="KEY=VALUE")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    recs = _records(sys.stdin)
    audited = M.sample(recs, a.audit_rate)
    m = M.batch_metrics(audited)
    if a.write_baseline:
        with open(a.write_baseline, "w", encoding="utf-8") as f:
            json.dump(m, f, indent=1)
        print(f"drift: baseline of {len(audited)} records written to {a.write_baseline}", file=sys.stderr)
        return 0
    if not a.baseline:
        print("drift: --baseline or --write-baseline is required", file=sys.stderr)
        return 2
    try:
        th = {k: float(v) for k, v in (t.split("=", 1) for t in a.threshold)}
        with open(a.baseline, encoding="utf-8") as f:
            base = json.load(f)
    except (ValueError, OSError) as e:
        print(f"drift: {e}", file=sys.stderr)
        return 2
    d = M.drift(m, base, th)
    rid = "drift-" + hashlib.sha256(",".join(r.id for r in audited).encode()).hexdigest()[:12]
    marker = {"id": rid, "flow": "eigendata", "tags": ["drift" if d["drift"] else "no-drift"],
              "extra": {"metrics": m, "baseline": base, "drift": d, "audited": len(audited), "batch": len(recs)}}
    print(json.dumps(marker))
    if d["drift"]:
        print("drift: " + "; ".join(d["signals"]) + " -> pause large-scale generation and re-run the pilot loop",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
