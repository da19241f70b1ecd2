"""The check of exercise 5: the learner's own metric of the attempts dead
messages spent, run on prepared databases and compared with
``Queue.metrics().dead_attempts``, the answer key.

Accepted: a function ``db_path -> mapping`` whose result is any mapping
(``dict``, ``OrderedDict``, ``Counter``, ...) of event ids (``str``) to
attempts (``int``, not ``bool`` or ``float``), ``{}`` when nothing is dead,
in any order. Refused, each with what to change: a list of pairs, a pandas
Series, ``None``; a function that raises; one that writes to the database it
measures (a statement that would write, even one that changes no value, or
a commit by any connection: ``PRAGMA data_version``; a pragma that changes
the file, such as ``PRAGMA journal_mode=DELETE``, named as such, not by the
``database is locked`` that SQLite answers it with); and one that reaches
the answer key another way than SQL of its own: a call into ``queue_core``
at all, from any thread (``Queue.metrics()`` and ``audit.read_metrics`` are
the very key the answer is compared with), or a child process of any kind
(the CLI's ``metrics``, or a script that calls the package). ``watch`` says
how the function is watched
while it runs; nothing is replaced.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Mapping
from typing import Any, Callable

from ...audit import Snapshot, snapshot
from ...queue import Queue
from .setup import fresh, malformed_cases, reference_cases, silent_and_transient
from .verdicts import NOT_QUITE, SOLVED, NotAttempted, Verdict, checked, plain
from .watch import FILE_PRAGMAS, Watched, watched

__all__ = ["check_5"]

_ANSWER_KEY = ("metrics", "read_metrics")  # Queue.metrics(), audit.read_metrics()
_ONLY_READ = ("only read: `sqlite3.connect` and a SELECT; no CREATE, INSERT, UPDATE or DELETE, "
              "no claim")
_OWN_SQL = ("write your own SELECT on the messages table with `sqlite3.connect(db_path)` "
            "(Hint 1), without queue_core")
_ROWS = ("look at that case's rows (`SELECT event_id, state, attempts, generation, last_error "
         "FROM messages`) and fix your SELECT")
Problem = tuple[str, str]  # what is wrong, what to do next


def check_5(dead_attempts: Any) -> Verdict:
    """Compare ``dead_attempts(db_path) -> {event_id: attempts}`` against
    ``Queue.metrics().dead_attempts`` on several prepared databases."""
    def body() -> Verdict:
        if dead_attempts is None:
            raise NotAttempted("replace None with your function db_path -> {event_id: attempts}")
        if not callable(dead_attempts):
            return Verdict(5, NOT_QUITE, f"expected a function, found {plain(dead_attempts)}",
                           "define `def dead_attempts(db_path): ...` and pass the function")
        cases = 0
        with tempfile.TemporaryDirectory(prefix="queue-exercise-5-") as workdir:
            for name, stages in (("reference", reference_cases), ("silent", silent_and_transient),
                                 ("malformed", malformed_cases)):
                queue = fresh(workdir, name)
                for case in stages(queue):
                    cases += 1
                    problems = _trial(dead_attempts, queue, case)
                    if problems:
                        return Verdict(5, NOT_QUITE, "; ".join(p for p, _ in problems),
                                       problems[0][1])
        return Verdict(5, SOLVED, f"your metric matches Queue.metrics().dead_attempts on all "
                                  f"{cases} prepared databases, silent expiries included")
    return checked(5, body)


def _trial(fn: Callable[[str], Any], queue: Queue, case: str) -> list[Problem]:
    """Run the learner's metric on one prepared database: what is wrong, if anything."""
    expected = dict(queue.metrics().dead_attempts)   # the answer key, read before the run
    before = snapshot(queue.path)
    witness = sqlite3.connect(queue.path)  # held open: sees any commit by another connection
    try:
        version = _data_version(witness)
        seen = watched(fn, queue.path)
        committed = _data_version(witness) != version
    finally:
        witness.close()
    where = f"on '{case}'"
    problems = _answer_key(seen)   # first: how the answer was reached, whatever came of it
    changes = [p for p in seen.pragmas if p.split("=", 1)[0].lower() in FILE_PRAGMAS
               and p.lower().strip("'\"") != "journal_mode=wal"]  # the queue's own mode
    if changes:
        problems.append(_file_pragma(where, changes[0], seen.error))
    elif seen.error is not None:
        problems.append((f"{where} your function raised {plain(seen.error)}",
                         "run it on q5.path in a cell of its own to see where it fails"))
    if seen.writes:
        problems.append((f"{where} your function writes to the database it measures "
                         f"({', '.join(seen.writes)}): a metric only reads, even a write that "
                         "changes no value", _ONLY_READ))
    elif committed or snapshot(queue.path) != before:
        problems.append((f"{where} your function changed the database it measures (a "
                         "metric only reads)", _ONLY_READ))
    if not problems:
        problems += _unseen_child(seen)
    if not problems:
        problems += _result_problems(where, seen.result, expected, before)
    return problems


def _file_pragma(where: str, pragma: str, error: BaseException | None) -> Problem:
    """A pragma that asks SQLite to change the file itself (its journal mode, ...),
    and, when it failed, why: SQLite changes a WAL file's journal mode only with
    no other connection open on it, and the check holds one."""
    name = pragma.split("=", 1)[0]
    said = f"{where} your function ran `PRAGMA {pragma}`, which changes the file it measures " \
           f"(its {name}), not only reads it"
    locked = isinstance(error, sqlite3.OperationalError) and "locked" in str(error)
    if locked and name.lower() == "journal_mode":
        said += (": SQLite changes a WAL file's journal mode only when no other connection "
                 "has the file open, and the check holds one open, so it raised "
                 f"{plain(error)}")
    elif error is not None:
        said += f", and it raised {plain(error)}"
    return said, f"remove the PRAGMA and {_ONLY_READ}"


def _data_version(conn: sqlite3.Connection) -> int:
    """SQLite's count of commits by other connections, as this one has seen them."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _answer_key(seen: Watched) -> list[Problem]:
    """The answer key reached another way than SQL of one's own: a call into
    queue_core, or queue_core run in a child process (its command line)."""
    problems: list[Problem] = []
    if seen.entered:
        calls = ", ".join(dict.fromkeys(_call_name(name) for name in seen.entered))
        key = [n for n in seen.entered if n.rsplit(".", 1)[-1] in _ANSWER_KEY]
        said = (f": {_call_name(key[0])} is the answer key your result is compared with" if key
                else " instead of reading with SQL of its own")
        problems.append((f"your function calls into queue_core ({calls}){said}", _OWN_SQL))
    if seen.package_opened and not seen.entered:  # from a thread of its own
        problems.append(("your function reached queue_core from another thread (the package "
                         "opened the database itself while your function ran) instead of "
                         "reading with SQL of its own", _OWN_SQL))
    for run, shown in seen.children:
        if "queue_core" in run or "queue-core" in run:
            said = (": its metrics command is the answer key your result is compared with"
                    if "metrics" in run else " instead of reading with SQL of its own")
            problems.append((f"your function runs queue_core in a child process (`{shown}`)"
                             f"{said}", _OWN_SQL))
        break
    return problems


def _unseen_child(seen: Watched) -> list[Problem]:
    """A child process that does not run queue_core by its command line: what it runs
    cannot be watched (a script that calls the package, say), so it is refused
    too; named after what the check did see of it, if anything."""
    for run, shown in seen.children:
        if "queue_core" not in run and "queue-core" not in run:
            return [(f"your function runs a child process (`{shown}`), whose work this "
                     "check cannot see (it could run queue_core's metrics, the answer key) "
                     "instead of reading with SQL of its own", _OWN_SQL)]
    return []


def _call_name(qualname: str) -> str:
    """How the learner wrote the call: ``Queue()``, ``Queue.metrics()`` (whichever
    class of the engine defines it), ``snapshot()``."""
    last = qualname.rsplit(".", 1)[-1]
    if last == "metrics":
        return "Queue.metrics()"
    return qualname.removesuffix(".__init__") + "()"


def _result_problems(where: str, found: Any, expected: dict[str, int],
                     stored: Snapshot) -> list[Problem]:
    """The result's form, then its values against the answer key."""
    mapping, form = _as_mapping(found)
    if form is not None:
        return [(f"{where} your function returned {form[0]}", form[1])]
    if mapping == expected:
        return []
    why, step = _diagnose(mapping, expected, stored)
    return [(f"{where} expected {expected}, found {dict(sorted(mapping.items()))}: {why}", step)]


_DICT = "not a dict {event_id: attempts}"


def _as_mapping(found: Any) -> tuple[dict[str, int], Problem | None]:
    """The result as a dict, or what form it has instead of a mapping of str to int."""
    if found is None:
        return {}, (f"None, {_DICT}", "return the dict, `{}` when nothing is dead")
    kind = f"a {type(found).__name__}"
    if hasattr(found, "to_dict") and not isinstance(found, Mapping):  # pandas
        return {}, (f"{kind}, {_DICT}", "return a dict, e.g. `dict(zip(frame.event_id, "
                                        "frame.attempts))` or `series.to_dict()`")
    if not isinstance(found, Mapping):
        pairs = isinstance(found, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in found)
        if pairs:
            return {}, (f"{kind} of pairs, {_DICT}", "return `dict(rows)`: a dict (any "
                                                     "mapping is accepted), not the rows")
        return {}, (f"{kind}, {_DICT}", "return a dict {event_id: attempts}")
    for key, value in found.items():
        if not isinstance(key, str):
            return {}, (f"a key that is no event id: {plain(key)}",
                        "use the event ids (text such as 'E0004') as keys")
        if type(value) is not int:
            return {}, (f"attempts that are not a whole number: {plain(value)} for {key}",
                        "return the stored attempts as they are (int)")
    return dict(found), None


def _diagnose(found: dict[str, int], expected: dict[str, int],
              stored: Snapshot) -> tuple[str, str]:
    """Why the values differ, from the stored rows of that case, and what to change."""
    for event_id in sorted(set(found) - set(expected)):
        message = stored.messages.get(event_id)
        if message is None:
            return (f"{event_id} is not in this database at all",
                    "read the file your function is given (`db_path`), do not return figures "
                    "of your own")
        return (f"it counts {event_id}, which is stored {message.state}, not dead",
                "ask the stored state: `WHERE state = 'dead'` (Hint 3)")
    for event_id in sorted(set(expected) - set(found)):
        message = stored.messages[event_id]
        return (f"it misses {event_id} (dead, last error {message.last_error})",
                "count every dead message, whatever its last_error")
    wrong = sorted(e for e in expected if found[e] != expected[e])
    message = stored.messages[wrong[0]]
    if found[wrong[0]] == message.generation:
        return (f"the value of {wrong[0]} is its generation, not the attempts of this cycle",
                "count `attempts`, not `generation` (Hint 2)")
    return f"{wrong[0]} has {expected[wrong[0]]} attempts, not {found[wrong[0]]}", _ROWS
