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


def process_one(queue: Queue, handler: Handler) -> Outcome | None:
    """Claim and finish one message; ``None`` when nothing is due now."""
    lease = queue.claim()
    return None if lease is None else finish(queue, lease, handler)


def drain(queue: Queue, handler: Handler, *, batch_size: int = 1,
          on_outcome: Callable[[Outcome], None] | None = None,
          stop: Callable[[], bool] | None = None,
          max_messages: int | None = None) -> list[Outcome]:
    """Process every message due at the queue clock's current time.

    With ``batch_size`` above 1, leases are claimed and ACKed in batches
    (``claim_batch``, ``complete_batch``); each is still fenced on its own.
    ``on_outcome`` sees each outcome as soon as it is final; ``stop`` is
    asked before each claim, and ``True`` ends the loop there (every claimed
    message has been settled by then). ``max_messages`` ends the loop once
    that many outcomes are final; no claim takes more than are left.
    """
    with queue.session():
        return _drain(queue, handler, batch_size, on_outcome, stop or _never, max_messages)


def _never() -> bool:
    return False


def _drain(queue: Queue, handler: Handler, batch_size: int,
           on_outcome: Callable[[Outcome], None] | None,
           stop: Callable[[], bool], max_messages: int | None) -> list[Outcome]:
    outcomes: list[Outcome] = []
    while not stop() and (room := _room(batch_size, max_messages, len(outcomes))) and \
            (leases := queue.claim_batch(room)):
        if batch_size == 1:
            batch = [finish(queue, leases[0], handler)]
        else:
            batch = [_settle(queue, lease, result) for lease, result
                     in zip(leases, queue.complete_batch(leases, handler))]
        for outcome in batch:
            if on_outcome is not None:
                on_outcome(outcome)
        outcomes.extend(batch)
    return outcomes


def _room(batch_size: int, max_messages: int | None, done: int) -> int:
    """How many messages the next claim may take."""
    return batch_size if max_messages is None else max(0, min(batch_size, max_messages - done))


def _settle(queue: Queue, lease: Lease, result: Effect | QueueError) -> Outcome:
    if isinstance(result, Effect):
        return Outcome(lease.event_id, "done", lease.generation, effect=result)
    if isinstance(result, InvalidPayload | TransientError):
        return _fail(queue, lease, result, permanent=isinstance(result, InvalidPayload))
    if isinstance(result, LeaseLost):
        return Outcome(lease.event_id, "lost", lease.generation, result.code, detail=result.message)
    raise result
