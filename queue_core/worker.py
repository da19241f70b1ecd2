"""A worker: claim, run the business handler, ACK or fail, until nothing is due.

This is the loop ``python -m queue_core work`` runs. It owns no protocol
logic; every step is a ``Queue`` call.
"""

from __future__ import annotations

from typing import Callable

from .errors import InvalidPayload, LeaseLost, QueueError, TransientError
from .handler import Handler
from .queue import Queue
from .values import Effect, Lease, Outcome


def finish(queue: Queue, lease: Lease, handler: Handler) -> Outcome:
    """Complete one lease, or route its failure: invalid payload dead, transient retried.

    A lost lease is reported as ``lost``, never retried by this worker.
    """
    try:
        effect = queue.complete(lease, handler)
    except InvalidPayload as exc:
        return _fail(queue, lease, exc, permanent=True)
    except TransientError as exc:
        return _fail(queue, lease, exc, permanent=False)
    except LeaseLost as exc:
        return Outcome(lease.event_id, "lost", lease.generation, exc.code, detail=exc.message)
    return Outcome(lease.event_id, "done", lease.generation, effect=effect)


def _fail(queue: Queue, lease: Lease, exc: InvalidPayload | TransientError, *,
          permanent: bool) -> Outcome:
    try:
        outcome = queue.fail(lease, exc.code, permanent=permanent)
    except LeaseLost as lost:
        return Outcome(lease.event_id, "lost", lease.generation, lost.code, detail=lost.message)
    return Outcome(outcome.event_id, outcome.kind, outcome.generation, outcome.code,
                   available_at=outcome.available_at, detail=exc.message)


def finish_and_claim(queue: Queue, lease: Lease,
                     handler: Handler) -> tuple[Outcome, Lease | None]:
    """Complete one lease and claim the next due message in the same
    transaction (``Queue.complete_and_claim``); return the outcome and the
    next lease (``None`` when nothing is due).

    A refused ACK claims nothing in that transaction: its failure is routed
    as ``finish`` routes it (the handler is not run again: this attempt has
    had its run), and the next message is then claimed on its own.
    """
    try:
        effect, following = queue.complete_and_claim(lease, handler)
    except InvalidPayload as exc:
        return _fail(queue, lease, exc, permanent=True), queue.claim()
    except TransientError as exc:
        return _fail(queue, lease, exc, permanent=False), queue.claim()
    except LeaseLost as exc:
        lost = Outcome(lease.event_id, "lost", lease.generation, exc.code, detail=exc.message)
        return lost, queue.claim()
    return Outcome(lease.event_id, "done", lease.generation, effect=effect), following


def process_one(queue: Queue, handler: Handler) -> Outcome | None:
    """Claim and finish one message; ``None`` when nothing is due now."""
    lease = queue.claim()
    return None if lease is None else finish(queue, lease, handler)


def drain(queue: Queue, handler: Handler, *, batch_size: int = 1,
          on_outcome: Callable[[Outcome], None] | None = None,
          stop: Callable[[], bool] | None = None,
          max_messages: int | None = None) -> list[Outcome]:
    """Process every message due at the queue clock's current time.

    One message at a time, each ACK claims the next due message in its own
    transaction (``finish_and_claim``): one transaction per message. With
    ``batch_size`` above 1, leases are claimed and ACKed in batches
    (``claim_batch``, ``complete_batch``); each is still fenced on its own.
    ``on_outcome`` sees each outcome as soon as it is final. ``stop`` is
    asked before each claim, the claim inside an ACK included, and after
    each message; ``max_messages`` caps how many messages are processed.
    Either way the loop ends with the message in hand finished and nothing
    else held: a message the last ACK claimed ahead is given back at once
    (``Queue.release``: ready again, its attempt not counted), as it is when
    ``on_outcome`` raises (a closed pipe). No message is left waiting for a
    lease to expire; only a crash leaves one, as it always could.
    """
    if max_messages is not None and (isinstance(max_messages, bool)
                                     or not isinstance(max_messages, int) or max_messages < 0):
        raise ValueError(f"max_messages must be a non-negative integer, got {max_messages!r}")
    stopping = stop or _never
    outcomes: list[Outcome] = []

    def room(in_hand: int) -> int | None:
        """How many more messages may be claimed with ``in_hand`` not yet settled."""
        if stopping():
            return 0
        return None if max_messages is None else max_messages - len(outcomes) - in_hand

    def report(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    with queue.session():
        if batch_size == 1:
            _one_by_one(queue, handler, room, report)
        else:
            _in_batches(queue, handler, batch_size, room, report)
    return outcomes


def _never() -> bool:
    return False


def _one_by_one(queue: Queue, handler: Handler, room: Callable[[int], int | None],
                report: Callable[[Outcome], None]) -> None:
    lease = queue.claim() if room(0) != 0 else None
    while lease is not None:
        if room(1) != 0:  # one more may follow the message in hand: the ACK claims it
            outcome, lease = finish_and_claim(queue, lease, handler)
        else:
            outcome, lease = finish(queue, lease, handler), None
        try:
            report(outcome)
        except BaseException:  # the reader went away (a closed pipe), or worse
            _give_back(queue, lease)
            raise
        if lease is not None and room(0) == 0:  # a stop came while that message was in hand
            _give_back(queue, lease)
            return


def _give_back(queue: Queue, lease: Lease | None) -> None:
    """Release a message claimed ahead and not started, so that nobody waits
    for its lease to expire."""
    if lease is not None:
        queue.release(lease)


def _in_batches(queue: Queue, handler: Handler, batch_size: int,
                room: Callable[[int], int | None], report: Callable[[Outcome], None]) -> None:
    while (left := room(0)) != 0:
        leases = queue.claim_batch(batch_size if left is None else min(batch_size, left))
        if not leases:
            return
        for lease, result in zip(leases, queue.complete_batch(leases, handler)):
            report(_settle(queue, lease, result))


def _settle(queue: Queue, lease: Lease, result: Effect | QueueError) -> Outcome:
    if isinstance(result, Effect):
        return Outcome(lease.event_id, "done", lease.generation, effect=result)
    if isinstance(result, InvalidPayload | TransientError):
        return _fail(queue, lease, result, permanent=isinstance(result, InvalidPayload))
    if isinstance(result, LeaseLost):
        return Outcome(lease.event_id, "lost", lease.generation, result.code, detail=result.message)
    raise result
