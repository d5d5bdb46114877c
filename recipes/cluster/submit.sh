#!/usr/bin/env bash
# Submit the sharded run and its merge: N array tasks (one node and one vLLM server each), then a
# merge job that starts when every task succeeded (afterok).
#   MODEL=/models/my-agent INPUT=tasks.jsonl OUT_DIR=out/run1 NSHARDS=8 recipes/cluster/submit.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NSHARDS=${NSHARDS:-8}
OUT_DIR=${OUT_DIR:-out/cluster}
: "${MODEL:?}" "${INPUT:?}"
export MODEL INPUT OUT_DIR NSHARDS HERE
jid=$(sbatch --parsable --export=ALL --array="0-$((NSHARDS - 1))" "$HERE/slurm_array.sbatch")
sbatch --parsable --dependency="afterok:$jid" --job-name=toolkit-merge --output="logs/%x-%j.out" --wrap \
  "python3 '$HERE/merge.py' --input '$INPUT' --parts '$OUT_DIR' --nshards $NSHARDS \
     --rejects-out '$OUT_DIR/rejects.jsonl' > '$OUT_DIR/merged.jsonl'"
echo "array job $jid ($NSHARDS shards) + merge submitted; output: $OUT_DIR/merged.jsonl" >&2
