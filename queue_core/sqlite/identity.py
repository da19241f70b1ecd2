"""What a file is: the queue's own (and of which schema version), new, or refused.

A queue file carries a mark: ``PRAGMA application_id`` and the schema
version in ``PRAGMA user_version``. ``prepare`` reads a file's header
before anything is written (the switch to WAL included) and accepts only a
missing or empty file, to create (under a name that does not end in
``-wal``, ``-shm`` or ``-journal``, as SQLite names the files it keeps
beside a database), or a file with the queue's own mark: a file of another
application is left byte for byte as it was.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ..errors import UnusableFile
from ..ids import COURSE
from ..marks import APPLICATION_ID, no_such_version, too_new
from .connection import (_connect_immutable, _connect_ro, connect, damaged, read_transaction,
                         transaction)
from .schema import META_TABLE, PAGE_SIZE, SCHEMA_VERSION, SIDE_FILES, schema, statements

# The first schema version that records its id rule; every file before it is a course queue.
RULE_RECORDED = 3


def prepare(path: str | os.PathLike[str], *, create: bool = True, ids: str = COURSE) -> int:
    """Make ``path`` a usable queue file, or refuse it without writing a byte;
    return its schema version.

    A file with the queue's mark is used as it is (nothing is written; one
    of an earlier schema version too: reading it is safe, and writing is
    refused until ``migrations.migrate`` upgraded it). A missing or empty
    file is created, if ``create``. Anything else raises ``UnusableFile``:
    ``not_a_queue`` (another application's database), ``schema_too_new``
    (a later version of this package made it), ``not_a_database`` (not
    SQLite, or truncated), ``no_queue_file``, or ``reserved_name`` (a new
    file named as SQLite names the ``-wal``, ``-shm`` or ``-journal`` of
    another, or a database under one of those names beside ``path``:
    ``refuse_databases_beside``). A created queue's event ids follow the
    rule ``ids``.
    """
    found = inspect(path)
    if found == "queue":
        return schema_version(path)
    if not create:
        raise UnusableFile("no_queue_file", f"{os.fspath(path)}: no queue here yet "
                           "(enqueue a batch to create one)")
    if os.path.basename(os.fspath(path)).endswith(SIDE_FILES):  # no queue is named so
        # SQLite would take it for the -wal (or -shm, -journal) of the file whose name
        # it ends, and the last connection to that file would delete it
        raise UnusableFile("reserved_name", f"{os.fspath(path)}: SQLite names the files it "
                           "keeps beside a database with -wal, -shm or -journal after the "
                           "database's name, and would take a queue named so for one of them "
                           "and delete it: choose a name that does not end so")
    _create(path, ids)
    return schema_version(path)


_DATABASE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database


def refuse_databases_beside(path: str | os.PathLike[str]) -> None:
    """Refuse (``reserved_name``) the file ``path`` if a SQLite database sits beside
    it under the name of one of its side files (``-wal``, ``-shm``, ``-journal``),
    before any connection to ``path`` opens: SQLite would take that database for
    the side file of ``path``, overwrite it and delete it. Releases before the
    names were reserved made queues under such names (``queue.sqlite3-wal``).
    None of SQLite's own side files starts as a database does (a WAL, its
    index and a rollback journal each have a header of their own), so nothing
    SQLite left there is refused. Reads the first bytes of each; writes nothing."""
    name = os.path.realpath(path)  # SQLite keeps the side files beside the file itself
    for suffix in SIDE_FILES:
        try:
            with open(name + suffix, "rb") as side:
                head = side.read(len(_DATABASE_HEADER))
        except OSError:  # none there (or unreadable: SQLite could not use it either)
            continue
        if head == _DATABASE_HEADER:
            beside = os.path.basename(name + suffix)
            raise UnusableFile("reserved_name", f"{os.fspath(path)}: {beside} beside it is "
                               "a SQLite database of its own (a queue an earlier release "
                               "made under that name, say), which SQLite would take for the "
                               f"{suffix} file of {os.path.basename(name)}, overwrite and "
                               "delete: move it, and any -wal and -shm of its own, to a name "
                               "that does not end in -wal, -shm or -journal, then run this "
                               "again")


def id_rule(conn: sqlite3.Connection, version: int) -> str:
    """The rule the event ids of a queue file of schema ``version`` follow
    (``ids``), read on ``conn``: a file made before the rule was recorded is a
    course queue."""
    if version < RULE_RECORDED:
        return COURSE
    return str(conn.execute(f"SELECT id_rule FROM {META_TABLE}").fetchone()[0])


def file_rule(path: str | os.PathLike[str]) -> str | None:
    """The id rule of the queue file ``path`` (``ids``), read as ``read`` reads,
    leaving nothing behind; ``None`` for a file that is no queue yet."""
    from .files import read  # files reads through identity's checks
    if inspect(path) != "queue":
        return None
    version = schema_version(path)
    return read(path, lambda conn: id_rule(conn, version))


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
    refuse_databases_beside(name)
    try:
        with open(name, "rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        return "new"
    except IsADirectoryError:
        raise UnusableFile("not_a_database", f"{name} is a folder, not a file") from None
    if not header:
        return "new"
    if len(header) < 100 or not header.startswith(_DATABASE_HEADER):
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


def _create(path: str | os.PathLike[str], ids: str) -> None:
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
                for statement in statements(schema(ids)):
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        conn.close()
