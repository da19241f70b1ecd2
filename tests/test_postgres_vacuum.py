"""How ``messages`` is vacuumed on PostgreSQL: the schema's own storage parameters
(``postgres.schema.MESSAGES_VACUUM``) on a new queue and on one migrated from schema 5,
and what a vacuum does for the claim's read of due messages.

When autovacuum comes is the server's clock (``autovacuum_naptime``): these tests
never wait for it. They read the parameters from the catalogue, and run ``VACUUM``
themselves on a table whose autovacuum they switch off, so that every count is the
data's own. ``make scale`` measures what the parameters do under load.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Iterator

import psycopg
import pytest

import pg
import previous_engine
from conftest import ROOT
from queue_core import Handler, ModelClock, Queue, migrate, postgres

sys.path.insert(0, str(ROOT / "benchmarks"))

from scale_probe import claim_work  # noqa: E402  (the benchmark's probe of the claim's reads)

# What the schema sets on ``messages``, as the catalogue spells it.
STORAGE = ["autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000",
           "autovacuum_vacuum_cost_delay=0", "vacuum_index_cleanup=on"]
EVENTS = 9000  # 174 pages of messages: an index pass is skipped (auto) below 3 with dead items


def storage(dsn: str) -> list[str] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT reloptions FROM pg_class "
                           "WHERE oid = 'messages'::regclass").fetchone()
    return None if row is None else row[0]


def batch(first: int, count: int) -> str:
    return "\n".join(json.dumps({"event_id": f"E{n:04d}", "payload": {
        "category": "book", "amount_cents": 100 + n}}) for n in range(first, first + count))


def filled(dsn: str) -> tuple[Queue, ModelClock]:
    """A queue of ``EVENTS`` ready messages whose table autovacuum never touches."""
    clock = ModelClock(1000)
    queue = Queue(dsn, clock=clock, lease_seconds=30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messages SET (autovacuum_enabled = false)")
    for first in range(0, EVENTS, 1000):
        queue.enqueue_jsonl(batch(first, 1000))
    return queue, clock


def finish(queue: Queue, count: int) -> None:
    """Claim and ACK ``count`` messages, one at a time, in the claim's order."""
    handler = Handler()
    with queue.session():
        for _ in range(count):
            lease = queue.claim()
            assert lease is not None
            queue.complete(lease, handler)


def vacuum(dsn: str, options: str = "") -> int:
    """``VACUUM (VERBOSE ...) messages``; how many passes over its indexes it made."""
    said: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda notice: said.append(notice.message_primary or ""))
        conn.execute(f"VACUUM (VERBOSE{options}) messages")
    found = [int(n) for text in said for n in re.findall(
        r'finished vacuuming "[^"]*\.messages": index scans: (\d+)', text)]
    assert len(found) == 1, said
    return found[0]


@pytest.fixture
def other_schema(pg_server: str) -> Iterator[str]:
    yield from pg.fresh_schema(pg_server)


def test_a_new_queue_sets_how_its_messages_are_vacuumed(pg_dsn: str) -> None:
    Queue(pg_dsn, clock=ModelClock(1000))
    assert storage(pg_dsn) == STORAGE
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the other tables keep the defaults
        others = conn.execute("SELECT relname, reloptions FROM pg_class WHERE relnamespace = "
                              "current_schema()::regnamespace AND relkind = 'r' "
                              "AND relname <> 'messages' ORDER BY relname").fetchall()
    assert others == [("compacted", None), ("effects", None), ("queue_core_meta", None),
                      ("transitions", None)]


def test_the_step_to_schema_6_sets_them_on_a_queue_of_the_previous_release(
        pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    previous_engine.require_history()
    engine = previous_engine.export(previous_engine.SCHEMA5_ENGINE,
                                    tmp_path_factory.mktemp("engines"))
    previous_engine.run(engine, "import sys\nfrom queue_core import ModelClock, Queue\n"
                        "Queue(sys.argv[1], clock=ModelClock(1000)).enqueue_jsonl(sys.argv[2])",
                        pg_dsn, batch(1, 3))
    assert storage(pg_dsn) is None  # schema 5 left every parameter at the server's default
    done = migrate(pg_dsn)
    assert (done.from_version, done.to_version) == (5, postgres.SCHEMA_VERSION)
    assert done.steps == ((5, 0), (6, 0))  # 5 -> 6 sets them; 6 -> 7 keeps them
    assert storage(pg_dsn) == STORAGE


def test_vacuum_cleans_the_indexes_even_of_a_few_dead_rows_in_a_large_table(
        pg_dsn: str, other_schema: str) -> None:
    """Below 2 % of the heap's pages with dead items, PostgreSQL (14 and later)
    skips the index pass unless the table says ``vacuum_index_cleanup = on``: the
    dead entries, those the claim's read walks, would stay for a later vacuum."""
    for dsn in (pg_dsn, other_schema):
        queue, _ = filled(dsn)
        finish(queue, 20)  # their old versions on 2 of the table's 175 pages
    assert vacuum(pg_dsn) == 1  # the table's own setting
    assert vacuum(other_schema, ", INDEX_CLEANUP AUTO") == 0  # the server's default


def test_after_a_vacuum_the_claims_read_of_due_messages_is_back_to_its_start(
        pg_dsn: str) -> None:
    """Each claim leaves its old version's entry at the head of the ready range; the
    next claim's read steps over every such page until a vacuum removes them."""
    queue, clock = filled(pg_dsn)
    start = claim_work(pg_dsn, clock.now())["due"]
    finish(queue, 2000)
    grown = claim_work(pg_dsn, clock.now())["due"]
    assert vacuum(pg_dsn) == 1
    after = claim_work(pg_dsn, clock.now())["due"]
    assert grown >= start + 10, (start, grown)  # 2,000 dead entries: a dozen index pages
    # PostgreSQL 16: 4, 18, then 6 buffers; 18: 12, 26, then 14
    assert after <= start + 2, (start, grown, after)
    assert queue.status().states == {"ready": EVENTS - 2000, "leased": 0, "done": 2000,
                                     "dead": 0}
