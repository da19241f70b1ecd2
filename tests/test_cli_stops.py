"""Every way ``queue-core work`` ends gives back or settles every lease it holds,
through real processes and real pipes: a reader that closes the pipe in the
middle of a batch, a reader that stalls while the message claimed ahead runs
out of time, then a signal or a close, and a message taken over meanwhile.

The output pipe is made small (one page), so that a worker whose reader has
stopped reading is blocked in a write long before it runs out of messages;
the tests wait for that state (the kernel says where the process sleeps) and
for the lease's deadline on the system clock, never for a guessed time.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import read_back
from observe import expect, ledger
from queue_core.audit import findings

PIPE_BYTES = 4096
WAIT_SECONDS = 30


def command(db: Path, *args: str, now: int | None = None) -> list[str]:
    clock = [] if now is None else ["--now", str(now)]
    return [sys.executable, "-m", "queue_core", "--db", str(db), *clock, *args]


def enqueue(db: Path, events: list[tuple[str, str, int]], *, now: int | None = None) -> None:
    batch = db.parent / "batch.jsonl"
    batch.write_text("".join(json.dumps({"event_id": e, "payload": {
        "category": c, "amount_cents": a}}) + "\n" for e, c, a in events))
    subprocess.run(command(db, "enqueue", str(batch), now=now), check=True, capture_output=True)
    batch.unlink()


def small_pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return read_end, write_end


@pytest.fixture
def worker() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The worker processes a test starts; any still running at the end is killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_work(started: list[subprocess.Popen[bytes]], db: Path, *args: str,
               now: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``work`` writing into a small pipe; returns the process and the pipe's read end."""
    read_end, write_end = small_pipe()
    proc = subprocess.Popen(command(db, "work", *args, now=now), stdout=write_end,
                            stderr=subprocess.PIPE)
    os.close(write_end)
    started.append(proc)
    return proc, read_end


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


@functools.cache
def kernel_says_where_a_writer_sleeps() -> bool:
    """Whether ``/proc/PID/wchan`` names the pipe write a process is blocked in
    (a kernel may keep it to itself); asked of ``yes`` writing into a full pipe."""
    read_end, write_end = small_pipe()
    proc = subprocess.Popen(["yes"], stdout=write_end)
    os.close(write_end)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if open(f"/proc/{proc.pid}/wchan").read().endswith("pipe_write"):
                return True
            time.sleep(0.01)
        return False
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)


def blocked_writing(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process sleeps in a write to a full pipe, as the kernel says."""
    assert proc.poll() is None, "the worker ended before its reader stalled"
    return open(f"/proc/{proc.pid}/wchan").read().endswith("pipe_write")


def leased(db: Path) -> list[tuple[str, int, int]]:
    return read_back(db, "SELECT event_id, generation, lease_until FROM messages "
                         "WHERE state = 'leased'")


def stall_past_the_deadline(proc: subprocess.Popen[bytes], db: Path) -> tuple[str, int]:
    """Wait until the worker is blocked writing, holding the lease its last ACK
    claimed ahead, and until that lease's deadline has passed; return it."""
    if not kernel_says_where_a_writer_sleeps():
        pytest.skip("this kernel does not say where a blocked process sleeps (/proc/PID/wchan)")
    wait_for(lambda: blocked_writing(proc), "the worker to block on its stalled reader")
    [(event_id, generation, lease_until)] = leased(db)
    wait_for(lambda: int(time.time()) >= lease_until, "the claimed-ahead lease to run out")
    assert blocked_writing(proc) and leased(db) == [(event_id, generation, lease_until)]
    return event_id, generation


def books(n: int) -> list[tuple[str, str, int]]:
    return [(f"E{i:04d}", "book", 100 + i) for i in range(1, n + 1)]


def journal(db: Path, event_id: str) -> list[tuple[str, int]]:
    return read_back(db, "SELECT reason, attempts FROM transitions WHERE event_id = ? "
                         "ORDER BY seq", (event_id,))


def finish_and_check(db: Path, events: list[tuple[str, str, int]], *, dead: int = 0,
                     now: int | None = None) -> None:
    """The stopped worker left its file consistent and alone, with nothing leased;
    a later run finishes every message once."""
    assert sorted(path.name for path in db.parent.iterdir()) == [db.name]
    assert ledger(db)["states"]["leased"] == 0
    assert findings(db) == []
    done = subprocess.run(command(db, "work", now=now), capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    money = sum(a for _, c, a in events if c != "toy")
    assert ledger(db) == expect(total=money, effects=len(events) - dead,
                                done=len(events) - dead, dead=dead)
    assert findings(db) == []


# -- a reader that goes away in the middle of a batch ----------------------------------

def test_a_closed_pipe_in_a_batch_settles_every_lease_of_the_batch_and_exits_141(
        tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    # One valid message and 199 an old handler refuses: 200 lines of outcome are far
    # more than the pipe holds, so the reader's close meets the worker mid-batch.
    db = tmp_path / "q.sqlite3"
    events = [("E0001", "book", 100), *((f"E{i:04d}", "toy", 100) for i in range(2, 201))]
    enqueue(db, events, now=1000)
    proc, read_end = start_work(worker, db, "--batch-size", "100", now=1000)

    with os.fdopen(read_end, "rb") as reader:  # like: work --batch-size 100 | head -1
        assert reader.readline().startswith(b"E0001 done")
    err = proc.stderr.read() if proc.stderr else b""
    proc.wait(timeout=WAIT_SECONDS)

    assert (proc.returncode, err) == (141, b"")
    states = ledger(db)["states"]
    assert (states["leased"], states["done"], states["ready"] + states["dead"]) == (0, 1, 199)
    assert states["dead"] >= 99  # the first batch's refusals, all settled before any report
    # what is ready was never claimed: no attempt spent, nothing waits for a deadline
    assert read_back(db, "SELECT count(*) FROM messages WHERE state = 'ready' "
                         "AND attempts > 0") == [(0,)]
    assert read_back(db, "SELECT DISTINCT attempts, last_error FROM messages "
                         "WHERE state = 'dead'") == [(1, "invalid_payload")]
    assert ledger(db)["total"] == 100
    finish_and_check(db, events, dead=199, now=1000)


# -- a reader that stalls past the deadline of the message claimed ahead ---------------

def test_a_signal_to_a_worker_blocked_on_a_stalled_reader_stops_it_and_gives_the_lease_back(
        tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    db = tmp_path / "q.sqlite3"
    events = books(300)
    enqueue(db, events)
    proc, read_end = start_work(worker, db, "--lease-seconds", "2")
    ahead, _ = stall_past_the_deadline(proc, db)

    proc.send_signal(signal.SIGTERM)  # the reader never reads again
    proc.wait(timeout=WAIT_SECONDS)
    err = proc.stderr.read().decode() if proc.stderr else ""
    os.close(read_end)

    assert proc.returncode == 143
    assert err.startswith("stopped by SIGTERM after ") and err.count("\n") == 1
    assert "already lost" not in err and "Traceback" not in err
    assert journal(db, ahead)[-2:] == [("claimed", 1), ("released", 0)]
    finish_and_check(db, events)


def test_a_signal_then_a_reader_that_reads_on_ends_with_143_not_a_refusal(
        tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    db = tmp_path / "q.sqlite3"
    events = books(300)
    enqueue(db, events)
    proc, read_end = start_work(worker, db, "--lease-seconds", "2")
    ahead, _ = stall_past_the_deadline(proc, db)

    proc.send_signal(signal.SIGTERM)
    with os.fdopen(read_end, "rb") as reader:
        lines = reader.read().splitlines()
    proc.wait(timeout=WAIT_SECONDS)
    err = proc.stderr.read().decode() if proc.stderr else ""

    assert proc.returncode == 143, err
    assert err.startswith("stopped by SIGTERM after ") and err.count("\n") == 1
    assert "lease_expired" not in err and "already lost" not in err
    processed = int(err.split(" after ")[1].split()[0])
    assert len(lines) <= processed  # every line read is an outcome that was committed
    assert journal(db, ahead)[-2:] == [("claimed", 1), ("released", 0)]
    finish_and_check(db, events)


def test_a_stalled_reader_that_closes_the_pipe_past_the_deadline_ends_it_quietly_with_141(
        tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    db = tmp_path / "q.sqlite3"
    events = books(300)
    enqueue(db, events)
    proc, read_end = start_work(worker, db, "--lease-seconds", "2")
    ahead, _ = stall_past_the_deadline(proc, db)

    os.close(read_end)
    proc.wait(timeout=WAIT_SECONDS)
    err = proc.stderr.read() if proc.stderr else b""

    assert (proc.returncode, err) == (141, b"")
    assert journal(db, ahead)[-2:] == [("claimed", 1), ("released", 0)]
    finish_and_check(db, events)


def test_a_message_taken_over_while_the_worker_was_held_up_is_named_already_lost_in_the_stop(
        tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    db = tmp_path / "q.sqlite3"
    events = books(300)
    enqueue(db, events)
    proc, read_end = start_work(worker, db, "--lease-seconds", "2")
    ahead, generation = stall_past_the_deadline(proc, db)
    other = subprocess.run(command(db, "work"), capture_output=True, text=True, timeout=120)
    assert (other.returncode, other.stderr) == (0, "")
    assert f"{ahead} done (generation {generation + 1})" in other.stdout  # it recovered it

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=WAIT_SECONDS)
    err = proc.stderr.read().decode() if proc.stderr else ""
    os.close(read_end)

    assert proc.returncode == 143, err
    assert err.count("\n") == 1 and err.startswith("stopped by SIGTERM after ")
    assert (f"; {ahead}, claimed ahead, was already lost (stale_generation: its lease had run "
            "out while this worker was held up, and another worker has claimed it since), "
            "so there was nothing to give back: run work again to go on") in err
    assert journal(db, ahead) == [("enqueued", 0), ("claimed", 1), ("lease_expired", 1),
                                  ("claimed", 2), ("completed", 2)]
    assert ledger(db) == expect(total=sum(a for _, _, a in events), effects=300, done=300)
    finish_and_check(db, events)


def test_on_postgresql_a_signal_to_a_worker_blocked_past_the_deadline_gives_the_lease_back(
        pg_dsn: str, tmp_path: Path, worker: list[subprocess.Popen[bytes]]) -> None:
    """The same stop on the other store, where the server's clock judges the deadline."""
    import psycopg

    from queue_core import Queue, audit

    events = books(300)
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"event_id": e, "payload": {
        "category": c, "amount_cents": a}}) + "\n" for e, c, a in events))
    subprocess.run([sys.executable, "-m", "queue_core", "--db", pg_dsn, "enqueue", str(batch)],
                   check=True, capture_output=True)
    read_end, write_end = small_pipe()
    proc = subprocess.Popen([sys.executable, "-m", "queue_core", "--db", pg_dsn, "work",
                             "--lease-seconds", "2"], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    worker.append(proc)
    if not kernel_says_where_a_writer_sleeps():
        pytest.skip("this kernel does not say where a blocked process sleeps (/proc/PID/wchan)")
    wait_for(lambda: blocked_writing(proc), "the worker to block on its stalled reader")
    [ahead] = [m for m in audit.snapshot(pg_dsn).messages.values() if m.state == "leased"]
    with psycopg.connect(pg_dsn) as conn:
        def server_now() -> int:
            return int(conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()))"
                                    "::bigint").fetchone()[0])
        wait_for(lambda: server_now() >= ahead.lease_until, "the lease to run out")

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=WAIT_SECONDS)
    err = proc.stderr.read().decode() if proc.stderr else ""
    os.close(read_end)

    assert proc.returncode == 143, err
    assert err.startswith("stopped by SIGTERM after ") and err.count("\n") == 1
    queue = Queue(pg_dsn)
    assert [(t.reason, t.attempts) for t in queue.transitions(ahead.event_id)][-2:] == [
        ("claimed", 1), ("released", 0)]
    snap = audit.snapshot(pg_dsn)
    assert audit.check(snap) == [] and snap.status.states["leased"] == 0
    done = subprocess.run([sys.executable, "-m", "queue_core", "--db", pg_dsn, "work"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    final = audit.snapshot(pg_dsn)
    assert audit.check(final) == []
    assert (final.status.states["done"], final.status.effects, final.money) == (
        300, 300, sum(a for _, _, a in events))
