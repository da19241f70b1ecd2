"""Real crashes: a separate worker process dies by ``os._exit`` at a named
point, with no ``finally`` and no Python rollback; SQLite alone decides what
survives. A fresh connection then reads the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conftest import read_back
from observe import expect, ledger, reasons, row
from queue_core import CRASH_EXIT_CODE, Effect, Handler, ModelClock, Queue, drain, process_one
from queue_core.audit import findings
from queue_core.lab.story.child import ChildResult, run_child

E0003 = '{"event_id": "E0003", "payload": {"category": "book", "amount_cents": 5000}}\n'


def crash(db_path: Path, point: str) -> ChildResult:
    result = run_child(db_path, now=1000, lease_seconds=2, crash_at=point)
    assert isinstance(result, ChildResult)
    return result


def integrity(db_path: Path) -> list[tuple]:
    return read_back(db_path, "PRAGMA integrity_check")


def test_a_worker_killed_after_its_insert_leaves_no_effect_and_the_claim_leased(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(E0003)

    child = crash(db_path, "complete.after_insert")

    assert (child.exit_code, child.crashed, child.outcomes) == (86, True, ())
    assert CRASH_EXIT_CODE == 86
    stored = row(db_path, "E0003")
    assert (stored["state"], stored["generation"], stored["attempts"], stored["lease_until"]) == \
        ("leased", 1, 1, 1002)
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
    assert integrity(db_path) == [("ok",)]
    assert [r[3] for r in reasons(db_path, "E0003")] == ["enqueued", "claimed"]


def test_after_the_crash_the_lease_expires_and_a_new_generation_adds_the_money_once(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(E0003)
    crash(db_path, "complete.after_insert")
    model_clock.set(1001)
    assert process_one(queue, handler) is None  # the dead worker's lease still holds
    model_clock.set(1002)

    outcome = process_one(queue, handler)

    assert outcome is not None
    assert (outcome.event_id, outcome.kind, outcome.generation, outcome.effect) == \
        ("E0003", "done", 2, Effect("book", 5000))
    assert ledger(db_path) == expect(total=5000, effects=1, done=1)
    assert read_back(db_path, "SELECT count(*) FROM effects WHERE event_id = 'E0003'") == [(1,)]
    assert integrity(db_path) == [("ok",)]


# Where the worker dies -> what a fresh connection finds: (state, generation, effects).
CRASH_POINTS = {
    "claim.before_commit": ("ready", 0, 0),
    "claim.after_commit": ("leased", 1, 0),
    "complete.after_begin": ("leased", 1, 0),
    "complete.after_insert": ("leased", 1, 0),
    "complete.after_recheck": ("leased", 1, 0),
    "complete.before_commit": ("leased", 1, 0),
    "complete.after_commit": ("done", 1, 1),
}


@pytest.mark.parametrize("point, found", CRASH_POINTS.items(), ids=CRASH_POINTS.keys())
def test_wherever_a_worker_dies_the_money_ends_up_added_exactly_once(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path,
        point: str, found: tuple[str, int, int]) -> None:
    queue.enqueue_jsonl(E0003)

    assert crash(db_path, point).exit_code == CRASH_EXIT_CODE

    stored = row(db_path, "E0003")
    assert (stored["state"], stored["generation"], ledger(db_path)["effects"]) == found
    assert integrity(db_path) == [("ok",)]
    model_clock.set(1002)  # any lease the dead worker held has expired
    process_one(queue, handler)
    assert ledger(db_path) == expect(total=5000, effects=1, done=1)


E0001 = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}\n'
# The worker loop's step: E0001's ACK claims E0003 in the same transaction.
# Where the worker dies -> (E0001's state, E0003's state and generation, effects).
HANDOFF_POINTS = {
    "complete_and_claim.after_insert": ("leased", "ready", 0, 0),
    "complete_and_claim.after_recheck": ("leased", "ready", 0, 0),
    "complete_and_claim.before_commit": ("leased", "ready", 0, 0),
    "complete_and_claim.after_commit": ("done", "leased", 1, 1),
}


@pytest.mark.parametrize("point, found", HANDOFF_POINTS.items(), ids=HANDOFF_POINTS.keys())
def test_a_worker_loop_killed_in_the_ack_that_claims_the_next_loses_and_doubles_nothing(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path,
        point: str, found: tuple[str, str, int, int]) -> None:
    queue.enqueue_jsonl(E0001 + E0003)

    result = run_child(db_path, now=1000, lease_seconds=2, crash_at=point, mode="drain")

    assert isinstance(result, ChildResult) and result.crashed
    first, second = row(db_path, "E0001"), row(db_path, "E0003")
    assert (first["state"], second["state"], second["generation"],
            ledger(db_path)["effects"]) == found
    assert integrity(db_path) == [("ok",)]
    model_clock.set(1002)  # every lease the dead worker held has expired
    drain(queue, handler)
    assert ledger(db_path) == expect(total=15000, effects=2, done=2)
    assert findings(db_path) == []


def test_a_fresh_connection_after_the_crash_can_write_at_once(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(E0003)
    crash(db_path, "complete.before_commit")

    conn = sqlite3.connect(db_path, timeout=0)  # no waiting: the dead worker holds no lock
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
