"""Many real worker processes, random transient faults, random crashes.

``run_stress`` enqueues a batch, then plays rounds on the model clock: each
round starts ``workers`` child processes at the same model second, most of
them armed to die by ``os._exit`` at a random crash point (at their 1st to
``MAX_CRASH_AFTER``-th arrival there), released together through a starting gate, all draining
the queue at once (under SQLite's ``BEGIN IMMEDIATE``, one writer at a
time; on PostgreSQL, many transactions at once). Crashed workers are replaced in the
next round; the clock moves to the next due time so that abandoned leases
expire. At the end the shared audit (``queue_core.audit``) must find
nothing, every event must be ``done`` or ``dead``, no event may be reported
done by two workers, and the money must equal the sum of the done payloads.

``killed_first`` rounds open the run with crashes it is sure to cause: in
each, every worker is armed at ``claim.after_commit`` on its first claim, and
the queue holds a due message for each of them, so each dies there whatever
the scheduler does; ``StressReport.caused`` counts those kills, a figure a
test can ask for exactly (the random crashes after them depend on which
worker reaches its point before the queue runs dry).

``run_stress(workdir, db="postgresql://...")`` runs the same scenario on a
PostgreSQL schema (the connection string's current schema, which must be
empty or hold nothing but a queue); ``workdir`` still holds the gates.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from ... import audit as ledger_audit
from ...clock import ModelClock
from ...crashpoints import PROTOCOL_POINTS
from ...handler import DEFAULT_CATEGORIES
from ...queue import Queue
from ..story.child import collect, mode_for, open_gate, reap, run_child
from ..story.scenario import LEASE_SECONDS, START

MAX_ROUNDS = 200
MAX_CRASH_AFTER = 12  # an armed worker dies at its 1st..12th arrival at the point
SURE_POINT = "claim.after_commit"  # where the killed_first rounds' workers die, at their first claim


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
    caused: int = 0  # crashes of the ``killed_first`` rounds, each at a known point

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
               crash_rate: float = 0.9, fault_rate: float = 0.2, seed: int = 0,
               db: str | None = None, killed_first: int = 0) -> StressReport:
    """Run the stress scenario in ``workdir``; see the module docstring.

    ``db`` is where the queue lives: by default ``stress.sqlite3`` in
    ``workdir``; a ``postgresql://`` connection string puts it in that
    connection's current schema. Raises ``ValueError`` for no worker or an
    event count outside 1..9999, or fewer events than the ``killed_first``
    rounds' workers claim, before anything is written.
    """
    if workers < 1 or not 1 <= events <= 9999:
        raise ValueError("need at least one worker and 1..9999 events")
    if killed_first < 0 or killed_first * workers >= events:
        raise ValueError("killed_first rounds need a due message for each of their workers")
    db = db or os.path.join(os.fspath(workdir), "stress.sqlite3")
    clock = ModelClock(START)
    queue = Queue(db, clock=clock, lease_seconds=LEASE_SECONDS)
    text, amounts = stress_batch(events, seed)
    for start in range(0, events, 1000):  # a batch holds at most 1000 lines
        queue.enqueue_jsonl("\n".join(text.splitlines()[start:start + 1000]))
    rng = random.Random(seed)
    reported: Counter[str] = Counter()
    rounds = processes = crashes = caused = 0
    while _pending(queue) and rounds < MAX_ROUNDS:
        rounds += 1
        gate = Path(workdir) / f"gate-{rounds}"  # all workers of a round start together
        gate.mkdir()
        certain = rounds <= killed_first
        crashes_at = ([(SURE_POINT, 1)] * workers if certain else
                      [(rng.choice(PROTOCOL_POINTS) if rng.random() < crash_rate else None,
                        rng.randint(1, MAX_CRASH_AFTER)) for _ in range(workers)])
        procs = [run_child(db, now=clock.now(), lease_seconds=LEASE_SECONDS,
                           mode="drain" if point is None else mode_for(point), crash_at=point,
                           crash_after=after, faults={"rate": fault_rate, "seed": seed},
                           gate=gate, wait=False)
                 for point, after in crashes_at]
        try:
            open_gate(gate, workers)
            for proc in procs:
                result = collect(proc)  # type: ignore[arg-type]
                crashes += result.crashed
                caused += certain and result.crashed
                reported.update(o.event_id for o in result.outcomes if o.kind == "done")
        finally:
            reap(procs)  # type: ignore[arg-type]
        processes += len(procs)
        clock.set(max(clock.now() + 1, _next_due(queue) or clock.now() + 1))
    report = audit(db, events, amounts, reported, workers=workers, rounds=rounds,
                   processes=processes, crashes=crashes)
    return replace(report, caused=caused)


def _pending(queue: Queue) -> bool:
    states = queue.status().states
    return bool(states["ready"] or states["leased"])


def _next_due(queue: Queue) -> int | None:
    due = [m.lease_until if m.lease_until is not None else m.available_at
           for m in queue.messages() if m.state in ("ready", "leased")]
    return min(due, default=None)


def audit(db: str | os.PathLike[str], events: int, amounts: dict[str, int],
          reported: Counter[str] | None = None, *, workers: int = 0, rounds: int = 0,
          processes: int = 0, crashes: int = 0) -> StressReport:
    """Check a finished stress database with the shared audit, plus what only
    this run knows: ``amounts`` (the money each accepted event should add) and
    ``reported``, the ``done`` outcomes the workers announced per event (two
    for one event is a duplicate, which the effects' primary key hides)."""
    reported = reported or Counter()
    snap = ledger_audit.snapshot(db)
    findings = ledger_audit.check(snap)
    states = snap.states()
    done = sorted(e for e, s in states.items() if s == "done")
    dead = sum(1 for s in states.values() if s == "dead")
    duplicates = sum(n - 1 for n in reported.values() if n > 1)
    unaccounted = {f.event_id for f in findings
                   if f.name in ("done_without_effect", "effect_without_done")}
    losses = (sum(1 for s in states.values() if s not in ("done", "dead"))
              + len(unaccounted) + events - len(states))
    expected = sum(amounts.get(e, 0) for e in done)
    problems = tuple(text for bad, text in [
        (findings, "; ".join(str(f) for f in findings[:5])),
        (duplicates, f"{duplicates} duplicate completions"),
        (losses, f"{losses} lost or unfinished messages"),
        (snap.money != expected, f"money {snap.money} != {expected} expected from the done events"),
        (any(e not in amounts for e in done), "an event the handler refuses is done"),
        (rounds >= MAX_ROUNDS and losses, "still pending after the last round"),
    ] if bad)
    return StressReport(workers, events, rounds, processes, crashes, len(done), dead,
                        len(snap.effect_rows), duplicates, losses, snap.money, expected,
                        "; ".join(snap.integrity), problems)
