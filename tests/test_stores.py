"""One protocol, two stores: each guarantee holds on a SQLite file and on PostgreSQL.

Every test runs once per store (``store`` fixture: ``sqlite``, ``postgres``)
and reads the result back through a separate connection (``audit.snapshot``),
checking money, effects and states together, and that the audit finds nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from queue_core import Handler, LeaseLost, ModelClock, Queue, audit
from queue_core.lab.story.child import run_child

REFERENCE = [("E0001", "book", 10000), ("E0001", "book", 10000), ("E0002", "pen", 2000),
             ("E0003", "book", 5000), ("E0004", "toy", 3000)]


def jsonl(events: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(json.dumps({"event_id": event_id,
                                 "payload": {"category": category, "amount_cents": amount}})
                     for event_id, category, amount in events)


def seen(store: str) -> dict[str, Any]:
    """Money, effects and states as a second connection reads them; the audit must be clean."""
    snap = audit.snapshot(store)
    assert audit.check(snap) == []
    states = {name: n for name, n in snap.status.states.items() if n}
    return {"total": snap.status.total, "effects": snap.status.effects, "states": states}


def stored_rows(store: str) -> tuple[Any, ...]:
    """Every stored fact, for 'nothing changed' checks."""
    snap = audit.snapshot(store)
    return snap.status, dict(snap.messages), snap.effect_rows, snap.journal


@pytest.fixture
def queue(store: str, model_clock: ModelClock) -> Queue:
    return Queue(store, clock=model_clock, lease_seconds=2)


def test_the_reference_scenario_gives_the_course_figures_with_a_real_crash(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    handler = Handler()
    assert (queue.enqueue_jsonl(jsonl(REFERENCE)).inserted,
            queue.enqueue_jsonl(jsonl(REFERENCE[:1])).duplicates) == (4, 1)
    queue.complete(queue.claim(), handler)
    assert queue.fail(queue.claim()).available_at == 1001
    crashed = run_child(store, now=1000, lease_seconds=2, crash_at="complete.after_insert")
    dead = queue.fail(queue.claim(), "invalid_payload", permanent=True)

    assert (crashed.exit_code, dead.kind) == (86, "dead")
    assert seen(store) == {"total": 10000, "effects": 1,
                           "states": {"ready": 1, "leased": 1, "done": 1, "dead": 1}}

    model_clock.set(1001)
    queue.complete(queue.claim(), handler)
    model_clock.set(1002)
    retried = queue.claim()
    queue.complete(retried, handler)
    assert (retried.event_id, retried.generation) == ("E0003", 2)
    assert seen(store) == {"total": 17000, "effects": 3, "states": {"done": 3, "dead": 1}}
    assert queue.status().totals == {"book": 15000, "pen": 2000}

    assert queue.enqueue_jsonl(jsonl(REFERENCE)).duplicates == 5
    queue.redrive("E0004")
    assert queue.fail(queue.claim(), "invalid_payload", permanent=True).kind == "dead"
    queue.redrive("E0004")
    queue.complete(queue.claim(), handler.supporting("toy"))
    assert seen(store) == {"total": 20000, "effects": 4, "states": {"done": 4}}


def test_a_stale_generation_ack_is_refused_and_writes_nothing_also_after_redrive(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "toy", 3000)]))
    first = queue.claim()
    model_clock.advance(2)
    second = queue.claim()
    before = stored_rows(store)

    with pytest.raises(LeaseLost) as stale:
        queue.complete(first, Handler().supporting("toy"))

    assert stale.value.code == "stale_generation"
    assert stored_rows(store) == before
    queue.fail(second, "invalid_payload", permanent=True)
    queue.redrive("E0001")
    third = queue.claim()
    assert (third.attempt, third.generation) == (1, 3)
    for old in (first, second):
        with pytest.raises(LeaseLost) as refused:
            queue.complete(old, Handler().supporting("toy"))
        assert refused.value.code == "stale_generation"
    queue.complete(third, Handler().supporting("toy"))
    assert seen(store) == {"total": 3000, "effects": 1, "states": {"done": 1}}


def test_three_claims_spend_the_budget_expired_leases_included_then_the_message_is_dead(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    claims = []
    for _ in range(3):
        claims.append(queue.claim())
        model_clock.advance(2)  # the worker dies silently: the lease expires

    assert queue.claim() is None
    assert [lease.attempt for lease in claims] == [1, 2, 3]
    message = queue.message("E0001")
    assert (message.state, message.attempts, message.last_error) == ("dead", 3, "lease_expired")
    assert seen(store) == {"total": 0, "effects": 0, "states": {"dead": 1}}


def test_transient_failures_back_off_one_then_two_seconds_then_go_dead(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))

    first = queue.fail(queue.claim())
    assert queue.claim() is None
    model_clock.set(first.available_at)
    second = queue.fail(queue.claim())
    model_clock.set(second.available_at)
    third = queue.fail(queue.claim())

    assert (first.available_at, second.available_at) == (1001, 1003)
    assert (third.kind, third.code) == ("dead", "transient_error")
    assert seen(store) == {"total": 0, "effects": 0, "states": {"dead": 1}}


def test_an_invalid_payload_goes_dead_at_once_and_the_others_go_on(
        queue: Queue, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", ["book"], 100), ("E0002", "pen", True),
                               ("E0003", "bag", 700)]))
    from queue_core import drain

    outcomes = drain(queue, Handler())

    assert [(o.event_id, o.kind, o.code) for o in outcomes] == [
        ("E0001", "dead", "invalid_payload"), ("E0002", "dead", "invalid_payload"),
        ("E0003", "done", None)]
    assert queue.message("E0001").attempts == 1
    assert json.loads(queue.message("E0001").payload) == {"amount_cents": 100,
                                                          "category": ["book"]}
    assert seen(store) == {"total": 700, "effects": 1, "states": {"done": 1, "dead": 2}}


def test_a_batch_claim_and_complete_fence_each_lease_on_its_own(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    queue.enqueue_jsonl(jsonl([(f"E000{i}", "book", 100 * i) for i in range(1, 6)]))
    early = queue.claim_batch(2)
    model_clock.advance(1)
    late = queue.claim_batch(3)
    model_clock.advance(1)  # the early leases expire; E0001 goes to another worker
    taken = queue.claim()

    results = queue.complete_batch([*early, *late], Handler())

    assert [lease.event_id for lease in [*early, *late]] == [f"E000{i}" for i in range(1, 6)]
    assert (taken.event_id, taken.generation) == ("E0001", 2)
    codes = [getattr(result, "code", "done") for result in results]
    assert codes == ["stale_generation", "not_leased", "done", "done", "done"]
    assert seen(store) == {"total": 1200, "effects": 3,
                           "states": {"ready": 1, "leased": 1, "done": 3}}


def test_extend_moves_the_deadline_of_a_held_lease_and_journals_nothing(
        queue: Queue, model_clock: ModelClock, store: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    lease = queue.claim()
    model_clock.advance(1)

    longer = queue.extend(lease, 10)
    model_clock.advance(5)  # past the first deadline, inside the new one

    assert (longer.generation, longer.attempt, longer.lease_until) == (1, 1, 1011)
    assert queue.claim() is None
    assert queue.message("E0001").lease_until == 1011
    assert [t.reason for t in queue.transitions()] == ["enqueued", "claimed"]
    queue.complete(longer, Handler())
    assert seen(store) == {"total": 100, "effects": 1, "states": {"done": 1}}


@pytest.mark.parametrize("case", ["stale_generation", "lease_expired", "not_leased"])
def test_extend_of_a_lost_lease_is_refused_with_the_acks_code_and_changes_nothing(
        queue: Queue, model_clock: ModelClock, store: str, case: str) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    lease = queue.claim()
    model_clock.advance(2)
    if case == "stale_generation":
        queue.claim()
    elif case == "not_leased":
        model_clock.set(1001)
        queue.fail(lease)
        model_clock.advance(2)
    before = stored_rows(store)

    with pytest.raises(LeaseLost) as lost:
        queue.extend(lease, 30)

    assert lost.value.code == case
    assert stored_rows(store) == before


@pytest.mark.parametrize("seconds", [0, -5, True, 1.5])
def test_extend_by_a_non_positive_or_non_integer_time_is_a_value_error_before_any_read(
        queue: Queue, store: str, seconds: Any) -> None:
    queue.enqueue_jsonl(jsonl([("E0001", "book", 100)]))
    lease = queue.claim()
    before = stored_rows(store)

    with pytest.raises(ValueError):
        queue.extend(lease, seconds)

    assert stored_rows(store) == before


def test_a_sqlite_queue_never_imports_the_postgresql_driver(tmp_path: Any) -> None:
    import subprocess
    import sys

    from conftest import ROOT
    code = ("import sys, queue_core.cli; from queue_core import Queue, ModelClock; "
            f"q = Queue({str(tmp_path / 'q.sqlite3')!r}, clock=ModelClock()); q.status(); "
            "print('psycopg' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60)

    assert (result.returncode, result.stdout) == (0, "False\n"), result.stderr
