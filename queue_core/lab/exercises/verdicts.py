"""What every exercise check shares: reading the learner's database, comparing
its figures, and the one verdict a check prints.

A check collects what is wrong in a ``Findings``, each item with the step
that would fix it, and ends in exactly one ``Verdict``: ``Solved``, ``Not
quite`` (what is wrong, then ``Next:`` what to do) or ``Not attempted yet``
(where to begin). ``checked`` runs a check's body so that nothing it meets,
a learner's exception included, ever escapes into the learner's cell.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from ...audit import Snapshot, check, snapshot
from ...errors import QueueError, UnusableFile
from ...queue import Queue
from ...sqlite import inspect
from .provenance import handlers_used, provenance
from .setup import STARTS

SOLVED, NOT_QUITE, NOT_ATTEMPTED = "solved", "not_quite", "not_attempted"
_PREFIX = {SOLVED: "Solved", NOT_QUITE: "Not quite", NOT_ATTEMPTED: "Not attempted yet"}
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/][^\s'\"]*[\\/][^\s'\"]*")
_ENGINE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # queue_core/
_START_FILE = re.compile(r"exercise_(\d+)\.sqlite3")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a check found: ``status`` is ``solved``, ``not_quite`` or ``not_attempted``;
    ``next_step`` says what to do next whenever it is not ``solved``."""

    exercise: int
    status: str
    detail: str
    next_step: str = ""

    @property
    def text(self) -> str:
        text = f"{_PREFIX[self.status]}: {self.detail}"
        if self.status == NOT_QUITE and self.next_step:
            text += f". Next: {self.next_step}"
        return text

    def __str__(self) -> str:
        return self.text

    def _ipython_display_(self) -> None:
        """Show nothing more: the check has already printed the verdict once."""


class NotAttempted(Exception):
    """Raised inside a check to give the ``not_attempted`` verdict (the text: where to begin)."""


class Stop(Exception):
    """Raised inside a check to give a ``not_quite`` verdict at once."""

    def __init__(self, what: str, next_step: str) -> None:
        super().__init__(what)
        self.what, self.next_step = what, next_step


class Findings:
    """What a check found wrong, each with the step that would fix it.

    The verdict names every problem and one next step: the first one given
    with ``first=True`` (a hand edit: start over; its problem is named first
    too), else the first given, else the exercise's ``default`` step.
    """

    def __init__(self, number: int, default: str) -> None:
        self.number, self.default = number, default
        self.wrong: list[str] = []
        self._steps: list[str] = []

    def add(self, what: str, next_step: str | None = None, *, first: bool = False) -> None:
        self.wrong.insert(0, what) if first else self.wrong.append(what)
        if next_step and first:
            self._steps.insert(0, next_step)
        elif next_step:
            self._steps.append(next_step)

    def __bool__(self) -> bool:
        return bool(self.wrong)

    def verdict(self, solved: str) -> Verdict:
        if not self.wrong:
            return Verdict(self.number, SOLVED, solved)
        step = self._steps[0] if self._steps else self.default
        return Verdict(self.number, NOT_QUITE, "; ".join(self.wrong), step)


def checked(number: int, body: Callable[[], Verdict]) -> Verdict:
    """Run a check body; whatever happens, print one verdict and return it."""
    try:
        verdict = body()
    except NotAttempted as exc:
        verdict = Verdict(number, NOT_ATTEMPTED, str(exc), str(exc))
    except Stop as exc:
        verdict = Verdict(number, NOT_QUITE, exc.what, exc.next_step)
    except BaseException as exc:  # a check never raises into the learner's cell
        verdict = Verdict(number, NOT_QUITE, f"the check could not finish: {plain(exc)}",
                          f"run `start_{number}` again, then your cells once, and this check")
    print(verdict.text)
    return verdict


def plain(value: Any) -> str:
    """A short description that is the same on every run: no paths, no addresses."""
    if isinstance(value, BaseException):
        return _PATH.sub("<path>", f"{type(value).__name__}: {value}")[:160]
    if value is None or isinstance(value, (bool, int, float, str, list, tuple, dict, set)):
        return _PATH.sub("<path>", repr(value))[:80]
    return f"a {type(value).__name__}"


# -- reading what the learner's database holds ------------------------------------

def path_of(target: Any) -> Any:
    """The file of ``target``: a Queue's path, or ``target`` itself."""
    return target.path if isinstance(target, Queue) else target


def read(target: Any, number: int) -> Snapshot:
    """Read a queue's stored facts at one moment, read-only (``target``: Queue or path).

    Stops at a queue whose file is gone (its folder removed), at one that
    another exercise's start built (``start_N`` names its file
    ``exercise_N.sqlite3``): checking it would compare another story, and at
    one whose contents did not come from the package's calls on the queue
    ``start_N`` handed out in this kernel (``provenance``)."""
    path = path_of(target)
    start = f"`q{number} = exercises.start_{number}(workdir)`"
    if isinstance(target, Queue) and not os.path.isfile(path):
        raise Stop(f"q{number}'s file does not exist any more (`scratch.cleanup()` removes the "
                   "work folder)", f"run the notebook's first code cell again, then {start} "
                   "and your cells")
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise NotAttempted(f"pass the queue your {start} cell returned")
    other = exercise_of(path)
    if other is not None and other != number:
        raise Stop(f"that is exercise {other}'s queue (q{other}, built by start_{other}), not "
                   f"exercise {number}'s", f"pass q{number}, the queue {start} returned: "
                   f"`exercises.check_{number}(q{number}, ...)`")
    again = f"pass q{number}, the queue `exercises.start_{number}(workdir)` returned"
    try:
        kind = inspect(path)
    except UnusableFile as exc:
        raise Stop(f"that file is not a queue database ({exc.code})", again) from None
    if kind != "queue":
        raise Stop("that file holds no queue yet", again)
    refused = provenance(path, number, target)
    if refused is not None and refused.kind in ("foreign", "rebuilt", "record"):
        # the others (own SQL, an own handler, a hand edit) join the findings
        raise Stop(refused.what, refused.next_step)
    return snapshot(path)


def whose(path: str, number: int) -> str:
    """Which queue the file ``path`` is, said to a learner of exercise ``number``."""
    other = exercise_of(path)
    if other is None:
        return "a queue file of no exercise's start"
    if other == number:
        return f"exercise {number}'s file in another folder (or one removed since)"
    return f"exercise {other}'s queue (q{other})"


def exercise_of(path: Any) -> int | None:
    """The exercise whose start built the file ``path`` (``exercise_N.sqlite3``), if any."""
    named = _START_FILE.fullmatch(os.path.basename(os.fspath(path)))
    return int(named.group(1)) if named else None


def _fingerprint(world: Snapshot) -> tuple[Any, ...]:
    return (len(world.journal), len(world.messages), len(world.effect_rows), world.status.total,
            tuple(sorted(world.status.states.items())))


@lru_cache(maxsize=None)
def _start_fingerprint(start: Callable[[str], Queue | None]) -> tuple[Any, ...]:
    with tempfile.TemporaryDirectory(prefix="queue-exercise-") as workdir:
        queue = start(workdir)
        assert queue is not None  # a new temporary folder is always usable
        return _fingerprint(snapshot(queue.path))


def untouched(world: Snapshot, number: int,
              start: Callable[[str], Queue | None] | None = None) -> bool:
    """The start as ``start_N`` built it (exercises 1 to 3 share one start); an
    exercise whose start is not in ``STARTS`` passes its own ``start``."""
    return _fingerprint(world) == _start_fingerprint(start or STARTS[1 if number <= 3 else number])


def figures(target: Any) -> str:
    """One line of the figures every check compares: money, effects, states."""
    status = target.status() if isinstance(target, Queue) else target
    totals = ", ".join(f"{name} {cents}" for name, cents in status.totals.items())
    states = ", ".join(f"{name} {count}" for name, count in status.states.items())
    money = f"total {status.total} ({totals})" if totals else f"total {status.total}"
    return f"{money}; effects {status.effects}; {states}"


def show(queue: Any) -> None:
    """Print the queue's figures (the clock's time first)."""
    if not isinstance(queue, Queue) or not os.path.isfile(queue.path):
        print("Nothing to show: no queue (the start cell above says why)")
        return
    print(f"t={queue.clock.now()} {figures(queue)}")


# -- comparing ----------------------------------------------------------------------

def states(ready: int = 0, leased: int = 0, done: int = 0, dead: int = 0) -> dict[str, int]:
    return {"ready": ready, "leased": leased, "done": done, "dead": dead}


def compare(world: Snapshot, total: int, effects: int, expected: Mapping[str, int]) -> list[str]:
    """Money, effect count and every state together: each mismatch as text."""
    wrong = []
    if world.status.total != total:
        wrong.append(f"total expected {total}, found {world.status.total}")
    if world.status.effects != effects:
        wrong.append(f"effects expected {effects}, found {world.status.effects}")
    for state, count in expected.items():
        found = world.status.states.get(state, 0)
        if found != count:
            wrong.append(f"{state} expected {count}, found {found}")
    return wrong


def bypassed(world: Snapshot, found: Findings, queue: Any, *,
             ignore: Callable[[Any], bool] = lambda f: False, audit: bool = True,
             first: bool = True) -> None:
    """What the witness and the shared audit find: a change made around the package's
    calls on the start's queue (``provenance``: any row written, changed or deleted
    with SQL of one's own, even in the engine's exact shape), and the invariants it
    broke (an edited effect, an effect written without a worker, a state the
    journal never recorded). A right total reached that way is not a solution.
    Where the witness finds only the package's calls, the audit's findings are
    said as what they are: the calls' own doing, with a handler of the learner's
    own named when they ran one (an effect its payload does not say).
    ``audit=False`` where the exercise's own runner breaks invariants on purpose;
    ``first=False`` where the check has named the same writes already, with their
    reason and next step."""
    refused = provenance(path_of(queue), found.number, queue)
    problems = [f for f in check(world) if not ignore(f)] if audit else []
    if refused is None and not problems:
        return
    audited = "; ".join(str(f) for f in problems)
    if refused is not None:
        what = f"a hand edit: {refused.what}" + (f"; the audit also found {audited}"
                                                 if audited else "")
        found.add(what, refused.next_step, first=first)
        return
    mine = f"q{found.number}"
    own = handlers_used(path_of(queue))
    if own:  # no SQL of one's own: what the calls were given made those rows
        differs = any(f.name == "effect_differs" for f in problems)
        found.add(f"the audit found {audited}: every change came through {mine}'s calls, and "
                  f"they ran a handler of your own ({', '.join(own)}, not the course's Handler)"
                  + (", whose effects are not what their payloads say" if differs else ""),
                  f"run `start_{found.number}` "
                  "again and process with the course's Handler (`Handler()`, or "
                  "`Handler().supporting(...)`): an effect is what its payload says", first=True)
        return
    found.add(f"the audit found {audited}, though every change came through {mine}'s calls",
              f"run `start_{found.number}` again and change the queue only through its calls",
              first=True)


def nudge(world: Snapshot, found: Findings, worker: str) -> None:
    """One item for messages still waiting for a worker (``ready``), if any;
    ``worker`` is the call that processes them in this exercise's notebook cells."""
    waiting = sorted(e for e, m in world.messages.items() if m.state == "ready")
    if waiting:
        one = len(waiting) == 1
        found.add(f"{', '.join(waiting)} {'is' if one else 'are'} ready: no worker has "
                  f"processed {'it' if one else 'them'} yet", worker)


def used_start(world: Snapshot, number: int, event_id: str,
               what: str = "a claim now finds nothing") -> Stop:
    """Why nothing could be claimed: the start was used by an earlier run of the cell."""
    stored = world.messages.get(event_id)
    state = stored.state if stored else "gone"
    return Stop(f"{event_id} is already {state} from an earlier run of your cell, so {what}",
                f"run `start_{number}` again, then your cells once")


def refusal(label: str, error: Any, code: str, found: Findings, *, queue: Any, keep: str,
            other: str | None = None, event_id: str | None = None,
            line: int | None = None) -> bool:
    """Add what is wrong with a recorded refusal (an exception the learner kept).

    ``keep`` is the next step when none was kept (how the cell keeps it),
    ``other`` when it is another refusal than the one asked for. The refusal
    must have been raised by a call on ``queue`` (see ``raised_by``). True if
    nothing was wrong.
    """
    mine = f"q{found.number}"
    if error is None:
        found.add(f"{label}: expected a {code} refusal, found none", keep)
    elif not isinstance(error, QueueError):
        found.add(f"{label}: expected a {code} refusal (the exception itself), found "
                  f"{plain(error)}", keep)
    elif (origin := raised_by(error)) is None:
        found.add(f"{label}: that {error.code} was not raised by a call on {mine} (an exception "
                  "made or raised by your own code is not the queue's answer)", keep)
    elif not same_file(origin, path_of(queue)):
        found.add(f"{label}: that refusal was raised by {whose(origin, found.number)}, not by "
                  f"{mine}", f"on {mine} itself: {keep}")
    elif error.code != code:
        found.add(f"{label}: code expected {code}, found {error.code}", other)
    elif event_id is not None and getattr(error, "event_id", event_id) != event_id:
        found.add(f"{label}: event expected {event_id}, found {getattr(error, 'event_id')}",
                  other)
    elif line is not None and getattr(error, "line", None) != line:
        found.add(f"{label}: line expected {line}, found {getattr(error, 'line', None)}", other)
    else:
        return True
    return False


def raised_by(error: BaseException) -> str | None:
    """The file of the ``Queue`` whose method raised ``error``, or None.

    Read from the exception's own traceback: the first frame of a ``Queue``
    method on the way to the ``raise`` holds that queue as ``self``. An
    exception built by hand has no traceback, and one raised by the learner's
    own code passes through no queue method, so neither names a queue; one
    raised by another exercise's queue names that queue's file. Only a call
    on the learner's queue can leave that queue in the traceback.
    """
    frame = error.__traceback__
    while frame is not None:
        owner = frame.tb_frame.f_locals.get("self")
        if isinstance(owner, Queue) and frame.tb_frame.f_code.co_filename.startswith(_ENGINE):
            return owner.path
        frame = frame.tb_next
    return None


def same_file(first: Any, second: Any) -> bool:
    try:
        return os.path.samefile(first, second)
    except (OSError, TypeError, ValueError):
        return isinstance(first, str) and isinstance(second, (str, os.PathLike)) \
            and os.path.abspath(first) == os.path.abspath(second)
