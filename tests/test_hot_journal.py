"""A queue file switched to a rollback journal, and a writer killed mid-transaction.

WAL is the queue's own mode, but the file's owner may switch it
(``PRAGMA journal_mode = DELETE``). A writer killed after SQLite synced the
journal and began to overwrite pages in the file leaves a *hot* journal and a
half-written file. A read-only connection cannot roll that back; the reading
commands roll it back as any connection that can write does, so the figures
and the audit are those of the last commit and the file is again byte for
byte what it was before the killed transaction. Where the reader may not
write, it refuses with one line and touches nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from observe import expect, ledger
from queue_core import Handler, ModelClock, Queue, drain
from queue_core.audit import findings
from queue_core.lab.story import run_child

# A writer whose transaction outgrows its one-page cache, so SQLite syncs the
# journal and writes changed pages into the file before COMMIT; then it dies.
KILLED_WRITER = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 1")
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE messages SET last_error = hex(randomblob(2000))")
conn.execute("CREATE TABLE filler (x BLOB)")
for _ in range(200):
    conn.execute("INSERT INTO filler VALUES (randomblob(3000))")
os._exit(86)
"""
BEFORE = {"states": {"ready": 3, "leased": 0, "done": 1, "dead": 0}, "effects": 1,
          "totals": {"book": 10000}, "total": 10000, "pruned": 0, "ids": "course"}


def cli(db: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "queue_core", "--db", str(db),
                           "--now", "1000", *args], capture_output=True, text=True, timeout=120)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def rollback_queue(tmp_path: Path) -> Path:
    """A queue that has done some work (E0001 done), then switched to a rollback journal."""
    db = tmp_path / "q.sqlite3"
    queue = Queue(db, clock=ModelClock(1000), lease_seconds=2)
    queue.enqueue_file(DATA / "demo.jsonl")
    assert len(drain(queue, Handler(), max_messages=1)) == 1
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    finally:
        conn.close()
    return db


def kill_a_writer_mid_transaction(db: Path) -> str:
    """Run the killed writer; return the digest of the file as it was before it."""
    before = digest(db)
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], timeout=120)
    assert killed.returncode == 86
    assert Path(f"{db}-journal").stat().st_size > 0
    assert digest(db) != before  # the file is half-written: only the journal can undo it
    return before


@pytest.mark.parametrize("reader", ["status", "metrics", "audit"])
def test_the_first_reader_rolls_a_hot_journal_back_to_the_last_commit(
        rollback_queue: Path, reader: str) -> None:
    db = rollback_queue
    before = kill_a_writer_mid_transaction(db)

    if reader == "audit":
        assert findings(db) == []
    else:
        result = cli(db, reader, "--json")
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        figures = json.loads(result.stdout)
        assert figures["states" if reader == "status" else "depth"] == BEFORE["states"]

    assert digest(db) == before  # byte for byte the file of the last commit
    assert sorted(path.name for path in db.parent.iterdir()) == ["q.sqlite3"]  # journal gone
    assert json.loads(cli(db, "status", "--json").stdout) == BEFORE
    assert findings(db) == []
    assert ledger(db) == expect(total=10000, effects=1, done=1, ready=3)


def count_unwritten_pages_in_the_header(db: Path) -> None:
    """Page 1 as a COMMIT writes it first (it writes pages in order): its header
    counts the grown file, whose last pages the killed writer never wrote."""
    data = bytearray(db.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    data[28:32] = (len(data) // page_size + 50).to_bytes(4, "big")
    data[92:96] = data[24:28]  # "the size in the header is valid"
    db.write_bytes(data)


@pytest.mark.parametrize("command", ["status", "work"])
def test_a_writer_killed_during_commit_is_rolled_back_not_refused_as_truncated(
        rollback_queue: Path, command: str) -> None:
    db = rollback_queue
    before = kill_a_writer_mid_transaction(db)
    count_unwritten_pages_in_the_header(db)

    result = cli(db, command)

    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert not Path(f"{db}-journal").exists()
    if command == "status":
        assert digest(db) == before
        assert ledger(db) == expect(total=10000, effects=1, done=1, ready=3)
    else:
        assert ledger(db) == expect(total=17000, effects=3, done=3, dead=1)
    assert findings(db) == []


def test_without_the_rollback_the_read_only_connection_fails(rollback_queue: Path) -> None:
    """What the reading commands did before they rolled back: the failure is SQLite's."""
    db = rollback_queue
    kill_a_writer_mid_transaction(db)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly database") as caught:
            conn.execute("SELECT count(*) FROM messages")
    finally:
        conn.close()
    assert caught.value.sqlite_errorcode == 776  # SQLITE_READONLY_ROLLBACK


def read_only_prefix(folder: Path) -> tuple[str, ...]:
    """A command prefix under which ``folder`` cannot be written: as root (whom
    file modes do not stop) a read-only bind mount in a private mount namespace;
    otherwise the folder's and its files' modes are taken away (put back by the test)."""
    if os.geteuid() != 0:
        for path in [*folder.iterdir(), folder]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        return ()
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(folder))


def test_a_reader_that_may_not_write_refuses_with_one_line_and_touches_nothing(
        rollback_queue: Path) -> None:
    db = rollback_queue
    before = kill_a_writer_mid_transaction(db)
    torn = {path.name: digest(path) for path in db.parent.iterdir()}

    try:
        refused = cli(db, "status", prefix=read_only_prefix(db.parent))
    finally:
        for path in [db.parent, *db.parent.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)

    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr.startswith(f"error: hot_journal: {db}: a writer died mid-transaction")
    assert "run the same command once as a user who can write" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert {path.name: digest(path) for path in db.parent.iterdir()} == torn

    recovered = cli(db, "status", "--json")  # where it may write, the same command recovers
    assert (recovered.returncode, json.loads(recovered.stdout)) == (0, BEFORE)
    assert digest(db) == before


def test_a_worker_killed_before_its_commit_leaves_no_hot_journal_and_status_reads_on(
        rollback_queue: Path) -> None:
    """Killed after its effect INSERT: the journal was never synced, so it is not hot
    and the file holds only committed pages; the claim it committed before stays."""
    db = rollback_queue
    child = run_child(db, now=1000, lease_seconds=2, crash_at="complete.after_insert")
    assert child.exit_code == 86

    result = cli(db, "status", "--json")

    assert (result.returncode, result.stderr) == (0, "")
    assert json.loads(result.stdout) == {**BEFORE, "states": {"ready": 2, "leased": 1,
                                                              "done": 1, "dead": 0}}
    assert findings(db) == []
    worked = cli(db, "work")  # the next writer removes the journal; at 1000 E0002's lease holds
    assert worked.returncode == 0, worked.stderr
    assert not Path(f"{db}-journal").exists()
    assert ledger(db) == expect(total=15000, effects=2, done=2, dead=1, leased=1)
