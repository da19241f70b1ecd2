"""A PostgreSQL connection that speaks the protocol's SQL, and its transactions.

``PgConnection`` takes ``?`` parameters as SQLite does; ``pg_transaction``
runs a transaction in psycopg's pipeline mode, so that a guarded statement
waits for nothing until its result is read; ``picked`` is how a write names
the rows its read chose; ``_journalled`` makes a guarded UPDATE write its
own journal row.
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any, Iterable, Iterator, Sequence

import psycopg

from ..transitions import JOURNAL_COLUMNS
from .session import raise_translated

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

    __slots__ = ("raw", "where", "_client", "_types")

    def __init__(self, raw: psycopg.Connection[Any], where: str = "postgresql://") -> None:
        self.raw = raw
        self.where = where  # the server, without the password, for an error's line
        self._client: psycopg.ClientCursor[Any] | None = None
        self._types: dict[str, dict[str, str]] = {}  # table -> column -> its SQL type

    def client_cursor(self) -> psycopg.ClientCursor[Any]:
        """A cursor whose values psycopg binds into the text (quoted as literals),
        for a message of several statements; one per connection."""
        if self._client is None:
            self._client = psycopg.ClientCursor(self.raw)
        return self._client

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self.raw.execute(_placeholders(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        """Run ``sql`` once per row; an ``INSERT ... VALUES (?, ...)`` of many rows
        as ONE statement instead (``_insert_all``), with the same rows and order."""
        rows = list(rows)
        cursor = self.raw.cursor()
        insert = _INSERT_VALUES.fullmatch(sql)
        if insert is None or len(rows) < 2:
            cursor.executemany(_placeholders(sql), rows)
        else:
            self._insert_all(cursor, insert["table"], insert["columns"].split(", "), rows)
        return cursor

    def _insert_all(self, cursor: psycopg.Cursor[Any], table: str, columns: list[str],
                    rows: list[Sequence[Any]]) -> None:
        """INSERT ``rows`` into ``table`` with one statement: each column's values
        as one array, ``unnest`` into rows, in the order given.

        The server prepares a table's CHECK constraints once per statement it
        runs, not once per session (it reads each from its stored text, then
        plans it), so a batch sent as a statement per row paid that for every
        row: an enqueue of 1,000 events took about 130 us an event here, 60
        with one statement. The order is the rows' own (``WITH ORDINALITY``
        ... ``ORDER BY``), so the journal's sequence numbers follow it as
        before. Every constraint is checked on every row as before; a refused
        row refuses the statement, and the transaction, as it did.
        """
        types = self._types.get(table)
        if types is None:
            types = self._types[table] = dict(self.raw.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                (table,)).fetchall())
        names = ", ".join(columns)
        arrays = ", ".join(f"%s::{types[column]}[]" for column in columns)
        cursor.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM unnest({arrays}) "
                       f"WITH ORDINALITY AS given ({names}, position) ORDER BY position",
                       [list(values) for values in zip(*rows)])

    def has_table(self, name: str) -> bool:
        return self.raw.execute("SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
                                "AND tablename = %s", (name,)).fetchone() is not None

    def close(self) -> None:
        self.raw.close()


_TRANSLATED: dict[str, str] = {}
# A plain INSERT of one row of ``?`` parameters: what ``executemany`` sends as one statement.
_INSERT_VALUES = re.compile(r"INSERT INTO (?P<table>\w+) \((?P<columns>\w+(?:, \w+)*)\) "
                            r"VALUES \(\?(?:, \?)*\)")


def _placeholders(sql: str) -> str:
    """``?`` to psycopg's ``%s`` (a literal ``%`` doubled); the protocol's
    statements hold no ``?`` inside a string literal."""
    translated = _TRANSLATED.get(sql)
    if translated is None:
        translated = _TRANSLATED[sql] = sql.replace("%", "%%").replace("?", "%s")
    return translated


class pg_transaction:  # noqa: N801 - used like a function, as sqlite.transaction
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
