#!/usr/bin/env bash
# LOGIGEN synthesis end to end:  recipes/logigen_synth.sh BRIEF [N]   (just logigen-synth BRIEF N)
#   BRIEF: a JSONL of domain briefs (→ gen-plan --strategy logigen, the Architect), or an existing
#          domain: a bundled id (airline, clinic) or a domain directory / JSON / YAML file.
#   N:     tasks per domain (default 10).
# Stages: [gen-plan] | gen-task | validate-task --filter passed | rollout | verify --filter passed
# → $OUT/verified.jsonl (records), $OUT/sft.jsonl (SFT-ready rows: messages + tools of every
# trajectory with reward 1), $OUT/stages.jsonl (stage summaries) and the yield/cost table
# ($OUT/yield.txt, $OUT/yield.json; printed on stderr).
# Env: OUT (default out/logigen-synth), RECIPE (default recipes/logigen.yaml), TOOLKIT_PYTHON (python), ROLLOUT_ARGS (extra
# rollout flags, e.g. "-n 1 --max-turns 4"), GEN_ARGS (extra gen-task flags, e.g. "--explorer llm"),
# VERIFY_FILTER (passed | all; default passed).
set -euo pipefail
cd "$(dirname "$0")/.."
brief=${1:?usage: logigen_synth.sh BRIEF [N]}
n=${2:-10}
out=${OUT:-out/logigen-synth}
recipe=${RECIPE:-recipes/logigen.yaml}
PY=${TOOLKIT_PYTHON:-python}
mkdir -p "$out"
: > "$out/stages.jsonl"
: > "$out/rejects.jsonl"
export TOOLKIT_STAGE_LOG="$out/stages.jsonl"

if [[ "$brief" == *.jsonl && -f "$brief" ]]; then
  if ! "$PY" -c "import sys; from toolkit.stages.registry import names; sys.exit('logigen' not in names('gen-plan'))"; then
    echo "[logigen-synth] gen-plan --strategy logigen (the Architect) is not available in this build;" \
         "pass an existing domain (bundled id or path) instead of a brief file" >&2
    exit 2
  fi
  gen-plan --strategy logigen --recipe "$recipe" --out-dir "$out/domains" --rejects "$out/rejects.jsonl" \
    < "$brief" > "$out/domains.jsonl"
else
  "$PY" - "$brief" > "$out/domains.jsonl" <<'PY'
import json, os, sys
b = sys.argv[1]
if os.path.exists(b):
    env = {"backend": "sqlite", "path": os.path.abspath(b)}
    name = os.path.splitext(os.path.basename(os.path.normpath(b)))[0]
else:
    env = {"backend": "sqlite", "id": b}
    name = b
rid = "".join(c if c.isalnum() or c in "._-" else "-" for c in name) or "domain"
print(json.dumps({"id": rid, "flow": "logigen", "env": env}))
PY
fi
echo "[logigen-synth] $(wc -l < "$out/domains.jsonl") domain(s) → $n tasks each" >&2

# a stage that rejects lines exits 1; the pipeline keeps going and the table reports the reasons
set +e
gen-task --recipe "$recipe" -n "$n" --rejects "$out/rejects.jsonl" ${GEN_ARGS:-} < "$out/domains.jsonl" \
  | validate-task --recipe "$recipe" --rejects "$out/rejects.jsonl" \
  | tee "$out/tasks.jsonl" \
  | rollout --recipe "$recipe" --rejects "$out/rejects.jsonl" ${ROLLOUT_ARGS:-} \
  | verify --recipe "$recipe" --filter "${VERIFY_FILTER:-passed}" --rejects "$out/rejects.jsonl" > "$out/verified.jsonl"
codes=("${PIPESTATUS[@]}")
set -e
for c in "${codes[@]}"; do
  if [ "$c" -gt 1 ]; then echo "[logigen-synth] a stage failed (exit codes ${codes[*]})" >&2; exit "$c"; fi
done

"$PY" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
n = 0
with open(f"{out}/sft.jsonl", "w", encoding="utf-8") as f:
    for line in open(f"{out}/verified.jsonl", encoding="utf-8"):
        r = json.loads(line)
        for t in r.get("trajectories") or []:
            if t.get("reward") == 1.0:
                f.write(json.dumps({"id": t["id"], "messages": t["messages"], "tools": t.get("tools") or []},
                                   ensure_ascii=False) + "\n")
                n += 1
print(f"[logigen-synth] {n} SFT-ready rows in {out}/sft.jsonl", file=sys.stderr)
PY
"$PY" -m toolkit.yieldtable "$out/stages.jsonl" --json "$out/yield.json" > "$out/yield.txt"
cat "$out/yield.txt" >&2
"$PY" -m toolkit.yieldtable "$out/stages.jsonl" --require-nonempty "$out/sft.jsonl" > /dev/null  # emptied: exit 1, naming the stage
