# Recipes: `just <name>`. Every recipe runs from a checkout; `just install` first on a new machine.
set shell := ["bash", "-euo", "pipefail", "-c"]
export PATH := justfile_directory() + "/.venv/bin:" + env_var('PATH')
export LITELLM_LOCAL_MODEL_COST_MAP := "True"

# install into .venv (extras: embedded model, tests, tau2)
install:
    bin/setup install

# run the test suite (the same command CI runs)
test *ARGS:
    bin/setup test {{ARGS}}

# the main job on the embedded default model (no key, no GPU, no network)
demo:
    bin/setup demo

# regenerate schemas/record.schema.json from toolkit/schema.py
schemas:
    toolkit schema export

# all benchmarks (each prints figures and ratios against a baseline measured in the same run)
bench:
    for b in bench/*.py; do echo "== $b"; python "$b"; done

# which backends are usable here
doctor:
    toolkit doctor

# LOGIGEN flow on a bundled domain: oracle + LLM rollouts, state-DIFF reward, keep passing records
logigen domain="airline" n="4":
    toolkit tasks {{domain}} | rollout -n {{n}} --recipe recipes/logigen.yaml | verify --recipe recipes/logigen.yaml --filter passed > out/{{domain}}.passed.jsonl

# tau2-bench oracle self-check (offline) and a model evaluation
tau2-oracle:
    eval-tau2 --oracle --domain all -o out/tau2-oracle.jsonl --summary-json out/tau2-oracle.json

tau2-eval domain="airline" k="4" model="" base_url="":
    eval-tau2 --domain {{domain}} -k {{k}} --agent-model "{{model}}" --agent-base-url "{{base_url}}" -o out/tau2-{{domain}}.jsonl --summary-json out/tau2-{{domain}}.json --chart out/tau2-{{domain}}.png --compare paper

# LOGIGEN: check sqlite domains (every rule provoked by a real call); exit 1 with reasons
domain-check +paths="toolkit/domains/airline toolkit/domains/clinic":
    toolkit domain check {{paths}}

# LOGIGEN Architect: domain briefs (extra.brief) -> compiled domains under out/domains
logigen-architect briefs out="out/domains":
    gen-plan --strategy logigen --out-dir {{out}} -i {{briefs}} -o out/plans.jsonl

# EigenData pilot loop on ENV (bundled sqlite domain or tau2:<domain>), N scenarios per prompt set
# and iteration, with a yield/cost table per stage and iteration (recipes/eigendata.sh)
eigendata env="airline" n="2" iters="16":
    recipes/eigendata.sh {{env}} {{n}} {{iters}}

# data-regression gate (docs/ci-data-regression.md), e.g.
#   just stats out/verified.jsonl --baseline ci/baseline-stats.json --max-drop pass_rate=0.02
stats file *args:
    toolkit stats {{file}} {{args}}

# sharded replay run, merged (recipes/cluster; the Slurm body run locally for every shard)
cluster-local n="3":
    mkdir -p out/cluster && toolkit tasks airline > out/cluster/tasks.jsonl
    for i in $(seq 0 $(({{n}} - 1))); do SHARD=$i NSHARDS={{n}} INPUT=out/cluster/tasks.jsonl OUT_DIR=out/cluster bash recipes/cluster/shard_body.sh; done
    python recipes/cluster/merge.py --input out/cluster/tasks.jsonl --parts out/cluster --nshards {{n}} > out/cluster/merged.jsonl

# the same sharded flow over a local Ray cluster (the `cluster` extra): toolkit ray-shard
ray-local n="3":
    mkdir -p out/ray && toolkit tasks airline > out/ray/tasks.jsonl
    toolkit ray-shard -n {{n}} -i out/ray/tasks.jsonl -o out/ray/merged.jsonl --parts-dir out/ray/parts -- bash -c 'rollout --agent replay | verify'

# LOGIGEN synthesis: domain briefs (JSONL → gen-plan) or an existing domain (bundled id / path) →
# tasks → validate → rollout → verify → SFT-ready rows + per-stage yield/cost table (out/logigen-synth)
logigen-synth brief="airline" n="10":
    bash recipes/logigen_synth.sh {{brief}} {{n}}

# Simia flow: seed pre-filter → one-call trajectory simulation (N per seed) → rule post-process →
# grounding against the real env; prints the yield table (SEEDS empty: bundled airline tasks replayed)
simia seeds="" n="2" *ARGS:
    python -m toolkit.flows.simia.recipe --seeds "{{seeds}}" -n {{n}} --out-dir out/simia {{ARGS}}

# ASTRA: tool docs → chain graph → tasks → emulated/real rollouts → 7-dim judge (tools), and
# QA → sandbox-checked python environments → F1 (qa); `both` runs both; prints yield/cost tables
astra which="both" n="2":
    bash recipes/astra.sh {{which}} {{n}}

# ---- training (sft / grpo; docs/training.md). Settings come from the flow recipe's sft: / grpo: sections.

# SFT on verified records: just sft logigen out/airline.passed.jsonl /models/Qwen2.5-7B-Instruct ckpt/sft
sft flow="logigen" data="out/airline.passed.jsonl" model="" out="ckpt/sft" *ARGS:
    sft --recipe recipes/{{flow}}.yaml -i {{data}} --model {{model}} --output-dir {{out}} {{ARGS}}

# user-simulator SFT on the user turns (EigenData): just sft-user eigendata out/dialogues.jsonl /models/M ckpt/user
sft-user flow="eigendata" data="out/airline.passed.jsonl" model="" out="ckpt/sft-user" *ARGS:
    sft --role user --recipe recipes/{{flow}}.yaml -i {{data}} --model {{model}} --output-dir {{out}} {{ARGS}}

# training rows for another stack: just sft-export sharegpt out/airline.passed.jsonl > train.jsonl
sft-export format="sharegpt" data="out/airline.passed.jsonl" *ARGS:
    sft --export {{format}} --filter passed -i {{data}} {{ARGS}}

# GRPO on a bundled domain's tasks: just grpo logigen airline ckpt/sft ckpt/grpo
grpo flow="logigen" domain="airline" model="" out="ckpt/grpo" *ARGS:
    toolkit tasks {{domain}} | grpo --recipe recipes/{{flow}}.yaml --model {{model}} --output-dir {{out}} --rollouts {{out}}/rollouts.jsonl {{ARGS}}

# GRPO on a cluster node (vLLM server on GPU 0, 7 training GPUs): just grpo-slurm /models/ckpt-sft tasks.jsonl logigen
grpo-slurm model tasks flow="logigen" variant="ta-grpo":
    mkdir -p logs && sbatch recipes/cluster/grpo-vllm.sbatch {{model}} {{tasks}} recipes/{{flow}}.yaml {{variant}}

# CPU demo of the whole training path on a tiny model built offline (no GPU, no download)
train-demo:
    python bench/grpo_rollout_bench.py --demo

# rollout throughput inside grpo vs TRL's built-in tool loop (tiny model, CPU)
bench-grpo:
    python bench/grpo_rollout_bench.py

# the closed loop on SmolLM2-135M (issue 20): synth → split → oracle → SFT → GRPO → evaluate (out/learn)
# just learn --scale smoke|cpu|gpu [--domain DIR] [--eval-domain DIR] [--out DIR]
learn *ARGS:
    bash recipes/learn.sh {{ARGS}}
