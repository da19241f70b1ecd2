"""What ``scale.py`` reads from a queue while it runs: sizes, and the claim's work.

Sizes. PostgreSQL: each table of the queue (``messages``, ``effects``,
``transitions``, ``compacted``) as ``pg_table_size`` (heap, TOAST, free
space and visibility maps) and ``pg_indexes_size``. SQLite: the file and
its ``-wal``, and the pages of tables and of indexes as ``dbstat`` counts
them.

The claim's work per claim, read without changing the queue:

- PostgreSQL: the buffers (shared hits + reads) that ``EXPLAIN (ANALYZE,
  BUFFERS)`` reports for each of the claim's two reads of candidates, in
  the words the claim itself runs them (``transitions.DUE`` and
  ``postgres.EXPIRED_READ``, each ``FOR NO KEY UPDATE SKIP LOCKED``), in a
  transaction that is rolled back: the row it locks is skipped by the
  workers for that moment, and nothing is written.
- SQLite has no per-statement page counter that Python can read; what is
  counted is the virtual machine's instructions for each of the same two
  reads (a progress handler called on every instruction), in a read
  transaction. An instruction count grows with every index entry a read
  steps over, as PostgreSQL's buffers grow with every page.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from queue_core.lab.speed import rawcommits
from queue_core.postgres.schema import EXPIRED_READ
from queue_core.sqlite import is_connection_string
from queue_core.transitions import DUE, EXPIRED

PG_TABLES = ("messages", "effects", "transitions", "compacted")


def sizes(db: str) -> dict[str, int]:
    """``{"table": bytes, "index": bytes, "file": bytes}`` of the queue now
    (PostgreSQL: ``file`` is tables and indexes together)."""
    if is_connection_string(db):
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            table, index = conn.execute(
                "SELECT sum(pg_table_size(c.oid)), sum(pg_indexes_size(c.oid)) "
                "FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace "
                "AND c.relname = ANY(%s)", (list(PG_TABLES),)).fetchone()
        return {"table": int(table), "index": int(index), "file": int(table) + int(index)}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        rows = conn.execute("SELECT s.name, sum(s.pgsize), m.type FROM dbstat s "
                            "LEFT JOIN sqlite_master m ON m.name = s.name "
                            "GROUP BY s.name").fetchall()
    finally:
        conn.close()
    table = sum(size for _, size, kind in rows if kind != "index")
    index = sum(size for _, size, kind in rows if kind == "index")
    wal = Path(f"{db}-wal")
    file = os.path.getsize(db) + (wal.stat().st_size if wal.exists() else 0)
    return {"table": table, "index": index, "file": file}


def pg_vacuum_state(db: str) -> dict[str, int]:
    """What decides the claim's buffers on PostgreSQL: ``messages``' dead row
    versions not yet vacuumed, how often autovacuum has run on it, and the pages
    of its two partial indexes (ready and done rows; leases)."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        dead, vacuums, updates, hot = conn.execute(
            "SELECT n_dead_tup, autovacuum_count + vacuum_count, n_tup_upd, n_tup_hot_upd "
            "FROM pg_stat_user_tables WHERE relid = 'messages'::regclass").fetchone()
        live, leased = conn.execute(
            "SELECT pg_relation_size('messages_live') / 8192, "
            "pg_relation_size('messages_leased') / 8192").fetchone()
    return {"dead_tuples": int(dead), "vacuums": int(vacuums), "updates": int(updates),
            "hot_updates": int(hot), "live_index_pages": int(live),
            "leased_index_pages": int(leased)}


def vacuum_test(db: str, now: int) -> dict[str, Any]:
    """The claim's buffers, then ``VACUUM messages``, then the buffers again, with
    the table's dead row versions before: if the claim's reads shrink, what they
    read was index entries of dead row versions that only a vacuum removes."""
    import time

    import psycopg

    before = {**claim_work(db, now), **pg_vacuum_state(db)}
    started = time.perf_counter()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM messages")
    seconds = time.perf_counter() - started
    return {"before": before, "after": {**claim_work(db, now), **pg_vacuum_state(db)},
            "vacuum_s": seconds}


def relations(db: str) -> dict[str, int]:
    """Bytes of each table and index of the queue, largest first."""
    if is_connection_string(db):
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT c.relname, pg_table_size(c.oid) FROM pg_class c "
                "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN "
                "('r', 'i') AND c.relname <> 'queue_core_meta'").fetchall()
    else:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
        try:
            rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        finally:
            conn.close()
    return dict(sorted(((str(name), int(size)) for name, size in rows),
                       key=lambda item: -item[1]))


def claim_work(db: str, now: int) -> dict[str, int]:
    """The claim's work for one claim at ``now``: ``{"due": n, "expired": n}``
    (PostgreSQL: buffers; SQLite: VM instructions; see the module)."""
    return _pg_buffers(db, now) if is_connection_string(db) else _sqlite_steps(db, now)


def _pg_buffers(db: str, now: int) -> dict[str, int]:
    import psycopg

    reads = {"due": (DUE, (now, now, 1)), "expired": (EXPIRED_READ, (now,))}
    found: dict[str, int] = {}
    with psycopg.connect(db) as conn:  # a transaction, rolled back on leaving
        for name, (sql, params) in reads.items():
            text = sql.replace("?", "%s") + " FOR NO KEY UPDATE SKIP LOCKED"
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text,
                                params).fetchone()[0]
            found[name] = _buffers(plan[0] if isinstance(plan, list) else json.loads(plan)[0])
        conn.rollback()
    return found


def _buffers(entry: dict[str, Any]) -> int:
    """Shared buffers hit and read by a plan: the top node's, which include
    every node below it (the init plan of ``EXPIRED_READ``'s ``min`` too)."""
    top = entry["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def _sqlite_steps(db: str, now: int) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0
    found: dict[str, int] = {}
    try:
        conn.execute("BEGIN")
        for name, sql, params in (("due", DUE, (now, now, 1)), ("expired", EXPIRED, (now,))):
            conn.execute(sql, params).fetchall()  # the statement prepared, the pages cached
            steps[0] = 0
            conn.set_progress_handler(count, 1)
            conn.execute(sql, params).fetchall()
            conn.set_progress_handler(None, 1)
            found[name] = steps[0]
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return found


def prepare_raw(db: str) -> None:
    """The table the raw commits write (``scale_worker.raw``), in the queue's
    PostgreSQL schema or a SQLite file of its own beside the queue."""
    rawcommits.prepare(db)
