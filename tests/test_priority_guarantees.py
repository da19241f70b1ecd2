"""Priorities keep every guarantee, on both stores, on a model clock.

Under a steady stream of urgent messages at or above the workers' rate, every
bulk message is claimed within ``priority.wait_bound`` (read from the journal),
where strict priority would never claim one. Every way of claiming (``claim``,
``claim_batch``, the ACK that claims the next, PostgreSQL's step function, the
worker loop) takes due messages in the claim's order, checked by
``lab.sweeps.order.passed_over`` after each transaction; backoff holds for an
urgent message. A retried, recovered or redriven message keeps its priority;
a replay with another priority is a duplicate that keeps the stored one, after
a prune too; a bad priority is refused before anything is stored.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

import pg
from conftest import ROOT
from queue_core import BatchRejected, Handler, ModelClock, Queue, audit, drain, parse_batch
from queue_core.lab.sweeps.order import claim_key, last_seq, passed_over
from queue_core.priority import HEAD_START_SECONDS, HIGHEST, LOWEST, wait_bound

URGENT, BULK = HIGHEST, LOWEST
START = 1000


def line(event_id: str, cents: int, category: str = "book") -> str:
    return (f'{{"event_id": "{event_id}", "payload": {{"category": "{category}", '
            f'"amount_cents": {cents}}}}}\n')


# -- the starvation bound under load ---------------------------------------------------------

RATE = 2                   # messages the two workers claim (and finish) each model second
BACKLOG = 4                # urgent messages already waiting when the run starts
BULK_AT = {0: 2, 100: 1, 300: 1}  # seconds after the start -> bulk messages enqueued then
URGENT_CENTS, BULK_CENTS = 1, 100


@dataclass
class Load:
    """One run: each bulk message's ``ahead`` when it became due, the final snapshot."""

    urgent_per_second: int
    ahead: dict[str, int]
    snap: audit.Snapshot

    def journal_of(self, reason: str) -> dict[str, Any]:
        """Each event's first journal row of ``reason``."""
        rows: dict[str, Any] = {}
        for row in self.snap.journal:
            if row.reason == reason:
                rows.setdefault(row.event_id, row)
        return rows

    def waits(self) -> dict[str, int]:
        """Each bulk message's wait: its claim's time less its ``available_at``."""
        claimed = self.journal_of("claimed")
        return {e: claimed[e].at - self.snap.messages[e].available_at for e in self.ahead}


def run_load(target: str, urgent_per_second: int) -> Load:
    """Urgent messages at ``urgent_per_second`` from the start, a backlog of them
    first, bulk ones at ``BULK_AT``; each second one worker claims and ACKs, the
    other ACKs the message it holds and claims the next in one transaction (on
    PostgreSQL the step function), until every bulk message has been claimed."""
    clock = ModelClock(START)
    queue = Queue(target, clock=clock, synchronous="NORMAL")
    ids = (f"E{n:04d}" for n in count(1))
    handler = Handler()

    def enqueue(n: int, priority: int, cents: int) -> list[str]:
        batch = [next(ids) for _ in range(n)]
        queue.enqueue_jsonl("".join(line(e, cents) for e in batch), priority=priority)
        return batch

    ahead: dict[str, int] = {}
    claimed: set[str] = set()
    held = None
    with queue.session():  # one connection: each call still its own transaction
        enqueue(BACKLOG, URGENT, URGENT_CENTS)
        while not (len(ahead) == sum(BULK_AT.values()) and set(ahead) <= claimed):
            for event_id in enqueue(BULK_AT.get(clock.now() - START, 0), BULK, BULK_CENTS):
                snap = audit.snapshot(target)
                key = claim_key(snap.messages[event_id])
                ahead[event_id] = sum(m.state == "ready" and claim_key(m) < key
                                      for m in snap.messages.values())
            enqueue(urgent_per_second, URGENT, URGENT_CENTS)
            lease = queue.claim()
            queue.complete(lease, handler)
            held = (queue.claim() if held is None
                    else queue.complete_and_claim(held, handler)[1])
            claimed.update((lease.event_id, held.event_id))
            clock.advance(1)
        queue.complete(held, handler)
    return Load(urgent_per_second, ahead, audit.snapshot(target))


def strict_claims(load: Load) -> tuple[list[str], int]:
    """The same arrivals under strict priority (the highest first, then by due time
    and id), ``RATE`` claims a second: the events it would claim over the run, and
    the fewest urgent messages it ever leaves waiting after a second's claims."""
    arrivals: dict[int, list[tuple[int, int, str]]] = {}
    for event_id, row in load.journal_of("enqueued").items():
        message = load.snap.messages[event_id]
        arrivals.setdefault(row.at, []).append((-message.priority, row.at, event_id))
    waiting: list[tuple[int, int, str]] = []
    taken, fewest = [], len(load.snap.messages)
    for second in range(START, max(arrivals) + 1):
        waiting = sorted(waiting + arrivals.get(second, []))
        taken += [event_id for _, _, event_id in waiting[:RATE]]
        waiting = waiting[RATE:]
        fewest = min(fewest, sum(priority == -URGENT for priority, _, _ in waiting))
    return taken, fewest


@pytest.fixture(scope="module", params=[("sqlite", RATE), ("sqlite", RATE + 1),
                                        ("postgres", RATE), ("postgres", RATE + 1)],
                ids=["sqlite-urgent at the rate", "sqlite-urgent above the rate",
                     "postgres-urgent at the rate", "postgres-urgent above the rate"])
def load(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Load]:
    """One run per store and urgent rate, read by the tests below."""
    store, urgent_per_second = request.param
    if store == "sqlite":
        yield run_load(str(tmp_path_factory.mktemp("load") / "queue.sqlite3"),
                       urgent_per_second)
        return
    for schema in pg.fresh_schema(request.getfixturevalue("pg_server")):
        yield run_load(schema, urgent_per_second)


def test_under_a_steady_urgent_load_every_bulk_message_waits_within_the_stated_bound(
        load: Load) -> None:
    urgent_per_second = load.urgent_per_second

    window = (HIGHEST - BULK) * HEAD_START_SECONDS
    for event_id, wait in load.waits().items():
        bound = wait_bound(BULK, load.ahead[event_id], urgent_per_second, RATE)
        assert wait <= bound, (event_id, wait, bound)
        # and the bound is met to the second: what was ahead, and every urgent message
        # due within the nine minutes after it, went first, RATE a second
        assert wait == (load.ahead[event_id] + urgent_per_second * window) // RATE
        assert wait >= window  # nine minutes of urgent arrivals overtook it
    assert audit.check(load.snap) == []
    done = [m for m in load.snap.messages.values() if m.state == "done"]
    assert load.snap.money == sum(BULK_CENTS if m.event_id in load.ahead else URGENT_CENTS
                                  for m in done)
    assert len(load.snap.effect_rows) == len(done) == len(load.journal_of("claimed"))
    assert {m.priority for m in done if m.event_id in load.ahead} == {BULK}


def test_an_urgent_message_due_exactly_the_window_later_ties_and_the_bound_counts_it(
        tmp_path: Path) -> None:
    # E5000 (priority 0) is due at 1000; an urgent message (9) comes every second from
    # 1000 to 1540, each with an id before E5000's. The last one's key is 1540 - 540 =
    # 1000, E5000's own: a tie that the event ids decide, against E5000. One worker
    # finishes one message a second.
    clock = ModelClock(1000)
    queue = Queue(tmp_path / "tie.sqlite3", clock=clock, synchronous="NORMAL")
    queue.enqueue_jsonl(line("E5000", BULK_CENTS), priority=BULK)
    claimed = []
    with queue.session():
        for second in range(1000, 1600):
            clock.set(second)
            if second <= 1540:
                queue.enqueue_jsonl(line(f"E{second - 1000:04d}", URGENT_CENTS), priority=URGENT)
            lease = queue.claim()
            claimed.append(lease.event_id)
            queue.complete(lease, Handler())
            if lease.event_id == "E5000":
                break
    wait = second - 1000
    assert claimed[-2:] == ["E0540", "E5000"] and len(claimed) == 542
    assert wait == 541 == wait_bound(BULK, 0, 1, 1)  # the window's 541 whole seconds
    snap = audit.snapshot(queue.path)
    assert audit.check(snap) == [] and snap.money == 541 * URGENT_CENTS + BULK_CENTS


def test_one_of_its_own_priority_overtakes_only_in_the_second_it_became_due_and_is_counted(
        tmp_path: Path) -> None:
    # E0009 (priority 9, nothing above it) is due at 1000. E0001, of the same priority, is
    # enqueued later in that same second: equal keys, and its smaller id goes first. E0000,
    # a second later, has a later key and does not. A bound that counted only higher
    # priorities would be 0 s here; wait_bound counts the window's one second.
    clock = ModelClock(1000)
    queue = Queue(tmp_path / "same.sqlite3", clock=clock, synchronous="NORMAL")
    queue.enqueue_jsonl(line("E0009", URGENT_CENTS), priority=URGENT)
    queue.enqueue_jsonl(line("E0001", URGENT_CENTS), priority=URGENT)
    claimed = []
    with queue.session():
        for second in (1000, 1001, 1002):
            clock.set(second)
            if second == 1001:
                queue.enqueue_jsonl(line("E0000", URGENT_CENTS), priority=URGENT)
            lease = queue.claim()
            claimed.append((second, lease.event_id))
            queue.complete(lease, Handler())
    assert claimed == [(1000, "E0001"), (1001, "E0009"), (1002, "E0000")]
    waited = claimed[1][0] - 1000  # E0009's claim, less the second it became due
    assert waited == wait_bound(URGENT, 0, 1, 1) == 1
    snap = audit.snapshot(queue.path)
    assert audit.check(snap) == [] and snap.money == 3 * URGENT_CENTS


def test_the_same_stream_under_strict_priority_never_claims_a_bulk_message(load: Load) -> None:
    urgent_per_second = load.urgent_per_second

    # whenever the head start let a bulk message go, urgent ones were due and waiting:
    # strict priority would have claimed one of them instead
    enqueued, claimed = load.journal_of("enqueued"), load.journal_of("claimed")
    for event_id in load.ahead:
        at = claimed[event_id].seq
        due_urgent = [e for e, row in enqueued.items() if row.seq < at
                      and load.snap.messages[e].priority == URGENT
                      and (e not in claimed or claimed[e].seq > at)]
        assert len(due_urgent) >= urgent_per_second, event_id
    # and over the whole run it claims none: its urgent backlog never empties, since
    # urgent messages arrive at least as fast as the workers finish them
    taken, fewest = strict_claims(load)
    assert not set(taken) & set(load.ahead) and fewest >= BACKLOG
    assert len(taken) == RATE * (max(r.at for r in enqueued.values()) - START + 1)


# -- every way of claiming takes the same order ------------------------------------------------

# E0006 waits since 470 (priority 0, key 470). At 1000 come E0005 (9, key 460), which
# is claimed and fails at once, so it is in its backoff until 1001 (key 461: not due,
# and left alone at 1000); then E0001 and E0002 (0, key 1000), E0003 (3, key 820) and
# E0004 (9, key 460). The old bulk message goes after the urgent one that came just
# now, and before the one of priority 3: its head start is three minutes.
ORDER_AT_1000 = ["E0004", "E0006", "E0003", "E0001", "E0002"]


def prepared(target: str) -> Queue:
    clock = ModelClock(470)
    queue = Queue(target, clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(line("E0006", 6))
    clock.set(1000)
    queue.enqueue_jsonl(line("E0005", 5), priority=9)
    lease = queue.claim()
    assert lease is not None and lease.event_id == "E0005"
    queue.fail(lease)  # transient: due again at 1001, priority kept
    queue.enqueue_jsonl(line("E0001", 1) + line("E0002", 2))
    queue.enqueue_jsonl(line("E0003", 3), priority=3)
    queue.enqueue_jsonl(line("E0004", 4), priority=9)
    return queue


def checked(target: str, claim: Callable[[], Any]) -> Any:
    """Run one transaction that claims; refuse it if it passed over a due message."""
    before = last_seq(audit.snapshot(target))
    result = claim()
    after = audit.snapshot(target)
    assert passed_over(after, before) == [] and audit.check(after) == []
    return result


def claim_one_by_one(target: str, queue: Queue) -> list[str]:
    leases = []
    while (lease := checked(target, queue.claim)) is not None:
        leases.append(lease)
    for lease in leases:
        queue.complete(lease, Handler())
    return [lease.event_id for lease in leases]


def claim_in_batches(target: str, queue: Queue) -> list[str]:
    got: list[str] = []
    while leases := checked(target, lambda: queue.claim_batch(2)):
        got += [lease.event_id for lease in leases]  # in the claim's order
        for lease in leases:
            queue.complete(lease, Handler())
    return got


def ack_and_claim_the_next(target: str, queue: Queue) -> list[str]:
    lease, got = checked(target, queue.claim), []
    while lease is not None:
        got.append(lease.event_id)
        _, lease = checked(target, lambda: queue.complete_and_claim(lease, Handler()))
    return got


def worker_loop(target: str, queue: Queue) -> list[str]:
    return [outcome.event_id for outcome in drain(queue, Handler())]


def worker_loop_in_batches(target: str, queue: Queue) -> list[str]:
    return [outcome.event_id for outcome in drain(queue, Handler(), batch_size=3)]


WAYS = {"claim": claim_one_by_one, "claim_batch": claim_in_batches,
        "complete_and_claim": ack_and_claim_the_next, "drain": worker_loop,
        "drain in batches": worker_loop_in_batches}


@pytest.mark.parametrize("way", WAYS)
def test_every_way_of_claiming_takes_due_messages_in_the_claims_order(
        store: str, way: str) -> None:
    queue = prepared(store)

    assert WAYS[way](store, queue) == ORDER_AT_1000  # E0005 not yet: its backoff holds
    queue.clock.set(1001)
    assert WAYS[way](store, queue) == ["E0005"]

    snap = audit.snapshot(store)
    claims = [row.event_id for row in snap.journal if row.reason == "claimed"]
    assert claims == ["E0005", *ORDER_AT_1000, "E0005"]
    assert audit.check(snap) == [] and snap.money == 21
    assert {e: m.priority for e, m in snap.messages.items()} == {
        "E0001": 0, "E0002": 0, "E0003": 3, "E0004": 9, "E0005": 9, "E0006": 0}


def test_the_order_check_sees_a_due_message_passed_over(store: str) -> None:
    queue = prepared(store)
    before = last_seq(audit.snapshot(store))
    leases = queue.claim_batch(2)
    snap = audit.snapshot(store)
    # the same rows, read as if E0003 had the highest priority: it would have come
    # before both (its key 460 as E0004's, its id smaller)
    forged = replace(snap, messages={**snap.messages,
                                     "E0003": replace(snap.messages["E0003"], priority=9)})

    assert [lease.event_id for lease in leases] == ["E0004", "E0006"]
    assert passed_over(snap, before) == []
    assert passed_over(forged, before) == [
        f"claim_order_passed_over: {event_id} (key {key}) claimed at 1000 while E0003 "
        "(key 460, priority 9) was due" for event_id, key in (("E0004", 460), ("E0006", 470))]


# -- a message keeps its priority --------------------------------------------------------------

def test_a_retried_recovered_or_redriven_message_keeps_its_priority(store: str) -> None:
    clock = ModelClock(START)
    queue = Queue(store, clock=clock, lease_seconds=30, max_attempts=3)
    queue.enqueue_jsonl(line("E0001", 10))  # priority 0, due since the start (key 1000)
    clock.set(START + 200)
    queue.enqueue_jsonl(line("E0002", 20), priority=7)  # key 780

    def claim() -> Any:
        return checked(store, queue.claim)

    def held() -> dict[str, tuple[str, int]]:
        return {m.event_id: (m.state.value, m.priority) for m in queue.messages()}

    first = claim()
    queue.fail(first)  # transient: due again a second later
    clock.advance(1)  # the retry is due (key 781): still before E0001
    retried = claim()
    assert held()["E0002"] == ("leased", 7)
    clock.advance(30)  # its lease expires; the claim recovers it (due from 1231, key 811)
    recovered = claim()
    assert held()["E0002"] == ("leased", 7)
    clock.advance(30)  # expired again, the budget spent: the claim lets it die, takes E0001
    bulk = claim()
    assert [(lease.event_id, lease.attempt) for lease in (first, retried, recovered, bulk)] == [
        ("E0002", 1), ("E0002", 2), ("E0002", 3), ("E0001", 1)]
    assert held() == {"E0001": ("leased", 0), "E0002": ("dead", 7)}
    queue.complete(bulk, Handler())

    queue.redrive("E0002")
    queue.enqueue_jsonl(line("E0003", 30))  # priority 0, due now, as E0002 is again
    assert held() == {"E0001": ("done", 0), "E0002": ("ready", 7), "E0003": ("ready", 0)}
    redriven = claim()
    assert (redriven.event_id, redriven.attempt) == ("E0002", 1)  # its head start kept
    queue.complete(redriven, Handler())
    snap = audit.snapshot(store)
    assert audit.check(snap) == [] and snap.money == 30
    assert [row.reason for row in snap.journal if row.event_id == "E0002"] == [
        "enqueued", "claimed", "transient_error", "claimed", "lease_expired", "claimed",
        "attempts_exhausted", "redrive", "claimed", "completed"]


# -- a replay is a duplicate that keeps the stored priority ------------------------------------

def test_a_replay_with_another_priority_is_a_duplicate_keeping_the_stored_one_after_prune_too(
        store: str) -> None:
    clock = ModelClock(START)
    queue = Queue(store, clock=clock)
    queue.enqueue_jsonl(line("E0001", 100), priority=3)
    replayed = queue.enqueue_jsonl(line("E0001", 100), priority=8)
    assert (replayed.inserted, replayed.duplicates) == (0, 1)
    assert [(m.event_id, m.priority) for m in queue.messages()] == [("E0001", 3)]
    queue.complete(queue.claim(), Handler())
    queue.enqueue_jsonl(line("E0002", 1))  # owns the journal's last row
    clock.advance(10)
    assert queue.prune(0).messages == 1
    before = audit.snapshot(store)
    assert before.messages["E0001"].payload is None

    for priority in (0, 9):
        again = queue.enqueue_jsonl(line("E0001", 100), priority=priority)
        assert (again.inserted, again.duplicates) == (0, 1)
    with pytest.raises(BatchRejected) as refused:
        queue.enqueue_jsonl(line("E0001", 101), priority=9)

    assert refused.value.code == "batch_conflict"
    after = audit.snapshot(store)
    assert after.messages == before.messages and after.messages["E0001"].priority == 3
    assert after.journal == before.journal and after.money == 100 and audit.check(after) == []


# -- a bad priority is refused, nothing stored -------------------------------------------------

BAD = [-1, 10, True, 1.5, "3"]


def stored(target: str) -> Any:
    """Everything a queue holds: the folder's bytes, or the schema's rows."""
    if not target.startswith("postgresql://"):
        folder = Path(target).parent
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.iterdir()) if p.is_file()}
    with psycopg.connect(target, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1")]
        return {table: sorted(map(repr, conn.execute(f"SELECT * FROM {table}")))
                for table in tables}


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_priority_is_refused_by_every_enqueue_and_nothing_is_stored(
        store: str, bad: object, tmp_path: Path) -> None:
    queue = Queue(store, clock=ModelClock(START))
    queue.enqueue_jsonl(line("E0001", 1))
    text = line("E0002", 2)
    batch_file = tmp_path / "batch.jsonl"
    batch_file.write_text(text)
    before = stored(store)
    calls: dict[str, Callable[[], object]] = {
        "enqueue": lambda: queue.enqueue(parse_batch(text), priority=bad),  # type: ignore
        "enqueue_jsonl": lambda: queue.enqueue_jsonl(text, priority=bad),  # type: ignore
        "enqueue_file": lambda: queue.enqueue_file(batch_file, priority=bad)}  # type: ignore
    for name, call in calls.items():
        with pytest.raises(ValueError, match="priority must be an integer from 0 to 9"):
            call()
        assert stored(store) == before, name


@pytest.mark.parametrize("bad", ["-1", "10", "True", "1.5", '"3"', "", "０", "+3"], ids=repr)
def test_the_cli_refuses_a_bad_priority_with_invalid_priority_and_stores_nothing(
        store: str, bad: str, tmp_path: Path) -> None:
    batch_file = tmp_path / "in" / "batch.jsonl"
    batch_file.parent.mkdir()
    batch_file.write_text(line("E0001", 1))
    before = stored(store)

    done = subprocess.run([sys.executable, "-m", "queue_core", "--db", store, "enqueue",
                           "--priority", bad, str(batch_file)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)

    assert (done.returncode, done.stdout) == (2, "")
    assert f"error: invalid_priority: argument --priority: expected a priority, a whole " \
           f"number from 0 to 9, got {bad!r}" in done.stderr
    assert stored(store) == before  # no file made, no table created
