"""Raw commits: the baseline a queue's rate is measured against.

A raw commit is one single-row ``INSERT`` in a transaction of its own,
committed as durably as the queue's ACK: on SQLite ``BEGIN IMMEDIATE`` at
``synchronous=FULL`` (the queue's own connection and transaction helper),
on PostgreSQL with ``synchronous_commit = on`` (``BEGIN``, ``INSERT`` and
``COMMIT``: three round trips, as a client writes a transaction; ``make
bench``'s raw commits are the same). ``messages per second / raw commits per
second`` (of as many clients as workers) says how much of the store's
per-transaction commit rate the protocol keeps. It is a baseline, not a
limit: a queue that commits many messages in one transaction passes it, and
the worker's step on PostgreSQL travels as one round trip.

``prepare`` creates the table (``raw``) in a SQLite file of its own or in a
PostgreSQL schema, ``committer`` opens one client, and ``raw_rate`` times
``clients`` real processes committing together (started through a gate, so
Python's start-up is not timed):

    python -m queue_core.lab.speed.rawcommits '{"location": "...", "commits": 200, "gate": "..."}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ...sqlite import connect, is_connection_string, transaction
from ..story.child import open_gate, reap, wait_at_gate

PAYLOAD = json.dumps({"amount_cents": 100, "category": "book"})  # an order's size of row
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])  # the folder that holds queue_core


def prepare(location: str) -> None:
    """Create the table the raw commits write, if it is not there yet."""
    if is_connection_string(location):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS raw (id bigint GENERATED ALWAYS AS "
                         "IDENTITY PRIMARY KEY, payload text NOT NULL)")
        return
    conn = connect(location)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, "
                     "payload TEXT NOT NULL) STRICT")
    finally:
        conn.close()


def committer(location: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """One client of ``location``: a function that makes one raw commit, and one
    that closes the connection."""
    if is_connection_string(location):
        import psycopg

        conn: Any = psycopg.connect(location, autocommit=True)
        conn.execute("SET synchronous_commit = on")

        def once() -> None:
            with conn.transaction():
                conn.execute("INSERT INTO raw (payload) VALUES (%s)", (PAYLOAD,))
        return once, conn.close
    lite = connect(location)

    def once_lite() -> None:
        with transaction(lite) as tx:
            tx.execute("INSERT INTO raw (payload) VALUES (?)", (PAYLOAD,))
    return once_lite, lite.close


def raw_rate(location: str, clients: int, commits: int = 200) -> float:
    """Raw commits per second of ``clients`` processes, each making ``commits``
    raw commits into ``location`` (``prepare`` it first), from the first
    client's first commit to the last client's last."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [_PACKAGE_PARENT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    with tempfile.TemporaryDirectory(prefix="queue_gate_") as gate:
        spec = json.dumps({"location": location, "commits": commits, "gate": gate})
        procs = [subprocess.Popen([sys.executable, "-m", __name__, spec], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(clients)]
        try:
            open_gate(gate, clients)
            answers = []
            for proc in procs:
                out, err = proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"a raw-commit client exited with {proc.returncode}: "
                                       f"{err.strip()}")
                answers.append(json.loads(out))
        finally:
            reap(procs)
    # perf_counter is the system's monotonic clock here: the clients' readings compare
    span = max(a["ended"] for a in answers) - min(a["started"] for a in answers)
    return clients * commits / span


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    once, close = committer(spec["location"])
    try:
        wait_at_gate(spec["gate"])
        started = time.perf_counter()
        for _ in range(spec["commits"]):
            once()
        ended = time.perf_counter()
    finally:
        close()
    print(json.dumps({"started": started, "ended": ended}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
