"""PostgreSQL's worker step as one call of the schema's function (schema version 3).

The handler computes the effect from the payload the claim returned; the
server writes it, marks the message done under the ACK's guard and the
payload's digest, and claims the next, in one statement. These tests hold it
to the client's own path (a handler that overrides ``apply`` takes that one):
the same rows, the same refusals with the same codes, nothing written by a
refused step, and one round trip per message.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import psycopg
import pytest

from queue_core import (Handler, IntegrityViolation, InvalidPayload, LeaseLost, ModelClock,
                        Queue, UnknownEvent, audit, drain)
from queue_core.acks import _effect_only
from queue_core.lab.story.faults import FlakyHandler
from queue_core.postgres import PostgresStore
from queue_core.values import Lease

EVENTS = [("E0001", "book", 10000), ("E0002", "pen", 2000), ("E0003", "bag", 700),
          ("E0004", "book", 5000), ("E0005", "toy", 3000)]


def jsonl(events: list[tuple[str, str, int]]) -> str:
    return "\n".join(json.dumps({"event_id": e, "payload": {"category": c, "amount_cents": a}})
                     for e, c, a in events)


def rows(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def journal(dsn: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT at, event_id, from_state, to_state, generation, attempts, reason "
                     "FROM transitions ORDER BY seq")


def stored(dsn: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT event_id, state, attempts, generation, available_at, lease_until, "
                     "last_error, finished_at FROM messages ORDER BY event_id")


class ClientSide(Handler):
    """The same business rules, writing the effect itself: the client's path."""

    def apply(self, conn: Any, event_id: str, payload: Any) -> Any:
        return super().apply(conn, event_id, payload)


def count_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The event ids the step function is called for (the real call goes on)."""
    called: list[str] = []
    real = PostgresStore.step

    def step(self: PostgresStore, conn: Any, lease: Lease, *args: Any) -> Any:
        called.append(lease.event_id)
        return real(self, conn, lease, *args)

    monkeypatch.setattr(PostgresStore, "step", step)
    return called


def test_the_function_and_the_clients_step_write_the_same_rows(
        pg_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import pg

    called = count_calls(monkeypatch)
    results = []
    for handler in (Handler(), ClientSide()):
        for dsn in pg.fresh_schema(pg_server):
            clock = ModelClock(1000)
            queue = Queue(dsn, clock=clock, lease_seconds=30)
            queue.enqueue_jsonl(jsonl(EVENTS))
            outcomes = drain(queue, handler)
            snap = audit.snapshot(dsn)
            assert audit.check(snap) == []
            results.append(([(o.event_id, o.kind, o.generation, o.code) for o in outcomes],
                            journal(dsn), stored(dsn),
                            rows(dsn, "SELECT * FROM effects ORDER BY event_id")))
    assert _effect_only(Handler()) and not _effect_only(ClientSide())
    # the first handler's, and not E0005's: its payload is invalid, so nothing is sent
    assert called == ["E0001", "E0002", "E0003", "E0004"]
    by_function, by_client = results
    assert by_function == by_client
    outcomes, _, states, effects = by_function
    assert [kind for _, kind, _, _ in outcomes] == ["done", "done", "done", "done", "dead"]
    assert sum(amount for _, _, amount in effects) == 17700 and len(effects) == 4
    assert [state for _, state, *_ in states] == ["done", "done", "done", "done", "dead"]


def test_a_lease_of_an_earlier_claim_is_refused_by_the_function_and_claims_nothing(
        pg_dsn: str) -> None:
    clock = ModelClock(1000)
    queue = Queue(pg_dsn, clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:1]))
    old = queue.claim()
    assert old is not None and old.payload is not None
    clock.advance(31)
    newer = queue.claim()  # recovers E0001 (ready again) and claims it: generation 2
    assert newer is not None and (newer.event_id, newer.generation) == ("E0001", 2)
    queue.enqueue_jsonl(jsonl(EVENTS[1:2]))
    before = (journal(pg_dsn), stored(pg_dsn))

    with pytest.raises(LeaseLost) as refused:
        queue.complete_and_claim(old, Handler())

    assert refused.value.code == "stale_generation"
    assert (journal(pg_dsn), stored(pg_dsn)) == before
    assert rows(pg_dsn, "SELECT count(*) FROM effects") == [(0,)]
    effect, following = queue.complete_and_claim(newer, Handler())
    assert effect.amount_cents == 10000 and following is not None
    assert following.event_id == "E0002"


@pytest.mark.parametrize("how, code", [("expired", "lease_expired"), ("released", "not_leased")])
def test_an_expired_or_given_back_lease_is_refused_with_the_clients_codes(
        pg_dsn: str, how: str, code: str) -> None:
    clock = ModelClock(1000)
    queue = Queue(pg_dsn, clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:2]))
    lease = queue.claim()
    assert lease is not None
    if how == "expired":
        clock.advance(30)
    else:
        queue.release(lease)
    before = (journal(pg_dsn), stored(pg_dsn))

    with pytest.raises(LeaseLost) as refused:
        queue.complete_and_claim(lease, Handler())

    assert refused.value.code == code
    assert (journal(pg_dsn), stored(pg_dsn)) == before


def test_a_lease_whose_payload_was_changed_is_refused_and_writes_nothing(pg_dsn: str) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:2]))
    lease = queue.claim()
    assert lease is not None and json.loads(lease.payload or "") == {
        "category": "book", "amount_cents": 10000}
    forged = dataclasses.replace(lease, payload='{"amount_cents":1,"category":"book"}')
    assert forged == lease  # the payload is not part of the token's identity
    before = (journal(pg_dsn), stored(pg_dsn))

    with pytest.raises(IntegrityViolation) as refused:
        queue.complete_and_claim(forged, Handler())

    assert refused.value.code == "payload_differs"
    assert "E0001" in str(refused.value) and "not the stored one" in str(refused.value)
    assert (journal(pg_dsn), stored(pg_dsn)) == before
    assert rows(pg_dsn, "SELECT count(*) FROM effects") == [(0,)]
    # the lease still holds: its true payload is ACKed, once
    effect, following = queue.complete_and_claim(lease, Handler())
    assert effect.amount_cents == 10000 and following is not None
    assert rows(pg_dsn, "SELECT event_id, amount_cents FROM effects") == [("E0001", 10000)]


def test_a_lease_made_by_hand_carries_no_payload_and_takes_the_clients_path(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    called = count_calls(monkeypatch)
    queue = Queue(pg_dsn, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:2]))
    claimed = queue.claim()
    assert claimed is not None
    by_hand = Lease(claimed.event_id, claimed.generation, claimed.attempt, claimed.lease_until)
    assert by_hand.payload is None and by_hand == claimed

    effect, following = queue.complete_and_claim(by_hand, Handler())

    assert effect.amount_cents == 10000 and following is not None
    assert following.payload is not None and called == []
    queue.complete_and_claim(following, Handler())
    assert called == ["E0002"]


def test_an_invalid_payload_of_a_lost_lease_is_reported_as_lost_not_as_invalid(
        pg_dsn: str) -> None:
    clock = ModelClock(1000)
    queue = Queue(pg_dsn, clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(jsonl([("E0005", "toy", 3000)]))
    lease = queue.claim()
    assert lease is not None
    with pytest.raises(InvalidPayload):
        queue.complete_and_claim(lease, Handler())
    clock.advance(30)

    with pytest.raises(LeaseLost) as lost:
        queue.complete_and_claim(lease, Handler())

    assert lost.value.code == "lease_expired"
    assert [row[1:] for row in stored(pg_dsn)] == [("leased", 1, 1, 1000, 1030, None, None)]


def test_a_transient_fault_is_the_handlers_and_the_function_writes_nothing(
        pg_dsn: str) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:2]))
    flaky = FlakyHandler(first_attempt=["E0001"])
    assert _effect_only(flaky)

    outcomes = drain(queue, flaky)

    assert [(o.event_id, o.kind, o.code) for o in outcomes] == [
        ("E0001", "retry", "transient_error"), ("E0002", "done", None)]
    assert rows(pg_dsn, "SELECT event_id FROM effects") == [("E0002",)]
    assert [(r[0], r[1], r[2]) for r in stored(pg_dsn)] == [("E0001", "ready", 1),
                                                           ("E0002", "done", 1)]


def test_an_effect_the_schema_refuses_is_an_integrity_violation_and_nothing_is_done(
        pg_dsn: str) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:2]))
    lease = queue.claim()
    assert lease is not None
    # an effect row written by hand, outside the protocol
    rows(pg_dsn, "INSERT INTO effects VALUES ('E0001', 'book', 10000) RETURNING event_id")
    before = (journal(pg_dsn), stored(pg_dsn))

    with pytest.raises(IntegrityViolation) as refused:
        queue.complete_and_claim(lease, Handler())

    assert refused.value.code == "integrity_violation"
    assert str(refused.value).startswith("E0001: duplicate key value violates unique constraint")
    assert "\n" not in str(refused.value)
    assert (journal(pg_dsn), stored(pg_dsn)) == before


def test_on_the_servers_clock_the_function_reads_the_time_itself(pg_dsn: str) -> None:
    from queue_core.postgres import DatabaseClock

    clock = DatabaseClock(pg_dsn)
    try:
        queue = Queue(pg_dsn, clock=clock, lease_seconds=30)
        queue.enqueue_jsonl(jsonl(EVENTS[:2]))
        lease = queue.claim()
        assert lease is not None
        before = clock.now()
        effect, following = queue.complete_and_claim(lease, Handler())
        after = clock.now()
    finally:
        clock.close()
    assert effect.amount_cents == 10000 and following is not None
    (finished,), = rows(pg_dsn, "SELECT finished_at FROM messages WHERE event_id = 'E0001'")
    assert before <= finished <= after
    assert before + 30 <= following.lease_until <= after + 30


def _read_cost(dsn: str, sql: str, now: int) -> tuple[int, str]:
    """Buffers a read touches (hit or read), and its plan's top node, inside a
    transaction that is rolled back."""
    with psycopg.connect(dsn) as conn:
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                            + sql.replace("?", "%s"), (now,)).fetchone()[0][0]["Plan"]
        conn.rollback()
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"], plan["Node Type"]


def test_the_claims_read_of_expired_leases_does_not_grow_with_the_messages_done(
        pg_dsn: str) -> None:
    """Every claim and ACK writes a new version of the message's row; the old
    version's index entries stay until VACUUM. The read of expired leases must not
    walk those of every message finished since: it would make each claim slower
    than the one before, until autovacuum comes (here it never does)."""
    from queue_core.postgres import EXPIRED_READ

    clock = ModelClock(1000)
    queue = Queue(pg_dsn, clock=clock, lease_seconds=30)  # creates the schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messages SET (autovacuum_enabled = false)")
    costs = []
    for start in (0, 1000):
        queue.enqueue_jsonl("\n".join(json.dumps({
            "event_id": f"E{n:04d}", "payload": {"category": "book", "amount_cents": 100 + n}})
            for n in range(start, start + 1000)))
        assert len(drain(queue, Handler())) == 1000
        clock.advance(60)  # every finished message's old lease is past its deadline now
        assert queue.claim() is None  # the claim's own read passes them once
        costs.append(_read_cost(pg_dsn, EXPIRED_READ, clock.now()))
    assert costs[1][0] <= costs[0][0] + 2, costs  # 2,000 done cost no more than 1,000
    assert all(buffers <= 12 for buffers, _ in costs), costs


def test_a_lease_kept_by_the_heartbeat_still_carries_its_payload_to_the_step(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    called = count_calls(monkeypatch)
    clock = ModelClock(1000)
    queue = Queue(pg_dsn, clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:2]))
    lease = queue.claim()
    assert lease is not None
    clock.advance(20)
    kept = queue.extend(lease, 30)
    assert (kept.payload, kept.lease_until) == (lease.payload, 1050)
    clock.advance(20)  # past the first deadline, before the new one

    effect, following = queue.complete_and_claim(kept, Handler())

    assert effect.amount_cents == 10000 and called == ["E0001"]
    assert following is not None and following.event_id == "E0002"
