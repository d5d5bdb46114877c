"""EigenData RandomPoolAgent (gen-task step `random_pool`): the LLM writes a pool of
randomization factors; the pool is checked against the paper's counts (FLOWS §1.2 Stage 1) and
one scenario's parameters are drawn from it deterministically (seeded)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from toolkit.roles.structured import Malformed, parse_json_object

COUNTS = {  # key: (min, max) — EigenData App. 3.1 RandomPoolAgent "Generation Guidelines"
    "user_profiles": (3, 5),
    "testing_objectives": (3, 5),
    "deception_tactics": (1, 3),
    "operational_complexity": (2, 4),
    "policy_focuses": (2, 5),
}
ENUMS = {
    "complexity_levels": ("simple", "moderate", "complex"),
    "urgency_levels": ("low", "medium", "high", "critical"),
    "emotional_states": ("neutral", "excited", "anxious", "frustrated", "confused"),
}
EXPERIENCE = ("novice", "occasional", "frequent", "expert")
POOL_KEYS = ("testing_objectives", "deception_tactics", "operational_complexity", "policy_focuses",
             "behavioral_patterns", "complexity_levels", "urgency_levels", "emotional_states")


def _strings(v: Any, key: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise Malformed(f"{key!r} must be a list of non-empty strings")
    return [x.strip() for x in v]


def parse_pool(text: str | None) -> dict:
    """Strict parse of the RandomPool reply into a normalized pool:
    {user_profiles: [...], testing_objectives: [...], ..., seed}.

    Accepts the paper's layout (profiles, then one dict holding the factor lists, then {"seed"}
    all inside `user_profiles`) and a flat layout (the lists next to `user_profiles`)."""
    obj = parse_json_object(text, required=("random_factors",))
    rf = obj["random_factors"]
    if not isinstance(rf, dict):
        raise Malformed("'random_factors' must be an object")
    items = rf.get("user_profiles")
    if not isinstance(items, list):
        raise Malformed("'random_factors.user_profiles' must be a list")
    pool: dict[str, Any] = {"user_profiles": [], "seed": rf.get("seed")}
    factors: dict[str, Any] = {k: rf[k] for k in POOL_KEYS if k in rf}
    for it in items:
        if not isinstance(it, dict):
            raise Malformed("every item of user_profiles must be an object")
        if "seed" in it and len(it) == 1:
            pool["seed"] = it["seed"]
        elif any(k in it for k in POOL_KEYS):
            factors.update({k: it[k] for k in POOL_KEYS if k in it})
        else:
            pool["user_profiles"].append(it)
    for p in pool["user_profiles"]:
        if not isinstance(p.get("role"), str) or not p["role"].strip():
            raise Malformed("a user profile needs a 'role'")
        exp = p.get("experience", p.get("travel_experience"))
        if exp is not None and (not isinstance(exp, str) or exp.strip().lower() not in EXPERIENCE):
            raise Malformed(f"user profile experience must be one of {', '.join(EXPERIENCE)}, got {exp!r}")
    for k in POOL_KEYS:
        if k not in factors:
            raise Malformed(f"missing factor list {k!r}")
        pool[k] = _strings(factors[k], k)
    for k, allowed in ENUMS.items():
        bad = [x for x in pool[k] if x.lower() not in allowed]
        if bad:
            raise Malformed(f"{k!r} must only hold {', '.join(allowed)}; got {', '.join(map(repr, bad))}")
        pool[k] = [x.lower() for x in pool[k]]
    for k, (lo, hi) in COUNTS.items():
        n = len(pool[k])
        if not lo <= n <= hi:
            raise Malformed(f"{k!r} must have {lo}-{hi} items, got {n}")
    if not pool["behavioral_patterns"]:
        raise Malformed("'behavioral_patterns' is empty")
    return pool


def _rng(*parts: Any) -> random.Random:
    h = hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()
    return random.Random(int(h[:16], 16))


def select(pool: dict, record_id: str, k: int) -> dict:
    """Draw one scenario's parameters from the pool; deterministic in (record id, k, pool seed).
    The first testing objective is the primary one (kept by repair)."""
    r = _rng(record_id, k, pool.get("seed"))

    def some(key: str, lo: int, hi: int) -> list[str]:
        xs = pool[key]
        n = min(len(xs), r.randint(lo, hi))
        return r.sample(xs, n)

    return {
        "user_profile": r.choice(pool["user_profiles"]),
        "testing_objectives": some("testing_objectives", 1, 2),
        "deception_tactics": some("deception_tactics", 1, 1),
        "operational_complexity": some("operational_complexity", 1, 2),
        "policy_focuses": some("policy_focuses", 1, 2),
        "behavioral_pattern": r.choice(pool["behavioral_patterns"]),
        "complexity_level": r.choice(pool["complexity_levels"]),
        "urgency_level": r.choice(pool["urgency_levels"]),
        "emotional_state": r.choice(pool["emotional_states"]),
    }
