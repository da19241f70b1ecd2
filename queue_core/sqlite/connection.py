"""Connections to the queue's file, and the one write-transaction helper.

Every request opens its own connection and closes it in ``finally`` (a
``with`` block on a ``sqlite3.Connection`` commits or rolls back but does
NOT close it). A request is one call, or a whole worker session (see
``Queue.session``), whose transactions then share one connection. Nothing
else in the package says ``BEGIN``.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from ..errors import UnusableFile
from ..marks import refuse_other_version
from .schema import BUSY_TIMEOUT_SECONDS, CHECKPOINT_PAGES


def connect(path: str | os.PathLike[str], *, synchronous: str = "FULL") -> sqlite3.Connection:
    """Open a connection in manual-transaction mode with the protocol's pragmas."""
    conn = sqlite3.connect(os.fspath(path), timeout=BUSY_TIMEOUT_SECONDS,
                           isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")  # the first statement reads the schema
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
    except UnicodeDecodeError:
        conn.close()
        raise damaged(path) from None
    except BaseException:
        conn.close()
        raise
    return conn


def damaged(path: str | os.PathLike[str]) -> UnusableFile:
    """The refusal of a file whose pages hold text that is not UTF-8: an overwritten
    schema page makes SQLite's own error quote the broken text, and Python then
    cannot even decode the error (``UnicodeDecodeError``, not a ``DatabaseError``);
    an overwritten data page does the same to a row that is read."""
    return UnusableFile("not_a_database", f"{os.fspath(path)} is damaged: SQLite read text "
                        "that is not UTF-8 from it (a page of the file was overwritten)")


def _connect_ro(name: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{quote(name)}?mode=ro", uri=True,
                           timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)




def _connect_immutable(name: str) -> sqlite3.Connection:
    uri = f"file:{quote(Path(name).resolve().as_posix())}?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, isolation_level=None)




class transaction:  # noqa: N801 - used like a function: ``with transaction(conn):``
    """Run the body inside ``BEGIN IMMEDIATE``: commit on success, roll back on
    any exception (``BaseException`` included, so an interrupt or an encoding
    error never leaves the transaction open).

    ``IMMEDIATE`` takes the write lock before the first read, so choosing a
    row and changing it cannot interleave with another writer.

    ``relaxed=True`` commits this one transaction at ``synchronous=NORMAL``
    (in WAL mode: its frames are written, not fsynced) and sets the
    connection back to FULL afterwards. The queue uses it for claims only;
    see ``Queue.claim_batch`` for why that loses nothing a caller was told.

    ``version``, if given, is the schema version the body's statements are
    written for: it is read again under the write lock, where no other
    process can change it until the commit (``PRAGMA user_version``, about
    2 us), and any other version is refused (``schema_too_old`` or
    ``schema_too_new``) before the body runs, with nothing written. A
    connection opened before another process migrated the file thus never
    writes the old schema's statements into the new one.

    A class rather than a ``@contextmanager`` generator: a worker enters it
    twice per message, and the generator machinery cost more CPU than the
    statements it wraps.
    """

    __slots__ = ("conn", "relaxed", "version")

    def __init__(self, conn: sqlite3.Connection, *, relaxed: bool = False,
                 version: int | None = None) -> None:
        self.conn = conn
        self.relaxed = relaxed
        self.version = version

    def __enter__(self) -> sqlite3.Connection:
        if self.relaxed:
            self.conn.execute("PRAGMA synchronous = NORMAL")
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._restore()
            raise
        if self.version is not None:
            try:
                found = self.conn.execute("PRAGMA user_version").fetchone()[0]
                if found != self.version:
                    refuse_other_version(_file_of(self.conn), found, self.version)
            except BaseException:
                self.conn.rollback()
                self._restore()
                raise
        return self.conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            if exc_type is None:
                self.conn.commit()
            else:
                self.conn.rollback()  # the exception propagates: __exit__ returns None
        finally:
            self._restore()

    def _restore(self) -> None:
        if self.relaxed:
            self.conn.execute("PRAGMA synchronous = FULL")


def _file_of(conn: sqlite3.Connection) -> str:
    """The path of the main database file of ``conn``, for a refusal's message."""
    return str(conn.execute("PRAGMA database_list").fetchone()[2])


class read_transaction:  # noqa: N801 - used like a function
    """Run the body inside one read transaction (``BEGIN`` deferred), so every
    statement in it sees the same committed moment; never takes the write lock."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN")
        return self.conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.conn.rollback()  # nothing was written: ending the read is all there is to do
