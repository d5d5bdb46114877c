#!/usr/bin/env bash
# EigenData pilot loop (Phase 1 + Phase 2 of EigenData, arXiv 2601.22607) on one environment, with a yield/cost
# table per stage and iteration (toolkit.yieldtable; group "<iteration>", repair rounds "<iteration>.r<round>"):
#   recipes/eigendata.sh ENV N [MAX_ITERS]
# ENV: a bundled sqlite domain (airline, clinic) or tau2:<domain> (tau2:airline ...).
# N: scenarios per prompt set and iteration. MAX_ITERS: pilot iterations (the paper: up to 16).
# K: prompt sets (default: the recipe's gen-plan.n).
# Model: the embedded default unless TOOLKIT_BASE_URL / TOOLKIT_MODEL (or role-specific
# TOOLKIT_<ROLE>_*) point elsewhere. Outputs in $OUT (default out/eigendata-<env>):
#   plans.it<k>.in.jsonl  the plans iteration k starts from; it<k>/<stage>.jsonl (+ .rejects.jsonl,
#                         .log = the stage's stderr with its summary line: requests, tokens, cost)
#   stages.jsonl, yield.json  every stage's summary (the table's rows)
#   dataset.jsonl         records that passed verify and whose verifier passed its self-test
#   prompts/eigendata/    the prompt versions reflect evolved ($TOOLKIT_PROMPTS when set)
#   drift.jsonl           one drift-audit marker record per iteration (tags drift | no-drift)
# Drift monitoring (EigenData Phase 3): each iteration audits a deterministic sample (AUDIT_RATE,
# default 0.5) of its batch against the baseline: DRIFT_BASELINE (a pilot's metrics JSON, from
# `python -m toolkit.flows.eigendata.drift --write-baseline`) or else iteration 1's whole batch. On drift
# the loop stops: the marker record goes to $OUT/DRIFT.jsonl and the script exits 3 (DRIFT_EXIT),
# so a job script can pause generation and re-enter the pilot loop. DRIFT=0 turns the audit off.
# Phase 3 (large-scale generation with online monitoring): PHASE=3 PLANS=<pilot's final plans>
# (DRIFT_BASELINE=<pilot metrics>) recipes/eigendata.sh ENV N BATCHES: no gen-plan, no reflect (the
# optimized prompts stay frozen), every batch is audited; on drift exit 3 (re-enter Phase 2 with
# PLANS=the same file). PLANS also starts a Phase-2 run from given prompt sets.
set -uo pipefail
cd "$(dirname "$0")/.."
env_name=${1:-airline}; n=${2:-2}; iters=${3:-16}
name=$(echo "$env_name" | tr ':' '-')
out=${OUT:-out/eigendata-$name}
recipe=recipes/eigendata.yaml
export PATH="$PWD/bin:$PATH"
mkdir -p "$out"
case "$env_name" in
  tau2:*) envref="{\"backend\":\"tau2\",\"id\":\"${env_name#tau2:}\"}" ;;
  *)      envref="{\"backend\":\"sqlite\",\"id\":\"$env_name\"}" ;;
esac
echo "{\"id\":\"$name\",\"env\":$envref}" > "$out/env.jsonl"
export TOOLKIT_STAGE_LOG="$out/stages.jsonl"; : > "$TOOLKIT_STAGE_LOG"
# reflect writes the evolved prompt versions here (eigendata/<role>.v<N>.txt); every stage reads them
export TOOLKIT_PROMPTS=${TOOLKIT_PROMPTS:-$out/prompts}; mkdir -p "$TOOLKIT_PROMPTS"
common=(--recipe "$recipe" --max-tokens "${MAX_TOKENS:-1024}")
strat=(--attempts "${ATTEMPTS:-2}")
phase=${PHASE:-2}
case "$phase" in 2|3) ;; *) echo "[eigendata] PHASE must be 2 (pilot) or 3 (large-scale generation)" >&2; exit 2 ;; esac
if [ -n "${PLANS:-}" ]; then  # start from given prompt sets (Phase 3: the pilot's final plans)
  cp "$PLANS" "$out/plans.it1.in.jsonl"
elif [ "$phase" = 3 ]; then
  echo "[eigendata] PHASE=3 needs PLANS (the optimized prompt sets of a pilot run, e.g. its last plans.it<k>.in.jsonl)" >&2
  exit 2
else
  # K prompt sets: the recipe's gen-plan.n unless K is set
  TOOLKIT_STAGE_GROUP=plan gen-plan --strategy eigendata ${K:+-n "$K"} "${common[@]}" "${strat[@]}" --rejects "$out/gen-plan.rejects.jsonl" \
    < "$out/env.jsonl" > "$out/plans.it1.in.jsonl"
fi
if [ ! -s "$out/plans.it1.in.jsonl" ]; then  # no valid prompt set: start from the shipped prompts
  echo "[eigendata] gen-plan produced no prompt set; using the shipped prompts (version 1)" >&2
  echo "{\"id\":\"$name-ps0\",\"env\":$envref,\"plan\":{\"id\":\"$name-ps0\",\"prompt_set\":\"$name-ps0\",\"prompt_version\":\"1\"}}" \
    > "$out/plans.it1.in.jsonl"
fi
: > "$out/dataset.jsonl"
# jq filters: every verdict of a stage passed / some failed / has verdicts of the stage
ok()   { jq -c "select([.verdicts[] | select(.stage==\"$1\") | .passed] | all)"; }
bad()  { jq -c "select([.verdicts[] | select(.stage==\"$1\") | .passed] | all | not)"; }
pass() { jq -c "select(([.verdicts[] | select(.stage==\"$1\")] | length > 0) and ([.verdicts[] | select(.stage==\"$1\") | .passed] | all))"; }
for it in $(seq 1 "$iters"); do
  d="$out/it$it"; mkdir -p "$d"
  sd=$d; g=$it  # where s() writes rejects and logs; the stage's group in the yield table
  # s COMMAND [ARGS]: run a stage with the recipe, its rejects and stderr (summary line) next to its output
  s() { local c=$1; shift; local extra=(); case $c in rollout|verify) ;; *) extra=("${strat[@]}") ;; esac
        TOOLKIT_STAGE_GROUP=$g "$c" "${common[@]}" "${extra[@]}" --rejects "$sd/$c.rejects.jsonl" "$@" 2> >(tee "$sd/$c.log" >&2); }
  s gen-task --strategy eigendata -n "$n" < "$out/plans.it$it.in.jsonl" > "$d/gen-task.jsonl"
  s validate-task --strategy eigendata < "$d/gen-task.jsonl" > "$d/validate-task.jsonl"
  ok validate-task < "$d/validate-task.jsonl" > "$d/validated.jsonl"
  s rollout < "$d/validated.jsonl" > "$d/rollout.jsonl"
  s verify < "$d/rollout.jsonl" > "$d/verify.jsonl"
  # repair what failed (task failures from validate-task, trajectory failures from verify)
  { bad validate-task < "$d/validate-task.jsonl"; bad verify < "$d/verify.jsonl"; } > "$d/repair.in.jsonl"
  s repair --strategy eigendata < "$d/repair.in.jsonl" > "$d/repair.jsonl"
  # Validate <-> Modify: repaired records are checked again; repair itself refuses a 4th round
  cp "$d/verify.jsonl" "$d/verified.all.jsonl"
  cur="$d/repair.jsonl"
  for r in 1 2 3; do
    [ -s "$cur" ] || break
    sd="$d/repair$r"; g="$it.r$r"; mkdir -p "$sd"
    jq -c 'select(.extra.repair_mode=="TASK")' "$cur" > "$sd/validate-task.in.jsonl"
    s validate-task --strategy eigendata < "$sd/validate-task.in.jsonl" > "$sd/validate-task.jsonl"
    ok validate-task < "$sd/validate-task.jsonl" > "$sd/validated.jsonl"
    s rollout < "$sd/validated.jsonl" > "$sd/rollout.jsonl"
    { cat "$sd/rollout.jsonl"; jq -c 'select(.extra.repair_mode!="TASK")' "$cur"; } > "$sd/verify.in.jsonl"
    s verify < "$sd/verify.in.jsonl" > "$sd/verify.jsonl"
    cat "$sd/verify.jsonl" >> "$d/verified.all.jsonl"
    { bad validate-task < "$sd/validate-task.jsonl"; bad verify < "$sd/verify.jsonl"; } > "$sd/repair.in.jsonl"
    s repair --strategy eigendata < "$sd/repair.in.jsonl" > "$sd/repair.jsonl"
    cur="$sd/repair.jsonl"
  done
  sd=$d; g=$it
  pass verify < "$d/verified.all.jsonl" > "$d/make-verifier.in.jsonl"
  s make-verifier --strategy eigendata < "$d/make-verifier.in.jsonl" > "$d/make-verifier.jsonl"
  ok make-verifier < "$d/make-verifier.jsonl" >> "$out/dataset.jsonl"
  # reflect and drift see the latest version of every record of this iteration (verify's over
  # validate-task's) AND the repaired records of every round (<root>-rep<k>, extra.repair_round), so
  # the repair-rounds signal and the repair outcomes reach them
  cat "$d/validate-task.jsonl" "$d/verify.jsonl" \
      $(for r in 1 2 3; do for f in validate-task verify; do [ -f "$d/repair$r/$f.jsonl" ] && echo "$d/repair$r/$f.jsonl"; done; done) \
    | jq -s -c 'reverse | unique_by(.id) | .[] | select(.plan != null)' > "$d/reflect.in.jsonl"
  if [ "${DRIFT:-1}" != 0 ] && [ -s "$d/reflect.in.jsonl" ]; then  # sampled audit against the baseline
    audit=(python -m toolkit.flows.eigendata.drift --audit-rate "${AUDIT_RATE:-0.5}")
    if [ ! -s "$out/drift.baseline.json" ]; then
      if [ -n "${DRIFT_BASELINE:-}" ]; then cp "$DRIFT_BASELINE" "$out/drift.baseline.json"
      else python -m toolkit.flows.eigendata.drift --write-baseline "$out/drift.baseline.json" < "$d/reflect.in.jsonl"; fi
    fi
    "${audit[@]}" --baseline "$out/drift.baseline.json" < "$d/reflect.in.jsonl" > "$d/drift.jsonl"
    rc=$?
    cat "$d/drift.jsonl" >> "$out/drift.jsonl"
    if [ "$rc" = 1 ]; then
      cp "$d/drift.jsonl" "$out/DRIFT.jsonl"
      python -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --markdown --json "$out/yield.json" >&2
      echo "[eigendata] drift at iteration $it (marker: $out/DRIFT.jsonl); stopping with exit ${DRIFT_EXIT:-3}" >&2
      exit "${DRIFT_EXIT:-3}"
    elif [ "$rc" != 0 ]; then
      echo "[eigendata] drift audit failed (exit $rc); continuing without it" >&2
    fi
  fi
  next="$out/plans.it$((it + 1)).in.jsonl"
  if [ "$phase" = 3 ]; then  # the prompts stay frozen; the drift audit above is the only control
    cp "$out/plans.it$it.in.jsonl" "$next"
    python -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --markdown --json "$out/yield.json" >&2
    continue
  fi
  s reflect --strategy eigendata < "$d/reflect.in.jsonl" > "$d/reflect.jsonl"
  if [ -s "$d/reflect.jsonl" ]; then cp "$d/reflect.jsonl" "$next"; else cp "$out/plans.it$it.in.jsonl" "$next"; fi
  python -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --markdown --json "$out/yield.json" >&2
  if [ -s "$d/reflect.jsonl" ] && jq -e -s 'all(.[]; .plan.extra.pilot.stop == true)' "$d/reflect.jsonl" > /dev/null; then
    echo "[eigendata] pilot criteria met after iteration $it" >&2; break
  fi
done
echo "[eigendata] dataset: $(wc -l < "$out/dataset.jsonl") records in $out/dataset.jsonl" >&2
python -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --require-nonempty "$out/dataset.jsonl" > /dev/null || exit 1  # emptied run: exit 1 naming the stage
