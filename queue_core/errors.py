"""One small error hierarchy with stable, machine-readable codes.

Every error the package raises on purpose is a ``QueueError`` whose ``code``
never changes between versions: scripts, tests and the exercise checks compare
codes, not message text.
"""

from __future__ import annotations


class QueueError(Exception):
    """Base of every deliberate error; ``code`` is stable, ``str()`` explains."""

    code: str = "queue_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class BatchRejected(QueueError):
    """The whole input batch was refused before anything was written.

    ``line`` is the 1-based line number in the file, or ``None`` for a
    file-level problem (too large, too many lines, unreadable).
    """

    code = "batch_rejected"

    def __init__(self, code: str, message: str, *, line: int | None = None) -> None:
        super().__init__(message, code=code)
        self.line = line

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.code}: {self.message}"


class BatchConflict(BatchRejected):
    """An event id arrived again with a different canonical payload."""

    def __init__(self, message: str, *, line: int, event_id: str) -> None:
        super().__init__("batch_conflict", message, line=line)
        self.event_id = event_id


class LeaseLost(QueueError):
    """The caller's lease no longer entitles it to finish the message.

    ``code`` is one of ``stale_generation`` (someone claimed the message
    after this lease was granted, or it was redriven), ``lease_expired``
    (the deadline passed) or ``not_leased`` (the message is no longer
    leased at all). ``stored_state`` and ``stored_generation`` are the
    message's as the refusal read them (``None`` where nothing was read).
    """

    def __init__(self, code: str, message: str, *, event_id: str,
                 stored_state: str | None = None, stored_generation: int | None = None) -> None:
        super().__init__(message, code=code)
        self.event_id = event_id
        self.stored_state = stored_state
        self.stored_generation = stored_generation


class NotRedrivable(QueueError):
    """Only a dead message may be redriven.

    ``code`` is ``not_redrivable`` (the message is not dead) or
    ``invalid_event_id`` (what was given is no event id: refused input, with
    the code a batch line gets for it).
    """

    code = "not_redrivable"


class UnknownEvent(QueueError):
    """No message with this event id is stored."""

    code = "unknown_event"


class InvalidPayload(QueueError):
    """The business handler cannot accept this payload: a permanent failure."""

    code = "invalid_payload"


class TransientError(QueueError):
    """A failure worth retrying later (a timeout, a busy dependency)."""

    code = "transient_error"


class IntegrityViolation(QueueError):
    """A constraint of the schema refused a write (a second line of defence)."""

    code = "integrity_violation"


class PayloadDiffers(IntegrityViolation):
    """An ACK refused because a payload is not the one the message was enqueued with.

    The payload a message is counted with is the payload it was enqueued
    with; its SHA-256 is kept from enqueue on (``payload_sha256``), and every
    ACK checks it in its own transaction. Two cases, one code:

    - the stored payload was edited (by hand, after enqueue): the message
      itself can no longer be counted. The ACK writes no effect and, in the
      same transaction, moves the message to ``dead`` with
      ``payload_differs`` as its reason (``dead_lettered`` is true), so that
      a person looks at it and redrives it once the payload is repaired;
    - the lease carries a payload that is not the stored one (a caller's
      copy, changed after the claim): nothing is written, the message is
      untouched and the lease still holds (``dead_lettered`` is false).
    """

    code = "payload_differs"

    def __init__(self, message: str, *, dead_lettered: bool) -> None:
        super().__init__(message)
        self.dead_lettered = dead_lettered


class IdRuleDiffers(QueueError):
    """A queue was opened with an id rule other than its own.

    A queue keeps the rule (``ids``) it was created with, so nothing was
    written."""

    code = "id_rule_differs"


class UnusableFile(QueueError):
    """The file cannot be used as a queue, and nothing was written to it.

    ``code`` is ``not_a_queue`` (another application's database, or the
    queue's mark on a file that holds no queue), ``schema_too_new``,
    ``schema_too_old`` (a write to a queue not yet migrated),
    ``not_a_database`` (not SQLite, truncated or damaged), ``no_queue_file``
    (a reading command found no queue to read), ``hot_journal`` (a killed
    writer's journal must be rolled back, and this process may not write),
    ``migration_failed`` or ``migration_blocked`` (``migrate`` changed
    nothing), ``cannot_connect`` (a PostgreSQL server that cannot be
    reached, or refuses the credentials) or ``reserved_name`` (a new file
    whose name ends in ``-wal``, ``-shm`` or ``-journal``, as SQLite names
    the files it keeps beside a database: the last connection to a database
    of the shorter name would delete it; or a database already beside the
    file under such a name, which SQLite would overwrite).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


# What a lost connection's line says after its detail. Whether the transaction in
# flight committed is unknown: its COMMIT may have been applied without the answer
# coming back. The line says so, and why that does not matter: the effect and the
# ACK commit together, the lease's generation fences a second ACK, and a later
# claim recovers a lease that nobody holds any more.
CONNECTION_LOST_OUTCOME = (
    "every outcome reported before this line is committed; whether the transaction in "
    "flight committed is unknown (its COMMIT may have taken effect without the answer "
    "coming back), and the queue settles it: an effect commits only with its ACK and the "
    "lease's generation fences a second one, so a later work finishes every message "
    "exactly once: run the command again")


class ConnectionLost(QueueError):
    """A PostgreSQL session ended under a call, its transaction's outcome unknown.

    The connection broke, or the server ended the session (a restart, a
    terminated backend, a network drop, one of the session's timeouts),
    while a transaction may have been in flight. Its outcome is unknown:
    the COMMIT may have taken effect without the answer coming back.
    ``str()`` is one line that says so, and that the queue settles it
    (``CONNECTION_LOST_OUTCOME``). ``where`` names the server, ``detail``
    is the driver's own words on one line.
    """

    code = "connection_lost"

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}; {CONNECTION_LOST_OUTCOME}")
        self.where = where
        self.detail = detail


class LockTimeout(QueueError):
    """A statement waited past the session's lock timeout, and its transaction rolled back.

    The lock was held by another transaction; the outcome of this one is
    known: nothing of it committed.

    A worker reports the message as ``lost`` with this code and goes on with
    the next: the transaction holding the lock settles the message, or its
    lease runs out and a later claim recovers it.
    """

    code = "lock_timeout"
