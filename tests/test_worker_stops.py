"""Every way ``drain`` ends leaves no lease held, on both stores: a report that
fails in the middle of a batch, an interrupt inside an ACK, a stop that finds
the message it claimed ahead already lost. Each test checks money, effects,
states and the journal together, and that a later drain finishes the rest."""

from __future__ import annotations

from typing import Any

import pytest

from queue_core import Handler, Lease, ModelClock, Outcome, Queue, drain
from test_stores import jsonl, seen

BOOKS = [(f"E000{i}", "book", 100 * i) for i in range(1, 6)]


@pytest.fixture
def queue(store: str, model_clock: ModelClock) -> Queue:
    return Queue(store, clock=model_clock, lease_seconds=2)


def reasons(queue: Queue, event_id: str) -> list[str]:
    return [t.reason for t in queue.transitions(event_id)]


def closed_pipe(outcome: Outcome) -> None:
    raise BrokenPipeError("the reader went away")


def test_a_report_that_fails_in_a_batch_leaves_no_lease_of_the_batch_held(
        queue: Queue, store: str) -> None:
    # One book and nine toys: the batch's ACK commits E0001 and refuses the toys;
    # every toy is settled (dead, as the old handler must) before the first report.
    toys = [(f"E00{i:02d}", "toy", 100) for i in range(2, 11)]
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100), *toys]))

    with pytest.raises(BrokenPipeError):
        drain(queue, Handler(), batch_size=10, on_outcome=closed_pipe)

    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1, "dead": 9}}
    assert {m.event_id: (m.state, m.attempts, m.last_error) for m in queue.messages()
            if m.state == "dead"} == {e: ("dead", 1, "invalid_payload") for e, _, _ in toys}
    assert drain(queue, Handler().supporting("toy"), batch_size=10) == []  # nothing held back


def test_a_report_that_fails_in_a_batch_of_retries_gives_each_its_backoff_not_a_lost_lease(
        queue: Queue, store: str, model_clock: ModelClock) -> None:
    class Busy(Handler):
        def apply(self, conn: Any, event_id: str, payload: dict[str, Any]) -> Any:
            from queue_core import TransientError
            if event_id != "E0001":
                raise TransientError("the payment service is busy")
            return super().apply(conn, event_id, payload)

    queue.enqueue_jsonl(jsonl(BOOKS))

    with pytest.raises(BrokenPipeError):
        drain(queue, Busy(), batch_size=5, on_outcome=closed_pipe)

    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1, "ready": 4}}
    assert {m.event_id: (m.attempts, m.available_at, m.last_error) for m in queue.messages()
            if m.state == "ready"} == {e: (1, 1001, "transient_error") for e, _, _ in BOOKS[1:]}
    model_clock.advance(1)
    assert len(drain(queue, Handler(), batch_size=5)) == 4
    assert seen(store) == {"total": 1500, "effects": 5, "states": {"done": 5}}


class Interrupted(Handler):
    """Ctrl-C in a notebook arrives inside the handler of the third message."""

    def apply(self, conn: Any, event_id: str, payload: dict[str, Any]) -> Any:
        if event_id == "E0003":
            raise KeyboardInterrupt
        return super().apply(conn, event_id, payload)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_an_interrupt_inside_an_ack_rolls_it_back_and_gives_its_message_back(
        queue: Queue, store: str, batch_size: int) -> None:
    queue.enqueue_jsonl(jsonl(BOOKS))

    with pytest.raises(KeyboardInterrupt):
        drain(queue, Interrupted(), batch_size=batch_size)

    # one by one, E0003 is in hand; in batches of two, E0003 and E0004 share the ACK
    given_back = ["E0003"] if batch_size == 1 else ["E0003", "E0004"]
    assert seen(store) == {"total": 300, "effects": 2, "states": {"done": 2, "ready": 3}}
    for event_id in given_back:
        assert reasons(queue, event_id) == ["enqueued", "claimed", "released"]
        assert queue.message(event_id).attempts == 0
    assert len(drain(queue, Handler(), batch_size=batch_size)) == 3  # at once: nothing waits
    assert seen(store) == {"total": 1500, "effects": 5, "states": {"done": 5}}


def held_up_past_the_deadline(queue: Queue, model_clock: ModelClock, *,
                               taken_over: bool) -> tuple[list[Outcome], list[Lease]]:
    """Drain E0001 and E0002, held up while reporting E0001 (E0002 claimed ahead)
    until past E0002's deadline, when (``taken_over``) another worker's claim takes
    E0002; then the stop comes."""
    queue.enqueue_jsonl(jsonl(BOOKS[:2]))
    other = Queue(queue.path, clock=model_clock, lease_seconds=2)
    taken: list[Lease] = []

    def held_up(outcome: Outcome) -> None:
        model_clock.advance(5)
        if taken_over:
            taken.append(other.claim())

    outcomes = drain(queue, Handler(), on_outcome=held_up, stop=lambda: model_clock.now() > 1000)
    return outcomes, taken


def test_a_stop_that_finds_the_message_claimed_ahead_taken_over_is_no_error(
        queue: Queue, store: str, model_clock: ModelClock) -> None:
    outcomes, taken = held_up_past_the_deadline(queue, model_clock, taken_over=True)

    assert [(o.event_id, o.kind) for o in outcomes] == [("E0001", "done")]
    assert [(lease.event_id, lease.generation) for lease in taken] == [("E0002", 2)]
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1, "leased": 1}}
    queue.complete(taken[0], Handler())
    assert reasons(queue, "E0002") == ["enqueued", "claimed", "lease_expired", "claimed",
                                       "completed"]
    assert seen(store) == {"total": 300, "effects": 2, "states": {"done": 2}}


def test_a_stop_after_the_deadline_of_the_message_claimed_ahead_still_gives_it_back(
        queue: Queue, store: str, model_clock: ModelClock) -> None:
    # Nobody claimed it: it is given back, its attempt not counted, instead of
    # waiting for a claim that would count an attempt it never had.
    outcomes, _ = held_up_past_the_deadline(queue, model_clock, taken_over=False)

    assert [(o.event_id, o.kind) for o in outcomes] == [("E0001", "done")]
    assert reasons(queue, "E0002") == ["enqueued", "claimed", "released"]
    assert (queue.message("E0002").state, queue.message("E0002").attempts) == ("ready", 0)
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1, "ready": 1}}
    assert [(o.event_id, o.generation) for o in drain(queue, Handler())] == [("E0002", 2)]
    assert seen(store) == {"total": 300, "effects": 2, "states": {"done": 2}}


@pytest.mark.parametrize("taken_over, heard", [(False, ("E0002", 1, None)),
                                               (True, ("E0002", 1, "stale_generation"))])
def test_on_given_back_hears_each_lease_given_back_or_found_lost(
        queue: Queue, store: str, model_clock: ModelClock, taken_over: bool,
        heard: tuple[str, int, str | None]) -> None:
    queue.enqueue_jsonl(jsonl(BOOKS[:2]))
    other = Queue(store, clock=model_clock, lease_seconds=2)
    said: list[tuple[str, int, str | None]] = []

    def held_up(outcome: Outcome) -> None:
        model_clock.advance(5)
        if taken_over:
            other.claim()

    drain(queue, Handler(), on_outcome=held_up, stop=lambda: model_clock.now() > 1000,
          on_given_back=lambda lease, lost: said.append(
              (lease.event_id, lease.generation, None if lost is None else lost.code)))

    assert said == [heard]
