"""The model the schedule explorer steps through: a scenario, the steps of a
schedule, and workers driven one transaction at a time on the real engine.

A worker is a small state machine over the public API, stepped one
transaction at a time: ``idle`` claims; ``holding`` a lease runs the ACK
(``complete``), or, with the protocol, the worker loop's step that ACKs and
claims the next message in the same transaction (``complete_and_claim``),
after which it holds the next lease; an ACK that raised a transient or
permanent failure leaves it ``failing``, and its next step is ``fail``; a
lost lease makes it ``idle``.
The two split contrasts ("mark then write", "write then mark") ACK in two
transactions, so for them the ACK is two steps with ``between`` in the middle:
``Runner`` calls the subclass's own ``first_half`` and ``second_half``, the two
transactions its ``complete`` runs. The protocol and "no generation check"
ACK in one step by calling their class's ``complete`` and ``fail``. The
search over every schedule is ``explore``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ... import audit
from ...clock import ModelClock
from ...errors import InvalidPayload, LeaseLost, TransientError
from ...queue import Queue
from ...values import Effect, Lease, State
from ..story.contrasts import REAL, Protocol
from ..story.faults import FlakyHandler
from ..story.scenario import LEASE_SECONDS, START
from .sweep import run_to_completion

SPLIT = ("mark then write", "write then mark")
HANDOFF = "ACKs and claims the next"  # the worker loop's step: one transaction


@dataclass(frozen=True)
class Scenario:
    """What may happen: the events, the workers, and the budgets of the schedule.

    ``transient`` events fail their first attempt with a transient error;
    ``crashes``, ``jumps`` and ``redrives`` bound the crashes, clock jumps and
    operator redrives one schedule may contain. ``fused`` lets the protocol's
    workers also take the worker loop's step (ACK and claim the next in one
    transaction); without it they ACK, then claim, in two. ``prunes`` bounds
    the cleaner's prunes (``Queue.prune(0)``: every done message so far) and
    ``duplicates`` the producer's late enqueues of the same events again;
    both are 0 unless a scenario asks for them (``PRUNE``). ``priorities``
    gives events a priority other than the default, 0 (``PRIORITY``): the
    producer's enqueue is then one batch per priority, in the same step
    (nothing else can happen before the events are enqueued).
    """

    events: tuple[tuple[str, str, int], ...]
    workers: int = 2
    transient: tuple[str, ...] = ()
    crashes: int = 1
    jumps: int = 3
    redrives: int = 1
    lease_seconds: int = LEASE_SECONDS
    max_attempts: int = 3
    start: int = START
    fused: bool = True
    prunes: int = 0
    duplicates: int = 0
    priorities: tuple[tuple[str, int], ...] = ()

    def jsonl(self, priority: int | None = None) -> str:
        """The events as JSONL: all, or those of ``priority``."""
        given = dict(self.priorities)
        return "".join(f'{{"event_id": "{e}", "payload": {{"category": "{c}", '
                       f'"amount_cents": {a}}}}}\n' for e, c, a in self.events
                       if priority is None or given.get(e, 0) == priority)

    def enqueue(self, queue: Queue) -> tuple[int, int]:
        """Enqueue the events, a batch per priority; ``(inserted, duplicates)``."""
        if not self.priorities:
            result = queue.enqueue_jsonl(self.jsonl())
            return result.inserted, result.duplicates
        inserted = duplicates = 0
        for priority in sorted({0, *dict(self.priorities).values()}):
            if text := self.jsonl(priority):
                result = queue.enqueue_jsonl(text, priority=priority)
                inserted, duplicates = inserted + result.inserted, duplicates + result.duplicates
        return inserted, duplicates

    def handler(self) -> FlakyHandler:
        return FlakyHandler(first_attempt=self.transient)

    def __str__(self) -> str:
        return (f"{_count(self.workers, 'worker')} x {_count(len(self.events), 'event')} "
                f"({', '.join(self.transient) or 'none'} failing once), "
                f"{_count(self.crashes, 'crash')}, {_count(self.jumps, 'clock jump')}, "
                f"{_count(self.redrives, 'redrive')}, lease {self.lease_seconds} s"
                + ("" if self.fused else ", ACK and claim in two transactions")
                + (f", {_count(self.prunes, 'prune')}" if self.prunes else "")
                + (f", {_count(self.duplicates, 'late duplicate enqueue')}"
                   if self.duplicates else "")
                + "".join(f", {e} of priority {p}" for e, p in self.priorities))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('sh') else 's'}"


DEFAULT = Scenario(events=(("E0001", "book", 10000), ("E0002", "pen", 2000)),
                   transient=("E0002",))
SMALL = Scenario(events=(("E0001", "book", 10000),), transient=("E0001",), jumps=2)
# Retention model-checked: a prune interleaved with a late duplicate enqueue of the
# same events and with a stale ACK (a worker stalled past its lease while another
# finished the message, which may then be pruned before the stale one wakes up).
PRUNE = Scenario(events=(("E0001", "book", 10000), ("E0002", "pen", 2000)),
                 crashes=0, jumps=2, redrives=0, prunes=1, duplicates=1)
# Two priorities and a retry: the urgent E0002 (enqueued with E0001, after it in
# event id order) is claimed first, fails once, and is due again a second later,
# ahead of E0001 if E0001 still waits; a crash, clock jumps and a redrive besides.
PRIORITY = replace(DEFAULT, priorities=(("E0002", 9),))


@dataclass(frozen=True)
class Step:
    """One step of a schedule: ``who`` (W1, W2, producer, clock, operator) does ``what``."""

    who: str
    what: str
    arg: int | str | None = None

    def __str__(self) -> str:
        if self.what == "jump":
            return f"the clock jumps to {self.arg}"
        if self.what == "redrive":
            return f"the operator redrives {self.arg}"
        if self.what == "enqueue":
            return "the producer enqueues the events"
        if self.what == "enqueue again":
            return "the producer enqueues the events again (a late duplicate)"
        if self.what == "prune":
            return "the cleaner prunes every done message"
        if self.what == "finish":
            return "the clock runs free and a fresh worker finishes the queue"
        return f"{self.who} {self.what}"


# The end of a schedule the bound cut short: a fresh worker, the clock free.
FINISH = Step("clock", "finish")

# A worker's state, hashable: ("idle",), ("holding", lease),
# ("between", lease, effect) inside a split ACK, ("failing", lease, code, permanent).
IDLE: tuple[Any, ...] = ("idle",)


@dataclass(frozen=True)
class World:
    """Everything besides the file: model time, the workers, budgets left."""

    now: int
    workers: tuple[tuple[Any, ...], ...]
    enqueued: bool
    crashes: int
    jumps: int
    redrives: int
    prunes: int = 0
    duplicates: int = 0


class Runner:
    """One protocol's queue on one file, and the steps that move it."""

    def __init__(self, proto: Protocol, scenario: Scenario, path: Path) -> None:
        self.proto, self.scenario, self.path = proto, scenario, path
        self.clock = ModelClock(scenario.start)
        # Power loss is not part of this model (the power-loss sweep covers it):
        # no fsync, so a step costs what SQLite's logic costs.
        self.queue: Queue = proto.open(path, clock=self.clock, lease_seconds=scenario.lease_seconds,
                                       max_attempts=scenario.max_attempts, synchronous="OFF")
        self.handler = scenario.handler()
        self.fd = os.open(path, os.O_RDWR)

    def close(self) -> None:
        os.close(self.fd)

    def image(self) -> bytes:
        # A reader (the audit's snapshot) may leave an empty WAL behind; frames
        # in it would mean the file alone is not the state.
        wal = f"{self.path}-wal"
        if os.path.exists(wal) and os.path.getsize(wal):
            raise RuntimeError("the WAL holds frames: the file is not the whole state")
        return Path(self.path).read_bytes()

    def restore(self, image: bytes) -> None:
        """Write ``image`` back in place: faster than replacing the file."""
        os.pwrite(self.fd, image, 0)
        os.ftruncate(self.fd, len(image))

    def start(self) -> World:
        s = self.scenario
        return World(s.start, (IDLE,) * s.workers, False, s.crashes, s.jumps, s.redrives,
                     s.prunes, s.duplicates)

    def apply(self, world: World, step: Step) -> tuple[World, str, bool]:
        """Run ``step`` from ``world`` (the file must hold that state). Return the new
        world, what happened in words, and whether the journal cannot show it (a
        rejected ACK, a crash, a write to the contrasts' ledger): then a plot marks it."""
        self.clock.set(world.now)
        if step.what == "enqueue":
            self.scenario.enqueue(self.queue)
            return replace(world, enqueued=True), str(step), False
        if step.what == "enqueue again":
            inserted, duplicates = self.scenario.enqueue(self.queue)
            return (replace(world, duplicates=world.duplicates - 1),
                    f"{step}: {inserted} new, {duplicates} duplicates", False)
        if step.what == "prune":
            pruned = self.queue.prune(0)
            return (replace(world, prunes=world.prunes - 1),
                    f"the cleaner prunes {pruned.messages} done "
                    f"message{'s' if pruned.messages != 1 else ''}", False)
        if step.what == "jump":
            assert isinstance(step.arg, int)
            return replace(world, now=step.arg, jumps=world.jumps - 1), str(step), False
        if step.what == "redrive":
            assert isinstance(step.arg, str)
            self.queue.redrive(step.arg)
            return replace(world, redrives=world.redrives - 1), str(step), False
        n = int(step.who[1:]) - 1
        state, said, marked = self._work(world.workers[n], step.what)
        workers = world.workers[:n] + (state,) + world.workers[n + 1:]
        crashes = world.crashes - (step.what == "crashes")
        return replace(world, workers=workers, crashes=crashes), f"{step.who} {said}", marked

    def _work(self, state: tuple[Any, ...], what: str) -> tuple[tuple[Any, ...], str, bool]:
        if what == "claims":
            lease = self.queue.claim()
            if lease is None:
                return IDLE, "claims nothing", False
            return ("holding", lease), f"claims {held(lease)}, lease until {lease.lease_until}", False
        lease: Lease = state[1]
        if what == "crashes":
            return IDLE, f"crashes holding {held(lease)}", True
        try:
            if what == "fails":
                outcome = self.queue.fail(lease, state[2], permanent=state[3])
                return IDLE, f"reports the failure of {held(lease)}: {outcome.kind}", False
            return self._ack(state, what)
        except (TransientError, InvalidPayload) as exc:
            failing = ("failing", lease, exc.code, isinstance(exc, InvalidPayload))
            return failing, f"ACK of {held(lease)} fails: {exc.code}", False
        except LeaseLost as exc:
            tried = f"reports the failure of {held(lease)}" if what == "fails" else \
                f"ACKs {held(lease)}"
            return IDLE, f"{tried}: rejected, {exc.code}", True

    def _ack(self, state: tuple[Any, ...], what: str) -> tuple[tuple[Any, ...], str, bool]:
        lease: Lease = state[1]
        if what == HANDOFF:
            effect, following = self.queue.complete_and_claim(lease, self.handler)
            said = f"ACKs {held(lease)}: done, +{effect.amount_cents}"
            if following is None:
                return IDLE, f"{said}, and claims nothing", False
            return (("holding", following), f"{said}, and claims {held(following)}, "
                    f"lease until {following.lease_until}", False)
        if self.proto.name not in SPLIT:
            effect = self.queue.complete(lease, self.handler)
            return IDLE, f"ACKs {held(lease)}: done, +{effect.amount_cents}", False
        marks_first = self.proto.name == "mark then write"
        if what == "ACKs (part 1)":
            effect = self._first_half(lease)
            said = ("marks {} done, effect not written yet" if marks_first
                    else "writes the effect of {}, not marked done yet").format(held(lease))
            return ("between", lease, effect), said, not marks_first
        self._second_half(lease, state[2])
        said = "writes the effect of {}" if marks_first else "marks {} done"
        return IDLE, said.format(held(lease)), marks_first

    # The two transactions of MarkThenWrite.complete and WriteThenMark.complete.
    def _first_half(self, lease: Lease) -> Effect:
        return self.queue.first_half(lease, self.handler)  # type: ignore[attr-defined, no-any-return]

    def _second_half(self, lease: Lease, effect: Effect) -> None:
        self.queue.second_half(lease, effect)  # type: ignore[attr-defined]

    def enabled(self, world: World, snap: audit.Snapshot) -> list[Step]:
        """Every step that can change something, in a fixed order."""
        if not world.enqueued:
            return [Step("producer", "enqueue")]
        messages = snap.messages.values()
        claimable = any((m.state == State.READY and m.available_at <= world.now)
                        or (m.state == State.LEASED and m.lease_until is not None
                            and m.lease_until <= world.now) for m in messages)
        steps = []
        for n, state in enumerate(world.workers, start=1):
            steps += [Step(f"W{n}", what) for what in self._worker_steps(state, claimable)]
            if state != IDLE and world.crashes:
                steps.append(Step(f"W{n}", "crashes"))
        due = [m.available_at if m.state == State.READY else m.lease_until for m in messages
               if m.state in (State.READY, State.LEASED)]
        future = [t for t in due if t is not None and t > world.now]
        if future and world.jumps:
            steps.append(Step("clock", "jump", min(future)))
        if world.redrives:
            steps += [Step("operator", "redrive", m.event_id) for m in messages
                      if m.state == State.DEAD]
        if world.duplicates:
            steps.append(Step("producer", "enqueue again"))
        # A prune that would prune nothing is no step: it leaves the owner of the
        # journal's last row for later (retention: sequence numbers never reused).
        last = snap.journal[-1].event_id if snap.journal else None
        if world.prunes and any(m.state == State.DONE and m.payload is not None
                                and m.event_id != last for m in messages):
            steps.append(Step("cleaner", "prune"))
        return steps

    def _worker_steps(self, state: tuple[Any, ...], claimable: bool) -> list[str]:
        kind = state[0]
        if kind == "idle":
            return ["claims"] if claimable else []
        if kind == "holding":
            if self.proto.name in SPLIT:
                return ["ACKs (part 1)"]
            fused = self.scenario.fused and self.proto.name == REAL.name
            return ["ACKs", HANDOFF] if fused else ["ACKs"]
        if kind == "between":
            return ["ACKs (part 2)"]
        return ["fails"]

    def finish(self) -> None:
        """A fresh worker finishes the queue with the clock free (the budget ran out)."""
        run_to_completion(self.queue, self.clock, self.handler)


def held(lease: Lease) -> str:
    """A lease in a few words: ``E0001 (g2)``."""
    return f"{lease.event_id} (g{lease.generation})"
