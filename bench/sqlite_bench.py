"""Benchmark of the sqlite backend: tool-call latency, reset, snapshot + hash.

    python bench/sqlite_bench.py [--domain airline] [-n 2000]

Each figure is compared with a baseline measured in the same run on the same database:
- tool calls: the raw parametrized sqlite3 statement the tool boils down to (same schema, same
  triggers), without argument validation, SAVEPOINT, row dicts or structured results;
- reset: rebuilding the database from the DDL + seed text (what a naive backend does);
- snapshot + hash: raw `SELECT *` of every table (no dicts, no canonical JSON, no sha256).
Target (issue): median tool call <= 1 ms.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolkit.domains import domain_path
from toolkit.envs import load_env
from toolkit.envs.sqlite import compiled_from_path


def timeit(fn, n: int, between=None, every: int = 0) -> list[float]:
    out = []
    for i in range(n):
        if between is not None and every and i % every == 0:
            between()
        t = time.perf_counter_ns()
        fn(i)
        out.append((time.perf_counter_ns() - t) / 1000.0)
    return out


def stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domain", default="airline")
    ap.add_argument("-n", type=int, default=2000)
    a = ap.parse_args()
    if a.domain != "airline":
        print("only the airline workload is scripted", file=sys.stderr)
        return 2
    n = a.n
    env = load_env({"backend": "sqlite", "id": "airline"})
    dom = compiled_from_path(domain_path("airline"))
    raw = sqlite3.connect(":memory:", isolation_level=None)
    raw.deserialize(dom.pristine)
    raw.execute("PRAGMA foreign_keys = ON")

    def raw_reset():
        raw.deserialize(dom.pristine)

    rows = []

    # query: filtered + ordered, as the tool does
    fl = ["HAT170-2024-05-20", "HAT172-2024-05-20", "HAT201-2024-05-18", "HAT510-2024-05-25"]
    for _ in range(50):
        env.call("query_flight_cabin", {"flight_id": fl[0], "cabin": "economy"})
    t_env = timeit(lambda i: env.call("query_flight_cabin", {"flight_id": fl[i % 4], "cabin": "economy"}), n)
    q = ('SELECT * FROM "flight_cabin" WHERE "flight_id" = ? AND "cabin" = ? '
         'ORDER BY "flight_id", "cabin" LIMIT ? OFFSET ?')
    t_raw = timeit(lambda i: raw.execute(q, (fl[i % 4], "economy", 51, 0)).fetchall(), n)
    rows.append(("query_flight_cabin (2 filters)", t_env, t_raw))

    t_env = timeit(lambda i: env.call("query_reservation", {"status": {"op": "in", "value": ["active"]},
                                                            "order_by": "created_on", "order": "desc", "limit": 5}), n)
    q2 = 'SELECT * FROM "reservation" WHERE "status" IN (?) ORDER BY "created_on" DESC, "reservation_id" LIMIT ? OFFSET ?'
    t_raw = timeit(lambda i: raw.execute(q2, ("active", 6, 0)).fetchall(), n)
    rows.append(("query_reservation (in, order, limit)", t_env, t_raw))

    # insert: a charge (BEFORE rules + AFTER balance/audit triggers fire)
    pay = {"reservation_id": 1001, "payment_id": "gift_card_7791", "purpose": "baggage", "amount": 0.01}
    t_env = timeit(lambda i: env.call("insert_payment", pay), n, between=env.reset, every=200)
    ins = ('INSERT INTO "payment" ("reservation_id", "payment_id", "purpose", "amount") VALUES (?, ?, ?, ?)')
    t_raw = timeit(lambda i: raw.execute(ins, (1001, "gift_card_7791", "baggage", 0.01)), n, between=raw_reset, every=200)
    rows.append(("insert_payment (5 rules + 2 side effects)", t_env, t_raw))

    # update: a profile field (BEFORE rules fire)
    names = ["Mia", "Mya"]
    t_env = timeit(lambda i: env.call("update_customer", {"user_id": "mia_li_3668", "first_name": names[i % 2]}), n)
    upd = 'UPDATE "customer" SET "first_name" = ? WHERE "user_id" = ?'
    t_raw = timeit(lambda i: raw.execute(upd, (names[i % 2], "mia_li_3668")), n)
    rows.append(("update_customer (2 rules)", t_env, t_raw))

    # update with a cascade: cancel (rules, seat release, refunds, balances, audit)
    t_env = timeit(lambda i: env.call("update_reservation", {"reservation_id": 1003, "status": "cancelled"}),
                   n // 4, between=env.reset, every=1)
    upd2 = 'UPDATE "reservation" SET "status" = ? WHERE "reservation_id" = ?'
    t_raw = timeit(lambda i: raw.execute(upd2, ("cancelled", 1003)), n // 4, between=raw_reset, every=1)
    rows.append(("update_reservation cancel (cascade)", t_env, t_raw))
    env.reset()

    # reset
    spec = dom.spec

    def rebuild(_):
        c = sqlite3.connect(":memory:", isolation_level=None)
        c.executescript(spec.schema_sql)
        for (t,) in c.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            c.execute(f'DROP TRIGGER "{t}"')  # a seed is loaded with the triggers off
        c.executescript(spec.seed)
        for sql in dom.trigger_sql:
            c.execute(sql)
        c.close()

    t_env = timeit(lambda i: env.reset(), n // 4)
    t_raw = timeit(rebuild, n // 20)
    rows.append(("reset (vs rebuild from DDL + seed)", t_env, t_raw))
    src = sqlite3.connect(":memory:")
    src.deserialize(dom.pristine)
    dst = sqlite3.connect(":memory:")
    t_bak = timeit(lambda i: src.backup(dst), n // 4)
    rows.append(("  (alternative: sqlite3 backup API copy)", t_bak, t_raw))

    # snapshot + state hash
    tables = list(dom.tables)
    t_env = timeit(lambda i: env.state_hash(), n // 4)
    t_raw = timeit(lambda i: [raw.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables], n // 4)
    rows.append((f"snapshot + state_hash ({sum(len(v) for v in env.snapshot().values())} rows)", t_env, t_raw))

    print(f"sqlite backend, domain airline, python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}")
    print(f"{'operation':44s} {'median us':>10s} {'p95 us':>10s} {'baseline us':>12s} {'ratio':>7s}")
    for name, te, tr in rows:
        me, pe = stats(te)
        mr, _ = stats(tr)
        print(f"{name:44s} {me:10.1f} {pe:10.1f} {mr:12.1f} {me / mr:7.3g}")
    calls = [stats(te)[0] for name, te, _ in rows[:5]]
    ok = max(calls) <= 1000.0
    print(f"target: median tool call <= 1000 us -> {'PASS' if ok else 'FAIL'} (worst median {max(calls):.1f} us)")
    env.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
