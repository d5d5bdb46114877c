#!/usr/bin/env bash
# The closed loop on a real model, offline (issue 20):
#   recipes/learn.sh [--scale smoke|cpu|gpu] [--domain DIR|NAME] [--eval-domain DIR|NAME] [--out DIR]
#   (just learn [ARGS])
# 1. synthesize LOGIGEN tasks symbolically on the domain (gen-task --explorer symbolic | validate-task)
# 2. split by target into train / held-out (disjoint targets and entities: toolkit.train.learn split)
# 3. oracle replay of train → verify state_diff --filter passed → verified trajectories
# 4. sft on SmolLM2-135M-Instruct (toolkit models materialize smollm2-135m-instruct) → ckpt/sft
# 5. grpo --variant ta-grpo from the SFT checkpoint → ckpt/grpo
# 6. evaluate base / SFT / GRPO: toolkit serve --model CKPT (CPU: GGUF export on llama.cpp; GPU: vLLM) →
#    rollout on the held-out tasks (and on --eval-domain's tasks) → verify --strategy state_diff
#    (no-write tasks need the DB + ACTION + COMMUNICATE basis)
# Out ($OUT, default out/learn): table.md, summary.json, details.json, curves.png, yield.txt, timings.json,
# and every intermediate JSONL. The user simulator of every evaluation (and of GRPO) is the packaged
# SmolLM2 GGUF on the embedded llama.cpp server, its own server (TOOLKIT_EMBEDDED_SLOTS=role), so the
# three rows differ only by the agent; each agent checkpoint is served by `toolkit serve --model`
# (CPU: exported to GGUF, llama.cpp's server, its KV cache kept between turns; GPU: vLLM).
# Env: TOOLKIT_PYTHON (python), LEARN_N (tasks to synthesize), LEARN_SFT_STEPS, LEARN_GRPO_STEPS, LEARN_SKIP_GRPO=1,
#      LEARN_CONSTRAINED=0 (no constrained-decoding rows), LEARN_CONSTRAINED_N (held-out tasks they use),
#      LEARN_BF16=false (fp32 SFT on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=smoke; domain=airline; eval_domain=""; out=${OUT:-out/learn}
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) scale=$2; shift 2 ;;
    --domain) domain=$2; shift 2 ;;
    --eval-domain) eval_domain=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "learn.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=${TOOLKIT_PYTHON:-python}
case "$scale" in
  # n: tasks synthesized; held: held-out cap; k: rollouts per held-out task; turns/tokens: per episode / reply;
  # lr: SFT learning rate; G: GRPO group size; sys: the agent's system prompt (the domain policy) kept or
  # dropped, at training and at evaluation alike
  smoke) n=60;  held=3;  k=1; turns=3; toks=112; sft_steps=6;   grpo_steps=1;  G=2; max_len=3072; lr=2.0e-4; sys=drop; cn=2 ;;
  cpu)   n=200; held=20; k=1; turns=3; toks=112; sft_steps=130; grpo_steps=2;  G=2; max_len=3072; lr=2.0e-4; sys=drop; cn=8 ;;
  gpu)   n=400; held=60; k=4; turns=8; toks=256; sft_steps=600; grpo_steps=40; G=8; max_len=4096; lr=5.0e-5; sys=keep; cn=60 ;;
  *) echo "learn.sh: --scale smoke|cpu|gpu" >&2; exit 2 ;;
esac
n=${LEARN_N:-$n}; sft_steps=${LEARN_SFT_STEPS:-$sft_steps}; grpo_steps=${LEARN_GRPO_STEPS:-$grpo_steps}
mkdir -p "$out"
: > "$out/stages.jsonl"; : > "$out/rejects.jsonl"
export TOOLKIT_STAGE_LOG="$out/stages.jsonl"
export TOOLKIT_EMBEDDED_SLOTS=${TOOLKIT_EMBEDDED_SLOTS:-role}
T0=$(date +%s)
declare -A secs
stamp() { secs[$1]=$(( $(date +%s) - T0 )); echo "[learn] $(date -u +%H:%M:%S) $1 done (+${secs[$1]}s)" >&2; }

env_record() {  # a domain name or directory → one gen-task input record
  "$PY" - "$1" <<'PY'
import json, os, sys
b = sys.argv[1]
env = {"backend": "sqlite", "path": os.path.abspath(b)} if os.path.exists(b) else {"backend": "sqlite", "id": b}
name = os.path.basename(os.path.normpath(b))
print(json.dumps({"id": "".join(c if c.isalnum() or c in "._-" else "-" for c in name), "flow": "logigen", "env": env}))
PY
}

# the recipe every stage reads. What the CPU scales cut (docs/learn.md): tasks with one write each
# (max_writes 1, no violation-first or boundary tasks: a 135M model gets 0 on the deep ones), the
# minimal tool rendering (airline: 11 tools in ~0.95k tokens instead of 2.3k compact / 11k full),
# bf16 autocast on CPU, greedy decoding, short replies, 3 agent turns (an oracle episode: 2 reads,
# the write, a closing line), Hermes tool calls in text. sys=drop leaves the policy (1.2k tokens)
# out of the agent's prompt at training and evaluation alike (rows ~1.8k instead of ~2.9k tokens,
# so the CPU budget covers ~1 epoch of SFT: 130 steps on 133 trajectories; docs/learn.md run 3:
# SFT 15/20 held-out vs base 0/20). The same rendering at training and at evaluation
# (tests/train/test_render_parity.py).
recipe="$out/learn.yaml"
bf16=$([ "$scale" = gpu ] && echo true || echo "${LEARN_BF16:-true}")
cat > "$recipe" <<YAML
defaults:
  temperature: 0.0
  concurrency: 1
gen-task:
  strategy: logigen
  explorer: symbolic
  user_view: template
  max_writes: 1
  violation_share: 0.0
  rule_coverage: false
  boundary_share: 0.0
validate-task:
  strategy: logigen
  filter: passed
rollout:
  max_turns: $turns
  max_tool_errors: 3
  first_message: instruction
  agent_system_prompt: $sys
  agent_tool_protocol: hermes
  agent_compact_tools: minimal
  agent_max_tokens: $toks
  user_tool_protocol: hermes
  user_max_tokens: 48
  # one server answers one request at a time and never cancels one: a client retry after a
  # timeout would queue a second copy behind the first, so wait long and retry once
  agent_timeout: 1800
  agent_max_retries: 1
  user_timeout: 1800
  user_max_retries: 1
verify:
  strategy: [state_diff]
sft:
  filter: passed
  chat_template: toolkit
  tool_schema: minimal
  system_prompt: $sys
  max_steps: $sft_steps
  learning_rate: $lr
  lr_scheduler_type: cosine
  warmup_steps: 5
  per_device_train_batch_size: 1
  max_length: $max_len
  bf16: $bf16
  model_dtype: float32
  save_strategy: "no"
  logging_steps: 1
grpo:
  variant: ta-grpo
  chat_template: toolkit
  tool_schema: minimal
  system_prompt: $sys
  max_steps: $grpo_steps
  num_generations: $G
  tasks_per_step: 1
  max_turns: $(( turns < 4 ? turns : 4 ))
  max_new_tokens: $toks
  max_total_tokens: $(( max_len + 1536 ))
  learning_rate: 1.0e-6
  temperature: 1.0
  user_tool_protocol: hermes
  user_max_tokens: 48
  user_timeout: 1800
  user_max_retries: 1
YAML

# 1-2 synthesize and split
env_record "$domain" > "$out/domain.jsonl"
set +e
gen-task --recipe "$recipe" -n "$n" --seed 7 --rejects "$out/rejects.jsonl" < "$out/domain.jsonl" \
  | validate-task --recipe "$recipe" --rejects "$out/rejects.jsonl" > "$out/tasks.jsonl"
set -e
"$PY" -m toolkit.train.learn split --heldout 0.3 --seed 7 --max-heldout "$held" \
  --train "$out/train_tasks.jsonl" --heldout-out "$out/heldout_tasks.jsonl" < "$out/tasks.jsonl" > "$out/split.json"
stamp synthesize

# 3 oracle replay → verified teacher trajectories
set +e
rollout --recipe "$recipe" --agent replay --max-turns 64 --rejects "$out/rejects.jsonl" < "$out/train_tasks.jsonl" \
  | verify --recipe "$recipe" --filter passed --rejects "$out/rejects.jsonl" > "$out/train_verified.jsonl"
set -e
echo "[learn] $(wc -l < "$out/train_verified.jsonl") verified train trajectories" >&2
stamp oracle

# 4 base checkpoint and its server
base=$(toolkit models materialize smollm2-135m-instruct | tail -1)
base_url=$(toolkit serve --model "$base" | tail -1)
stamp materialize

evaluate() {  # MODEL_NAME CKPT TASKS OUTFILE [ROLLOUT FLAGS...]
  local url name=$1 ckpt=$2 tasks=$3 outfile=$4
  shift 4
  if [ "$ckpt" = "$base" ]; then url=$base_url; else url=$(toolkit serve --model "$ckpt" | tail -1); fi
  set +e
  rollout --recipe "$recipe" -n "$k" --seed 11 --agent-base-url "$url" --agent-model "$ckpt" "$@" \
      --rejects "$out/rejects.jsonl" < "$tasks" \
    | verify --recipe "$recipe" --rejects "$out/rejects.jsonl" > "$outfile"
  set -e
  if [ "$ckpt" != "$base" ] && [ "${KEEP_SERVED:-0}" != 1 ]; then toolkit serve --model "$ckpt" --stop; fi
}

# constrained decoding of the agent's tool calls (a GBNF grammar: a reply is plain text or calls
# naming offered tools with schema-shaped arguments), as extra rows NAME+grammar on the first
# LEARN_CONSTRAINED_N held-out tasks (grammar sampling is slow on CPU); LEARN_CONSTRAINED=0 skips them
constrained=${LEARN_CONSTRAINED:-1}
head -n "${LEARN_CONSTRAINED_N:-$cn}" "$out/heldout_tasks.jsonl" > "$out/heldout_constrained.jsonl"

evaluate base "$base" "$out/heldout_tasks.jsonl" "$out/eval_base.jsonl"
stamp eval_base
if [ "$constrained" = 1 ]; then
  evaluate base "$base" "$out/heldout_constrained.jsonl" "$out/eval_base_grammar.jsonl" --constrain-tool-calls grammar
  stamp eval_base_grammar
fi

# 5 SFT
sft --recipe "$recipe" --model "$base" --output-dir "$out/ckpt/sft" < "$out/train_verified.jsonl" > /dev/null
stamp sft
evaluate sft "$(cd "$out/ckpt/sft" && pwd)" "$out/heldout_tasks.jsonl" "$out/eval_sft.jsonl"
stamp eval_sft
if [ "$constrained" = 1 ]; then
  evaluate sft "$(cd "$out/ckpt/sft" && pwd)" "$out/heldout_constrained.jsonl" "$out/eval_sft_grammar.jsonl" \
    --constrain-tool-calls grammar
  stamp eval_sft_grammar
fi

# 6 GRPO from the SFT checkpoint (rewards: verify state_diff, the same no-write basis)
evals=(base="$out/eval_base.jsonl" sft="$out/eval_sft.jsonl")
[ "$constrained" = 1 ] && evals+=("base+grammar=$out/eval_base_grammar.jsonl" "sft+grammar=$out/eval_sft_grammar.jsonl")
curves=(sft="$out/ckpt/sft")
if [ "${LEARN_SKIP_GRPO:-0}" != 1 ]; then
  set +e
  grpo --recipe "$recipe" --model "$(cd "$out/ckpt/sft" && pwd)" --output-dir "$out/ckpt/grpo" \
    < "$out/train_tasks.jsonl"
  rc=$?
  set -e
  stamp grpo
  if [ $rc -eq 0 ] && [ -f "$out/ckpt/grpo/config.json" ]; then
    evaluate grpo "$(cd "$out/ckpt/grpo" && pwd)" "$out/heldout_tasks.jsonl" "$out/eval_grpo.jsonl"
    stamp eval_grpo
    evals+=(grpo="$out/eval_grpo.jsonl"); curves+=(grpo="$out/ckpt/grpo")
  else
    echo "[learn] grpo failed (exit $rc): the table has no GRPO row" >&2
  fi
fi

# a second domain never trained on
if [ -n "$eval_domain" ]; then
  env_record "$eval_domain" | gen-task --recipe "$recipe" -n "$held" --seed 13 \
    | validate-task --recipe "$recipe" > "$out/eval_domain_tasks.jsonl" || true
  evaluate base "$base" "$out/eval_domain_tasks.jsonl" "$out/evaldomain_base.jsonl"
  evaluate sft "$(cd "$out/ckpt/sft" && pwd)" "$out/eval_domain_tasks.jsonl" "$out/evaldomain_sft.jsonl"
  "$PY" -m toolkit.train.learn report --out "$out/eval_domain" base="$out/evaldomain_base.jsonl" \
    sft="$out/evaldomain_sft.jsonl" > /dev/null
  stamp eval_domain
fi
toolkit serve --model "$base" --stop

"$PY" -m toolkit.train.learn report --out "$out" "${evals[@]}" --curves "${curves[@]}" > /dev/null
"$PY" -m toolkit.yieldtable "$out/stages.jsonl" --json "$out/yield.json" > "$out/yield.txt" || true
"$PY" - "$out" "$scale" <<PY
import json, sys
t = {$(for s in "${!secs[@]}"; do printf '"%s": %s, ' "$s" "${secs[$s]}"; done)}
json.dump({"scale": sys.argv[2], "seconds_since_start": t}, open(sys.argv[1] + "/timings.json", "w"), indent=1)
PY
cat "$out/table.md" >&2
echo "[learn] done in $(( $(date +%s) - T0 ))s: $out/table.md $out/summary.json" >&2
