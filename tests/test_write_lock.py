"""A writer that finds SQLite's write lock taken by another process asks for it
again until it is free (``sqlite.connection.begin_immediate``), instead of
sleeping in SQLite's busy handler. Every test here holds the lock in a real
second process, and none asserts on how long anything took: only on what
happened, in what order."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from queue_core import Queue
from queue_core.sqlite import connection, polling

BOOK = '{{"event_id": "{}", "payload": {{"category": "book", "amount_cents": 100}}}}'

# A second process that takes the write lock and keeps it until told to go on
# (one line on stdin), then commits and waits to be told to end; or, with
# "churn", commits row after row until told to stop. It reports on stdout.
_HOLDER = r"""
import json, sqlite3, sys, time
db, mode = sys.argv[1], sys.argv[2]
conn = sqlite3.connect(db, isolation_level=None, timeout=60)
conn.execute("CREATE TABLE IF NOT EXISTS lock_test (n INTEGER)")
def say(**what):
    print(json.dumps(what), flush=True)
if mode == "hold":
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO lock_test VALUES (1)")
    say(held=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    say(released=True)
    sys.stdin.readline()
else:
    import threading
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    commits, deadline = 0, time.monotonic() + 120
    while not stop.is_set() and time.monotonic() < deadline:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO lock_test VALUES (?)", (commits,))
        conn.execute("COMMIT")
        commits += 1
        if commits == 1:
            say(churning=True)
    say(commits=commits, stopped_by_the_test=stop.is_set())
conn.close()
"""


class Holder:
    """The second process, driven one line at a time."""

    def __init__(self, db: Path, mode: str = "hold") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(db), mode], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def said(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the holder process ended with {self.proc.wait()}"
        return dict(json.loads(line))

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write("\n\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        assert self.proc.wait(timeout=60) == 0


@pytest.fixture
def queue_file(tmp_path: Path) -> Path:
    db = tmp_path / "q.sqlite3"
    Queue(db)
    return db


@pytest.fixture
def holder(queue_file: Path) -> Iterator[Holder]:
    started = Holder(queue_file)
    try:
        assert started.said() == {"held": True}
        yield started
    finally:
        started.end()


def _busy_timeout(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA busy_timeout").fetchone()[0])


def test_a_waiting_writer_goes_on_once_the_other_process_commits(queue_file: Path,
                                                                 holder: Holder) -> None:
    queue = Queue(queue_file)
    results: list[Any] = []

    def write() -> None:
        with queue.session():
            results.append(queue.enqueue_jsonl(BOOK.format("E0001")))
            # the wait asked with a busy timeout of 0; the connection has its own back
            results.append(_busy_timeout(queue.connection))
    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.5)
    assert writer.is_alive() and not results  # it cannot write while the lock is held
    holder.go_on()
    assert holder.said() == {"released": True}
    writer.join(60)
    assert not writer.is_alive()
    assert results[0].inserted == 1
    assert results[1] == int(connection.BUSY_TIMEOUT_SECONDS * 1000)
    holder.end()
    assert queue.status().states["ready"] == 1
    assert sorted(path.name for path in queue_file.parent.iterdir()) == ["q.sqlite3"]


def test_a_reader_never_waits_for_the_writer(queue_file: Path, holder: Holder) -> None:
    queue = Queue(queue_file)
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.append(queue.status()))
    reader.start()
    reader.join(60)  # the other process still holds the write lock
    assert not reader.is_alive() and read[0].states["ready"] == 0


def test_a_writer_gives_up_after_the_busy_timeout_with_its_connection_as_it_was(
        queue_file: Path, holder: Holder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_SECONDS", 0.3)
    queue = Queue(queue_file)
    with queue.session():
        conn = queue.connection
        with pytest.raises(sqlite3.OperationalError, match="locked") as raised:
            queue.enqueue_jsonl(BOOK.format("E0001"))
        assert raised.value.sqlite_errorcode & 0xFF == connection.SQLITE_BUSY
        assert not conn.in_transaction
        assert _busy_timeout(conn) == 300
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL, as opened
        holder.go_on()
        assert holder.said() == {"released": True}
        assert queue.enqueue_jsonl(BOOK.format("E0001")).inserted == 1  # the same connection


def test_a_second_connection_of_the_same_thread_waits_for_the_first_then_gives_up(
        queue_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested in one process: the inner writer cannot have the lock the outer one
    holds; it gives up after the busy timeout as SQLite's busy handler did, and
    the outer transaction, its locks untouched, commits."""
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_SECONDS", 0.3)
    outer, inner = Queue(queue_file), Queue(queue_file)
    with outer.session(), outer.transaction() as conn:
        conn.execute("INSERT INTO messages (event_id, payload, payload_sha256, available_at) "
                      "VALUES ('E0002', '{}', zeroblob(32), 0)")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            inner.enqueue_jsonl(BOOK.format("E0001"))
    states = inner.status().states
    assert states["ready"] == 1  # the outer row only
    assert inner.enqueue_jsonl(BOOK.format("E0001")).inserted == 1


def test_a_waiting_writer_is_not_starved_by_a_process_that_keeps_committing(
        queue_file: Path) -> None:
    """While the other process commits, a waiter lets a few asks pass, but never
    all of them: it gets the lock while the other is still committing."""
    churn = Holder(queue_file, "churn")
    try:
        assert churn.said() == {"churning": True}
        queue = Queue(queue_file)
        assert queue.enqueue_jsonl(BOOK.format("E0001")).inserted == 1
        churn.go_on()
        report = churn.said()
        assert report["stopped_by_the_test"] and report["commits"] > 1
    finally:
        churn.end()


def test_polling_sets_how_often_to_ask_for_the_block_only() -> None:
    default = connection._POLL.get()
    assert default == (connection.LOCK_POLL_SECONDS, connection.LOCK_PATIENCE)
    with polling(0.0002):
        assert connection._POLL.get() == (0.0002, 0)
        with pytest.raises(KeyError), polling(0.5, 3):
            assert connection._POLL.get() == (0.5, 3)
            raise KeyError
        assert connection._POLL.get() == (0.0002, 0)
    assert connection._POLL.get() == default


def test_prune_beside_a_process_holding_the_lock_waits_then_prunes(
        queue_file: Path, holder: Holder) -> None:
    queue = Queue(queue_file)
    done: list[Any] = []
    pruning = threading.Thread(target=lambda: done.append(queue.prune(0)))
    pruning.start()
    pruning.join(0.5)
    holder.go_on()
    assert holder.said() == {"released": True}
    pruning.join(60)
    assert not pruning.is_alive() and done[0].messages == 0
