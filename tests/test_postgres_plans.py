"""The claim on the plans a real PostgreSQL server picks, not only a fresh schema's.

A fresh schema's tables were never analyzed, so the planner guesses their
sizes. A real server's autovacuum analyzes a table about a minute after it
changes, and from then on the planner chooses from what it saw: after a
drain it saw no ready row. A long-lived worker also runs prepared
statements (psycopg prepares one on the server after its fifth execution),
and those may run a generic plan. Each statement that picks rows with
``LIMIT ... SKIP LOCKED`` must lease exactly the rows its read returned on
every such plan: an ``IN (subquery)`` that the planner turned into a nested
loop re-ran the read for every row it compared and leased every ready
message for one claim.

Every test here asserts exact states, money, effects and journal rows, on a
real server; only the clock is modelled.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import pytest

import pg
from queue_core import Effect, Handler, ModelClock, Queue, audit
from queue_core.lab.story.child import open_gate, reap, run_child
from queue_core.postgres import PostgresStore
from queue_core.priority import DEFAULT_PRIORITY, PRIORITIES
from queue_core.transitions import CLAIM, DUE, picking
from queue_core.worker import drain

LEASE = 30
FIRST_SLICE = 200

# Each is a session setting a real worker may run under, or that pushes the
# planner to a strategy it would otherwise pick only on other statistics.
PLANNERS = {
    "as analyzed": "",
    "no hash join": "-c enable_hashjoin=off",
    "no merge join": "-c enable_mergejoin=off",
    "no nested loop": "-c enable_nestloop=off",
    "nested loop only": "-c enable_hashjoin=off -c enable_mergejoin=off",
    "no index scan": "-c enable_indexscan=off -c enable_bitmapscan=off",
    "generic plans": "-c plan_cache_mode=force_generic_plan",
    "generic nested loop": ("-c plan_cache_mode=force_generic_plan -c enable_hashjoin=off "
                            "-c enable_mergejoin=off"),
}


def events(first: int, count: int, amount: int = 1) -> str:
    return "".join(json.dumps({"event_id": f"E{i:04d}",
                               "payload": {"category": "pen", "amount_cents": amount}}) + "\n"
                   for i in range(first, first + count))


def with_options(dsn: str, options: str) -> str:
    """``dsn`` whose sessions start with ``options`` (``-c name=value`` ...)."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} {options}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def counts(dsn: str) -> dict[str, object]:
    """Money, effects and states as the audit reads them, with its findings."""
    snap = audit.snapshot(dsn)
    return {"findings": audit.check(snap), "total": snap.status.total,
            "effects": snap.status.effects,
            "states": {state: n for state, n in snap.status.states.items() if n}}


def journal(dsn: str, reason: str) -> Counter[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return Counter(row[0] for row in conn.execute(
            "SELECT event_id FROM transitions WHERE reason = %s", (reason,)))


def analyzed_after_a_drain(dsn: str, clock: ModelClock) -> None:
    """200 events enqueued and drained, then ``ANALYZE``: the statistics saw
    no ready row, as autovacuum's would about a minute after a drain."""
    queue = Queue(dsn, clock=clock, lease_seconds=LEASE)
    queue.enqueue_jsonl(events(0, FIRST_SLICE))
    assert len(drain(queue, Handler())) == FIRST_SLICE
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE messages")
        conn.execute("ANALYZE transitions")
        conn.execute("ANALYZE effects")


@pytest.mark.parametrize("planner", PLANNERS)
def test_every_claim_leases_exactly_what_it_returns_on_each_plan_the_server_may_pick(
        pg_dsn: str, planner: str) -> None:
    clock = ModelClock(1000)
    analyzed_after_a_drain(pg_dsn, clock)
    Queue(pg_dsn, clock=clock).enqueue_jsonl(events(200, 200))
    queue = Queue(with_options(pg_dsn, PLANNERS[planner]), clock=clock, lease_seconds=LEASE)
    handler = Handler()

    with queue.session():  # one long-lived connection: its statements get prepared
        # claim and give back, more often than psycopg's prepare threshold
        for _ in range(7):
            lease = queue.claim()
            assert lease is not None and lease.event_id == "E0200"
            assert counts(pg_dsn)["states"] == {"done": 200, "leased": 1, "ready": 199}
            queue.release(lease)
        first = queue.claim()
        batch = queue.claim_batch(5)
        assert [lease.event_id for lease in [first, *batch]] == [
            f"E{i:04d}" for i in range(200, 206)]
        assert counts(pg_dsn)["states"] == {"done": 200, "leased": 6, "ready": 194}

        # the worker loop's ACK claims the next: one message leased at a time
        assert all(isinstance(r, Effect) for r in queue.complete_batch(batch, handler))
        lease = first
        for step in range(10):
            _, lease = queue.complete_and_claim(lease, handler)
            assert lease is not None and lease.event_id == f"E{206 + step:04d}"
            assert counts(pg_dsn)["states"] == {"done": 206 + step, "leased": 1,
                                                "ready": 193 - step}

        # four leases expire together: recovery changes and journals exactly those
        # four, and the claim after it leases the next two due (available since 1000;
        # the recovered ones are available again from their old deadline, 1030)
        held = [lease, *queue.claim_batch(3)]
        assert [lease.event_id for lease in held] == ["E0215", "E0216", "E0217", "E0218"]
        assert counts(pg_dsn)["states"] == {"done": 215, "leased": 4, "ready": 181}
        clock.advance(LEASE)
        again = queue.claim_batch(2)

    assert journal(pg_dsn, "lease_expired") == Counter({lease.event_id: 1 for lease in held})
    assert [(lease.event_id, lease.generation) for lease in again] == [("E0219", 1),
                                                                      ("E0220", 1)]
    assert counts(pg_dsn) == {"findings": [], "total": 215, "effects": 215,
                              "states": {"done": 215, "leased": 2, "ready": 183}}

    outcomes = drain(queue, handler)  # every due message; the two just claimed stay leased
    assert counts(pg_dsn)["states"] == {"done": 398, "leased": 2}
    clock.advance(LEASE)
    outcomes += drain(queue, handler)  # their leases expired: recovered, then done
    assert Counter(o.kind for o in outcomes) == Counter({"done": 185})
    assert counts(pg_dsn) == {"findings": [], "total": 400, "effects": 400,
                              "states": {"done": 400}}
    claims = journal(pg_dsn, "claimed")
    assert set(claims) == {f"E{i:04d}" for i in range(400)}
    # E0200 claimed and given back 7 times before its last claim; each expired
    # lease claimed twice; every other message once, each claim journalled once
    assert claims["E0200"] == 8
    assert {claims[lease.event_id] for lease in held + again} == {2}
    assert sum(claims.values()) == 400 + 7 + len(held) + len(again)


@pytest.mark.parametrize("planner", ["as analyzed", "generic nested loop"])
def test_a_claim_after_an_analyze_that_saw_no_ready_row_leaves_the_others_ready_for_others(
        pg_dsn: str, planner: str) -> None:
    clock = ModelClock(1000)
    analyzed_after_a_drain(pg_dsn, clock)
    Queue(pg_dsn, clock=clock).enqueue_jsonl(events(200, 200))
    dsn = with_options(pg_dsn, PLANNERS[planner])
    one, two = (Queue(dsn, clock=clock, lease_seconds=LEASE) for _ in range(2))

    with one.session(), two.session():
        leases = [queue.claim() for _ in range(6) for queue in (one, two)]

    assert [lease.event_id for lease in leases if lease] == [f"E{i:04d}" for i in range(200, 212)]
    assert counts(pg_dsn) == {"findings": [], "total": 200, "effects": 200,
                              "states": {"done": 200, "leased": 12, "ready": 188}}
    clock.advance(LEASE + 1)  # the seed's failure: each drain handled 1, then none went dead
    outcomes = drain(one, Handler())
    assert Counter(o.kind for o in outcomes) == Counter({"done": 200})
    assert counts(pg_dsn) == {"findings": [], "total": 400, "effects": 400,
                              "states": {"done": 400}}
    assert journal(pg_dsn, "attempts_exhausted") == Counter()


# -- a long run while autovacuum analyzes the tables ----------------------------

SLICES, SLICE = 6, 100
ANALYZE_WAIT_SECONDS = 60.0


@pytest.fixture(scope="module")
def analyzing_server() -> Iterator[str]:
    """A private server whose autovacuum wakes every second (the default is a
    minute); the setting is the server's own, so never a shared server's."""
    for dsn in pg.server_dsn(pg.own_server):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET autovacuum_naptime = 1")
            conn.execute("SELECT pg_reload_conf()")
        yield dsn


def autoanalyzed(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT autoanalyze_count FROM pg_stat_user_tables "
                           "WHERE schemaname = %s AND relname = 'messages'", (schema,)).fetchone()
    return int(row[0]) if row else 0


def wait_for_an_analyze(dsn: str, schema: str, seen: int) -> int:
    """Block until autovacuum has analyzed ``messages`` again (a real-time
    deadline: it fails the test, it never decides what passes)."""
    deadline = time.monotonic() + ANALYZE_WAIT_SECONDS
    while (count := autoanalyzed(dsn, schema)) <= seen:
        assert time.monotonic() < deadline, (
            f"autovacuum did not analyze messages within {ANALYZE_WAIT_SECONDS:.0f} s")
        time.sleep(0.1)
    return count


def test_workers_drain_slice_after_slice_exactly_once_while_autovacuum_analyzes_between(
        analyzing_server: str, tmp_path: Path) -> None:
    dsn = pg.new_schema(analyzing_server, prefix="queue_test")
    schema = pg.schema_of(dsn)
    assert schema is not None
    try:
        clock = ModelClock(1000)
        lasting = Queue(dsn, clock=clock, lease_seconds=LEASE)  # one long-lived worker
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("messages", "effects", "transitions"):  # analyze after 50 changes
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_analyze_scale_factor = 0, "
                             "autovacuum_analyze_threshold = 50)")
        analyses = autoanalyzed(analyzing_server, schema)
        done_by: Counter[str] = Counter()
        with lasting.session():
            for number in range(SLICES):
                first = number * SLICE
                lasting.enqueue_jsonl(events(first, SLICE, amount=number + 1))
                if number % 2 == 0:  # the long-lived worker alone, its statements prepared
                    finished = [o.event_id for o in drain(lasting, Handler())]
                else:  # two worker processes at once
                    finished = two_workers(dsn, tmp_path / f"gate{number}")
                done_by.update(finished)
                assert sorted(finished) == [f"E{i:04d}" for i in range(first, first + SLICE)]
                expected_total = sum((n + 1) * SLICE for n in range(number + 1))
                assert counts(dsn) == {"findings": [], "total": expected_total,
                                       "effects": SLICE * (number + 1),
                                       "states": {"done": SLICE * (number + 1)}}
                # the next slice meets statistics that saw this one drained: no ready row
                analyses = wait_for_an_analyze(analyzing_server, schema, analyses)
        assert set(done_by.values()) == {1}
        assert journal(dsn, "claimed") == Counter({event_id: 1 for event_id in done_by})
        assert journal(dsn, "lease_expired") == Counter()
    finally:
        pg.drop_schema(dsn)


def two_workers(dsn: str, gate: Path) -> list[str]:
    gate.mkdir()
    workers = [run_child(dsn, now=1000, lease_seconds=LEASE, mode="drain", wait=False,
                         gate=str(gate)) for _ in range(2)]
    try:
        open_gate(gate, 2)
        outputs = [proc.communicate(timeout=60)[0] for proc in workers]
    finally:
        reap(workers)
    assert [proc.returncode for proc in workers] == [0, 0]
    return [json.loads(line)["event_id"] for out in outputs for line in out.splitlines()]


# -- the claim's plan and reads with priorities ---------------------------------------
# The due read walks ``messages_live`` in the claim's order (``priority.CLAIM_ORDER``),
# bounded by now on that order and on ``available_at``: one index scan, no sort, a
# handful of buffers however many messages are done, and as many with priorities as
# without. Without ``available_at`` in the index, a table not analyzed yet with few
# ready rows got a bitmap scan of every ready row and a sort (``LIVE_INDEX_6``).

def enqueue_mixed(queue: Queue, first: int, count: int, mixed: bool) -> None:
    """Events ``first`` on, all at priority 0, or (``mixed``) each at i % 10, one
    batch per priority (a batch has one priority)."""
    lines = events(first, count).splitlines()
    for priority in PRIORITIES if mixed else (DEFAULT_PRIORITY,):
        queue.enqueue_jsonl("\n".join(line for i, line in enumerate(lines, first)
                                      if not mixed or i % len(PRIORITIES) == priority),
                            priority=priority)


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def claims_plan(dsn: str, now: int) -> list[tuple[str, str | None]]:
    """The claim's statement as the queue runs it: its plan's nodes (type, index)."""
    claim = picking(CLAIM, DUE, PostgresStore.picked).replace("?", "%s")
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + claim,
                            (now + LEASE, now, now, 1)).fetchone()[0][0]["Plan"]
    return [(node["Node Type"], node.get("Index Name")) for node in plan_nodes(plan)]


def due_plan(dsn: str, now: int) -> list[tuple[str, str | None]]:
    """The claim's due read alone, as it locks its rows: its plan's nodes (type, index)."""
    due = DUE.replace("?", "%s") + " FOR NO KEY UPDATE SKIP LOCKED"
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + due, (now, now, 1)).fetchone()[0][0]["Plan"]
    return [(node["Node Type"], node.get("Index Name")) for node in plan_nodes(plan)]


def due_buffers(dsn: str, now: int) -> int:
    """Buffers the claim's due read touches, read as the claim reads it (locking, in
    a transaction rolled back); once before, as the session's first read of the
    tables also reads the catalogs."""
    due = DUE.replace("?", "%s") + " FOR NO KEY UPDATE SKIP LOCKED"
    with psycopg.connect(dsn) as conn:
        for _ in range(2):
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + due,
                                (now, now, 1)).fetchone()[0][0]["Plan"]
        conn.rollback()
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


ROUNDS, ENQUEUED, LEFT_READY = 3, 500, 200


@pytest.mark.parametrize("planner", ["as analyzed", "generic plans"])
@pytest.mark.parametrize("analyzed", [False, True], ids=["vacuumed", "vacuumed-and-analyzed"])
def test_the_claim_is_one_index_scan_of_the_live_index_and_reads_as_much_with_priorities(
        pg_server: str, analyzed: bool, planner: str) -> None:
    found: dict[str, Any] = {}
    for mix in ("all 0", "priorities 0-9"):
        for dsn in pg.fresh_schema(pg_server):
            clock = ModelClock(1000)
            queue = Queue(dsn, clock=clock, lease_seconds=LEASE)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ALTER TABLE messages SET (autovacuum_enabled = false)")
            plans, reads, buffers = [], [], []
            for number in range(ROUNDS):  # each round: more history, the same ready rows
                enqueue_mixed(queue, number * ENQUEUED, ENQUEUED, mix != "all 0")
                drain(queue, Handler(), batch_size=100, max_messages=ENQUEUED - LEFT_READY)
                # as it is (in the first round never vacuumed nor analyzed: a new queue)
                plans.append(claims_plan(with_options(dsn, PLANNERS[planner]), clock.now()))
                reads.append(due_plan(with_options(dsn, PLANNERS[planner]), clock.now()))
                with psycopg.connect(dsn, autocommit=True) as conn:  # the dead versions gone
                    conn.execute("VACUUM ANALYZE messages" if analyzed else "VACUUM messages")
                plans.append(claims_plan(with_options(dsn, PLANNERS[planner]), clock.now()))
                reads.append(due_plan(with_options(dsn, PLANNERS[planner]), clock.now()))
                buffers.append(due_buffers(with_options(dsn, PLANNERS[planner]), clock.now()))
                drain(queue, Handler(), batch_size=100)
                clock.advance(10)
            found[mix] = (plans, reads, buffers, counts(dsn))

    for mix, (plans, reads, buffers, stored) in found.items():
        for nodes in plans:  # the due read: one ordered walk of messages_live, no sort
            assert [node for node in nodes if node[1] == "messages_live"] == [
                ("Index Scan", "messages_live")], (mix, nodes)
            assert not any("Sort" in kind for kind, _ in nodes), nodes
        # and nothing else reads messages for it. (The UPDATE then finds the rows it
        # picked by key; on a table this small PostgreSQL 16 may read it whole for
        # that, a choice of its costs that does not depend on the priorities.)
        for nodes in reads:
            assert nodes == [("Limit", None), ("LockRows", None),
                             ("Index Scan", "messages_live")], (mix, nodes)
        assert stored == {"findings": [], "total": ROUNDS * ENQUEUED,
                          "effects": ROUNDS * ENQUEUED, "states": {"done": ROUNDS * ENQUEUED}}
    # The same buffers per claim as history grows, and with priorities as without, to
    # one page: which leaf the ready range begins on, after the done entries before it,
    # moves with their number, and the read may step to the next leaf (1,000 and 400
    # ready gave 6 and 6 here, 500 and 200 gave 6 and 5)
    flat = {mix: set(buffers) for mix, (_, _, buffers, _) in found.items()}
    assert all(len(each) == 1 for each in flat.values()), flat
    (plain,), (mixed,) = flat.values()
    assert abs(mixed - plain) <= 1 and max(plain, mixed) <= 8, flat
