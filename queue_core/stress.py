"""Many real worker processes, random transient faults, random crashes.

``run_stress`` enqueues a batch, then plays rounds on the model clock: each
round starts ``workers`` child processes at the same model second, most of
them armed to die by ``os._exit`` at a random crash point (at their 1st to
25th arrival there), released together through a starting gate, all draining
the queue at once under ``BEGIN IMMEDIATE``. Crashed workers are replaced in the
next round; the clock moves to the next due time so that abandoned leases
expire. At the end every event must be ``done`` or ``dead`` (with a reason),
each ``done`` event must have exactly one effect, no event may be reported
done by two workers, and the money must equal the sum of the done payloads.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .crashpoints import POINTS
from .errors import TransientError
from .handler import DEFAULT_CATEGORIES, Handler
from .values import Effect

START = 1000
LEASE_SECONDS = 2
MAX_ROUNDS = 200
MAX_CRASH_AFTER = 25  # an armed worker dies at its 1st..25th arrival at the point
REAL_POINTS = tuple(p for p in POINTS if p != "complete.between_transactions")


class FlakyHandler(Handler):
    """The business handler with transient faults injected on purpose.

    Attempt ``n`` of an event fails with ``TransientError`` when the event is
    in ``first_attempt`` and ``n == 1``, or with probability ``rate``. The
    draw is a pure function of ``(seed, event_id, attempt)``, so every
    process makes the same decision and a run can be replayed.
    """

    def __init__(self, categories: Iterable[str] = DEFAULT_CATEGORIES, *, rate: float = 0.0,
                 seed: int = 0, first_attempt: Iterable[str] = ()) -> None:
        super().__init__(categories)
        self.rate, self.seed = rate, seed
        self.first_attempt = frozenset(first_attempt)

    @classmethod
    def from_spec(cls, categories: Iterable[str], spec: dict[str, Any]) -> "FlakyHandler":
        """Build from a child spec's ``faults`` entry (JSON: rate, seed, first_attempt)."""
        return cls(categories, rate=float(spec.get("rate", 0.0)), seed=int(spec.get("seed", 0)),
                   first_attempt=spec.get("first_attempt", ()))

    def supporting(self, *categories: str) -> "FlakyHandler":
        return type(self)(self.categories | frozenset(categories), rate=self.rate,
                          seed=self.seed, first_attempt=self.first_attempt)

    def fails(self, event_id: str, attempt: int) -> bool:
        """Whether attempt ``attempt`` of ``event_id`` gets a transient fault."""
        if attempt == 1 and event_id in self.first_attempt:
            return True
        return random.Random(f"{self.seed}:{event_id}:{attempt}").random() < self.rate

    def inject_fault(self, conn: sqlite3.Connection, event_id: str) -> None:
        """Raise ``TransientError`` if this attempt is scheduled to fail."""
        attempt = conn.execute("SELECT attempts FROM messages WHERE event_id = ?",
                               (event_id,)).fetchone()[0]
        if self.fails(event_id, attempt):
            raise TransientError(f"{event_id}: injected transient fault on attempt {attempt}")

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        self.inject_fault(conn, event_id)
        return super().apply(conn, event_id, payload)


@dataclass(frozen=True)
class StressReport:
    """What a stress run did and what it found; ``ok`` if nothing was wrong."""

    workers: int
    events: int
    rounds: int
    processes: int
    crashes: int
    done: int
    dead: int
    effects: int
    duplicates: int
    losses: int
    total: int
    expected_total: int
    integrity: str
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems


def stress_batch(events: int, seed: int) -> tuple[str, dict[str, int]]:
    """A JSONL batch of ``events`` orders (about 2% with an unknown category)
    and the amount of each event that the handler accepts."""
    rng = random.Random(seed)
    lines, amounts = [], {}
    for number in range(1, events + 1):
        event_id = f"E{number:04d}"
        category = "toy" if rng.random() < 0.02 else rng.choice(sorted(DEFAULT_CATEGORIES))
        amount = rng.randint(1, 99_999)
        lines.append(json.dumps({"event_id": event_id,
                                 "payload": {"category": category, "amount_cents": amount}}))
        if category in DEFAULT_CATEGORIES:
            amounts[event_id] = amount
    return "\n".join(lines) + "\n", amounts


def run_stress(workdir: str | os.PathLike[str], *, events: int = 1000, workers: int = 4,
               crash_rate: float = 0.9, fault_rate: float = 0.2, seed: int = 0) -> StressReport:
    """Run the stress scenario in ``workdir``; see the module docstring."""
    from .child import collect, open_gate, reap, run_child  # child imports this module lazily too
    from .clock import ModelClock
    from .queue import Queue

    if workers < 1 or not 1 <= events <= 9999:
        raise ValueError("need at least one worker and 1..9999 events")
    db = os.path.join(os.fspath(workdir), "stress.sqlite3")
    clock = ModelClock(START)
    queue = Queue(db, clock=clock, lease_seconds=LEASE_SECONDS)
    text, amounts = stress_batch(events, seed)
    for start in range(0, events, 1000):  # a batch holds at most 1000 lines
        queue.enqueue_jsonl("\n".join(text.splitlines()[start:start + 1000]))
    rng = random.Random(seed)
    reported: Counter[str] = Counter()
    rounds = processes = crashes = 0
    while _pending(db) and rounds < MAX_ROUNDS:
        rounds += 1
        gate = Path(workdir) / f"gate-{rounds}"  # all workers of a round start together
        gate.mkdir()
        procs = [run_child(db, now=clock.now(), lease_seconds=LEASE_SECONDS, mode="drain",
                           crash_at=rng.choice(REAL_POINTS) if rng.random() < crash_rate else None,
                           crash_after=rng.randint(1, MAX_CRASH_AFTER),
                           faults={"rate": fault_rate, "seed": seed}, gate=gate, wait=False)
                 for _ in range(workers)]
        try:
            open_gate(gate, workers)
            for proc in procs:
                result = collect(proc)  # type: ignore[arg-type]
                crashes += result.crashed
                reported.update(o.event_id for o in result.outcomes if o.kind == "done")
        finally:
            reap(procs)  # type: ignore[arg-type]
        processes += len(procs)
        clock.set(max(clock.now() + 1, _next_due(db) or clock.now() + 1))
    return audit(db, events, amounts, reported, workers=workers, rounds=rounds,
                 processes=processes, crashes=crashes)


def _pending(db: str) -> bool:
    return bool(_rows(db, "SELECT 1 FROM messages WHERE state IN ('ready', 'leased') LIMIT 1"))


def _next_due(db: str) -> int | None:
    due = _rows(db, "SELECT min(CASE state WHEN 'leased' THEN lease_until ELSE available_at END) "
                    "FROM messages WHERE state IN ('ready', 'leased')")[0][0]
    return None if due is None else int(due)


def _rows(db: str, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def audit(db: str | os.PathLike[str], events: int, amounts: dict[str, int],
          reported: Counter[str] | None = None, *, workers: int = 0, rounds: int = 0,
          processes: int = 0, crashes: int = 0) -> StressReport:
    """Check a finished stress database; ``reported`` counts the ``done``
    outcomes the workers announced per event (two for one event is a duplicate)."""
    db, reported = os.fspath(db), reported or Counter()
    states = dict(_rows(db, "SELECT event_id, state FROM messages"))
    reasonless = _rows(db, "SELECT count(*) FROM messages WHERE state = 'dead' AND last_error IS NULL")[0][0]
    effects = dict(_rows(db, "SELECT event_id, amount_cents FROM effects"))
    done = {e for e, s in states.items() if s == "done"}
    # effects.event_id is the primary key, so a second effect cannot even be
    # stored: a duplicate shows as a second "done" announced by the workers.
    duplicates = sum(n - 1 for n in reported.values() if n > 1)
    losses = (sum(1 for s in states.values() if s not in ("done", "dead")) + reasonless
              + len(done ^ set(effects)) + events - len(states))
    total, expected = sum(effects.values()), sum(amounts[e] for e in done if e in amounts)
    integrity = _rows(db, "PRAGMA integrity_check")[0][0]
    problems = tuple(text for bad, text in [
        (duplicates, f"{duplicates} duplicate completions"),
        (losses, f"{losses} lost or unfinished messages"),
        (total != expected, f"money {total} != {expected} expected from the done events"),
        (any(effects[e] != amounts.get(e) for e in effects), "an effect differs from its payload"),
        (integrity != "ok", f"integrity_check: {integrity}"),
        (rounds >= MAX_ROUNDS and _pending(db), "still pending after the last round"),
    ] if bad)
    return StressReport(workers, events, rounds, processes, crashes, len(done),
                        sum(1 for s in states.values() if s == "dead"), len(effects),
                        duplicates, losses, total, expected, integrity, problems)
