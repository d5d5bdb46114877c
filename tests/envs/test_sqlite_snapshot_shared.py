"""snapshot_shared(): the same rows as snapshot(), reusing the row dicts of tables whose
contents did not change (the goal walker and the traced replay snapshot after every write)."""

from __future__ import annotations

from toolkit.envs import load_env


def test_shared_snapshot_equals_snapshot_and_reuses_only_unchanged_tables():
    env = load_env({"backend": "sqlite", "id": "airline"})
    try:
        a = env.snapshot_shared()
        assert a == env.snapshot()
        cust = a["customer"][0]
        r = env.call("update_customer", {"user_id": cust["user_id"], "email": "new.address@example.com"})
        assert r.ok, r.error
        b = env.snapshot_shared()
        assert b == env.snapshot() and b != a
        # the changed table is read again; the others share their row dicts, in new lists
        assert not any(x is y for x, y in zip(a["customer"], b["customer"]))
        assert all(x is y for x, y in zip(a["flight"], b["flight"])) and a["flight"] is not b["flight"]
        b["flight"].append({"x": 1})  # a caller's list is its own
        assert env.snapshot_shared()["flight"] == env.snapshot()["flight"]
        # back to the first state (restore): its rows again, equal to a fresh read
        env.reset()
        assert env.snapshot_shared() == env.snapshot() == a
    finally:
        env.close()
