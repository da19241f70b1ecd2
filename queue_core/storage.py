"""The SQLite file: one schema text that encodes the state machine, the mark
that tells the queue's own files from every other file, the connection
settings, and the single write-transaction helper.

Every request opens its own connection and closes it in ``finally`` (a
``with`` block on a ``sqlite3.Connection`` commits or rolls back but does
NOT close it). A request is one call, or a whole worker session (see
``Queue.session``), whose transactions then share one connection. Nothing
else in the package says ``BEGIN``.

A queue file carries a mark: ``PRAGMA application_id`` and the schema
version in ``PRAGMA user_version``. ``prepare`` reads a file's header
before anything is written (the switch to WAL included) and accepts only a
missing or empty file, to create, or a file with the queue's own mark: a
file of another application is left byte for byte as it was.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import struct
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, TypeVar
from urllib.parse import quote

from .crashpoints import crash_point
from .errors import UnusableFile

from .marks import APPLICATION_ID, no_such_version, refuse_other_version, too_new

try:
    import fcntl
except ImportError:  # not a POSIX system: no file locks of an open file's own
    fcntl = None  # type: ignore[assignment]
from .transitions import EXPIRED, write_journal

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "OFF")
# The queue's pages are small: a row is a few hundred bytes, and every commit
# appends each page it changed, whole, to the WAL before its fsync. An ACK that
# claims the next message changes four pages (its row and the next one's, the
# live index, the effect, the journal): 4 KB with 1 KB pages instead of 16 KB
# with SQLite's default 4 KB.
PAGE_SIZE = 1024
# SQLite checkpoints the WAL into the file once it holds 1000 pages: 4 MB of its
# default 4 KB pages, but only 1 MB of ours. A checkpoint costs two fsyncs and
# rewrites every page the WAL holds: keep the default's 4 MB between them.
CHECKPOINT_PAGES = 4 * 1024 * 1024 // PAGE_SIZE
BUSY_TIMEOUT_SECONDS = 30.0
SCHEMA_VERSION = 2           # PRAGMA user_version of the schema below; ``migrations``
                             # upgrades a file of every earlier version to it

# The state checks are written as OR chains, not ``IN ('ready', ...)``: for an
# IN list of more than two constants SQLite builds a temporary index each time
# a statement checks a row, which cost more than the rest of a journal INSERT.
SCHEMA = """
CREATE TABLE messages (
    event_id     TEXT PRIMARY KEY
                 CONSTRAINT event_id_shape
                 CHECK (length(event_id) = 5 AND event_id GLOB 'E[0-9][0-9][0-9][0-9]'),
    -- NULL once pruned (``retention``); its digest stays, and deduplicates forever.
    payload      TEXT CONSTRAINT payload_is_json CHECK (payload IS NULL OR json_valid(payload)),
    payload_sha256 BLOB NOT NULL
                 CONSTRAINT payload_sha256_shape CHECK (length(payload_sha256) = 32),
    state        TEXT NOT NULL DEFAULT 'ready'
                 CONSTRAINT state_valid CHECK (state = 'ready' OR state = 'leased'
                                               OR state = 'done' OR state = 'dead'),
    attempts     INTEGER NOT NULL DEFAULT 0 CONSTRAINT attempts_valid CHECK (attempts >= 0),
    generation   INTEGER NOT NULL DEFAULT 0
                 CONSTRAINT generation_counts_every_claim CHECK (generation >= attempts),
    available_at INTEGER NOT NULL,
    lease_until  INTEGER,
    last_error   TEXT,
    finished_at  INTEGER,
    CONSTRAINT lease_until_iff_leased CHECK ((state = 'leased') = (lease_until IS NOT NULL)),
    CONSTRAINT leased_was_claimed CHECK (state <> 'leased' OR attempts >= 1),
    CONSTRAINT dead_has_reason CHECK (state <> 'dead' OR last_error IS NOT NULL),
    CONSTRAINT finished_at_iff_done CHECK ((state = 'done') = (finished_at IS NOT NULL)),
    CONSTRAINT pruned_only_when_done CHECK (payload IS NOT NULL OR state = 'done')
) STRICT;

-- ONE index for every row the queue still moves or may prune: those that keep
-- their payload (a pruned row leaves it). Claims and recoveries read their
-- state's range of it (the ready rows in due order, the few leased rows), and
-- prune the oldest done rows; dead rows sit apart. A claim moves a row from the
-- head of the ready range to the end of the leased range just before it, an ACK
-- from there to the end of the done range just before that: the worker loop's
-- step changes one page of this index, where two indexes (ready, leased) changed
-- two. The queries name its condition (``payload IS NOT NULL``), so that the
-- database may use it.
CREATE INDEX messages_live ON messages (state, available_at, event_id, lease_until, finished_at)
    WHERE payload IS NOT NULL;

CREATE TABLE effects (
    event_id     TEXT PRIMARY KEY REFERENCES messages (event_id),
    category     TEXT NOT NULL CONSTRAINT category_named CHECK (length(category) > 0),
    amount_cents INTEGER NOT NULL
                 CONSTRAINT amount_in_range CHECK (amount_cents BETWEEN 1 AND 9999999)
) STRICT, WITHOUT ROWID;  -- the event id IS the key: one b-tree, one page per ACK

-- Journal of state changes, written in the same transaction as each change.
-- Append-only and read whole (plots, audits); no second index, so each
-- commit writes one journal page, not two. One event's history is a scan.
-- A sequence number is never reused: prune never deletes the journal's last
-- row (SQLite gives a new row the largest rowid plus one).
CREATE TABLE transitions (
    seq        INTEGER PRIMARY KEY,
    at         INTEGER NOT NULL,
    event_id   TEXT NOT NULL REFERENCES messages (event_id),
    from_state TEXT CONSTRAINT from_valid
               CHECK (from_state IS NULL OR from_state = 'ready' OR from_state = 'leased'
                      OR from_state = 'done' OR from_state = 'dead'),
    to_state   TEXT NOT NULL
               CONSTRAINT to_valid CHECK (to_state = 'ready' OR to_state = 'leased'
                                          OR to_state = 'done' OR to_state = 'dead'),
    generation INTEGER NOT NULL,
    attempts   INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    -- The state machine's edges, and no others, can be journalled. A CASE, not
    -- an OR of conditions: a comparison with NULL is NULL, and a CHECK that is
    -- NULL passes, so "from_state = 'ready' AND ..." would let NULL -> leased in.
    CONSTRAINT legal_edge CHECK (CASE
        WHEN from_state IS NULL THEN to_state = 'ready'                  -- enqueued
        WHEN from_state = 'ready' THEN to_state = 'leased'               -- claimed
        WHEN from_state = 'leased' THEN to_state = 'done' OR to_state = 'ready'
                                        OR to_state = 'dead'             -- ACK, fail, expiry
        WHEN from_state = 'dead' THEN to_state = 'ready'                 -- redrive
        ELSE FALSE END)
) STRICT;

-- What a pruned message's journal proved, kept in its place (``retention``):
-- enqueued once, claimed ``claims`` times (generations 1..claims, one by one),
-- redriven ``redrives`` times, completed once by its newest lease, with this
-- effect. The audit holds the message and its effect against it.
CREATE TABLE compacted (
    event_id     TEXT PRIMARY KEY REFERENCES messages (event_id),
    enqueued_at  INTEGER NOT NULL,
    claims       INTEGER NOT NULL CONSTRAINT claimed_at_least_once CHECK (claims >= 1),
    redrives     INTEGER NOT NULL CONSTRAINT redrives_counted CHECK (redrives >= 0),
    steps        INTEGER NOT NULL CONSTRAINT steps_counted CHECK (steps >= claims + 2),
    category     TEXT NOT NULL,
    amount_cents INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
"""


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


def connect_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open a connection that can neither create the file nor write to it.

    A hot journal beside the file is rolled back first (see
    ``roll_back_hot_journal``): no read of the file can succeed before that.
    Beside a file in WAL mode such a connection creates the ``-wal`` and
    ``-shm`` files if they are missing, and cannot remove them when it
    closes last: ``read`` is the way to read a file and leave its folder as
    it was.
    """
    roll_back_hot_journal(path)
    return _connect_ro(Path(path).resolve().as_posix())


def _connect_ro(name: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{quote(name)}?mode=ro", uri=True,
                           timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)


T = TypeVar("T")


def read(path: str | os.PathLike[str], body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body`` in ONE read transaction on a connection that writes
    nothing and leaves the folder of ``path`` as it found it.

    SQLite's own read-only connection (``mode=ro``) does not: beside a file
    in WAL mode it creates the ``-wal`` and ``-shm`` files, and it cannot
    remove them when it closes last; where the reader may not write the
    file, they then stand in the way of its owner's next write. So:

    - a hot journal is rolled back first, or refused (``roll_back_hot_journal``);
    - a file in WAL mode with no ``-wal`` beside it is read with
      ``immutable=1``, which opens nothing beside the file. That is safe
      only while no process writes the file, and no process can: every
      connection to a WAL file keeps a ``-wal`` until the last one closes,
      a WAL writer changes the file itself only by a checkpoint of that
      ``-wal``, and this read holds the file's shared lock, as every SQLite
      reader does, so the last closing writer cannot checkpoint and remove
      its ``-wal`` meanwhile. If a ``-wal`` has appeared when the read ends,
      a writer came during it: the figures are dropped and read again,
      through that ``-wal``;
    - any other file is read through ``mode=ro``: in WAL mode it then uses
      the ``-wal`` and ``-shm`` already there, and in rollback mode a reader
      makes no file at all.
    """
    try:
        return _read(path, body)
    except UnicodeDecodeError:
        raise damaged(path) from None


def _read(path: str | os.PathLike[str], body: Callable[[sqlite3.Connection], T]) -> T:
    roll_back_hot_journal(path)
    name = Path(path).resolve().as_posix()
    for _ in range(_UNCHANGED_TRIES):
        reading = _Unchanged.open(name)
        if reading is None:
            break
        try:
            with read_transaction(reading.conn):
                result = body(reading.conn)
            if reading.still_alone():
                return result
        finally:
            reading.close()
    conn = _connect_ro(name)
    try:
        with read_transaction(conn):
            return body(conn)
    finally:
        conn.close()


_UNCHANGED_TRIES = 3
# SQLite's locks on a database file (os_unix.c): the PENDING byte, then the range
# of bytes that readers lock shared and a writer about to change the file exclusive.
_PENDING_BYTE = 0x40000000
_SHARED_FIRST, _SHARED_SIZE = _PENDING_BYTE + 2, 510


class _Unchanged:
    """An ``immutable=1`` connection to a WAL file that has no ``-wal``, and
    the shared lock that keeps a checkpoint from changing the file under it."""

    __slots__ = ("conn", "fd", "wal")

    def __init__(self, conn: sqlite3.Connection, fd: int, wal: str) -> None:
        self.conn, self.fd, self.wal = conn, fd, wal

    @classmethod
    def open(cls, name: str) -> "_Unchanged | None":
        """The connection, or ``None`` where a file must be read otherwise: it is
        not in WAL mode, it has a ``-wal``, or this system has no locks of
        an open file's own (``F_OFD_SETLK``, Linux)."""
        wal = f"{name}-wal"
        if not hasattr(fcntl, "F_OFD_SETLK") or os.path.exists(wal) or not _in_wal_mode(name):
            return None
        fd = os.open(name, os.O_RDONLY)
        try:
            if not _lock_shared(fd) or os.path.exists(wal):
                os.close(fd)
                return None
            conn = _connect_immutable(name)
        except BaseException:
            os.close(fd)
            raise
        return cls(conn, fd, wal)

    def still_alone(self) -> bool:
        """Whether no writer came while the read ran: no ``-wal`` appeared."""
        return not os.path.exists(self.wal)

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            os.close(self.fd)  # and with it the lock, which belongs to this open file


def _in_wal_mode(name: str) -> bool:
    """Whether the file's header says WAL (its read and write versions are 2)."""
    try:
        with open(name, "rb") as file:
            header = file.read(20)
    except OSError:  # missing or unreadable: SQLite's own connection says so
        return False
    return len(header) == 20 and header[18:20] == b"\x02\x02"


def _lock_shared(fd: int) -> bool:
    """Take SQLite's shared lock on the file as a lock of this open file
    (``F_OFD_SETLK``: closing another descriptor of the file in this process,
    as SQLite does, leaves it alone), waiting as SQLite's busy handler would
    while a writer holds the file; ``False`` if it never came free."""
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            _ofd_lock(fd, fcntl.F_RDLCK, _PENDING_BYTE, 1)  # as SQLite: no new reader
            try:                                            # while a writer waits for them
                _ofd_lock(fd, fcntl.F_RDLCK, _SHARED_FIRST, _SHARED_SIZE)
                return True
            finally:
                _ofd_lock(fd, fcntl.F_UNLCK, _PENDING_BYTE, 1)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                return False
        time.sleep(0.001)


def _ofd_lock(fd: int, kind: int, start: int, length: int) -> None:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for a lock of an open file)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", kind, os.SEEK_SET, start,
                                                    length, 0))


def may_write(path: str | os.PathLike[str]) -> bool:
    """Whether this process may write the queue file and every file SQLite
    keeps beside it, and create and remove them in its folder."""
    return unwritable(path) is None


def unwritable(path: str | os.PathLike[str]) -> OSError | None:
    """Why this process may not write the queue file ``path`` (or create it),
    its ``-wal``, ``-shm`` or ``-journal``, or create and remove them in its
    folder: the refusal to raise, naming the first file in the way; ``None``
    if nothing is in the way.

    ``sqlite3.connect`` does not say: it opens a file it may not write
    read-only, silently, and its first write then fails, after the files
    beside it were made.
    """
    name = Path(path).absolute().as_posix()
    folder = os.path.dirname(name)
    needed = [(name, os.R_OK | os.W_OK)] if os.path.exists(name) else []
    needed.append((folder, os.W_OK | os.X_OK))
    needed += [(f"{name}{suffix}", os.R_OK | os.W_OK) for suffix in ("-wal", "-shm", "-journal")
               if os.path.exists(f"{name}{suffix}")]
    for target, mode in needed:
        if not _access(target, mode):
            code = errno.EROFS if _on_read_only_mount(target) else errno.EACCES
            what = "the file's folder" if target == folder else \
                "the queue file" if target == name else os.path.basename(target)
            return OSError(code, f"{os.strerror(code)} (this user may not write {what}, "
                                 "which this command must)", target)
    return None


def _access(target: str, mode: int) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(target, mode, effective_ids=True)
    return os.access(target, mode)


def _on_read_only_mount(target: str) -> bool:
    try:
        return bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        return False


SQLITE_READONLY_ROLLBACK = 776  # a read-only connection met a hot journal


def roll_back_hot_journal(path: str | os.PathLike[str]) -> None:
    """Roll back the transaction a killed writer left in a hot journal, or refuse.

    A file switched from WAL to a rollback journal (``journal_mode=DELETE``)
    keeps in ``-journal`` the pages a transaction is about to overwrite; a
    writer killed before COMMIT leaves that journal *hot*, the file possibly
    half-written. SQLite calls it hot only when no connection holds a lock
    to write, so its writer is gone. The first connection that can write
    and reads the file copies those pages back and deletes the journal (a
    rollback, not a new write: the bytes become those of the last commit,
    as every reader must see them anyway); a read-only connection cannot,
    and fails (``attempt to write a readonly database``). So a reader does
    what SQLite does for every writer, holding the exclusive lock only for
    the rollback, and creates no file.

    A rollback writes the file, reads and writes the journal and deletes it
    from the folder. SQLite does not ask first: where it may write the file
    but not delete the journal, it copies the pages back, then fails
    (``disk I/O error``) and leaves the journal hot; where it may not write
    the journal, it fails (``unable to open database file``). So this
    process's permissions are asked first: where it may not do all of it,
    ``UnusableFile("hot_journal")`` says what to run, and not a byte is
    touched. Without a ``-journal`` file beside an existing file there is
    nothing to do.
    """
    name = Path(path).resolve().as_posix()
    journal = f"{name}-journal"
    if not (os.path.isfile(name) and os.path.exists(journal)):
        return  # only a rollback journal can be hot; a missing file stays missing
    if _hot_journal_probe(name, "ro"):
        return  # no hot journal: a live writer's, or none at all
    if not (_access(name, os.R_OK | os.W_OK) and _access(journal, os.R_OK | os.W_OK)
            and _access(os.path.dirname(name), os.W_OK | os.X_OK)):
        raise UnusableFile("hot_journal", f"{os.fspath(path)}: a writer died mid-transaction "
                           f"and left {os.path.basename(journal)}, which must be rolled back "
                           "before anything can be read, and this process may not do that "
                           "(write the file and the journal, and delete the journal from the "
                           "folder): run the same command once as a user who can write to "
                           "the file, its journal and its folder")
    _hot_journal_probe(name, "rw")  # "rw" never creates a file; only SQLite's rollback writes


def _hot_journal_probe(name: str, mode: str) -> bool:
    """Read the file's schema through a ``mode`` connection: ``True`` if that
    worked (at ``rw``: after SQLite rolled the journal back), ``False`` if a
    read-only connection met a hot journal."""
    conn = sqlite3.connect(f"file:{quote(name)}?mode={mode}", uri=True,
                           timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return True
    except sqlite3.OperationalError as exc:
        if mode == "ro" and exc.sqlite_errorcode == SQLITE_READONLY_ROLLBACK:
            return False
        raise
    finally:
        conn.close()


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


def prepare(path: str | os.PathLike[str], *, create: bool = True) -> int:
    """Make ``path`` a usable queue file, or refuse it without writing a byte;
    return its schema version.

    A file with the queue's mark is used as it is (nothing is written; one
    of an earlier schema version too: reading it is safe, and writing is
    refused until ``migrations.migrate`` upgraded it). A missing or empty
    file is created, if ``create``. Anything else raises ``UnusableFile``:
    ``not_a_queue`` (another application's database), ``schema_too_new``
    (a later version of this package made it), ``not_a_database`` (not
    SQLite, or truncated) or ``no_queue_file``.
    """
    found = inspect(path)
    if found == "queue":
        return schema_version(path)
    if not create:
        raise UnusableFile("no_queue_file", f"{os.fspath(path)}: no queue here yet "
                           "(enqueue a batch to create one)")
    _create(path)
    return schema_version(path)


def schema_version(path: str | os.PathLike[str]) -> int:
    """The schema version of the queue file ``path`` (``PRAGMA user_version``)
    as its last commit left it: from the header's bytes 60-63 while no
    ``-wal`` holds commits, else through SQLite (see ``_identity``)."""
    return _identity(os.fspath(path))[1]


def inspect(path: str | os.PathLike[str]) -> str:
    """``queue``, ``new`` (missing or empty) or raise ``UnusableFile``; writes nothing.

    The file is judged as its last commit left it (``_identity``): by its
    100-byte header while no ``-wal`` holds commits, else through SQLite,
    which reads the header's page from the ``-wal``. Only a SQLite file
    without the mark is opened further, read-only, to see whether it holds
    anything at all.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        return "new"
    except IsADirectoryError:
        raise UnusableFile("not_a_database", f"{name} is a folder, not a file") from None
    if not header:
        return "new"
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise UnusableFile("not_a_database", f"{name} is not a SQLite database; "
                           "the queue writes only to its own files")
    application_id, version = _identity(name, header)
    if application_id == APPLICATION_ID:
        if version < 1:
            raise no_such_version(name, version)
        if version > SCHEMA_VERSION:
            raise too_new(name, version, SCHEMA_VERSION)
        if os.path.exists(f"{name}-journal"):  # perhaps hot: read once it is rolled back
            return "queue"
        try:
            tables = _tables(name)
        except UnicodeDecodeError:
            raise damaged(name) from None
        except sqlite3.DatabaseError as exc:
            raise UnusableFile("not_a_database", f"{name} is damaged: SQLite cannot read its "
                               f"tables ({exc})") from None
        if "messages" not in tables:  # the mark set by hand, or by another program
            raise UnusableFile("not_a_queue", f"{name} carries the queue's mark (application_id "
                               f"and schema version {version}) but holds no queue "
                               f"({_listed(tables)}); the queue writes only to its own files")
        return "queue"
    if _is_empty_database(name):
        return "new"
    raise UnusableFile("not_a_queue", f"{name} is a database of another application "
                       f"(application_id {application_id}: {_table_names(name)}); "
                       "the queue writes only to its own files")


def _identity(name: str, header: bytes | None = None) -> tuple[int, int]:
    """The file's application id and schema version as its last commit left them.

    While no ``-wal`` holds commits, the main file is the last commit, and
    its header (``header``, or read here) is read as bytes, without opening
    the database: a foreign file is then refused without SQLite touching
    it. The header's page count is checked against the file's size there
    (a file cut short is refused as ``not_a_database``).

    A ``-wal`` that holds frames overrides the main file: a commit that is
    still there (a writer killed before its checkpoint), or a checkpoint
    killed half-way, which has copied some pages, the header's among them,
    and not others. The main file's bytes are then not what was committed
    and may be shorter than its header counts, though nothing is lost: so
    the identity is read through SQLite (``mode=ro``, using the ``-wal``
    and ``-shm`` already there, as ``read`` does), and the size is not
    compared, since the pages the main file lacks are in the ``-wal``.

    Only for a main file that carries the queue's application id, though:
    a queue file gets its mark in the main file when it is created, before
    it is switched to WAL, and keeps it, so a main file without the mark
    was never a queue. Its ``-wal`` is another application's, and SQLite,
    which writes to a ``-shm`` as it reads (and creates a missing one), is
    not let near it.
    """
    if header is None:
        with open(name, "rb") as file:
            header = file.read(100)
    marked = int.from_bytes(header[68:72], "big") == APPLICATION_ID
    if marked and _wal_holds_frames(name):
        try:
            conn = _connect_ro(Path(name).resolve().as_posix())
            try:
                with read_transaction(conn):
                    return (int(conn.execute("PRAGMA application_id").fetchone()[0]),
                            int(conn.execute("PRAGMA user_version").fetchone()[0]))
            finally:
                conn.close()
        except UnicodeDecodeError:
            raise damaged(name) from None
        except sqlite3.DatabaseError as exc:
            raise UnusableFile("not_a_database", f"{name}: {exc}") from exc
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96] and pages > 0
    size = os.path.getsize(name)
    application_id = int.from_bytes(header[68:72], "big")
    if application_id == APPLICATION_ID and valid and size < pages * page_size:
        raise UnusableFile("not_a_database", f"{name} is truncated: its header counts "
                           f"{pages * page_size} bytes, the file has {size}")
    return application_id, int.from_bytes(header[60:64], "big")


def _wal_holds_frames(name: str) -> bool:
    """Whether a ``-wal`` beside ``name`` holds anything (a header at least)."""
    try:
        return os.path.getsize(f"{name}-wal") > 0
    except OSError:
        return False


def _is_empty_database(name: str) -> bool:
    """Whether a SQLite file without the mark holds nothing at all.

    Read through ``immutable=1``, which opens no ``-wal`` or ``-shm`` file
    beside it; a non-empty WAL beside the file counts as content.
    """
    wal = Path(f"{name}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return False
    try:
        conn = _connect_immutable(name)
        try:
            return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise UnusableFile("not_a_database", f"{name}: {exc}") from exc


def _table_names(name: str) -> str:
    """The tables of another application's file, read from the main file alone
    (``immutable=1``, nothing opened beside it), and whether its ``-wal`` holds
    commits that were not read (see ``_identity``)."""
    unread = (", and commits in its -wal that the queue leaves unread"
              if _wal_holds_frames(name) else "")
    try:
        conn = _connect_immutable(name)
        try:
            tables = [row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        finally:
            conn.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError):
        return "unreadable tables" + unread
    if not tables and unread:
        return "no tables in the file itself" + unread
    return _listed(tables) + unread


def _tables(name: str) -> list[str]:
    """The names of a queue file's tables as its last commit left them, read-only."""
    # Through the -wal where it holds frames: a WAL file's tables may exist only there.
    conn = (_connect_ro(Path(name).resolve().as_posix()) if _wal_holds_frames(name)
            else _connect_immutable(name))
    try:
        return [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    finally:
        conn.close()


def _listed(tables: list[str]) -> str:
    return "tables " + ", ".join(tables[:6]) if tables else "no tables"


def _connect_immutable(name: str) -> sqlite3.Connection:
    uri = f"file:{quote(Path(name).resolve().as_posix())}?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, isolation_level=None)


def _create(path: str | os.PathLike[str]) -> None:
    """Create the schema and the mark in one transaction, then switch to WAL.

    Under the write lock the file is looked at again: another process may
    have created the queue meanwhile (then nothing is done), or written
    something else (then it is refused and the transaction rolled back).
    WAL comes last, so a refused file is never switched.
    """
    conn = connect(path)
    try:
        # Both take effect only on an empty file, before its first table. Incremental
        # auto-vacuum lets prune give the pages it frees back to the file system.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        with transaction(conn):
            application_id = conn.execute("PRAGMA application_id").fetchone()[0]
            objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if application_id != APPLICATION_ID:
                if objects:
                    raise UnusableFile("not_a_queue", f"{os.fspath(path)} was filled by "
                                       "another application while the queue was opening it")
                for statement in statements(SCHEMA):
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        conn.close()


def statements(script: str) -> list[str]:
    """Split the schema into statements (``executescript`` would COMMIT first)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements


# -- migrations: one step per schema version, each in ONE transaction ------------------

# Schema 1 -> 2 (``SCHEMA`` above is 2). SQLite cannot drop a column's NOT NULL
# or add a NOT NULL column without a default in place, so ``messages`` is
# rebuilt: a new table, filled from the old one, renamed into its place (the
# steps of "Making Other Kinds Of Table Schema Changes" in SQLite's ALTER TABLE
# page). The other tables keep their rows; their foreign keys name
# ``messages``, which they find again once the rename is done.
_MESSAGES_V2 = next(statement for statement in statements(SCHEMA)
                    if "CREATE TABLE messages (" in statement)
_REBUILD_MESSAGES_V2 = (
    _MESSAGES_V2.replace("CREATE TABLE messages (", "CREATE TABLE messages_v2 (", 1),
    # A done message finished when its last ``done`` step was journalled; a
    # done message with no such step (a file edited by hand: the audit says
    # so) is given the time it became available, so the copy never fails.
    "INSERT INTO messages_v2 (event_id, payload, payload_sha256, state, attempts, generation, "
    "available_at, lease_until, last_error, finished_at) "
    "SELECT m.event_id, m.payload, queue_sha256(m.payload), m.state, m.attempts, m.generation, "
    "m.available_at, m.lease_until, m.last_error, "
    "CASE WHEN m.state = 'done' THEN coalesce(f.at, m.available_at) END "
    "FROM messages AS m LEFT JOIN (SELECT event_id, max(at) AS at FROM transitions "
    "WHERE to_state = 'done' GROUP BY event_id) AS f ON f.event_id = m.event_id",
    "DROP TABLE messages",
    "ALTER TABLE messages_v2 RENAME TO messages",
    *(statement for statement in statements(SCHEMA)
      if "CREATE INDEX messages_live" in statement or "CREATE TABLE compacted" in statement),
)


def _sqlite_1_to_2(conn: sqlite3.Connection) -> int:
    conn.create_function("queue_sha256", 1, _sha256_of_text, deterministic=True)
    rows = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    for statement in _REBUILD_MESSAGES_V2:
        conn.execute(statement)
    return int(rows)


def _sha256_of_text(text: str | None) -> bytes | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).digest()


# version -> the step that upgrades a file of that version to the next one
SQLITE_STEPS: dict[int, Callable[[sqlite3.Connection], int]] = {1: _sqlite_1_to_2}


def migrate_step(path: str | os.PathLike[str], version: int) -> int | None:
    """Upgrade the queue file ``path`` from schema ``version`` to the next, in ONE
    transaction; return how many messages it rewrote, or ``None`` if the file
    was no longer at ``version`` once the write lock was taken (another
    migrator was first: nothing is done twice).

    The version is read again inside the transaction, under the write lock;
    the step and the new ``user_version`` commit together, so a crash leaves
    the old version intact or the new one complete. Foreign keys are off for
    the step's connection, as a table rebuild needs (``DROP TABLE`` would
    otherwise check every effect and journal row against a table being
    replaced), and ``foreign_key_check`` must find nothing before the commit.
    """
    conn = connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")  # only outside a transaction
        with transaction(conn):
            crash_point("migrate.after_begin")
            if conn.execute("PRAGMA user_version").fetchone()[0] != version:
                return None
            rows = SQLITE_STEPS[version](conn)
            crash_point("migrate.after_copy")
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise UnusableFile("migration_failed", f"{os.fspath(path)}: after the step to "
                                   f"schema {version + 1}, {len(broken)} rows point at no "
                                   "message; nothing was changed")
            conn.execute(f"PRAGMA user_version = {version + 1}")
            crash_point("migrate.before_commit")
        crash_point("migrate.after_commit")
        return rows
    finally:
        conn.close()


# -- the store: what differs between SQLite and PostgreSQL ------------------------------

class SqliteStore:
    """The queue's SQLite file behind the interface the protocol calls.

    See ``stores`` for what a store supplies; ``postgres.PostgresStore``
    is the other one.
    """

    name = "sqlite"
    schema_version = SCHEMA_VERSION
    expired = EXPIRED  # the claim's read of expired leases: the leased range of messages_live
    fused_step = False  # the worker's step runs here, in one local transaction
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

    def prepare(self, *, create: bool = True) -> int:
        return prepare(self.target, create=create)

    def migrate_step(self, version: int) -> int | None:
        return migrate_step(self.target, version)

    def connect(self, *, synchronous: str = "FULL") -> sqlite3.Connection:
        return connect(self.target, synchronous=synchronous)

    def connect_readonly(self) -> sqlite3.Connection:
        return connect_readonly(self.target)

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
