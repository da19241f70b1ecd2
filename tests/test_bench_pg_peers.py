"""The PostgreSQL peer queues of ``make bench`` (pgqueuer, procrastinate) on a
private server: the same put / get / ack as the SQLite peers, counted in their
own tables, their durability read back, and the two-consumer and crash probes
beside ours. Without a server these tests skip, or fail where
``QUEUE_CORE_PG_REQUIRED=1`` (``pg.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import fencing  # noqa: E402
import peer_safety  # noqa: E402
from bench_cases import CheckFailed  # noqa: E402
from peers import PG_PEERS, PeerCase, PeerWorker, item_of  # noqa: E402

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
