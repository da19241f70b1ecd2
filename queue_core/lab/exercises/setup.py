"""What the exercises start from and run: starting states, the prepared
databases of exercise 5, and exercise 6's naive worker process.

Every state is built through the protocol on a fresh file with a model clock;
every crash is a real process ending by ``os._exit``. ``python -m
queue_core.lab.exercises.setup JSON`` is the naive worker's process (see
``run_naive_worker``). Learners call these through ``queue_core.lab.exercises``.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from ..story.child import run_child
from ...clock import ModelClock
from ...crashpoints import CRASH_EXIT_CODE
from ...handler import Handler
from ...queue import Queue
from ...worker import drain, process_one
from ..story.scenario import DEMO_JSONL, LEASE_SECONDS, START
from .provenance import Witness, forget, hand_out, queue_signing_as, signed_as

E0001_PAYLOAD = '{"amount_cents":10000,"category":"book"}'  # E0001 as stored (canonical)
_DEMO_LINES = DEMO_JSONL.splitlines()
E0003_LINE, E0004_LINE = _DEMO_LINES[3], _DEMO_LINES[4]
MALFORMED = "\n".join((
    '{"event_id": "E0201", "payload": {"category": ["book"], "amount_cents": 1000}}',
    '{"event_id": "E0202", "payload": {"category": "book", "amount_cents": true}}',
    '{"event_id": "E0203", "payload": {"category": "book", "amount_cents": 1.0}}')) + "\n"


# -- starting states ------------------------------------------------------------

def fresh(workdir: str | os.PathLike[str], name: str) -> Queue:
    """A new queue file in ``workdir`` (an earlier one, and its witness, are removed:
    start over)."""
    path = Path(workdir) / f"{name}.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    forget(path)
    return Queue(path, clock=ModelClock(START), lease_seconds=LEASE_SECONDS)


def folder_refused(workdir: Any, number: int) -> bool:
    """Print why ``workdir`` is no folder to start exercise ``number`` in, and what
    to run; False (and nothing printed) when it is one.

    Notebook 09's last cell removes its folder (``scratch.cleanup()``): a
    start run after it says to run the first code cell again, instead of
    SQLite's "unable to open database file". No folder is made here: a
    path mistyped is refused, not created.
    """
    start = f"`q{number} = exercises.start_{number}(workdir)`"
    if not isinstance(workdir, (str, os.PathLike)):
        why = f"pass the work folder, {start}, found {_kind(workdir)}"
    elif not Path(workdir).exists():
        why = ("its work folder does not exist (any more: `scratch.cleanup()` removes it). "
               f"Run the notebook's first code cell again (it makes a new workdir), then {start}")
    elif not Path(workdir).is_dir():
        why = f"the work folder given is a file, not a folder: pass workdir, {start}"
    else:
        return False
    print(f"Cannot start exercise {number}: {why}")
    return True


def _kind(value: Any) -> str:
    return f"a value of type {type(value).__name__}"


def queue_refused(queue: Any, number: int) -> str | None:
    """Why ``queue`` is no queue of exercise ``number`` to run on (None: it is one)."""
    start = f"`q{number} = exercises.start_{number}(workdir)`"
    if not isinstance(queue, Queue):
        return f"pass the queue that {start} returned, found {_kind(queue)}"
    if not Path(queue.path).is_file():
        return (f"q{number}'s file does not exist any more (`scratch.cleanup()` removes the "
                f"work folder): run the notebook's first code cell again, then {start}")
    return None


def reference_final(queue: Queue) -> Queue:
    """Play the reference scenario up to its final state: total 17000, E0004 dead."""
    handler = Handler()
    queue.enqueue_jsonl(DEMO_JSONL)
    process_one(queue, handler)                                   # E0001 done
    lease = queue.claim()                                         # E0002: transient error
    assert lease is not None and lease.event_id == "E0002"
    queue.fail(lease, "transient_error")
    run_child(queue.path, now=queue.clock.now(), lease_seconds=LEASE_SECONDS,
              crash_at="complete.after_insert")                   # E0003: a real crash
    process_one(queue, handler)                                   # E0004: toy, dead
    for t in (START + 1, START + 2):
        queue.clock.set(t)  # type: ignore[attr-defined]
        process_one(queue, handler)                               # E0002, then E0003 done
    return queue


@lru_cache(maxsize=1)
def _reference_image() -> sqlite3.Connection:
    """The reference scenario's final state, played once per process (its crash
    a real one) and kept in memory, so that every start of it is a byte copy."""
    with tempfile.TemporaryDirectory(prefix="queue-reference-") as workdir:
        played = reference_final(fresh(workdir, "reference"))
        image = sqlite3.connect(":memory:", check_same_thread=False)
        source = sqlite3.connect(played.path)
        try:
            source.backup(image)
        finally:
            source.close()
    return image


def _copy_of_reference(workdir: str | os.PathLike[str], number: int) -> Queue:
    return hand_out(_load_reference(fresh(workdir, f"exercise_{number}")), number)


def _load_reference(queue: Queue) -> Queue:
    """Make ``queue``'s file a copy of the reference scenario's final state."""
    target = sqlite3.connect(queue.path)
    try:
        _reference_image().backup(target)
    finally:
        target.close()
    queue.clock.set(START + 2)  # type: ignore[attr-defined]  # where the scenario ended
    return queue


def start_1(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 1: the reference scenario's final state (total 17000, E0004 dead), t=1002."""
    return None if folder_refused(workdir, 1) else _copy_of_reference(workdir, 1)


def start_2(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 2: the reference scenario's final state, t=1002."""
    return None if folder_refused(workdir, 2) else _copy_of_reference(workdir, 2)


def start_3(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 3: the reference scenario's final state, E0004 (toy) dead, t=1002."""
    return None if folder_refused(workdir, 3) else _copy_of_reference(workdir, 3)


def start_4(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 4: E0004 (toy 3000) ready at t=1000, lease 2 s."""
    if folder_refused(workdir, 4):
        return None
    queue = fresh(workdir, "exercise_4")
    queue.enqueue_jsonl(E0004_LINE)
    return hand_out(queue, 4)


def start_5(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 5: a message dead after three transient failures, one dead after
    three silent lease expiries (real crashed processes), one done."""
    if folder_refused(workdir, 5):
        return None
    queue = fresh(workdir, "exercise_5")
    for _ in silent_and_transient(queue):
        pass
    return hand_out(queue, 5)


def start_6(workdir: str | os.PathLike[str]) -> Queue | None:
    """Exercise 6: E0003 (book 5000) ready at t=1000, lease 2 s."""
    if folder_refused(workdir, 6):
        return None
    queue = fresh(workdir, "exercise_6")
    queue.enqueue_jsonl(E0003_LINE)
    return hand_out(queue, 6)


STARTS: dict[int, Callable[[str | os.PathLike[str]], Queue | None]] = {
    1: start_1, 2: start_2, 3: start_3, 4: start_4, 6: start_6}


# -- exercise 5: prepared databases ----------------------------------------------------

def _line(event_id: str, category: str, amount_cents: int) -> str:
    return json.dumps({"event_id": event_id,
                       "payload": {"category": category, "amount_cents": amount_cents}})


def silent_and_transient(queue: Queue) -> Iterator[str]:
    """E0501 dies after three transient failures; E0502's three workers are real
    processes that crash; E0503 is done. Yields a case name at each stage."""
    queue.enqueue_jsonl(_line("E0501", "pen", 700))
    clock: ModelClock = queue.clock  # type: ignore[assignment]
    for t in (START, START + 1, START + 3):   # backoff 1 s, then 2 s; the third claim ends dead
        clock.set(t)
        lease = queue.claim()
        assert lease is not None
        queue.fail(lease, "transient_error")
    yield "three transient failures"
    queue.enqueue_jsonl(_line("E0502", "bag", 900))
    for t in (START + 3, START + 5, START + 7):   # each worker process dies before COMMIT
        run_child(queue.path, now=t, lease_seconds=LEASE_SECONDS, crash_at="complete.after_insert")
    clock.set(START + 9)
    yield "three silent lease expiries, not yet noticed by a claim"
    queue.enqueue_jsonl(_line("E0503", "book", 400))
    drain(queue, Handler())   # its first claim moves E0502 to dead, then E0503 is done
    yield "three silent lease expiries, then a claim"


def reference_cases(queue: Queue) -> Iterator[str]:
    """The reference scenario's end, then E0004 redriven twice: without and with the fix."""
    _load_reference(queue)
    yield "the reference scenario (E0004, unknown category)"
    queue.redrive("E0004")
    process_one(queue, Handler())
    yield "E0004 redriven without the fix, dead again"
    queue.redrive("E0004")
    process_one(queue, Handler().supporting("toy"))
    yield "nothing dead (E0004 fixed)"


def malformed_cases(queue: Queue) -> Iterator[str]:
    """Three payloads the handler refuses at once, each dead after one attempt."""
    queue.enqueue_jsonl(MALFORMED)
    drain(queue, Handler())
    yield "invalid payloads (a category array, amounts true and 1.0)"


# -- exercise 6: a naive worker, ACK before INSERT, in a real process ---------------------

@dataclass(frozen=True, slots=True)
class NaiveRun:
    """How the naive worker's process ended: steps committed, exit code, first
    error; ``db`` is the queue file it ran on and ``now`` its clock, so that a
    check can tie the run to the queue it checks and replay it."""

    steps: tuple[str, ...]
    event_id: str | None
    generation: int
    committed: int
    exit_code: int
    error: str | None = None
    db: str = ""
    now: int = 0

    def __str__(self) -> str:
        if self.event_id is None:
            return ("the worker found nothing to claim (nothing is ready: run the start "
                    "cell again to start over)")
        text = (f"worker process claimed {self.event_id} (generation {self.generation}), "
                f"committed {self.committed} step{'' if self.committed == 1 else 's'}")
        if self.error:
            what = explain_sql_error(self.error)[0]
            return f"{text}, then step {self.committed + 1} failed: {what}"
        if self.exit_code == CRASH_EXIT_CODE:
            return f"{text}, then died (exit code {self.exit_code}) before the next step"
        return f"{text} and exited normally (exit code {self.exit_code})"


# What each named CHECK of the schema means, and how a naive step meets it.
_CONSTRAINTS = {
    "lease_until_iff_leased": ("a message is leased exactly when lease_until is set, so a "
                               "done row needs lease_until = NULL",
                               "set `lease_until = NULL` in the same UPDATE (Hint 2)"),
    "finished_at_iff_done": ("a message is done exactly when finished_at is set (the time "
                             "it finished, from which retention counts its age)",
                             "set `finished_at = :now` in the same UPDATE (Hint 2)"),
    "pruned_only_when_done": ("only a done message may lose its payload",
                              "leave payload alone"),
    "payload_sha256_shape": ("payload_sha256 is the 32-byte SHA-256 of the payload",
                             "leave payload_sha256 alone"),
    "state_valid": ("state is one of 'ready', 'leased', 'done' and 'dead'",
                    "write `state = 'done'`"),
    "dead_has_reason": ("a dead row needs a last_error", "mark the message 'done', not 'dead'"),
    "leased_was_claimed": ("a leased row has at least 1 attempt", "leave attempts alone"),
    "attempts_valid": ("attempts is never negative", "leave attempts alone"),
    "generation_counts_every_claim": ("generation is never below attempts",
                                      "leave generation and attempts alone"),
    "amount_in_range": ("an effect's amount_cents lies between 1 and 9999999",
                        "insert `:amount_cents`"),
    "category_named": ("an effect's category is not empty", "insert `:category`"),
}
_TABLES = ("the tables are messages (event_id, state, attempts, generation, available_at, "
           "lease_until, last_error, finished_at) and effects (event_id, category, "
           "amount_cents)")


def explain_sql_error(error: str) -> tuple[str, str]:
    """What a naive step's SQL error means, and what to change: (what, next step)."""
    check = re.search(r"CHECK constraint failed: (\w+)", error)
    if check and check.group(1) in _CONSTRAINTS:
        meaning, fix = _CONSTRAINTS[check.group(1)]
        kind = error.split(":", 1)[0]
        return (f"the schema's CHECK constraint {check.group(1)} refused it ({kind}): "
                f"{meaning}", fix)
    known = [("UNIQUE constraint failed: effects", "the event already has an effect: effects "
              "holds one row per event (its primary key)", "insert the effect once, in step 2"),
             ("FOREIGN KEY constraint failed", "an effect must belong to a stored message",
              "insert `:event_id` as the effect's event_id"),
             ("NOT NULL constraint failed", "a column that needs a value got none",
              "give every column a value: `:event_id`, `:category`, `:amount_cents`"),
             ("one statement at a time", "a step holds more than one statement",
              "give each statement its own string in the list"),
             ("syntax error", "it is not valid SQL", "fix that step's SQL; Hint 3 shows both "
              "statements"),
             ("incomplete input", "it is not valid SQL", "fix that step's SQL"),
             ("no such", "a name it uses does not exist", _TABLES),
             ("binding", "it names a parameter that is not given", "use only `:event_id`, "
              "`:generation`, `:category`, `:amount_cents` and `:now`")]
    for needle, meaning, fix in known:
        if needle in error:
            return f"{meaning} ({error})", fix
    return error, "fix that step, then run the start cell and the worker cell again"


def run_naive_worker(queue: Any, steps: Any, *, crash_after: int = 1) -> NaiveRun | None:
    """Claim one message in a separate OS process, run each SQL step in its own
    committed transaction, and die by ``os._exit`` after step ``crash_after``.

    Steps get the parameters ``:event_id``, ``:generation``, ``:category``,
    ``:amount_cents`` and ``:now``. ``crash_after=0`` never crashes. Prints
    what happened and returns it; prints why instead (and returns ``None``)
    if there is nothing to run.
    """
    if steps is None:
        print("Nothing to run yet: replace None with your list of SQL steps")
        return None
    if not isinstance(steps, (list, tuple)) or not all(isinstance(s, str) for s in steps):
        print(f"Cannot run: steps must be a list of SQL strings, found {type(steps).__name__}")
        return None
    refused = queue_refused(queue, 6)
    if refused:
        print(f"Cannot run: {refused}")
        return None
    run = run_naive_quietly(queue, tuple(steps), crash_after)
    print(run)
    return run


def run_naive_quietly(queue: Queue, steps: tuple[str, ...], crash_after: int) -> NaiveRun:
    """``run_naive_worker`` without the printing: start the process, wait, report."""
    witness = getattr(queue, "witness", None)  # the child signs its calls as q6 does
    spec = {"db": os.path.abspath(queue.path), "now": queue.clock.now(),
            "lease_seconds": queue.lease_seconds, "steps": list(steps), "crash_after": crash_after,
            "witness": witness.spec() if witness is not None else None}
    package_parent = str(Path(__file__).resolve().parents[3])  # holds queue_core/
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_parent, *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-m", "queue_core.lab.exercises.setup", json.dumps(spec)],
                          capture_output=True, text=True, env=env, check=False)
    report: dict[str, Any] = {"event_id": None, "generation": 0, "committed": 0, "error": None}
    for line in done.stdout.splitlines():
        report.update(json.loads(line))
    if done.returncode not in (0, CRASH_EXIT_CODE):
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        report["error"] = (report["error"]
                           or f"the process exited with {done.returncode}: {last[:100]}")
    return NaiveRun(steps, report["event_id"], report["generation"], report["committed"],
                    done.returncode, report["error"], db=spec["db"], now=spec["now"])


def naive_worker(spec: dict[str, Any]) -> int:
    """The child's side of ``run_naive_worker``: a real claim, then naive steps."""
    options = {"clock": ModelClock(spec["now"]), "lease_seconds": spec["lease_seconds"]}
    witness = Witness.from_spec(spec["witness"]) if spec.get("witness") else None
    queue = queue_signing_as(witness, spec["db"], **options)
    lease = queue.claim()
    if lease is None:
        return 0
    effect = Handler().effect_of(json.loads(queue.message(lease.event_id).payload))
    print(json.dumps({"event_id": lease.event_id, "generation": lease.generation}), flush=True)
    params = {"event_id": lease.event_id, "generation": lease.generation, "now": spec["now"],
              "category": effect.category, "amount_cents": effect.amount_cents}
    try:
        with queue.session():
            for number, sql in enumerate(spec["steps"], start=1):
                with signed_as(queue, "naive step"), queue.transaction() as conn:
                    conn.execute(sql, params)  # each step commits on its own: the naive part
                print(json.dumps({"committed": number}), flush=True)
                if number == spec["crash_after"]:
                    os._exit(CRASH_EXIT_CODE)  # a real death: no finally, no cleanup
    except sqlite3.Error as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(naive_worker(json.loads(sys.argv[1])))
