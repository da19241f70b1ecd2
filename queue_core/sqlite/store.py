"""The SQLite store: the queue's file behind the interface the protocol calls."""

from __future__ import annotations

import os
import sqlite3
from contextlib import AbstractContextManager
from typing import Any, Callable, TypeVar

from ..ids import COURSE, require_same_rule
from ..transitions import EXPIRED, write_journal
from .connection import connect, read_transaction, transaction
from .files import connect_readonly, read
from .identity import id_rule, prepare
from .schema import SCHEMA_VERSION
from .turns import turns

T = TypeVar("T")


class SqliteStore:
    """The queue's SQLite file behind the interface the protocol calls.

    See ``stores`` for what a store supplies; ``postgres.PostgresStore``
    is the other one.
    """

    name = "sqlite"
    schema_version = SCHEMA_VERSION
    expired = EXPIRED  # the claim's read of expired leases: the leased range of messages_live
    fused_step = False  # the worker's step runs here, in one local transaction
    # No index of the journal by event: it would be one more page in every step's
    # commit (4 now); prune walks the journal instead (``retention._journal_of``).
    journal_by_event = False
    row_locks = False  # ``picked`` takes every row: the write lock is the only lock
    integrity_errors: tuple[type[BaseException], ...] = (sqlite3.IntegrityError,)
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.target = os.fspath(path)

    @staticmethod
    def picked(read: str) -> str:
        """A read that picks rows for a write locks nothing more: under BEGIN
        IMMEDIATE the write lock already serialises every writer, and SQLite
        runs an uncorrelated ``IN (<read>)`` once, into a list."""
        return f"IN ({read})"

    def describe(self) -> str:
        return os.path.basename(self.target)

    def prepare(self, *, create: bool = True, ids: str | None = None) -> int:
        """Make the file a usable queue (see ``identity.prepare``); return its
        schema version. A new queue's ids follow ``ids`` (the course's rule
        when ``None``); an existing queue of another rule than ``ids`` is
        refused (``IdRuleDiffers``), with nothing written."""
        version = prepare(self.target, create=create, ids=ids or COURSE)
        if ids is not None:
            require_same_rule(self.describe(), self.id_rule(version), ids)
        return version

    def id_rule(self, version: int) -> str:
        """The rule this queue's event ids follow (``ids``), as its last commit left it."""
        return read(self.target, lambda conn: id_rule(conn, version))

    def migrate_step(self, version: int) -> int | None:
        from .migrations import migrate_step  # loaded on first use
        return migrate_step(self.target, version)

    def connect(self, *, synchronous: str = "FULL") -> sqlite3.Connection:
        return connect(self.target, synchronous=synchronous)

    def connect_readonly(self) -> sqlite3.Connection:
        return connect_readonly(self.target)

    def turns(self, conn: sqlite3.Connection) -> AbstractContextManager[None]:
        """In the block, ``conn``'s write transactions take turns with the other
        workers of this file (``turns``): a worker's ``drain``."""
        return turns(conn, self.target)

    def read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return read(self.target, body)

    def transaction(self, conn: sqlite3.Connection, *, relaxed: bool = False) -> transaction:
        """A write transaction for this engine's statements: the file's version is
        checked under the write lock (``transaction``'s ``version``)."""
        return transaction(conn, relaxed=relaxed, version=SCHEMA_VERSION)

    def read_transaction(self, conn: sqlite3.Connection) -> read_transaction:
        return read_transaction(conn)

    def serialize_enqueue(self, conn: sqlite3.Connection) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already admits one writer at a time."""

    def transition(self, conn: sqlite3.Connection, sql: str, params: tuple[Any, ...], at: int,
                   journal: list[tuple[Any, ...]], order: tuple[str, ...] = ()
                   ) -> list[tuple[Any, ...]]:
        """Run a guarded statement; its rows join ``journal``, written once per
        transaction by ``write_journal`` (one INSERT, one journal page)."""
        cursor = conn.execute(sql, params)
        rows = cursor.fetchall()
        if order and len(rows) > 1:
            names = [column[0] for column in cursor.description]
            at_ = [names.index(name) for name in order]
            rows.sort(key=lambda row: [row[i] for i in at_])
        journal.extend((at, *row[:6]) for row in rows)
        return rows

    def write_journal(self, conn: sqlite3.Connection, journal: list[tuple[Any, ...]]) -> None:
        write_journal(conn, journal)

    def self_checks(self, conn: sqlite3.Connection) -> tuple[tuple[str, ...],
                                                             tuple[tuple[Any, ...], ...]]:
        """SQLite's own checks of the file: ``integrity_check`` and ``foreign_key_check``."""
        return (tuple(row[0] for row in conn.execute("PRAGMA integrity_check")),
                tuple(conn.execute("PRAGMA foreign_key_check")))


def is_connection_string(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL database rather than a file."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def has_table(conn: Any, name: str) -> bool:
    """Whether the connection's database holds a table ``name``."""
    if isinstance(conn, sqlite3.Connection):
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (name,)).fetchone() is not None
    return bool(conn.has_table(name))
