"""A worker's turn at the write lock: consecutive steps without handing it over.

SQLite admits one writer. Worker processes that all want it took it in turn
message by message, and each waiter woke every millisecond to ask again
(``connection.begin_immediate``). Both cost: every time the lock changes
hands between processes, the new holder reads again every page it needs
(SQLite drops a connection's page cache once another connection has
written), and on a machine with fewer cores than workers, the waiters'
wake-ups take CPU from the holder. Four workers made about 0.85 of one
worker's rate.

So inside ``drain`` a worker takes a turn first: an ``flock`` of the
queue's ``-wal`` file, which the kernel hands to a waiter as soon as it is
let go, while the waiters sleep without waking. The holder keeps it across
its steps for ``TURN_SECONDS``, and lets go at the end (a commit or a
rollback) of its first transaction to end past that; then it waits for its
next turn like the others (asking at once, it would take the turn back
before the waiter the kernel woke could run). The
turn is only an order among the package's own workers: each step still
takes SQLite's write lock (``BEGIN IMMEDIATE``), so a prune, an enqueue, a
command line or any other writer goes on exactly as before, and what a
transaction may do is decided by SQLite's lock alone. With turns, four
workers made 0.90 to 1.06 of one worker's rate in five runs of
``benchmarks/bench.py --writers``, against 0.84 and 0.85 without them the
same day (those runs were taken before ``WAIT_SECONDS`` existed and before
a turn that comes while a worker goes on without one was taken; both act
only when a holder commits nothing for ``IDLE_SECONDS`` or a waiter has
waited ``WAIT_SECONDS``), and 0.92 to 1.00 in seven runs of the code as it
is, taken later the same day (README gives the runs).

Why the ``-wal`` and not the database file: SQLite's unix VFS holds its own
``fcntl`` locks on the database file and on the ``-shm``, and closing any
descriptor of a file drops every ``fcntl`` lock the process holds on it.
SQLite takes no lock on the ``-wal``, so a descriptor of it can be opened
and closed with each ``drain``; it is never created here (no ``-wal``, no
turn), so no file is left behind. The ``-wal`` stays the same file while any
connection to the queue is open, and a worker in ``drain`` has one open.
``flock`` and ``fcntl`` locks are separate on Linux, so the two never meet.

A waiter does not wait long for a holder that commits nothing: it looks
every ``IDLE_SECONDS`` whether another connection committed (``PRAGMA
data_version``), and if none did (the holder is inside a slow handler, in a
caller's callback, or stopped), or once it has waited ``WAIT_SECONDS`` in
all (a stuck holder beside another writer that keeps committing), it goes
to SQLite's lock without its turn, as every writer did before, and goes on
so until its turn comes: a holder stuck for good costs each of the others
one such wait, not one per message. A holder that dies lets go with its
process; a child forked while a turn is open closes its copy of the
descriptor at once, so the turn never outlives the process that took it.
Only a worker outside any transaction waits for a turn, so no process
holds SQLite's lock while it waits for the turn, and the two cannot
deadlock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

try:
    import fcntl
except ImportError:  # not a POSIX system: no flock, no turns (SQLite's lock alone)
    fcntl = None  # type: ignore[assignment]

SQLITE_BUSY = 5  # the primary code of SQLITE_BUSY, _RECOVERY, _SNAPSHOT and _TIMEOUT


def data_version(conn: sqlite3.Connection) -> int | None:
    """What ``PRAGMA data_version`` says now (it changes with every commit of another
    connection), or ``None`` if even that read met a lock (a WAL recovery)."""
    try:
        return int(conn.execute("PRAGMA data_version").fetchall()[0][0])  # read to the end
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF != SQLITE_BUSY:
            raise
        return None


# A holder lets go after its first commit this long after it took the turn. A
# worker's step takes a fraction of a millisecond, so a turn is tens of steps. The
# message a worker's last step of a turn claimed waits out the other workers' turns
# before its ACK, a turn and a commit each: with 4 workers about 30 to 40 ms, where
# turns of 20 ms gave about 60 (``make scale`` prints the claim-to-ACK p99).
TURN_SECONDS = 0.01
# A waiter that saw no other connection commit for this long goes on without its turn,
# and so does one that waited this long in all (the holder is stuck, and another
# writer, an enqueue say, keeps committing). A turn is 10 ms and a commit: a second
# is the turns of about eighty workers.
IDLE_SECONDS = 0.05
WAIT_SECONDS = 1.0


class Turn:
    """The turn of one ``drain`` on one connection (see the module's docstring)."""

    __slots__ = ("conn", "fd", "pid", "since", "granted", "waiting", "bypass", "gave", "failed",
                 "ended", "guard")

    def __init__(self, conn: sqlite3.Connection, fd: int) -> None:
        self.conn = conn
        self.fd = fd
        self.pid = os.getpid()
        self.since: float | None = None  # when this process took the turn
        self.granted = threading.Event()  # set by the helper thread that waited for it
        self.waiting = False  # whether a helper thread is out waiting for the turn
        self.bypass = False  # whether it goes on without its turn until the helper gets it
        self.gave = False  # whether this drain has let go of a turn
        self.failed = False  # whether the helper's flock failed (then no turns)
        self.ended = False
        self.guard = threading.Lock()

    def take(self, conn: sqlite3.Connection) -> None:
        """Before a write transaction on ``conn``: hold the turn, or go on without it
        (see the module's docstring for when)."""
        if conn is not self.conn or self.since is not None or self.pid != os.getpid():
            return
        if self.waiting:
            if self.granted.is_set():  # the helper got it while this went on without it
                self._hold()
                return
            if self.bypass:
                return  # without a turn until the helper gets it
        else:
            if not self.gave:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self.since = time.monotonic()
                    return
                except BlockingIOError:
                    pass
            # A worker that has just let go waits like the others: asking at once, it
            # would take the turn back before the waiter the kernel woke could run.
            self.waiting = True
            threading.Thread(target=self._wait, name="queue-core-turn", daemon=True).start()
        seen, deadline = data_version(conn), time.monotonic() + WAIT_SECONDS
        while not self.granted.wait(IDLE_SECONDS):
            now = data_version(conn)
            if now == seen or time.monotonic() > deadline:
                self.bypass = True  # the holder is idle or stuck: SQLite's lock decides
                return
            seen = now
        self._hold()

    def _hold(self) -> None:
        self.granted.clear()
        self.waiting = self.bypass = False
        self.since = time.monotonic()

    def _wait(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # the kernel wakes this at the let-go
        except OSError:  # no lock to be had (ENOLCK): go on without turns
            with self.guard:
                self.bypass = True
                if self.ended:
                    os.close(self.fd)
                else:
                    self.failed = True
            return
        with self.guard:
            if self.ended:  # drain ended meanwhile: let go, and close what it left
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
            else:
                self.granted.set()

    def done(self, conn: sqlite3.Connection) -> None:
        """After a transaction on ``conn`` ended: let go once the turn is over."""
        if (conn is self.conn and self.since is not None
                and time.monotonic() - self.since >= TURN_SECONDS):
            self.since = None
            self.gave = True
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def end(self) -> None:
        """Let go and close the descriptor, or leave both to a helper still out."""
        if self.pid != os.getpid():
            return
        with self.guard:
            self.ended = True
            if self.waiting and not self.granted.is_set() and not self.failed:
                return  # the helper lets go and closes when the kernel wakes it
            self.since = None
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


TURN: ContextVar[Turn | None] = ContextVar("turn", default=None)
_OPEN: set[Turn] = set()  # the turns of this process's drains that are running now


def _forget_in_child() -> None:
    """In a child forked while a drain ran: close the copies of the turns'
    descriptors, which share the parent's ``flock``: a parent that dies must
    let go of its turn, whatever its children do."""
    for turn in _OPEN:
        try:
            os.close(turn.fd)
        except OSError:
            pass
    _OPEN.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@contextmanager
def turns(conn: sqlite3.Connection, target: str) -> Iterator[None]:
    """In the block, write transactions on ``conn`` take turns with the other
    workers of the queue at ``target`` (see the module's docstring)."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(os.path.realpath(target) + "-wal", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no -wal (the file is not in WAL mode yet): no turns
        yield
        return
    turn = Turn(conn, fd)
    token = TURN.set(turn)
    _OPEN.add(turn)
    try:
        yield
    finally:
        TURN.reset(token)
        _OPEN.discard(turn)
        turn.end()
