"""The crash sweep, the stress run and a server restart on a real PostgreSQL server.

Real worker processes die by ``os._exit``; the server rolls back a dead
worker's open transaction when its connection drops. A restart is a real
``pg_ctl restart`` of a private server. Stored state is read through
``queue_core.audit``; only the clock is modelled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

import pg
from conftest import ROOT
from queue_core import ModelClock, Queue, audit
from queue_core.crashpoints import INSIDE_THE_SERVER_STEP, PROTOCOL_POINTS
from queue_core.lab.sweeps.stress import run_stress, stress_batch
from queue_core.lab.sweeps.sweep import EXPECTED_TOTAL, MIXED_PRIORITIES, SCHEDULES, run_sweep

STRESS_WORKERS, STRESS_EVENTS = 4, 1000
RESTART_EVENTS, LEASE = 3000, 30


@pytest.mark.parametrize("priorities", [None, MIXED_PRIORITIES],
                         ids=["one priority", "mixed priorities"])
def test_a_worker_killed_at_every_crash_point_on_postgresql_leaves_every_effect_exactly_once(
        pg_server: str, priorities: dict[str, int] | None) -> None:
    rows = run_sweep(["protocol"], db=pg_server, priorities=priorities)

    reached = {r.step: (r.outcome, r.total, r.detail.rsplit("; ", 1)[-1])
               for r in rows if r.outcome != "n/a"}
    assert reached == {step: ("ok", EXPECTED_TOTAL, f"every effect once: {EXPECTED_TOTAL}")
                       for step in PROTOCOL_POINTS + SCHEDULES
                       if step not in INSIDE_THE_SERVER_STEP}
    # the worker loop's step is one call of the schema's function: no Python inside it
    assert {r.step: r.detail for r in rows if r.outcome == "n/a"} == {
        "complete.between_transactions": "never passes here",
        **{step: "inside PostgreSQL's step function: one statement, no Python runs there"
           for step in INSIDE_THE_SERVER_STEP}}


def test_the_broken_contrasts_fail_on_postgresql_exactly_where_they_fail_on_sqlite(
        pg_server: str, tmp_path: Path) -> None:
    broken = ["mark then write", "write then mark", "no generation check"]
    steps = ("complete.between_transactions", "complete.after_insert", "stale.ack")

    on_pg = {(r.protocol, r.step): (r.outcome, r.total)
             for r in run_sweep(broken, steps, db=pg_server)}
    on_sqlite = {(r.protocol, r.step): (r.outcome, r.total)
                 for r in run_sweep(broken, steps, workdir=tmp_path)}

    assert on_pg == on_sqlite
    assert {cell: found for cell, found in on_pg.items() if found[0] != "ok"} == {
        ("mark then write", "complete.between_transactions"): ("lost money", 17000),
        ("mark then write", "complete.after_insert"): ("lost money", 17000),
        ("write then mark", "complete.between_transactions"): ("doubled money", 23000),
        ("no generation check", "complete.between_transactions"): ("n/a", 0),
        ("no generation check", "stale.ack"): ("stale ACK accepted", EXPECTED_TOTAL),
    }


def test_many_crashing_workers_on_postgresql_finish_every_event_once_and_the_money_reconciles(
        pg_dsn: str, tmp_path: Path) -> None:
    report = run_stress(tmp_path, events=STRESS_EVENTS, workers=STRESS_WORKERS, seed=5,
                        db=pg_dsn)

    assert report.problems == ()
    assert report.crashes >= 5, "the run must actually kill workers"
    assert (report.duplicates, report.losses) == (0, 0)
    snap = audit.snapshot(pg_dsn)
    _, amounts = stress_batch(STRESS_EVENTS, 5)
    done = {e for e, s in snap.states().items() if s == "done"}
    assert audit.check(snap) == []
    assert done <= set(amounts)  # a refused category is dead; so is a message out of attempts
    assert (snap.status.states["done"], snap.status.states["dead"], snap.status.effects,
            snap.money) == (len(done), STRESS_EVENTS - len(done), len(done),
                            sum(amounts[e] for e in done)) == (report.done, report.dead,
                                                               report.effects, report.total)
    assert snap.status.states["ready"] == snap.status.states["leased"] == 0


# -- a server restart under a running `work` -----------------------------------

@pytest.fixture(scope="module")
def own_server() -> Iterator[str]:
    """A private server this module may restart (never the session's shared one)."""
    yield from pg.server_dsn(pg.own_server)


@pytest.fixture
def own_dsn(own_server: str) -> Iterator[str]:
    yield from pg.fresh_schema(own_server)


def cli(*args: str, wait: bool = True) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "queue_core", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if wait:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def reported_done(stdout: str) -> Counter[str]:
    return Counter(line.split()[0] for line in stdout.splitlines() if " done " in line)


def test_a_server_restart_under_work_stops_it_with_one_line_and_a_later_work_finishes_each_once(
        own_server: str, own_dsn: str) -> None:
    amounts = {f"E{i:04d}": 100 + i for i in range(RESTART_EVENTS)}
    queue = Queue(own_dsn, clock=ModelClock(1000))
    events = list(amounts.items())
    for start in range(0, RESTART_EVENTS, 1000):
        queue.enqueue_jsonl("\n".join(json.dumps({"event_id": e, "payload": {
            "category": "book", "amount_cents": a}}) for e, a in events[start:start + 1000]))
    worker = cli("--db", own_dsn, "--now", "1000", "work", "--lease-seconds", str(LEASE),
                 wait=False)
    assert isinstance(worker, subprocess.Popen) and worker.stdout is not None
    first_lines = [worker.stdout.readline() for _ in range(50)]  # well into the run
    pg.restart(own_server)
    rest, err = worker.communicate(timeout=60)

    assert worker.returncode == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: connection_lost: postgresql://")
    first = reported_done("".join(first_lines) + rest)
    after_crash = audit.snapshot(own_dsn)
    assert audit.check(after_crash) == []  # nothing half-written
    stored = {e for e, s in after_crash.states().items() if s == "done"}
    # Everything reported done is committed; at most the ACK in flight
    # committed without its line reaching us.
    assert set(first) <= stored and len(stored - set(first)) <= 1 and max(first.values()) == 1
    assert after_crash.status.states["leased"] <= 1
    assert (after_crash.status.effects, after_crash.money) == (
        len(stored), sum(amounts[e] for e in stored))

    later = cli("--db", own_dsn, "--now", str(1000 + LEASE), "work")

    assert isinstance(later, subprocess.CompletedProcess)
    assert (later.returncode, later.stderr) == (0, "")
    second = reported_done(later.stdout)
    assert not set(second) & stored and max(second.values()) == 1
    assert set(second) | stored == set(amounts)
    final = audit.snapshot(own_dsn)
    assert audit.check(final) == []
    assert ({s: n for s, n in final.status.states.items() if n}, final.status.effects,
            final.money) == ({"done": RESTART_EVENTS}, RESTART_EVENTS, sum(amounts.values()))
