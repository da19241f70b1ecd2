"""What PostgreSQL adds or changes: many writers at once, a server apart from
the workers, one clock for many hosts, a schema shared with other tables.

Real server, real worker processes; only the clock is modelled (and
``DatabaseClock`` is tested against the server's own).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from conftest import ROOT
from queue_core.lab.story.child import run_child
from queue_core import (Handler, LeaseLost, ModelClock, NotRedrivable, Queue, UnusableFile,
                        audit)
from queue_core.lab.story.child import open_gate, reap
from pg import with_lock_timeout
from queue_core.postgres import DatabaseClock, PostgresStore
from queue_core.postgres.connection import _placeholders
from queue_core.transitions import CLAIM, DUE, REDRIVE, picking

pytestmark = pytest.mark.usefixtures("pg_dsn")


def jsonl(events: list[tuple[str, str, int]]) -> str:
    return "\n".join(json.dumps({"event_id": e, "payload": {"category": c, "amount_cents": a}})
                     for e, c, a in events)


def sql(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    """Rows as a second, independent connection sees them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def ledger(dsn: str) -> tuple[int, int, dict[str, int]]:
    snap = audit.snapshot(dsn)
    assert audit.check(snap) == []
    return (snap.status.total, snap.status.effects,
            {state: n for state, n in snap.status.states.items() if n})


def test_a_worker_killed_after_its_effect_insert_leaves_nothing_and_the_retry_counts_once(
        pg_dsn: str, model_clock: ModelClock) -> None:
    queue = Queue(pg_dsn, clock=model_clock, lease_seconds=2)
    queue.enqueue_jsonl(jsonl([("E0003", "book", 5000)]))

    crashed = run_child(pg_dsn, now=1000, lease_seconds=2, crash_at="complete.after_insert")

    assert crashed.exit_code == 86 and crashed.outcomes == ()
    # The dropped connection ended its transaction: the INSERT is gone, no lock is left.
    assert sql(pg_dsn, "SELECT count(*) FROM effects") == [(0,)]
    assert ledger(pg_dsn) == (0, 0, {"leased": 1})
    model_clock.set(1002)
    retry = queue.claim()
    assert (retry.event_id, retry.generation, retry.attempt) == ("E0003", 2, 2)
    queue.complete(retry, Handler())
    assert ledger(pg_dsn) == (5000, 1, {"done": 1})
    assert [t.reason for t in queue.transitions("E0003")] == [
        "enqueued", "claimed", "lease_expired", "claimed", "completed"]


def test_a_naive_claim_copied_from_sqlite_hands_one_message_to_two_workers(
        pg_dsn: str, model_clock: ModelClock) -> None:
    """SELECT ... LIMIT 1, then UPDATE: safe under SQLite's single writer, not here."""
    Queue(pg_dsn, clock=model_clock).enqueue_jsonl(jsonl([("E0001", "book", 100),
                                                         ("E0002", "pen", 200)]))
    choose = ("SELECT event_id FROM messages WHERE state = 'ready' "
              "ORDER BY available_at, event_id LIMIT 1")
    take = ("UPDATE messages SET state = 'leased', attempts = attempts + 1, "
            "generation = generation + 1, lease_until = 1030 WHERE event_id = %s "
            "RETURNING generation")
    with psycopg.connect(pg_dsn) as first, psycopg.connect(pg_dsn) as second:
        chosen = [conn.execute(choose).fetchone()[0] for conn in (first, second)]
        got_first = first.execute(take, (chosen[0],)).fetchone()
        first.commit()
        got_second = second.execute(take, (chosen[1],)).fetchone()  # waited, then went on
        second.commit()

    assert chosen == ["E0001", "E0001"]
    assert (got_first, got_second) == ((1,), (2,))  # two workers each hold E0001
    assert sql(pg_dsn, "SELECT state, attempts FROM messages WHERE event_id = 'E0001'") == [
        ("leased", 2)]


def test_the_protocols_claim_skips_a_row_another_claim_holds_instead_of_sharing_it(
        pg_dsn: str, model_clock: ModelClock) -> None:
    # A lock wait fails after a second instead of hanging: without SKIP LOCKED
    # the claim would wait for the other transaction, and this test would fail.
    queue = Queue(with_lock_timeout(pg_dsn, milliseconds=1000), clock=model_clock)
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100), ("E0002", "pen", 200)]))
    claim = _placeholders(picking(CLAIM, DUE, PostgresStore(pg_dsn).picked))
    with psycopg.connect(pg_dsn) as other:  # a claim that has chosen, not yet committed
        held = other.execute(claim, (1002, 1000, 1000, 1)).fetchone()

        lease = queue.claim()

        other.rollback()
    assert (held[0], lease.event_id, lease.generation) == ("E0001", "E0002", 1)
    assert ledger(pg_dsn) == (0, 0, {"ready": 1, "leased": 1})


def test_two_worker_processes_draining_twenty_events_count_each_exactly_once(
        pg_dsn: str, tmp_path: Path) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl([(f"E{i:04d}", "book", i) for i in range(1, 21)]))
    gate = tmp_path / "gate"
    gate.mkdir()
    workers = [run_child(pg_dsn, now=1000, lease_seconds=30, mode="drain", wait=False,
                          gate=str(gate)) for _ in range(2)]
    try:
        open_gate(gate, 2)
        done = [json.loads(line)["event_id"] for proc in workers
                for line in proc.communicate(timeout=60)[0].splitlines()]
    finally:
        reap(workers)

    assert [proc.returncode for proc in workers] == [0, 0]
    assert sorted(done) == [f"E{i:04d}" for i in range(1, 21)]
    assert ledger(pg_dsn) == (210, 20, {"done": 20})
    claims = sql(pg_dsn, "SELECT event_id, count(*) FROM transitions "
                         "WHERE to_state = 'leased' GROUP BY event_id HAVING count(*) <> 1")
    assert claims == []


def test_two_enqueues_of_one_batch_at_once_store_it_once_and_count_the_rest(
        pg_dsn: str) -> None:
    text = jsonl([(f"E{i:04d}", "pen", i) for i in range(1, 51)])
    Queue(pg_dsn, clock=ModelClock(1000))  # create the schema first
    results = []

    def enqueue() -> None:
        results.append(Queue(pg_dsn, clock=ModelClock(1000)).enqueue_jsonl(text))

    threads = [threading.Thread(target=enqueue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted((r.inserted, r.duplicates) for r in results) == [(0, 50), (50, 0)]
    assert ledger(pg_dsn) == (0, 0, {"ready": 50})


def test_a_schema_holding_another_applications_tables_is_refused_without_a_write(
        pg_dsn: str) -> None:
    sql(pg_dsn, "CREATE TABLE messages (id int)")
    sql(pg_dsn, "CREATE TABLE invoices (id int)")

    with pytest.raises(UnusableFile) as refused:
        Queue(pg_dsn)

    assert refused.value.code == "not_a_queue"
    assert "invoices, messages" in str(refused.value) and "\n" not in str(refused.value)
    assert sql(pg_dsn, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                       "ORDER BY 1") == [("invoices",), ("messages",)]


def test_reading_an_empty_schema_creates_nothing_and_names_the_missing_queue(
        pg_dsn: str) -> None:
    with pytest.raises(UnusableFile) as missing:
        Queue(pg_dsn, create=False)

    assert missing.value.code == "no_queue_file"
    assert sql(pg_dsn, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()") \
        == [(0,)]


@pytest.mark.parametrize("statement", [
    "UPDATE messages SET lease_until = 2000",                         # ready with a deadline
    "UPDATE messages SET state = 'dead'",                             # dead without a reason
    "UPDATE messages SET state = 'lost'",                             # no such state
    "INSERT INTO messages (event_id, payload, available_at) VALUES ('E12345', '{}', 1)",
    "INSERT INTO effects VALUES ('E0001', 'book', 10000000)",         # amount out of range
    "INSERT INTO effects VALUES ('E0009', 'book', 1)",                # no such message
    "INSERT INTO transitions (at, event_id, from_state, to_state, generation, attempts, reason) "
    "VALUES (1, 'E0001', 'done', 'ready', 1, 1, 'undo')",             # not an edge
], ids=["lease_until_iff_leased", "dead_has_reason", "state_valid", "event_id_shape",
        "amount_in_range", "foreign_key", "legal_edge"])
def test_the_postgresql_schema_refuses_what_the_sqlite_schema_refuses(
        pg_dsn: str, statement: str) -> None:
    Queue(pg_dsn, clock=ModelClock(1000)).enqueue_jsonl(jsonl([("E0001", "book", 100)]))

    with pytest.raises(psycopg.errors.IntegrityError):
        sql(pg_dsn, statement)

    assert ledger(pg_dsn) == (0, 0, {"ready": 1})


def test_the_database_clock_is_the_servers_and_judges_the_lease(pg_dsn: str) -> None:
    clock = DatabaseClock(pg_dsn)
    try:
        before = int(time.time())
        now = clock.now()
        queue = Queue(pg_dsn, clock=clock, lease_seconds=30)
        queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
        lease = queue.claim()
        queue.complete(lease, Handler())
    finally:
        clock.close()

    assert before - 1 <= now <= int(time.time()) + 1  # this server shares the host's clock
    assert now <= lease.lease_until - 30 <= now + 5
    assert ledger(pg_dsn) == (100, 1, {"done": 1})


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", *args], cwd=cwd,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_the_command_line_enqueues_works_and_reports_on_a_postgresql_queue(
        pg_dsn: str, tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(jsonl([("E0001", "book", 10000), ("E0002", "pen", 2000),
                            ("E0004", "toy", 3000)]), encoding="utf-8")

    enqueued = cli("--db", pg_dsn, "--now", "1000", "enqueue", str(batch), cwd=tmp_path)
    worked = cli("--db", pg_dsn, "--now", "1000", "work", cwd=tmp_path)
    status = cli("--db", pg_dsn, "status", "--json", cwd=tmp_path)

    assert [r.returncode for r in (enqueued, worked, status)] == [0, 0, 0], worked.stderr
    assert enqueued.stdout == "inserted 3, duplicates 0\n"
    assert json.loads(status.stdout) == {
        "states": {"ready": 0, "leased": 0, "done": 2, "dead": 1},
        "effects": 2, "totals": {"book": 10000, "pen": 2000}, "total": 12000, "pruned": 0, "ids": "course"}
    assert not list(tmp_path.glob("*.sqlite3"))


def as_user(dsn: str, user: str, password: str) -> str:
    """``dsn`` with another user name and password (a role the server does not know)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


@pytest.mark.parametrize("where", ["postgresql://queue@127.0.0.1:1/queue",
                                   "wrong user"], ids=["unreachable", "wrong_credentials"])
def test_a_server_that_cannot_be_used_gives_one_line_and_exit_1_never_a_traceback(
        pg_dsn: str, tmp_path: Path, where: str) -> None:
    dsn = where if where.startswith("postgresql:") else as_user(pg_dsn, "nobody_here", "p4ss")

    result = cli("--db", dsn, "status", cwd=tmp_path)

    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("error: cannot_connect: postgresql://")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "p4ss" not in result.stderr


def test_a_queue_names_its_database_without_the_password(pg_dsn: str) -> None:
    dsn = "postgresql://app:" + "s3cret@db.example:5433/shop"  # split: not a real secret

    assert PostgresStore(dsn).describe() == "postgresql://db.example:5433/shop"
    assert "s3cret" not in repr(DatabaseClock(dsn))
    assert repr(Queue(pg_dsn)).startswith("Queue('postgresql://local socket/")


# -- interleavings only PostgreSQL allows: another transaction commits mid-call ---------

def _waiting_on_a_lock(dsn: str) -> bool:
    return bool(sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                         "AND datname = current_database()")[0][0])


def test_two_concurrent_redrives_change_and_journal_the_message_once(
        pg_dsn: str, model_clock: ModelClock) -> None:
    queue = Queue(pg_dsn, clock=model_clock)
    queue.enqueue_jsonl(jsonl([("E0001", "toy", 300)]))
    queue.fail(queue.claim(), "invalid_payload", permanent=True)
    first = Queue(pg_dsn, clock=model_clock)
    results: list[object] = []
    with first.transaction() as conn:  # the first redrive has changed the row, not committed
        assert first.store.transition(conn, REDRIVE, (1000, "E0001"), 1000, [])  # done
        second = threading.Thread(target=lambda: results.append(_redrive(queue)))
        second.start()  # its UPDATE waits for the first one's row lock ...
        deadline = time.monotonic() + 10
        while not _waiting_on_a_lock(pg_dsn) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _waiting_on_a_lock(pg_dsn)
    second.join(timeout=10)  # ... then finds the row ready, no longer dead

    assert results == ["not_redrivable"]
    assert [t.reason for t in queue.transitions("E0001")] == [
        "enqueued", "claimed", "invalid_payload", "redrive"]
    assert ledger(pg_dsn) == (0, 0, {"ready": 1})


def _redrive(queue: Queue) -> str:
    try:
        queue.redrive("E0001")
    except NotRedrivable as exc:
        return exc.code
    return "redriven"


class TakeoverDuringTheHandler(Handler):
    """A handler during whose work another worker, whose clock already reads
    1002, recovers the lease and takes the message over (generation 2, until
    1004) on its own connection and commits: between this ACK's fence read
    and its guarded UPDATE. For this worker's clock the deadline has not
    passed, so only the generation in the guard can refuse the ACK."""

    def __init__(self, other: Queue) -> None:
        super().__init__()
        self.other, self.taken = other, None

    def apply(self, conn, event_id, payload):  # type: ignore[no-untyped-def]
        effect = super().apply(conn, event_id, payload)
        self.taken = self.other.claim()
        return effect


def test_an_ack_whose_lease_was_taken_over_during_its_handler_writes_nothing(
        pg_dsn: str, model_clock: ModelClock) -> None:
    queue = Queue(pg_dsn, clock=model_clock, lease_seconds=2)
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    lease = queue.claim()
    handler = TakeoverDuringTheHandler(Queue(pg_dsn, clock=ModelClock(1002), lease_seconds=2))

    with pytest.raises(LeaseLost) as lost:
        queue.complete(lease, handler)

    assert lost.value.code == "stale_generation"
    assert (handler.taken.event_id, handler.taken.generation) == ("E0001", 2)
    assert ledger(pg_dsn) == (0, 0, {"leased": 1})
    queue.complete(handler.taken, Handler())
    assert ledger(pg_dsn) == (100, 1, {"done": 1})


def test_a_batch_of_many_events_is_stored_by_one_statement_in_its_own_order(
        pg_dsn: str) -> None:
    """``PgConnection.executemany`` sends an INSERT of many rows as one statement
    (the server prepares the table's CHECKs once per statement): every row
    stored, journalled in the batch's order, and a refused row refuses it whole."""
    events = [(f"E{i:04d}", ("book", "pen", "bag")[i % 3], 100 + i) for i in range(1000, 0, -1)]
    queue = Queue(pg_dsn, clock=ModelClock(1000))
    assert queue.enqueue_jsonl(jsonl(events)).inserted == 1000
    journal = sql(pg_dsn, "SELECT event_id, from_state, to_state, reason FROM transitions "
                          "ORDER BY seq")
    assert journal == [(e, None, "ready", "enqueued") for e, _, _ in events]
    assert sql(pg_dsn, "SELECT count(*), sum(length(payload)) FROM messages") == [
        (1000, sum(len(json.dumps({"amount_cents": a, "category": c}, separators=(",", ":")))
                   for _, c, a in events))]
    before = sql(pg_dsn, "SELECT count(*) FROM transitions")
    insert = "INSERT INTO effects (event_id, category, amount_cents) VALUES (?, ?, ?)"
    with queue.session():
        with pytest.raises(LookupError):  # rolled back: only the statement's tag is kept
            with queue.transaction() as conn:
                cursor = conn.executemany(insert, [("E0001", "book", 5), ("E0002", "pen", 6),
                                                   ("E0003", "bag", 7)])
                conn.execute("SELECT 1").fetchall()  # the pipeline's results, read up to here
                said = cursor.statusmessage
                raise LookupError
        assert said == "INSERT 0 3"  # one statement (per row, the last would say 1)
        with pytest.raises(psycopg.errors.CheckViolation, match="amount_in_range"):
            with queue.transaction() as conn:  # a row the schema refuses, after one it takes
                conn.executemany(insert, [("E0001", "book", 5), ("E0002", "pen", 0)])
    assert sql(pg_dsn, "SELECT count(*) FROM effects") == [(0,)]
    assert sql(pg_dsn, "SELECT count(*) FROM transitions") == before
    assert ledger(pg_dsn) == (0, 0, {"ready": 1000})
