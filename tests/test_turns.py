"""Workers on one SQLite file take turns at the write lock (``sqlite.turns``): a
turn is an ``flock`` of the ``-wal``, which a worker holds across its steps
and the kernel hands to the next waiter. The turn only orders the workers;
SQLite's own lock still decides every transaction, so exactly-once holds
whatever the turns do, and a holder that commits nothing never stops the
others."""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import read_back
from observe import expect, ledger
from queue_core import Handler, ModelClock, Outcome, Queue, drain
from queue_core.lab.story.child import ChildResult, collect, open_gate, run_child
from queue_core.sqlite import turns as turns_module
from queue_core.sqlite.turns import TURN

BOOK = '{{"event_id": "E{:04d}", "payload": {{"category": "book", "amount_cents": {}}}}}\n'


def fill(queue: Queue, count: int) -> int:
    """Enqueue ``count`` book events of 1, 2, ... cents; return their total."""
    for start in range(1, count + 1, 1000):  # a batch holds at most 1,000 lines
        end = min(start + 1000, count + 1)
        queue.enqueue_jsonl("".join(BOOK.format(n, n) for n in range(start, end)))
    return count * (count + 1) // 2


def collect_within(proc: subprocess.Popen[str], seconds: float = 60) -> ChildResult:
    """``collect``, but a worker that hangs is killed and the test fails, not hangs."""
    killed: list[bool] = []
    timer = threading.Timer(seconds, lambda: (killed.append(True), proc.kill()))
    timer.start()
    try:
        result = collect(proc)
    except RuntimeError:  # the kill's exit status, or a real failure
        if killed:
            pytest.fail(f"a worker process did not finish within {seconds:.0f} s")
        raise
    finally:
        timer.cancel()
    return result


def open_fds() -> Counter[str]:
    """How many descriptors this process has open on each path (SQLite's own
    descriptor of the -wal and a turn's are two of the same path)."""
    paths: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths[os.readlink(f"/proc/self/fd/{fd}")] += 1
        except OSError:  # the descriptor listdir itself used, closed by now
            pass
    return paths


class HeldTurn:
    """The turn held from this test process, on a descriptor of its own: a holder
    that commits nothing (a worker stopped between two steps)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.reader = sqlite3.connect(db_path)  # keeps the -wal while the test holds it
        self.reader.execute("SELECT count(*) FROM messages").fetchall()
        self.fd = os.open(f"{db_path}-wal", os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def free(self) -> bool:
        """Whether another descriptor could take the turn now."""
        return wal_is_free(self.db_path)

    def close(self) -> None:
        os.close(self.fd)
        self.reader.close()


def wal_is_free(db_path: Path) -> bool:
    """Whether a descriptor of ``db_path``'s ``-wal`` could take the turn now (the
    last connection to close removes the ``-wal``: then nobody can)."""
    try:
        probe = os.open(f"{db_path}-wal", os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(probe)  # closing lets go of the probe's own flock, if it took one


def helpers_done() -> None:
    """Wait for every helper thread still out waiting for a turn (they end once
    the turn is free, closing the descriptor their drain left them)."""
    for thread in threading.enumerate():
        if thread.name == "queue-core-turn":
            thread.join(timeout=30)
            assert not thread.is_alive(), "a turn's helper thread never got the turn"


def test_four_worker_processes_taking_turns_add_each_event_once(
        queue: Queue, db_path: Path) -> None:
    total = fill(queue, 2000)
    gate = db_path.parent / "gate"
    gate.mkdir()
    procs = [run_child(db_path, now=1000, wait=False, mode="drain", gate=gate)
             for _ in range(4)]
    assert all(isinstance(proc, subprocess.Popen) for proc in procs)
    open_gate(gate, 4)
    results = [None] * 4

    def collect_into(i: int) -> None:  # read all four at once: a full pipe stops a worker
        results[i] = collect_within(procs[i])  # type: ignore[arg-type]

    readers = [threading.Thread(target=collect_into, args=(i,)) for i in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()

    assert [r.exit_code for r in results] == [0, 0, 0, 0]  # type: ignore[union-attr]
    done = sorted(o.event_id for r in results for o in r.outcomes)  # type: ignore[union-attr]
    assert done == [f"E{n:04d}" for n in range(1, 2001)]  # each exactly once
    assert ledger(db_path) == expect(total=total, effects=2000, done=2000)
    assert read_back(db_path, "SELECT count(*) FROM transitions WHERE reason = 'claimed'") == \
        [(2000,)]
    assert wal_is_free(db_path)  # every worker let go of its turn


def test_a_holder_that_commits_nothing_does_not_stop_a_worker(
        queue: Queue, db_path: Path) -> None:
    total = fill(queue, 300)
    held = HeldTurn(db_path)  # and it never lets go while the worker runs
    try:
        proc = run_child(db_path, now=1000, wait=False, mode="drain")
        result = collect_within(proc)  # type: ignore[arg-type]  # the turn held all along
    finally:
        held.close()

    assert result.exit_code == 0  # it went on without the turn, under SQLite's lock
    assert [o.event_id for o in result.outcomes] == [f"E{n:04d}" for n in range(1, 301)]
    assert ledger(db_path) == expect(total=total, effects=300, done=300)


def test_a_worker_waits_out_a_holder_idle_once_per_drain_not_once_per_message(
        queue: Queue, db_path: Path, handler: Handler,
        monkeypatch: pytest.MonkeyPatch) -> None:
    total = fill(queue, 50)
    waits: list[bool] = []

    class CountingEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            got = super().wait(timeout)
            if timeout == turns_module.IDLE_SECONDS:  # not a thread's start
                waits.append(got)
            return got

    monkeypatch.setattr(turns_module.threading, "Event", CountingEvent)
    held = HeldTurn(db_path)
    try:
        outcomes = drain(queue, handler)
        assert not held.free()
    finally:
        held.close()
    helpers_done()

    assert [o.kind for o in outcomes] == ["done"] * 50
    assert ledger(db_path) == expect(total=total, effects=50, done=50)
    assert waits == [False]  # one look at an idle holder: nobody committed since


def test_drain_lets_go_of_its_turn_and_its_descriptor_whatever_ends_it(
        queue: Queue, db_path: Path, handler: Handler) -> None:
    fill(queue, 5)
    with queue.session():  # the -wal exists once a connection has read the file
        before = open_fds()

        def closed_pipe(outcome: object) -> None:
            raise BrokenPipeError("the reader went away")

        with pytest.raises(BrokenPipeError):
            drain(queue, handler, on_outcome=closed_pipe)
        assert TURN.get() is None
        assert wal_is_free(db_path)
        assert open_fds() == before

        drain(queue, handler)
        assert wal_is_free(db_path)
        assert open_fds() == before
    assert ledger(db_path) == expect(total=15, effects=5, done=5)


def test_a_drain_that_ends_while_waiting_leaves_the_descriptor_to_its_helper(
        queue: Queue, db_path: Path, handler: Handler) -> None:
    total = fill(queue, 3)
    with queue.session():
        wal = str(db_path) + "-wal"
        before = open_fds()[wal]  # SQLite's own descriptor of it
        held = HeldTurn(db_path)
        try:
            drain(queue, handler)  # waits once, then goes on under SQLite's lock
            assert not held.free()
        finally:
            held.close()  # the helper gets the turn, lets go and closes
        helpers_done()
        assert open_fds()[wal] == before  # (the held turn's reader may leave SQLite an
        # unused descriptor of the database file, which it keeps while it holds locks)
        assert wal_is_free(db_path)
    assert ledger(db_path) == expect(total=total, effects=3, done=3)


def test_a_worker_with_its_turn_still_waits_for_sqlites_lock(
        queue: Queue, db_path: Path) -> None:
    total = fill(queue, 20)
    writer = sqlite3.connect(db_path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # another writer (an enqueue, a prune) holds it
        proc = run_child(db_path, now=1000, wait=False, mode="drain")
        assert isinstance(proc, subprocess.Popen)
        deadline = time.monotonic() + 30
        while wal_is_free(db_path):  # until the worker has taken its turn
            assert proc.poll() is None and time.monotonic() < deadline, \
                "the worker neither took its turn nor kept running"
            time.sleep(0.01)
        assert proc.poll() is None  # with its turn, it waits for SQLite's lock
        assert ledger(db_path) == expect(total=0, effects=0, ready=20)
        writer.execute("ROLLBACK")
        result = collect_within(proc)
    finally:
        writer.close()

    assert result.exit_code == 0
    assert len(result.outcomes) == 20
    assert ledger(db_path) == expect(total=total, effects=20, done=20)
    assert set(os.listdir(db_path.parent)) <= {db_path.name, f"{db_path.name}-shm",
                                               f"{db_path.name}-wal"}  # nothing left behind


def test_a_stuck_holder_beside_a_writer_that_keeps_committing_stops_no_worker(
        queue: Queue, db_path: Path, handler: Handler) -> None:
    total = fill(queue, 40)
    # another writer: an enqueue every 10 ms, of events due later than the worker's now
    producer = Queue(db_path, clock=ModelClock(5000))
    stop = threading.Event()
    produced: list[int] = []

    def enqueue_every_10_ms() -> None:
        while not stop.is_set() and len(produced) < 9000:  # E1000 to E9999 at most
            n = 1000 + len(produced)
            producer.enqueue_jsonl(BOOK.format(n, 1))
            produced.append(n)
            stop.wait(0.01)

    held = HeldTurn(db_path)
    enqueuer = threading.Thread(target=enqueue_every_10_ms)
    outcomes: list[Outcome] = []
    worker = threading.Thread(target=lambda: outcomes.extend(drain(queue, handler)))
    enqueuer.start()
    worker.start()
    try:
        worker.join(timeout=60)  # without WAIT_SECONDS it waits as long as both go on
        stuck = worker.is_alive()
    finally:
        stop.set()
        enqueuer.join()
        held.close()
        worker.join()
    helpers_done()

    assert not stuck, "the worker waited for a stuck holder while another writer committed"
    assert sorted(o.event_id for o in outcomes if o.kind == "done") == \
        [f"E{n:04d}" for n in range(1, 41)]
    assert ledger(db_path) == expect(total=total, effects=40, done=40, ready=len(produced))


def test_a_turn_that_comes_while_going_on_without_it_is_taken_and_let_go(
        queue: Queue, db_path: Path, handler: Handler,
        monkeypatch: pytest.MonkeyPatch) -> None:
    total = fill(queue, 10)
    monkeypatch.setattr(turns_module, "TURN_SECONDS", 0.0)  # let go after every commit
    held = HeldTurn(db_path)
    free_after: list[bool] = []

    def look(outcome: object) -> None:
        if len(free_after) == 0 and not held.fd < 0:  # the first outcome: the holder goes
            held.close()
            held.fd = -1
            deadline = time.monotonic() + 30
            while wal_is_free(db_path):  # until this drain's helper has the turn
                assert time.monotonic() < deadline, "the helper never got the turn"
                time.sleep(0.001)
            free_after.append(False)
        else:  # every later step took the turn it was given, and let go at its commit
            free_after.append(wal_is_free(db_path))

    try:
        outcomes = drain(queue, handler, on_outcome=look)
    finally:
        if held.fd >= 0:
            held.close()
    helpers_done()

    assert [o.kind for o in outcomes] == ["done"] * 10
    assert ledger(db_path) == expect(total=total, effects=10, done=10)
    assert free_after == [False] + [True] * 9


DIES_HOLDING_ITS_TURN = """
import os, sys, time
from queue_core import Handler, ModelClock, Queue, drain
from queue_core.sqlite import turns
turns.TURN_SECONDS = 3600.0  # the turn is still held at the first outcome, however slow
queue = Queue(sys.argv[1], clock=ModelClock(1000))

def fork_then_die(outcome):
    assert turns.TURN.get().since is not None  # held: it dies holding it
    child = os.fork()
    if child == 0:  # a child forked mid-drain (a handler's subprocess, say) lives on
        quiet = os.open(os.devnull, os.O_RDWR)
        os.dup2(quiet, 1)  # not the parent's pipes: the test reads them to their end
        os.dup2(quiet, 2)
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    os._exit(0)  # the parent dies between two steps, holding its turn

drain(queue, Handler(), on_outcome=fork_then_die)
"""


def test_a_worker_that_dies_holding_its_turn_lets_go_though_its_forked_child_lives(
        queue: Queue, db_path: Path) -> None:
    fill(queue, 3)
    reader = sqlite3.connect(db_path)  # keeps the -wal while the test looks at it
    reader.execute("SELECT count(*) FROM messages").fetchall()
    try:
        parent = subprocess.run([sys.executable, "-c", DIES_HOLDING_ITS_TURN, str(db_path)],
                                capture_output=True, text=True, timeout=60, check=True,
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        child = int(parent.stdout.split()[0])
        try:
            os.kill(child, 0)  # still alive, holding a copy of the parent's descriptors
            free = wal_is_free(db_path)
        finally:
            os.kill(child, signal.SIGKILL)
    finally:
        reader.close()

    assert free  # the turn went with the process that took it
    assert ledger(db_path) == expect(total=1, effects=1, done=1, leased=1,
                                     ready=1)  # E0002 claimed ahead
