"""Issue 34's quality acceptance of `gen-task --strategy logigen --explorer symbolic` on held-out
domains, measured with the acceptance test's own independent checks
(tests/flows/logigen/test_acceptance.py: replayed writes, read-dependent writes, user texts).

    python bench/logigen_acceptance.py [citypermits gym courier vet waterdesk] [-n 100] [--seed 11]

Per domain (a directory name under tests/data, or a path), one JSON line: tasks, tasks with >= 3
writes, with a write depending on a read, the signature ratio, the rules and the rules with a
violation-first / boundary task, replays at reward 1.0, tasks passing validate-task, user views
naming a column (spaced or not, or a one-word column that is no English word) or saying
"a <plural table>", and the synthesis's CPU seconds.
The bars: >= 50% with >= 3 writes, >= 25% read-dependent, signature ratio >= 0.8, violation-first
on >= 80% of the rules, replay 1.0 and validation on all, 0 leaky views.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.flows.logigen import test_acceptance as A  # noqa: E402
from tests.flows.logigen.test_tasks import gen, replay_rewards, validate  # noqa: E402
from toolkit.envs import load_env  # noqa: E402
from toolkit.envs.sqlite.english import is_word  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def leaks(env_ref: dict, rs: list) -> list:
    env = load_env(env_ref)
    try:
        snake = {c.name for t in env.domain.tables.values() for c in t.columns if "_" in c.name}
        tables = list(env.domain.tables)
        # a one-word column that is no word (`nm`, `sts`), unless the data says it as a value too
        values = {str(v).lower() for t in env.domain.tables.values() for c in t.columns for v in (c.enum or [])}
        abbrev = {c.name for t in env.domain.tables.values() for c in t.columns
                  if re.fullmatch(r"[A-Za-z]{2,}", c.name) and not is_word(c.name)} - values - set(tables)
    finally:
        env.close()
    plural = [t.replace("_", " ") for t in tables if t.endswith("s") and not t.endswith(("ss", "us", "is"))]
    bad = []
    for r in rs:
        text = A.user_texts(r)
        hit = [c for c in snake
               if re.search(r"(?i)(?<![\w-])" + r"[\s_]+".join(map(re.escape, c.split("_"))) + r"(?![\w-])", text)
               or re.search(r"(?i)(?<![A-Za-z0-9_])" + re.escape(c) + r"(?![A-Za-z0-9_])", text)]
        hit += [a for a in abbrev if re.search(r"(?i)(?<![\w-])" + re.escape(a) + r"(?![\w-])", text)]
        hit += ["a " + t for t in plural if re.search(r"(?i)\b(?:a|an)\s+(?:new\s+)?" + re.escape(t) + r"\b", text)]
        if hit:
            bad.append((r.id, hit, text[:300]))
    return bad


def measure(domain: str, n: int, seed: int) -> dict:
    path = Path(domain) if Path(domain).exists() else A.DATA / domain
    env_ref = {"backend": "sqlite", "path": str(path)}
    c0 = cpu()
    rs = gen(env_ref, n=n, seed=seed)
    c1 = cpu()
    facts = [A.replay(r) for r in rs]
    sigs = {tuple(a.name for a in r.task.ground_truth.actions) for r in rs}
    e = load_env(env_ref)
    try:
        schema = e.domain.spec.schema_sql
    finally:
        e.close()
    rules = set(re.findall(r"POLICY_VIOLATION: (\w+):", schema))
    viol = {r.task.complexity["violation"]["rule"] for r in rs if r.task.complexity.get("violation")}
    bnd = {r.task.complexity["boundary"]["rule"] for r in rs if r.task.complexity.get("boundary")}
    rewards = replay_rewards(rs)
    checked = validate(rs, filter="passed")
    bad = leaks(env_ref, rs)
    return {"domain": path.name, "n": len(rs), "ge3_writes": sum(w >= 3 for w, _ in facts),
            "read_dependent": sum(d > 0 for _, d in facts), "signature_ratio": round(len(sigs) / max(1, len(rs)), 3),
            "rules": len(rules), "violation_first_rules": len(viol & rules), "boundary_rules": len(bnd & rules),
            "replay_1.0": sum(x == 1.0 for x in rewards), "replays": len(rewards),
            "validated": sum(all(v.passed for v in r.verdicts if v.stage == "validate-task") for r in checked),
            "leaky_views": len(bad), "leak_examples": bad[:3], "synthesis_cpu_s": round(c1 - c0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("domains", nargs="*", default=["citypermits", "gym", "courier", "vet", "waterdesk"])
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    for d in a.domains:
        print(json.dumps(measure(d, a.n, a.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
