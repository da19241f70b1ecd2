"""Flat cost: the claim's reads walk partial indexes, whatever the queue holds.

``done`` rows are kept forever (they deduplicate repeats), so a claim that
scanned or sorted ``messages`` would slow down as history grows. The claim's
candidate reads (``transitions.DUE``, ``transitions.EXPIRED``) and the
guarded UPDATEs they sit in are the statements ``queue.py`` runs, explained
here as they are, and the work SQLite does for the reads is counted in
virtual-machine steps, which do not depend on the machine's speed. Every
guarded UPDATE finds its rows by primary key, and the pages each commit
writes are counted exactly. Each holds with messages of mixed priorities too
(``priority``): the claim's order is the live index's own, so a priority
changes where a message sits in the index, not how the claim reads it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Callable, Iterator

import pytest

from observe import expect, ledger
from queue_core import Handler, ModelClock, Queue
from queue_core.priority import DEFAULT_PRIORITY, PRIORITIES
from queue_core.retention import _CANDIDATES, _DROP_PAYLOADS
from queue_core.sqlite import PAGE_SIZE, SqliteStore
from queue_core.transitions import (ACK, CLAIM, DUE, EXPIRED, EXTEND, FAIL, RECOVER, REDRIVE,
                                    RELEASE, picking)

# Every message at priority 0, or priorities 0 to 9 in turn (event i at i % 10).
MIXES = {"all-0": False, "priorities-0-9": True}


def batch(first: int, count: int) -> str:
    return "".join(json.dumps({"event_id": f"E{i:04d}",
                               "payload": {"category": "pen", "amount_cents": 1}}) + "\n"
                   for i in range(first, first + count))


def enqueue(queue: Queue, first: int, count: int, mixed: bool) -> None:
    """Events ``first`` on: all at priority 0 in one batch, or (``mixed``) each
    at priority i % 10, one batch per priority (a batch has one priority)."""
    for priority in PRIORITIES if mixed else (DEFAULT_PRIORITY,):
        text = "".join(line for i, line in enumerate(batch(first, count).splitlines(True), first)
                       if not mixed or i % len(PRIORITIES) == priority)
        queue.enqueue_jsonl(text, priority=priority)


def fill(path: Path, clock: ModelClock, *, done: int, leased: int, ready: int,
         mixed: bool = False) -> Queue:
    """A queue with that many messages in each state (fsync off: only the
    shape of the file matters here, and the fill is faster); ``mixed``: with
    priorities 0 to 9 in turn."""
    queue = Queue(path, clock=clock, lease_seconds=60, synchronous="OFF")
    total = done + leased + ready
    for first in range(0, total, 1000):
        enqueue(queue, first, min(1000, total - first), mixed)
    with queue.session():
        drain_some(queue, done)
        if leased:
            queue.claim_batch(leased)
    assert ledger(path) == expect(total=done, effects=done, done=done, leased=leased,
                                  ready=ready)
    return queue


def drain_some(queue: Queue, count: int) -> list[str]:
    """Claim and complete ``count`` messages, 100 per transaction."""
    finished: list[str] = []
    while len(finished) < count:
        leases = queue.claim_batch(min(100, count - len(finished)))
        queue.complete_batch(leases, Handler())
        finished.extend(lease.event_id for lease in leases)
    return finished


@pytest.fixture
def reader(db_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db_path)
    yield conn
    conn.close()


BY_KEY = "SEARCH messages USING INDEX sqlite_autoindex_messages_1 (event_id=?)"


def plan(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> list[str]:
    return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]


def vm_steps(conn: sqlite3.Connection, sql: str, params: tuple[int, ...]) -> int:
    """Virtual-machine instructions SQLite executes for ``sql`` (deterministic)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 1)
    try:
        conn.execute(sql, params).fetchall()
    finally:
        conn.set_progress_handler(None, 1)
    return steps


# The live index's second column is the claim's order (``priority.CLAIM_ORDER``), an
# expression, which SQLite's plan names ``<expr>``; the due read is a range of it up to
# now (``CLAIM_ORDER <= now``), as it was a range of ``available_at`` before priorities.
IN_CLAIM_ORDER = "SEARCH messages USING INDEX messages_live (state=? AND <expr><?)"


@pytest.mark.parametrize("mixed", MIXES.values(), ids=MIXES)
@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "after-ANALYZE"])
def test_the_claim_walks_the_ready_index_in_order_without_a_scan_or_a_sort(
        db_path: Path, model_clock: ModelClock, reader: sqlite3.Connection,
        analyzed: bool, mixed: bool) -> None:
    fill(db_path, model_clock, done=1500, leased=100, ready=400, mixed=mixed)
    if analyzed:  # statistics must not tempt the planner into a scan
        reader.execute("ANALYZE")

    steps = plan(reader, picking(CLAIM, DUE, SqliteStore.picked), (1060, 1000, 1000, 100))

    assert steps == [BY_KEY, "LIST SUBQUERY 1", IN_CLAIM_ORDER]
    assert not any("SCAN" in step or "TEMP B-TREE" in step for step in steps)


READS_IN_CLAIM_ORDER = {"DUE": (DUE, (1000, 1000, 100)),
                        "prune's candidates": (_CANDIDATES, (1000, 1000, 1000, 100))}


@pytest.mark.parametrize("mixed", MIXES.values(), ids=MIXES)
@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "after-ANALYZE"])
@pytest.mark.parametrize("read", READS_IN_CLAIM_ORDER)
def test_the_due_read_and_prunes_candidates_are_one_search_of_the_live_index_in_its_order(
        db_path: Path, reader: sqlite3.Connection, analyzed: bool, mixed: bool,
        read: str) -> None:
    fill(db_path, ModelClock(1000), done=1500, leased=100, ready=400, mixed=mixed)
    if analyzed:
        reader.execute("ANALYZE")

    # ORDER BY the claim's order, event_id: the index's own order, so no sort (a
    # "USE TEMP B-TREE FOR ORDER BY" step) and no second index
    assert plan(reader, *READS_IN_CLAIM_ORDER[read]) == [IN_CLAIM_ORDER]


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "after-ANALYZE"])
def test_the_expiry_scan_walks_only_the_leased_rows_of_the_live_index(
        db_path: Path, model_clock: ModelClock, reader: sqlite3.Connection,
        analyzed: bool) -> None:
    fill(db_path, model_clock, done=1500, leased=100, ready=400)
    if analyzed:
        reader.execute("ANALYZE")

    steps = plan(reader, picking(RECOVER, EXPIRED, SqliteStore.picked), (3, 3, 1000))

    assert steps == [BY_KEY, "LIST SUBQUERY 1",
                     "SEARCH messages USING INDEX messages_live (state=?)"]


HOLDERS_WRITES = {"ACK": (ACK, (1000, "E0400", 1, 1000)),
                  "FAIL": (FAIL, ("ready", 1001, "x", "E0400", 1, 1000, "x")),
                  "EXTEND": (EXTEND, (1030, "E0400", 1, 1000)),
                  "RELEASE": (RELEASE, ("E0400", 1)),
                  "REDRIVE": (REDRIVE, (1000, "E0400"))}


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "after-ANALYZE"])
@pytest.mark.parametrize("name", HOLDERS_WRITES)
def test_every_guarded_update_of_one_message_finds_its_row_by_primary_key(
        db_path: Path, reader: sqlite3.Connection, analyzed: bool, name: str) -> None:
    fill(db_path, ModelClock(1000), done=300, leased=300, ready=300)
    if analyzed:
        reader.execute("ANALYZE")

    assert plan(reader, *HOLDERS_WRITES[name]) == [BY_KEY]


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "after-ANALYZE"])
def test_prunes_update_of_a_batch_finds_its_rows_by_key_not_in_the_done_backlog(
        db_path: Path, reader: sqlite3.Connection, analyzed: bool) -> None:
    # 1,500 done messages not yet pruned: a long retention's backlog, which the
    # batch's UPDATE, under the write lock, must not read through
    fill(db_path, ModelClock(1000), done=1500, leased=100, ready=400)
    if analyzed:
        reader.execute("ANALYZE")
    batch = tuple(f"E{n:04d}" for n in range(1, 51))

    steps = plan(reader, _DROP_PAYLOADS.format(", ".join("?" * len(batch))), batch)

    assert steps == [BY_KEY]


def test_the_claims_work_does_not_grow_with_done_rows_nor_change_with_priorities(
        tmp_path: Path) -> None:
    counts = {}
    for mix, mixed in MIXES.items():
        for done in (10, 4000):
            queue = fill(tmp_path / f"{mix}-{done}.sqlite3", ModelClock(1000), done=done,
                         leased=10, ready=50, mixed=mixed)
            conn = sqlite3.connect(queue.path)
            try:
                counts[mix, done] = (vm_steps(conn, DUE, (1000, 1000, 10)),
                                     vm_steps(conn, EXPIRED, (1000,)))
            finally:
                conn.close()

    assert len(set(counts.values())) == 1, counts  # 10 or 4,000 done, priorities or not
    assert counts["all-0", 10][0] < 400  # ten candidates, not thousands of rows


def test_the_claims_work_does_not_grow_with_ready_rows_beyond_its_limit(
        tmp_path: Path) -> None:
    few = fill(tmp_path / "few.sqlite3", ModelClock(1000), done=0, leased=0, ready=20)
    many = fill(tmp_path / "many.sqlite3", ModelClock(1000), done=0, leased=0, ready=5000)
    counts = []
    for queue in (few, many):
        conn = sqlite3.connect(queue.path)
        try:
            counts.append(vm_steps(conn, DUE, (1000, 1000, 10)))
        finally:
            conn.close()

    assert counts[0] == counts[1]


# -- pages per commit ---------------------------------------------------------
# At synchronous=FULL each commit appends its changed pages to the -wal file
# and fsyncs it; on a fast disk the bytes of that write show in the price of
# the commit. These counts are exact for a given schema, so a change that
# makes every commit write one more page (an index, a rowid table) fails here.

def wal_frames_of(queue: Queue, step: Callable[[], object]) -> int:
    """WAL frames (changed pages) that ``step``'s commits append."""
    conn = sqlite3.connect(queue.path)  # held open: the last close would delete the -wal
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # start from an empty log
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        step()
        size = Path(queue.path + "-wal").stat().st_size
    finally:
        conn.close()
    header, frame_header = 32, 24
    assert (size - header) % (frame_header + page_size) == 0
    return (size - header) // (frame_header + page_size)


def test_a_new_queue_file_has_small_pages(queue: Queue, db_path: Path) -> None:
    # Each commit appends every page it changed, whole, to the WAL: with 1 KB
    # pages an ACK that claims the next appends about 4 KB, with 4 KB pages 16 KB.
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 1024
    finally:
        conn.close()


@pytest.mark.parametrize("mixed", MIXES.values(), ids=MIXES)
def test_a_single_message_claim_writes_three_pages_and_its_ack_four(
        queue: Queue, handler: Handler, db_path: Path, mixed: bool) -> None:
    enqueue(queue, 0, 50, mixed)
    leases = []

    claim = wal_frames_of(queue, lambda: leases.append(queue.claim()))
    ack = wal_frames_of(queue, lambda: queue.complete(leases[0], handler))

    # claim: the row, the live index (its entry moves from the ready range to the
    # leased range beside it, on one page), the journal
    # ACK: the effect (its key is the table), the row, the live index, the journal
    assert (claim, ack) == (3, 4)
    assert leases[0].event_id == ("E0009" if mixed else "E0000")  # priority 9 first
    assert ledger(db_path) == expect(total=1, effects=1, done=1, ready=49)


def test_a_batch_of_a_hundred_writes_a_fraction_of_a_page_per_message(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_jsonl(batch(0, 300))
    queue.complete_batch(queue.claim_batch(100), handler)  # the indexes reach their shape
    leases = []

    claim = wal_frames_of(queue, lambda: leases.extend(queue.claim_batch(100)))
    ack = wal_frames_of(queue, lambda: queue.complete_batch(leases, handler))

    # 1 KB pages: a quarter of a page per message, versus four for a worker-loop step
    # (the done rows stay in the live index until they are pruned)
    assert claim + ack <= 50
    assert ledger(db_path) == expect(total=200, effects=200, done=200, ready=100)


@pytest.mark.parametrize("mixed", MIXES.values(), ids=MIXES)
def test_the_worker_loops_step_writes_four_pages_in_one_commit_where_two_commits_wrote_seven(
        queue: Queue, handler: Handler, db_path: Path, mixed: bool) -> None:
    enqueue(queue, 0, 50, mixed)
    leases = [queue.claim()]

    step = wal_frames_of(queue, lambda: leases.append(queue.complete_and_claim(leases[0],
                                                                               handler)[1]))

    # the effect, the two rows (one leaf page), the live index (the ACKed entry
    # moves from the leased range to the done range, the next from the ready
    # range to the leased range: one page where the three ranges meet), the
    # journal's two rows (one page): the pages of a claim and of an ACK
    # overlap, and one commit writes each once
    assert step == 4
    assert ledger(db_path) == expect(total=1, effects=1, done=1, leased=1, ready=48)


def step_pages(queue: Queue, handler: Handler, steps: int) -> list[int]:
    """The WAL pages of each of the worker loop's first ``steps`` steps."""
    leases = [queue.claim()]
    return [wal_frames_of(queue, lambda: leases.append(
        queue.complete_and_claim(leases[-1], handler)[1])) for _ in range(steps)]


def test_the_worker_loops_step_writes_a_page_more_where_lone_enqueues_take_turns_at_priorities(
        tmp_path: Path, handler: Handler) -> None:
    queues = {}
    for mix, mixed in MIXES.items():
        queues[mix] = Queue(tmp_path / f"{mix}.sqlite3", clock=ModelClock(1000))
        for i in range(50):  # one message per enqueue, as single producers send them
            queues[mix].enqueue_jsonl(batch(i, 1), priority=i % 10 if mixed else 0)

    pages = {mix: step_pages(queue, handler, 4) for mix, queue in queues.items()}

    # All at 0, the next message claimed is the row beside the one ACKed, on its page.
    # With priorities 0 to 9 in turn it is ten rows on (E0009, then E0019): the rows sit
    # in the order they came, and the claim takes them in the claim's order, so the
    # step writes the table's page of each, one page more than the four above. A
    # batch has one priority, and its rows sit together (the step above writes four).
    assert pages == {"all-0": [4, 4, 4, 4], "priorities-0-9": [5, 5, 5, 5]}
    for queue in queues.values():
        assert ledger(queue.path) == expect(total=4, effects=4, done=4, leased=1, ready=45)
