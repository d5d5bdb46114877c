#!/usr/bin/env bash
# Submit the sharded run and its merge: N array tasks (one node and one vLLM server each), then a
# merge job that starts when every task succeeded (afterok).
#   MODEL=/models/my-agent INPUT=tasks.jsonl OUT_DIR=out/run1 NSHARDS=8 recipes/cluster/submit.sh
# SBATCH_ARGS: extra sbatch options for both jobs (e.g. "--partition gpu --account me", or the CPU
# form "--gres=none --mem=0 --cpus-per-task=1"). Prints the merge job's id on stdout.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NSHARDS=${NSHARDS:-8}
OUT_DIR=${OUT_DIR:-out/cluster}
: "${MODEL:?}" "${INPUT:?}"
SBATCH_ARGS=${SBATCH_ARGS:-}
mkdir -p logs "$OUT_DIR"  # Slurm opens --output=logs/... before the script runs
export MODEL INPUT OUT_DIR NSHARDS HERE
# shellcheck disable=SC2086  # SBATCH_ARGS is a word list on purpose
jid=$(sbatch --parsable --export=ALL $SBATCH_ARGS --array="0-$((NSHARDS - 1))" "$HERE/slurm_array.sbatch")
sbatch --parsable $SBATCH_ARGS --dependency="afterok:$jid" --job-name=toolkit-merge --output="logs/%x-%j.out" --wrap \
  "python3 '$HERE/merge.py' --input '$INPUT' --parts '$OUT_DIR' --nshards $NSHARDS \
     --rejects-out '$OUT_DIR/rejects.jsonl' > '$OUT_DIR/merged.jsonl'"
echo "array job $jid ($NSHARDS shards) + merge submitted; output: $OUT_DIR/merged.jsonl" >&2
