"""The check of exercise 6: the naive worker ACKed first and died before its
INSERT, so E0003 is done with no effect.

The run is tied to the queue it is checked against: the run's file must be
the queue's file, the queue's journal must hold the run's claim, and the
queue must hold exactly what the run's steps leave when replayed with the
same clock on a scratch copy (so a hand edit after the run shows). The same
steps, run to the end without a crash, must be a whole naive ACK: total
5000, one effect, done.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ...audit import Snapshot, snapshot
from ...crashpoints import CRASH_EXIT_CODE
from .setup import NaiveRun, explain_sql_error, run_naive_quietly, start_6
from .verdicts import (Findings, NotAttempted, Stop, Verdict, bypassed, checked, compare,
                                figures, path_of, plain, read, states, untouched, used_start,
                                whose)

__all__ = ["check_6"]

_RUN = "`naive_run = exercises.run_naive_worker(q6, naive_steps)`"
_AGAIN = f"run `start_6` again, then {_RUN} once"
_ACK = ("`UPDATE messages SET state = 'done', lease_until = NULL, finished_at = :now "
        "WHERE event_id = :event_id AND generation = :generation`")
_INSERT = ("`INSERT INTO effects (event_id, category, amount_cents) VALUES (:event_id, "
           ":category, :amount_cents)`")


def check_6(queue: Any, naive_run: Any = None) -> Verdict:
    """The naive worker ACKed first and died before its INSERT: E0003 done, no effect."""
    def body() -> Verdict:
        world = read(queue, 6)
        if naive_run is None and untouched(world, 6):
            raise NotAttempted("write the naive steps, ACK first, and run the naive worker")
        run = _the_run(world, path_of(queue), naive_run)
        found = Findings(6, _AGAIN)
        # the naive worker breaks the audit's invariants on purpose: only the witness judges
        bypassed(world, found, queue, audit=False)
        _order(world, run, found)
        if not found:
            for wrong in compare(world, 0, 0, states(done=1)):
                found.add(wrong)
        if not found:
            _without_crash(run, found)
        return found.verdict("the ACK committed, then the worker died before its INSERT "
                             f"(exit code {CRASH_EXIT_CODE}): E0003 is done, so no claim will "
                             f"ever hand it out again, and its 5000 are lost: "
                             f"{figures(world.status)}")
    return checked(6, body)


def _the_run(world: Snapshot, path: str, run: Any) -> NaiveRun:
    """The run, if it is one of this queue: else stop with what is wrong."""
    if not isinstance(run, NaiveRun):
        raise Stop(f"the naive worker's run: expected what run_naive_worker returned, found "
                   f"{plain(run)}", f"keep the run: {_RUN}")
    elsewhere = not (run.db and os.path.exists(run.db) and os.path.samefile(run.db, path))
    if run.event_id is None and not elsewhere:
        raise used_start(world, 6, "E0003", "the naive worker found nothing to claim")
    tied = Findings(6, _AGAIN)
    if elsewhere:   # first: whatever that run found, it is another queue's story
        tied.add(f"that run was taken on another database, not on q6's file (it ran on "
                 f"{_which(run.db)})")
    claims = [t for t in world.journal if t.event_id == run.event_id and t.reason == "claimed"]
    claimed = run.generation in [t.generation for t in claims]
    if not claimed and not elsewhere and untouched(world, 6):
        raise Stop("q6 is a fresh start: that run came before `start_6` built it again",
                   f"run the worker cell again on this q6: {_RUN}, then this check")
    if not claimed and run.event_id is not None and not (elsewhere and untouched(world, 6)):
        stored = world.messages.get(run.event_id)
        tied.add(f"q6's journal holds no claim of {run.event_id} by generation {run.generation} "
                 f"(the run's): {run.event_id} is {stored.state if stored else 'gone'} without "
                 "that worker's claim, changed by hand or by another run")
    if tied:
        raise Stop("; ".join(tied.wrong), f"{_AGAIN}, on q6 itself")
    if run.error:
        what, step = explain_sql_error(run.error)
        raise Stop(f"step {run.committed + 1} failed in the worker: {what}",
                   f"{step}; then {_AGAIN}")
    return run


def _which(db: str) -> str:
    """The other database, named without its folder."""
    return whose(db, 6) if db else "no file it recorded"


def _order(world: Snapshot, run: NaiveRun, found: Findings) -> None:
    """Two steps, a real crash after the first, and a queue that holds what the first left."""
    if len(run.steps) != 2:
        found.add(*_step_count(world, run))
        return
    if run.exit_code != CRASH_EXIT_CODE or run.committed != 1:
        found.add(f"exit code expected {CRASH_EXIT_CODE} after step 1, found {run.exit_code} "
                  f"after step {run.committed}: the worker did not crash between the steps",
                  f"run `start_6` again, then {_RUN} without crash_after")
        return
    _replayed(world, run, found)
    if found:
        return
    e0003 = world.messages[run.event_id]
    if run.event_id in world.effects:
        found.add("the INSERT committed first: that order doubles on a retry instead (notebook "
                  "02): once the lease expires, a retry writes the effect a second time",
                  "swap the steps: the ACK (UPDATE messages ...) first, then the INSERT")
    elif e0003.state != "done":
        found.add(f"step 1 changed no row: {run.event_id} is still {e0003.state}",
                  f"make step 1 the ACK, {_ACK}")


def _step_count(world: Snapshot, run: NaiveRun) -> tuple[str, str]:
    """What a list of one step, or of more than two, is missing."""
    if len(run.steps) > 2:
        return (f"two steps expected (the ACK, then the INSERT), found {len(run.steps)}",
                "keep exactly two steps: the UPDATE, then the INSERT")
    if run.event_id in world.effects:
        return ("one step given, the INSERT: the ACK is missing, and it must come first",
                f"make step 1 the ACK, {_ACK}, and step 2 the INSERT")
    if world.messages[run.event_id].state == "done":
        return ("one step given, the ACK: the INSERT INTO effects is missing as step 2",
                f"make step 2 {_INSERT}")
    return ("one step given, and it changed no row: two expected (Hint 1)",
            f"make step 1 the ACK, {_ACK}, and step 2 {_INSERT}")


def _replayed(world: Snapshot, run: NaiveRun, found: Findings) -> None:
    """The queue must hold what the run's steps leave, replayed on a scratch copy."""
    again, replay = _replay(run, crash_after=1)
    same = (world.messages == replay.messages and world.effect_rows == replay.effect_rows
            and world.journal == replay.journal)
    if again.exit_code != run.exit_code or not same:
        found.add(f"q6 is not what your run left: your steps leave ({figures(replay.status)}), "
                  f"q6 holds ({figures(world.status)}): a hand edit changed it after the run",
                  _AGAIN, first=True)


def _replay(run: NaiveRun, crash_after: int) -> tuple[NaiveRun, Snapshot]:
    """Run the same steps at the same model time on a fresh start of exercise 6."""
    with tempfile.TemporaryDirectory(prefix="queue-exercise-6-") as workdir:
        queue = start_6(workdir)
        assert queue is not None  # a new temporary folder is always usable
        queue.clock.set(run.now)  # type: ignore[attr-defined]
        again = run_naive_quietly(queue, run.steps, crash_after)
        return again, snapshot(queue.path)


def _without_crash(run: NaiveRun, found: Findings) -> None:
    """The same steps, run to the end without a crash, must be a whole (naive) ACK."""
    dry, world = _replay(run, crash_after=0)
    label = "your steps run to the end without a crash"
    if dry.error:
        what, step = explain_sql_error(dry.error)
        found.add(f"{label}: step {dry.committed + 1} failed: {what}", step)
        return
    effect = world.effects.get(run.event_id)
    if effect is None:
        found.add(f"{label} write no effect ({'; '.join(compare(world, 5000, 1, {}))}): "
                  "step 2 must be the INSERT", f"make step 2 {_INSERT}")
    elif compare(world, 5000, 1, states(done=1)):
        found.add(f"{label} leave {figures(world.status)} instead of total 5000 (book 5000), "
                  "effects 1, done 1", f"insert `:category` and `:amount_cents`, as {_INSERT}")
