"""Self-checking exercises: a known starting state for each, and a check that never raises.

    >>> from queue_core.lab import exercises
    >>> q1 = exercises.start_1(workdir)           # the reference scenario's final state
    >>> exercises.check_1(q1, edit_refusal)       # prints one verdict and returns it

Each ``check_N`` prints exactly one line, ``Solved: ...``, ``Not quite: ...``
(which figure, expected and found) or ``Not attempted yet: ...``, and returns
a ``Verdict`` whose ``status`` is ``solved``, ``not_quite`` or
``not_attempted``. It catches everything, a ``None`` placeholder included,
and only reads the database. Money, effect count and states are checked
together: a right total with a lost message is not solved.

EXERCISES.md describes the exercises; notebook 09 runs them; the reference
solutions are in ``notebooks/solutions``. ``start_N(workdir)`` builds its
state on a fresh file in ``workdir`` (running it again starts over).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from ..audit import Snapshot, check, snapshot
from ..crashpoints import CRASH_EXIT_CODE
from ..errors import QueueError, UnusableFile
from .exercise_setup import (E0001_PAYLOAD, STARTS, NaiveRun, fresh, malformed_cases,
                             reference_cases, run_naive_quietly, run_naive_worker,
                             silent_and_transient, start_1, start_2, start_3, start_4, start_5,
                             start_6)
from ..queue import Queue
from ..storage import inspect
from ..values import Effect, Lease, Status

__all__ = [
    "NOT_ATTEMPTED", "NOT_QUITE", "NaiveRun", "SOLVED", "Verdict", "WHY_WHOLE_BATCH",
    "check_1", "check_2", "check_3", "check_4", "check_5", "check_6", "figures",
    "run_naive_worker", "show", "start_1", "start_2", "start_3", "start_4", "start_5", "start_6",
]

SOLVED, NOT_QUITE, NOT_ATTEMPTED = "solved", "not_quite", "not_attempted"
_PREFIX = {SOLVED: "Solved", NOT_QUITE: "Not quite", NOT_ATTEMPTED: "Not attempted yet"}
WHY_WHOLE_BATCH = "b"  # the right choice in exercise 2 (EXERCISES.md explains it)
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/][^\s'\"]*[\\/][^\s'\"]*")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a check found: ``status`` is ``solved``, ``not_quite`` or ``not_attempted``."""

    exercise: int
    status: str
    detail: str

    @property
    def text(self) -> str:
        return f"{_PREFIX[self.status]}: {self.detail}"

    def __str__(self) -> str:
        return self.text

    def _ipython_display_(self) -> None:
        """Show nothing more: the check has already printed the verdict once."""


# -- reading what the learner's database holds ------------------------------------

class _NotAttempted(Exception):
    """Raised inside a check to give the ``not_attempted`` verdict."""


def _read(target: Any) -> Snapshot:
    """Read a queue's stored facts at one moment, read-only (``target``: Queue or path)."""
    path = target.path if isinstance(target, Queue) else target
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise _NotAttempted("pass the queue its start_N() cell returned")
    try:
        if inspect(path) != "queue":
            raise ValueError("that file holds no queue yet")
    except UnusableFile as exc:
        raise ValueError(f"that file is not a queue database ({exc.code})") from None
    return snapshot(path)


def _fingerprint(world: Snapshot) -> tuple[Any, ...]:
    return (len(world.journal), len(world.messages), len(world.effect_rows), world.status.total,
            tuple(sorted(world.status.states.items())))


@lru_cache(maxsize=None)
def _start_fingerprint(number: int) -> tuple[Any, ...]:
    with tempfile.TemporaryDirectory(prefix="queue-exercise-") as workdir:
        return _fingerprint(_read(STARTS[number](workdir)))


def _untouched(world: Snapshot, number: int) -> bool:
    # Exercises 1 to 3 share one start (the reference scenario's end): build it once.
    return _fingerprint(world) == _start_fingerprint(1 if number <= 3 else number)


def figures(target: Any) -> str:
    """One line of the figures every check compares: money, effects, states."""
    status = target.status() if isinstance(target, Queue) else target
    totals = ", ".join(f"{name} {cents}" for name, cents in status.totals.items())
    states = ", ".join(f"{name} {count}" for name, count in status.states.items())
    money = f"total {status.total} ({totals})" if totals else f"total {status.total}"
    return f"{money}; effects {status.effects}; {states}"


def show(queue: Queue) -> None:
    """Print the queue's figures (the clock's time first)."""
    print(f"t={queue.clock.now()} {figures(queue)}")


# -- comparing ----------------------------------------------------------------------

def _compare(world: Snapshot, total: int, effects: int, states: Mapping[str, int]) -> list[str]:
    """Money, effect count and every state together: each mismatch as text."""
    wrong = []
    if world.status.total != total:
        wrong.append(f"total expected {total}, found {world.status.total}")
    if world.status.effects != effects:
        wrong.append(f"effects expected {effects}, found {world.status.effects}")
    for state, count in states.items():
        found = world.status.states.get(state, 0)
        if found != count:
            wrong.append(f"{state} expected {count}, found {found}")
    return wrong


def _bypassed(world: Snapshot, number: int) -> list[str]:
    """What the shared audit finds: rows changed around the protocol (an edited
    effect, an effect written without a worker, a state the journal never
    recorded). A right total reached that way is not a solution."""
    found = check(world)
    if not found:
        return []
    return ["the audit found " + "; ".join(str(finding) for finding in found)
            + f" (a change made around the protocol: run `start_{number}` again and use "
              "the queue's calls)"]


def _nudge(world: Snapshot, number: int) -> list[str]:
    """One line for messages still waiting for a worker (``ready``), if any."""
    waiting = sorted(e for e, m in world.messages.items() if m.state == "ready")
    if not waiting:
        return []
    return [f"{', '.join(waiting)} {'is' if len(waiting) == 1 else 'are'} ready: no worker has "
            f"processed {'it' if len(waiting) == 1 else 'them'} yet (run a worker, "
            f"e.g. drain(q{number}, handler))"]


def _used_start(world: Snapshot, number: int, event_id: str,
                what: str = "a claim now finds nothing") -> str:
    """Why nothing could be claimed: the start was used by an earlier run of the cell."""
    stored = world.messages.get(event_id)
    state = stored.state if stored else "gone"
    return (f"{event_id} is already {state} from an earlier run of your cell, so {what}: "
            f"run `start_{number}` again, then your cells once")


def _refusal(label: str, error: Any, code: str, event_id: str,
             line: int | None = None) -> list[str]:
    """What is wrong with a recorded refusal (an exception the learner caught)."""
    if error is None:
        return [f"{label}: expected a {code} refusal, found none (run that cell)"]
    if not isinstance(error, QueueError):
        return [f"{label}: expected a {code} refusal, found {type(error).__name__}"]
    if error.code != code:
        return [f"{label}: code expected {code}, found {error.code}"]
    if getattr(error, "event_id", event_id) != event_id:
        return [f"{label}: event expected {event_id}, found {getattr(error, 'event_id')}"]
    if line is not None and getattr(error, "line", None) != line:
        return [f"{label}: line expected {line}, found {getattr(error, 'line', None)}"]
    return []


def _states(ready: int = 0, leased: int = 0, done: int = 0, dead: int = 0) -> dict[str, int]:
    return {"ready": ready, "leased": leased, "done": done, "dead": dead}


def _checked(number: int, body: Callable[[], Verdict]) -> Verdict:
    """Run a check body; whatever happens, print one verdict and return it."""
    try:
        verdict = body()
    except _NotAttempted as exc:
        verdict = Verdict(number, NOT_ATTEMPTED, str(exc))
    except (Exception, SystemExit) as exc:  # a check never raises into the learner's cell
        verdict = Verdict(number, NOT_QUITE, f"the check could not finish: {_plain(exc)}")
    print(verdict.text)
    return verdict


def _plain(value: Any) -> str:
    """A short description that is the same on every run: no paths, no addresses."""
    if isinstance(value, BaseException):
        return _PATH.sub("<path>", f"{type(value).__name__}: {value}")[:120]
    if value is None or isinstance(value, (bool, int, float, str, list, tuple, dict, set)):
        return _PATH.sub("<path>", repr(value))[:60]
    return f"a {type(value).__name__}"


def _verdict(number: int, wrong: list[str], solved: str) -> Verdict:
    if wrong:
        return Verdict(number, NOT_QUITE, "; ".join(wrong))
    return Verdict(number, SOLVED, solved)


# -- the checks -----------------------------------------------------------------------

def check_1(queue: Any, edit_refusal: Any = None) -> Verdict:
    """Total 19000 by a NEW event, E0001 untouched, its edit refused (``batch_conflict``)."""
    def body() -> Verdict:
        world = _read(queue)
        if edit_refusal is None and _untouched(world, 1):
            raise _NotAttempted("try the edit of E0001 first, then add a new event and process it")
        wrong = _compare(world, 19000, 4, _states(done=4, dead=1))
        wrong += _refusal("the edit of E0001", edit_refusal, "batch_conflict", "E0001")
        stored = world.messages.get("E0001")
        if stored is None or stored.payload != E0001_PAYLOAD:
            wrong.append(f"E0001's payload expected {E0001_PAYLOAD}, "
                         f"found {stored.payload if stored else 'no message'}")
        new = sorted(set(world.messages) - {"E0001", "E0002", "E0003", "E0004"})
        if not new:
            wrong.append("a new event id expected, found none")
        elif len(new) > 1:
            wrong.append(f"one correction event expected (a single new event of 2000: the 3 "
                         f"effects of the start plus 1), found {len(new)}: {', '.join(new)}")
        wrong += _nudge(world, 1) + _bypassed(world, 1)
        return _verdict(1, wrong, "E0001 stayed as accepted (its edit was refused: "
                                  f"batch_conflict) and {', '.join(new)} added the difference: "
                                  f"{figures(world.status)}")
    return _checked(1, body)


def check_2(queue: Any, conflict_refusal: Any = None, why: Any = None) -> Verdict:
    """The conflicting batch refused whole (line 2, E0001), E0005 absent, 17000 kept."""
    def body() -> Verdict:
        world = _read(queue)
        if conflict_refusal is None and why is None and _untouched(world, 2):
            raise _NotAttempted("enqueue the conflicting batch and keep what it raises")
        wrong = _compare(world, 17000, 3, _states(done=3, dead=1))
        if "E0005" in world.messages:
            wrong.append(f"E0005 expected absent, found {world.messages['E0005'].state}")
        wrong += _refusal("the conflicting batch", conflict_refusal, "batch_conflict", "E0001", 2)
        wrong += _letter(why)
        wrong += _bypassed(world, 2)
        return _verdict(2, wrong, "the batch was refused whole at line 2 (batch_conflict on "
                                  f"E0001), so E0005 was not added: {figures(world.status)}")
    return _checked(2, body)


def _letter(why: Any) -> list[str]:
    """What is wrong with the chosen explanation (a letter, any case, spaces ignored)."""
    chosen = why.strip().strip(")").lower() if isinstance(why, str) else None
    if chosen == WHY_WHOLE_BATCH:
        return []
    if chosen in ("a", "b", "c"):
        return [f"why the whole batch goes: you chose {chosen}), which is not the right "
                "explanation (Hint 3 in EXERCISES.md)"]
    return [f"why the whole batch goes: expected one of the letters a, b or c, found "
            f"{_plain(why)}"]


def check_3(queue: Any) -> Verdict:
    """E0004 done by the newer handler after a redrive: 20000, effects 4, done 4, dead 0."""
    def body() -> Verdict:
        world = _read(queue)
        if _untouched(world, 3):
            raise _NotAttempted("add toy support, redrive E0004, then run a worker")
        wrong = _compare(world, 20000, 4, _states(done=4))
        toy = world.effects.get("E0004")
        if toy != Effect("toy", 3000):
            wrong.append(f"E0004's effect expected toy 3000, found {toy or 'none'}")
        redrives = sum(t.reason == "redrive" for t in world.journal if t.event_id == "E0004")
        if redrives == 0:
            wrong.append("a redrive of E0004 expected, found none")
        wrong += _nudge(world, 3) + _bypassed(world, 3)
        wasted = "" if redrives < 2 else f" ({redrives - 1} redrive before the fix went dead again)"
        return _verdict(3, wrong,
                        f"toy support first, then redrive: {figures(world.status)}{wasted}")
    return _checked(3, body)


def _stalled(world: Snapshot, event_id: str) -> list[int]:
    """Generations whose lease ran out unfinished: a later claim journalled it expired."""
    return [t.generation for t in world.journal
            if t.event_id == event_id and t.reason == "lease_expired"]


def _stale(label: str, part: Any, world: Snapshot, after_redrive: bool) -> list[str]:
    """What is wrong with a (stalled lease, refusal) pair of exercise 4."""
    if part is None:
        return [f"{label}: expected (stalled lease, refusal), found None"]
    if not isinstance(part, tuple) or len(part) != 2 or not isinstance(part[0], Lease):
        return [f"{label}: expected a pair (stalled lease, refusal), found {type(part).__name__}"]
    lease, error = part
    wrong = _refusal(label, error, "stale_generation", lease.event_id)
    stalled = _stalled(world, lease.event_id)
    if lease.generation not in stalled:
        asked = (f"W{stalled[0]}, generation {stalled[0]}, whose lease expired while it "
                 "stalled" if stalled else "a worker whose lease expired while it stalled "
                 "(let the clock pass its lease_until before the next claim)")
        return wrong + [f"{label}: your refusal came from W{lease.generation}'s lease "
                        f"(generation {lease.generation}, attempt {lease.attempt}); the "
                        f"exercise asks for the stalled worker's: {asked}"]
    stored = world.messages.get(lease.event_id)
    if stored is not None and stored.generation <= lease.generation:
        wrong.append(f"{label}: generation of {lease.event_id} expected above the stalled "
                     f"lease's {lease.generation}, found {stored.generation}")
    redriven = [t.generation for t in world.journal
                if t.event_id == lease.event_id and t.reason == "redrive"]
    if after_redrive and not any(lease.generation <= g for g in redriven):
        wrong.append(f"{label}: expected the stalled lease (generation {lease.generation}) "
                     f"to be older than a redrive of {lease.event_id}, found "
                     f"{'no redrive' if not redriven else 'it was taken after the redrive'}")
    return wrong


def check_4(queue: Any, before_redrive: Any = None, after_redrive: Any = None) -> Verdict:
    """A stalled worker's late ACK refused (``stale_generation``), also after a redrive;
    E0004 finally done once: total 3000, effects 1, done 1."""
    def body() -> Verdict:
        world = _read(queue)
        if before_redrive is None and after_redrive is None and _untouched(world, 4):
            raise _NotAttempted("let a stalled worker's lease expire, then try its late ACK")
        parts = (before_redrive, after_redrive)
        no_lease = any(isinstance(p, tuple) and p and p[0] is None for p in parts)
        story_over = parts == (None, None) and world.status.states.get("done") == 1
        if no_lease or story_over:  # the cell ran again on a used start: claims found nothing
            return Verdict(4, NOT_QUITE, _used_start(world, 4, "E0004"))
        wrong = _compare(world, 3000, 1, _states(done=1))
        wrong += _stale("before the redrive", before_redrive, world, after_redrive=False)
        wrong += _stale("after the redrive", after_redrive, world, after_redrive=True)
        wrong += _nudge(world, 4) + _bypassed(world, 4)
        late = after_redrive[0] if not wrong else None
        stalled = f"generation {late.generation}, attempt {late.attempt}" if late else ""
        return _verdict(4, wrong, f"the generation fenced the stalled lease ({stalled}) before "
                                  f"and after a redrive: {figures(world.status)}")
    return _checked(4, body)


def _as_mapping(found: Any) -> dict[str, int] | None:
    try:
        mapping = dict(found)
    except (TypeError, ValueError):
        return None
    return mapping if all(isinstance(k, str) for k in mapping) else None


def _trial(fn: Callable[[str], Any], queue: Queue, case: str) -> str | None:
    """Run the learner's metric on one prepared database; what is wrong, or None."""
    expected = dict(queue.metrics().dead_attempts)   # the answer key
    before = snapshot(queue.path)
    try:
        found = fn(queue.path)
    except Exception as exc:  # the learner's function may fail in any way
        return f"on '{case}' your function raised {_plain(exc)}"
    if snapshot(queue.path) != before:
        return f"on '{case}' your function changed the database it measures"
    mapping = _as_mapping(found)
    if mapping != expected:
        shown = dict(sorted(mapping.items())) if mapping is not None else _plain(found)
        return f"on '{case}' expected {expected}, found {shown}"
    return None


def check_5(dead_attempts: Any) -> Verdict:
    """Compare ``dead_attempts(db_path) -> {event_id: attempts}`` against
    ``Queue.metrics().dead_attempts`` on several prepared databases."""
    def body() -> Verdict:
        if dead_attempts is None:
            raise _NotAttempted("replace None with your function db_path -> {event_id: attempts}")
        if not callable(dead_attempts):
            return Verdict(5, NOT_QUITE, f"expected a function, found {_plain(dead_attempts)}")
        cases = 0
        with tempfile.TemporaryDirectory(prefix="queue-exercise-5-") as workdir:
            for name, stages in (("reference", reference_cases), ("silent", silent_and_transient),
                                 ("malformed", malformed_cases)):
                queue = fresh(workdir, name)
                for case in stages(queue):
                    cases += 1
                    wrong = _trial(dead_attempts, queue, case)
                    if wrong:
                        return Verdict(5, NOT_QUITE, wrong)
        return Verdict(5, SOLVED, f"your metric matches Queue.metrics().dead_attempts on all "
                                  f"{cases} prepared databases, silent expiries included")
    return _checked(5, body)


def _without_crash(run: NaiveRun) -> list[str]:
    """The same steps, run to the end without a crash, must be a whole (naive) ACK."""
    with tempfile.TemporaryDirectory(prefix="queue-exercise-6-") as workdir:
        queue = start_6(workdir)
        dry = run_naive_quietly(queue, run.steps, crash_after=0)
        world = _read(queue)
    label = "your steps run to the end without a crash"
    if dry.error:
        return [f"{label}: step {dry.committed + 1} failed: {dry.error}"]
    return [f"{label}: {wrong}" for wrong in _compare(world, 5000, 1, _states(done=1))]


def check_6(queue: Any, naive_run: Any = None) -> Verdict:
    """The naive worker ACKed first and died before its INSERT: E0003 done, no effect."""
    def body() -> Verdict:
        world = _read(queue)
        if naive_run is None and _untouched(world, 6):
            raise _NotAttempted("write the naive steps, ACK first, and run the naive worker")
        if not isinstance(naive_run, NaiveRun):
            return Verdict(6, NOT_QUITE, "the naive worker's run: expected what "
                                         f"run_naive_worker returned, found {_plain(naive_run)}")
        if naive_run.event_id is None:
            return Verdict(6, NOT_QUITE, _used_start(
                world, 6, "E0003", "the naive worker found nothing to claim"))
        if naive_run.error:
            return Verdict(6, NOT_QUITE, f"step {naive_run.committed + 1} failed in the worker: "
                                         f"{naive_run.error}")
        wrong = []
        if naive_run.exit_code != CRASH_EXIT_CODE or naive_run.committed != 1:
            wrong.append(f"exit code expected {CRASH_EXIT_CODE} after step 1, found "
                         f"{naive_run.exit_code} after step {naive_run.committed}")
        wrong += _compare(world, 0, 0, _states(done=1))
        if "E0003" in world.effects:
            wrong.append("the INSERT committed first: that order doubles on a retry instead "
                         "(notebook 02); put the ACK first to see the loss")
        if not wrong:
            wrong += _without_crash(naive_run)
        return _verdict(6, wrong, "the ACK committed, then the worker died before its INSERT "
                                  f"(exit code {CRASH_EXIT_CODE}): E0003 is done, so no claim "
                                  "will ever hand it out again, and its 5000 are lost: "
                                  f"{figures(world.status)}")
    return _checked(6, body)


# Exercise 7 (a broker that redelivers, and the inbox) lives in its own module;
# it starts a Redis server only when its takeover runs.
from .exercise_inbox import TakeoverRun, check_7, run_takeover_7, start_7  # noqa: E402

__all__ += ["TakeoverRun", "check_7", "run_takeover_7", "start_7"]
