"""The ACK in its three forms: one lease, one lease and the next claim, a batch.

Each writes the effect and marks the message ``done`` in ONE transaction,
fenced by the lease: the payload is read from the database and checked
(``transitions.check_fence``), the handler INSERTs the effect on the same
connection, and the guarded UPDATE (``transitions.ACK``) re-checks the lease
after the handler ran. ``Queue`` inherits these; the worker loop's
``complete_and_claim`` also claims the next due message before the commit.

The payload a message is counted with is the payload it was enqueued with:
its SHA-256 is kept from enqueue on (``payload_sha256``), and every ACK, in
its own transaction and before the handler runs, checks that the stored
payload still has it. A payload edited by hand is refused
(``PayloadDiffers``, code ``payload_differs``): no effect is written, and the
same transaction moves the message to ``dead`` with ``payload_differs`` as its
reason, so that it is never counted and never silently ready again; a person
repairs the payload and redrives it (``audit``'s ``digest_differs`` reports an
edit made after ``done``, which no ACK can refuse).

On PostgreSQL the worker loop's step is one call of a function of the schema
(``postgres.STEP_FUNCTION``), one round trip per message: the handler
computes the effect from the payload the claim read from the database and
returned with the lease (``Lease.payload``), and the server writes it and
marks the message ``done`` under the same guard, and only if that payload,
and the payload stored now, are the one enqueued (their SHA-256 is
``payload_sha256``); an edited stored payload is dead-lettered there as
above, and a lease carrying another copy is refused with nothing written.
A handler that writes more than its effect (one that overrides ``apply``)
needs the transaction open while it runs, and gets the path above.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager
from typing import Any, Iterable, Sequence

from .clock import Clock
from .crashpoints import crash_point
from .errors import IntegrityViolation, InvalidPayload, PayloadDiffers, QueueError, TransientError
from .handler import Handler
from .ingest import payload_digest
from .stores import Store
from .transitions import (ACK, FENCE_COLUMNS, FENCE_SELECT, check_fence, explain_miss,
                          rows_among)
from .values import Effect, Lease, Outcome

# The crash points of the ACK's steps: the plain ACK's, and those of the ACK
# that claims the next message in the same transaction.
_COMPLETE = ("complete.after_insert", "complete.after_recheck")
_HANDOFF = ("complete_and_claim.after_insert", "complete_and_claim.after_recheck")


class QueueAcks:
    """The ACK half of ``Queue``: what a lease's holder calls to finish its message."""

    clock: Clock
    store: Store
    lease_seconds: int
    max_attempts: int

    def transaction(self, *, relaxed: bool = False) -> AbstractContextManager[Any]:
        raise NotImplementedError  # Queue's

    def session(self) -> AbstractContextManager[Any]:
        raise NotImplementedError  # Queue's

    def _require_current_schema(self) -> None:
        raise NotImplementedError  # Queue's

    def _claim(self, conn: Any, now: int, limit: int,
               journal: list[tuple[Any, ...]]) -> Sequence[tuple[Any, ...]]:
        raise NotImplementedError  # Queue's

    def _fail(self, conn: Any, lease: Lease, code: str, permanent: bool,
              journal: list[tuple[Any, ...]]) -> Outcome:
        raise NotImplementedError  # Queue's

    def complete(self, lease: Lease, handler: Handler) -> Effect:
        """Write the effect and the ACK in ONE transaction, fenced by the lease.

        Checks state, generation and ``lease_until > now``; INSERTs the
        effect computed from the payload read from the database; marks
        ``done`` with an UPDATE guarded by the same three conditions, which
        re-checks the lease after the handler ran; commits. Raises
        ``LeaseLost`` (``stale_generation``, ``lease_expired``,
        ``not_leased``) or ``InvalidPayload``; either way the whole
        transaction, INSERT included, is rolled back. Raises
        ``PayloadDiffers`` if the stored payload is not the one enqueued: no
        effect, and the message committed as ``dead`` (``payload_differs``).
        """
        _require_lease(lease)
        edited: PayloadDiffers | None = None
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            journal: list[tuple[Any, ...]] = []
            try:
                effect, _ = self._ack(conn, lease, self._fence_row(conn, lease), handler,
                                      journal, _COMPLETE)
            except PayloadDiffers as refused:  # dead-lettered in this transaction: commit it
                edited = refused
            self.store.write_journal(conn, journal)
            crash_point("complete.before_commit")
        crash_point("complete.after_commit")
        if edited is not None:
            raise edited
        return effect

    def complete_and_claim(self, lease: Lease, handler: Handler) -> tuple[Effect, Lease | None]:
        """ACK ``lease`` as ``complete`` does and, in the SAME transaction, claim
        the next due message; return the effect and the new lease (``None``
        if nothing is due).

        The worker loop's step (``drain``): one transaction, and one fsync,
        per message. The claim inside it is an ordinary claim (expired leases
        recovered first); it is durable with the ACK, since the two commit
        together. If the ACK is refused (``LeaseLost``, ``InvalidPayload``, a
        transient error), everything is rolled back and nothing is claimed.
        A worker that dies after the commit holds a lease like any other:
        it expires, and the next claim recovers it.

        On PostgreSQL, for a handler that writes only its effect, the step is
        one call of the schema's function (``_step_on_server``), with the
        same outcomes and codes.
        """
        _require_lease(lease)
        if self.store.fused_step and lease.payload is not None and _effect_only(handler):
            return self._step_on_server(lease, handler)
        return self._complete_and_claim_here(lease, handler)

    def _complete_and_claim_here(self, lease: Lease,
                                 handler: Handler) -> tuple[Effect, Lease | None]:
        """``complete_and_claim`` in the client's transaction. An edited payload
        (``PayloadDiffers``) commits its dead-lettering and claims nothing."""
        edited: PayloadDiffers | None = None
        with self.transaction() as conn:
            journal: list[tuple[Any, ...]] = []
            try:
                effect, now = self._ack(conn, lease, self._fence_row(conn, lease), handler,
                                        journal, _HANDOFF)
                claimed = self._claim(conn, now, 1, journal)
            except PayloadDiffers as refused:  # dead-lettered in this transaction: commit it
                edited = refused
            self.store.write_journal(conn, journal)
            crash_point("complete_and_claim.before_commit")
        crash_point("complete_and_claim.after_commit")
        if edited is not None:
            raise edited
        following = _leases(claimed)
        return effect, (following[0] if following else None)

    def _step_on_server(self, lease: Lease, handler: Handler) -> tuple[Effect, Lease | None]:
        """``complete_and_claim`` as one call of PostgreSQL's step function.

        The effect is computed from ``lease.payload``, the payload the claim
        read from the database; the server refuses it unless that payload and
        the stored one are the payload enqueued (``payload_differs``), and
        dead-letters the message if the stored one is not. The call, its ``BEGIN`` and its
        ``COMMIT`` travel as one message (``PostgresStore.step``), so no
        transaction is ever left open between two of the worker's messages.
        Crash points: those inside the server's function cannot exist;
        ``before_commit`` is reached before the message is sent (nothing
        begun), ``after_commit`` once it committed.
        """
        assert lease.payload is not None
        self._require_current_schema()
        with self.session():
            conn = self.connection  # type: ignore[attr-defined]
            try:
                handler.fault(conn, lease.event_id)
                effect = handler.effect_of(json.loads(lease.payload))
            except (InvalidPayload, TransientError, ValueError):  # ValueError: no JSON
                # The lease is judged first, as complete's fence judges it: an
                # attempt no longer this lease's is not this worker's to fail;
                # nor is a payload that is not the stored one this message's.
                row = self._fence_row(conn, lease)
                stored = check_fence(lease, row, self.clock.now())
                if payload_digest(stored) != bytes(row[4]):  # edited: the client's ACK
                    return self._complete_and_claim_here(lease, handler)  # dead-letters it
                if stored != lease.payload:
                    raise _payload_differs(lease) from None
                raise
            crash_point("complete_and_claim.before_commit")
            try:
                rows = self.store.step(  # type: ignore[attr-defined]
                    conn, lease, payload_digest(lease.payload), effect, self.clock,
                    self.lease_seconds, self.max_attempts)
            except self.store.integrity_errors as exc:  # the schema refused the effect
                raise IntegrityViolation(f"{lease.event_id}: {str(exc).splitlines()[0]}") \
                    from exc
        found = _stepped(lease, rows)
        crash_point("complete_and_claim.after_commit")
        return effect, found

    def complete_batch(self, leases: Sequence[Lease],
                       handler: Handler) -> list[Effect | QueueError]:
        """ACK many leases in one transaction, each fenced on its own.

        The stored rows of all leases are read with one SELECT. Each lease
        then runs in a savepoint: one that fails its checks (or whose
        payload is invalid) is rolled back alone and reported as its error,
        in input order; the others commit together.
        """
        for lease in leases:
            _require_lease(lease)
        results: list[Effect | QueueError] = []
        journal: list[tuple[Any, ...]] = []
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            stored = _by_event_id(conn, FENCE_COLUMNS, (lease.event_id for lease in leases))
            seen: set[str] = set()
            for lease in leases:
                # A lease listed twice meets its own first ACK: read it again.
                row = (self._fence_row(conn, lease) if lease.event_id in seen
                       else stored.get(lease.event_id))
                seen.add(lease.event_id)
                conn.execute("SAVEPOINT ack")
                try:
                    results.append(self._ack(conn, lease, row, handler, journal, _COMPLETE)[0])
                except PayloadDiffers as exc:  # dead-lettered: kept, and committed with the rest
                    results.append(exc)
                except QueueError as exc:  # a refused ACK added no journal row
                    conn.execute("ROLLBACK TO ack")
                    results.append(exc)
                conn.execute("RELEASE ack")
            # One journal statement per transaction: only the leases that
            # passed their checks have a row here, and it commits with them.
            self.store.write_journal(conn, journal)
            crash_point("complete.before_commit")
        crash_point("complete.after_commit")
        return results

    def _fence_row(self, conn: Any, lease: Lease) -> tuple[Any, ...] | None:
        return conn.execute(FENCE_SELECT, (lease.event_id,)).fetchone()  # type: ignore[no-any-return]

    def _ack(self, conn: Any, lease: Lease, row: tuple[Any, ...] | None, handler: Handler,
             journal: list[tuple[Any, ...]], points: tuple[str, str]) -> tuple[Effect, int]:
        """Fence with the stored ``row``, apply, then mark ``done`` with the
        guarded UPDATE (``transitions.ACK``), which re-checks the lease after
        the handler ran. Return the effect and the time of that check.
        ``points`` names the crash points on the way.

        A stored payload that is not the one enqueued (its SHA-256 is not the
        digest kept, ``payload_sha256``) is refused before the handler runs:
        the message is moved to ``dead`` in this transaction, as a permanent
        failure (``payload_differs``), and ``PayloadDiffers`` raised for the
        caller to commit that and report it."""
        payload = check_fence(lease, row, self.clock.now())
        assert row is not None  # check_fence raised otherwise
        if payload_digest(payload) != bytes(row[4]):
            self._fail(conn, lease, PayloadDiffers.code, True, journal)
            raise _payload_edited(lease)
        try:
            effect = handler.apply(conn, lease.event_id, json.loads(payload))
        except self.store.integrity_errors as exc:
            raise IntegrityViolation(f"{lease.event_id}: {exc}") from exc
        crash_point(points[0])
        # The handler may have outlived the lease: the same three conditions
        # again, now as the guard of the UPDATE that marks it done. On
        # PostgreSQL (READ COMMITTED, no write lock held) that is enough: a
        # row changed by a transaction that committed since the fence read is
        # re-read and the WHERE re-evaluated on its newest version before the
        # write (EvalPlanQual), and a transaction still changing it makes this
        # UPDATE wait for its end; so a claim, recovery or redrive that beat
        # this ACK leaves 0 rows matched, and the INSERT rolls back with it.
        now = self.clock.now()
        if not self.store.transition(conn, ACK, (now, lease.event_id, lease.generation, now),
                                     now, journal):
            raise explain_miss(conn, lease, now)
        crash_point(points[1])
        return effect, now

    def fence(self, conn: sqlite3.Connection, lease: Lease) -> str:
        """Return the stored payload if ``lease`` still holds the message now.

        Run inside ``transaction()``; raises ``LeaseLost`` (``stale_generation``,
        ``not_leased``, ``lease_expired``) or ``UnknownEvent``. Not a step of
        the protocol's own transitions (each guarded UPDATE is its own
        check); a hook for subclasses: the course's broken contrasts use and
        override it to show what each check buys.
        """
        return check_fence(lease, self._fence_row(conn, lease), self.clock.now())


def _leases(rows: Iterable[tuple[Any, ...]]) -> list[Lease]:
    """The leases of ``transitions.CLAIM``'s rows."""
    return [Lease(row[0], row[3], row[4], row[6], row[8]) for row in rows]


def _payload_differs(lease: Lease) -> PayloadDiffers:
    return PayloadDiffers(f"{lease.event_id}: the payload this lease carries is not the "
                          "stored one (their SHA-256 differ); nothing was written",
                          dead_lettered=False)


def _payload_edited(lease: Lease) -> PayloadDiffers:
    return PayloadDiffers(f"{lease.event_id}: the stored payload is not the one it was enqueued "
                          "with (its SHA-256 is not the digest kept since): no effect was "
                          "written, and the message is dead (payload_differs); restore its "
                          "payload, then redrive it", dead_lettered=True)


def _effect_only(handler: Handler) -> bool:
    """Whether ``handler`` writes nothing but its effect (``Handler.apply`` as written)."""
    return type(handler).apply is Handler.apply


def _stepped(lease: Lease, rows: list[tuple[Any, ...]]) -> Lease | None:
    """The next lease of the step function's rows (``postgres.STEP_FUNCTION``),
    or raise why it refused ``lease``, as the client's own ACK says it."""
    kind = rows[0][0] if rows else None
    if kind == "done":
        return next((Lease(row[1], row[2], row[3], row[4], row[6]) for row in rows[1:]), None)
    stored = None if kind is None else (rows[0][5], rows[0][2], rows[0][4], "")
    at = rows[0][7] if rows else 0
    if kind == "payload_edited":  # the step moved the message to dead, and committed
        raise _payload_edited(lease)
    check_fence(lease, stored, at)  # raises LeaseLost or UnknownEvent if the lease is lost
    if kind == "payload_differs":
        raise _payload_differs(lease)
    raise AssertionError(f"{lease.event_id}: the step refused a lease that holds")


def _by_event_id(conn: sqlite3.Connection, columns: str,
                 event_ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """``columns`` of the stored messages among ``event_ids``: event id -> row."""
    return {row[0]: row[1:] for row in rows_among(
        conn, f"SELECT event_id, {columns} FROM messages WHERE event_id IN ({{}})",
        sorted(set(event_ids)))}


def _require_lease(lease: Lease) -> None:
    """A programmer error, refused before the database is touched."""
    if not isinstance(lease, Lease):
        raise TypeError(f"expected the Lease that claim() returned, got {type(lease).__name__}")


