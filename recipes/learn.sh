#!/usr/bin/env bash
# The closed loop on a real model, offline (issues 20, 31):
#   recipes/learn.sh [--scale smoke|cpu|gpu] [--tasks plain|deep] [--domain DIR|NAME] [--eval-domain DIR|NAME] [--out DIR]
#   (just learn [ARGS])
# 1. synthesize LOGIGEN tasks symbolically on the domain (gen-task --explorer symbolic | validate-task)
# 2. split by target into train / held-out (disjoint targets and entities: toolkit.train.learn split)
# 3. RL tasks of their own: the domain's principals (customers ...) replaced by clones none of the
#    train / held-out tasks name (toolkit.train.learn principals), tasks synthesized there, any task
#    sharing a key with train or held-out dropped (toolkit.train.learn exclude)
# 4. oracle replay of train → verify state_diff --filter passed → verified trajectories
# 5. sft on SmolLM2-135M-Instruct (toolkit models materialize smollm2-135m-instruct) → ckpt/sft
# 6. grpo --variant ta-grpo from the SFT checkpoint on the RL tasks → ckpt/grpo (on-policy)
# 7. evaluate base / SFT / GRPO: toolkit serve --model CKPT (CPU: GGUF export on llama.cpp; GPU: vLLM) →
#    rollout on the held-out tasks (and on --eval-domain's tasks) → verify --strategy state_diff
#    (no-write tasks need the DB + ACTION + COMMUNICATE basis)
# --config-only: write the recipe and each stage's effective configuration (`CMD --print-config`,
# the variant preset applied) to $OUT/config/, run nothing (how the gpu scale is checked without a GPU).
# --tasks deep: violation-first and boundary tasks (max_writes 2 goal writes; with their setup and the
# forbidden attempt the reference paths held 1-4 writes on airline) with the domain policy in the agent's
# prompt; the table adds the share of episodes that attempt a write the policy forbids.
# Out ($OUT, default out/learn): table.md, summary.json, details.json, curves.png, yield.txt, timings.json,
# and every intermediate JSONL. The user simulator of every evaluation (and of GRPO) is the packaged
# SmolLM2 GGUF on the embedded llama.cpp server, its own server (TOOLKIT_EMBEDDED_SLOTS=role), so the
# three rows differ only by the agent; each agent checkpoint is served by `toolkit serve --model`
# (CPU: exported to GGUF, llama.cpp's server, its KV cache kept between turns; GPU: vLLM).
# Env: TOOLKIT_PYTHON (python), LEARN_N (tasks to synthesize), LEARN_HELD (held-out cap), LEARN_SFT_STEPS,
#      LEARN_GRPO_STEPS, LEARN_GRPO_G, LEARN_GRPO_TASKS (groups per step), LEARN_GRPO_LR, LEARN_GRPO_T
#      (sampling temperature), LEARN_GRPO_STALENESS, LEARN_GRPO_VARIANT, LEARN_GRPO_FILL_ROUNDS (the
#      astra/eigendata variants' bound on refill rounds per step), LEARN_GRPO_GENERATION (CPU:
#      llamacpp, the default, or transformers), LEARN_RL_N (RL tasks synthesized),
#      LEARN_PRINCIPALS (clones), LEARN_SKIP_GRPO=1, LEARN_CONSTRAINED=1 (constrained-decoding rows),
#      LEARN_CONSTRAINED_N, LEARN_BF16=true|false (default: bf16 autocast where native),
#      LEARN_FROM=DIR (reuse DIR's tasks, base/SFT evaluations and SFT checkpoint: GRPO ablations).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=smoke; tasks=plain; domain=airline; eval_domain=""; out=${OUT:-out/learn}; config_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) scale=$2; shift 2 ;;
    --tasks) tasks=$2; shift 2 ;;
    --domain) domain=$2; shift 2 ;;
    --eval-domain) eval_domain=$2; shift 2 ;;
    --config-only) config_only=1; shift ;;
    --out) out=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "learn.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=${TOOLKIT_PYTHON:-python}
case "$scale" in
  # n: tasks synthesized; held: held-out cap; k: rollouts per held-out task; turns/tokens: per episode / reply;
  # lr: SFT learning rate, sbs: rows per SFT step (they share the tool-schema prefix, forwarded once);
  # sys: the agent's system prompt (the domain policy) kept or dropped, at training and at evaluation
  # alike; RL: rl_n tasks synthesized on `principals` cloned principals, grpo_steps optimizer steps of
  # tps groups of G episodes, learning rate glr, sampling temperature gT; cons: the constrained-decoding
  # rows (cn held-out tasks)
  smoke) n=60;  held=3;  k=1; turns=3; toks=112; sft_steps=4;   sbs=4; max_len=3072; lr=4.0e-4; sys=drop
         rl_n=12;  principals=8;  grpo_steps=2;   G=2; tps=1;  glr=5.0e-5; gT=1.0; cons=1; cn=2 ;;
  cpu)   n=600; held=48; k=1; turns=3; toks=112; sft_steps=36;  sbs=4; max_len=3072; lr=4.0e-4; sys=drop
         rl_n=120; principals=40; grpo_steps=12;  G=4; tps=2;  glr=1.0e-4; gT=1.0; cons=0; cn=8 ;;
  gpu)   n=600; held=100; k=4; turns=8; toks=256; sft_steps=300; sbs=4; max_len=4096; lr=5.0e-5; sys=keep
         rl_n=600; principals=120; grpo_steps=200; G=8; tps=16; glr=2.0e-6; gT=1.0; cons=1; cn=100 ;;
  *) echo "learn.sh: --scale smoke|cpu|gpu" >&2; exit 2 ;;
esac
# deep: violation-first and boundary tasks need the policy to be solved: it stays in the prompt
deep_gen="violation_share: 0.0
  rule_coverage: false
  boundary_share: 0.0
  max_writes: 1"
case "$tasks" in
  plain) ;;
  deep) sys=keep; max_len=$(( max_len + 1536 ))
        # CPU: one row of up to ~4.6k tokens per backward (4 such rows in one fp32 backward held 22.8 GB
        # and were killed for memory on the 24 GiB box); the same rows per optimizer step
        if [ "$scale" != gpu ]; then sga=$sbs; sbs=1; fi
        deep_gen="violation_share: 0.5
  rule_coverage: true
  boundary_share: 0.5
  max_writes: 2" ;;
  *) echo "learn.sh: --tasks plain|deep" >&2; exit 2 ;;
esac
n=${LEARN_N:-$n}; held=${LEARN_HELD:-$held}; sft_steps=${LEARN_SFT_STEPS:-$sft_steps}
grpo_steps=${LEARN_GRPO_STEPS:-$grpo_steps}; G=${LEARN_GRPO_G:-$G}; tps=${LEARN_GRPO_TASKS:-$tps}
glr=${LEARN_GRPO_LR:-$glr}; gT=${LEARN_GRPO_T:-$gT}; rl_n=${LEARN_RL_N:-$rl_n}; principals=${LEARN_PRINCIPALS:-$principals}
variant=${LEARN_GRPO_VARIANT:-ta-grpo}; staleness=${LEARN_GRPO_STALENESS:-0}
fill_key=""  # the variant's own max_fill_rounds unless set
[ -n "${LEARN_GRPO_FILL_ROUNDS:-}" ] && fill_key="max_fill_rounds: $LEARN_GRPO_FILL_ROUNDS"
from=${LEARN_FROM:-}
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
# (max_writes 1, no violation-first or boundary tasks unless --tasks deep), the minimal tool rendering
# (airline: 11 tools in ~0.95k tokens instead of 2.3k compact / 11k full), bf16 autocast on CPU, greedy
# decoding at evaluation, short replies, 3 agent turns (an oracle episode: 2 reads, the write, a closing
# line), Hermes tool calls in text. sys=drop leaves the policy (1.2k tokens) out of the agent's prompt
# at training and evaluation alike (rows ~1.8k instead of ~2.9k tokens). The same rendering at training
# and at evaluation (tests/train/test_render_parity.py).
recipe="$out/learn.yaml"
# bf16 autocast over fp32 weights where bf16 is native (GPU, CPU with AMX / AVX512-BF16): ~2x faster;
# on an AVX2-only CPU torch emulates bf16 and it is many times slower, so fp32 there
bf16=${LEARN_BF16:-$("$PY" -c 'from toolkit.train.sft import native_bf16; print(str(native_bf16()).lower())')}
if [ "$scale" = gpu ]; then  # one GPU: vLLM inside the training process (TRL's colocate mode)
  gen_keys="generation: vllm
  vllm_mode: colocate
  gradient_checkpointing: true
  gradient_accumulation_steps: 8
  micro_batch: 8
  trl:
    bf16: true
    vllm_gpu_memory_utilization: 0.35
    vllm_enable_sleep_mode: false"
else  # CPU: llama.cpp samples from a GGUF of the policy exported each step (docs/training.md); one
  # backward per episode (fp32 on the CPU keeps each layer's attention weights for the backward: a
  # group of 4 episodes of 2-4k tokens in one backward went past the box's 24 GiB)
  gen_keys="generation: ${LEARN_GRPO_GENERATION:-llamacpp}
  gradient_accumulation_steps: $(( G * tps ))
  trl:
    bf16: $bf16"
fi
cat > "$recipe" <<YAML
defaults:
  temperature: 0.0
  concurrency: 1
gen-task:
  strategy: logigen
  explorer: symbolic
  user_view: template
  $deep_gen
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
  warmup_steps: 3
  per_device_train_batch_size: $sbs
  gradient_accumulation_steps: ${sga:-1}
  max_length: $max_len
  bf16: $bf16
  model_dtype: float32
  save_strategy: "no"
  logging_steps: 1
grpo:
  # on-policy TA-GRPO (LOGIGEN eq. 5: the turn's ratio, r_t = -lambda_err for policy violations only);
  # zero-variance groups train only through their negative r_t (the variant's rule)
  variant: $variant
  max_staleness: $staleness
  chat_template: toolkit
  tool_schema: minimal
  system_prompt: $sys
  model_dtype: float32
  max_steps: $grpo_steps
  num_generations: $G
  tasks_per_step: $tps
  max_turns: $(( turns < 4 ? turns : 4 ))
  max_new_tokens: $toks
  max_total_tokens: $(( max_len + 1536 ))
  learning_rate: $glr
  lr_scheduler_type: constant
  temperature: $gT
  $fill_key
  strict_tool_calls: true
  user_tool_protocol: hermes
  user_max_tokens: 48
  user_timeout: 1800
  user_max_retries: 1
  $gen_keys
YAML
if [ "$config_only" = 1 ]; then  # the effective configuration of every stage, nothing run
  mkdir -p "$out/config"
  for c in gen-task validate-task rollout verify sft grpo; do
    "$c" --recipe "$recipe" --print-config > "$out/config/$c.yaml"
  done
  echo "[learn] --config-only: $recipe and the effective configuration of each stage in $out/config/" >&2
  exit 0
fi

reuse() {  # FILE...: take them from LEARN_FROM's run
  for f in "$@"; do
    [ -e "$from/$f" ] || { echo "learn.sh: LEARN_FROM=$from has no $f" >&2; exit 2; }
    mkdir -p "$(dirname "$out/$f")"; rm -rf "${out:?}/$f"; ln -s "$(cd "$from" && pwd)/$f" "$out/$f"
  done
}

if [ -n "$from" ]; then
  reuse tasks.jsonl train_tasks.jsonl heldout_tasks.jsonl rl_tasks.jsonl split.json train_verified.jsonl ckpt/sft
  # the base and SFT evaluations when LEARN_FROM's run has finished (else they run here)
  if [ -f "$from/summary.json" ]; then reuse eval_base.jsonl eval_sft.jsonl; fi
  stamp reused
else
  # 1-2 synthesize and split
  env_record "$domain" > "$out/domain.jsonl"
  set +e
  gen-task --recipe "$recipe" -n "$n" --seed 7 --rejects "$out/rejects.jsonl" < "$out/domain.jsonl" \
    | validate-task --recipe "$recipe" --rejects "$out/rejects.jsonl" > "$out/tasks.jsonl"
  set -e
  "$PY" -m toolkit.train.learn split --heldout 0.3 --seed 7 --max-heldout "$held" \
    --train "$out/train_tasks.jsonl" --heldout-out "$out/heldout_tasks.jsonl" < "$out/tasks.jsonl" > "$out/split.json"
  stamp synthesize

  # 3 RL tasks on principals nobody else names
  "$PY" -m toolkit.train.learn principals -k "$principals" --seed 7 < "$out/domain.jsonl" > "$out/domain_rl.jsonl"
  set +e
  gen-task --recipe "$recipe" -n "$rl_n" --seed 8 --rejects "$out/rejects.jsonl" < "$out/domain_rl.jsonl" \
    | validate-task --recipe "$recipe" --rejects "$out/rejects.jsonl" \
    | "$PY" -m toolkit.train.learn exclude "$out/train_tasks.jsonl" "$out/heldout_tasks.jsonl" > "$out/rl_tasks.jsonl"
  set -e
  echo "[learn] $(wc -l < "$out/rl_tasks.jsonl") RL tasks" >&2
  stamp synthesize_rl

  # 4 oracle replay → verified teacher trajectories
  set +e
  rollout --recipe "$recipe" --agent replay --max-turns 64 --rejects "$out/rejects.jsonl" < "$out/train_tasks.jsonl" \
    | verify --recipe "$recipe" --filter passed --rejects "$out/rejects.jsonl" > "$out/train_verified.jsonl"
  set -e
  echo "[learn] $(wc -l < "$out/train_verified.jsonl") verified train trajectories" >&2
  stamp oracle
fi

# the base checkpoint and its server
base=$(toolkit models materialize smollm2-135m-instruct | tail -1)
base_url=""
stamp materialize

evaluate() {  # MODEL_NAME CKPT TASKS OUTFILE [ROLLOUT FLAGS...]
  local url name=$1 ckpt=$2 tasks=$3 outfile=$4
  shift 4
  if [ "$ckpt" = "$base" ]; then
    [ -n "$base_url" ] || base_url=$(toolkit serve --model "$base" | tail -1)
    url=$base_url
  else
    url=$(toolkit serve --model "$ckpt" | tail -1)
  fi
  set +e
  rollout --recipe "$recipe" -n "$k" --seed 11 --agent-base-url "$url" --agent-model "$ckpt" "$@" \
      --rejects "$out/rejects.jsonl" < "$tasks" \
    | verify --recipe "$recipe" --rejects "$out/rejects.jsonl" > "$outfile"
  set -e
  if [ "$ckpt" != "$base" ] && [ "${KEEP_SERVED:-0}" != 1 ]; then toolkit serve --model "$ckpt" --stop; fi
}

# constrained decoding of the agent's tool calls (a GBNF grammar: a reply is plain text or calls
# naming offered tools with schema-shaped arguments), as extra rows NAME+grammar on the first
# LEARN_CONSTRAINED_N held-out tasks (grammar sampling is slow on CPU; off at --scale cpu, whose
# budget goes to the 48 held-out tasks and GRPO); LEARN_CONSTRAINED=1 adds them
constrained=${LEARN_CONSTRAINED:-$cons}
head -n "${LEARN_CONSTRAINED_N:-$cn}" "$out/heldout_tasks.jsonl" > "$out/heldout_constrained.jsonl"

sft_dir() { (cd "$out/ckpt/sft" && pwd -P); }
# training first (SFT, then GRPO from it), the evaluations after: a GRPO ablation can start from the
# SFT checkpoint (LEARN_FROM) while this run still evaluates
if [ -z "$from" ]; then
  # 5 SFT
  sft --recipe "$recipe" --model "$base" --output-dir "$out/ckpt/sft" < "$out/train_verified.jsonl" > /dev/null
  stamp sft
fi

# 6 GRPO from the SFT checkpoint on the RL tasks (rewards: verify state_diff, the same no-write basis)
grpo_ok=0
if [ "${LEARN_SKIP_GRPO:-0}" != 1 ]; then
  rm -rf "$out/ckpt/grpo" "$out/grpo_rollouts.jsonl"
  set +e
  grpo --recipe "$recipe" --model "$(sft_dir)" --output-dir "$out/ckpt/grpo" -i "$out/rl_tasks.jsonl" \
    --rollouts "$out/grpo_rollouts.jsonl"
  rc=$?
  set -e
  stamp grpo
  if [ $rc -eq 0 ] && [ -f "$out/ckpt/grpo/config.json" ]; then grpo_ok=1
  else echo "[learn] grpo failed (exit $rc): the table has no GRPO row" >&2; fi
fi

# 7 evaluate on the held-out tasks (the base and SFT rows are LEARN_FROM's when it has them)
if [ ! -e "$out/eval_base.jsonl" ]; then
  evaluate base "$base" "$out/heldout_tasks.jsonl" "$out/eval_base.jsonl"
  stamp eval_base
fi
if [ ! -e "$out/eval_sft.jsonl" ]; then
  evaluate sft "$(sft_dir)" "$out/heldout_tasks.jsonl" "$out/eval_sft.jsonl"
  stamp eval_sft
fi
evals=(base="$out/eval_base.jsonl" sft="$out/eval_sft.jsonl")
curves=(sft="$out/ckpt/sft")
if [ $grpo_ok = 1 ]; then
  evaluate grpo "$(cd "$out/ckpt/grpo" && pwd)" "$out/heldout_tasks.jsonl" "$out/eval_grpo.jsonl"
  stamp eval_grpo
  evals+=(grpo="$out/eval_grpo.jsonl"); curves+=(grpo="$out/ckpt/grpo")
fi
if [ "$constrained" = 1 ]; then
  evaluate base "$base" "$out/heldout_constrained.jsonl" "$out/eval_base_grammar.jsonl" --constrain-tool-calls grammar
  evaluate sft "$(sft_dir)" "$out/heldout_constrained.jsonl" "$out/eval_sft_grammar.jsonl" --constrain-tool-calls grammar
  evals+=("base+grammar=$out/eval_base_grammar.jsonl" "sft+grammar=$out/eval_sft_grammar.jsonl")
  stamp eval_grammar
fi

# a second domain never trained on
if [ -n "$eval_domain" ]; then
  env_record "$eval_domain" | gen-task --recipe "$recipe" -n "$held" --seed 13 \
    | validate-task --recipe "$recipe" > "$out/eval_domain_tasks.jsonl" || true
  evaluate base "$base" "$out/eval_domain_tasks.jsonl" "$out/evaldomain_base.jsonl"
  evaluate sft "$(sft_dir)" "$out/eval_domain_tasks.jsonl" "$out/evaldomain_sft.jsonl"
  ed=(base="$out/evaldomain_base.jsonl" sft="$out/evaldomain_sft.jsonl")
  if [ -f "$out/ckpt/grpo/config.json" ]; then
    evaluate grpo "$(cd "$out/ckpt/grpo" && pwd)" "$out/eval_domain_tasks.jsonl" "$out/evaldomain_grpo.jsonl"
    ed+=(grpo="$out/evaldomain_grpo.jsonl")
  fi
  "$PY" -m toolkit.train.learn report --out "$out/eval_domain" "${ed[@]}" > /dev/null
  stamp eval_domain
fi
[ -n "$base_url" ] && toolkit serve --model "$base" --stop

"$PY" -m toolkit.train.learn report --out "$out" "${evals[@]}" --curves "${curves[@]}" > /dev/null
"$PY" -m toolkit.yieldtable "$out/stages.jsonl" --json "$out/yield.json" > "$out/yield.txt" || true
"$PY" - "$out" "$scale" "$tasks" <<PY
import json, sys
t = {$(for s in "${!secs[@]}"; do printf '"%s": %s, ' "$s" "${secs[$s]}"; done)}
json.dump({"scale": sys.argv[2], "tasks": sys.argv[3], "seconds_since_start": t}, open(sys.argv[1] + "/timings.json", "w"), indent=1)
PY
cat "$out/table.md" >&2
echo "[learn] done in $(( $(date +%s) - T0 ))s: $out/table.md $out/summary.json" >&2
