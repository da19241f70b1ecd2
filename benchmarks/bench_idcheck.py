"""What the event id's CHECK costs per UPDATE, for each id rule, on both stores.

A queue's id rule (``queue_core.ids``) is a CHECK on ``messages.event_id``.
The two stores pay for it differently:

- SQLite evaluates a CHECK again only when an UPDATE changes a column the
  CHECK names, so a state change (every claim and ACK) never re-checks the
  id: its cost is paid once, at enqueue.
- PostgreSQL evaluates every CHECK of the table on every new version of a
  row, so the id's regex runs on each claim and ACK.

Each case is a scratch table with the engine's id CHECK text for one rule
(``ids.sql_check``), or none, and ``ROWS`` rows of ids of that rule's
shape; one statement updates the state column of every row, and the time
per row is the median of ``REPEATS`` runs, the three tables interleaved.
The figure is what the CHECK adds to an UPDATE, in microseconds: the
median with the CHECK minus the median without it. On SQLite the same is
measured for an UPDATE that writes ``event_id`` too, where the CHECK does
run, to show what a re-check would cost.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from queue_core.ids import COURSE, GENERAL, sql_check

ROWS = 5_000          # the course rule holds at most 10,000 ids
REPEATS = 9
RULES = (COURSE, GENERAL, None)


def _ids(rule: str | None) -> list[str]:
    if rule == COURSE:
        return [f"E{i:04d}" for i in range(ROWS)]
    return [str(uuid.UUID(int=i)) for i in range(ROWS)]  # general ids, and the no-CHECK table's


def _name(rule: str | None) -> str:
    return f"ids_{rule or 'none'}"


def sqlite_costs(workdir: Path) -> dict[str, float]:
    """Microseconds the CHECK adds per UPDATE on SQLite: ``{rule: us}`` for a
    state change and ``{rule + "_id_written": us}`` for an UPDATE writing the id."""
    conn = sqlite3.connect(workdir / "idcheck.sqlite3", isolation_level=None)
    try:
        for rule in RULES:
            check = f"CHECK ({sql_check(rule, 'sqlite')})" if rule else ""
            conn.execute(f"CREATE TABLE {_name(rule)} (event_id TEXT PRIMARY KEY {check}, "
                         "state TEXT NOT NULL) STRICT")
            conn.executemany(f"INSERT INTO {_name(rule)} VALUES (?, 'ready')",
                             ((i,) for i in _ids(rule)))
        per_row: dict[str, list[float]] = {}
        for _ in range(REPEATS):
            for rule in RULES:
                for kind, sets in (("state", "state = CASE state WHEN 'ready' THEN 'leased' "
                                             "ELSE 'ready' END"),
                                   ("id_written", "event_id = event_id, state = state")):
                    started = time.perf_counter()
                    conn.execute(f"UPDATE {_name(rule)} SET {sets}")
                    per_row.setdefault(f"{rule}:{kind}", []).append(
                        (time.perf_counter() - started) / ROWS * 1e6)
    finally:
        conn.close()
    return _added(per_row, ("state", "id_written"))


def postgres_costs(dsn: str) -> dict[str, float]:
    """Microseconds the CHECK adds per UPDATE on PostgreSQL (a state change),
    ``{rule: us}``, in a fresh schema of ``dsn``'s server, dropped afterwards."""
    import psycopg

    from queue_core.lab.servers.postgres_server import drop_schema, fresh_schema

    db = fresh_schema(dsn, "queue_idcheck")
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            for rule in RULES:
                check = f"CHECK ({sql_check(rule, 'postgresql')})" if rule else ""
                conn.execute(f"CREATE TABLE {_name(rule)} (event_id text PRIMARY KEY {check}, "
                             "state text NOT NULL)")
                with conn.cursor() as cursor:
                    cursor.executemany(f"INSERT INTO {_name(rule)} VALUES (%s, 'ready')",
                                       [(i,) for i in _ids(rule)])
                conn.execute(f"VACUUM ANALYZE {_name(rule)}")
            per_row: dict[str, list[float]] = {}
            for _ in range(REPEATS):
                for rule in RULES:
                    started = time.perf_counter()
                    conn.execute(f"UPDATE {_name(rule)} SET state = CASE state WHEN 'ready' "
                                 "THEN 'leased' ELSE 'ready' END")
                    per_row.setdefault(f"{rule}:state", []).append(
                        (time.perf_counter() - started) / ROWS * 1e6)
                    conn.execute(f"VACUUM {_name(rule)}")  # every run on the same few pages
    finally:
        drop_schema(db)
    return _added(per_row, ("state",))


def _added(per_row: dict[str, list[float]], kinds: tuple[str, ...]) -> dict[str, Any]:
    """Each rule's median minus the no-CHECK table's, per kind of UPDATE; and the
    no-CHECK table's own median (``none``), for scale."""
    out: dict[str, Any] = {}
    for kind in kinds:
        bare = statistics.median(per_row[f"None:{kind}"])
        suffix = "" if kind == "state" else f"_{kind}"
        out[f"none{suffix}"] = bare
        for rule in (COURSE, GENERAL):
            out[f"{rule}{suffix}"] = statistics.median(per_row[f"{rule}:{kind}"]) - bare
    return out


def lines(costs: dict[str, dict[str, float]]) -> list[str]:
    """The report's lines: what each rule's CHECK adds per UPDATE, per store."""
    said = ["The event id's CHECK, per UPDATE (the table's other work, for scale, in brackets):"]
    if "sqlite" in costs:
        s = costs["sqlite"]
        said.append(f"  SQLite, a state change: course {s['course']:+.2f} us, general "
                    f"{s['general']:+.2f} us [{s['none']:.2f} us]: not evaluated, the id "
                    "is not written")
        said.append(f"  SQLite, an UPDATE that writes the id: course {s['course_id_written']:+.2f}"
                    f" us, general {s['general_id_written']:+.2f} us "
                    f"[{s['none_id_written']:.2f} us]")
    if "postgres" in costs:
        p = costs["postgres"]
        said.append(f"  PostgreSQL, a state change: course {p['course']:+.2f} us, general "
                    f"{p['general']:+.2f} us [{p['none']:.2f} us]: every CHECK runs on "
                    "every row version")
    return said
