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
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from ..errors import UnusableFile
from ..marks import refuse_other_version
from .schema import BUSY_TIMEOUT_SECONDS, CHECKPOINT_PAGES, LOCK_PATIENCE, LOCK_POLL_SECONDS
from .turns import SQLITE_BUSY, TURN, data_version


def connect(path: str | os.PathLike[str], *, synchronous: str = "FULL") -> sqlite3.Connection:
    """Open a connection in manual-transaction mode with the protocol's pragmas.

    A path is a path: SQLite would read a name that starts with ``file:`` as a
    URI (``file:new.db`` is ``new.db``, and ``?mode=...`` an option), where every
    reading connection (``_connect_ro``) opens the file of that very name."""
    name = os.fspath(path)
    if name.startswith("file:"):
        name = os.path.join(".", name)
    conn = sqlite3.connect(name, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
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


# (seconds between asks, asks a writer lets pass while the holder keeps committing)
_POLL: ContextVar[tuple[float, int]] = ContextVar("lock_poll", default=(LOCK_POLL_SECONDS,
                                                                       LOCK_PATIENCE))


@contextmanager
def polling(seconds: float, patience: int = 0) -> Iterator[None]:
    """In the block, ask for the write lock every ``seconds``, and let at most
    ``patience`` asks pass while the holder keeps committing (``begin_immediate``),
    whatever transaction helper the block goes through. A prune asks often and
    at once: beside a worker that holds the lock all but a few tens of
    microseconds between its messages, a prune that waited for a quiet moment
    fell behind."""
    token = _POLL.set((seconds, patience))
    try:
        yield
    finally:
        _POLL.reset(token)


def begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE`` on ``conn``, the write lock taken soon after it is free.

    SQLite admits one writer. Its busy handler makes a writer that finds the
    lock taken sleep 1 ms, then 2, 5, 10 ... up to 100 ms between tries, even
    when the lock is free again 0.1 ms later: the last worker to find the
    queue empty slept up to 100 ms after the others had finished, and a
    worker beside a prune slept through most of the time the lock was free.
    So the lock is asked for without waiting (``busy_timeout`` 0 for the
    ``BEGIN``) and asked again, the first polls after each ask shorter (a
    prune's batch holds the lock about a millisecond), then every
    ``LOCK_POLL_SECONDS``, for as long as the busy timeout would have waited;
    then SQLite's own ``database is locked`` error goes on.

    A waiter does not snatch the lock in the gap between two messages of a
    worker that is still committing: each time the lock changes hands
    between processes, the new holder reads every page it needs again
    (SQLite drops a connection's whole page cache once another connection
    has written), which cost more than the gap. So while ``PRAGMA
    data_version`` (read without any lock) says another connection commits
    poll after poll, a waiter lets up to ``LOCK_PATIENCE`` asks pass. It asks
    at once after a poll with no commit (the holder stopped, or is inside one
    long transaction), and after the first commit that follows such a poll
    (a prune's batch, say, has just ended). ``polling`` changes both for a
    block.

    Every ``SQLITE_BUSY`` is asked again, ``SQLITE_BUSY_RECOVERY`` included
    (another connection is rebuilding the WAL index). The busy timeout is
    set back before the body runs, so the body's statements, and every read
    on this connection or any other, wait as they always did: a reader never
    waits for a writer in WAL mode, and a read that meets a recovery still
    waits for it instead of failing.
    """
    poll, patience = _POLL.get()
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        calm = False  # whether the last poll saw no commit
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            seen, passed, nap = data_version(conn), 0, poll / 8
            while True:
                nap = min(nap * 2, poll)  # poll / 4, / 2, then poll: a short hold ends soon
                time.sleep(nap)
                now = data_version(conn)
                if now is None or now == seen or calm or passed >= patience:
                    break  # ask: nobody committed, or one commit after a quiet spell
                seen, passed = now, passed + 1  # the holder commits again and again
            calm = now == seen
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")


class transaction:  # noqa: N801 - used like a function: ``with transaction(conn):``
    """Run the body inside ``BEGIN IMMEDIATE``: commit on success, roll back on
    any exception (``BaseException`` included, so an interrupt or an encoding
    error never leaves the transaction open).

    ``IMMEDIATE`` takes the write lock before the first read, so choosing a
    row and changing it cannot interleave with another writer; a writer that
    finds it taken polls for it instead of sleeping in SQLite's busy handler
    (``begin_immediate`` says how often, and when it lets a busy holder go on).
    Inside ``drain`` a worker first takes its turn among the workers
    (``turns``), which keeps it from asking while another keeps committing.

    ``relaxed=True`` commits this one transaction at ``synchronous=NORMAL``
    (in WAL mode: its frames are written, not fsynced) and sets the
    connection back to FULL afterwards. The queue uses it for claims and
    prune's transactions; see ``Queue.claim_batch`` and ``retention`` for why
    that loses nothing a caller was told.

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
        turn = TURN.get()
        if turn is not None:  # inside drain: the worker's turn first (``turns``)
            turn.take(self.conn)
        if self.relaxed:
            self.conn.execute("PRAGMA synchronous = NORMAL")
        try:
            begin_immediate(self.conn)
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
            turn = TURN.get()
            if turn is not None:
                turn.done(self.conn)

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
