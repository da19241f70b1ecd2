"""Deliberately BROKEN protocols, kept only as teaching contrasts.

Never use these to process real events. Each one removes one safeguard of
``Queue.complete`` so that the crash sweep (``queue_core.sweep``) can show
what that safeguard buys:

``mark_then_write``      marks the message ``done``, commits, THEN writes the
                         effect in a second transaction: a crash between the
                         two loses the money.
``write_then_mark``      writes the effect, commits, THEN marks ``done`` in a
                         second transaction: a crash between the two leaves
                         the message leased, its lease expires, and the next
                         worker writes the effect again: the money doubles.
``no_generation_check``  the real single transaction, but the fence checks
                         only the state and the deadline stored in the row,
                         not the lease's generation: a worker whose lease
                         expired can finish (or fail) a message that has
                         since been handed to another worker.

The two split-transaction protocols write their effects to ``naive_ledger``,
a table with no unique key on ``event_id``, as an ordinary counter or ledger
has. The real ``effects`` table's primary key is a second line of defence,
not a replacement for the protocol: leaving it out shows what the protocol
alone guarantees. All protocols share the real ``Queue.claim``; each passes
through the same named crash points as far as they apply (``points``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Callable

from .crashpoints import crash_point
from .errors import IntegrityViolation, InvalidPayload, LeaseLost, TransientError
from .handler import Handler
from .queue import Queue, _journal, backoff_seconds
from .storage import connect, transaction
from .values import Effect, Lease, Outcome, State
from .worker import drain as real_drain

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS naive_ledger (
    seq          INTEGER PRIMARY KEY,
    event_id     TEXT NOT NULL,
    category     TEXT NOT NULL,
    amount_cents INTEGER NOT NULL
) STRICT
"""

CLAIM_POINTS = ("claim.after_begin", "claim.after_select", "claim.before_commit",
                "claim.after_commit")
FAIL_POINTS = ("fail.after_begin", "fail.before_commit", "fail.after_commit")


@dataclass(frozen=True)
class Protocol:
    """How a worker finishes a lease: ``complete`` (the ACK) and ``fail``."""

    name: str
    complete: Callable[[Queue, Lease, Handler], Effect]
    fail: Callable[[Queue, Lease, str, bool], Outcome]
    points: tuple[str, ...]
    broken: bool


def _real_complete(queue: Queue, lease: Lease, handler: Handler) -> Effect:
    return queue.complete(lease, handler)


def _real_fail(queue: Queue, lease: Lease, code: str, permanent: bool) -> Outcome:
    return queue.fail(lease, code, permanent=permanent)


def create_ledger(path: str | os.PathLike[str]) -> None:
    """Create ``naive_ledger`` (no unique key) beside the queue's tables."""
    conn = connect(path)
    try:
        with transaction(conn):
            conn.execute(LEDGER_SCHEMA)
    finally:
        conn.close()


# -- mark, then write (loses money) ------------------------------------------

def _mark_then_write(queue: Queue, lease: Lease, handler: Handler) -> Effect:
    """BROKEN: the ACK commits before the effect is written."""
    with queue._tx() as conn:
        crash_point("complete.after_begin")
        effect = _effect(conn, queue, lease, handler)  # validate first, as a careful naive worker would
        _mark_done(conn, queue, lease)
        crash_point("complete.before_commit")
    crash_point("complete.between_transactions")
    with queue._tx() as conn:
        _write_ledger(conn, lease.event_id, effect)
        crash_point("complete.after_insert")
    crash_point("complete.after_commit")
    return effect


# -- write, then mark (doubles money) ----------------------------------------

def _write_then_mark(queue: Queue, lease: Lease, handler: Handler) -> Effect:
    """BROKEN: the effect commits before the ACK, in a separate transaction."""
    with queue._tx() as conn:
        crash_point("complete.after_begin")
        effect = _effect(conn, queue, lease, handler)
        _write_ledger(conn, lease.event_id, effect)
        crash_point("complete.after_insert")
    crash_point("complete.between_transactions")
    with queue._tx() as conn:
        queue._fenced(conn, lease)
        _mark_done(conn, queue, lease)
        crash_point("complete.before_commit")
    crash_point("complete.after_commit")
    return effect


def _effect(conn: sqlite3.Connection, queue: Queue, lease: Lease, handler: Handler) -> Effect:
    payload = queue._fenced(conn, lease)
    fault = getattr(handler, "inject_fault", None)  # transient faults of a stress handler
    if fault is not None:
        fault(conn, lease.event_id)
    return handler.effect_of(json.loads(payload))


def _write_ledger(conn: sqlite3.Connection, event_id: str, effect: Effect) -> None:
    conn.execute("INSERT INTO naive_ledger (event_id, category, amount_cents) VALUES (?, ?, ?)",
                 (event_id, effect.category, effect.amount_cents))


def _mark_done(conn: sqlite3.Connection, queue: Queue, lease: Lease) -> None:
    conn.execute("UPDATE messages SET state = 'done', lease_until = NULL "
                 "WHERE event_id = ? AND state = 'leased' AND generation = ?",
                 (lease.event_id, lease.generation))
    _journal(conn, [(queue.clock.now(), lease.event_id, State.LEASED, State.DONE,
                     lease.generation, lease.attempt, "completed")])


# -- the real transaction without the generation check ------------------------

def _unfenced(conn: sqlite3.Connection, queue: Queue, lease: Lease) -> str:
    """BROKEN fence: state and stored deadline only; the generation is ignored."""
    state, lease_until, payload = conn.execute(
        "SELECT state, lease_until, payload FROM messages WHERE event_id = ?",
        (lease.event_id,)).fetchone()
    if state != State.LEASED:
        raise LeaseLost("not_leased", f"{lease.event_id} is {state}", event_id=lease.event_id)
    if lease_until <= queue.clock.now():  # the deadline of whoever holds it NOW
        raise LeaseLost("lease_expired", f"{lease.event_id} expired", event_id=lease.event_id)
    return str(payload)


def _complete_without_generation(queue: Queue, lease: Lease, handler: Handler) -> Effect:
    """BROKEN: one transaction, but any worker that once held the lease may ACK."""
    with queue._tx() as conn:
        crash_point("complete.after_begin")
        payload = _unfenced(conn, queue, lease)
        try:
            effect = handler.apply(conn, lease.event_id, json.loads(payload))
        except sqlite3.IntegrityError as exc:
            raise IntegrityViolation(f"{lease.event_id}: {exc}") from exc
        crash_point("complete.after_insert")
        _unfenced(conn, queue, lease)
        crash_point("complete.after_recheck")
        conn.execute("UPDATE messages SET state = 'done', lease_until = NULL "
                     "WHERE event_id = ? AND state = 'leased'", (lease.event_id,))
        _journal(conn, [(queue.clock.now(), lease.event_id, State.LEASED, State.DONE,
                         lease.generation, lease.attempt, "completed")])
        crash_point("complete.before_commit")
    crash_point("complete.after_commit")
    return effect


def _fail_without_generation(queue: Queue, lease: Lease, code: str, permanent: bool) -> Outcome:
    """BROKEN: a stale worker's failure report overrides the current holder."""
    with queue._tx() as conn:
        crash_point("fail.after_begin")
        _unfenced(conn, queue, lease)
        now = queue.clock.now()
        dead = permanent or lease.attempt >= queue.max_attempts
        to, at = ("dead", now) if dead else ("ready", now + backoff_seconds(lease.attempt))
        conn.execute("UPDATE messages SET state = ?, lease_until = NULL, available_at = ?, "
                     "last_error = ? WHERE event_id = ? AND state = 'leased'",
                     (to, at, code, lease.event_id))
        _journal(conn, [(now, lease.event_id, State.LEASED, State(to), lease.generation,
                         lease.attempt, code if permanent or not dead else "attempts_exhausted")])
        crash_point("fail.before_commit")
    crash_point("fail.after_commit")
    if dead:
        return Outcome(lease.event_id, "dead", lease.generation, code)
    return Outcome(lease.event_id, "retry", lease.generation, code, available_at=at)


REAL = Protocol("protocol", _real_complete, _real_fail, CLAIM_POINTS + (
    "complete.after_begin", "complete.after_insert", "complete.after_recheck",
    "complete.before_commit", "complete.after_commit") + FAIL_POINTS, broken=False)
_SPLIT_POINTS = CLAIM_POINTS + (
    "complete.after_begin", "complete.after_insert", "complete.before_commit",
    "complete.between_transactions", "complete.after_commit") + FAIL_POINTS
MARK_THEN_WRITE = Protocol("mark then write", _mark_then_write, _real_fail, _SPLIT_POINTS, True)
WRITE_THEN_MARK = Protocol("write then mark", _write_then_mark, _real_fail, _SPLIT_POINTS, True)
NO_GENERATION_CHECK = Protocol("no generation check", _complete_without_generation,
                               _fail_without_generation, REAL.points, broken=True)
PROTOCOLS = {p.name: p for p in (REAL, MARK_THEN_WRITE, WRITE_THEN_MARK, NO_GENERATION_CHECK)}


def protocol(name: str) -> Protocol:
    """The protocol called ``name``; raises ``ValueError`` for an unknown one."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}") from None


def finish(proto: Protocol, queue: Queue, lease: Lease, handler: Handler) -> Outcome:
    """``worker.finish`` with ``proto``'s complete and fail."""
    try:
        effect = proto.complete(queue, lease, handler)
    except (InvalidPayload, TransientError) as exc:
        try:
            failed = proto.fail(queue, lease, exc.code, isinstance(exc, InvalidPayload))
        except LeaseLost as lost:
            return Outcome(lease.event_id, "lost", lease.generation, lost.code)
        return Outcome(failed.event_id, failed.kind, failed.generation, failed.code,
                       available_at=failed.available_at)
    except LeaseLost as exc:
        return Outcome(lease.event_id, "lost", lease.generation, exc.code)
    return Outcome(lease.event_id, "done", lease.generation, effect=effect)


def drain(queue: Queue, handler: Handler, proto: Protocol = REAL,
          on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Process every message due now with ``proto`` (the real worker for ``REAL``)."""
    if proto is REAL:
        return real_drain(queue, handler, on_outcome=on_outcome)
    if proto.complete in (_mark_then_write, _write_then_mark):
        create_ledger(queue.path)
    outcomes: list[Outcome] = []
    with queue.session():
        while (lease := queue.claim()) is not None:
            outcomes.append(finish(proto, queue, lease, handler))
            if on_outcome is not None:
                on_outcome(outcomes[-1])
    return outcomes
