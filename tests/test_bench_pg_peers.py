"""The PostgreSQL peer queues of ``make bench`` (pgqueuer, procrastinate) on a
private server: the same put / get / ack as the SQLite peers, counted in their
own tables, their durability read back, and the two-consumer and crash probes
beside ours; each on the same work as ours (its effect committed in an effects
table of the same database, then acked) and what it then guarantees. Without a
server these tests skip, or fail where ``QUEUE_CORE_PG_REQUIRED=1``
(``pg.py``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import app_effects  # noqa: E402
import fencing  # noqa: E402
import peer_safety  # noqa: E402
from bench_cases import CheckFailed  # noqa: E402
from peers import PG_PEERS, PeerCase, PeerWorker, SameWorkCase, item_of  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402


@pytest.fixture
def schemas(pg_server: str) -> Iterator[Schemas]:
    with Schemas(pg_server, "queue_test_peer") as made:
        yield made


@pytest.mark.parametrize("name", list(PG_PEERS))
def test_each_postgres_peer_hands_out_what_was_put_once_and_its_tables_agree(
        name: str, pg_dsn: str) -> None:
    adapter = PG_PEERS[name]
    assert adapter.installed(), f"{adapter.dist} is missing: make test installs it (.[bench])"
    queue = adapter(pg_dsn)
    try:
        queue.put([item_of(i) for i in range(3)])
        handle, first = queue.get() or (None, "")
        assert queue.settled() == (0, 3)  # one taken, not yet acknowledged: still pending
        queue.ack(handle)
        got = [first, *queue.consume(5)]
        settled, pragmas = queue.settled(), queue.pragmas()
        stored = queue.still_stored("E0001")
    finally:
        queue.close()

    assert sorted(got) == ["E0000", "E0001", "E0002"]
    assert settled == (3, 0)
    assert pragmas == {"journal_mode": "LOGGED", "synchronous": "on"}
    assert stored is False


def test_a_postgres_peer_case_checks_every_slice_against_its_own_tables(
        schemas: Schemas) -> None:
    worker = PeerWorker()
    try:
        case = PeerCase(PG_PEERS["pgqueuer"], "defaults", schemas, 4, worker)
        first, second = case.slice(), case.slice()
        where = {"peer": "pgqueuer", "variant": "defaults"}
        worker.call(op="put", first=100, n=1, **where)  # an item the case does not know of
        with pytest.raises(CheckFailed, match="pgqueuer"):
            case.slice()
    finally:
        worker.close()

    assert (first.messages, second.messages, case.baseline) == (4, 4, "pg_raw")
    assert case.durability() == "LOGGED, on (its defaults)" and case.fsyncs_every_commit()


def test_postgres_probes_two_consumers_share_and_a_crash_is_redelivered_or_held(
        schemas: Schemas, tmp_path: Path) -> None:
    names = ["queue_core_pg", *PG_PEERS]
    shared = {name: peer_safety.two_consumers(name, tmp_path, 12, "t", schemas)
              for name in names}
    crashed = peer_safety.crash_all(names, tmp_path, schemas=schemas)

    for name in names:
        assert (shared[name]["duplicates"], shared[name]["missing"], shared[name]["errors"]) == \
            (0, 0, []), name
        assert crashed[name]["others_missing"] == 0 and crashed[name]["crash_errors"] == [], name
    # ours and pgqueuer hand a dead consumer's item out again once its lease or
    # heartbeat is stale; procrastinate keeps it 'doing' until someone retries it
    assert {name: crashed[name]["crash"] for name in names} == \
        {"queue_core_pg": "redelivered", "pgqueuer": "redelivered", "procrastinate": "held"}
    assert shared["queue_core_pg"]["synchronous"] == "on"


def test_only_ours_refuses_a_late_ack_for_an_item_another_consumer_now_holds(
        schemas: Schemas) -> None:
    found = fencing.late_acks(schemas)

    ours = found["queue_core_pg"]
    assert ours["late_ack"].startswith("refused (LeaseLost") and ours["b_ack"] == "accepted"
    assert (ours["settled_after_a"], ours["settled"]) == ((0, 1), (1, 0))
    # pgqueuer deletes the job under its new owner; procrastinate marks it succeeded
    # for A and then refuses B, who really holds it
    assert found["pgqueuer"]["late_ack"] == "accepted"
    assert found["pgqueuer"]["settled_after_a"] == (1, 0)
    assert found["procrastinate"]["late_ack"] == "accepted"
    assert found["procrastinate"]["b_ack"].startswith("refused")


# -- the peers on the same work -------------------------------------------------

@pytest.mark.parametrize("name", list(PG_PEERS))
def test_a_postgres_peer_on_the_same_work_commits_one_effect_per_event_even_when_it_comes_twice(
        name: str, pg_dsn: str) -> None:
    queue = PG_PEERS[name](pg_dsn)
    try:
        effects = queue.open_effects(pg_dsn)  # a table in the same database, the same schema
        queue.put([item_of(i) for i in range(4)] + [item_of(1)])  # the source repeats E0001
        got = queue.work(10)
        settled = queue.settled()
    finally:
        queue.close()

    assert sorted(got) == ["E0000", "E0001", "E0001", "E0002", "E0003"]
    assert settled == (5, 0)  # the library acknowledged every job, the repeat included
    found = app_effects.rows(pg_dsn)
    assert found == [("E0000", "book", 100), ("E0001", "pen", 101), ("E0002", "bag", 102),
                     ("E0003", "book", 103)]
    assert sum(row[2] for row in found) == 406
    assert effects == {"journal_mode": "LOGGED", "synchronous": "on"}


def test_a_pgqueuer_consumer_dead_after_the_effect_is_picked_again_and_adds_no_effect(
        pg_dsn: str) -> None:
    adapter = PG_PEERS["pgqueuer"]
    first = adapter(pg_dsn)
    first.open_effects(pg_dsn)
    first.put([item_of(i) for i in range(3)])
    _, item = first.take() or (None, "")
    event_id, effect = app_effects.effect_of_item(item)
    assert first.run(first.effects.commit(event_id, effect))
    first.close()  # the consumer dies here: the effect committed, no log_jobs
    stale_soon = type("PgQueuerShortHeartbeat", (adapter,), {"lease_seconds": 0.2})
    time.sleep(0.3)  # its heartbeat is now stale for a dequeue that allows 0.2 s
    second = stale_soon(pg_dsn)
    try:
        second.open_effects(pg_dsn)
        again = second.work(10)
        settled = second.settled()
    finally:
        second.close()

    assert event_id in again and sorted(again) == ["E0000", "E0001", "E0002"]
    assert settled == (3, 0)
    assert app_effects.rows(pg_dsn) == app_effects.expected(3)  # the second run added nothing
    assert adapter.guarantee == "at least once, deduped"


def test_a_procrastinate_job_whose_worker_died_after_the_effect_waits_for_a_retry_then_adds_nothing(
        pg_dsn: str) -> None:
    adapter = PG_PEERS["procrastinate"]
    first = adapter(pg_dsn)
    first.open_effects(pg_dsn)
    first.put([item_of(i) for i in range(3)])
    _, item = first.take() or (None, "")
    event_id, effect = app_effects.effect_of_item(item)
    assert first.run(first.effects.commit(event_id, effect))
    first.close()  # the worker stops here: the effect committed, no finish_job
    second = adapter(pg_dsn)
    try:
        second.open_effects(pg_dsn)
        before_retry = second.work(10)
        held = second.settled()
        second.recover_stalled(30)  # the documented periodic task: retry_job each stalled job
        after_retry = second.work(10)
        settled = second.settled()
    finally:
        second.close()

    assert event_id not in before_retry and len(before_retry) == 2
    assert held == (2, 1)  # still doing: nobody hands it out by itself
    assert after_retry == [event_id] and settled == (3, 0)
    assert app_effects.rows(pg_dsn) == app_effects.expected(3)  # the rerun added nothing
    assert adapter.guarantee == "at least once after a retry, deduped"


def test_a_postgres_same_work_case_checks_the_effects_table_after_every_slice(
        schemas: Schemas) -> None:
    worker = PeerWorker()
    try:
        case = SameWorkCase(PG_PEERS["procrastinate"], "defaults", schemas, 4, worker)
        first, second = case.slice(), case.slice()
        import psycopg
        with psycopg.connect(case.effects_at, autocommit=True) as conn:
            conn.execute("DELETE FROM effects WHERE event_id = 'E0005'")
        with pytest.raises(CheckFailed, match="effects table holds 11 effects"):
            case.slice()
    finally:
        worker.close()

    assert (first.messages, second.messages, case.baseline) == (4, 4, "pg_raw")
    assert case.durability() == "LOGGED, on (its defaults); effects LOGGED, on"
    assert case.effects_at == case.path  # the same schema of the same database
