#!/usr/bin/env bash
# The main job (bin/setup demo): what the toolkit makes, on 2 CPU cores, offline, in a few minutes.
#   1. gen-task --strategy logigen --explorer symbolic: tasks at depth on a bundled sqlite domain
#      (3-8 writes, violation-first and boundary tasks on every rule it can, look-ups, option menus,
#      user views in the domain's words), each with its executed target state;
#   2. validate-task: every task replayed to its target, its labels and user view checked;
#   3. toolkit stats --quality: depth, rule coverage, diversity, leak rate (and a chart);
#   4. the oracle: the tasks' reference paths replayed through rollout → verify (state DIFF reward
#      1.0) → SFT-ready rows (messages + tools), the teacher data a real model is distilled from;
#   5. a SHORT rollout of the embedded 135M model (SmolLM2) on two tasks, its tool calls decoded
#      under a grammar (every call names an offered tool with schema-shaped arguments): it makes
#      valid calls; it is not expected to solve the tasks (the agent evaluation is `just learn`);
#   6. the per-stage yield/cost table of the run.
# Each file is named on screen at the end. Env: OUT (default out/demo), DEMO_DOMAIN (airline),
# DEMO_TASKS (40), DEMO_ROLLOUTS (2 tasks for the embedded model; 0 skips it), DEMO_TURNS (2),
# DEMO_ARGS (extra rollout flags for step 5, e.g. --agent-base-url URL --agent-model M for a real model).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/demo}
PY=${TOOLKIT_PYTHON:-python}
domain=${DEMO_DOMAIN:-airline}
n=${DEMO_TASKS:-40}
k=${DEMO_ROLLOUTS:-2}
turns=${DEMO_TURNS:-2}
mkdir -p "$out"
rm -f "$out"/{tasks,validated,oracle,sft,embedded,quality,rejects}.jsonl "$out"/quality.{json,png} "$out"/yield.{txt,json}
export TOOLKIT_STAGE_LOG="$out/stages.jsonl"
: > "$TOOLKIT_STAGE_LOG"
t0=$(date +%s)
say() { echo "[demo $(( $(date +%s) - t0 ))s] $*" >&2; }

if [ -e "$domain" ]; then env="{\"backend\": \"sqlite\", \"path\": \"$(cd "$domain" && pwd)\"}"
else env="{\"backend\": \"sqlite\", \"id\": \"$domain\"}"; fi
echo "{\"id\": \"demo\", \"flow\": \"logigen\", \"env\": $env}" > "$out/domain.jsonl"

say "1/6 gen-task --strategy logigen --explorer symbolic -n $n on $domain"
gen-task --strategy logigen --explorer symbolic -n "$n" --seed 7 --rejects "$out/rejects.jsonl" \
  < "$out/domain.jsonl" > "$out/tasks.jsonl"

say "2/6 validate-task --strategy logigen --filter passed"
validate-task --strategy logigen --filter passed --rejects "$out/rejects.jsonl" \
  < "$out/tasks.jsonl" > "$out/validated.jsonl"

say "3/6 toolkit stats --quality"
chart=()
if "$PY" -c "import matplotlib" 2>/dev/null; then chart=(--chart "$out/quality.png"); fi
toolkit stats --quality "$out/validated.jsonl" "${chart[@]}" --markdown "$out/quality.md" > "$out/quality.json"

say "4/6 the oracle: reference paths replayed → verify (state DIFF) → SFT rows"
TOOLKIT_STAGE_LABEL="rollout (oracle)" rollout --agent replay --rejects "$out/rejects.jsonl" < "$out/validated.jsonl" \
  | TOOLKIT_STAGE_LABEL="verify (oracle)" verify --strategy state_diff --filter passed --rejects "$out/rejects.jsonl" \
  > "$out/oracle.jsonl"

if [ "$k" -gt 0 ]; then
  say "5/6 the embedded 135M model on $k task(s), $turns turns, tool calls under a grammar (~1 min on 2 cores)"
  set +e
  head -n "$k" "$out/validated.jsonl" \
    | TOOLKIT_STAGE_LABEL="rollout (135M)" rollout -n 1 --max-turns "$turns" --max-tokens 96 --first-message instruction \
        --constrain-tool-calls grammar --cache "$out/llm-cache.sqlite" --rejects "$out/rejects.jsonl" ${DEMO_ARGS:-} \
    | TOOLKIT_STAGE_LABEL="verify (135M)" verify --strategy state_diff --filter all --rejects "$out/rejects.jsonl" \
    > "$out/embedded.jsonl"
  codes=("${PIPESTATUS[@]}")
  set -e
  for c in "${codes[@]}"; do
    if [ "$c" -gt 1 ]; then say "the embedded rollout failed (exit codes ${codes[*]})"; exit "$c"; fi
  done
else
  : > "$out/embedded.jsonl"
fi

say "6/6 the yield table"
"$PY" -m toolkit.yieldtable "$TOOLKIT_STAGE_LOG" --json "$out/yield.json" > "$out/yield.txt"

"$PY" - "$out" <<'PY'
import json, sys
out = sys.argv[1]


def rows(name):
    try:
        return [json.loads(line) for line in open(f"{out}/{name}", encoding="utf-8") if line.strip()]
    except FileNotFoundError:
        return []


tasks, valid, oracle, emb = rows("tasks.jsonl"), rows("validated.jsonl"), rows("oracle.jsonl"), rows("embedded.jsonl")
with open(f"{out}/sft.jsonl", "w", encoding="utf-8") as f:
    n_sft = 0
    for r in oracle:
        for t in r.get("trajectories") or []:
            if t.get("reward") == 1.0:
                f.write(json.dumps({"id": t["id"], "messages": t["messages"], "tools": t.get("tools") or []},
                                   ensure_ascii=False) + "\n")
                n_sft += 1
q = json.load(open(f"{out}/quality.json"))["total"]
say = lambda s: print(s, file=sys.stderr)  # noqa: E731
say("")
say(f"tasks: {len(tasks)} synthesized, {len(valid)} validated; writes per task {q['writes'].get('mean')}, "
    f"{q['share_writes_ge3']:.0%} with >= 3 writes, {q['read_dependent_share'] or 0:.0%} with a write found by a "
    f"look-up, {q['violation_first']} violation-first ({len(q['violation_rules'])} rules), {q['boundary']} at a "
    f"rule's limit ({len(q['boundary_rules'])} rules), signature ratio {q['signature_ratio']}, "
    f"leak rate {q['leak_rate']}")
if valid:
    t = valid[min(3, len(valid) - 1)]["task"]
    say(f"one user view ({t['complexity'].get('archetype')}, {t.get('difficulty') or t['complexity'].get('level')}): "
        f"{t['user_scenario']['instructions'][:400]}")
calls = valid_calls = 0
for r in emb:
    for tr in r.get("trajectories") or []:
        for m in tr.get("messages") or []:
            if m.get("role") == "tool":
                calls += 1
                try:
                    c = json.loads(m.get("content") or "{}")
                except ValueError:
                    c = {}
                code = ((c.get("error") or {}).get("code") if isinstance(c, dict) else None)
                valid_calls += code not in ("UNKNOWN_TOOL", "INVALID_ARGUMENTS", "PARSE_ERROR")
rewards = [t.get("reward") or 0.0 for r in emb for t in r.get("trajectories") or []]
if emb:
    say(f"embedded 135M model: {len(rewards)} trajectories, {calls} tool calls, {valid_calls} valid "
        f"(an offered tool with well-formed arguments), mean reward {sum(rewards) / max(1, len(rewards)):.2f}")
say(f"oracle: {len(oracle)} tasks verified at reward 1.0 → {n_sft} SFT-ready rows")
say("")
say("files in " + out + ":")
for name, what in [
    ("tasks.jsonl", "the synthesized tasks: user view, hidden ground truth (reference actions, target state), labels"),
    ("validated.jsonl", "the tasks that passed validate-task (replay to the target, leak rule, labels, rules)"),
    ("quality.json", "toolkit stats --quality: depth, rule coverage, diversity, leak rate (quality.md: as a table)"),
    ("quality.png", "the quality chart: writes by archetype, difficulty mix, ratios"),
    ("oracle.jsonl", "the oracle's trajectories, verified by state DIFF"),
    ("sft.jsonl", "SFT-ready rows (messages + tools) of every oracle trajectory with reward 1.0: `sft` trains on it"),
    ("embedded.jsonl", "the embedded model's short trajectories with their rewards"),
    ("yield.txt", "the per-stage yield/cost table (yield.json: the same as JSON)"),
    ("rejects.jsonl", "lines a stage rejected, with the reason"),
]:
    import os
    if os.path.exists(f"{out}/{name}"):
        say(f"  {name:16} {what}")
say("")
say(open(f"{out}/yield.txt", encoding="utf-8").read().rstrip())
if n_sft == 0:
    say("[demo] the oracle replay verified no task: the synthesized tasks do not replay")
    sys.exit(1)
PY
say "done"
