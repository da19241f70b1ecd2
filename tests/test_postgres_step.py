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
                        Queue, audit, drain)
from queue_core.acks import _effect_only
from queue_core.lab.story.faults import FlakyHandler
from queue_core.postgres import PostgresStore
from queue_core.values import Effect, Lease
from queue_core.worker import finish_and_claim

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
    for start in (0, 1000, 2000):
        queue.enqueue_jsonl("\n".join(json.dumps({
            "event_id": f"E{n:04d}", "payload": {"category": "book", "amount_cents": 100 + n}})
            for n in range(start, start + 1000)))
        assert len(drain(queue, Handler())) == 1000
        clock.advance(60)  # every finished message's old lease is past its deadline now
        assert queue.claim() is None  # the claim's own read passes them once
        costs.append(_read_cost(pg_dsn, EXPIRED_READ, clock.now()))
    # 2,000 and 3,000 done cost no more than 1,000 (the schema-2 read: 28, 60, then 92 pages)
    assert max(buffers for buffers, _ in costs[1:]) <= costs[0][0] + 2, costs
    assert costs[-1][0] <= 12, costs


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


@pytest.mark.parametrize("forged", ['{"amount_cents":1,"category":"toy"}', "not json"])
def test_a_changed_payload_the_handler_refuses_is_not_dead_lettered_but_refused(
        pg_dsn: str, forged: str) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS[:1]))
    lease = queue.claim()
    assert lease is not None
    before = (journal(pg_dsn), stored(pg_dsn))

    with pytest.raises(IntegrityViolation) as refused:
        finish_and_claim(queue, dataclasses.replace(lease, payload=forged), Handler())

    assert refused.value.code == "payload_differs"
    assert (journal(pg_dsn), stored(pg_dsn)) == before  # still leased, not dead
    outcome, _ = finish_and_claim(queue, lease, Handler())
    assert (outcome.kind, outcome.effect) == ("done", Effect("book", 10000))


@pytest.mark.parametrize("where, taken_as, recovered", [
    # the step's message held back, none of it arrived: E0001's lease is recovered
    # (it has no lock), and E0002, due first, is claimed
    ({"statement": "COMMIT"}, ("E0002", 1), "E0001"),
    # it arrived and committed, the answer held back: E0002, which the step claimed,
    # is recovered and claimed again
    ({"reply": "COMMIT"}, ("E0002", 2), "E0002"),
])
def test_a_worker_stalled_at_its_step_holds_no_lock(
        pg_dsn: str, where: dict[str, str], taken_as: tuple[str, int], recovered: str) -> None:
    """The step's BEGIN, call and COMMIT are one message: the server runs all of
    it or none. A worker whose network drops everything, before the message
    arrives or after, holds no row: another worker, whose clock is past the
    lease, recovers a message of the stalled worker while the stall goes on
    (its first, whose step never arrived; or the next, which its step
    claimed). Sent as separate messages, the COMMIT held back would leave the
    server waiting with both rows locked."""
    import threading

    from queue_core import ConnectionLost
    from queue_core.lab.servers import Fault, FaultProxy

    Queue(pg_dsn, clock=ModelClock(1000)).enqueue_jsonl(jsonl(EVENTS[:2]))
    ended: list[BaseException] = []
    with FaultProxy(pg_dsn, Fault("blackhole", after="queue_core_step(", seconds=20, **where),
                    lifetime=60) as proxy:
        stalled = Queue(proxy.dsn(pg_dsn), clock=ModelClock(1000), lease_seconds=30)

        def work() -> None:
            try:
                with stalled.session():
                    lease = stalled.claim()
                    assert lease is not None
                    stalled.complete_and_claim(lease, Handler())
            except BaseException as exc:  # noqa: BLE001 - read below
                ended.append(exc)

        worker = threading.Thread(target=work)
        worker.start()
        assert proxy.fired.wait(30)
        other = Queue(pg_dsn, clock=ModelClock(1031), lease_seconds=30)
        taken = other.claim()  # a lease of the stalled worker, past at 1031, recovered
        still_stalled = worker.is_alive()
        proxy.close()
        worker.join(30)
    assert still_stalled and taken is not None
    assert (taken.event_id, taken.generation) == taken_as
    assert [(step.event_id, step.to_state, step.reason) for step in audit.snapshot(
        pg_dsn).journal if step.reason == "lease_expired"] == [(recovered, "ready",
                                                               "lease_expired")]
    assert [type(exc) for exc in ended] == [ConnectionLost]
    other.complete(taken, Handler())
    drain(other, Handler())
    snap = audit.snapshot(pg_dsn)
    assert audit.check(snap) == [] and snap.money == 12000
    assert snap.states() == {"E0001": "done", "E0002": "done"}
