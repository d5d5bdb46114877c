"""snapshot_shared(): the same rows as snapshot(), reusing the row dicts of tables whose
contents did not change (the goal walker and the traced replay snapshot after every write)."""

from __future__ import annotations

from toolkit.envs import load_env
from toolkit.envs.sqlite import SqliteEnvironment


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



def test_state_hash_memo_by_content_ids_matches_the_rows_hash():
    """state_hash() is kept per set of table contents: each state's hash equals the hash of its
    rows (hash_state(snapshot()), computed without the memo), a write to any one table gives a new
    hash, and returning to a state (restore, reset) gives its hash again without hashing again."""
    env = SqliteEnvironment.from_spec({
        "name": "two", "schema": "CREATE TABLE a (a_id TEXT PRIMARY KEY, v TEXT); "
                                 "CREATE TABLE b (b_id TEXT PRIMARY KEY, v TEXT);",
        "seed": {"a": [{"a_id": "a1", "v": "x"}], "b": [{"b_id": "b1", "v": "x"}]}})
    try:
        h0 = env.state_hash()
        assert h0 == env.hash_state(env.snapshot())
        cp = env.checkpoint()
        assert env.call("update_a", {"a_id": "a1", "v": "y"}).ok
        h1 = env.state_hash()
        assert h1 != h0 and h1 == env.hash_state(env.snapshot())
        env.restore(cp)
        assert env.state_hash() == h0
        assert env.call("update_b", {"b_id": "b1", "v": "y"}).ok  # the other table this time
        h2 = env.state_hash()
        assert h2 not in (h0, h1) and h2 == env.hash_state(env.snapshot())
        assert env.call("update_a", {"a_id": "a1", "v": "y"}).ok  # both changed
        h3 = env.state_hash()
        assert h3 not in (h0, h1, h2) and h3 == env.hash_state(env.snapshot())
        n = len(env._hash_memo)
        env.reset()
        assert env.state_hash() == h0 and len(env._hash_memo) == n  # seen before: no new entry
        assert env.call("update_b", {"b_id": "b1", "v": "y"}).ok
        assert env.state_hash() == h2 and len(env._hash_memo) == n
    finally:
        env.close()
