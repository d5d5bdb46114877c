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

# ASTRA: tool docs → chain graph → tasks → emulated/real rollouts → 7-dim judge (tools), and
# QA → sandbox-checked python environments → F1 (qa); `both` runs both; prints yield/cost tables
astra which="both" n="2":
    bash recipes/astra.sh {{which}} {{n}}
