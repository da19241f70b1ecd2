"""Batched claim and complete keep every guarantee of single-message mode.

``claim_batch(K)`` leases up to K messages in one ``BEGIN IMMEDIATE``
transaction; ``complete_batch`` ACKs many leases in one transaction, each in
its own savepoint and fenced by its own generation and deadline. A lease that
fails its checks is rejected alone; the others commit. A crash anywhere in the
batch (a real process ending by ``os._exit``) commits nothing of that
transaction. Every test checks money, effect count and states together.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import read_back, snapshot
from observe import effects, expect, ledger
from queue_core import (Effect, Handler, InvalidPayload, LeaseLost, ModelClock, Queue,
                        QueueError, drain)
from queue_core.lab.story.child import ChildResult, run_child


def jsonl(*events: tuple[str, Any, Any]) -> str:
    """JSONL text of (event_id, category, amount_cents) events."""
    return "".join(json.dumps({"event_id": event_id,
                               "payload": {"category": category, "amount_cents": amount}}) + "\n"
                   for event_id, category, amount in events)


FIVE = jsonl(("E0001", "book", 100), ("E0002", "pen", 200), ("E0003", "bag", 400),
             ("E0004", "book", 800), ("E0005", "pen", 1600))


def codes(results: list[Effect | QueueError]) -> list[Any]:
    """Each result as its error code, or the effect itself."""
    return [result.code if isinstance(result, QueueError) else result for result in results]


def journal(db_path: Path) -> list[tuple[str, str, int]]:
    """(event_id, reason, generation) of every journal row after enqueue, in order."""
    return read_back(db_path, "SELECT event_id, reason, generation FROM transitions "
                              "WHERE reason <> 'enqueued' ORDER BY seq")


# -- claim_batch ---------------------------------------------------------------

def test_claim_batch_takes_at_most_limit_messages_in_available_at_then_event_id_order(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0003", "book", 1), ("E0001", "book", 2)))
    model_clock.set(1001)
    queue.enqueue_jsonl(jsonl(("E0000", "book", 4), ("E0002", "book", 8)))

    first = queue.claim_batch(3)
    rest = queue.claim_batch(3)

    # E0003 and E0001 became available at 1000, before E0000 and E0002 (1001)
    assert [(lease.event_id, lease.generation, lease.attempt, lease.lease_until)
            for lease in first] == [("E0001", 1, 1, 1003), ("E0003", 1, 1, 1003),
                                    ("E0000", 1, 1, 1003)]
    assert [lease.event_id for lease in rest] == ["E0002"]
    assert queue.claim_batch(3) == []
    assert ledger(db_path) == expect(total=0, effects=0, leased=4)
    assert journal(db_path) == [("E0001", "claimed", 1), ("E0003", "claimed", 1),
                                ("E0000", "claimed", 1), ("E0002", "claimed", 1)]


def test_claim_batch_leaves_messages_that_are_not_yet_due(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    retried = queue.claim_batch(1)[0]
    queue.fail(retried, "transient_error")  # E0001 is due again at 1001

    leases = queue.claim_batch(10)

    assert [lease.event_id for lease in leases] == ["E0002", "E0003", "E0004", "E0005"]
    assert ledger(db_path) == expect(total=0, effects=0, ready=1, leased=4)
    model_clock.set(1001)
    assert [(lease.event_id, lease.attempt) for lease in queue.claim_batch(10)] == [("E0001", 2)]


def test_a_batch_larger_than_one_statement_takes_is_claimed_and_acked_whole_and_in_order(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    # 700 ids: more than one IN (...) list holds, so the UPDATE and the
    # fence read each run in two chunks; the order must not depend on them
    ids = [f"E{i:04d}" for i in reversed(range(700))]
    queue.enqueue_jsonl(jsonl(*((event_id, "pen", 1) for event_id in ids)))

    leases = queue.claim_batch(1000)
    results = queue.complete_batch(list(reversed(leases)), handler)

    assert [lease.event_id for lease in leases] == sorted(ids)
    assert {(lease.generation, lease.attempt, lease.lease_until) for lease in leases} == \
        {(1, 1, 1002)}
    assert results == [Effect("pen", 1)] * 700
    assert ledger(db_path) == expect(total=700, effects=700, done=700)
    assert [reason for _, reason, _ in journal(db_path)] == ["claimed"] * 700 + ["completed"] * 700


@pytest.mark.parametrize("limit", [0, -1, True, 2.0], ids=["zero", "negative", "bool", "float"])
def test_a_limit_that_is_not_a_positive_integer_is_refused_before_the_database_is_touched(
        queue: Queue, db_path: Path, limit: Any) -> None:
    queue.enqueue_jsonl(FIVE)
    before = snapshot(db_path)

    with pytest.raises(ValueError):
        queue.claim_batch(limit)

    assert snapshot(db_path) == before


# -- complete_batch: each lease fenced on its own -------------------------------

def test_a_stale_generation_inside_a_batch_is_rejected_alone_and_the_others_commit(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    old = queue.claim_batch(2)  # E0001, E0002 at generation 1, until 1002
    model_clock.set(1002)
    new = queue.claim_batch(5)  # recovers both: E0001, E0002 now generation 2
    # recovered leases are due from their old deadline, so they come last
    assert [(lease.event_id, lease.generation) for lease in new] == [
        ("E0003", 1), ("E0004", 1), ("E0005", 1), ("E0001", 2), ("E0002", 2)]

    results = queue.complete_batch([new[0], old[1], *new[1:]], handler)

    assert codes(results) == [Effect("bag", 400), "stale_generation", Effect("book", 800),
                              Effect("pen", 1600), Effect("book", 100), Effect("pen", 200)]
    assert ledger(db_path) == expect(total=3100, effects=5, done=5)
    assert read_back(db_path, "SELECT generation FROM messages WHERE event_id = 'E0002'") == [(2,)]
    completed = [row for row in journal(db_path) if row[1] == "completed"]
    assert completed == [("E0003", "completed", 1), ("E0004", "completed", 1),
                         ("E0005", "completed", 1), ("E0001", "completed", 2),
                         ("E0002", "completed", 2)]


def test_an_expired_lease_inside_a_batch_is_rejected_alone_and_the_others_commit(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    early = queue.claim_batch(1)[0]  # E0001 until 1002
    model_clock.set(1001)
    late = queue.claim_batch(4)  # E0002..E0005 until 1003
    model_clock.set(1002)  # E0001's lease has ended; nobody has claimed it again

    results = queue.complete_batch([*late[:2], early, *late[2:]], handler)

    assert codes(results) == [Effect("pen", 200), Effect("bag", 400), "lease_expired",
                              Effect("book", 800), Effect("pen", 1600)]
    assert ledger(db_path) == expect(total=3000, effects=4, done=4, leased=1)
    assert effects(db_path) == {"E0002": ("pen", 200), "E0003": ("bag", 400),
                                "E0004": ("book", 800), "E0005": ("pen", 1600)}


def test_an_invalid_payload_inside_a_batch_writes_nothing_for_it_and_drain_sends_it_dead(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0001", "book", 100), ("E0002", ["book"], 200),
                              ("E0003", "bag", True), ("E0004", "toy", 800)))
    leases = queue.claim_batch(4)

    results = queue.complete_batch(leases, handler)

    assert codes(results) == [Effect("book", 100), "invalid_payload", "invalid_payload",
                              "invalid_payload"]
    assert all(isinstance(r, InvalidPayload) for r in results[1:])
    assert ledger(db_path) == expect(total=100, effects=1, done=1, leased=3)

    for lease, result in zip(leases[1:], results[1:]):  # what drain does with them
        queue.fail(lease, result.code, permanent=True)
    assert ledger(db_path) == expect(total=100, effects=1, done=1, dead=3)


def test_drain_in_batches_routes_invalid_payloads_to_dead_and_adds_the_rest_once(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0001", "book", 100), ("E0002", ["book"], 200),
                              ("E0003", "pen", 1.0), ("E0004", "bag", 400)))

    outcomes = drain(queue, handler, batch_size=10)

    assert [(o.event_id, o.kind, o.code) for o in outcomes] == [
        ("E0001", "done", None), ("E0002", "dead", "invalid_payload"),
        ("E0003", "dead", "invalid_payload"), ("E0004", "done", None)]
    assert ledger(db_path) == expect(total=500, effects=2, done=2, dead=2)


class SlowOn(Handler):
    """A handler that takes ``seconds`` of model time on one event, as a slow
    call would: the lease may end between the INSERT and the re-check."""

    def __init__(self, clock: ModelClock, event_id: str, seconds: int) -> None:
        super().__init__()
        self.clock, self.event_id, self.seconds = clock, event_id, seconds

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        effect = super().apply(conn, event_id, payload)
        if event_id == self.event_id:
            self.clock.advance(self.seconds)
        return effect


def test_a_lease_lost_at_the_recheck_rolls_back_its_own_insert_and_only_that(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    early = queue.claim_batch(3)  # E0001..E0003 until 1002
    model_clock.set(1001)
    late = queue.claim_batch(2)  # E0004, E0005 until 1003
    slow = SlowOn(model_clock, "E0003", 1)  # finishes E0003 at 1002: its lease has ended

    results = queue.complete_batch([*early, *late], slow)

    assert codes(results) == [Effect("book", 100), Effect("pen", 200), "lease_expired",
                              Effect("book", 800), Effect("pen", 1600)]
    assert ledger(db_path) == expect(total=2700, effects=4, done=4, leased=1)
    assert "E0003" not in effects(db_path)  # its INSERT was undone by its savepoint


def test_the_same_lease_twice_in_one_batch_adds_its_effect_once(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    lease = queue.claim_batch(1)[0]

    results = queue.complete_batch([lease, lease], handler)

    assert codes(results) == [Effect("book", 100), "not_leased"]
    assert isinstance(results[1], LeaseLost)
    assert ledger(db_path) == expect(total=100, effects=1, done=1, ready=4)


def test_an_empty_batch_commits_nothing(queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    before = snapshot(db_path)

    assert queue.complete_batch([], handler) == []

    assert snapshot(db_path) == before


# -- crash mid-batch, in a real process --------------------------------------------

def crash(db_path: Path, point: str, *, after: int = 1) -> ChildResult:
    result = run_child(db_path, now=1000, lease_seconds=2, crash_at=point, mode="drain",
                       batch_size=4, crash_after=after)
    assert isinstance(result, ChildResult)
    assert result.crashed
    return result


@pytest.mark.parametrize(("point", "after"), [
    ("complete.after_begin", 1),
    ("complete.after_insert", 1),
    ("complete.after_insert", 3),  # three effects INSERTed in this transaction
    ("complete.after_recheck", 2),
    ("complete.before_commit", 1),  # all four ACKs written, not committed
])
def test_a_crash_inside_a_complete_batch_commits_nothing_of_it_and_recovery_adds_each_once(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path,
        point: str, after: int) -> None:
    queue.enqueue_jsonl(FIVE)

    child = crash(db_path, point, after=after)

    assert child.outcomes == ()
    assert ledger(db_path) == expect(total=0, effects=0, ready=1, leased=4)
    assert [reason for _, reason, _ in journal(db_path)] == ["claimed"] * 4
    model_clock.set(1002)  # the dead worker's leases end
    outcomes = drain(queue, handler, batch_size=4)
    assert sorted((o.event_id, o.kind, o.generation) for o in outcomes) == [
        ("E0001", "done", 2), ("E0002", "done", 2), ("E0003", "done", 2), ("E0004", "done", 2),
        ("E0005", "done", 1)]
    assert ledger(db_path) == expect(total=3100, effects=5, done=5)
    assert read_back(db_path, "SELECT count(*), count(DISTINCT event_id) FROM transitions "
                              "WHERE reason = 'completed'") == [(5, 5)]


def test_a_crash_inside_a_claim_batch_leases_nothing(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)

    crash(db_path, "claim.before_commit")

    assert ledger(db_path) == expect(total=0, effects=0, ready=5)
    assert journal(db_path) == []
    assert len(drain(queue, handler, batch_size=4)) == 5  # no lease to wait for
    assert ledger(db_path) == expect(total=3100, effects=5, done=5)


def test_a_crash_after_a_batch_commit_keeps_the_whole_batch_and_the_rest_is_added_once(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)

    crash(db_path, "complete.after_commit")

    assert ledger(db_path) == expect(total=1500, effects=4, done=4, ready=1)
    assert [(o.event_id, o.kind) for o in drain(queue, handler, batch_size=4)] == \
        [("E0005", "done")]
    assert ledger(db_path) == expect(total=3100, effects=5, done=5)
