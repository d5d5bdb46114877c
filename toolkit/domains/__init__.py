"""Bundled sqlite domains (LOGIGEN hard-compiled policy environments) and their hand-checked tasks.

Each sub-directory is one domain (layout in docs/adding-a-domain.md): policy.md, schema.sql,
seed.sql|seed.json, tools.yaml, domain.yaml, tasks.jsonl (one `toolkit.schema.Record` per line)
and TASKS.md (why each task's reference actions are the right ones under the policy).

    from toolkit.domains import list_domains, load_tasks
    from toolkit.envs import load_env
    rec = load_tasks("airline")[0]
    env = load_env(rec["env"])          # {"backend": "sqlite", "id": "airline", ...}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit import registry
from toolkit.envs import load_env
from toolkit.envs.sqlite.registered import _NAME_RE, domain_path, list_domains
from toolkit.io import parse_jsonl

DOMAINS_DIR = Path(__file__).resolve().parent


def register_domain(name: str, path: str | Path, help: str = "", flow: str | None = None) -> Path:
    """Register a sqlite domain directory (the layout above) as `name`: `load_env({"backend":
    "sqlite", "id": name})`, `toolkit tasks name` and the distractor pools then find it. A plugin
    module doing this is listed under the `toolkit.domains` entry-point group."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"domain name {str(name)[:80]!r} must match {_NAME_RE.pattern}")
    p = Path(path).resolve()
    if not (p / "schema.sql").is_file():
        raise ValueError(f"domain {name!r}: {p} has no schema.sql")
    if not help:
        pol = p / "policy.md"
        first = pol.read_text(encoding="utf-8").lstrip().splitlines()[:1] if pol.is_file() else []
        help = first[0].lstrip("# ").strip() if first else ""
    registry.register("domains", name, p, scope="sqlite", help=help, flow=flow,
                      module=sys._getframe(1).f_globals.get("__name__"))
    return p


for _d in sorted(DOMAINS_DIR.iterdir()):  # the bundled domains
    if _d.is_dir() and (_d / "schema.sql").is_file():
        register_domain(_d.name, _d)


def load_tasks(name: str) -> list[dict]:
    """The domain's tasks.jsonl as record dicts (empty list when the domain has none)."""
    p = domain_path(name) / "tasks.jsonl"
    if not p.is_file():
        return []
    return parse_jsonl(p.read_text(encoding="utf-8"), str(p))


def replay(record: dict):
    """Replay a task's reference actions on a fresh environment.

    Returns (env, results): the environment in its final state (caller closes it) and the
    ToolResult of each action.
    """
    env = load_env(record["env"])
    gt = (record.get("task") or {}).get("ground_truth") or {}
    results = [env.call(a["name"], a.get("arguments") or {}, side=a.get("side", "agent"))
               for a in gt.get("actions") or []]
    return env, results


def rebuild_targets(name: str, write: bool = False) -> list[dict]:
    """Recompute env.state_ref, target_state and target_state_ref of every task of a domain.

    For maintainers after editing a domain's seed, triggers or tasks:
        python -c "from toolkit.domains import rebuild_targets; rebuild_targets('airline', write=True)"
    Every reference action must succeed (a task never lists a refused action); otherwise ValueError.
    """
    records = load_tasks(name)
    for rec in records:
        env_ref = {k: v for k, v in rec["env"].items() if k != "state_ref"}
        rec["env"] = env_ref
        env, results = replay({**rec, "env": env_ref})
        try:
            bad = [(i, r.error) for i, r in enumerate(results) if not r.ok]
            if bad:
                raise ValueError(f"{rec['id']}: reference action(s) failed: {bad}")
            env_ref["state_ref"] = env.initial_state_hash()
            target = env.snapshot()
        finally:
            env.close()
        gt = rec["task"]["ground_truth"]
        gt["target_state"] = target
        gt["target_state_ref"] = env.hash_state(target)
    if write:
        p = domain_path(name) / "tasks.jsonl"
        p.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=False, separators=(",", ":")) + "\n"
                             for r in records), encoding="utf-8")
    return records


__all__ = ["DOMAINS_DIR", "domain_path", "list_domains", "load_tasks", "rebuild_targets", "register_domain", "replay"]
