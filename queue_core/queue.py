"""The protocol: enqueue, claim, complete, fail, redrive, extend; on SQLite or PostgreSQL.

Transitions (each one guarded UPDATE, journalled in the same transaction):

    ready  --claim-->     leased   attempts+1, generation+1, lease_until set
    leased --complete-->  done     effect INSERT + ACK in ONE transaction
    leased --fail-->      ready    transient, available again after backoff
    leased --fail-->      dead     permanent, or the attempt budget is spent
    leased --(expiry)-->  ready    noticed lazily by the next claim
    leased --(expiry)-->  dead     ... when no attempt is left
    leased --release-->   ready    given back untouched; the attempt not counted
    dead   --redrive-->   ready    attempts reset; generation kept

Who moves a message out of each state: ``ready`` only a claim; ``leased``
only the lease's holder (complete, fail, release) or, after ``lease_until``,
a claim; ``done`` nobody; ``dead`` only ``redrive``. The holder may also
``extend`` its lease (a heartbeat): ``lease_until`` moves, the state does not.

The rules are written once, here and in ``acks`` (the ACK in its three
forms, which ``Queue`` inherits), each transition one guarded statement of
``transitions``; the store (``stores``: a file or a ``postgresql://``
connection string) supplies the connections, the transaction mechanics and
how a transition's row reaches the journal.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from .clock import Clock, SystemClock
from .crashpoints import crash_point
from .errors import BatchConflict, NotRedrivable, UnknownEvent
from .ids import COURSE, matches, require_rule, why_not
from .ingest import Batch, parse_batch, payload_digest, read_batch, require_ids
from .marks import refuse_other_version
from .sqlite import SYNCHRONOUS_MODES
from .stores import open_store
from .priority import DEFAULT_PRIORITY, require_priority
from .transitions import (CLAIM, CLAIMED_ORDER, DUE, EXTEND, FAIL, RECOVER, REDRIVE, RELEASE,
                          explain_miss, picking, write_journal)
from .values import EnqueueResult, Lease, Outcome, State, require_positive
from .acks import QueueAcks, _by_event_id, _leases, _require_lease
from .views import QueueViews

if TYPE_CHECKING:  # loaded on first use: most queues never migrate or prune
    from .migrations import Migration
    from .retention import Pruned

PRUNE_BATCH = 50  # messages per prune transaction (``retention``)
_INSERT = ("INSERT INTO messages (event_id, payload, payload_sha256, available_at) "
           "VALUES (?, ?, ?, ?)")
_INSERT_WITH_PRIORITY = ("INSERT INTO messages (event_id, payload, payload_sha256, "
                         "available_at, priority) VALUES (?, ?, ?, ?, ?)")



def require_event_id(event_id: object, ids: str = COURSE) -> None:
    """Refuse what is no event id under the rule ``ids`` as input, with ingest's
    code for it: ``NotRedrivable`` with code ``invalid_event_id`` (an id that is
    well formed but not stored is ``UnknownEvent``: a fact of the queue, not of
    the input). Before a queue is opened, ``GENERAL`` refuses what no queue
    could hold."""
    if not matches(ids, event_id):
        meant = event_id.strip().upper() if isinstance(event_id, str) else None
        hint = f": did you mean {meant!r}?" if meant and matches(ids, meant) else ""
        what = ("E followed by four ASCII digits" if ids == COURSE
                else f"under the {ids} rule, it {why_not(ids, event_id)}")
        raise NotRedrivable(f"{event_id!r} is not an event id ({what}){hint}",
                            code="invalid_event_id")


def backoff_seconds(attempt: int) -> int:
    """Delay before the next try after a transient failure of ``attempt``: 1, 2, 4..."""
    return int(2 ** (attempt - 1))  # int: ``**`` of two ints is typed as Any


class Queue(QueueAcks, QueueViews):
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
    claim commits without an fsync of its own (see ``claim_batch``), as
    does each of ``prune``'s transactions (see ``retention``: a lost prune
    only leaves what it dropped in place); ``fsync_claims=True`` fsyncs
    those too. ``NORMAL`` fsyncs nothing per
    commit: a labelled trade of durability on power loss for speed.
    ``create=False`` refuses a missing file instead of creating it.
    ``ids`` is the rule a new queue's event ids follow (``ids``: ``course``,
    the default, or ``general``); given for an existing queue, it must be
    the rule that queue was created with (else ``IdRuleDiffers``).

    Opening writes nothing to a file that is not new and empty or marked as
    the queue's own: anything else raises ``UnusableFile`` (see ``sqlite``);
    on PostgreSQL also ``cannot_connect``.
    """

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock | None = None,
                 lease_seconds: int = 30, max_attempts: int = 3,
                 synchronous: str = "FULL", fsync_claims: bool = False,
                 create: bool = True, ids: str | None = None) -> None:
        require_positive("lease_seconds", lease_seconds)
        if ids is not None:
            require_rule(ids)
        require_positive("max_attempts", max_attempts)
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        self.store = open_store(path)
        self.path: str = self.store.target
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.synchronous = synchronous
        # The commits that promise a caller nothing durable (claims, prune's) skip
        # their own fsync. Only a FULL connection has one to skip: at NORMAL every
        # commit is relaxed.
        self.relaxed_commits = synchronous == "FULL" and not fsync_claims
        self._session: sqlite3.Connection | None = None
        # The two statements that change the rows a read picks (``transitions``).
        self._claim_sql = picking(CLAIM, DUE, self.store.picked)
        self._recover_sql = picking(RECOVER, self.store.expired, self.store.picked)
        # An earlier schema version is read as it is; every write refuses it
        # (``transaction``) until ``migrations.migrate`` upgraded it.
        self.schema_version = self.store.prepare(create=create, ids=ids)
        self._id_rule = ids  # read on first use when not given: most calls never need it

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
    def id_rule(self) -> str:
        """The rule this queue's event ids follow (``ids``), chosen when it was created."""
        if self._id_rule is None:
            self._id_rule = self.store.id_rule(self.schema_version)
        return self._id_rule

    @property
    def connection(self) -> sqlite3.Connection | None:
        """The open session's connection (``None`` outside ``session``), to inspect."""
        return self._session

    def transaction(self, *, relaxed: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``) on this queue's connection.

        The hook every transition runs in, and subclasses too: commit on
        success, roll back on any exception. ``relaxed=True`` commits it
        without an fsync (claims and prune's; see ``claim_batch``).
        """
        self._require_current_schema()
        # In a session the transaction helper is entered directly: a worker
        # runs this twice per message, and two nested generator-based context
        # managers cost more CPU than the statements they wrap.
        if self._session is not None:
            return self.store.transaction(self._session, relaxed=relaxed)
        return self._transaction_on_own_connection(relaxed)

    def _require_current_schema(self) -> None:
        """Refuse a write to a queue of another schema version than this engine's
        (``schema_too_old``, ``schema_too_new``).

        The version seen when the queue was opened is read again when it
        differs: another process may have migrated the file since. The
        store's write transaction checks it once more under its lock, so a
        version changed after this check is refused there too.
        """
        if self.schema_version != self.store.schema_version:
            self.schema_version = self.store.prepare(create=False)
            refuse_other_version(self.store.describe(), self.schema_version,
                                 self.store.schema_version)

    @contextmanager
    def _transaction_on_own_connection(self, relaxed: bool) -> Iterator[sqlite3.Connection]:
        conn = self.store.connect(synchronous=self.synchronous)
        try:
            with self.store.transaction(conn, relaxed=relaxed):
                yield conn
        finally:
            conn.close()

    # -- enqueue --------------------------------------------------------------

    def enqueue(self, batch: Batch, *, priority: int = DEFAULT_PRIORITY) -> EnqueueResult:
        """Store a validated batch in one transaction; repeats are counted, not stored.

        Every new message of the batch gets ``priority`` (0 to 9, see
        ``priority``: a head start of a minute per step in the claim's
        order). A repeat keeps the priority it was stored with, whatever
        ``priority`` it comes with now: it is the same event.

        Raises ``BatchConflict`` (code ``batch_conflict``) if an event id is
        already stored with a different payload; then nothing is written.
        Payloads are compared by their SHA-256, which the queue keeps for
        every event forever: a replay of a pruned event gets the same
        answer as before it was pruned. A batch whose ids were checked
        against another rule than the queue's is checked again
        (``invalid_event_id``) before anything is written.
        """
        require_priority(priority)
        require_ids(batch, self.id_rule)
        with self.transaction() as conn:
            self.store.serialize_enqueue(conn)
            now = self.clock.now()
            stored = _stored_digests(conn, [event.event_id for event in batch.events])
            new = []
            for event in batch.events:
                known = stored.get(event.event_id)
                digest = payload_digest(event.payload)
                if known is None:
                    new.append((event, digest))
                elif known != digest:
                    raise BatchConflict(
                        f"{event.event_id} is already stored with a different payload; "
                        "a correction needs a new event id",
                        line=event.line, event_id=event.event_id)
            if priority == DEFAULT_PRIORITY:  # the column's default: the statement of every
                conn.executemany(_INSERT, [(event.event_id, event.payload, digest, now)
                                           for event, digest in new])  # earlier release
            else:
                conn.executemany(_INSERT_WITH_PRIORITY,
                                 [(event.event_id, event.payload, digest, now, priority)
                                  for event, digest in new])
            write_journal(conn, [(now, event.event_id, None, State.READY, 0, 0, "enqueued")
                                 for event, _ in new])
        return EnqueueResult(inserted=len(new), duplicates=batch.repeats + len(batch) - len(new))

    def enqueue_file(self, path: str | os.PathLike[str], *,
                     priority: int = DEFAULT_PRIORITY) -> EnqueueResult:
        """Validate a JSONL file whole, then ``enqueue`` it (codes: see ``ingest``)."""
        require_priority(priority)
        return self._enqueue_at(read_batch(path, ids=self.id_rule), priority)

    def enqueue_jsonl(self, text: str | bytes, *,
                      priority: int = DEFAULT_PRIORITY) -> EnqueueResult:
        """Validate JSONL text whole, then ``enqueue`` it (codes: see ``ingest``)."""
        require_priority(priority)
        return self._enqueue_at(parse_batch(text, ids=self.id_rule), priority)

    def _enqueue_at(self, batch: Batch, priority: int) -> EnqueueResult:
        if priority == DEFAULT_PRIORITY:  # as before priorities: a subclass's own
            return self.enqueue(batch)    # ``enqueue(batch)`` is still called
        return self.enqueue(batch, priority=priority)

    # -- claim ----------------------------------------------------------------

    def claim(self) -> Lease | None:
        """Lease the next available message, or return ``None`` if none is due.

        Expired leases are recovered first (to ``ready``, or to ``dead`` when
        the budget is spent). Candidates: ``ready`` and ``available_at <= now``,
        in the claim's order: ``available_at`` less the priority's head start
        (``priority``), then ``event_id``.
        """
        leases = self.claim_batch(1)
        return leases[0] if leases else None

    def claim_batch(self, limit: int) -> list[Lease]:
        """Lease up to ``limit`` messages in one ``BEGIN IMMEDIATE`` transaction."""
        require_positive("limit", limit)
        # Durability: a claim commits without an fsync of its own (WAL at
        # synchronous=NORMAL for this one transaction). A process crash loses
        # no written frame: the OS holds it. A power loss may drop the claim,
        # but only together with every worker on this host (WAL needs one
        # host: its index lives in shared memory), so no holder of the lost
        # lease survives to ACK; the message is simply ready again, or leased
        # until its lease expires, which the protocol already handles. An ACK
        # can never survive without the claim it fences: the ACK's fsync of
        # the WAL covers every frame written before it.
        with self.transaction(relaxed=self.relaxed_commits) as conn:
            crash_point("claim.after_begin")
            journal: list[tuple[Any, ...]] = []
            claimed = self._claim(conn, self.clock.now(), limit, journal)
            self.store.write_journal(conn, journal)
            crash_point("claim.before_commit")
        crash_point("claim.after_commit")
        return _leases(claimed)

    def _claim(self, conn: Any, now: int, limit: int,
               journal: list[tuple[Any, ...]]) -> Sequence[tuple[Any, ...]]:
        """Recover the expired leases, then lease up to ``limit`` due messages,
        each step one guarded statement; return the claim's rows (read them
        with ``_leases``, after the commit: on PostgreSQL the statement then
        travels with the ``COMMIT``)."""
        self.store.transition(conn, self._recover_sql, (self.max_attempts, self.max_attempts, now),
                              now, journal)
        return self.store.transition(conn, self._claim_sql,
                                     (now + self.lease_seconds, now, now, limit), now, journal,
                                     order=CLAIMED_ORDER)

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
        require_positive("seconds", seconds)
        with self.transaction() as conn:
            now = self.clock.now()
            until = now + seconds
            if conn.execute(EXTEND, (until, lease.event_id, lease.generation, now)).fetchone() is None:
                raise explain_miss(conn, lease, now)
        return Lease(lease.event_id, lease.generation, lease.attempt, until, lease.payload)

    def release(self, lease: Lease) -> None:
        """Give back a message this worker claimed but has not started: ``ready``
        again at once, in its old place in the order, the attempt not counted.

        Fenced by state and generation: a message that a later claim took
        (``stale_generation``) or recovered (``not_leased``), or a lease that
        is no longer held at all, raises ``LeaseLost`` (or ``UnknownEvent``)
        and changes nothing. Journalled (``released``). The generation stays
        counted, so the released lease can never ACK. The worker loop uses it
        when it must stop while holding a message it claimed ahead.

        Unlike the ACK, ``fail`` and ``extend``, a release is not refused
        because the deadline has passed: until a claim recovers it, an
        expired lease is still this generation's and nobody else's, and
        giving it back asserts no right to the message (it writes no
        effect and moves no deadline on). So a worker that was held up
        past its deadline (a reader that stalled) still gives back a
        message it never started, and that message's attempt is not
        counted; had a claim recovered it first, the attempt would count.
        """
        _require_lease(lease)
        with self.transaction() as conn:
            now = self.clock.now()
            journal: list[tuple[Any, ...]] = []
            if not self.store.transition(conn, RELEASE, (lease.event_id, lease.generation),
                                         now, journal):
                raise explain_miss(conn, lease, now)
            self.store.write_journal(conn, journal)

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
            journal: list[tuple[Any, ...]] = []
            outcome = self._fail(conn, lease, code, permanent, journal)
            self.store.write_journal(conn, journal)
            crash_point("fail.before_commit")
        crash_point("fail.after_commit")
        return outcome

    def _fail(self, conn: Any, lease: Lease, code: str, permanent: bool,
              journal: list[tuple[Any, ...]]) -> Outcome:
        now = self.clock.now()
        if permanent or lease.attempt >= self.max_attempts:
            to, available_at, kind = State.DEAD, now, "dead"
            reason = code if permanent else "attempts_exhausted"
        else:
            to, available_at, kind = State.READY, now + backoff_seconds(lease.attempt), "retry"
            reason = code
        if not self.store.transition(conn, FAIL, (to, available_at, code, lease.event_id,
                                                  lease.generation, now, reason), now, journal):
            raise explain_miss(conn, lease, now)
        return Outcome(lease.event_id, kind, lease.generation, code,
                       available_at=available_at if kind == "retry" else None)

    def redrive(self, event_id: str) -> None:
        """Send a dead message back to ``ready`` for a new cycle of attempts.

        Resets ``attempts`` to 0; keeps ``generation`` and the payload, so a
        worker from an earlier cycle stays fenced. Raises ``UnknownEvent`` (no
        such message) or ``NotRedrivable`` (code ``not_redrivable``: it is not
        dead; ``invalid_event_id``: what was given is no event id, refused
        before the database is read) and changes nothing.
        """
        require_event_id(event_id, self.id_rule)
        with self.transaction() as conn:
            now = self.clock.now()
            journal: list[tuple[Any, ...]] = []
            if not self.store.transition(conn, REDRIVE, (now, event_id), now, journal):
                row = conn.execute("SELECT state FROM messages WHERE event_id = ?",
                                   (event_id,)).fetchone()
                if row is None:
                    raise UnknownEvent(f"no message {event_id}")
                raise NotRedrivable(f"{event_id} is {row[0]}; only a dead message can be redriven")
            self.store.write_journal(conn, journal)


    # -- the queue's lifetime ---------------------------------------------------

    def migrate(self) -> Migration:
        """Upgrade this queue to the engine's schema version, one transaction per
        step (see ``migrations``); a queue already current is left as it is."""
        from .migrations import migrate
        done = migrate(self.path)
        self.schema_version = done.to_version
        return done


    def prune(self, older_than: int, *, batch_size: int = PRUNE_BATCH) -> Pruned:
        """Drop the payload and the journal rows of each ``done`` message that
        finished at least ``older_than`` seconds ago, keeping its key, digest,
        effect and a compacted record, in short transactions (see ``retention``)."""
        from .retention import prune
        return prune(self, older_than, batch_size=batch_size)


def _stored_digests(conn: sqlite3.Connection, event_ids: list[str]) -> dict[str, bytes]:
    return {event_id: bytes(row[0])
            for event_id, row in _by_event_id(conn, "payload_sha256", event_ids).items()}


