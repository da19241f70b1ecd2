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

from ..audit import Snapshot, check, snapshot
from ..errors import QueueError, UnusableFile
from ..queue import Queue
from ..storage import inspect
from .exercise_setup import STARTS

SOLVED, NOT_QUITE, NOT_ATTEMPTED = "solved", "not_quite", "not_attempted"
_PREFIX = {SOLVED: "Solved", NOT_QUITE: "Not quite", NOT_ATTEMPTED: "Not attempted yet"}
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/][^\s'\"]*[\\/][^\s'\"]*")


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
    """Read a queue's stored facts at one moment, read-only (``target``: Queue or path)."""
    path = path_of(target)
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise NotAttempted(f"pass the queue your `q{number} = exercises.start_{number}(workdir)` "
                           "cell returned")
    again = f"pass q{number}, the queue `exercises.start_{number}(workdir)` returned"
    try:
        kind = inspect(path)
    except UnusableFile as exc:
        raise Stop(f"that file is not a queue database ({exc.code})", again) from None
    if kind != "queue":
        raise Stop("that file holds no queue yet", again)
    return snapshot(path)


def _fingerprint(world: Snapshot) -> tuple[Any, ...]:
    return (len(world.journal), len(world.messages), len(world.effect_rows), world.status.total,
            tuple(sorted(world.status.states.items())))


@lru_cache(maxsize=None)
def _start_fingerprint(start: Callable[[str], Queue]) -> tuple[Any, ...]:
    with tempfile.TemporaryDirectory(prefix="queue-exercise-") as workdir:
        return _fingerprint(snapshot(start(workdir).path))


def untouched(world: Snapshot, number: int,
              start: Callable[[str], Queue] | None = None) -> bool:
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


def show(queue: Queue) -> None:
    """Print the queue's figures (the clock's time first)."""
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


def bypassed(world: Snapshot, found: Findings, ignore: Callable[[Any], bool] = lambda f: False
             ) -> None:
    """What the shared audit finds: rows changed around the protocol (an edited
    effect, an effect written without a worker, a state the journal never
    recorded). A right total reached that way is not a solution."""
    problems = [f for f in check(world) if not ignore(f)]
    if problems:
        found.add("a hand edit: the audit found " + "; ".join(str(f) for f in problems)
                  + " (a change made around the protocol, with SQL of your own)",
                  f"run `start_{found.number}` again and change the queue only through its "
                  "calls", first=True)


def nudge(world: Snapshot, found: Findings) -> None:
    """One item for messages still waiting for a worker (``ready``), if any."""
    waiting = sorted(e for e, m in world.messages.items() if m.state == "ready")
    if waiting:
        one = len(waiting) == 1
        found.add(f"{', '.join(waiting)} {'is' if one else 'are'} ready: no worker has "
                  f"processed {'it' if one else 'them'} yet",
                  f"run a worker, e.g. `drain(q{found.number}, handler)`")


def used_start(world: Snapshot, number: int, event_id: str,
               what: str = "a claim now finds nothing") -> Stop:
    """Why nothing could be claimed: the start was used by an earlier run of the cell."""
    stored = world.messages.get(event_id)
    state = stored.state if stored else "gone"
    return Stop(f"{event_id} is already {state} from an earlier run of your cell, so {what}",
                f"run `start_{number}` again, then your cells once")


def refusal(label: str, error: Any, code: str, found: Findings, *, keep: str,
            other: str | None = None, event_id: str | None = None,
            line: int | None = None) -> bool:
    """Add what is wrong with a recorded refusal (an exception the learner kept).

    ``keep`` is the next step when none was kept (how the cell keeps it),
    ``other`` when it is another refusal than the one asked for. True if
    nothing was wrong.
    """
    if error is None:
        found.add(f"{label}: expected a {code} refusal, found none", keep)
    elif not isinstance(error, QueueError):
        found.add(f"{label}: expected a {code} refusal (the exception itself), found "
                  f"{plain(error)}", keep)
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
