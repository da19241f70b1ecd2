"""A payload edited by hand is never counted, whichever call ACKs it, on either store.

The payload a message is counted with is the payload it was enqueued with:
its SHA-256 is kept from enqueue on (``payload_sha256``), and every ACK
checks, in its own transaction, that the stored payload still has it. An
edited one is refused as ``payload_differs``: no effect, and the same
transaction moves the message to ``dead`` with that reason, where a person
finds it, repairs the payload and redrives it. Each test edits a real row
with a second connection, as a person with a database shell would, then
asserts money, effects, states and the journal together.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable

import psycopg
import pytest

from queue_core import (Handler, Lease, ModelClock, PayloadDiffers, Queue, audit, drain,
                        finish)
from queue_core.values import Effect
from test_stores import jsonl

ORIGINAL = '{"amount_cents":100,"category":"book"}'
EVENTS = [("E0001", "book", 100), ("E0002", "pen", 200), ("E0003", "bag", 300)]


def sql(store: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement with a connection of its own, committed: a person's shell."""
    if store.startswith("postgresql://"):
        with psycopg.connect(store, autocommit=True) as conn:
            cursor = conn.execute(statement.replace("?", "%s"), params)
            return cursor.fetchall() if cursor.description else []
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def edit(store: str, payload: str = '{"amount_cents":999900,"category":"book"}') -> None:
    sql(store, "UPDATE messages SET payload = ? WHERE event_id = 'E0001'", (payload,))


def facts(store: str) -> dict[str, Any]:
    """E0001's state and reason, the effects, and E0001's last journal step."""
    return {
        "E0001": sql(store, "SELECT state, last_error FROM messages WHERE event_id = 'E0001'"),
        "effects": sql(store, "SELECT event_id, amount_cents FROM effects ORDER BY event_id"),
        "last step": sql(store, "SELECT from_state, to_state, reason FROM transitions "
                                "WHERE event_id = 'E0001' ORDER BY seq DESC LIMIT 1"),
    }


REFUSED = {"E0001": [("dead", "payload_differs")],
           "effects": [("E0002", 200), ("E0003", 300)],
           "last step": [("leased", "dead", "payload_differs")]}


class Ledger(Handler):
    """A handler that writes more than its effect: it overrides ``apply``, so
    every ACK of it runs in the client's transaction (three round trips on
    PostgreSQL)."""

    def apply(self, conn: Any, event_id: str, payload: Any) -> Effect:
        return super().apply(conn, event_id, payload)


# Every way a worker ACKs: the loop's step (PostgreSQL: the server's function),
# the loop capped at one message (``complete``), batches, and a handler that
# overrides ``apply``.
LOOPS: dict[str, Callable[[Queue], list[Any]]] = {
    "worker step": lambda queue: drain(queue, Handler()),
    "complete (--max 1)": lambda queue: [o for _ in range(3)
                                         for o in drain(queue, Handler(), max_messages=1)],
    "batch": lambda queue: drain(queue, Handler(), batch_size=3),
    "overriding apply": lambda queue: drain(queue, Ledger()),
}


@pytest.fixture
def queue(store: str) -> Queue:
    queue = Queue(store, clock=ModelClock(1000), lease_seconds=30)
    queue.enqueue_jsonl(jsonl(EVENTS))
    return queue


def repaired_and_redriven(queue: Queue, store: str) -> None:
    """Once the payload is the enqueued one again, a redrive finishes it, counted once."""
    edit(store, ORIGINAL)
    queue.redrive("E0001")
    assert [str(o) for o in drain(queue, Handler())] == ["E0001 done (generation 2): book +100"]
    snap = audit.snapshot(store)
    assert audit.check(snap) == [] and snap.money == 600
    assert snap.states() == {"E0001": "done", "E0002": "done", "E0003": "done"}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_payload_edited_before_the_claim_is_dead_lettered_by_every_worker_path(
        queue: Queue, store: str, loop: str) -> None:
    edit(store)

    outcomes = LOOPS[loop](queue)

    assert [(o.event_id, o.kind, o.code) for o in outcomes] == [
        ("E0001", "dead", "payload_differs"), ("E0002", "done", None), ("E0003", "done", None)]
    assert facts(store) == REFUSED
    assert [f.name for f in audit.check(audit.snapshot(store))] == ["digest_differs"]
    # never ready again on its own: a second worker finds nothing to do
    assert drain(queue, Handler()) == []
    repaired_and_redriven(queue, store)


@pytest.mark.parametrize("call", ["complete", "complete_and_claim", "complete_batch"])
def test_each_ack_call_refuses_a_payload_edited_while_leased_and_commits_the_dead_letter(
        queue: Queue, store: str, call: str) -> None:
    lease = queue.claim()  # carries the payload as enqueued
    assert lease is not None and lease.payload == ORIGINAL
    edit(store)

    if call == "complete_batch":
        [result] = queue.complete_batch([lease], Handler())
        assert isinstance(result, PayloadDiffers)
        refusal = result
    else:
        with pytest.raises(PayloadDiffers) as raised:
            getattr(queue, call)(lease, Handler())
        refusal = raised.value

    assert (refusal.code, refusal.dead_lettered) == ("payload_differs", True)
    assert str(refusal).startswith("E0001: the stored payload is not the one it was enqueued "
                                   "with") and "redrive" in str(refusal)
    assert facts(store) == {**REFUSED, "effects": []}
    assert sql(store, "SELECT state FROM messages ORDER BY event_id") == [
        ("dead",), ("ready",), ("ready",)]  # and the step claimed nothing
    drain(queue, Handler())
    assert facts(store) == REFUSED
    repaired_and_redriven(queue, store)


@pytest.mark.parametrize("payload", ['{"amount_cents":100,"category":"toy"}', "[1]"])
def test_an_edit_the_handler_would_refuse_is_payload_differs_not_invalid_payload(
        queue: Queue, store: str, payload: str) -> None:
    edit(store, payload)

    outcomes = drain(queue, Handler())

    assert [(o.event_id, o.kind, o.code) for o in outcomes][0] == (
        "E0001", "dead", "payload_differs")
    assert facts(store) == REFUSED


def test_the_edit_is_refused_even_when_the_edited_row_keeps_its_amount(
        queue: Queue, store: str) -> None:
    # The same JSON in another spelling is another text: the digest is of the
    # canonical text, and the queue never re-canonicalises what it stored.
    edit(store, '{"category":"book","amount_cents":100}')

    outcome = finish(queue, queue.claim(), Handler())

    assert (outcome.kind, outcome.code) == ("dead", "payload_differs")
    assert facts(store) == {**REFUSED, "effects": []}


def test_a_lease_carrying_a_copy_of_its_own_is_refused_and_the_message_kept(
        queue: Queue, store: str) -> None:
    # Not an edit of the message: the caller's lease holds a changed copy. The
    # stored payload is the enqueued one, so the message stays its holder's.
    lease = queue.claim()
    assert lease is not None
    forged = Lease(lease.event_id, lease.generation, lease.attempt, lease.lease_until,
                   payload='{"amount_cents":999900,"category":"book"}')

    if queue.store.fused_step:
        with pytest.raises(PayloadDiffers) as raised:
            queue.complete_and_claim(forged, Handler())
        assert raised.value.dead_lettered is False
        assert sql(store, "SELECT state FROM messages WHERE event_id = 'E0001'") == [("leased",)]
    effect, _ = queue.complete_and_claim(lease, Handler())  # the payload read from the database
    assert effect == Effect("book", 100)
