#!/usr/bin/env bash
# The main job on the embedded default (no API key, no GPU, no network):
# bundled LOGIGEN-style airline tasks → rollout (embedded SmolLM2 agent + user simulator, 2 trajectories
# each) and an oracle replay → verify with the state DIFF reward → a per-task summary with jq/python.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/demo}
mkdir -p "$out"
toolkit tasks airline > "$out/tasks.jsonl"
echo "[demo] $(wc -l < "$out/tasks.jsonl") bundled airline tasks" >&2
rollout --agent replay < "$out/tasks.jsonl" | verify --strategy state_diff > "$out/oracle.jsonl"
# the embedded 135M CPU model is slow (~10 s per call on 2 cores) and weak: 2 tasks x 2 trajectories
# show the loop; point --agent-base-url/--user-base-url at a real server for real data.
head -n "${DEMO_TASKS:-2}" "$out/tasks.jsonl" \
  | rollout -n 2 --max-turns 3 --max-tokens 96 --cache "$out/llm-cache.sqlite" --concurrency 2 \
  | verify --strategy state_diff > "$out/embedded.jsonl"
python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("oracle", "embedded"):
    rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    rewards = [t.get("reward") or 0.0 for r in rows for t in r["trajectories"]]
    print(json.dumps({"run": name, "tasks": len(rows), "trajectories": len(rewards),
                      "mean_reward": round(sum(rewards) / max(1, len(rewards)), 3),
                      "terminations": sorted({t["termination"] for r in rows for t in r["trajectories"]})}))
PY
