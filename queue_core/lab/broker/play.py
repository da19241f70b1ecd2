"""The course's broker scenarios: real consumer processes on a real Redis server,
each run judged by the audit of the queue file the consumers wrote.

Three orders are published (``ORDERS``: E0001 book 10000, E0002 pen 2000,
E0003 book 5000; 17000 in all). Consumers A and B take them; one failure
happens to E0001, the same for ``naive`` and for ``inbox`` consumers:

``stall``          A receives E0001 and stalls past the idle time; B takes it
                   over (``XAUTOCLAIM``, delivery 2) and stalls too; A wakes,
                   runs its step and acknowledges (the broker accepts: the
                   entry was B's, and ``XACK`` names no consumer); then B runs
                   its step and acknowledges (``XACK -> 0``).
``after_commit``   A's step commits, then A is killed before its ``XACK``; B
                   takes E0001 over once it has been idle long enough.
``before_commit``  A is killed before its step commits; B takes E0001 over.
``ack_first``      A acknowledges first (a teaching contrast), then is killed
                   before its step: nothing is pending, so nobody ever gets
                   E0001 again.

Every wait is for a fact the broker or the log reports (A has received, an
entry has been idle ``min_idle_ms``), never a sleep, so each run takes the
same path on any machine. ``play`` runs one (``play_many`` several side by
side); ``play_poison`` feeds one inbox consumer entries no retry can fix. Each
run is a ``BrokerRun``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ... import audit
from ...audit import Finding, Snapshot
from .streams import MIN_IDLE_MS, Broker, DeadLetter, LogStep, Pending, open_broker
from .consumer import ConsumerResult, collect_consumer, prepare_db, run_consumer
from ..story.child import reap

ORDERS = "\n".join(json.dumps({"event_id": e, "payload": {"category": c, "amount_cents": a}})
                   for e, c, a in (("E0001", "book", 10000), ("E0002", "pen", 2000),
                                   ("E0003", "book", 5000))) + "\n"
EXPECTED = 17000
FAILURES = {
    "stall": "A stalls with E0001 past the idle time; B takes it over",
    "after_commit": "A is killed between its commit and its XACK",
    "before_commit": "A is killed before its commit",
    "ack_first": "A acknowledges first, then is killed before its commit",
}
# Entries no retry can fix, among good ones and a producer's repeat (play_poison).
POISON: tuple[tuple[str, dict[str, str]], ...] = tuple((what, {"event": text}) for what, text in (
    ("a new order", '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}'),
    ("a new order", '{"event_id": "E0002", "payload": {"category": "pen", "amount_cents": 2000}}'),
    ("the producer sends E0001 again", '{"event_id": "E0001", "payload": {"amount_cents": 10000, '
                                       '"category": "book"}}'),
    ("E0002 with another amount", '{"event_id": "E0002", "payload": {"category": "pen", '
                                  '"amount_cents": 2500}}'),
    ("a malformed event id", '{"event_id": "E12", "payload": {"category": "pen", '
                             '"amount_cents": 100}}'),
    ("a payload that is no object", '{"event_id": "E0005", "payload": "pen 100"}'),
    ("a key twice", '{"event_id": "E0006", "payload": {"category": "pen", "category": "bag", '
                    '"amount_cents": 100}}'),
    ("no JSON at all", "E0007 pen 100"),
    ("a category the handler lacks", '{"event_id": "E0004", "payload": {"category": "toy", '
                                     '"amount_cents": 3000}}'),
)) + (("no event field", {"event_id": "E0008"}),)
POISON_EXPECTED = 12000


@dataclass(frozen=True)
class BrokerRun:
    """What one scenario left: the consumers' log, their exit codes, the broker's
    pending list at the moments that matter and at the end, the dead letters,
    and the audit's snapshot and findings of the queue file."""

    failure: str
    keep: str
    steps: tuple[LogStep, ...]
    exits: Mapping[str, int]
    moments: tuple[tuple[str, tuple[Pending, ...]], ...]
    pending: tuple[Pending, ...]
    dead_letters: tuple[DeadLetter, ...]
    snapshot: Snapshot
    findings: tuple[Finding, ...]
    expected: int

    @property
    def money(self) -> int:
        """Every effect row's amount, wherever it was written (a ledger included)."""
        return self.snapshot.money

    def deliveries(self, event_id: str) -> int:
        """How often the broker delivered ``event_id``: its highest delivery counter."""
        return max((s.delivery for s in self.steps
                    if s.event_id == event_id and s.step == "received"), default=0)

    def effects_of(self, event_id: str) -> int:
        """How many effect rows ``event_id`` has."""
        return sum(row.event_id == event_id for row in self.snapshot.effect_rows)

    def verdict(self) -> str:
        """One line: money against the expected, effects per event, pending, the audit."""
        events = sorted({row.event_id for row in self.snapshot.effect_rows}
                        | {s.event_id for s in self.steps if s.event_id})
        effects = ", ".join(f"{e} {self.effects_of(e)}" for e in events
                            if e in self.snapshot.messages or self.effects_of(e))
        names = Counter(f.name for f in self.findings)
        judged = ", ".join(f"{n} x{c}" for n, c in sorted(names.items())) or "clean"
        return (f"money {self.money} (expected {self.expected}); effects per event: {effects}; "
                f"pending at the end: {len(self.pending)}; audit: {judged}")

    def __str__(self) -> str:
        head = f"{self.keep} consumers: {FAILURES.get(self.failure, self.failure)}"
        return "\n".join([head, *(f"  {s}" for s in self.steps), self.verdict()])


def play(url: str, folder: str | os.PathLike[str], failure: str, keep: str, *,
         min_idle_ms: int = MIN_IDLE_MS) -> BrokerRun:
    """Run scenario ``failure`` (a key of ``FAILURES``) with ``keep`` consumers
    (``naive`` or ``inbox``) on a fresh stream of the server at ``url`` and a
    new queue file in ``folder``; remove the stream afterwards."""
    if failure not in FAILURES:
        raise ValueError(f"failure must be one of {tuple(FAILURES)}, got {failure!r}")
    db = Path(folder) / f"{failure}-{keep}.sqlite3"
    prepare_db(db, keep)
    broker = open_broker(url, min_idle_ms=min_idle_ms)
    try:
        broker.publish(ORDERS)
        story = _takeover if failure == "stall" else _crash
        moments, exits = story(broker, db, keep, failure)
        return _report(broker, db, failure, keep, moments, exits, EXPECTED)
    finally:
        broker.drop()


def play_many(url: str, folder: str | os.PathLike[str],
              cases: Sequence[tuple[str, str]]) -> dict[tuple[str, str], BrokerRun]:
    """``play`` each ``(failure, keep)`` of ``cases`` side by side, in threads of this
    process; ``{(failure, keep): run}`` in the order given.

    The runs share nothing but the server: each has its own stream, consumer
    processes and queue file, and each waits only for facts about its own
    stream, so each takes the path it takes alone.
    """
    with ThreadPoolExecutor(max_workers=max(1, len(cases))) as pool:
        futures = [pool.submit(play, url, folder, failure, keep) for failure, keep in cases]
        return {case: future.result() for case, future in zip(cases, futures)}


def play_poison(url: str, folder: str | os.PathLike[str]) -> BrokerRun:
    """One inbox consumer meets ``POISON``: good orders, a producer's repeat, a
    conflicting payload and entries that fail validation. Nothing stays
    pending; each bad entry is in the dead-letter stream with its code."""
    db = Path(folder) / "poison-inbox.sqlite3"
    prepare_db(db, "inbox")
    broker = open_broker(url)
    try:
        for _, fields in POISON:
            broker.publish_entry(fields)
        exits = {"A": _exit_code(run_consumer(broker, db, "A", keep="inbox"))}
        return _report(broker, db, "poison", "inbox", (), exits, POISON_EXPECTED)
    finally:
        broker.drop()


# -- the two shapes of scenario ---------------------------------------------------------------

Moments = tuple[tuple[str, tuple[Pending, ...]], ...]
Story = tuple[Moments, dict[str, int]]


def _takeover(broker: Broker, db: Path, keep: str, _: str) -> Story:
    procs: list[subprocess.Popen[str]] = []
    try:
        a = _start(procs, broker, db, "A", keep, stall=True, limit=1)
        b = _start(procs, broker, db, "B", keep, stall=True, hold=True)
        broker.wait_logged("A", "received", alive=_alive(a))
        broker.wait_idle()
        broker.release("B")  # B starts taking: E0001 has been idle long enough
        broker.wait_logged("B", "received", alive=_alive(b))
        held = tuple(broker.pending())
        broker.release("A")
        exits = {"A": collect_consumer(a, "A").exit_code}
        after_a = tuple(broker.pending())
        broker.release("B")
        exits["B"] = collect_consumer(b, "B").exit_code
    finally:
        reap(procs)
    return ((("B holds E0001, A still stalled", held),
             ("A has acknowledged, B still working on E0001", after_a)), exits)


def _crash(broker: Broker, db: Path, keep: str, failure: str) -> Story:
    point = "after_ack" if failure == "ack_first" else failure
    procs: list[subprocess.Popen[str]] = []
    try:
        a = _start(procs, broker, db, "A", keep, limit=1, crash_at=point,
                   ack_first=failure == "ack_first")
        b = _start(procs, broker, db, "B", keep, hold=True)
        exits = {"A": collect_consumer(a, "A").exit_code}
        broker.note("A", "exited", f"killed (exit code {exits['A']})")
        left = tuple(broker.pending())
        if left:  # the broker still holds E0001 for A: B may take it over once it is idle
            broker.wait_idle()
        broker.release("B")
        exits["B"] = collect_consumer(b, "B").exit_code
    finally:
        reap(procs)
    return (("A has died", left),), exits


def _exit_code(result: object) -> int:
    assert isinstance(result, ConsumerResult)
    return result.exit_code


def _start(procs: list[subprocess.Popen[str]], broker: Broker, db: Path, name: str, keep: str,
           **options: object) -> subprocess.Popen[str]:
    proc = run_consumer(broker, db, name, keep=keep, wait=False, **options)  # type: ignore[arg-type]
    assert isinstance(proc, subprocess.Popen)
    procs.append(proc)
    return proc


def _alive(proc: subprocess.Popen[str]) -> Callable[[], bool]:
    return lambda: proc.poll() is None


def _report(broker: Broker, db: Path, failure: str, keep: str, moments: Moments,
            exits: Mapping[str, int], expected: int) -> BrokerRun:
    steps = tuple(broker.log())
    snap = audit.snapshot(db)
    return BrokerRun(failure, keep, steps, dict(sorted(exits.items())), moments,
                     tuple(broker.pending()), tuple(broker.dead_letters()), snap,
                     tuple(audit.check(snap)), expected)
