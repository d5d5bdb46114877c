#!/usr/bin/env bash
# ASTRA end to end:  recipes/astra.sh tools|qa|both [N]      (just astra tools 2)
#   tools (pipeline A, SFT): tool docs → toolkit tools import → gen-plan (chain graph, walks,
#         dependency check; graphs in $OUT/graphs) → gen-task (chain tasks from the plans + N server-only
#         tasks per server record, 3 augmentations each)
#         → validate-task (S_qq/S_sr/S_tn) → rollout (real tools where the server has a backend,
#         the emulator with 20% injected failures otherwise) → verify judge (7 dimensions) → sft.jsonl
#   qa    (pipeline B, RL): knowledge records → gen-task astra-qa → validate-task (tool necessity +
#         QS, before any code) → make-verifier astra (sandboxed python envs) → rollout --agent replay
#         | verify f1 (self-check: F1 = 1) → rollout (LLM agent) | verify f1 → rl.jsonl
#   N: plans / tasks / samples per input (default 2). Prints a yield/cost table per pipeline.
# Env: OUT (out/astra), RECIPE (recipes/astra.yaml), DOCS (tool docs / tau2:<d> / sqlite:<d> / mcp:<id>;
#      default recipes/astra/*.json; mcp:<id> = a live MCP server from TOOLKIT_MCP_SERVERS, started in a
#      copy of MCP_WORKDIR per episode, its chain tasks also verified by state: docs/astra.md), KB (recipes/astra/kb.jsonl), LLM_ARGS (e.g. "--base-url URL
#      --model M"; default: the embedded CPU model), ROLLOUT_ARGS, TOOLKIT_PYTHON, QA_ENV_DIR (write the
#      generated python environments there as directories, env.path, instead of inline env.config).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-both}
n=${2:-2}
out=${OUT:-out/astra}
recipe=${RECIPE:-recipes/astra.yaml}
PY=${TOOLKIT_PYTHON:-python}
LLM=${LLM_ARGS:-}
mkdir -p "$out"

# stage NAME IN OUT CMD...: run one stage from file to file, its row in the yield table labelled NAME; a
# stage that rejects lines exits 1 and the recipe goes on (the table shows it); exit codes > 1 (usage /
# crash) stop the recipe.
stage() {
  local name=$1 in=$2 outf=$3; shift 3
  local rej="$out/rejects.$(printf %s "$name" | tr -c 'A-Za-z0-9.-' '_').jsonl"
  : > "$rej"
  set +e
  TOOLKIT_STAGE_LABEL="$name" "$@" --rejects "$rej" < "$in" > "$outf"
  local rc=$?
  set -e
  if [ "$rc" -gt 1 ]; then echo "[astra] $name failed (exit $rc)" >&2; exit "$rc"; fi
  echo "[astra] $name: $(wc -l < "$in") in → $(wc -l < "$outf") out, $(wc -l < "$rej") rejected" >&2
}

table() {
  echo "== ASTRA $1: yield / cost per stage" >&2
  "$PY" -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --json "$out/$1.yield.json" | tee "$out/$1.yield.txt" >&2
  # an emptied run exits 1 naming the stage that emptied it
  if [ -n "${2:-}" ]; then "$PY" -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --require-nonempty "$2" > /dev/null; fi
}

if [ "$which" = tools ] || [ "$which" = both ]; then
  export TOOLKIT_STAGE_LOG="$out/tools.stages.jsonl"; : > "$TOOLKIT_STAGE_LOG"
  # the operator's MCP_WORKDIR is the one host directory the records may name (docs/mcp.md)
  if [ -n "${MCP_WORKDIR:-}" ]; then
    export TOOLKIT_MCP_WORKDIR_ROOTS="${TOOLKIT_MCP_WORKDIR_ROOTS:+$TOOLKIT_MCP_WORKDIR_ROOTS:}$(cd "$MCP_WORKDIR" && pwd -P)"
  fi
  # shellcheck disable=SC2086
  toolkit tools import ${DOCS:-recipes/astra/notes.mcp.json recipes/astra/petstore.openapi.json} \
    ${MCP_WORKDIR:+--workdir "$MCP_WORKDIR"} --report "$out/import.json" > "$out/servers.jsonl"
  stage "gen-plan" "$out/servers.jsonl" "$out/plans.jsonl" \
    gen-plan --strategy astra --recipe "$recipe" -n "$n" --out-dir "$out/graphs" $LLM
  # T = T_chain ∪ T_server (§2.1.3): the chain plans give chain-conditioned tasks, the server records
  # themselves give N server-only tasks each (coverage beyond the sampled chains)
  cat "$out/plans.jsonl" "$out/servers.jsonl" > "$out/plans+servers.jsonl"
  stage "gen-task" "$out/plans+servers.jsonl" "$out/tasks.jsonl" \
    gen-task --strategy astra --recipe "$recipe" -n "$n" $LLM
  stage "validate-task" "$out/tasks.jsonl" "$out/tasks.valid.jsonl" \
    validate-task --strategy astra --recipe "$recipe" --filter passed $LLM
  stage "rollout" "$out/tasks.valid.jsonl" "$out/trajectories.jsonl" \
    rollout --recipe "$recipe" -n 1 --max-turns 6 ${ROLLOUT_ARGS:-} $LLM
  stage "verify judge" "$out/trajectories.jsonl" "$out/sft.jsonl" \
    verify --recipe "$recipe" --strategy judge --judge-rubric astra --require judge --filter passed $LLM
  case " ${DOCS:-} " in *" mcp:"*)
    # live MCP servers: chain tasks whose arguments are all literals carry reference actions; replay them
    # against a fresh server and compare states (tasks without actions are rejected here, with the reason)
    stage "verify state" "$out/trajectories.jsonl" "$out/state.jsonl" \
      verify --recipe "$recipe" --strategy state_diff --require state_diff ;;
  esac
  table tools "$out/sft.jsonl"
fi

if [ "$which" = qa ] || [ "$which" = both ]; then
  export TOOLKIT_STAGE_LOG="$out/qa.stages.jsonl"; : > "$TOOLKIT_STAGE_LOG"
  stage "gen-task" "${KB:-recipes/astra/kb.jsonl}" "$out/qa.jsonl" \
    gen-task --strategy astra-qa --recipe "$recipe" -n "$n" $LLM
  stage "validate-task" "$out/qa.jsonl" "$out/qa.valid.jsonl" \
    validate-task --strategy astra --recipe "$recipe" --filter passed $LLM
  stage "make-verifier" "$out/qa.valid.jsonl" "$out/qa.envs.jsonl" \
    make-verifier --strategy astra --recipe "$recipe" --filter passed ${QA_ENV_DIR:+--out-dir "$QA_ENV_DIR"} $LLM
  stage "rollout replay" "$out/qa.envs.jsonl" "$out/qa.replay.jsonl" rollout --agent replay
  stage "verify f1 (replay)" "$out/qa.replay.jsonl" "$out/qa.replay.f1.jsonl" \
    verify --strategy f1 --require f1
  stage "rollout" "$out/qa.envs.jsonl" "$out/qa.rollouts.jsonl" \
    rollout --recipe "$recipe" -n 2 --max-turns 8 ${ROLLOUT_ARGS:-} $LLM
  stage "verify f1" "$out/qa.rollouts.jsonl" "$out/rl.jsonl" verify --strategy f1 --require f1
  table qa "$out/rl.jsonl"
fi
