#!/usr/bin/env bash
# The body of one array task: rollout | verify on shard SHARD of NSHARDS of INPUT.
#
# Called by slurm_array.sbatch after its vLLM server is up, and by tests/test_cluster.py in a
# plain loop (no Slurm, `--agent replay`). Everything comes from the environment:
#   SHARD, NSHARDS   this task's partition (rollout --shard "$SHARD/$NSHARDS": a stable hash of
#                    the record id, so every node agrees without coordination)
#   INPUT            task records (JSONL, .gz ok), the same file for every shard
#   OUT_DIR          where part-<SHARD>.jsonl and rejects-<SHARD>.jsonl go
#   ROLLOUT_ARGS     e.g. "--base-url http://127.0.0.1:8000/v1 --model my-model -n 8" (default:
#                    "--agent replay", the reference actions, no LLM)
#   VERIFY_ARGS      default "--strategy state_diff"
#   TOOLKIT_BIN      directory of the toolkit commands (default: on PATH)
# The part file is written under a temporary name and renamed when the pipeline succeeded, so a
# killed task leaves no half part for merge.py to pick up; rerunning a task redoes its shard.
set -euo pipefail
: "${SHARD:?SHARD is required (0-based)}" "${NSHARDS:?NSHARDS is required}" "${INPUT:?INPUT is required}"
: "${OUT_DIR:?OUT_DIR is required}"
ROLLOUT_ARGS=${ROLLOUT_ARGS:---agent replay}
VERIFY_ARGS=${VERIFY_ARGS:---strategy state_diff}
bin=${TOOLKIT_BIN:+$TOOLKIT_BIN/}
mkdir -p "$OUT_DIR"
part="$OUT_DIR/part-$SHARD.jsonl"
rejects="$OUT_DIR/rejects-$SHARD.jsonl"
rm -f "$part.tmp" "$rejects"
# shellcheck disable=SC2086  # the *_ARGS are word lists on purpose
"${bin}rollout" --shard "$SHARD/$NSHARDS" --rejects "$rejects" $ROLLOUT_ARGS < "$INPUT" \
  | "${bin}verify" --rejects "$rejects" $VERIFY_ARGS > "$part.tmp"
mv "$part.tmp" "$part"
echo "shard $SHARD/$NSHARDS: $(wc -l < "$part") records -> $part" >&2
