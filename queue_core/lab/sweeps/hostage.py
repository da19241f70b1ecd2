"""A worker stalled mid-transaction, and how long its message waits (notebooks 10, 14).

``hold_hostage`` starts a real ``queue-core work`` process on one message
and stalls it inside its claim, after the claim's UPDATE has locked the
message's row and before the COMMIT (the worker loop's later steps cannot be
stalled so: each is one message to the server, its COMMIT inside it, see
``postgres.PostgresStore.step``): either a ``FaultProxy`` stops
forwarding (``how="blackhole"``: a network that drops everything) or the
process stops itself with ``SIGSTOP`` (``how="stopped"``: a suspended VM,
a process paused by a debugger). Its lease has passed on the model clock,
so another worker may recover the message as soon as the row is free: it
polls ``claim()`` against a real-time deadline.

How long the message was held is read from the server's own clock, not
from the poller's: a session queued on the message's row lock (``FOR
UPDATE``, from just after the stall began) notes ``clock_timestamp()`` the
moment it gets the row, and ``held`` is that minus the stalled transaction's
``xact_start`` in ``pg_stat_activity``. ``transaction_timeout`` counts from
that same start, so where it freed the row ``held >= bound`` holds by
construction; how far above the bound depends only on how soon the busy
server acted on its timer and woke the waiting session. The poller's own
figure (``freed_after``) adds its polling interval and its own scheduling.

The stalled backend is ``active`` and waits on ``ClientRead``: it sits in
the middle of a pipeline, so ``idle_in_transaction_session_timeout`` never
fires. ``transaction_timeout`` (PostgreSQL 17 and later) does: the server
ends the session, the lock goes, the other worker claims the message, and
the stalled worker, once it can speak again, reads ``connection_lost``. On
PostgreSQL 16 no setting frees it: the message waits as long as the stall
lasts, and is free at once when the stalled client's connection closes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import audit
from ...clock import ModelClock
from ...handler import Handler
from ...postgres.session import TRANSACTION_TIMEOUT_MS, TRANSACTION_TIMEOUT_SINCE
from ...queue import Queue
from ..servers.faultproxy import Fault, FaultProxy
from ..servers.postgres_server import drop_schema, fresh_schema
from .network import CLAIM_STATEMENT

EVENT = {"event_id": "E0001", "payload": {"category": "book", "amount_cents": 700}}
LEASE = 30
START_SECONDS = 30.0   # the longest the stalled worker may take to reach its stall
POLL_SECONDS = 0.05

# ``queue-core work`` that stops itself (SIGSTOP) where its first claim's UPDATE
# has locked the row, before its COMMIT.
STOPPING_WORKER = """
import os, signal, sys
import queue_core.crashpoints as crashpoints

def stop_here():  # the first arrival only: disarm, then stop this process
    crashpoints.arm(None)
    os.kill(os.getpid(), signal.SIGSTOP)

crashpoints._arrive = stop_here
crashpoints.arm("claim.before_commit")
from queue_core.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass(frozen=True)
class HostageRun:
    """What one stall did: how long the message was held, and what was left."""

    how: str                       # blackhole or stopped
    server_major: int
    bound: float | None            # transaction_timeout in seconds; None where there is none
    freed_after: float | None      # real seconds from the stall to another worker's claim
    held: float | None             # server's clock: the stalled transaction's start to the
                                   # moment a session waiting for the row got it
    watched: float                 # how long the other worker tried, in real seconds
    freed_after_end: float | None  # where nothing freed it: seconds after the stall ended
    holder: tuple[str, str]        # the stalled backend: state, wait event
    holder_line: str               # the stalled worker's last line, once it could go on
    money: int
    effects: int
    states: tuple[tuple[str, int], ...]


def hold_hostage(server: str, how: str = "blackhole", *,
                 transaction_timeout_ms: int | None = None,
                 watch_seconds: float | None = None) -> HostageRun:
    """Stall a worker inside its claim; poll another worker's claims; report.

    ``transaction_timeout_ms`` overrides the module's limit for this run
    (``queue_core.postgres.TRANSACTION_TIMEOUT_MS``); ``watch_seconds`` is
    how long the other worker tries (by default the bound and 3 s more, or
    3 s where there is no bound). ``freed_after`` is ``None`` where nothing
    freed the message while the stall lasted; ``held`` counts to whenever the
    row came free, during the stall or after it ended.
    """
    if how not in ("blackhole", "stopped"):
        raise ValueError(f"how must be 'blackhole' or 'stopped', got {how!r}")
    db = fresh_schema(server, "queue_hostage")
    Queue(db, clock=ModelClock(1000), lease_seconds=LEASE).enqueue_jsonl(json.dumps(EVENT))
    major = _major(db)
    limit = TRANSACTION_TIMEOUT_MS if transaction_timeout_ms is None else transaction_timeout_ms
    bound = limit / 1000 if major * 10000 >= TRANSACTION_TIMEOUT_SINCE else None
    worker_db = db  # the module's own limits, unless this run sets a shorter one
    if transaction_timeout_ms is not None and bound is not None:
        worker_db = _with_option(db, f"-c transaction_timeout={limit}")
    watch = watch_seconds if watch_seconds is not None else (bound + 3 if bound else 3.0)
    victim = f"hostage-{uuid.uuid4().hex[:10]}"
    proxy = (FaultProxy(server, Fault("blackhole", statement="COMMIT", after=CLAIM_STATEMENT,
                                      seconds=60), lifetime=watch + 60)
             if how == "blackhole" else None)
    waiter = _RowWaiter(db, EVENT["event_id"], watch + 20)  # connected before the stall
    worker = _start(proxy.dsn(worker_db) if proxy else worker_db, victim, how)
    try:
        _wait_for_stall(worker, proxy)
        stalled = time.monotonic()
        _wait_until_row_held(db, victim, worker)
        waiter.start()
        holder, began = _backend(db, victim)
        other = Queue(db, clock=ModelClock(1000 + LEASE + 1), lease_seconds=LEASE)
        freed_after = _poll_claim(other, stalled + watch, stalled)
        freed_after_end = None
        _end_stall(worker, proxy)
        if freed_after is None:
            ended = time.monotonic()
            freed_after_end = _poll_claim(other, ended + 10, ended)
        line = _last_line(worker)
        got = waiter.result()
    finally:
        _reap(worker)
        if proxy is not None:
            proxy.close()
        waiter.close()
    held = None if got is None or began is None else (got - began).total_seconds()
    try:
        return _judged(db, how, major, bound, freed_after, held, watch, freed_after_end, holder,
                       line)
    finally:
        drop_schema(db)


def _judged(db: str, how: str, major: int, bound: float | None, freed_after: float | None,
            held: float | None, watch: float, freed_after_end: float | None,
            holder: tuple[str, str], line: str) -> HostageRun:
    """Finish what is left (a later worker, past every lease), then audit."""
    later = Queue(db, clock=ModelClock(1000 + 3 * LEASE), lease_seconds=LEASE)
    while (lease := later.claim()) is not None:
        later.complete(lease, Handler())
    snap = audit.snapshot(db)
    if audit.check(snap):
        raise AssertionError(f"the audit found: {audit.check(snap)}")
    return HostageRun(how, major, bound, freed_after, held, watch, freed_after_end, holder, line,
                      snap.money, len(snap.effect_rows), tuple(snap.status.states.items()))


def _poll_claim(other: Queue, deadline: float, since: float) -> float | None:
    """Seconds from ``since`` until ``other`` claims the message (and finishes
    it), or ``None`` if the deadline passes first."""
    while time.monotonic() < deadline:
        lease = other.claim()
        if lease is not None:
            took = time.monotonic() - since
            other.complete(lease, Handler())
            return took
        time.sleep(POLL_SECONDS)
    return None


def _start(dsn: str, victim: str, how: str) -> subprocess.Popen[str]:
    parent = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PGAPPNAME=victim, PYTHONPATH=os.pathsep.join(
        [parent, *filter(None, [os.environ.get("PYTHONPATH")])]))
    args = ["--db", dsn, "--now", "1000", "work", "--lease-seconds", str(LEASE)]
    command = ([sys.executable, "-c", STOPPING_WORKER, *args] if how == "stopped"
               else [sys.executable, "-m", "queue_core", *args])
    return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _wait_for_stall(worker: subprocess.Popen[str], proxy: FaultProxy | None) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not (proxy.fired.is_set() if proxy else _stopped(worker.pid)):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker never stalled where it should: "
                               f"{(worker.stderr.read() if worker.stderr else '').strip()}")
        time.sleep(0.01)


def _wait_until_row_held(db: str, victim: str, worker: subprocess.Popen[str]) -> None:
    """Wait until the stalled backend has run its claim's UPDATE and waits for
    the client: it has a transaction id (assigned by its first write) and
    reads from the client. The proxy fires when it sees the COMMIT's bytes,
    which can be before the server has run the UPDATE sent ahead of them; a
    session that asked for the row then would get it first, and ``held``
    would count from a row that was not yet taken."""
    import psycopg

    deadline = time.monotonic() + START_SECONDS
    with psycopg.connect(db, autocommit=True) as conn:
        while conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
                "AND state = 'active' AND wait_event = 'ClientRead' "
                "AND backend_xid IS NOT NULL", (victim,)).fetchone() is None:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the stalled worker never held the message's row")
            time.sleep(0.005)


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (``T`` in /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "T"
    except OSError:
        return False


def _backend(db: str, victim: str) -> tuple[tuple[str, str], Any]:
    """The stalled backend's state and wait event, and when its transaction
    began by the server's clock (``None`` if it is gone)."""
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT state, coalesce(wait_event, ''), xact_start "
                           "FROM pg_stat_activity WHERE application_name = %s",
                           (victim,)).fetchone()
    return ((str(row[0]), str(row[1])), row[2]) if row else (("gone", ""), None)


class _RowWaiter:
    """A session that asks for the message's row lock (``FOR UPDATE``, waiting
    as long as it takes, up to ``limit`` seconds) and notes, by the server's
    clock, the moment it got it; it lets the row go at once (autocommit), so
    the other worker's claim is delayed by no more than one poll. Connected
    when made, so that asking costs one message to the server."""

    def __init__(self, db: str, event_id: str, limit: float) -> None:
        import psycopg

        self._conn = psycopg.connect(db, autocommit=True)
        self._conn.execute(f"SET statement_timeout = {int(limit * 1000)}")
        self._event_id = event_id
        self._got: Any = None
        self._thread = threading.Thread(target=self._wait, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _wait(self) -> None:
        try:  # the subquery takes the lock; the outer clock_timestamp() runs once it has it
            row = self._conn.execute(
                "SELECT clock_timestamp() FROM (SELECT 1 FROM messages WHERE event_id = %s "
                "FOR UPDATE) AS locked", (self._event_id,)).fetchone()
            self._got = row[0] if row else None
        except Exception:  # noqa: BLE001 - no figure (None) rather than a wrong one
            self._got = None

    def result(self) -> Any:
        """When the row was got, by the server's clock, or ``None``."""
        self._thread.join()
        return self._got

    def close(self) -> None:
        if self._thread.is_alive():
            self._conn.cancel_safe()
            self._thread.join()
        self._conn.close()


def _end_stall(worker: subprocess.Popen[str], proxy: FaultProxy | None) -> None:
    if proxy is not None:
        proxy.close()  # the client reads end of file; the server, if it still waits, too
    else:
        os.kill(worker.pid, signal.SIGCONT)


def _last_line(worker: subprocess.Popen[str]) -> str:
    try:
        out, err = worker.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        return "still running"
    lines = (err or out).strip().splitlines()
    return lines[-1] if lines else ""


def _reap(worker: subprocess.Popen[str]) -> None:
    if worker.returncode is None:
        try:
            os.kill(worker.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        worker.kill()
        worker.communicate()


def _major(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def _with_option(dsn: str, option: str) -> str:
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} {option}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
