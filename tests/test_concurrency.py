"""Competing clients are real OS processes on one SQLite file: ``BEGIN
IMMEDIATE`` serialises their claims, so no event is handed out twice in one
generation and every effect is written exactly once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

from conftest import DATA, read_back
from observe import effects, expect, ledger
from queue_core import Queue
from queue_core.lab.story.child import ChildResult, collect, run_child

BOOK = '{{"event_id": "{}", "payload": {{"category": "book", "amount_cents": {}}}}}\n'


def start(db_path: Path, **options: object) -> subprocess.Popen[str]:
    proc = run_child(db_path, now=1000, lease_seconds=30, wait=False, **options)
    assert isinstance(proc, subprocess.Popen)
    return proc


def _ready(proc: subprocess.Popen[str], db_path: Path) -> bool:
    """True once the worker has the database open (or has ended: collect reports why)."""
    if proc.poll() is not None:
        return True
    try:
        return any(os.readlink(f"/proc/{proc.pid}/fd/{fd}") == str(db_path)
                   for fd in os.listdir(f"/proc/{proc.pid}/fd"))
    except OSError:  # not on Linux: start without the gate's help
        return True


def both(db_path: Path, **options: object) -> list[ChildResult]:
    """Start two workers and let them go at the same instant; wait for both.

    The test holds the write lock until both processes have opened the file,
    so neither can drain the queue before the other is ready to compete.
    """
    gate = sqlite3.connect(db_path, isolation_level=None)
    try:
        gate.execute("BEGIN IMMEDIATE")
        procs = [start(db_path, **options), start(db_path, **options)]
        deadline = time.monotonic() + 20
        while not all(_ready(proc, db_path) for proc in procs):
            assert time.monotonic() < deadline, "a worker process did not start"
            time.sleep(0.01)
        gate.execute("ROLLBACK")
    finally:
        gate.close()
    return [collect(proc) for proc in procs]


def test_two_competing_clients_never_claim_the_same_event(queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(BOOK.format("E0001", 1) + BOOK.format("E0002", 2))

    # each claims, commits its claim, and dies holding the lease
    results = both(db_path, crash_at="claim.after_commit")

    assert [result.exit_code for result in results] == [86, 86]
    claims = read_back(db_path, "SELECT event_id, generation FROM transitions "
                                "WHERE reason = 'claimed' ORDER BY event_id")
    assert claims == [("E0001", 1), ("E0002", 1)]
    assert read_back(db_path, "SELECT event_id, state, generation, attempts FROM messages "
                              "ORDER BY event_id") == [("E0001", "leased", 1, 1),
                                                       ("E0002", "leased", 1, 1)]
    assert ledger(db_path) == expect(total=0, effects=0, leased=2)


def test_two_competing_clients_for_one_event_add_its_money_once(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(BOOK.format("E0001", 7))

    results = both(db_path, mode="one")

    reported = [(o.event_id, o.kind, o.generation) for r in results for o in r.outcomes]
    assert [r.exit_code for r in results] == [0, 0]
    assert reported == [("E0001", "done", 1)]  # the other found nothing to claim
    assert ledger(db_path) == expect(total=7, effects=1, done=1)


def test_twenty_events_with_two_consumer_processes_are_each_added_exactly_once(
        queue: Queue, db_path: Path) -> None:
    lines = [json.loads(text) for text in (DATA / "twenty.jsonl").read_text().splitlines()]
    expected = {item["event_id"]: (item["payload"]["category"], item["payload"]["amount_cents"])
                for item in lines}
    assert len(expected) == 20
    queue.enqueue_file(DATA / "twenty.jsonl")

    results = both(db_path, mode="drain")

    done = Counter(o.event_id for r in results for o in r.outcomes if o.kind == "done")
    assert [r.exit_code for r in results] == [0, 0]
    assert sum(len(r.outcomes) for r in results) == 20
    assert done == Counter(list(expected))  # twenty events, each exactly once
    assert effects(db_path) == expected
    total = sum(amount for _, amount in expected.values())
    assert ledger(db_path) == expect(total=total, effects=20, done=20)
    assert read_back(db_path, "SELECT DISTINCT generation FROM messages") == [(1,)]
    claims = read_back(db_path, "SELECT count(*) FROM transitions WHERE reason = 'claimed'")
    assert claims == [(20,)]


def test_two_consumers_claiming_in_batches_still_add_each_event_once(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_file(DATA / "twenty.jsonl")

    results = both(db_path, mode="drain", batch_size=3)

    assert sorted(o.event_id for r in results for o in r.outcomes) == \
        [f"E{n:04d}" for n in range(100, 120)]
    assert ledger(db_path) == expect(total=21000, effects=20, done=20)
