"""A worker: claim, run the business handler, ACK or fail, until nothing is due.

This is the loop ``python -m queue_core work`` runs. It owns no protocol
logic; every step is a ``Queue`` call.
"""

from __future__ import annotations

from typing import Callable

from .errors import (InvalidPayload, LeaseLost, LockTimeout, PayloadDiffers, QueueError,
                     TransientError, UnknownEvent)
from .handler import Handler
from .queue import Queue
from .values import Effect, Lease, Outcome, require_positive

# What ``drain`` tells of each lease it gave back (``None``) or found already lost.
GivenBack = Callable[[Lease, "LeaseLost | UnknownEvent | None"], None]


def finish(queue: Queue, lease: Lease, handler: Handler) -> Outcome:
    """Complete one lease, or route its failure: invalid payload dead, transient retried.

    A lost lease is reported as ``lost``, never retried by this worker; so is
    an ACK that waited past PostgreSQL's lock timeout for its message's row
    (the outcome's code says lock_timeout): another transaction is changing
    that message, and it, or the lease's expiry, settles it. A stored
    payload edited since enqueue is reported ``dead`` (the outcome's code says
    payload_differs): the ACK itself moved it there.
    """
    try:
        effect = queue.complete(lease, handler)
    except PayloadDiffers as exc:
        return _edited(lease, exc)
    except InvalidPayload as exc:
        return _fail(queue, lease, exc, permanent=True)
    except TransientError as exc:
        return _fail(queue, lease, exc, permanent=False)
    except (LeaseLost, LockTimeout) as exc:
        return Outcome(lease.event_id, "lost", lease.generation, exc.code, detail=exc.message)
    return Outcome(lease.event_id, "done", lease.generation, effect=effect)


def _edited(lease: Lease, exc: PayloadDiffers) -> Outcome:
    """The outcome of an ACK refused for an edited payload, which the ACK dead-lettered;
    a lease carrying a copy of its own (not the worker's) is the caller's error."""
    if not exc.dead_lettered:
        raise exc
    return Outcome(lease.event_id, "dead", lease.generation, exc.code, detail=exc.message)


def _fail(queue: Queue, lease: Lease, exc: InvalidPayload | TransientError, *,
          permanent: bool) -> Outcome:
    try:
        outcome = queue.fail(lease, exc.code, permanent=permanent)
    except (LeaseLost, LockTimeout) as lost:
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
    outcome, following, refused = _ack_and_claim(queue, lease, handler)
    return outcome, (queue.claim() if refused else following)


def _ack_and_claim(queue: Queue, lease: Lease,
                   handler: Handler) -> tuple[Outcome, Lease | None, bool]:
    """``finish_and_claim`` up to the refusal: the outcome, the lease the ACK
    claimed, and whether the ACK was refused (then nothing was claimed)."""
    try:
        effect, following = queue.complete_and_claim(lease, handler)
    except PayloadDiffers as exc:
        return _edited(lease, exc), None, True
    except InvalidPayload as exc:
        return _fail(queue, lease, exc, permanent=True), None, True
    except TransientError as exc:
        return _fail(queue, lease, exc, permanent=False), None, True
    except (LeaseLost, LockTimeout) as exc:
        return Outcome(lease.event_id, "lost", lease.generation, exc.code,
                       detail=exc.message), None, True
    return Outcome(lease.event_id, "done", lease.generation, effect=effect), following, False


def process_one(queue: Queue, handler: Handler) -> Outcome | None:
    """Claim and finish one message; ``None`` when nothing is due now."""
    lease = queue.claim()
    return None if lease is None else finish(queue, lease, handler)


def drain(queue: Queue, handler: Handler, *, batch_size: int = 1,
          on_outcome: Callable[[Outcome], None] | None = None,
          stop: Callable[[], bool] | None = None,
          max_messages: int | None = None,
          on_given_back: GivenBack | None = None,
          keep_outcomes: bool = True) -> list[Outcome]:
    """Process every message due at the queue clock's current time.

    One message at a time, each ACK claims the next due message in its own
    transaction (``finish_and_claim``): one transaction per message. With
    ``batch_size`` above 1, leases are claimed and ACKed in batches
    (``claim_batch``, ``complete_batch``); each is still fenced on its own,
    and every lease of a batch is settled (done, or failed as ``finish``
    fails it) before the first of its outcomes is reported.
    ``on_outcome`` sees each outcome once it is final. ``stop`` is asked
    before each claim, the claim inside an ACK included, and after each
    message; ``max_messages`` caps how many messages are processed.

    Whatever ends the loop, it ends holding no lease. A stop or the cap
    ends it with the message in hand finished; a message the last ACK
    claimed ahead is given back at once (``Queue.release``: ready again,
    its attempt not counted), as it is when ``on_outcome`` raises (a closed
    pipe). Any other exception inside an ACK (a signal's
    ``KeyboardInterrupt``, a database error, a bug in the handler) rolls
    that ACK back; its lease is given back too, then the exception goes on
    (a batch's ACK that waits past PostgreSQL's lock timeout is one of them:
    the whole batch is rolled back, and that error ends the loop).
    A lease that can no longer be given back is no error of the stop: its
    deadline passed and a claim recovered it or handed it to another worker
    meanwhile. ``on_given_back(lease, lost)`` hears of every lease given back
    (``lost`` is ``None``) or found lost so (``lost`` is the ``LeaseLost``
    that says why). Only a crash, or a connection that broke, leaves a lease
    to run out, as it always could.

    Returns every outcome, in order; with ``keep_outcomes=False`` none is
    kept (an empty list): a long run that reads each through ``on_outcome``
    (the command line's ``work``) then holds no more memory after a million
    messages than after one.
    """
    if max_messages is not None and (isinstance(max_messages, bool)
                                     or not isinstance(max_messages, int) or max_messages < 0):
        raise ValueError(f"max_messages must be a non-negative integer, got {max_messages!r}")
    require_positive("batch_size", batch_size)
    stopping = stop or _never
    notify = on_given_back or _ignore
    outcomes: list[Outcome] = []
    settled = 0

    def room(in_hand: int) -> int | None:
        """How many more messages may be claimed with ``in_hand`` not yet settled."""
        if stopping():
            return 0
        return None if max_messages is None else max_messages - settled - in_hand

    def report(outcome: Outcome) -> None:
        nonlocal settled
        settled += 1
        if keep_outcomes:
            outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    with queue.session(), queue.store.turns(queue.connection):
        if batch_size == 1:
            _one_by_one(queue, handler, room, report, notify)
        else:
            _in_batches(queue, handler, batch_size, room, report, notify)
    return outcomes


def _never() -> bool:
    return False


def _ignore(lease: Lease, lost: LeaseLost | UnknownEvent | None) -> None:
    pass


def _one_by_one(queue: Queue, handler: Handler, room: Callable[[int], int | None],
                report: Callable[[Outcome], None], notify: GivenBack) -> None:
    lease = queue.claim() if room(0) != 0 else None
    while lease is not None:
        try:
            if room(1) != 0:  # one more may follow the message in hand: the ACK claims it
                outcome, ahead, refused = _ack_and_claim(queue, lease, handler)
            else:
                outcome, ahead, refused = finish(queue, lease, handler), None, False
        except BaseException:  # the ACK was rolled back: a signal, a database error, a bug
            _give_back(queue, lease, notify, quietly=True)
            raise
        try:
            report(outcome)
        except BaseException:  # the reader went away (a closed pipe), or worse
            _give_back(queue, ahead, notify, quietly=True)
            raise
        if room(0) == 0:  # a stop came while that message was in hand, or the cap is reached
            _give_back(queue, ahead, notify)
            return
        lease = queue.claim() if refused else ahead  # a refused ACK claimed nothing


def _give_back(queue: Queue, lease: Lease | None, notify: GivenBack, *,
               quietly: bool = False) -> None:
    """Release a message claimed and not started (or whose ACK was rolled
    back), so that nobody waits for its lease to expire.

    A lease lost meanwhile is reported to ``notify``, not raised. With
    ``quietly`` (an exception is already ending the loop, and it is the one
    the caller must see) a failure to release is not raised either: that
    lease then runs out as a crashed worker's does.
    """
    if lease is None:
        return
    try:
        queue.release(lease)
    except (LeaseLost, UnknownEvent) as lost:
        notify(lease, lost)
        return
    except Exception:
        if quietly:
            return
        raise
    notify(lease, None)


def _in_batches(queue: Queue, handler: Handler, batch_size: int,
                room: Callable[[int], int | None], report: Callable[[Outcome], None],
                notify: GivenBack) -> None:
    while (left := room(0)) != 0:
        leases = queue.claim_batch(batch_size if left is None else min(batch_size, left))
        if not leases:
            return
        try:
            results = queue.complete_batch(leases, handler)
        except BaseException:  # rolled back whole: nothing of the batch was finished
            for lease in leases:
                _give_back(queue, lease, notify, quietly=True)
            raise
        outcomes, error = _settle_batch(queue, leases, results, report, notify)
        for outcome in outcomes:
            report(outcome)
        if error is not None:
            raise error


def _settle_batch(queue: Queue, leases: list[Lease], results: list[Effect | QueueError],
                  report: Callable[[Outcome], None],
                  notify: GivenBack) -> tuple[list[Outcome], QueueError | None]:
    """The outcome of every lease of an ACKed batch, each settled before any
    is reported, so that a report that fails (a closed pipe) leaves no lease
    of the batch held; and the first error that no outcome stands for (the
    schema refused an effect), raised once the outcomes are reported.

    If settling fails (a signal, the database), the rest are settled as far
    as they can be, and what is committed is reported before the exception
    goes on: every outcome reported is committed, and every one committed is
    reported unless reporting fails too.
    """
    outcomes: list[Outcome] = []
    error: QueueError | None = None
    pairs = list(zip(leases, results))
    for at, (lease, result) in enumerate(pairs):
        try:
            outcome = _settle(queue, lease, result)
        except BaseException:
            for rest in pairs[at:]:
                _settle_quietly(queue, *rest, notify)
            _report_quietly(report, [*outcomes, *(_done(lease, result) for lease, result
                                                  in pairs[at:] if isinstance(result, Effect))])
            raise
        if outcome is None:  # its ACK was rolled back alone: give the message back
            _give_back(queue, lease, notify, quietly=True)
            error = error or result  # type: ignore[assignment]
        else:
            outcomes.append(outcome)
    return outcomes, error


def _done(lease: Lease, effect: Effect) -> Outcome:
    return Outcome(lease.event_id, "done", lease.generation, effect=effect)


def _report_quietly(report: Callable[[Outcome], None], outcomes: list[Outcome]) -> None:
    try:
        for outcome in outcomes:
            report(outcome)
    except Exception:  # noqa: BLE001 - the exception that ends the loop is the one to see
        pass


def _settle(queue: Queue, lease: Lease, result: Effect | QueueError) -> Outcome | None:
    if isinstance(result, Effect):
        return _done(lease, result)
    if isinstance(result, PayloadDiffers) and result.dead_lettered:
        return _edited(lease, result)
    if isinstance(result, InvalidPayload | TransientError):
        return _fail(queue, lease, result, permanent=isinstance(result, InvalidPayload))
    if isinstance(result, LeaseLost):
        return Outcome(lease.event_id, "lost", lease.generation, result.code, detail=result.message)
    return None


def _settle_quietly(queue: Queue, lease: Lease, result: Effect | QueueError,
                    notify: GivenBack) -> None:
    """Settle one lease of a batch while an exception ends the loop; never raise."""
    try:
        if isinstance(result, InvalidPayload | TransientError):
            queue.fail(lease, result.code, permanent=isinstance(result, InvalidPayload))
        elif not (isinstance(result, Effect | LeaseLost)
                  or isinstance(result, PayloadDiffers) and result.dead_lettered):
            _give_back(queue, lease, notify, quietly=True)
    except Exception:  # noqa: BLE001 - the exception that ends the loop is the one to see
        pass
