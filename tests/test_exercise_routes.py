"""A catalogue of wrong routes through the exercises: each is refused, and the
verdict names what is wrong and says what to do next.

Every route is played through the same calls a learner has in notebook 09
(plain SQL on the file included, where the route is a hand edit). Where a
route reaches the right money, the figures read back through a second
connection prove it: the check refuses it for how it got there. The right
answers are in test_exercises.py.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import DATA, ROOT as ROOT_DIR
from queue_core import (BatchConflict, BatchRejected, Handler, Lease, LeaseLost, Queue, drain,
                        finish)
from queue_core.audit import snapshot
from queue_core.lab import exercises
from queue_core.lab.exercises import NOT_QUITE
from test_exercises import ACK, EDIT_E0001, INSERT, NEW_E0005, figures, sql_metric

Played = tuple[str, tuple[Any, ...]]  # the queue file checked, and the check's arguments


@dataclass(frozen=True)
class Route:
    """A wrong way through exercise ``number``, what its verdict must name, the
    next step it must give, (for a right total) the figures it reaches, and
    what the verdict must not claim (a reason that is not this route's)."""

    number: int
    name: str
    play: Callable[[Path], tuple[Any, ...]]
    says: tuple[str, ...]
    next_step: str
    reaches: tuple[int, int, dict[str, int]] | None = None
    not_says: tuple[str, ...] = ()


def sql(db: str, *statements: str) -> None:
    """Write to the queue's file with plain SQL, around every call of the queue."""
    conn = sqlite3.connect(db)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def caught(action: Callable[[], Any]) -> Exception:
    with pytest.raises((BatchRejected, LeaseLost)) as raised:
        action()
    return raised.value


def place(tmp: Path, name: str) -> Path:
    folder = tmp / name
    folder.mkdir()
    return folder


# -- exercise 1 --------------------------------------------------------------------

def one_with(tmp: Path, *lines: str, statements: tuple[str, ...] = (), work: bool = True,
             edit: bool = True) -> tuple[Any, ...]:
    queue = exercises.start_1(tmp)
    refusal = caught(lambda: queue.enqueue_jsonl(EDIT_E0001)) if edit else None
    for line in lines:
        queue.enqueue_jsonl(line)
    if work:
        drain(queue, Handler())
    sql(queue.path, *statements)
    return queue, refusal


E0005_1000 = NEW_E0005.replace("2000", "1000")
ROUTES = [
    Route(1, "hand-edit-of-e0001s-effect", lambda t: one_with(t, statements=(
        "UPDATE effects SET amount_cents = 12000 WHERE event_id = 'E0001'",)),
        ("a hand edit", "effect_differs: E0001", "effects expected 4, found 3"),
        "run `start_1` again", (19000, 3, {"done": 3, "dead": 1})),
    Route(1, "two-new-events-of-1000", lambda t: one_with(
        t, E0005_1000, E0005_1000.replace("E0005", "E0006")),
        ("one correction event expected", "E0005, E0006", "effects expected 4, found 5"),
        "ONE new event of 2000", (19000, 5, {"done": 5, "dead": 1})),
    Route(1, "new-event-of-1000-then-its-effect-edited-by-hand", lambda t: one_with(
        t, E0005_1000, statements=("UPDATE effects SET amount_cents = 2000 WHERE event_id = "
                                   "'E0005'",)),
        ("a hand edit", "effect_differs: E0005"), "run `start_1` again",
        (19000, 4, {"done": 4, "dead": 1})),
    Route(1, "effect-written-without-a-worker", lambda t: one_with(t, NEW_E0005, work=False,
        statements=("INSERT INTO effects (event_id, category, amount_cents) VALUES "
                    "('E0005', 'pen', 2000)", "UPDATE messages SET state = 'done', finished_at = 1000 "
                                              "WHERE event_id = 'E0005'")),
        ("a hand edit", "journal_disagrees: E0005"), "run `start_1` again",
        (19000, 4, {"done": 4, "dead": 1})),
    Route(1, "new-event-enqueued-but-never-processed", lambda t: one_with(t, NEW_E0005, work=False),
        ("E0005 is ready: no worker has processed it yet", "total expected 19000, found 17000"),
        "`drain(q1, Handler())`"),
    Route(1, "edit-never-tried", lambda t: one_with(t, NEW_E0005, edit=False),
        ("the edit of E0001: expected a batch_conflict refusal, found none",),
        "run the edit cell", (19000, 4, {"done": 4, "dead": 1})),
    Route(1, "refusal-kept-as-text", lambda t: (one_with(t, NEW_E0005)[0], "batch_conflict"),
        ("expected a batch_conflict refusal (the exception itself), found 'batch_conflict'",),
        "keeps the exception as edit_refusal", (19000, 4, {"done": 4, "dead": 1})),
    Route(1, "correction-with-a-category-the-handler-does-not-know", lambda t: one_with(
        t, NEW_E0005.replace("pen", "toy")),
        ("E0005 is dead (invalid_payload)", "dead expected 1, found 2"),
        "a category the handler knows"),
    Route(1, "correction-of-the-wrong-amount", lambda t: one_with(t, E0005_1000),
        ("E0005 brings 1000, the difference is 2000", "total expected 19000, found 18000"),
        "ONE new event of 2000"),
]



def made_up() -> BatchConflict:
    """A refusal built by hand: no queue ever raised it."""
    return BatchConflict("made up", line=1, event_id="E0001")


def raised_by_own_code() -> Exception:
    """A refusal the learner's own code raised: it passed through no queue."""
    return caught(lambda: (_ for _ in ()).throw(made_up()))


def honest_with(refusal: Callable[[Path], Any]) -> Callable[[Path], tuple[Any, ...]]:
    """Exercise 1's honest correction, kept with ``refusal`` as the edit's evidence
    (the dishonest step itself skipped)."""
    def play(tmp: Path) -> tuple[Any, ...]:
        queue, _ = one_with(tmp, NEW_E0005, edit=False)
        return queue, refusal(tmp)
    return play


def edit_refused_by(start: Callable[[Path], Queue | None], line: str = EDIT_E0001
                    ) -> Callable[[Path], Exception]:
    def refusal(folder: Path) -> Exception:
        other = start(folder)
        assert other is not None
        return caught(lambda: other.enqueue_jsonl(line))
    return refusal


def one_with_edit_of(tmp: Path, edit: str) -> tuple[Any, ...]:
    """Exercise 1 solved, with the refusal of ``edit`` (raised by q1) as the evidence."""
    queue = exercises.start_1(tmp)
    refusal = caught(lambda: queue.enqueue_jsonl(edit))
    queue.enqueue_jsonl(NEW_E0005)
    drain(queue, Handler())
    return queue, refusal


EDIT_E0002 = '{"event_id": "E0002", "payload": {"category": "pen", "amount_cents": 2500}}'
SOLVED_1 = (19000, 4, {"done": 4, "dead": 1})
ROUTES += [
    Route(1, "a-refusal-made-by-hand-and-the-edit-skipped", honest_with(lambda t: made_up()),
        ("the edit of E0001: that batch_conflict was not raised by a call on q1",),
        "run the edit cell", SOLVED_1),
    Route(1, "a-refusal-raised-by-the-learners-own-code", honest_with(
        lambda t: raised_by_own_code()),
        ("that batch_conflict was not raised by a call on q1",), "run the edit cell", SOLVED_1),
    Route(1, "a-refusal-raised-by-exercise-2s-queue", honest_with(edit_refused_by(
        exercises.start_2)),
        ("the edit of E0001: that refusal was raised by exercise 2's queue (q2), not by q1",),
        "on q1 itself: run the edit cell", SOLVED_1),
    Route(1, "a-refusal-raised-by-an-exercise-1-queue-in-another-folder", honest_with(
        lambda t: edit_refused_by(exercises.start_1)(place(t, "earlier"))),
        ("that refusal was raised by exercise 1's file in another folder",),
        "on q1 itself: run the edit cell", SOLVED_1),
    Route(1, "a-conflict-on-another-event-than-e0001", lambda t: one_with_edit_of(t, EDIT_E0002),
        ("the edit of E0001: event expected E0001, found E0002",), "the edit must be E0001",
        SOLVED_1),
    Route(1, "exercise-3s-queue-passed-to-check-1", lambda t: (exercises.start_3(t), None),
        ("that is exercise 3's queue (q3, built by start_3), not exercise 1's",), "pass q1"),
]


# -- exercise 2 --------------------------------------------------------------------

def two_with(tmp: Path, *, batch: Any = "file", why: Any = "b",
             then: Callable[[Queue], None] = lambda q: None) -> tuple[Any, ...]:
    queue = exercises.start_2(tmp)
    refusal = None
    if batch == "file":
        refusal = caught(lambda: queue.enqueue_file(DATA / "conflict.jsonl"))
    elif batch is not None:
        refusal = caught(lambda: queue.enqueue_jsonl(batch))
    then(queue)
    return queue, refusal, why


# A batch of the learner's own that conflicts on line 2 as the file does, but holds no E0005.
OWN_CONFLICT = ('{"event_id": "E0007", "payload": {"category": "pen", "amount_cents": 500}}\n'
                + EDIT_E0001)


def loaded_line_by_line_then_deleted(queue: Queue) -> None:
    """The naive loader lets E0005 in; a DELETE by hand takes it out again."""
    queue.enqueue_jsonl((DATA / "conflict.jsonl").read_text().splitlines()[0])
    sql(queue.path, "DELETE FROM messages WHERE event_id = 'E0005'")


ROUTES += [
    Route(2, "e0005-sent-again-on-its-own", lambda t: two_with(
        t, then=lambda q: q.enqueue_jsonl(NEW_E0005)),
        ("E0005 expected absent, found ready",), "run `start_2` again"),
    Route(2, "naive-loader-then-e0005-deleted-by-hand", lambda t: two_with(
        t, then=loaded_line_by_line_then_deleted),
        ("a hand edit", "journal_disagrees: E0005"), "run `start_2` again",
        (17000, 3, {"done": 3, "dead": 1})),
    Route(2, "refusal-of-a-single-edited-line-not-of-the-file", lambda t: two_with(
        t, batch=EDIT_E0001), ("line expected 2, found 1",), "send the whole file",
        (17000, 3, {"done": 3, "dead": 1})),
    Route(2, "explanation-a", lambda t: two_with(t, why="a"),
        ("you chose a), which is not the right explanation",), "read Hint 3"),
    Route(2, "no-explanation", lambda t: two_with(t, why=None),
        ("expected one of the letters a, b or c, found None",), "set why_whole_batch"),
    Route(2, "batch-never-sent", lambda t: two_with(t, batch=None),
        ("the conflicting batch: expected a batch_conflict refusal, found none",),
        "set conflict_file"),
    Route(2, "a-conflicting-batch-of-ones-own-without-e0005", lambda t: two_with(
        t, batch=OWN_CONFLICT), ("that refusal came from a batch of your own (2 events: E0007, "
                                 "E0001), not data/conflict.jsonl (2 events: E0005, E0001)",),
        "send the whole file", (17000, 3, {"done": 3, "dead": 1}),
        not_says=("so its E0005 on line 1 was not added",)),
]


def two_kept(refusal: Callable[[Path], Any]) -> Callable[[Path], tuple[Any, ...]]:
    """Exercise 2's start untouched, with ``refusal`` kept as the batch's evidence."""
    return lambda tmp: (exercises.start_2(tmp), refusal(tmp), "b")


def file_refused_by_exercise_1s_queue(tmp: Path) -> Exception:
    other = exercises.start_1(tmp)
    return caught(lambda: other.enqueue_file(DATA / "conflict.jsonl"))


SOLVED_2 = (17000, 3, {"done": 3, "dead": 1})
ROUTES += [
    Route(2, "a-refusal-made-by-hand", two_kept(lambda t: BatchConflict(
        "made up", line=2, event_id="E0001")),
        ("the conflicting batch: that batch_conflict was not raised by a call on q2",),
        "set conflict_file", SOLVED_2),
    Route(2, "the-file-refused-by-exercise-1s-queue", two_kept(file_refused_by_exercise_1s_queue),
        ("that refusal was raised by exercise 1's queue (q1), not by q2",),
        "on q2 itself: set conflict_file", SOLVED_2),
    Route(2, "exercise-1s-queue-passed-to-check-2", lambda t: (exercises.start_1(t), None, "b"),
        ("that is exercise 1's queue (q1, built by start_1), not exercise 2's",), "pass q2"),
]


# -- exercise 3 --------------------------------------------------------------------

def three_with(tmp: Path, play: Callable[[Queue], None]) -> tuple[Any, ...]:
    queue = exercises.start_3(tmp)
    play(queue)
    return (queue,)


def redriven_with(handler: Handler, work: bool = True) -> Callable[[Queue], None]:
    def play(queue: Queue) -> None:
        queue.redrive("E0004")
        if work:
            drain(queue, handler)
    return play


ROUTES += [
    Route(3, "redrive-before-the-fix", lambda t: three_with(t, redriven_with(Handler())),
        ("went dead again after your last redrive", "dead expected 0, found 1"),
        "redrive E0004 once more"),
    Route(3, "twenty-thousand-from-a-new-event", lambda t: three_with(t, lambda q: (
        q.enqueue_jsonl(NEW_E0005.replace("pen", "book").replace("2000", "3000")),
        drain(q, Handler()))),
        ("no new event expected, found E0005", "dead expected 0, found 1"),
        "recover E0004 instead", (20000, 4, {"done": 4, "dead": 1})),
    Route(3, "e0004-set-done-by-hand", lambda t: three_with(t, lambda q: sql(
        q.path, "UPDATE messages SET state = 'done', last_error = NULL, finished_at = 1000 "
        "WHERE event_id = 'E0004'",
        "INSERT INTO effects (event_id, category, amount_cents) VALUES ('E0004', 'toy', 3000)")),
        ("a hand edit", "journal_disagrees: E0004", "a redrive of E0004 expected, found none"),
        "run `start_3` again", (20000, 4, {"done": 4})),
    Route(3, "e0004-set-ready-by-hand-instead-of-a-redrive", lambda t: three_with(t, lambda q: (
        sql(q.path, "UPDATE messages SET state = 'ready', attempts = 0 WHERE event_id = 'E0004'"),
        drain(q, Handler().supporting("toy")))),
        ("a hand edit", "illegal_edge: E0004", "a redrive of E0004 expected, found none"),
        "run `start_3` again", (20000, 4, {"done": 4})),
    Route(3, "redriven-but-never-processed", lambda t: three_with(
        t, redriven_with(Handler().supporting("toy"), work=False)),
        ("E0004 is ready: no worker has processed it yet",), "`drain(q3, newer_handler)`"),
]


def exercise_1_solved(tmp: Path) -> tuple[Any, ...]:
    queue, _ = one_with(tmp, NEW_E0005)
    return (queue,)


ROUTES += [
    Route(3, "exercise-1s-queue-passed-to-check-3", exercise_1_solved,
        ("that is exercise 1's queue (q1, built by start_1), not exercise 3's",), "pass q3",
        not_says=("no new event expected",)),
]


# -- exercise 4 --------------------------------------------------------------------

def late(queue: Queue, lease: Lease, handler: Handler) -> Exception:
    return caught(lambda: queue.complete(lease, handler))


def takeover(tmp: Path) -> tuple[Any, ...]:
    """Exercise 4 up to W2's failure: W1 stalls, W2 takes E0004 over, W1's late
    ACK is refused, W2 sends E0004 dead. Returns the queue, the handler, W1's
    refused (lease, refusal) and W2's lease."""
    queue, handler = exercises.start_4(tmp), Handler()
    w1 = queue.claim()
    queue.clock.advance(2)  # type: ignore[attr-defined]
    w2 = queue.claim()
    assert w1 is not None and w2 is not None
    before = (w1, late(queue, w1, handler))
    finish(queue, w2, handler)
    return queue, handler, before, w2


def story(tmp: Path, pick: Callable[..., tuple[Any, Any]]) -> tuple[Any, ...]:
    """Exercise 4's story as the solution plays it; ``pick`` chooses what to check."""
    queue, handler, before, w2 = takeover(tmp)
    w1 = before[0]
    queue.redrive("E0004")
    newer = handler.supporting("toy")
    w3 = queue.claim()
    assert w3 is not None
    after = (w1, late(queue, w1, newer))
    w2_after = (w2, late(queue, w2, newer))
    queue.complete(w3, newer)
    return (queue, *pick(before, after, w2_after, w3))


def no_takeover(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_4(tmp)
    w1 = queue.claim()
    queue.clock.advance(2)  # type: ignore[attr-defined]
    assert w1 is not None
    return queue, (w1, late(queue, w1, Handler())), None


def accepted_ack(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_4(tmp)
    w1 = queue.claim()
    assert w1 is not None
    return queue, (w1, queue.complete(w1, Handler().supporting("toy"))), None


def lease_of_exercise_3(tmp: Path) -> Lease:
    """E0004 claimed in another queue: exercise 3's, after its redrive."""
    other = exercises.start_3(place(tmp, "other"))
    other.redrive("E0004")
    lease = other.claim()
    assert lease is not None
    return lease


def hand_finished(tmp: Path) -> tuple[Any, ...]:
    queue, _, before, _ = takeover(tmp)
    sql(queue.path, "UPDATE messages SET state = 'done', last_error = NULL, finished_at = 1000",
        "INSERT INTO effects (event_id, category, amount_cents) VALUES ('E0004', 'toy', 3000)")
    return queue, before, before


SOLVED_FIGURES = (3000, 1, {"done": 1})
ROUTES += [
    Route(4, "late-ack-without-a-takeover-claim", no_takeover,
        ("W1's ACK was refused with lease_expired, not stale_generation",
         "no second claim had taken E0004 over"), "let W2 claim E0004"),
    Route(4, "pair-in-the-wrong-order", lambda t: story(
        t, lambda b, a, w2, w3: ((b[1], b[0]), a)),
        ("before the redrive: the pair is in the wrong order, (refusal, lease)",),
        "write it as (w1, exc)", SOLVED_FIGURES),
    Route(4, "w2s-refusal-after-the-redrive", lambda t: story(
        t, lambda b, a, w2, w3: (b, w2)),
        ("came from W2's lease (generation 2, attempt 2), and W2 did not stall",
         "the stalled worker's: W1, generation 1"), "pair the stalled lease", SOLVED_FIGURES),
    Route(4, "the-first-refusal-kept-twice", lambda t: story(t, lambda b, a, w2, w3: (b, b)),
        ("after the redrive: that is the same refusal as before the redrive",),
        "try `q4.complete(w1, newer)` once more", SOLVED_FIGURES),
    Route(4, "a-lease-from-another-queue", lambda t: story(
        place(t, "q4"), lambda b, a, w2, w3: (b, (lease_of_exercise_3(t), a[1]))),
        ("that lease (E0004, generation 2, attempt 1) was not claimed in q4",),
        "take W1's lease with `w1 = q4.claim()`", SOLVED_FIGURES),
    Route(4, "w3s-lease-with-a-made-up-refusal", lambda t: story(t, lambda b, a, w2, w3: (
        b, (w3, LeaseLost("stale_generation", "made up", event_id="E0004")))),
        ("W3 did not stall: it finished E0004 itself",), "pair the stalled lease",
        SOLVED_FIGURES),
    Route(4, "e0004-finished-by-hand-without-a-redrive", hand_finished,
        ("a hand edit", "expected a redrive of E0004 after W1's claim, found none"),
        "run `start_4` again", SOLVED_FIGURES),
    Route(4, "an-ack-in-time-accepted", accepted_ack,
        ("W1's ACK was accepted (it returned an Effect), not refused",),
        "let W2 claim E0004", SOLVED_FIGURES),
]


def made_up_late_acks(before: Any, after: Any, w2: Any, w3: Any) -> tuple[Any, Any]:
    """W1's real lease, with refusals built by hand instead of its late ACKs' own."""
    made = [LeaseLost("stale_generation", "made up", event_id="E0004") for _ in range(2)]
    return (before[0], made[0]), (after[0], made[1])


def refusals_of_another_queue(tmp: Path) -> tuple[Any, ...]:
    """W1's lease of q4, each paired with what the same story raised on another q4."""
    _, other_before, other_after = story(place(tmp, "other"), lambda b, a, w2, w3: (b, a))
    queue, before, after = story(place(tmp, "q4"), lambda b, a, w2, w3: (b, a))
    return queue, (before[0], other_before[1]), (after[0], other_after[1])


ROUTES += [
    Route(4, "both-pairs-in-the-wrong-order", lambda t: story(
        t, lambda b, a, w2, w3: ((b[1], b[0]), (a[1], a[0]))),
        ("before the redrive: the pair is in the wrong order, (refusal, lease)",
         "after the redrive: the pair is in the wrong order, (refusal, lease)"),
        "write it as (w1, exc)", SOLVED_FIGURES, not_says=("same refusal",)),
    Route(4, "refusals-made-by-hand-for-w1s-lease", lambda t: story(t, made_up_late_acks),
        ("before the redrive: that stale_generation refusal was raised by no call on q4",
         "after the redrive: that stale_generation refusal was raised by no call on q4"),
        "keep what `q4.complete(w1, ...)` raises", SOLVED_FIGURES),
    Route(4, "refusals-raised-by-another-exercise-4-queue", refusals_of_another_queue,
        ("that stale_generation refusal was raised by exercise 4's file in another folder",),
        "keep what `q4.complete(w1, ...)` raises", SOLVED_FIGURES),
    Route(4, "exercise-6s-queue-passed-to-check-4", lambda t: (exercises.start_6(t), None, None),
        ("that is exercise 6's queue (q6, built by start_6), not exercise 4's",), "pass q4"),
]


# -- exercise 5 --------------------------------------------------------------------

def recovering_in_sql(db_path: str) -> dict[str, int]:
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("UPDATE messages SET state = 'dead', lease_until = NULL, "
                     "last_error = 'lease_expired' WHERE state = 'leased'")
        conn.commit()
        return dict(conn.execute("SELECT event_id, attempts FROM messages WHERE state = 'dead'"))
    finally:
        conn.close()


def recovering_by_a_claim(db_path: str) -> dict[str, int]:
    Queue(db_path, lease_seconds=2).claim()  # a claim recovers expired leases
    return sql_metric("SELECT event_id, attempts FROM messages WHERE state = 'dead'")(db_path)


def as_rows(db_path: str) -> list[tuple[str, int]]:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute("SELECT event_id, attempts FROM messages WHERE state = 'dead'"
                            ).fetchall()
    finally:
        conn.close()


def metric(fn: Callable[[str], Any]) -> Callable[[Path], tuple[Any, ...]]:
    return lambda tmp: (fn,)


ROUTES += [
    Route(5, "the-answer-key-called", metric(lambda p: dict(Queue(p).metrics().dead_attempts)),
        ("your function calls into queue_core (Queue(), Queue.metrics())",
         "Queue.metrics() is the answer key"), "write your own SELECT"),
    Route(5, "the-audit-snapshot-read", metric(lambda p: {
        e: m.attempts for e, m in snapshot(p).messages.items() if m.state == "dead"}),
        ("calls into queue_core (snapshot()) instead of reading with SQL of its own",),
        "write your own SELECT"),
    Route(5, "a-claim-that-recovers-leases", metric(recovering_by_a_claim),
        ("calls into queue_core (Queue(), Queue.claim())",), "write your own SELECT"),
    Route(5, "an-update-that-recovers-leases", metric(recovering_in_sql),
        ("on 'the reference scenario (E0004, unknown category)' your function writes to the "
         "database it measures (UPDATE messages)",), "only read"),
    Route(5, "a-list-of-pairs", metric(as_rows),
        ("your function returned a list of pairs, not a dict {event_id: attempts}",),
        "return `dict(rows)`"),
    Route(5, "the-generation-not-the-attempts", metric(sql_metric(
        "SELECT event_id, generation FROM messages WHERE state = 'dead'")),
        ("dead again", "the value of E0004 is its generation"), "count `attempts`"),
    Route(5, "leased-counted-as-dead", metric(sql_metric(
        "SELECT event_id, attempts FROM messages WHERE state = 'dead' OR attempts >= 3")),
        ("not yet noticed", "it counts E0502, which is stored leased, not dead"),
        "`WHERE state = 'dead'`"),
    Route(5, "only-invalid-payloads", metric(sql_metric(
        "SELECT event_id, attempts FROM messages "
        "WHERE state = 'dead' AND last_error = 'invalid_payload'")),
        ("three transient", "it misses E0501 (dead, last error transient_error)"),
        "whatever its last_error"),
    Route(5, "figures-of-its-own", metric(lambda p: {"E0501": 3, "E0502": 3}),
        ("E0501 is not in this database at all",), "read the file"),
    Route(5, "attempts-as-floats", metric(lambda p: {
        e: float(a) for e, a in sql_metric("SELECT event_id, attempts FROM messages "
                                           "WHERE state = 'dead'")(p).items()}),
        ("attempts that are not a whole number: 1.0 for E0004",), "(int)"),
    Route(5, "a-function-that-raises", metric(lambda p: 1 / 0),
        ("your function raised ZeroDivisionError",), "in a cell of its own"),
]


def through_the_command_line(db_path: str) -> dict[str, int]:
    """The answer key, reached through the CLI in a child process."""
    done = subprocess.run([sys.executable, "-m", "queue_core", "--db", db_path, "metrics",
                           "--json"], capture_output=True, text=True, check=False)
    return dict(json.loads(done.stdout)["dead_attempts"])


def writes_and_reads(*writes: str) -> Callable[[str], dict[str, int]]:
    """The right SELECT, after statements that write (and may change nothing)."""
    def metric(db_path: str) -> dict[str, int]:
        conn = sqlite3.connect(db_path)
        try:
            for statement in writes:
                conn.execute(statement)
            conn.commit()
            return dict(conn.execute("SELECT event_id, attempts FROM messages "
                                     "WHERE state = 'dead'"))
        finally:
            conn.close()
    return metric


def written_by_a_child_process(db_path: str) -> dict[str, int]:
    """A table created by another process (no authorizer there), then the right SELECT."""
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                    "c.execute('CREATE TABLE mymetric (x)'); c.commit()", db_path], check=True)
    return sql_metric("SELECT event_id, attempts FROM messages WHERE state = 'dead'")(db_path)


def from_a_thread(db_path: str) -> dict[str, int]:
    """The answer key, called from a thread of the function's own."""
    found: dict[str, int] = {}
    thread = threading.Thread(target=lambda: found.update(Queue(db_path).metrics().dead_attempts))
    thread.start()
    thread.join()
    return found


def from_a_script_of_ones_own(db_path: str) -> dict[str, int]:
    """The answer key, in a child process whose command line does not name the package."""
    script = Path(db_path).with_name("count.py")
    script.write_text("import json, sys\nfrom queue_core import Queue\n"
                      "print(json.dumps(dict(Queue(sys.argv[1]).metrics().dead_attempts)))\n")
    done = subprocess.run([sys.executable, str(script), db_path], check=True,
                          capture_output=True, text=True, cwd=ROOT_DIR)
    return dict(json.loads(done.stdout))


NO_OP = "UPDATE messages SET attempts = attempts"
ROUTES += [
    Route(5, "the-answer-key-from-a-thread", metric(from_a_thread),
        ("your function reached queue_core from another thread",), "write your own SELECT"),
    Route(5, "the-answer-key-from-a-script-of-ones-own", metric(from_a_script_of_ones_own),
        ("your function runs a child process (`python <path> <path>`), whose work this "
         "check cannot see",), "write your own SELECT"),
    Route(5, "the-answer-key-through-the-command-line", metric(through_the_command_line),
        ("your function runs queue_core in a child process (`python",
         "-m queue_core --db <path> metrics --json`): its metrics command is the answer key"),
        "write your own SELECT"),
    Route(5, "a-table-created-and-a-no-op-update", metric(writes_and_reads(
        "CREATE TABLE mymetric (event_id TEXT, attempts INTEGER)", NO_OP)),
        ("your function writes to the database it measures (CREATE TABLE mymetric, UPDATE "
         "messages): a metric only reads",), "only read"),
    Route(5, "a-no-op-update-alone", metric(writes_and_reads(NO_OP)),
        ("writes to the database it measures (UPDATE messages)", "even a write that changes no "
         "value"), "only read"),
    Route(5, "a-table-created-by-a-child-process", metric(written_by_a_child_process),
        ("your function changed the database it measures (a metric only reads)",), "only read"),
]


# -- exercise 6 --------------------------------------------------------------------

def six_with(tmp: Path, steps: list[str], *, crash_after: int = 1,
             then: Callable[[Queue], None] = lambda q: None) -> tuple[Any, ...]:
    queue = exercises.start_6(tmp)
    run = exercises.run_naive_worker(queue, steps, crash_after=crash_after)
    then(queue)
    return queue, run


def set_done_by_hand_with_a_run_of_another_queue(tmp: Path) -> tuple[Any, ...]:
    _, elsewhere = six_with(place(tmp, "other"), [ACK, INSERT])
    queue = exercises.start_6(place(tmp, "q6"))
    sql(queue.path, "UPDATE messages SET state = 'done', finished_at = 1000 "
        "WHERE event_id = 'E0003'")
    return queue, elsewhere


def run_then_start_again(tmp: Path) -> tuple[Any, ...]:
    _, run = six_with(tmp, [ACK, INSERT])
    return exercises.start_6(tmp), run


NO_RESET = "UPDATE messages SET state = 'done' WHERE event_id = :event_id"
ROUTES += [
    Route(6, "set-done-by-hand-with-a-run-of-another-database",
        set_done_by_hand_with_a_run_of_another_queue,
        ("that run was taken on another database, not on q6's file",
         "q6's journal holds no claim of E0003 by generation 1"), "on q6 itself",
        (0, 0, {"done": 1})),
    Route(6, "one-step-only", lambda t: six_with(t, [ACK]),
        ("one step given, the ACK: the INSERT INTO effects is missing as step 2",),
        "make step 2 `INSERT INTO effects", (0, 0, {"done": 1})),
    Route(6, "first-natural-attempt-without-lease-reset", lambda t: six_with(t, [NO_RESET, INSERT]),
        ("CHECK constraint lease_until_iff_leased refused it (IntegrityError)",
         "a done row needs lease_until = NULL"), "set `lease_until = NULL`",
        (0, 0, {"leased": 1})),
    Route(6, "an-ack-without-its-finish-time", lambda t: six_with(t, [ACK.replace(
        ", finished_at = :now", ""), INSERT]),
        ("CHECK constraint finished_at_iff_done refused it (IntegrityError)",
         "a message is done exactly when finished_at is set"), "set `finished_at = :now`",
        (0, 0, {"leased": 1})),
    Route(6, "insert-before-ack", lambda t: six_with(t, [INSERT, ACK]),
        ("the INSERT committed first", "a retry writes the effect a second time"),
        "swap the steps", (5000, 1, {"leased": 1})),
    Route(6, "second-step-is-no-insert", lambda t: six_with(t, [ACK, "SELECT 1"]),
        ("without a crash write no effect", "effects expected 1, found 0"),
        "make step 2 `INSERT INTO effects", (0, 0, {"done": 1})),
    Route(6, "no-crash", lambda t: six_with(t, [ACK, INSERT], crash_after=0),
        ("exit code expected 86 after step 1, found 0 after step 2",), "without crash_after",
        (5000, 1, {"done": 1})),
    Route(6, "insert-first-then-the-loss-made-by-hand", lambda t: six_with(
        t, [INSERT, ACK], then=lambda q: sql(
            q.path, "DELETE FROM effects",
            "UPDATE messages SET state = 'done', lease_until = NULL, finished_at = 1000")),
        ("q6 is not what your run left", "a hand edit changed it after the run"),
        "run `start_6` again", (0, 0, {"done": 1})),
    Route(6, "an-ack-that-matches-no-row", lambda t: six_with(t, [ACK.replace(
        ":event_id", "'E9999'"), INSERT]),
        ("step 1 changed no row: E0003 is still leased",), "make step 1 the ACK"),
    Route(6, "a-run-from-before-start-6-ran-again", run_then_start_again,
        ("q6 is a fresh start: that run came before `start_6` built it again",),
        "run the worker cell again on this q6"),
]


def a_run_elsewhere_and_a_fresh_q6(tmp: Path) -> tuple[Any, ...]:
    _, elsewhere = six_with(place(tmp, "other"), [ACK, INSERT])
    return exercises.start_6(place(tmp, "q6")), elsewhere


def a_run_on_exercise_4s_queue(tmp: Path) -> tuple[Any, ...]:
    run = exercises.run_naive_worker(exercises.start_4(tmp), [ACK, INSERT])
    return exercises.start_6(tmp), run


ROUTES += [
    Route(6, "a-run-on-another-database-checked-against-a-fresh-q6", a_run_elsewhere_and_a_fresh_q6,
        ("that run was taken on another database, not on q6's file (it ran on exercise 6's file "
         "in another folder",), "on q6 itself", (0, 0, {"ready": 1}),
        not_says=("q6 is a fresh start",)),
    Route(6, "a-run-on-exercise-4s-queue", a_run_on_exercise_4s_queue,
        ("that run was taken on another database, not on q6's file (it ran on exercise 4's queue "
         "(q4))",), "on q6 itself", (0, 0, {"ready": 1}), not_says=("q6 is a fresh start",)),
    Route(6, "exercise-4s-queue-passed-to-check-6", lambda t: (exercises.start_4(t), None),
        ("that is exercise 4's queue (q4, built by start_4), not exercise 6's",), "pass q6"),
]


class Doubling(Handler):
    """A handler of the learner's own: twice the payload's amount."""

    def effect_of(self, payload: Any) -> Any:
        effect = super().effect_of(payload)
        return type(effect)(effect.category, 2 * effect.amount_cents)


def test_exercise_1_a_handler_subclass_is_named_as_such_not_as_sql_of_ones_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue = exercises.start_1(tmp_path)
    refusal = caught(lambda: queue.enqueue_jsonl(EDIT_E0001))
    queue.enqueue_jsonl(E0005_1000)
    drain(queue, Doubling())  # 1000 written as 2000: the right total, the wrong effect
    assert figures(queue.path) == (19000, 4, {"done": 4, "dead": 1})
    capsys.readouterr()

    verdict = exercises.check_1(queue, refusal)

    assert capsys.readouterr().out.splitlines() == [verdict.text]
    assert verdict.text == (
        "Not quite: the audit found effect_differs: E0005: effect pen 2000, payload says pen "
        "1000: every change came through q1's calls, and they ran a handler of your own "
        "(Doubling, not the course's Handler), whose effects are not what their payloads say; "
        "E0005 brings 1000, the difference is 2000. Next: run `start_1` again and process with "
        "the course's Handler (`Handler()`, or `Handler().supporting(...)`): an effect is what "
        "its payload says")
    assert "SQL of your own" not in verdict.text and "hand edit" not in verdict.text


def test_exercise_2_a_conflicting_batch_of_ones_own_is_refused_saying_what_was_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue, refusal, why = two_with(tmp_path, batch=OWN_CONFLICT)
    assert (refusal.code, refusal.line, refusal.event_id) == ("batch_conflict", 2, "E0001")
    capsys.readouterr()

    verdict = exercises.check_2(queue, refusal, why)

    assert capsys.readouterr().out.splitlines() == [verdict.text]
    assert verdict.text == (
        "Not quite: the conflicting batch: that refusal came from a batch of your own (2 events: "
        "E0007, E0001), not data/conflict.jsonl (2 events: E0005, E0001): the exercise asks "
        "what the course's file does, whose E0005 on line 1 the refusal keeps out. Next: send "
        f"the whole file with `q2.enqueue_file(\"{exercises.checks.conflict_path()}\")`, not a "
        "batch of your own")
    same_lines = two_with(place(tmp_path, "lines"),
                          batch=(DATA / "conflict.jsonl").read_text().replace(": ", ":"))
    assert exercises.check_2(*same_lines).text == (  # the file's lines, spelled otherwise
        "Solved: the batch of data/conflict.jsonl was refused whole at line 2 (batch_conflict "
        "on E0001), so its E0005 on line 1 was not added: total 17000 (book 15000, pen 2000); "
        "effects 3; ready 0, leased 0, done 3, dead 1")


@pytest.mark.parametrize("route", ROUTES, ids=[f"{r.number}-{r.name}" for r in ROUTES])
def test_each_wrong_route_is_refused_naming_what_is_wrong_and_what_to_do_next(
        route: Route, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = route.play(tmp_path)
    capsys.readouterr()
    verdict = getattr(exercises, f"check_{route.number}")(*args)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [verdict.text]
    assert verdict.status == NOT_QUITE, verdict.text
    assert [said for said in route.says if said not in verdict.detail] == [], verdict.text
    assert route.next_step in verdict.next_step, verdict.text
    assert [said for said in route.not_says if said in verdict.text] == [], verdict.text
    assert verdict.text.endswith(f". Next: {verdict.next_step}")
    if route.reaches is not None:  # the money is right; the route is what is wrong
        assert figures(args[0].path) == route.reaches


def test_the_catalogue_holds_at_least_four_wrong_routes_for_every_exercise() -> None:
    per_exercise = Counter(route.number for route in ROUTES)
    assert sorted(per_exercise) == [1, 2, 3, 4, 5, 6]
    assert min(per_exercise.values()) >= 4, per_exercise
    assert len({(r.number, r.name) for r in ROUTES}) == len(ROUTES)
