"""Self-checking exercises: a known starting state for each, and a check that never raises.

    >>> from queue_core.lab import exercises
    >>> q1 = exercises.start_1(workdir)           # the reference scenario's final state
    >>> exercises.check_1(q1, edit_refusal)       # prints one verdict and returns it

Each ``check_N`` prints exactly one line, ``Solved: ...``, ``Not quite: ...
Next: ...`` (what is wrong, with the expected and the found value, then what
to do) or ``Not attempted yet: ...`` (where to begin), and returns a
``Verdict`` whose ``status`` is ``solved``, ``not_quite`` or
``not_attempted``. It catches everything, a ``None`` placeholder included,
and only reads the learner's database. Money, effect count and states are
checked together, and so is how the answer was reached: a right total with
a lost message, a hand edit (SQL of one's own, inside the queue's own
``transaction()`` too), the answer key called or copied (or run as a child
process), a refusal, a lease or a run from another queue (or made by hand),
or another exercise's queue is not solved.

EXERCISES.md describes the exercises; notebook 09 runs them; the reference
solutions are in ``notebooks/solutions``. ``start_N(workdir)`` builds its
state on a fresh file ``exercise_N.sqlite3`` in ``workdir`` (running it
again starts over); given a folder that no longer exists, it prints what to
run and returns ``None``. This module only gathers the public names: the
shared verdict helpers are in ``verdicts``, the starts in
``setup``, the witness that ties a queue's contents to its start's calls in
``provenance``, how exercise 5 watches a learner's function in
``watch``, and the checks in one module per theme. A new exercise lives in a module of its own and joins
here with one import line and one line of ``__all__``.
"""

from __future__ import annotations

from .checks import check_1, check_2, check_3
from .crash import check_6
from .fencing import check_4
from .metric import check_5
from .setup import (NaiveRun, run_naive_worker, start_1, start_2, start_3, start_4,
                             start_5, start_6)
from .verdicts import NOT_ATTEMPTED, NOT_QUITE, SOLVED, Verdict, figures, show

__all__ = [
    "NOT_ATTEMPTED", "NOT_QUITE", "SOLVED", "Verdict", "figures", "show",
    "start_1", "check_1",
    "start_2", "check_2",
    "start_3", "check_3",
    "start_4", "check_4",
    "start_5", "check_5",
    "start_6", "check_6", "NaiveRun", "run_naive_worker",
]

# Exercise 7 (a broker that redelivers, and the inbox) lives in its own module;
# it starts a Redis server only when its takeover runs.
from .inbox import TakeoverRun, check_7, run_takeover_7, start_7  # noqa: E402

__all__ += ["TakeoverRun", "check_7", "run_takeover_7", "start_7"]

# Exercise 8 (retention: prune, and a replay that is still a duplicate).
from .retention import check_8, start_8  # noqa: E402

__all__ += ["check_8", "start_8"]
# Exercise 9 (what a worker does after a lost connection, notebook 14).
from .lostconn import CutRun, check_9, run_after_cut_9, start_9  # noqa: E402

__all__ += ["CutRun", "check_9", "run_after_cut_9", "start_9"]

# Exercise 10 (an urgent message overtakes a backlog with a priority, and the backlog
# still finishes).
from .urgent import check_10, start_10  # noqa: E402

__all__ += ["check_10", "start_10"]
