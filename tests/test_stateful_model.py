"""A Hypothesis state machine drives the real queue (a real SQLite file, a
model clock) and a plain in-memory model of the protocol side by side:
claim (in the order of the messages' priorities), complete, fail (transient
or permanent), abandon a lease (the worker died), move the clock, redrive,
replay an event with any priority, upgrade the handler, and ACK with leases
that are no longer current. After every step the database must agree with the
model on every field, and the invariants must hold.

``QUEUE_SOAK=1`` runs 20 times more programs.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from queue_core import (Handler, InvalidPayload, LeaseLost, ModelClock, NotRedrivable, Queue,
                        backoff_seconds)
from queue_core.priority import HEAD_START_SECONDS
from queue_core.values import Lease

SOAK = os.environ.get("QUEUE_SOAK") == "1"
START, LEASE, BUDGET = 1000, 2, 3
EVENTS = {"E0001": ("book", 100), "E0002": ("pen", 250), "E0003": ("toy", 300),
          "E0004": ("bag", 400)}
# Each event's priority, a head start of a minute per step: E0003 (9) goes first
# while due, E0002 (1) overtakes what became due less than a minute before it.
PRIORITIES = {"E0001": 0, "E0002": 1, "E0003": 9, "E0004": 0}


@dataclass(frozen=True)
class Row:
    """The model's copy of one ``messages`` row."""

    state: str = "ready"
    attempts: int = 0
    generation: int = 0
    available_at: int = START
    lease_until: int | None = None
    last_error: str | None = None
    priority: int = 0


class QueueModel(RuleBasedStateMachine):
    """Real queue and model, step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="stateful-")
        self.clock = ModelClock(START)
        self.queue = Queue(os.path.join(self.folder, "q.sqlite3"), clock=self.clock,
                           lease_seconds=LEASE, max_attempts=BUDGET, synchronous="NORMAL")
        self.session = self.queue.session()  # one connection for the whole program
        self.session.__enter__()
        for event_id, (category, amount) in EVENTS.items():
            self.queue.enqueue_jsonl(_line(event_id), priority=PRIORITIES[event_id])
        self.rows = {event_id: Row(priority=PRIORITIES[event_id]) for event_id in EVENTS}
        self.effects: dict[str, int] = {}
        self.categories = {"book", "pen", "bag"}
        self.held: list[Lease] = []     # leases a live worker still holds
        self.issued: list[Lease] = []   # every lease ever granted, for stale ACKs
        self.max_generation = {event_id: 0 for event_id in EVENTS}

    def teardown(self) -> None:
        self.session.__exit__(None, None, None)
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- the model of the protocol -------------------------------------------

    def _recover_expired(self, now: int) -> None:
        for event_id, row in self.rows.items():
            if row.state == "leased" and row.lease_until is not None and row.lease_until <= now:
                if row.attempts >= BUDGET:
                    self.rows[event_id] = replace(row, state="dead", lease_until=None,
                                                  last_error="lease_expired")
                else:
                    self.rows[event_id] = replace(row, state="ready", available_at=row.lease_until,
                                                  lease_until=None, last_error="lease_expired")

    def _fence(self, lease: Lease) -> str | None:
        """The code ``LeaseLost`` must carry, or ``None`` if the lease holds."""
        row = self.rows[lease.event_id]
        if row.generation != lease.generation:
            return "stale_generation"
        if row.state != "leased":
            return "not_leased"
        if row.lease_until is None or row.lease_until <= self.clock.now():
            return "lease_expired"
        return None

    def _pick(self, data: st.DataObject, leases: list[Lease]) -> Lease:
        return leases[data.draw(st.integers(0, len(leases) - 1))]

    # -- rules -----------------------------------------------------------------

    @rule()
    def claim(self) -> None:
        now = self.clock.now()
        self._recover_expired(now)
        due = sorted((row.available_at - HEAD_START_SECONDS * row.priority, event_id)
                     for event_id, row in self.rows.items()
                     if row.state == "ready" and row.available_at <= now)
        lease = self.queue.claim()
        if not due:
            assert lease is None
            return
        event_id = due[0][1]
        row = self.rows[event_id]
        row = replace(row, state="leased", attempts=row.attempts + 1,
                      generation=row.generation + 1, lease_until=now + LEASE)
        self.rows[event_id] = row
        assert lease == Lease(event_id, row.generation, row.attempts, now + LEASE)
        self.held.append(lease)
        self.issued.append(lease)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        lease = self._pick(data, self.held)
        self.held.remove(lease)
        self._ack(lease)

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def ack_with_any_lease_ever_issued(self, data: st.DataObject) -> None:
        """A slow or confused worker hands back a lease that may be stale."""
        self._ack(self._pick(data, self.issued))

    def _ack(self, lease: Lease) -> None:
        expected = self._fence(lease)
        category, amount = EVENTS[lease.event_id]
        if expected is None and category not in self.categories:
            expected = "invalid_payload"
        try:
            effect = self.queue.complete(lease, Handler(self.categories))
        except (LeaseLost, InvalidPayload) as exc:
            assert exc.code == expected
            return
        assert expected is None, f"ACK accepted, model expected {expected}"
        assert (effect.category, effect.amount_cents) == (category, amount)
        self.rows[lease.event_id] = replace(self.rows[lease.event_id], state="done",
                                            lease_until=None)
        self.effects[lease.event_id] = amount

    @precondition(lambda self: self.held)
    @rule(data=st.data(), permanent=st.booleans())
    def fail(self, data: st.DataObject, permanent: bool) -> None:
        lease = self._pick(data, self.held)
        self.held.remove(lease)
        code = "invalid_payload" if permanent else "transient_error"
        expected = self._fence(lease)
        try:
            outcome = self.queue.fail(lease, code, permanent=permanent)
        except LeaseLost as exc:
            assert exc.code == expected
            return
        assert expected is None
        now, row = self.clock.now(), self.rows[lease.event_id]
        if permanent or lease.attempt >= BUDGET:
            self.rows[lease.event_id] = replace(row, state="dead", lease_until=None,
                                                available_at=now, last_error=code)
            assert outcome.kind == "dead"
        else:
            retry_at = now + backoff_seconds(lease.attempt)
            self.rows[lease.event_id] = replace(row, state="ready", lease_until=None,
                                                available_at=retry_at, last_error=code)
            assert (outcome.kind, outcome.available_at) == ("retry", retry_at)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def worker_dies_holding_its_lease(self, data: st.DataObject) -> None:
        # Real process deaths are the crash sweep's job; here the lease is just abandoned.
        self.held.remove(self._pick(data, self.held))

    @rule(seconds=st.integers(1, 3))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(event_id=st.sampled_from(sorted(EVENTS)))
    def redrive(self, event_id: str) -> None:
        row = self.rows[event_id]
        try:
            self.queue.redrive(event_id)
        except NotRedrivable:
            assert row.state != "dead"
            return
        assert row.state == "dead"
        self.rows[event_id] = replace(row, state="ready", attempts=0,
                                      available_at=self.clock.now())

    @rule(event_id=st.sampled_from(sorted(EVENTS)), priority=st.integers(0, 9))
    def replay_with_any_priority(self, event_id: str, priority: int) -> None:
        """The source repeats an event, with whatever priority: a duplicate that
        keeps the stored priority, its place in the order, and changes nothing."""
        result = self.queue.enqueue_jsonl(_line(event_id), priority=priority)
        assert (result.inserted, result.duplicates) == (0, 1)

    @precondition(lambda self: "toy" not in self.categories)
    @rule()
    def upgrade_handler_to_know_toy(self) -> None:
        self.categories.add("toy")

    # -- invariants after every step -------------------------------------------

    @invariant()
    def database_agrees_with_the_model_and_the_invariants_hold(self) -> None:
        conn = sqlite3.connect(self.queue.path)  # a second, independent connection
        try:
            stored = {e: Row(*rest) for e, *rest in conn.execute(
                "SELECT event_id, state, attempts, generation, available_at, lease_until, "
                "last_error, priority FROM messages")}
            effects = conn.execute("SELECT event_id, amount_cents FROM effects").fetchall()
        finally:
            conn.close()
        assert stored == self.rows
        assert dict(effects) == self.effects
        done = {e for e, row in stored.items() if row.state == "done"}
        # money is the sum of done effects; each event has at most one effect
        assert len(effects) == len(dict(effects)) == len(done) and set(self.effects) == done
        assert sum(a for _, a in effects) == sum(EVENTS[e][1] for e in done)
        for event_id, row in stored.items():
            assert (row.state == "leased") == (row.lease_until is not None)
            assert 0 <= row.attempts <= BUDGET
            assert row.generation >= self.max_generation[event_id]  # never decreases
            self.max_generation[event_id] = row.generation
            assert row.state != "dead" or row.last_error is not None


def _line(event_id: str) -> str:
    category, amount = EVENTS[event_id]
    return (f'{{"event_id": "{event_id}", "payload": {{"category": "{category}", '
            f'"amount_cents": {amount}}}}}\n')


QueueModel.TestCase.settings = settings(
    max_examples=600 if SOAK else 25, stateful_step_count=30, deadline=None, database=None,
    derandomize=not SOAK, suppress_health_check=[HealthCheck.too_slow])
test_queue_agrees_with_its_model_after_every_step = QueueModel.TestCase

