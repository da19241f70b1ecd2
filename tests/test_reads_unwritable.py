"""A reading command leaves the folder as it found it, on any file it can read;
a writing command that may not write says so and touches nothing.

Every case is run by a user without write permission: as root here, whom
file modes do not stop, the command runs with every capability dropped
(``setpriv``), so the modes decide as they do for anyone else. Before and
after, every file in the folder is compared byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from conftest import DATA, ROOT
from observe import expect, ledger
from queue_core import Handler, ModelClock, Queue, drain
from queue_core.audit import findings
from test_hot_journal import KILLED_WRITER  # a writer that dies with its journal hot

BEFORE = {"states": {"ready": 3, "leased": 0, "done": 1, "dead": 0}, "effects": 1,
          "totals": {"book": 10000}, "total": 10000, "pruned": 0, "ids": "course"}
NOBODY = 65534
AUDIT = """
import sys
from queue_core import Queue, UnusableFile
from queue_core.audit import findings
try:
    queue = Queue(sys.argv[1], create=False)
    print(queue.status().total, len(queue.messages()), findings(sys.argv[1]))
except UnusableFile as refused:
    sys.exit(f"{refused.code}: {refused}")
"""


def unprivileged() -> tuple[str, ...]:
    """The prefix that runs a command without root's override of file modes."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is needed to drop root's override of file modes")
    return ("setpriv", "--bounding-set=-all", "--inh-caps=-all")


def cli(db: Path, *args: str, privileged: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = () if privileged else unprivileged()
    return subprocess.run([*prefix, sys.executable, "-m", "queue_core", "--db", str(db),
                           "--now", "1000", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def audit_as_reader(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*unprivileged(), sys.executable, "-c", AUDIT, str(db)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def folder_bytes(folder: Path) -> dict[str, str]:
    """Every file in the folder: its name and the digest of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.iterdir())}


@pytest.fixture
def queue_file(tmp_path: Path) -> Path:
    """A queue that has done some work (E0001 done), alone in a folder of its own."""
    db = tmp_path / "queue" / "q.sqlite3"
    db.parent.mkdir()
    queue = Queue(db, clock=ModelClock(1000), lease_seconds=2)
    queue.enqueue_file(DATA / "demo.jsonl")
    assert len(drain(queue, Handler(), max_messages=1)) == 1
    assert [path.name for path in db.parent.iterdir()] == ["q.sqlite3"]
    yield db
    restore(db.parent)


def restore(folder: Path) -> None:
    os.chown(folder, os.getuid(), os.getgid())
    folder.chmod(0o755)
    for path in folder.iterdir():
        os.chown(path, os.getuid(), os.getgid())
        path.chmod(0o644)


def read_only_file(db: Path) -> None:
    db.chmod(0o444)


def read_only_folder(db: Path) -> None:
    db.parent.chmod(0o555)


def another_users_file_and_folder(db: Path) -> None:
    os.chown(db, NOBODY, NOBODY)
    os.chown(db.parent, NOBODY, NOBODY)


def read_only_wal_and_shm_beside_it(db: Path) -> None:
    """What an earlier reader of a read-only file left: an empty -wal and a -shm,
    both read-only to everyone but their owner."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.execute("SELECT count(*) FROM messages").fetchone()
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        os.chown(f"{db}{suffix}", NOBODY, NOBODY)
        os.chmod(f"{db}{suffix}", 0o444)


UNWRITABLE: dict[str, Callable[[Path], None]] = {
    "read-only file": read_only_file,
    "read-only folder": read_only_folder,
    "another user's file and folder": another_users_file_and_folder,
    "read-only -wal and -shm": read_only_wal_and_shm_beside_it,
}


@pytest.mark.parametrize("case", UNWRITABLE)
@pytest.mark.parametrize("reader", ["status", "metrics", "audit"])
def test_a_reader_that_may_not_write_reads_and_leaves_every_byte_and_file_as_it_was(
        queue_file: Path, case: str, reader: str) -> None:
    db = queue_file
    UNWRITABLE[case](db)
    before = folder_bytes(db.parent)

    result = audit_as_reader(db) if reader == "audit" else cli(db, reader, "--json")

    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    if reader == "audit":
        assert result.stdout == "10000 4 []\n"
    else:
        figures = json.loads(result.stdout)
        assert figures["states" if reader == "status" else "depth"] == BEFORE["states"]
    assert folder_bytes(db.parent) == before
    # Nothing was left in the way of the file's owner: once it may write, work works.
    restore(db.parent)
    for suffix in ("-wal", "-shm"):  # what the case itself put there, not the reader
        if case == "read-only -wal and -shm":
            Path(f"{db}{suffix}").unlink()
    worked = cli(db, "work")
    assert (worked.returncode, worked.stderr) == (0, "")
    assert [path.name for path in db.parent.iterdir()] == ["q.sqlite3"]
    assert ledger(db) == expect(total=17000, effects=3, done=3, dead=1)
    assert findings(db) == []


@pytest.mark.parametrize("case", UNWRITABLE)
@pytest.mark.parametrize("args", [["work"], ["redrive", "E0004"],
                                  ["enqueue", str(DATA / "twenty.jsonl")]],
                         ids=["work", "redrive", "enqueue"])
def test_a_writing_command_that_may_not_write_refuses_with_one_line_and_touches_nothing(
        queue_file: Path, case: str, args: list[str]) -> None:
    db = queue_file
    UNWRITABLE[case](db)
    before = folder_bytes(db.parent)
    in_the_way = {"read-only file": db, "read-only folder": db.parent,
                  "another user's file and folder": db,
                  "read-only -wal and -shm": Path(f"{db}-wal")}[case]

    result = cli(db, *args)

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"error: os_error: {in_the_way}: Permission denied (this "
                                    "user may not write ")
    assert result.stderr.endswith(", which this command must)\n")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert folder_bytes(db.parent) == before


def test_enqueue_into_a_folder_it_may_not_write_creates_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "queue"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = cli(folder / "q.sqlite3", "enqueue", str(DATA / "demo.jsonl"))
    finally:
        folder.chmod(0o755)

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"error: os_error: {folder}: Permission denied (this user may "
                             "not write the file's folder, which this command must)\n")
    assert list(folder.iterdir()) == []


def test_reading_through_the_package_leaves_no_wal_or_shm_beside_the_file(
        queue_file: Path) -> None:
    """Where the reader may write too: SQLite's read-only connection, closing last,
    would leave the -wal and -shm it made."""
    db = queue_file
    queue = Queue(db, clock=ModelClock(1000), create=False)

    assert queue.status().total == 10000
    assert len(queue.messages()) == 4 and len(queue.transitions()) == 6
    assert findings(db) == []

    assert [path.name for path in db.parent.iterdir()] == ["q.sqlite3"]


# -- a hot journal that this reader may not roll back -------------------------------------

@pytest.fixture
def hot_journal(queue_file: Path) -> tuple[Path, str]:
    """The queue switched to a rollback journal, then a writer killed mid-transaction:
    the file is half-written and its -journal hot. Returns the file and the digest of
    the file as its last commit left it."""
    db = queue_file
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    finally:
        conn.close()
    committed = hashlib.sha256(db.read_bytes()).hexdigest()
    assert subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)]).returncode == 86
    assert hashlib.sha256(db.read_bytes()).hexdigest() != committed
    return db, committed


HOT_OBSTACLES: dict[str, Callable[[Path], None]] = {
    "read-only folder": read_only_folder,
    "read-only journal": lambda db: os.chmod(f"{db}-journal", 0o444),
    "unreadable journal": lambda db: os.chmod(f"{db}-journal", 0o000),
    "read-only file": read_only_file,
}


@pytest.mark.parametrize("obstacle", HOT_OBSTACLES)
@pytest.mark.parametrize("reader", ["status", "metrics", "audit"])
def test_a_hot_journal_this_reader_may_not_roll_back_is_refused_and_no_page_rewritten(
        hot_journal: tuple[Path, str], obstacle: str, reader: str) -> None:
    db, committed = hot_journal
    HOT_OBSTACLES[obstacle](db)
    torn = folder_bytes(db.parent)

    result = audit_as_reader(db) if reader == "audit" else cli(db, reader)

    assert result.returncode == 1 and result.stdout == ""
    line = (f"hot_journal: {db}: a writer died mid-transaction and left q.sqlite3-journal, "
            "which must be rolled back before anything can be read")
    assert result.stderr.startswith(line if reader == "audit" else f"error: {line}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.rstrip().endswith("run the same command once as a user who can write "
                                           "to the file, its journal and its folder")
    assert folder_bytes(db.parent) == torn  # not a page of the file rewritten

    restore(db.parent)  # where it may write, the same command rolls back, then reads
    recovered = cli(db, "status", "--json")
    assert (recovered.returncode, json.loads(recovered.stdout)) == (0, BEFORE)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == committed
    assert [path.name for path in db.parent.iterdir()] == ["q.sqlite3"]


def test_a_writer_that_comes_during_an_immutable_read_makes_it_read_again_through_the_wal(
        queue_file: Path) -> None:
    """``immutable=1`` is safe only while nobody writes the file: a read that finds a
    ``-wal`` when it ends drops its figures and reads again, through that ``-wal``;
    and the writer, closing meanwhile, could not checkpoint under the read."""
    from queue_core.sqlite import read

    db = queue_file
    calls: list[int] = []

    def body(conn: sqlite3.Connection) -> int:
        count = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        if not calls:  # a writer comes, commits and goes while the first read runs
            queue = Queue(db, clock=ModelClock(1000))
            queue.enqueue_jsonl(json.dumps({"event_id": "E0009", "payload": {
                "category": "pen", "amount_cents": 5}}))
            assert Path(f"{db}-wal").exists()  # its closing checkpoint could not run
        calls.append(count)
        return count

    assert read(db, body) == 5
    assert calls == [4, 5]
    assert findings(db) == []
