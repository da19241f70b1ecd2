"""Exercise 9: decide what a worker does after a lost connection (notebook 14).

``start_9`` builds the moment after the cut: three orders, and two workers
whose ACK ended without an answer, each a real process that ended during its
ACK (on this SQLite file that stands for the connection that broke: from the
outside both look alike). E0901's COMMIT had taken effect; E0902's had not.
Nobody told anyone which. ``run_after_cut_9(q9, after_lost_connection)``
calls the learner's function once with each worker's lease, in event order,
as each worker would after its ``connection_lost`` line, then lets a later
worker (past every lease) run the queue to the end. ``check_9`` judges the
run on q9: money, effects and states together, every call of the function
that raised, and where the work came from (``provenance``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from ...audit import Snapshot, snapshot
from ...errors import IntegrityViolation, LeaseLost, QueueError
from ...handler import Handler
from ...queue import Queue
from ...values import Lease
from ...worker import drain
from ..story.child import run_child
from ..story.scenario import LEASE_SECONDS, START
from .provenance import hand_out
from .setup import folder_refused, fresh, queue_refused
from .verdicts import (Findings, NotAttempted, Stop, Verdict, bypassed, checked, compare,
                       figures, path_of, plain, read, same_file, states, untouched, whose)

__all__ = ["CutRun", "check_9", "run_after_cut_9", "start_9"]

ORDERS = "\n".join(json.dumps({"event_id": e, "payload": {"category": c, "amount_cents": a}})
                   for e, c, a in (("E0901", "book", 10000), ("E0902", "pen", 2000),
                                   ("E0903", "book", 5000)))
# The two workers' ACKs: the first ended after its COMMIT, the second before it.
CUTS = (("E0901", "complete.after_commit"), ("E0902", "complete.before_commit"))
TOTAL, EFFECTS = 17000, 3
_RUN = "`cut_run = exercises.run_after_cut_9(q9, after_lost_connection)`"
_AGAIN = f"run `q9 = exercises.start_9(workdir)` again, then {_RUN} once"


@dataclass(frozen=True)
class CutRun:
    """What the function did with each lost lease, and how the later worker ended."""

    db: str
    calls: tuple[tuple[str, str], ...]   # (event id, "returned" or the exception it raised)
    raised: tuple[tuple[str, BaseException], ...]
    later: str                            # the later worker: "finished" or its error

    def __str__(self) -> str:
        lines = [f"after the lost connection, for {event_id}: {what}"
                 for event_id, what in self.calls]
        return "\n".join([*lines, f"a later worker, past every lease: {self.later}"])


def start_9(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 9: E0901 book 10000, E0902 pen 2000, E0903 book 5000 at t=1000,
    lease 2 s; two workers' ACKs ended without an answer (E0901's had committed,
    E0902's had not)."""
    if folder_refused(workdir, 9):
        return None
    queue = fresh(workdir, "exercise_9")
    queue.enqueue_jsonl(ORDERS)
    for _, point in CUTS:  # real processes, ending by os._exit inside their ACK
        run_child(queue.path, now=START, lease_seconds=LEASE_SECONDS, crash_at=point)
    return hand_out(queue, 9)


def lost_leases(world: Snapshot) -> list[Lease]:
    """The leases the two cut workers held: their claims, read from the journal."""
    return [Lease(t.event_id, t.generation, t.attempts, t.at + LEASE_SECONDS)
            for t in world.journal if t.reason == "claimed" and t.generation == 1
            and t.event_id in dict(CUTS)]


def run_after_cut_9(queue: Any, after_lost_connection: Any) -> CutRun | None:
    """Call ``after_lost_connection(queue, lease, handler)`` for each lost lease,
    then run a later worker; print and return what happened (or, with nothing to
    run, print why and return ``None``)."""
    if after_lost_connection is None:
        print("Nothing to run yet: replace None with your function "
              "(queue, lease, handler)")
        return None
    if not callable(after_lost_connection):
        print("Cannot run: after_lost_connection must be a function (queue, lease, handler), "
              f"found {plain(after_lost_connection)}")
        return None
    refused = queue_refused(queue, 9) or _used(queue)
    if refused:
        print(f"Cannot run: {refused}")
        return None
    run = _run(queue, after_lost_connection)
    print(run)
    return run


def _used(queue: Queue) -> str | None:
    world = snapshot(queue.path)
    held = [(m.state.value, m.generation) for e, m in sorted(world.messages.items())]
    if held == [("done", 1), ("leased", 1), ("ready", 0)] and len(lost_leases(world)) == 2:
        return None
    return (f"q9 is no fresh start ({figures(world.status)}): run "
            "`q9 = exercises.start_9(workdir)` again first, then run_after_cut_9 once")


def _run(queue: Queue, decide: Callable[[Queue, Lease, Handler], Any]) -> CutRun:
    calls: list[tuple[str, str]] = []
    raised: list[tuple[str, BaseException]] = []
    for lease in lost_leases(snapshot(queue.path)):
        try:
            decide(queue, lease, Handler())
            calls.append((lease.event_id, "returned"))
        except Exception as exc:  # noqa: BLE001 - the learner's code: recorded, judged later
            calls.append((lease.event_id, f"raised {plain(exc)}"))
            raised.append((lease.event_id, exc))
    queue.clock.set(START + LEASE_SECONDS)  # type: ignore[attr-defined]  # every lease passed
    try:
        drain(queue, Handler())
        later = "finished"
    except Exception as exc:  # noqa: BLE001 - what the function left may refuse the worker
        later = f"stopped: {plain(exc)}"
    return CutRun(os.path.abspath(queue.path), tuple(calls), tuple(raised), later)


def check_9(queue: Any, cut_run: Any = None) -> Verdict:
    """After the lost connections, every order counted once: 17000, 3 effects, done 3."""
    def body() -> Verdict:
        world = read(queue, 9)
        if cut_run is None and untouched(world, 9, start_9):
            raise NotAttempted("write after_lost_connection(queue, lease, handler), then run "
                               + _RUN)
        run = _the_run(queue, cut_run)
        found = Findings(9, _AGAIN)
        _raised(run, found)
        rewrote = any(_rewrote(exc) for _, exc in run.raised)
        # an effect the function wrote outside its ACK is named above, with its reason
        bypassed(world, found, queue, first=not rewrote,
                 ignore=lambda f: rewrote and f.name == "effect_without_done")
        _lost(world, found)
        if not found:
            for wrong in compare(world, TOTAL, EFFECTS, states(done=3)):
                found.add(wrong)
        return found.verdict(_settled(world))
    return checked(9, body)


def _the_run(queue: Any, run: Any) -> CutRun:
    if not isinstance(run, CutRun):
        raise Stop(f"the run: expected what run_after_cut_9 returned, found {plain(run)}",
                   f"keep the run: {_RUN}")
    if not same_file(run.db, path_of(queue)):
        raise Stop(f"that run was taken on another database, not on q9's file (it ran on "
                   f"{whose(run.db, 9)})", f"{_AGAIN}, on q9 itself")
    return run


def _raised(run: CutRun, found: Findings) -> None:
    """What each call of the function raised, and what the queue meant by it."""
    for event_id, exc in run.raised:
        committed = event_id == CUTS[0][0]
        if _rewrote(exc):
            found.add(f"for {event_id} your function wrote the effect again, outside its ACK: "
                      "the effects table's key refused it (the second line of defence); with an "
                      "effect that has no such key, a counter or an e-mail, the money doubles "
                      "(notebook 14)", "never run the effect yourself after a lost connection: "
                      "leave it to the fenced ACK (do nothing and let the lease run out, or "
                      "retry complete with the same lease)")
        elif _refused_by_the_schema(exc):
            found.add(f"for {event_id} your function wrote the queue's tables with SQL of its "
                      f"own, and the schema refused it: {plain(exc)}", "never write the queue's "
                      "rows yourself: leave the message to the fenced ACK (do nothing and let "
                      "the lease run out, or retry complete with the same lease)")
        elif isinstance(exc, LeaseLost):
            why = ("its COMMIT had taken effect: the message is done, and the old lease is "
                   "refused" if committed else "its lease is no longer this worker's")
            found.add(f"for {event_id} your function raised LeaseLost ({exc.code}): {why}",
                      "catch LeaseLost: a refusal means the queue has settled that message "
                      "already, and the worker goes on")
        elif isinstance(exc, QueueError):
            found.add(f"for {event_id} your function raised {exc.code}: {plain(exc)}",
                      "call only what the lease still allows, and catch the queue's refusals")
        else:
            found.add(f"for {event_id} your function raised {plain(exc)}",
                      "fix the function so that it returns for both leases")
    if run.later != "finished" and not found:
        found.add(f"the later worker {run.later}", _AGAIN)


def _rewrote(exc: BaseException) -> bool:
    """An effect written a second time, refused by the effects table's key."""
    if isinstance(exc, IntegrityViolation):
        return True
    text = str(exc)
    return type(exc).__name__ in ("IntegrityError", "UniqueViolation") and (
        "effects" in text and ("UNIQUE" in text or "unique" in text or "duplicate key" in text))


def _refused_by_the_schema(exc: BaseException) -> bool:
    """Another constraint of the schema refused a row written by hand (a CHECK)."""
    return type(exc).__name__ in ("IntegrityError", "CheckViolation", "NotNullViolation")


def _lost(world: Snapshot, found: Findings) -> None:
    """A message given up whose ACK may never have committed: its money lost."""
    dead = sorted(e for e, m in world.messages.items() if m.state == "dead")
    if dead:
        reasons = ", ".join(str(world.messages[e].last_error) for e in dead)
        found.add(f"{', '.join(dead)} dead ({reasons}): "
                  "your function gave up a message whose ACK may never have committed, and "
                  "its money is lost", "do not fail a message after a lost connection: its "
                  "outcome is unknown, and the queue settles it")


def _settled(world: Snapshot) -> str:
    second = world.messages[CUTS[1][0]]
    how = ("its ACK retried with the same lease, fenced" if second.generation == 1
           else "handed out again (once its lease ran out, or at once if it was given back), "
                f"done by generation {second.generation}")
    return (f"E0901's COMMIT had taken effect (done by generation 1, its 10000 counted once), "
            f"E0902's had not ({how}): {figures(world.status)}")
