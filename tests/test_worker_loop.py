"""The worker loop: each ACK claims the next message in its own transaction,
and a stop, a cap or a failed report never leaves a claimed message waiting
for its lease to expire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from observe import expect, ledger
from queue_core import Handler, ModelClock, Outcome, Queue, TransientError, drain
from queue_core.audit import findings

FIVE = "".join(json.dumps({"event_id": f"E000{i}", "payload": {"category": "book",
                                                                 "amount_cents": 100 * i}}) + "\n"
               for i in range(1, 6))


def commits_of(queue: Queue, run: callable) -> tuple[object, list[str]]:
    """What ``run`` returns, and the statements of its session that began or ended a transaction."""
    seen: list[str] = []
    with queue.session():
        assert queue.connection is not None
        queue.connection.set_trace_callback(seen.append)
        result = run()
        queue.connection.set_trace_callback(None)
    return result, [s for s in seen if s in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")]


def test_draining_n_messages_commits_n_plus_one_transactions(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)

    outcomes, statements = commits_of(queue, lambda: drain(queue, handler))

    assert [o.kind for o in outcomes] == ["done"] * 5
    # the first claim, then five ACKs each claiming the next (the last finds none)
    assert statements == ["BEGIN IMMEDIATE", "COMMIT"] * 6
    assert ledger(db_path) == expect(total=1500, effects=5, done=5)
    assert findings(db_path) == []


def test_a_cap_finishes_the_last_message_without_claiming_one_more(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)

    outcomes = drain(queue, handler, max_messages=2)

    assert [(o.event_id, o.kind) for o in outcomes] == [("E0001", "done"), ("E0002", "done")]
    assert ledger(db_path) == expect(total=300, effects=2, done=2, ready=3)
    assert [t.reason for t in queue.transitions("E0003")] == ["enqueued"]
    assert findings(db_path) == []


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_loop_that_keeps_no_outcome_reports_each_once_and_still_stops_at_its_cap(
        queue: Queue, handler: Handler, db_path: Path, batch_size: int) -> None:
    queue.enqueue_jsonl(FIVE)
    seen: list[Outcome] = []

    kept = drain(queue, handler, batch_size=batch_size, max_messages=4, keep_outcomes=False,
                 on_outcome=seen.append)

    assert kept == []  # nothing held: ``queue-core work`` over a million messages
    assert [(o.event_id, o.kind) for o in seen] == [(f"E000{i}", "done") for i in range(1, 5)]
    assert ledger(db_path) == expect(total=1000, effects=4, done=4, ready=1)
    assert findings(db_path) == []


@pytest.mark.parametrize("batch_size", [1, 10])
def test_a_cap_of_zero_claims_nothing_and_a_cap_below_the_batch_claims_only_what_is_left(
        queue: Queue, handler: Handler, db_path: Path, batch_size: int) -> None:
    queue.enqueue_jsonl(FIVE)

    assert drain(queue, handler, max_messages=0, batch_size=batch_size) == []
    assert len(drain(queue, handler, max_messages=4, batch_size=batch_size)) == 4

    assert ledger(db_path) == expect(total=1000, effects=4, done=4, ready=1)


@pytest.mark.parametrize("cap", [-1, True, 1.5, "2"])
def test_a_cap_that_is_not_a_count_is_a_value_error_before_any_claim(
        queue: Queue, handler: Handler, db_path: Path, cap: object) -> None:
    queue.enqueue_jsonl(FIVE)

    with pytest.raises(ValueError):
        drain(queue, handler, max_messages=cap)  # type: ignore[arg-type]

    assert ledger(db_path) == expect(total=0, effects=0, ready=5)


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "2"])
def test_a_batch_size_that_is_not_a_positive_count_is_named_before_any_claim(
        queue: Queue, handler: Handler, db_path: Path, size: object) -> None:
    # 0 was refused by claim_batch, as "limit must be a positive integer", a name the
    # caller never gave; True ran one message at a time
    queue.enqueue_jsonl(FIVE)

    with pytest.raises(ValueError, match=f"^batch_size must be a positive integer, got {size!r}$"):
        drain(queue, handler, batch_size=size)  # type: ignore[arg-type]

    assert ledger(db_path) == expect(total=0, effects=0, ready=5)


def test_a_stop_asked_for_during_a_message_finishes_it_and_gives_back_the_one_claimed_ahead(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    done: list[Outcome] = []

    # as a signal arriving while E0001 is in hand: its ACK has already claimed E0002
    outcomes = drain(queue, handler, on_outcome=done.append, stop=lambda: len(done) >= 1)

    assert [o.event_id for o in outcomes] == ["E0001"]
    assert ledger(db_path) == expect(total=100, effects=1, done=1, ready=4)
    assert [t.reason for t in queue.transitions("E0002")] == ["enqueued", "claimed", "released"]
    assert findings(db_path) == []


def test_a_report_that_fails_gives_the_message_claimed_ahead_back_at_once(
        queue: Queue, handler: Handler, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)

    def closed_pipe(outcome: Outcome) -> None:
        raise BrokenPipeError("the reader went away")

    with pytest.raises(BrokenPipeError):
        drain(queue, handler, on_outcome=closed_pipe)

    # E0001 is done; E0002, claimed by that ACK, is ready again with no attempt spent
    assert ledger(db_path) == expect(total=100, effects=1, done=1, ready=4)
    assert [t.reason for t in queue.transitions("E0002")] == ["enqueued", "claimed", "released"]
    assert queue.message("E0002").attempts == 0
    assert len(drain(queue, handler)) == 4  # at the same model second: nothing waits
    assert ledger(db_path) == expect(total=1500, effects=5, done=5)
    assert findings(db_path) == []


def test_a_refused_ack_claims_nothing_in_its_transaction_and_the_loop_goes_on(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE.replace('"book", "amount_cents": 200', '"toy", "amount_cents": 200'))

    outcomes = drain(queue, Handler())

    assert [(o.event_id, o.kind) for o in outcomes] == [
        ("E0001", "done"), ("E0002", "dead"), ("E0003", "done"), ("E0004", "done"),
        ("E0005", "done")]
    assert ledger(db_path) == expect(total=1300, effects=4, done=4, dead=1)
    assert findings(db_path) == []


class CountingHandler(Handler):
    """Counts its runs per event, and fails E0002's first run transiently."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, int] = {}

    def apply(self, conn, event_id, payload):  # type: ignore[no-untyped-def]
        self.runs[event_id] = self.runs.get(event_id, 0) + 1
        if event_id == "E0002" and self.runs[event_id] == 1:
            raise TransientError("the payment service is busy")
        return super().apply(conn, event_id, payload)


def test_the_handler_runs_once_per_attempt_also_when_the_ack_that_claims_is_refused(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(FIVE)
    handler = CountingHandler()

    first = drain(queue, handler)
    model_clock.advance(1)  # E0002's backoff after its first attempt
    second = drain(queue, handler)

    assert [(o.event_id, o.kind) for o in first] == [
        ("E0001", "done"), ("E0002", "retry"), ("E0003", "done"), ("E0004", "done"),
        ("E0005", "done")]
    assert [(o.event_id, o.kind, o.generation) for o in second] == [("E0002", "done", 2)]
    assert handler.runs == {"E0001": 1, "E0002": 2, "E0003": 1, "E0004": 1, "E0005": 1}
    assert ledger(db_path) == expect(total=1500, effects=5, done=5)
    assert findings(db_path) == []
