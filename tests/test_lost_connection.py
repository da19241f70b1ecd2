"""A PostgreSQL connection lost at a chosen moment of a worker's conversation
with the server: one line, with the ``connection_lost`` code and what it means,
and a later ``work`` finishes every message exactly once.

The worker is a real ``queue-core work`` process. At a crash point of the
protocol it does not die: another connection ends its server backend
(``pg_terminate_backend``, which waits until the backend is gone), and the
worker goes on, into a pipeline whose server has gone. Nothing here waits for
a guessed time, so each case meets the same moment on every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter

import pytest

from conftest import ROOT
from queue_core import ModelClock, Queue, audit
from queue_core.errors import ConnectionLost

LEASE = 30
EVENTS = {f"E{i:04d}": ("toy" if i % 7 == 0 else "book", 100 + i) for i in range(1, 31)}
# Where the backend is ended: a crash point, and which arrival there. The loop's
# own claims (the first, and one after each refused ACK) and failures (a toy for
# the old handler) come fewer times than its ACKs that claim the next. Those ACKs
# are each one call of the schema's step function, which has no point inside
# (``crashpoints.INSIDE_THE_SERVER_STEP``): before_commit is the call sent.
ONE_BY_ONE = [("claim.after_begin", 2), ("claim.before_commit", 2),
              ("complete_and_claim.before_commit", 3), ("complete_and_claim.after_commit", 3),
              ("fail.after_begin", 1), ("fail.before_commit", 1)]
IN_BATCHES = [("claim.before_commit", 2), ("complete.after_begin", 2),
              ("complete.after_insert", 3), ("complete.before_commit", 2),
              ("fail.before_commit", 1)]
BATCH = 4
MEANING = ("every outcome reported before this line is committed; whether the transaction "
           "in flight committed is unknown (its COMMIT may have taken effect without the "
           "answer coming back), and the queue settles it: an effect commits only with its "
           "ACK and the lease's generation fences a second one, so a later work finishes "
           "every message exactly once: run the command again")

# ``queue-core work`` whose backend is ended at the armed point (argv: dsn, the
# victim's application_name, point, arrival, then work's own options).
CUT_WORKER = """
import os, sys
import psycopg
import queue_core.crashpoints as crashpoints

dsn, victim, point, arrival = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def end_my_backend():
    crashpoints._arrivals_left -= 1
    if crashpoints._arrivals_left > 0:
        return
    with psycopg.connect(dsn, autocommit=True, application_name="executioner") as other:
        ended = other.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) "
                              "FROM pg_stat_activity WHERE application_name = %s",
                              (victim,)).fetchone()[0]
    if ended != 1:
        sys.exit(f"expected to end 1 backend, ended {ended}")

crashpoints._arrive = end_my_backend
crashpoints.arm(point, after=arrival)
os.environ["PGAPPNAME"] = victim
from queue_core.cli import main
sys.exit(main(["--db", dsn, "--now", "1000", "work", "--lease-seconds", "30", *sys.argv[5:]]))
"""


def reported_done(stdout: str) -> Counter[str]:
    return Counter(line.split()[0] for line in stdout.splitlines() if " done " in line)


def cut_work(dsn: str, point: str, arrival: int, *options: str) -> subprocess.CompletedProcess[str]:
    victim = f"cut-{uuid.uuid4().hex[:12]}"
    return subprocess.run([sys.executable, "-c", CUT_WORKER, dsn, victim, point, str(arrival),
                           *options], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), PGAPPNAME=victim))


@pytest.mark.parametrize("options, point, arrival",
                         [((), point, arrival) for point, arrival in ONE_BY_ONE]
                         + [(("--batch-size", str(BATCH)), point, arrival)
                            for point, arrival in IN_BATCHES],
                         ids=[f"{p}#{a}" for p, a in ONE_BY_ONE]
                         + [f"batch-{p}#{a}" for p, a in IN_BATCHES])
def test_a_connection_lost_at_any_step_says_so_in_one_line_and_a_later_work_finishes_each_once(
        pg_dsn: str, options: tuple[str, ...], point: str, arrival: int) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000))
    queue.enqueue_jsonl("\n".join(json.dumps({"event_id": e, "payload": {
        "category": c, "amount_cents": a}}) for e, (c, a) in EVENTS.items()))

    cut = cut_work(pg_dsn, point, arrival, *options)

    assert cut.returncode == 1, cut.stderr
    assert cut.stderr.startswith("error: connection_lost: postgresql://")
    assert cut.stderr.endswith(f"; {MEANING}\n")
    assert cut.stderr.count("\n") == 1  # no library's cleanup message, no traceback
    first = reported_done(cut.stdout)
    assert not first or max(first.values()) == 1
    after_cut = audit.snapshot(pg_dsn)
    assert audit.check(after_cut) == []
    stored = {e for e, s in after_cut.states().items() if s == "done"}
    # Everything reported done is committed; at most the transaction in flight
    # committed without its answer reaching the worker (one message, or a batch).
    assert set(first) <= stored and len(stored - set(first)) <= (BATCH if options else 1)
    assert after_cut.status.states["leased"] <= (BATCH if options else 1)
    assert (after_cut.status.effects, after_cut.money) == (
        len(stored), sum(EVENTS[e][1] for e in stored))

    later = subprocess.run([sys.executable, "-m", "queue_core", "--db", pg_dsn, "--now",
                            str(1000 + LEASE), "work", *options], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))

    assert (later.returncode, later.stderr) == (0, "")
    second = reported_done(later.stdout)
    assert not set(second) & stored and (not second or max(second.values()) == 1)
    books = {e for e, (c, _) in EVENTS.items() if c == "book"}
    assert set(second) | stored == books
    final = audit.snapshot(pg_dsn)
    assert audit.check(final) == []
    assert ({s: n for s, n in final.status.states.items() if n}, final.status.effects,
            final.money) == ({"done": len(books), "dead": len(EVENTS) - len(books)}, len(books),
                             sum(EVENTS[e][1] for e in books))


def test_a_transaction_whose_backend_ends_before_its_commit_leaves_no_pipeline_behind(
        pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """psycopg's ``Pipeline`` left open on a broken connection is closed by the
    garbage collector, whenever it runs, and then logs ``error ignored terminating
    <psycopg.Pipeline [BAD] ...>``: a second line beside the command's one."""
    import gc

    import psycopg

    from queue_core.postgres import PostgresStore

    store = PostgresStore(pg_dsn)
    conn = store.connect()
    try:
        with pytest.raises(ConnectionLost) as lost:
            with store.transaction(conn):  # BEGIN sent; the COMMIT will meet a dead backend
                with psycopg.connect(pg_dsn, autocommit=True) as other:
                    assert other.execute("SELECT pg_terminate_backend(%s, 30000)",
                                         (conn.raw.info.backend_pid,)).fetchone() == (True,)
        gc.collect()
    finally:
        conn.close()
    gc.collect()

    assert lost.value.code == "connection_lost" and isinstance(lost.value.__cause__,
                                                                psycopg.OperationalError)
    assert str(lost.value).endswith(f"; {MEANING}") and "\n" not in str(lost.value)

    assert [record.getMessage() for record in caplog.records if record.name == "psycopg"] == []
