"""The reference scenario of the course (notebook 00, README), end to end.

``python -m queue_core demo`` and notebook 00 run exactly this, in a
temporary database (notebook 10 on PostgreSQL, with the same calls), with a real child process that crashes before COMMIT.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .child import ChildResult, run_child
from ...clock import ModelClock
from ...handler import Handler
from ...queue import Queue
from ...values import EnqueueResult, Status
from ...worker import process_one
from .scenario import DEMO_JSONL, LEASE_SECONDS, START



@dataclass(frozen=True)
class DemoReport:
    """Every figure the scenario produces, in the order it produces them."""

    first_enqueue: EnqueueResult
    crash_exit_code: int
    snapshot: Status
    final: Status
    again: EnqueueResult
    after_redrive_without_fix: Status
    after_fix: Status


def run_scenario(workdir: str | Path, say: Callable[[str], None] = print) -> DemoReport:
    """Play the scenario on ``workdir/demo.sqlite3``; narrate through ``say``."""
    return play_scenario(str(Path(workdir) / "demo.sqlite3"), say)


def play_scenario(db: str, say: Callable[[str], None] = print) -> DemoReport:
    """Play the scenario on ``db``, a new SQLite file or an empty PostgreSQL
    schema's ``postgresql://`` string (notebook 10); narrate through ``say``."""
    clock = ModelClock(START)
    queue = Queue(db, clock=clock, lease_seconds=LEASE_SECONDS)
    handler = Handler()
    held = sum(queue.status().states.values())
    if held:  # played before: its story (and its crash) cannot happen twice on one queue
        raise ValueError(f"the reference scenario starts on a new, empty queue, and "
                         f"{queue.store.describe()} already holds {held} messages (the "
                         "scenario was played on it before): make a new one (run again the "
                         "cell that made its folder or schema), then play the scenario")

    first = queue.enqueue_jsonl(DEMO_JSONL)
    say(f"t={clock.now()} enqueue 5 lines: {first.inserted} messages, {first.duplicates} duplicate")
    say(f"t={clock.now()} {process_one(queue, handler)}")
    lease = queue.claim()
    assert lease is not None
    say(f"t={clock.now()} {lease.event_id} controlled transient error: "
        f"{queue.fail(lease, 'transient_error')}")
    child = run_child(db, now=clock.now(), lease_seconds=LEASE_SECONDS,
                      crash_at="complete.after_insert")
    assert isinstance(child, ChildResult)  # run_child waits unless told not to
    crashed = queue.message("E0003")
    say(f"t={clock.now()} E0003 worker process INSERTed its effect and died before COMMIT "
        f"(exit code {child.exit_code}); E0003 is {crashed.state}, generation {crashed.generation}")
    say(f"t={clock.now()} {process_one(queue, handler)}")
    snapshot = queue.status()
    say(f"snapshot: {_figures(snapshot)}")

    for t in (START + 1, START + 2):
        clock.set(t)
        say(f"t={t} {process_one(queue, handler)}")
    final = queue.status()
    say(f"final: {_figures(final)}")

    again = queue.enqueue_jsonl(DEMO_JSONL)
    say(f"enqueue the same 5 lines again: {again.inserted} inserted, {again.duplicates} duplicates; "
        f"total still {queue.status().total}")

    queue.redrive("E0004")
    say(f"redrive E0004 without the fix: {process_one(queue, handler)}")
    without_fix = queue.status()
    newer = handler.supporting("toy")
    queue.redrive("E0004")
    say(f"add toy support, redrive E0004: {process_one(queue, newer)}")
    after_fix = queue.status()
    say(f"after the fix: {_figures(after_fix)}")
    return DemoReport(first, child.exit_code, snapshot, final, again, without_fix, after_fix)


def run_demo(say: Callable[[str], None] = print) -> DemoReport:
    """Run the scenario in a fresh temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="queue-demo-") as workdir:
        return run_scenario(workdir, say)


def _figures(status: Status) -> str:
    states = ", ".join(f"{name} {count}" for name, count in status.states.items())
    totals = ", ".join(f"{name}={cents}" for name, cents in status.totals.items())
    return f"total={status.total} ({totals}); effects {status.effects}; {states}"
