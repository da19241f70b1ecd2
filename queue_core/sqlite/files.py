"""Reads that leave the file's folder as they found it, and a killed writer's hot journal."""

from __future__ import annotations

import errno
import os
import sqlite3
import struct
import time
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import quote

from ..errors import UnusableFile

try:
    import fcntl
except ImportError:  # not a POSIX system: no file locks of an open file's own
    fcntl = None  # type: ignore[assignment]
from .connection import _connect_immutable, _connect_ro, damaged, read_transaction
from .identity import refuse_databases_beside
from .schema import BUSY_TIMEOUT_SECONDS, SIDE_FILES

T = TypeVar("T")


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
    needed += [(f"{name}{suffix}", os.R_OK | os.W_OK) for suffix in SIDE_FILES
               if os.path.exists(f"{name}{suffix}")]
    for target, mode in needed:
        # another process's last connection may remove its -wal or -shm meanwhile
        if not _access(target, mode) and os.path.exists(target):
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
    the journal, it fails (``unable to open database file``). A database
    under the name of a side file is refused first (``reserved_name``,
    ``identity.refuse_databases_beside``). Then this process's permissions
    are asked: where it may not do all of it,
    ``UnusableFile("hot_journal")`` says what to run, and not a byte is
    touched. Without a ``-journal`` file beside an existing file there is
    nothing to do.
    """
    refuse_databases_beside(path)  # before any connection: it would overwrite them
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
