"""What bounds a worker's PostgreSQL session (``queue_core.postgres``): the
limits each connection sets, what a worker does when ``lock_timeout`` fires,
a server timeout reaching the caller as ``connection_lost``, and a long
handler that keeps its lease by the heartbeat, which none of the limits ends.

Real server, real connections; waits are bounded by deadlines, never guessed.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from pg import with_lock_timeout
from queue_core import Handler, ModelClock, Queue, audit, finish
from queue_core.errors import ConnectionLost
from queue_core.postgres.session import (LOCK_TIMEOUT_MS, SESSION_SETTINGS, TRANSACTION_TIMEOUT_MS,
                                  TRANSACTION_TIMEOUT_SINCE)
from queue_core.postgres import PostgresStore

EVENT = json.dumps({"event_id": "E0001", "payload": {"category": "book", "amount_cents": 700}})


def with_options(dsn: str, options: str) -> str:
    """``dsn`` whose startup packet also carries ``options`` (``-c name=value``)."""
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} {options}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def server_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version


def test_every_connection_bounds_lock_waits_and_transactions_and_watches_its_peer(
        pg_dsn: str) -> None:
    conn = PostgresStore(pg_dsn).connect()
    try:
        shown = {name: conn.execute(f"SELECT current_setting('{name}')").fetchone()[0]
                 for name in SESSION_SETTINGS}
        version = conn.raw.info.server_version
        transaction = conn.execute("SELECT current_setting('transaction_timeout', true)"
                                   ).fetchone()[0]
    finally:
        conn.close()

    assert shown["lock_timeout"] == f"{LOCK_TIMEOUT_MS // 1000}s"
    assert shown["idle_in_transaction_session_timeout"] == f"{TRANSACTION_TIMEOUT_MS // 1000}s"
    # tcp_keepalives_* show 0 over a Unix socket (ignored there): see test_fault_proxy
    if version >= TRANSACTION_TIMEOUT_SINCE:
        assert transaction == f"{TRANSACTION_TIMEOUT_MS // 1000}s"
    else:  # PostgreSQL 16 has no such setting: nothing was sent that it would refuse
        assert transaction is None


def test_a_connection_strings_own_settings_win_over_the_modules(pg_dsn: str) -> None:
    dsn = with_options(with_lock_timeout(pg_dsn, milliseconds=250),
                       "-c transaction_timeout=7s"
                       if server_version(pg_dsn) >= TRANSACTION_TIMEOUT_SINCE else "")
    conn = PostgresStore(dsn).connect()
    try:
        lock = conn.execute("SHOW lock_timeout").fetchone()[0]
        transaction = conn.execute("SELECT current_setting('transaction_timeout', true)"
                                   ).fetchone()[0]
        path = conn.execute("SHOW search_path").fetchone()[0]
    finally:
        conn.close()

    assert lock == "250ms"
    assert transaction in (None, "7s")
    assert path.startswith("queue_test_")  # the fixture's own option is kept


def test_an_ack_that_waits_past_lock_timeout_is_rolled_back_reported_lost_and_the_worker_goes_on(
        pg_dsn: str) -> None:
    clock = ModelClock(1000)
    queue = Queue(with_lock_timeout(pg_dsn, milliseconds=300), clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(EVENT)
    lease = queue.claim()
    assert lease is not None
    with psycopg.connect(pg_dsn) as holder:  # another transaction holds the message's row
        holder.execute("SELECT 1 FROM messages WHERE event_id = 'E0001' FOR UPDATE")
        started = time.monotonic()
        outcome = finish(queue, lease, Handler())
        waited = time.monotonic() - started
        during = audit.snapshot(pg_dsn)
    # the holder's transaction ended (rolled back) with its block

    assert (outcome.kind, outcome.code) == ("lost", "lock_timeout")
    assert 0.3 <= waited < 10
    assert audit.check(during) == []
    assert (during.status.effects, during.money, during.messages["E0001"].state,
            during.messages["E0001"].generation) == (0, 0, "leased", 1)
    assert finish(queue, lease, Handler()).kind == "done"  # the lease still held: done once
    final = audit.snapshot(pg_dsn)
    assert (final.status.effects, final.money, final.messages["E0001"].state) == (1, 700, "done")


def test_a_transaction_the_server_ends_reaches_the_caller_as_connection_lost(pg_dsn: str) -> None:
    if server_version(pg_dsn) < TRANSACTION_TIMEOUT_SINCE:
        pytest.skip("PostgreSQL 16 has no transaction_timeout")
    store = PostgresStore(with_options(pg_dsn, "-c transaction_timeout=300"))
    conn = store.connect()
    try:
        with pytest.raises(ConnectionLost) as lost:
            with store.transaction(conn):
                conn.execute("SELECT pg_sleep(5)").fetchone()
    finally:
        conn.close()

    assert lost.value.code == "connection_lost"
    assert "transaction timeout" in lost.value.detail
    assert "unknown" in str(lost.value) and "\n" not in str(lost.value)


def test_a_long_handler_that_keeps_its_lease_by_heartbeat_outlives_every_session_limit(
        pg_dsn: str) -> None:
    """The work runs between transactions, its lease extended as it goes: the
    session is idle, which no limit here ends, however short."""
    version = server_version(pg_dsn)
    limits = "-c lock_timeout=200 -c idle_in_transaction_session_timeout=300"
    if version >= TRANSACTION_TIMEOUT_SINCE:
        limits += " -c transaction_timeout=300"
    clock = ModelClock(1000)
    queue = Queue(with_options(pg_dsn, limits), clock=clock, lease_seconds=2)
    queue.enqueue_jsonl(EVENT)
    with queue.session():
        backend = queue.connection.raw.info.backend_pid  # type: ignore[union-attr]
        lease = queue.claim()
        assert lease is not None
        for _ in range(3):  # 3 x 0.4 s of real work, each longer than every limit
            time.sleep(0.4)
            clock.advance(1)
            lease = queue.extend(lease, 2)
        outcome = finish(queue, lease, Handler())
        same_backend = queue.connection.raw.info.backend_pid == backend  # type: ignore[union-attr]

    assert (outcome.kind, same_backend) == ("done", True)
    final = audit.snapshot(pg_dsn)
    assert audit.check(final) == []
    assert (final.status.effects, final.money, final.messages["E0001"].state,
            final.messages["E0001"].generation) == (1, 700, "done", 1)


# ``queue-core work`` whose ACK of the first message meets that message's row
# held by another transaction (as a claim recovering the lease would hold it),
# taken in the handler's hook that every ACK calls before its guarded UPDATE
# (argv: dsn, then work's own arguments).
HELD_ROW_WORKER = """
import sys, threading
import psycopg

dsn = sys.argv[1]
locked = threading.Event()

def hold_the_row():
    with psycopg.connect(dsn) as other:  # one transaction, rolled back at the end
        other.execute("SELECT 1 FROM messages WHERE event_id = 'E0001' FOR NO KEY UPDATE")
        locked.set()
        threading.Event().wait(2.0)  # longer than the worker's lock_timeout, then let go

from queue_core.handler import Handler

def take_the_row(self, conn, event_id):  # the handler's hook, first in every ACK: act once
    if locked.is_set():
        return
    threading.Thread(target=hold_the_row).start()
    if not locked.wait(10):
        sys.exit("the other transaction never took the row")

Handler.fault = take_the_row  # before the ACK's guarded UPDATE, on either path
from queue_core.cli import main
sys.exit(main(["--db", dsn, *sys.argv[2:]]))
"""


def test_a_worker_whose_ack_waits_past_lock_timeout_reports_it_lost_and_finishes_the_rest(
        pg_dsn: str) -> None:
    import os
    import subprocess
    import sys

    from conftest import ROOT

    Queue(pg_dsn, clock=ModelClock(1000)).enqueue_jsonl("\n".join(json.dumps(
        {"event_id": f"E000{n}", "payload": {"category": "book", "amount_cents": n * 100}})
        for n in (1, 2, 3)))
    dsn = with_lock_timeout(pg_dsn, milliseconds=300)
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    cut = subprocess.run([sys.executable, "-c", HELD_ROW_WORKER, dsn, "--now", "1000", "work",
                          "--lease-seconds", "30"], capture_output=True, text=True, timeout=120,
                         env=env)

    assert (cut.returncode, cut.stderr) == (0, ""), cut.stderr
    lines = cut.stdout.splitlines()
    assert lines[0].startswith("E0001 lost (generation 1): lock_timeout: ")
    assert [line.split(" (")[0] for line in lines[1:3]] == ["E0002 done", "E0003 done"]
    during = audit.snapshot(pg_dsn)
    assert audit.check(during) == []
    assert (during.status.effects, during.money, during.messages["E0001"].state.value) == (
        2, 500, "leased")  # nothing of the refused ACK committed; its lease runs out

    later = subprocess.run([sys.executable, "-m", "queue_core", "--db", pg_dsn, "--now", "1030",
                            "work"], capture_output=True, text=True, timeout=120, env=env)

    assert later.returncode == 0 and later.stdout.startswith("E0001 done (generation 2)")
    final = audit.snapshot(pg_dsn)
    assert audit.check(final) == []
    assert (final.status.effects, final.money, dict(final.status.states)) == (
        3, 600, {"ready": 0, "leased": 0, "done": 3, "dead": 0})


def test_a_reading_connection_outlasts_the_limits_and_writes_nothing(pg_dsn: str) -> None:
    # The audit of a large queue is one snapshot read for longer than the write
    # limits allow (a million events: past 5 s), and builds its rows in the client
    # between statements. A reading connection holds no row lock: it has neither
    # limit, and is read-only.
    queue = Queue(pg_dsn, clock=ModelClock(1000))
    queue.enqueue_jsonl('{"event_id": "E0001", "payload": {"category": "book", '
                        '"amount_cents": 100}}')
    store = PostgresStore(pg_dsn)

    def slowly(conn: object) -> tuple[str, ...]:
        first = conn.execute("SELECT count(*) FROM messages").fetchone()[0]  # type: ignore[attr-defined]
        time.sleep(TRANSACTION_TIMEOUT_MS / 1000 + 0.5)  # idle in transaction, past both limits
        settings = tuple(conn.execute(  # type: ignore[attr-defined]
            f"SELECT current_setting('{name}', true)").fetchone()[0]
            for name in ("transaction_read_only", "idle_in_transaction_session_timeout",
                         "transaction_timeout"))
        return (str(first),) + settings

    found = store.read(slowly)
    assert found[:3] == ("1", "on", "0")
    assert found[3] in ("0", None)  # None: PostgreSQL 16 has no transaction_timeout
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        store.read(lambda conn: conn.execute("DELETE FROM effects"))
    assert audit.findings(pg_dsn) == [] and queue.status().states["ready"] == 1
