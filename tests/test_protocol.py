"""The protocol on a real SQLite file: duplicates, conflicts, leases, fencing,
rollback, the attempt budget, backoff, redrive, the journal and status.

Only the clock is modelled. Every outcome is read back through a second
connection and checked on money, effect count and states together.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA, read_back, snapshot
from observe import effects, expect, ledger, reasons, row
from queue_core import (BatchConflict, Effect, EnqueueResult, Handler, IntegrityViolation,
                        LeaseLost, ModelClock, NotRedrivable, Queue, State,
                        UnknownEvent, drain, finish, process_one)
from queue_core.sqlite import connect


def jsonl(*events: tuple[str, str, Any]) -> str:
    """JSONL text of (event_id, category, amount_cents) events."""
    return "".join(json.dumps({"event_id": event_id,
                               "payload": {"category": category, "amount_cents": amount}}) + "\n"
                   for event_id, category, amount in events)


ONE_BOOK = jsonl(("E0001", "book", 10000))


# -- duplicates and conflicts ---------------------------------------------------

def test_enqueue_stores_one_message_per_event_and_counts_the_repeat(queue: Queue,
                                                                    db_path: Path) -> None:
    result = queue.enqueue_file(DATA / "demo.jsonl")

    assert result == EnqueueResult(inserted=4, duplicates=1)
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)
    assert [r[0] for r in read_back(db_path, "SELECT event_id FROM messages ORDER BY 1")] == \
        ["E0001", "E0002", "E0003", "E0004"]
    assert row(db_path, "E0001")["payload"] == '{"amount_cents":10000,"category":"book"}'


def test_enqueueing_the_same_lines_after_processing_gives_five_duplicates_and_the_same_money(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, handler)
    before = snapshot(db_path)

    again = queue.enqueue_file(DATA / "demo.jsonl")

    assert again == EnqueueResult(inserted=0, duplicates=5)
    assert ledger(db_path) == expect(total=17000, effects=3, done=3, dead=1)
    assert snapshot(db_path) == before


@pytest.mark.parametrize("processed_first", [False, True], ids=["while-queued", "after-processing"])
def test_conflicting_batch_is_rejected_whole_and_its_new_event_is_not_added(
        queue: Queue, handler: Handler, db_path: Path, processed_first: bool) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")
    if processed_first:
        drain(queue, handler)
    before = snapshot(db_path)

    with pytest.raises(BatchConflict) as caught:
        queue.enqueue_file(DATA / "conflict.jsonl")

    assert (caught.value.code, caught.value.line, caught.value.event_id) == \
        ("batch_conflict", 2, "E0001")
    assert snapshot(db_path) == before
    assert read_back(db_path, "SELECT count(*) FROM messages WHERE event_id = 'E0005'") == [(0,)]
    assert ledger(db_path) == (expect(total=17000, effects=3, done=3, dead=1) if processed_first
                               else expect(total=0, effects=0, ready=4))


@pytest.mark.parametrize("stored, again, conflict", [
    ('{"a": 1, "b": 2}', '{"b": 2, "a": 1}', False),
    ('{"a": 1}', '{"a": 1.0}', True),
    ('{"a": 1.0}', '{"a": 1.00}', False),
    ('{"a": "x"}', '{"a": "x "}', True),
], ids=["key-order-is-a-duplicate", "int-vs-float-conflicts", "same-float-spelled-twice",
        "trailing-space-in-value-conflicts"])
def test_a_repeat_against_stored_is_judged_on_the_canonical_payload(
        queue: Queue, db_path: Path, stored: str, again: str, conflict: bool) -> None:
    queue.enqueue_jsonl(f'{{"event_id": "E0001", "payload": {stored}}}\n')
    before = snapshot(db_path)
    batch = ('{"event_id": "E0002", "payload": {}}\n'
             f'{{"event_id": "E0001", "payload": {again}}}\n')

    if conflict:
        with pytest.raises(BatchConflict) as caught:
            queue.enqueue_jsonl(batch)
        assert (caught.value.code, caught.value.line) == ("batch_conflict", 2)
        assert snapshot(db_path) == before
        assert ledger(db_path) == expect(total=0, effects=0, ready=1)
    else:
        assert queue.enqueue_jsonl(batch) == EnqueueResult(inserted=1, duplicates=1)
        assert ledger(db_path) == expect(total=0, effects=0, ready=2)


# -- the expiry boundary ----------------------------------------------------------

def test_ack_one_second_before_lease_until_is_accepted(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None and lease.lease_until == 1002
    model_clock.set(lease.lease_until - 1)

    assert queue.complete(lease, handler) == Effect("book", 10000)

    assert ledger(db_path) == expect(total=10000, effects=1, done=1)
    assert row(db_path, "E0001")["lease_until"] is None


def test_ack_when_now_equals_lease_until_is_expired_and_writes_nothing(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None
    model_clock.set(lease.lease_until)
    before = snapshot(db_path)

    with pytest.raises(LeaseLost) as caught:
        queue.complete(lease, handler)

    assert caught.value.code == "lease_expired"
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)


def test_a_claim_one_second_before_lease_until_does_not_take_the_lease_away(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    assert queue.claim() is not None
    model_clock.set(1001)

    assert queue.claim() is None

    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
    assert (row(db_path, "E0001")["generation"], row(db_path, "E0001")["lease_until"]) == (1, 1002)


def test_a_claim_when_now_equals_lease_until_recovers_it_with_the_next_generation(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    first = queue.claim()
    assert first is not None
    model_clock.set(first.lease_until)

    second = queue.claim()

    assert second is not None
    assert (second.event_id, second.generation, second.attempt, second.lease_until) == \
        ("E0001", 2, 2, 1004)
    assert queue.complete(second, handler) == Effect("book", 10000)
    assert ledger(db_path) == expect(total=10000, effects=1, done=1)
    assert [r[3] for r in reasons(db_path, "E0001")] == \
        ["enqueued", "claimed", "lease_expired", "claimed", "completed"]


# -- fencing ----------------------------------------------------------------------

def test_stale_generation_ack_is_rejected_and_writes_nothing(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    slow = queue.claim()
    model_clock.set(1002)
    fast = queue.claim()
    assert slow is not None and fast is not None and (slow.generation, fast.generation) == (1, 2)
    before = snapshot(db_path)

    with pytest.raises(LeaseLost) as caught:
        queue.complete(slow, handler)

    assert caught.value.code == "stale_generation"
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
    queue.complete(fast, handler)
    assert ledger(db_path) == expect(total=10000, effects=1, done=1)


def test_stale_generation_fail_is_rejected_and_changes_nothing(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    slow = queue.claim()
    model_clock.set(1002)
    assert queue.claim() is not None
    before = snapshot(db_path)

    for permanent in (False, True):
        with pytest.raises(LeaseLost) as caught:
            queue.fail(slow, "transient_error", permanent=permanent)
        assert caught.value.code == "stale_generation"

    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)


def test_a_lease_from_before_a_redrive_can_never_ack_even_when_attempts_is_one_again(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    old = queue.claim()
    assert old is not None and (old.generation, old.attempt) == (1, 1)
    queue.fail(old, "invalid_payload", permanent=True)
    queue.redrive("E0001")
    assert (row(db_path, "E0001")["attempts"], row(db_path, "E0001")["generation"]) == (0, 1)

    with pytest.raises(LeaseLost) as while_ready:
        queue.complete(old, handler)
    new = queue.claim()
    assert new is not None and (new.generation, new.attempt) == (2, 1)
    before = snapshot(db_path)
    with pytest.raises(LeaseLost) as after_claim:
        queue.complete(old, handler)

    assert (while_ready.value.code, after_claim.value.code) == ("not_leased", "stale_generation")
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
    queue.complete(new, handler)
    assert ledger(db_path) == expect(total=10000, effects=1, done=1)


def test_a_second_ack_of_a_done_message_is_refused_and_adds_no_money(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None
    queue.complete(lease, handler)

    with pytest.raises(LeaseLost) as caught:
        queue.complete(lease, handler)

    assert caught.value.code == "not_leased"
    assert ledger(db_path) == expect(total=10000, effects=1, done=1)


# -- failure during apply -----------------------------------------------------------

class ExplodingHandler(Handler):
    """Writes its effect, then fails before the ACK."""

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        super().apply(conn, event_id, payload)
        raise RuntimeError("the process failed after the INSERT")


class SlowHandler(Handler):
    """Writes its effect, then takes so long that the lease runs out."""

    def __init__(self, clock: ModelClock) -> None:
        super().__init__()
        self.clock = clock

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        effect = super().apply(conn, event_id, payload)
        self.clock.advance(5)
        return effect


def test_an_error_after_the_insert_rolls_the_insert_back(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None
    before = snapshot(db_path)

    with pytest.raises(RuntimeError):
        queue.complete(lease, ExplodingHandler())

    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
    assert queue.complete(lease, handler) == Effect("book", 10000)
    assert ledger(db_path) == expect(total=10000, effects=1, done=1)


def test_a_handler_that_outlives_its_lease_is_rolled_back_at_the_recheck(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None
    before = snapshot(db_path)

    with pytest.raises(LeaseLost) as caught:
        queue.complete(lease, SlowHandler(model_clock))

    assert caught.value.code == "lease_expired"
    assert model_clock.now() == 1005
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)


def test_an_effect_already_written_behind_the_protocol_is_refused_by_the_unique_key(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    conn = sqlite3.connect(db_path)  # the file's owner bypassing the protocol
    try:
        with conn:
            conn.execute("INSERT INTO effects VALUES ('E0001', 'book', 10000)")
    finally:
        conn.close()
    lease = queue.claim()
    assert lease is not None

    with pytest.raises(IntegrityViolation) as caught:
        queue.complete(lease, handler)

    assert caught.value.code == "integrity_violation"
    assert isinstance(caught.value.__cause__, sqlite3.IntegrityError)
    assert ledger(db_path) == expect(total=10000, effects=1, leased=1)


# -- the attempt budget and backoff ---------------------------------------------------

def test_three_silent_deaths_spend_the_budget_and_the_next_claim_makes_the_message_dead(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    generations = []
    for t in (1000, 1002, 1004):  # each worker dies silently holding its lease
        model_clock.set(t)
        lease = queue.claim()
        assert lease is not None
        generations.append((lease.generation, lease.attempt))
    model_clock.set(1006)

    assert queue.claim() is None

    assert generations == [(1, 1), (2, 2), (3, 3)]
    stored = row(db_path, "E0001")
    assert (stored["state"], stored["attempts"], stored["generation"], stored["last_error"],
            stored["lease_until"]) == ("dead", 3, 3, "lease_expired", None)
    assert ledger(db_path) == expect(total=0, effects=0, dead=1)
    assert reasons(db_path, "E0001")[-1] == ("leased", "dead", 3, "attempts_exhausted")


def test_transient_failures_back_off_one_then_two_seconds_and_the_third_claim_ends_dead(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    seen = []
    for t in (1000, 1001, 1003):
        model_clock.set(t)
        lease = queue.claim()
        assert lease is not None, f"nothing due at {t}"
        outcome = queue.fail(lease, "transient_error")
        seen.append((lease.attempt, outcome.kind, outcome.available_at))
        if outcome.available_at is not None:  # not due one second early
            model_clock.set(outcome.available_at - 1)
            assert queue.claim() is None

    assert seen == [(1, "retry", 1001), (2, "retry", 1003), (3, "dead", None)]
    stored = row(db_path, "E0001")
    assert (stored["state"], stored["attempts"], stored["last_error"]) == \
        ("dead", 3, "transient_error")
    assert ledger(db_path) == expect(total=0, effects=0, dead=1)


def test_a_permanent_failure_is_dead_at_once_without_spending_retries(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None

    outcome = queue.fail(lease, "invalid_payload", permanent=True)

    assert (outcome.kind, outcome.code) == ("dead", "invalid_payload")
    stored = row(db_path, "E0001")
    assert (stored["state"], stored["attempts"], stored["last_error"]) == \
        ("dead", 1, "invalid_payload")
    assert ledger(db_path) == expect(total=0, effects=0, dead=1)


def test_claims_take_due_messages_by_available_at_then_event_id(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0002", "pen", 1), ("E0001", "book", 1), ("E0003", "bag", 1)))
    first = queue.claim()
    assert first is not None and first.event_id == "E0001"
    queue.fail(first, "transient_error")  # E0001 is due again at 1001
    model_clock.set(1001)

    order = [lease.event_id for lease in iter(queue.claim, None)]

    assert order == ["E0002", "E0003", "E0001"]  # after a retry, not strict FIFO
    assert ledger(db_path) == expect(total=0, effects=0, leased=3)


# -- redrive ---------------------------------------------------------------------------

def test_redrive_after_adding_toy_support_brings_the_total_to_20000(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, handler)
    assert ledger(db_path) == expect(total=17000, effects=3, done=3, dead=1)

    queue.redrive("E0004")
    outcomes = drain(queue, handler.supporting("toy"))

    assert [(o.event_id, o.kind, o.generation) for o in outcomes] == [("E0004", "done", 2)]
    assert ledger(db_path) == expect(total=20000, effects=4, done=4)
    assert effects(db_path)["E0004"] == ("toy", 3000)


def test_redrive_without_the_fix_ends_dead_again(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, handler)

    queue.redrive("E0004")
    assert ledger(db_path) == expect(total=17000, effects=3, done=3, ready=1)
    outcomes = drain(queue, handler)

    assert [(o.event_id, o.kind, o.code) for o in outcomes] == \
        [("E0004", "dead", "invalid_payload")]
    stored = row(db_path, "E0004")
    assert (stored["attempts"], stored["generation"], stored["last_error"]) == \
        (1, 2, "invalid_payload")
    assert ledger(db_path) == expect(total=17000, effects=3, done=3, dead=1)


def _leave_in(state: str, queue: Queue, handler: Handler) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    if state == "leased":
        queue.claim()
    elif state == "done":
        process_one(queue, handler)


@pytest.mark.parametrize("state", ["ready", "leased", "done"])
def test_redrive_of_a_message_that_is_not_dead_is_refused_and_changes_nothing(
        queue: Queue, handler: Handler, db_path: Path, state: str) -> None:
    _leave_in(state, queue, handler)
    before = snapshot(db_path)

    with pytest.raises(NotRedrivable) as caught:
        queue.redrive("E0001")

    assert caught.value.code == "not_redrivable"
    assert snapshot(db_path) == before
    assert row(db_path, "E0001")["state"] == state


def test_redrive_of_an_unknown_event_is_refused_and_changes_nothing(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    before = snapshot(db_path)

    with pytest.raises(UnknownEvent) as caught:
        queue.redrive("E9999")

    assert caught.value.code == "unknown_event"
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=1)


@pytest.mark.parametrize("event_id", ["E01", "e0001", "E0001\n", "E\u0660\u0660\u0660\u0660", "",
                                      1], ids=repr)
def test_redrive_of_what_is_no_event_id_is_refused_as_input_and_changes_nothing(
        queue: Queue, handler: Handler, db_path: Path, event_id: object) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    before = snapshot(db_path)

    with pytest.raises(NotRedrivable) as caught:
        queue.redrive(event_id)  # type: ignore[arg-type]

    assert caught.value.code == "invalid_event_id"  # refused as input, as ingest refuses it
    assert "E followed by four ASCII digits" in str(caught.value)
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=1)


def test_a_lease_for_an_event_that_is_not_stored_is_refused(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None
    forged = type(lease)("E0002", lease.generation, lease.attempt, lease.lease_until)

    with pytest.raises(UnknownEvent) as caught:
        queue.complete(forged, handler)

    assert caught.value.code == "unknown_event"
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)


# -- batches of claims and ACKs --------------------------------------------------------

def test_complete_batch_fences_each_lease_on_its_own(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0001", "book", 100), ("E0002", "toy", 200)))
    stale = queue.claim_batch(1)[0]
    model_clock.set(1002)
    leases = queue.claim_batch(5)  # E0001 again (generation 2) and E0002
    assert [(lease.event_id, lease.generation) for lease in leases] == [("E0002", 1), ("E0001", 2)]

    results = queue.complete_batch([stale, *leases], handler)

    assert [getattr(r, "code", r) for r in results] == \
        ["stale_generation", "invalid_payload", Effect("book", 100)]
    assert ledger(db_path) == expect(total=100, effects=1, done=1, leased=1)


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_draining_in_batches_gives_the_same_money_and_states(
        queue: Queue, handler: Handler, db_path: Path, batch_size: int) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")

    outcomes = drain(queue, handler, batch_size=batch_size)

    assert sorted((o.event_id, o.kind) for o in outcomes) == \
        [("E0001", "done"), ("E0002", "done"), ("E0003", "done"), ("E0004", "dead")]
    assert ledger(db_path) == expect(total=17000, effects=3, done=3, dead=1)
    assert effects(db_path) == {"E0001": ("book", 10000), "E0002": ("pen", 2000),
                                "E0003": ("book", 5000)}


# -- journal, status, metrics ------------------------------------------------------------

def test_the_journal_replays_to_exactly_the_stored_states(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")
    lease = queue.claim()
    assert lease is not None
    queue.fail(lease, "transient_error")  # E0001 retries at 1001
    queue.claim()  # E0002 is left to expire
    drain(queue, handler)
    model_clock.set(1002)
    drain(queue, handler)
    queue.redrive("E0004")
    drain(queue, handler.supporting("toy"))

    journal = read_back(db_path, "SELECT event_id, from_state, to_state, generation, attempts "
                                 "FROM transitions ORDER BY seq")
    replayed: dict[str, tuple[str, int, int]] = {}
    for event_id, source, target, generation, attempts in journal:
        assert source == (replayed[event_id][0] if event_id in replayed else None)
        replayed[event_id] = (target, generation, attempts)
    stored = {event_id: (state, generation, attempts) for event_id, state, generation, attempts
              in read_back(db_path, "SELECT event_id, state, generation, attempts FROM messages")}
    assert replayed == stored
    assert ledger(db_path) == expect(total=20000, effects=4, done=4)
    assert [(t.from_state, t.to_state) for t in queue.transitions("E0002")] == [
        (None, State.READY), (State.READY, State.LEASED), (State.LEASED, State.READY),
        (State.READY, State.LEASED), (State.LEASED, State.DONE)]


def test_status_and_metrics_never_recover_an_expired_lease(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0001", "book", 100), ("E0002", "pen", 200)))
    queue.claim()
    model_clock.set(1005)
    before = snapshot(db_path)

    status = queue.status()
    metrics = queue.metrics()

    assert snapshot(db_path) == before
    assert status.as_dict() == {"states": {"ready": 1, "leased": 1, "done": 0, "dead": 0},
                                "effects": 0, "totals": {}, "total": 0, "pruned": 0, "ids": "course"}
    assert (metrics.at, dict(metrics.depth), metrics.oldest_ready_age, metrics.expired_leases) == \
        (1005, {"ready": 1, "leased": 1, "done": 0, "dead": 0}, 5, 1)
    assert ledger(db_path) == expect(total=0, effects=0, ready=1, leased=1)


def test_metrics_report_the_attempts_each_dead_message_spent(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(jsonl(("E0001", "pen", 100), ("E0002", "toy", 200)))
    assert queue.claim() is not None  # this worker dies silently
    assert process_one(queue, handler) is not None  # E0002: unknown category, dead at once
    for t in (1002, 1004):  # two more workers die silently
        model_clock.set(t)
        assert queue.claim() is not None
    model_clock.set(1006)
    assert queue.claim() is None

    metrics = queue.metrics()

    assert dict(metrics.dead_attempts) == {"E0001": 3, "E0002": 1}
    assert (metrics.at, metrics.oldest_ready_age, metrics.expired_leases) == (1006, None, 0)
    assert ledger(db_path) == expect(total=0, effects=0, dead=2)


def test_status_totals_are_per_category_and_match_the_effects(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, handler)

    status = queue.status()

    assert status.as_dict() == {"states": {"ready": 0, "leased": 0, "done": 3, "dead": 1},
                                "effects": 3, "totals": {"book": 15000, "pen": 2000},
                                "total": 17000, "pruned": 0, "ids": "course"}
    assert ledger(db_path) == expect(total=17000, effects=3, done=3, dead=1)


# -- programmer errors and connections --------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"lease_seconds": 0}, {"lease_seconds": -1}, {"lease_seconds": 1.5},
    {"lease_seconds": True}, {"max_attempts": 0}, {"synchronous": "EXTRA"},
    {"synchronous": "FULL; DROP TABLE messages"},
], ids=lambda kwargs: "-".join(f"{k}={v}" for k, v in kwargs.items()))
def test_programmer_errors_raise_value_error_before_the_database_is_touched(
        db_path: Path, model_clock: ModelClock, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Queue(db_path, clock=model_clock, **kwargs)

    assert not db_path.exists()


def test_a_non_positive_claim_limit_raises_value_error_and_changes_nothing(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    before = snapshot(db_path)

    with pytest.raises(ValueError):
        queue.claim_batch(0)

    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=1)


def test_connections_use_foreign_keys_and_full_synchronous(db_path: Path) -> None:
    Queue(db_path)
    conn = connect(db_path)
    try:
        pragmas = [conn.execute(f"PRAGMA {name}").fetchone()[0]
                   for name in ("foreign_keys", "synchronous", "journal_mode")]
    finally:
        conn.close()
    assert pragmas == [1, 2, "wal"]  # synchronous 2 is FULL


def _open_descriptors_on(folder: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:  # closed between listing and reading
            continue
    return [t for t in targets if t.startswith(str(folder))]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to list open files")
def test_every_call_closes_its_connection_so_the_folder_removes_cleanly(
        tmp_path: Path, model_clock: ModelClock, handler: Handler) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    db = folder / "queue.sqlite3"
    queue = Queue(db, clock=model_clock, lease_seconds=2)
    with sqlite3.connect(db) as leaky:  # the pitfall: the block commits, it does not close
        leaky.execute("SELECT count(*) FROM messages").fetchall()
    assert _open_descriptors_on(folder) != []  # so this check can catch a leak
    leaky.close()
    assert _open_descriptors_on(folder) == []
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, handler)
    with pytest.raises(NotRedrivable):
        queue.redrive("E0001")
    queue.redrive("E0004")
    lease = queue.claim()
    assert lease is not None
    finish(queue, lease, handler)
    queue.status(), queue.metrics(), queue.messages(), queue.effects(), queue.transitions()

    assert _open_descriptors_on(folder) == []
    assert ledger(db) == expect(total=17000, effects=3, done=3, dead=1)
    shutil.rmtree(folder)
    assert not folder.exists()


# -- the schema: a second line of defence against direct SQL ------------------------------

BAD_WRITES = {
    "unknown-state": "UPDATE messages SET state = 'paused'",
    "leased-without-deadline": "UPDATE messages SET state = 'leased', attempts = 1, generation = 1",
    "deadline-while-ready": "UPDATE messages SET lease_until = 1002",
    "negative-attempts": "UPDATE messages SET attempts = -1",
    "generation-below-attempts": "UPDATE messages SET attempts = 2, generation = 1",
    "dead-without-reason": "UPDATE messages SET state = 'dead'",
    "text-in-an-integer-column": "UPDATE messages SET available_at = 'soon'",
    "event-id-shape": "INSERT INTO messages (event_id, payload, available_at) "
                      "VALUES ('E123', '{}', 1000)",
    "payload-not-json": "INSERT INTO messages (event_id, payload, available_at) "
                        "VALUES ('E0002', '{', 1000)",
    "effect-for-unknown-event": "INSERT INTO effects VALUES ('E0009', 'book', 100)",
    "effect-amount-zero": "INSERT INTO effects VALUES ('E0001', 'book', 0)",
    "effect-amount-too-large": "INSERT INTO effects VALUES ('E0001', 'book', 10000000)",
    "second-effect-for-one-event": "INSERT INTO effects VALUES ('E0001', 'book', 1); "
                                   "INSERT INTO effects VALUES ('E0001', 'book', 1)",
}


@pytest.mark.parametrize("sql", BAD_WRITES.values(), ids=BAD_WRITES.keys())
def test_the_schema_refuses_rows_that_break_the_state_machine(
        queue: Queue, db_path: Path, sql: str) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    before = snapshot(db_path)
    conn = connect(db_path)  # foreign keys on, as every connection of the package
    try:
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.IntegrityError):
            for statement in sql.split("; "):
                conn.execute(statement)
        conn.execute("ROLLBACK")
    finally:
        conn.close()

    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=1)
