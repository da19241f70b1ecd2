"""The protocol: enqueue, claim, complete, fail, redrive, extend; on SQLite or PostgreSQL.

Transitions (each one guarded UPDATE, journalled in the same transaction):

    ready  --claim-->     leased   attempts+1, generation+1, lease_until set
    leased --complete-->  done     effect INSERT + ACK in ONE transaction
    leased --fail-->      ready    transient, available again after backoff
    leased --fail-->      dead     permanent, or the attempt budget is spent
    leased --(expiry)-->  ready    noticed lazily by the next claim
    leased --(expiry)-->  dead     ... when no attempt is left
    dead   --redrive-->   ready    attempts reset; generation kept

Who moves a message out of each state: ``ready`` only a claim; ``leased``
only the lease's holder (complete, fail) or, after ``lease_until``, a claim;
``done`` nobody; ``dead`` only ``redrive``. The holder may also ``extend``
its lease (a heartbeat): ``lease_until`` moves, the state does not.

The rules are written once, here; the store (``storage.SqliteStore`` for a
file, ``postgres.PostgresStore`` for a ``postgresql://`` connection string)
supplies the connections, the transaction mechanics and the claim's reads.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterable, Iterator, Sequence

from .clock import Clock, SystemClock
from .crashpoints import crash_point
from .errors import (BatchConflict, IntegrityViolation, LeaseLost, NotRedrivable,
                     QueueError, UnknownEvent)
from .handler import Handler
from .ingest import EVENT_ID, Batch, parse_batch, read_batch
from .storage import CLAIM_SELECT, EXPIRED_SELECT, SYNCHRONOUS_MODES, open_store
from .values import Effect, EnqueueResult, Lease, Outcome, State
from .views import QueueViews

_CHUNK = 500  # ids per IN (...) list, well under SQLite's variable limit

# The claim's write and the ACK's guarded write find their rows by primary key.
# LEASE_UPDATE takes one "?" per chosen event id in place of {marks}; ACK_UPDATE
# re-checks the lease (state, generation, deadline) as it marks the row done.
LEASE_UPDATE = ("UPDATE messages SET state = 'leased', attempts = attempts + 1, "
                "generation = generation + 1, lease_until = ? WHERE state = 'ready' "
                "AND event_id IN ({marks}) RETURNING event_id, generation, attempts, lease_until")
ACK_UPDATE = ("UPDATE messages SET state = 'done', lease_until = NULL WHERE event_id = ? "
              "AND state = 'leased' AND generation = ? AND lease_until > ?")
# The heartbeat's write: the ACK's guard, but the row stays leased with a later deadline.
EXTEND_UPDATE = ("UPDATE messages SET lease_until = ? WHERE event_id = ? "
                 "AND state = 'leased' AND generation = ? AND lease_until > ?")
JOURNAL_INSERT = ("INSERT INTO transitions (at, event_id, from_state, to_state, generation, "
                   "attempts, reason) VALUES (?, ?, ?, ?, ?, ?, ?)")
_FENCE_COLUMNS = "state, generation, lease_until, payload"
_FENCE_SELECT = f"SELECT {_FENCE_COLUMNS} FROM messages WHERE event_id = ?"


def backoff_seconds(attempt: int) -> int:
    """Delay before the next try after a transient failure of ``attempt``: 1, 2, 4..."""
    return int(2 ** (attempt - 1))  # int: ``**`` of two ints is typed as Any


class Queue(QueueViews):
    """A reliable queue in one SQLite file (or a PostgreSQL database), bound to a clock.

    ``path`` is a file path, or a ``postgresql://`` connection string: the
    same protocol then runs on that database's current schema (see
    ``queue_core.postgres``; there every commit is durable and
    ``synchronous`` other than FULL only stops waiting for the WAL flush).

    ``lease_seconds`` is how long a claim entitles a worker to finish;
    ``max_attempts`` is the claim budget (expired leases count);
    ``synchronous`` is SQLite's durability setting. At ``FULL`` (the
    default) every commit a caller is told is durable (enqueue, the ACK with
    its effect, fail, redrive) is fsynced before the call returns, and a
    claim commits without an fsync of its own (see ``claim_batch``);
    ``fsync_claims=True`` fsyncs claims too. ``NORMAL`` fsyncs nothing per
    commit: a labelled trade of durability on power loss for speed.
    ``create=False`` refuses a missing file instead of creating it.

    Opening writes nothing to a file that is not new and empty or marked as
    the queue's own: anything else raises ``UnusableFile`` (see ``storage``);
    on PostgreSQL also ``cannot_connect``.
    """

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock | None = None,
                 lease_seconds: int = 30, max_attempts: int = 3,
                 synchronous: str = "FULL", fsync_claims: bool = False,
                 create: bool = True) -> None:
        _require_positive("lease_seconds", lease_seconds)
        _require_positive("max_attempts", max_attempts)
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        self.store = open_store(path)
        self.path: str = self.store.target
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.synchronous = synchronous
        # Only a FULL connection has an fsync to skip: at NORMAL every commit is relaxed.
        self.relaxed_claims = synchronous == "FULL" and not fsync_claims
        self._session: sqlite3.Connection | None = None
        self.store.prepare(create=create)

    def __repr__(self) -> str:
        return (f"Queue({self.store.describe()!r}, clock={self.clock!r}, "
                f"lease_seconds={self.lease_seconds}, max_attempts={self.max_attempts})")

    @contextmanager
    def session(self) -> Iterator["Queue"]:
        """Share one connection among the calls in the block, then close it.

        Every call still runs its own transaction; only the cost of opening
        a connection (about a third of a millisecond, mostly parsing the
        schema) is paid once. ``drain`` runs in a session. Not for sharing
        a queue between threads: use one ``Queue`` per thread or process.
        """
        if self._session is not None:
            yield self
            return
        self._session = self.store.connect(synchronous=self.synchronous)
        try:
            yield self
        finally:
            conn, self._session = self._session, None
            conn.close()

    @property
    def connection(self) -> sqlite3.Connection | None:
        """The open session's connection (``None`` outside ``session``), to inspect."""
        return self._session

    def transaction(self, *, relaxed: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``) on this queue's connection.

        The hook every transition runs in, and subclasses too: commit on
        success, roll back on any exception. ``relaxed=True`` commits it
        without an fsync (claims only; see ``claim_batch``).
        """
        # In a session the transaction helper is entered directly: a worker
        # runs this twice per message, and two nested generator-based context
        # managers cost more CPU than the statements they wrap.
        if self._session is not None:
            return self.store.transaction(self._session, relaxed=relaxed)
        return self._transaction_on_own_connection(relaxed)

    @contextmanager
    def _transaction_on_own_connection(self, relaxed: bool) -> Iterator[sqlite3.Connection]:
        conn = self.store.connect(synchronous=self.synchronous)
        try:
            with self.store.transaction(conn, relaxed=relaxed):
                yield conn
        finally:
            conn.close()

    # -- enqueue --------------------------------------------------------------

    def enqueue(self, batch: Batch) -> EnqueueResult:
        """Store a validated batch in one transaction; repeats are counted, not stored.

        Raises ``BatchConflict`` (code ``batch_conflict``) if an event id is
        already stored with a different payload; then nothing is written.
        """
        with self.transaction() as conn:
            self.store.serialize_enqueue(conn)
            now = self.clock.now()
            stored = _stored_payloads(conn, [event.event_id for event in batch.events])
            new = []
            for event in batch.events:
                known = stored.get(event.event_id)
                if known is None:
                    new.append(event)
                elif known != event.payload:
                    raise BatchConflict(
                        f"{event.event_id} is already stored with a different payload; "
                        "a correction needs a new event id",
                        line=event.line, event_id=event.event_id)
            conn.executemany("INSERT INTO messages (event_id, payload, available_at) VALUES (?, ?, ?)",
                             [(event.event_id, event.payload, now) for event in new])
            write_journal(conn, [(now, event.event_id, None, State.READY, 0, 0, "enqueued")
                            for event in new])
        return EnqueueResult(inserted=len(new), duplicates=batch.repeats + len(batch) - len(new))

    def enqueue_file(self, path: str | os.PathLike[str]) -> EnqueueResult:
        """Validate a JSONL file whole, then ``enqueue`` it (codes: see ``ingest``)."""
        return self.enqueue(read_batch(path))

    def enqueue_jsonl(self, text: str | bytes) -> EnqueueResult:
        """Validate JSONL text whole, then ``enqueue`` it (codes: see ``ingest``)."""
        return self.enqueue(parse_batch(text))

    # -- claim ----------------------------------------------------------------

    def claim(self) -> Lease | None:
        """Lease the next available message, or return ``None`` if none is due.

        Expired leases are recovered first (to ``ready``, or to ``dead`` when
        the budget is spent). Candidates: ``ready`` and ``available_at <= now``,
        in ``available_at, event_id`` order.
        """
        leases = self.claim_batch(1)
        return leases[0] if leases else None

    def claim_batch(self, limit: int) -> list[Lease]:
        """Lease up to ``limit`` messages in one ``BEGIN IMMEDIATE`` transaction."""
        _require_positive("limit", limit)
        # Durability: a claim commits without an fsync of its own (WAL at
        # synchronous=NORMAL for this one transaction). A process crash loses
        # no written frame: the OS holds it. A power loss may drop the claim,
        # but only together with every worker on this host (WAL needs one
        # host: its index lives in shared memory), so no holder of the lost
        # lease survives to ACK; the message is simply ready again, or leased
        # until its lease expires, which the protocol already handles. An ACK
        # can never survive without the claim it fences: the ACK's fsync of
        # the WAL covers every frame written before it.
        with self.transaction(relaxed=self.relaxed_claims) as conn:
            crash_point("claim.after_begin")
            now = self.clock.now()
            self._recover_expired(conn, now)
            chosen = [row[0] for row in conn.execute(self.store.claim_select, (now, limit))]
            crash_point("claim.after_select")
            leases = self._lease(conn, chosen, now)
            write_journal(conn, [(now, lease.event_id, State.READY, State.LEASED, lease.generation,
                             lease.attempt, "claimed") for lease in leases])
            crash_point("claim.before_commit")
        crash_point("claim.after_commit")
        return leases

    def _lease(self, conn: sqlite3.Connection, chosen: list[str], now: int) -> list[Lease]:
        """Lease the ``chosen`` ready messages with one UPDATE; in ``chosen`` order
        (RETURNING promises no order)."""
        leased: dict[str, Lease] = {}
        for start in range(0, len(chosen), _CHUNK):
            chunk = chosen[start:start + _CHUNK]
            marks = ", ".join("?" * len(chunk))
            leased.update((row[0], Lease(*row)) for row in conn.execute(
                LEASE_UPDATE.format(marks=marks), (now + self.lease_seconds, *chunk)))
        return [leased[event_id] for event_id in chosen]

    def _recover_expired(self, conn: sqlite3.Connection, now: int) -> None:
        expired = conn.execute(self.store.expired_select, (now,)).fetchall()
        for event_id, attempts, generation in expired:
            if attempts >= self.max_attempts:
                conn.execute("UPDATE messages SET state = 'dead', lease_until = NULL, "
                             "last_error = 'lease_expired' WHERE event_id = ?", (event_id,))
                write_journal(conn, [(now, event_id, State.LEASED, State.DEAD, generation, attempts,
                                 "attempts_exhausted")])
            else:
                conn.execute("UPDATE messages SET state = 'ready', available_at = lease_until, "
                             "lease_until = NULL, last_error = 'lease_expired' WHERE event_id = ?",
                             (event_id,))
                write_journal(conn, [(now, event_id, State.LEASED, State.READY, generation, attempts,
                                 "lease_expired")])

    # -- complete (the ACK) ---------------------------------------------------

    def complete(self, lease: Lease, handler: Handler) -> Effect:
        """Write the effect and the ACK in ONE transaction, fenced by the lease.

        Checks state, generation and ``lease_until > now``; INSERTs the
        effect computed from the payload read from the database; marks
        ``done`` with an UPDATE guarded by the same three conditions, which
        re-checks the lease after the handler ran; commits. Raises
        ``LeaseLost`` (``stale_generation``, ``lease_expired``,
        ``not_leased``) or ``InvalidPayload``; either way the whole
        transaction, INSERT included, is rolled back.
        """
        _require_lease(lease)
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            row = conn.execute(_FENCE_SELECT, (lease.event_id,)).fetchone()
            effect, journal_row = self._ack(conn, lease, row, handler)
            write_journal(conn, [journal_row])
            crash_point("complete.before_commit")
        crash_point("complete.after_commit")
        return effect

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
        journal_rows: list[tuple[Any, ...]] = []
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            stored = _by_event_id(conn, _FENCE_COLUMNS, (lease.event_id for lease in leases))
            seen: set[str] = set()
            for lease in leases:
                # A lease listed twice meets its own first ACK: read it again.
                row = (conn.execute(_FENCE_SELECT, (lease.event_id,)).fetchone()
                       if lease.event_id in seen else stored.get(lease.event_id))
                seen.add(lease.event_id)
                conn.execute("SAVEPOINT ack")
                try:
                    effect, journal_row = self._ack(conn, lease, row, handler)
                except QueueError as exc:
                    conn.execute("ROLLBACK TO ack")
                    results.append(exc)
                else:
                    results.append(effect)
                    journal_rows.append(journal_row)
                conn.execute("RELEASE ack")
            # One journal statement per transaction, not per lease: only the
            # leases that passed their checks have a row here, and it commits
            # or rolls back with their ACKs.
            write_journal(conn, journal_rows)
            crash_point("complete.before_commit")
        crash_point("complete.after_commit")
        return results

    def _ack(self, conn: sqlite3.Connection, lease: Lease, row: tuple[Any, ...] | None,
             handler: Handler) -> tuple[Effect, tuple[Any, ...]]:
        """Fence with the stored ``row``, apply, then mark ``done`` with an UPDATE
        that re-checks the lease; return the effect and the journal row, which
        the caller writes in the same transaction."""
        payload = self._check_fence(lease, row, self.clock.now())
        try:
            effect = handler.apply(conn, lease.event_id, json.loads(payload))
        except self.store.integrity_errors as exc:
            raise IntegrityViolation(f"{lease.event_id}: {exc}") from exc
        crash_point("complete.after_insert")
        # The handler may have outlived the lease: the same three conditions
        # again, now as the guard of the UPDATE that marks it done. On
        # PostgreSQL (READ COMMITTED, no write lock held) that is enough: a
        # row changed by a transaction that committed since the fence read is
        # re-read and the WHERE re-evaluated on its newest version before the
        # write (EvalPlanQual), and a transaction still changing it makes this
        # UPDATE wait for its end; so a claim, recovery or redrive that beat
        # this ACK leaves 0 rows matched, and the INSERT rolls back with it.
        now = self.clock.now()
        marked = conn.execute(ACK_UPDATE, (lease.event_id, lease.generation, now)).rowcount
        if marked != 1:  # the lease is lost: read the row again only to say why
            self._check_fence(lease, conn.execute(_FENCE_SELECT, (lease.event_id,)).fetchone(),
                              now)
            # not reached: the read sees what the UPDATE saw (under SQLite's write
            # lock), or later (PostgreSQL): generations and states only move on
            raise AssertionError(f"{lease.event_id}: guarded UPDATE matched {marked} rows")
        crash_point("complete.after_recheck")
        return effect, (now, lease.event_id, State.LEASED, State.DONE,
                        lease.generation, lease.attempt, "completed")

    def fence(self, conn: sqlite3.Connection, lease: Lease) -> str:
        """Return the stored payload if ``lease`` still holds the message now.

        Run inside ``transaction()``; raises ``LeaseLost`` (``stale_generation``,
        ``not_leased``, ``lease_expired``) or ``UnknownEvent``. A hook for
        subclasses: the course's broken contrasts override it to show what
        each check buys.
        """
        row = conn.execute(_FENCE_SELECT, (lease.event_id,)).fetchone()
        return self._check_fence(lease, row, self.clock.now())

    @staticmethod
    def _check_fence(lease: Lease, row: tuple[Any, ...] | None, now: int) -> str:
        """Return the payload of ``row`` (from ``_FENCE_SELECT``) if ``lease``
        still holds the message at ``now``; else raise why it does not."""
        if row is None:
            raise UnknownEvent(f"no message {lease.event_id}")
        state, generation, lease_until, payload = row
        if generation != lease.generation:
            raise LeaseLost("stale_generation",
                            f"{lease.event_id}: lease generation {lease.generation}, "
                            f"stored generation {generation}", event_id=lease.event_id)
        if state != State.LEASED:
            raise LeaseLost("not_leased", f"{lease.event_id} is {state}, not leased",
                            event_id=lease.event_id)
        if lease_until <= now:
            raise LeaseLost("lease_expired",
                            f"{lease.event_id}: lease ended at {lease_until}, now is {now}",
                            event_id=lease.event_id)
        return str(payload)

    # -- extend (the heartbeat) -----------------------------------------------

    def extend(self, lease: Lease, seconds: int) -> Lease:
        """Move the deadline of a lease still held to ``now + seconds``; return the new lease.

        Fenced like ``complete``: raises ``LeaseLost`` (``stale_generation``,
        ``lease_expired``, ``not_leased``) or ``UnknownEvent``, and then
        changes nothing. Only ``lease_until`` changes: the state stays
        ``leased``, so nothing is journalled (the journal holds state changes,
        and leased -> leased is no edge of the state machine). A deadline
        passed is passed: an expired lease cannot be revived, since a claim
        may already have handed the message to another worker.
        """
        _require_lease(lease)
        _require_positive("seconds", seconds)
        with self.transaction() as conn:
            now = self.clock.now()
            self._check_fence(lease, conn.execute(_FENCE_SELECT, (lease.event_id,)).fetchone(),
                              now)
            until = now + seconds
            moved = conn.execute(EXTEND_UPDATE, (until, lease.event_id, lease.generation,
                                                 now)).rowcount
            if moved != 1:  # lost since the read (PostgreSQL only): say why
                self._check_fence(lease, conn.execute(_FENCE_SELECT,
                                                      (lease.event_id,)).fetchone(), now)
                raise AssertionError(f"{lease.event_id}: guarded UPDATE matched {moved} rows")
        return Lease(lease.event_id, lease.generation, lease.attempt, until)

    # -- fail and redrive -----------------------------------------------------

    def fail(self, lease: Lease, code: str = "transient_error", *,
             permanent: bool = False) -> Outcome:
        """Give the message back after a failure, fenced like ``complete``.

        Transient: back to ``ready`` after ``backoff_seconds(attempt)``
        (1 s, then 2 s), or ``dead`` if this was the last attempt. Permanent:
        ``dead`` at once. ``code`` is stored as ``last_error``.
        """
        _require_lease(lease)
        with self.transaction() as conn:
            crash_point("fail.after_begin")
            outcome = self._fail(conn, lease, code, permanent)
            crash_point("fail.before_commit")
        crash_point("fail.after_commit")
        return outcome

    def _fail(self, conn: sqlite3.Connection, lease: Lease, code: str,
              permanent: bool) -> Outcome:
        self.fence(conn, lease)
        now = self.clock.now()
        if permanent or lease.attempt >= self.max_attempts:
            reason = code if permanent else "attempts_exhausted"
            self._finish_failed(conn, lease, "dead", now, code, reason)
            return Outcome(lease.event_id, "dead", lease.generation, code)
        retry_at = now + backoff_seconds(lease.attempt)
        self._finish_failed(conn, lease, "ready", retry_at, code, code)
        return Outcome(lease.event_id, "retry", lease.generation, code, available_at=retry_at)

    def _finish_failed(self, conn: sqlite3.Connection, lease: Lease, to: str,
                       available_at: int, code: str, reason: str) -> None:
        changed = conn.execute(
            "UPDATE messages SET state = ?, lease_until = NULL, available_at = ?, "
            "last_error = ? WHERE event_id = ? AND state = 'leased' AND generation = ?",
            (to, available_at, code, lease.event_id, lease.generation)).rowcount
        if changed != 1:  # only without a write lock (PostgreSQL): recovered since the fence
            self.fence(conn, lease)
            raise LeaseLost("not_leased", f"{lease.event_id} was taken back meanwhile",
                            event_id=lease.event_id)
        write_journal(conn, [(self.clock.now(), lease.event_id, State.LEASED, State(to),
                         lease.generation, lease.attempt, reason)])

    def redrive(self, event_id: str) -> None:
        """Send a dead message back to ``ready`` for a new cycle of attempts.

        Resets ``attempts`` to 0; keeps ``generation`` and the payload, so a
        worker from an earlier cycle stays fenced. Raises ``UnknownEvent`` or
        ``NotRedrivable`` (code ``not_redrivable``) and changes nothing.
        """
        if not isinstance(event_id, str) or not EVENT_ID.fullmatch(event_id):
            raise UnknownEvent(f"{event_id!r} is not an event id (E followed by four digits)")
        with self.transaction() as conn:
            row = conn.execute("SELECT state, generation FROM messages WHERE event_id = ?"
                               + self.store.for_update, (event_id,)).fetchone()
            if row is None:
                raise UnknownEvent(f"no message {event_id}")
            if row[0] != State.DEAD:
                raise NotRedrivable(f"{event_id} is {row[0]}; only a dead message can be redriven")
            now = self.clock.now()
            conn.execute("UPDATE messages SET state = 'ready', attempts = 0, available_at = ? "
                         "WHERE event_id = ? AND state = 'dead'", (now, event_id))
            write_journal(conn, [(now, event_id, State.DEAD, State.READY, row[1], 0, "redrive")])


def _stored_payloads(conn: sqlite3.Connection, event_ids: list[str]) -> dict[str, str]:
    return {event_id: row[0] for event_id, row in _by_event_id(conn, "payload", event_ids).items()}


def _by_event_id(conn: sqlite3.Connection, columns: str,
                 event_ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """``columns`` of the stored messages among ``event_ids``: event id -> row."""
    ids = sorted(set(event_ids))
    rows: dict[str, tuple[Any, ...]] = {}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows.update((row[0], row[1:]) for row in conn.execute(
            f"SELECT event_id, {columns} FROM messages WHERE event_id IN ({marks})", chunk))
    return rows


def write_journal(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Journal state changes inside the caller's open transaction.

    Each row: ``(at, event_id, from_state, to_state, generation, attempts,
    reason)``; the schema refuses a step that is not an edge of the state
    machine.
    """
    if len(rows) == 1:  # the single-message path: execute is cheaper than executemany
        conn.execute(JOURNAL_INSERT, rows[0])
        return
    conn.executemany(JOURNAL_INSERT, rows)


def _require_lease(lease: Lease) -> None:
    """A programmer error, refused before the database is touched."""
    if not isinstance(lease, Lease):
        raise TypeError(f"expected the Lease that claim() returned, got {type(lease).__name__}")


def _require_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
