"""Each transition's guard is the only check that decides it: take a condition
out of a guarded UPDATE and one of these tests fails, on either store.

A holder's write (ACK, failure, heartbeat, release) is one UPDATE whose
WHERE names the lease: still ``leased``, by the same generation, and (but
for a release, which gives up the message and asserts no right to it)
before the deadline (``transitions.HELD``). A lost lease matches no row,
and the row is read once more only to say why. Every test also checks that the refused
call changed nothing, and that the current holder still finishes.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from queue_core import Handler, Lease, LeaseLost, ModelClock, NotRedrivable, Queue
from test_stores import jsonl, seen, stored_rows

CALLS: dict[str, Callable[[Queue, Lease], Any]] = {
    "complete": lambda queue, lease: queue.complete(lease, Handler()),
    "complete_and_claim": lambda queue, lease: queue.complete_and_claim(lease, Handler()),
    "fail": lambda queue, lease: queue.fail(lease),
    "fail permanently": lambda queue, lease: queue.fail(lease, "invalid_payload", permanent=True),
    "extend": lambda queue, lease: queue.extend(lease, 30),
    "release": lambda queue, lease: queue.release(lease),
}


@pytest.fixture
def queue(store: str, model_clock: ModelClock) -> Queue:
    return Queue(store, clock=model_clock, lease_seconds=2)


def refused(call: str, queue: Queue, lease: Lease) -> str:
    with pytest.raises(LeaseLost) as lost:
        CALLS[call](queue, lease)
    return lost.value.code


@pytest.mark.parametrize("call", CALLS)
def test_a_lease_taken_over_by_another_worker_is_refused_and_its_holder_keeps_it(
        queue: Queue, model_clock: ModelClock, store: str, call: str) -> None:
    # The takeover's lease is fresh (until 1004): only the generation tells them apart.
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    stale = queue.claim()
    model_clock.advance(2)
    holder = queue.claim()
    before = stored_rows(store)

    assert (holder.generation, refused(call, queue, stale)) == (2, "stale_generation")

    assert stored_rows(store) == before
    queue.complete(holder, Handler())
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1}}


@pytest.mark.parametrize("call", CALLS)
def test_a_late_call_after_the_new_holder_finished_is_stale_not_merely_not_leased(
        queue: Queue, model_clock: ModelClock, store: str, call: str) -> None:
    # The stored row is done now: the fence must name the lease's age first,
    # since the state of a newer holder's message says nothing about this lease.
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    stale = queue.claim()
    model_clock.advance(2)
    queue.complete(queue.claim(), Handler())
    before = stored_rows(store)

    assert refused(call, queue, stale) == "stale_generation"

    assert stored_rows(store) == before
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1}}


@pytest.mark.parametrize("call", [call for call in CALLS if call != "release"])
def test_a_holder_at_its_deadline_is_refused_as_expired_and_changes_nothing(
        queue: Queue, model_clock: ModelClock, store: str, call: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100), ("E0002", "pen", 200)]))
    lease = queue.claim()
    model_clock.set(lease.lease_until)  # now == lease_until: the lease has just ended
    before = stored_rows(store)

    assert refused(call, queue, lease) == "lease_expired"

    assert stored_rows(store) == before
    assert queue.message("E0001").state == "leased"  # recovered only by a claim


@pytest.mark.parametrize("call", CALLS)
def test_a_lease_whose_message_was_already_finished_by_it_is_not_leased(
        queue: Queue, store: str, call: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    lease = queue.claim()
    queue.complete(lease, Handler())
    before = stored_rows(store)

    assert refused(call, queue, lease) == "not_leased"

    assert stored_rows(store) == before
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1}}


@pytest.mark.parametrize("state", ["ready", "leased", "done"])
def test_only_a_dead_message_is_redriven_and_a_refusal_writes_nothing(
        queue: Queue, store: str, state: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    if state != "ready":
        lease = queue.claim()
        if state == "done":
            queue.complete(lease, Handler())
    before = stored_rows(store)

    with pytest.raises(NotRedrivable):
        queue.redrive("E0001")

    assert stored_rows(store) == before


def test_a_released_message_is_due_again_at_once_and_its_attempt_is_not_counted(
        queue: Queue, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100), ("E0002", "pen", 200)]))
    first = queue.claim()

    queue.release(first)
    again = queue.claim()

    assert (again.event_id, again.generation, again.attempt) == ("E0001", 2, 1)
    assert [t.reason for t in queue.transitions("E0001")] == [
        "enqueued", "claimed", "released", "claimed"]
    queue.complete(again, Handler())
    assert refused("complete", queue, first) == "stale_generation"
    assert seen(store) == {"total": 100, "effects": 1, "states": {"ready": 1, "done": 1}}


def test_a_lease_past_its_deadline_that_no_claim_recovered_is_still_given_back_uncounted(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100), ("E0002", "pen", 200)]))
    lease = queue.claim()
    model_clock.set(lease.lease_until + 5)  # long past its deadline; nobody has claimed since

    queue.release(lease)

    assert [t.reason for t in queue.transitions("E0001")] == ["enqueued", "claimed", "released"]
    message = queue.message("E0001")
    assert (message.state, message.attempts, message.generation, message.lease_until) == \
        ("ready", 0, 1, None)
    again = queue.claim()  # due at once, in its old place, its first attempt again
    assert (again.event_id, again.generation, again.attempt) == ("E0001", 2, 1)
    assert refused("complete", queue, lease) == "stale_generation"
    queue.complete(again, Handler())
    assert seen(store) == {"total": 100, "effects": 1, "states": {"ready": 1, "done": 1}}


def test_a_lease_past_its_deadline_that_a_claim_recovered_is_no_longer_given_back(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    # The claim that recovers it makes it ready (a spent attempt) and may lease it
    # again: a late release is then refused, changing nothing, whoever holds it.
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    lease = queue.claim()
    model_clock.set(lease.lease_until)
    holder = queue.claim()
    before = stored_rows(store)

    assert (holder.generation, refused("release", queue, lease)) == (2, "stale_generation")

    assert stored_rows(store) == before
    queue.complete(holder, Handler())
    assert refused("release", queue, holder) == "not_leased"
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1}}


@pytest.mark.parametrize("edge", [("ready", "done"), ("done", "ready"), ("leased", "leased"),
                                  (None, "leased"), ("dead", "done")])
def test_the_schema_refuses_a_journal_step_that_is_no_edge_of_the_state_machine(
        queue: Queue, store: str, edge: tuple[str | None, str]) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    before = stored_rows(store)

    with pytest.raises(queue.store.integrity_errors) as refused_write:
        with queue.transaction() as conn:
            conn.execute("INSERT INTO transitions (at, event_id, from_state, to_state, "
                         "generation, attempts, reason) VALUES (1000, 'E0001', ?, ?, 0, 0, 'hand')",
                         edge)

    assert "legal_edge" in str(refused_write.value)
    assert stored_rows(store) == before
