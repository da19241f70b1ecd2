"""Exercise 10: an urgent message overtakes a backlog by its priority, and the backlog
still finishes.

The right answer, the one of notebook 09's solutions, is solved, with the least
priority that does it computed from the package's rule; every wrong route is
refused, naming what is wrong and the next step: too low a priority, a repeat
enqueue that cannot raise it (a duplicate keeps the stored priority), a worker
run before the refund arrived, none run yet, a backlog left starving, a refund
whose first claim did not finish it (dead, then redriven and done last), and the
routes that reach the right order by hand (an ``available_at`` or a ``priority``
changed with SQL of one's own, a claim forged into the journal, a state set by
hand, a clock set back, a ``Handler`` subclass that writes, another queue than
q10).
Every route is played on real files with the real witness; where it reaches
the right money, the figures read back through a second connection prove that
the money alone would have passed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import read_back
from queue_core import Handler, Lease, ModelClock, Queue, drain
from queue_core.lab import exercises
from queue_core.lab.exercises import NOT_ATTEMPTED, NOT_QUITE, SOLVED
from queue_core.lab.exercises.provenance import journal_by_hand, record_path
from test_exercise_routes import Route, place, sql
from test_exercises import figures

REFUND_LINE = '{"event_id": "E1007", "payload": {"category": "refund", "amount_cents": 2500}}'
REFUND = Handler().supporting("refund")  # handler_10 of the notebook
SOLVED_FIGURES = (14500, 7, {"done": 7})
BULK = ["E1001", "E1002", "E1003", "E1004", "E1005", "E1006"]


def claims(queue: Queue) -> list[str]:
    """The event ids of the journal's claims, in order, as a second connection reads them."""
    return [row[0] for row in read_back(Path(queue.path), "SELECT event_id FROM transitions "
                                        "WHERE reason = 'claimed' ORDER BY seq")]


def solved(tmp: Path, priority: int = 3) -> Queue:
    queue = exercises.start_10(tmp)
    queue.enqueue_jsonl(REFUND_LINE, priority=priority)
    drain(queue, REFUND)
    return queue


def test_exercise_10_starts_with_six_bulk_orders_due_and_none_claimed_at_t_1120(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue = exercises.start_10(tmp_path)

    assert queue.clock.now() == 1120
    assert figures(queue.path) == (0, 0, {"ready": 6})
    assert [(m.event_id, m.priority, m.available_at) for m in queue.messages()] == [
        (event_id, 0, 1000 + 10 * n) for n, event_id in enumerate(BULK)]
    capsys.readouterr()
    verdict = exercises.check_10(queue)
    assert verdict.status == NOT_ATTEMPTED
    assert capsys.readouterr().out.splitlines() == [verdict.text]
    assert verdict.text == (
        "Not attempted yet: enqueue the refund with a priority, "
        "`q10.enqueue_jsonl(REFUND_LINE, priority=...)`, then run a worker: "
        "`drain(q10, handler_10)`")


def test_exercise_10_the_refund_with_priority_3_then_a_worker_is_solved(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue = solved(tmp_path)
    capsys.readouterr()

    verdict = exercises.check_10(queue)

    assert verdict.status == SOLVED
    assert capsys.readouterr().out.splitlines() == [verdict.text]
    assert verdict.text == (
        "Solved: the refund E1007, enqueued at t=1120 with priority 3, was claimed first: its "
        "key in the claim's order (available_at - 60 * priority, then event_id), 1120 - 180 = "
        "940, came before the backlog's, 1000 to 1050 (priority 3 is the least that does it: a "
        "head start of more than the 120 s the oldest had been due); then all 6 bulk messages "
        "were done too, none left starving: total 14500 (bag 3500, book 7000, pen 1500, refund "
        "2500); effects 7; ready 0, leased 0, done 7, dead 0")
    assert figures(queue.path) == SOLVED_FIGURES
    assert claims(queue) == ["E1007", *BULK]
    assert read_back(Path(queue.path), "SELECT priority FROM messages "
                                       "WHERE event_id = 'E1007'") == [(3,)]


@pytest.mark.parametrize("priority", range(3, 10))
def test_exercise_10_every_priority_from_3_up_is_solved(tmp_path: Path, priority: int) -> None:
    queue = solved(tmp_path, priority)
    assert exercises.check_10(queue).status == SOLVED
    assert claims(queue) == ["E1007", *BULK] and figures(queue.path) == SOLVED_FIGURES


def test_exercise_10_the_refund_sent_as_a_file_with_its_priority_is_solved_too(
        tmp_path: Path) -> None:
    refund_file = tmp_path / "refund.jsonl"
    refund_file.write_text(REFUND_LINE + "\n")
    queue = exercises.start_10(place(tmp_path, "work"))
    queue.enqueue_file(refund_file, priority=4)
    drain(queue, REFUND)
    assert exercises.check_10(queue).status == SOLVED
    assert claims(queue) == ["E1007", *BULK] and figures(queue.path) == SOLVED_FIGURES


def test_exercise_10_the_next_step_of_too_low_a_priority_followed_literally_solves_it(
        tmp_path: Path) -> None:
    low = solved(tmp_path, priority=1)
    verdict = exercises.check_10(low)
    assert verdict.status == NOT_QUITE and claims(low) == [*BULK, "E1007"]
    [least] = re.findall(r"with priority (\d) or more", verdict.next_step)

    again = solved(tmp_path, priority=int(least))  # "run `start_10` again", as it says

    assert exercises.check_10(again).status == SOLVED
    assert claims(again) == ["E1007", *BULK]


def test_exercise_10_the_refund_enqueued_and_no_worker_yet_is_told_to_run_one_and_that_solves_it(
        tmp_path: Path) -> None:
    queue = exercises.start_10(tmp_path)
    queue.enqueue_jsonl(REFUND_LINE, priority=9)

    verdict = exercises.check_10(queue)

    assert verdict.status == NOT_QUITE and "starves" not in verdict.text
    assert verdict.text == (
        "Not quite: no worker has run yet: the refund E1007, enqueued with priority 9, and the "
        "six bulk messages are all still ready; total expected 14500, found 0; effects "
        "expected 7, found 0; ready expected 0, found 7; done expected 7, found 0. Next: run a "
        "worker until nothing is due: `drain(q10, handler_10)`")
    assert figures(queue.path) == (0, 0, {"ready": 7}) and claims(queue) == []
    drain(queue, REFUND)  # the next step, as it says
    assert exercises.check_10(queue).status == SOLVED
    assert claims(queue) == ["E1007", *BULK] and figures(queue.path) == SOLVED_FIGURES


def test_exercise_10_a_repeat_with_a_priority_that_already_puts_it_first_changes_nothing(
        tmp_path: Path) -> None:
    """The repeat is named only where it matters: stored at 3, the refund goes first."""
    [queue] = enqueued_again(3, 9)(tmp_path)
    verdict = exercises.check_10(queue)
    assert verdict.status == SOLVED and "with priority 3" in verdict.text
    assert read_back(Path(queue.path), "SELECT priority FROM messages "
                                       "WHERE event_id = 'E1007'") == [(3,)]


def test_the_witness_records_the_priority_given_and_the_journal_rows_of_each_call(
        tmp_path: Path) -> None:
    queue = solved(tmp_path)
    entries = [json.loads(line) for line in Path(record_path(queue.path)).read_text().splitlines()]

    assert [(e["kind"], e.get("what"), e.get("priority")) for e in entries] == [
        ("start", None, None), ("call", "enqueue", 3), ("call", "claim_batch", None),
        *[("call", "complete_and_claim", None)] * 7]
    spans = [e["journal"] for e in entries]
    assert spans[0] == [6, 6]  # the start's six enqueues
    assert all(later[0] == earlier[1] for earlier, later in zip(spans, spans[1:]))
    assert spans[-1][1] == 6 + 1 + 7 * 2  # the refund's enqueue, then a claim and an ACK each
    assert journal_by_hand(queue.path) == []


# -- the wrong routes -----------------------------------------------------------------------

def with_refund(priority: int = 3, *, before: Callable[[Queue], Any] = lambda q: None,
                after: Callable[[Queue], Any] = lambda q: None,
                handler: Handler = REFUND) -> Callable[[Path], tuple[Any, ...]]:
    """start_10, ``before``, the refund enqueued with ``priority``, ``after``, a worker."""
    def play(tmp: Path) -> tuple[Any, ...]:
        queue = exercises.start_10(tmp)
        before(queue)
        queue.enqueue_jsonl(REFUND_LINE, priority=priority)
        after(queue)
        drain(queue, handler)
        return (queue,)
    return play


def by_hand(*statements: str) -> Callable[[Queue], None]:
    return lambda queue: sql(queue.path, *statements)


def in_its_transaction(*statements: str) -> Callable[[Queue], None]:
    def write(queue: Queue) -> None:
        with queue.transaction() as conn:
            for statement in statements:
                conn.execute(statement)
    return write


def refund_only(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_10(tmp)
    queue.enqueue_jsonl(REFUND_LINE, priority=9)
    lease = queue.claim()
    assert lease is not None and lease.event_id == "E1007"
    queue.complete(lease, REFUND)
    return (queue,)


def backlog_first(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_10(tmp)
    drain(queue, REFUND)
    queue.enqueue_jsonl(REFUND_LINE, priority=9)
    drain(queue, REFUND)
    return (queue,)


def dead_then_redriven(tmp: Path) -> tuple[Any, ...]:
    """The refund claimed first by a handler that does not know refunds (dead), then
    redriven and done by handler_10 after the whole backlog: the right money, late."""
    queue = exercises.start_10(tmp)
    queue.enqueue_jsonl(REFUND_LINE, priority=9)
    drain(queue, Handler())
    queue.redrive("E1007")
    drain(queue, REFUND)
    return (queue,)


def failed_by_hand_then_done_last(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_10(tmp)
    queue.enqueue_jsonl(REFUND_LINE, priority=9)
    lease = queue.claim()
    assert lease is not None and lease.event_id == "E1007"
    queue.fail(lease, "transient_error")  # back to ready, due again at 1121
    drain(queue, REFUND)                  # the backlog, while the refund waits out its backoff
    queue.clock.set(1121)                 # type: ignore[attr-defined]
    drain(queue, REFUND)
    return (queue,)


def enqueued_again(*priorities: int, worker: bool = True) -> Callable[[Path], tuple[Any, ...]]:
    """The refund enqueued once per priority given, in turn; then a worker, or none."""
    def play(tmp: Path) -> tuple[Any, ...]:
        queue = exercises.start_10(tmp)
        for priority in priorities:
            queue.enqueue_jsonl(REFUND_LINE, priority=priority)
        if worker:
            drain(queue, REFUND)
        return (queue,)
    return play


def backlog_pushed_back(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_10(tmp)
    queue.enqueue_jsonl(REFUND_LINE)
    sql(queue.path, "UPDATE messages SET available_at = available_at + 600 "
        "WHERE event_id != 'E1007'")
    drain(queue, REFUND)                   # the refund alone is due
    queue.clock.set(1700)                  # type: ignore[attr-defined]
    drain(queue, REFUND)
    return (queue,)


def forged_claim(tmp: Path) -> tuple[Any, ...]:
    """The refund, enqueued at priority 0, handed out by a claim written by hand, then
    finished by a real ACK with that lease, and the backlog by a real worker."""
    queue = exercises.start_10(tmp)
    queue.enqueue_jsonl(REFUND_LINE)
    sql(queue.path, "UPDATE messages SET state = 'leased', attempts = 1, generation = 1, "
        "lease_until = 1122 WHERE event_id = 'E1007'",
        "INSERT INTO transitions (at, event_id, from_state, to_state, generation, attempts, "
        "reason) VALUES (1120, 'E1007', 'ready', 'leased', 1, 1, 'claimed')")
    queue.complete(Lease("E1007", 1, 1, 1122), REFUND)
    drain(queue, REFUND)
    return (queue,)


def a_queue_of_ones_own_on_q10s_file(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_10(tmp)
    Queue(queue.path, clock=ModelClock(1120)).enqueue_jsonl(REFUND_LINE, priority=3)
    drain(queue, REFUND)
    return (queue,)


class Jump(Handler):
    """A handler of one's own whose ACK moves the refund to the front of the order."""

    def apply(self, conn, event_id, payload):  # type: ignore[no-untyped-def]
        conn.execute("UPDATE messages SET available_at = 0 WHERE event_id = 'E1007'")
        return super().apply(conn, event_id, payload)


def a_solved_copy_in_another_folder(tmp: Path) -> tuple[Any, ...]:
    queue = solved(place(tmp, "mine"))
    copy = place(tmp, "copy") / "exercise_10.sqlite3"
    shutil.copy(queue.path, copy)
    shutil.copy(record_path(queue.path), record_path(copy))
    return (Queue(copy),)


def an_older_q10(tmp: Path) -> tuple[Any, ...]:
    older = solved(tmp)
    exercises.start_10(tmp)
    return (older,)


def on_the_clock(at: int) -> Callable[[Queue], None]:
    return lambda queue: queue.clock.set(at)  # type: ignore[attr-defined]


AGAIN = "run `start_10` again"
PRIORITY_3 = "run `start_10` again and enqueue the refund with priority 3 or more"
ROUTES = [
    Route(10, "priority-0", with_refund(0),
          ("E1007 was claimed seventh, after E1001, E1002, E1003, E1004, E1005, E1006: with "
           "priority 0 its key in the claim's order (available_at - 60 * priority, then "
           "event_id) was 1120 - 0 = 1120, behind theirs (1000 to 1050)",), PRIORITY_3,
          SOLVED_FIGURES),
    Route(10, "priority-2-a-tie-with-e1001", with_refund(2),
          ("E1007 was claimed second, after E1001", "1120 - 120 = 1000, which ties with "
           "E1001's and the tie goes to the smaller event id"), PRIORITY_3, SOLVED_FIGURES),
    Route(10, "the-backlog-drained-before-the-refund-arrived", backlog_first,
          ("E1001, E1002, E1003, E1004, E1005, E1006 were claimed before the refund was "
           "enqueued",), "run `start_10` again: first `q10.enqueue_jsonl", SOLVED_FIGURES),
    Route(10, "the-refund-alone-and-the-backlog-left-starving", refund_only,
          ("the backlog starves: E1001, E1002, E1003, E1004, E1005, E1006 are still ready",
           "total expected 14500, found 2500"), "`drain(q10, handler_10)`",
          (2500, 1, {"ready": 6, "done": 1})),
    Route(10, "processed-with-a-handler-that-does-not-know-refund",
          with_refund(9, handler=Handler()),
          ("E1007 is dead (invalid_payload): the handler that processed it does not know "
           "refund",), 'Handler().supporting("refund")', (12000, 6, {"done": 6, "dead": 1})),
    Route(10, "dead-at-its-first-claim-then-redriven-and-done-after-the-backlog",
          dead_then_redriven,
          ("E1007 was claimed first, but that claim ended in invalid_payload (dead), not "
           "completed: the handler that processed it does not know refund; it was redriven and "
           "done only at its second claim, after E1001, E1002, E1003, E1004, E1005, E1006",),
          'run `start_10` again and process with `handler_10 = Handler().supporting("refund")`',
          SOLVED_FIGURES),
    Route(10, "failed-at-its-first-claim-then-done-after-the-backlog",
          failed_by_hand_then_done_last,
          ("E1007 was claimed first, but that claim ended in transient_error (ready), not "
           "completed; it was done only at its second claim, after E1001",),
          "run `start_10` again, then `q10.enqueue_jsonl(REFUND_LINE, priority=...)` and "
          "`drain(q10, handler_10)`", SOLVED_FIGURES),
    Route(10, "enqueued-at-0-then-again-at-9-a-duplicate-that-keeps-0", enqueued_again(0, 9),
          ("E1007 was enqueued again with priority 9, but a repeat of a stored event is a "
           "duplicate and changes nothing: the refund kept the priority it was stored with, 0, "
           "and only `start_10` starts over", "E1007 was claimed seventh"), PRIORITY_3,
          SOLVED_FIGURES),
    Route(10, "enqueued-at-0-then-again-at-9-and-no-worker-yet",
          enqueued_again(0, 9, worker=False),
          ("the refund kept the priority it was stored with, 0, and only `start_10` starts "
           "over", "no worker has run yet"), PRIORITY_3, (0, 0, {"ready": 7}),
          not_says=("starves",)),
    Route(10, "the-refund-never-enqueued", lambda t: (drain(q := exercises.start_10(t), REFUND),
                                                      q)[1:],
          ("the refund E1007 was never enqueued: a worker processed the backlog",), AGAIN,
          (12000, 6, {"done": 6})),
    Route(10, "another-event-instead-of-the-refund", lambda t: (
        (q := exercises.start_10(t)).enqueue_jsonl(REFUND_LINE.replace("E1007", "E2000"),
                                                   priority=9), drain(q, REFUND), q)[2:],
          ("no event but the refund E1007 expected, found E2000",
           "the refund E1007 was never enqueued"), "enqueue REFUND_LINE alone",
          (14500, 7, {"done": 7})),
    Route(10, "the-clock-set-back-before-the-enqueue", with_refund(
        0, before=on_the_clock(900), after=on_the_clock(1120)),
          ("the refund was enqueued at t=900, before t=1120 where start_10 left q10's clock",),
          "leave q10's clock alone", SOLVED_FIGURES),
    Route(10, "enqueued-ten-minutes-late", with_refund(9, before=on_the_clock(1720)),
          ("E1007 was claimed seventh", "1720 - 540 = 1180"),
          "enqueue the refund at once, at t=1120: a message due since t=1000 can be overtaken "
          "only by messages due less than 540 s after it", SOLVED_FIGURES),
    Route(10, "available-at-updated-by-hand", with_refund(0, after=by_hand(
        "UPDATE messages SET available_at = 900 WHERE event_id = 'E1007'")),
          ("a hand edit: q10's file was changed around the package's calls before a later call",
           "available_at changed with SQL of your own: E1007's from 1120 to 900"), AGAIN,
          SOLVED_FIGURES),
    Route(10, "available-at-updated-inside-q10s-transaction", with_refund(
        0, after=in_its_transaction("UPDATE messages SET available_at = 900 "
                                    "WHERE event_id = 'E1007'")),
          ("a hand edit: q10's file was changed by SQL of your own, run inside "
           "`q10.transaction()` (it changed the table messages)",
           "available_at changed with SQL of your own: E1007's from 1120 to 900"), AGAIN,
          SOLVED_FIGURES),
    Route(10, "the-backlog-pushed-back-by-hand", backlog_pushed_back,
          ("a hand edit", "E1001's from 1000 to 1600", "E1006's from 1050 to 1650"), AGAIN,
          SOLVED_FIGURES),
    Route(10, "priority-updated-by-hand", with_refund(0, after=by_hand(
        "UPDATE messages SET priority = 9 WHERE event_id = 'E1007'")),
          ("a hand edit", "E1007's priority is 9, but q10's enqueue gave it 0: an UPDATE of its "
           "priority with SQL of your own"), AGAIN, SOLVED_FIGURES),
    Route(10, "priority-updated-inside-q10s-transaction", with_refund(
        1, after=in_its_transaction("UPDATE messages SET priority = 9 WHERE event_id = 'E1007'")),
          ("run inside `q10.transaction()`", "E1007's priority is 9, but q10's enqueue gave "
           "it 1"), AGAIN, SOLVED_FIGURES),
    Route(10, "a-claim-forged-into-the-journal", forged_claim,
          ("a hand edit", "a forged claim: the journal's row 8 (E1007 claimed at t=1120) was "
           "written by no call on q10"), AGAIN, SOLVED_FIGURES),
    Route(10, "the-refund-set-done-by-hand", with_refund(0, after=by_hand(
        "UPDATE messages SET state = 'done', finished_at = 1120 WHERE event_id = 'E1007'",
        "INSERT INTO effects (event_id, category, amount_cents) VALUES ('E1007', 'refund', "
        "2500)")),
          ("a hand edit", "journal_disagrees: E1007",
           "E1007 is done without a claim in q10's journal: a state written by hand"), AGAIN,
          SOLVED_FIGURES),
    Route(10, "the-refund-enqueued-by-a-queue-of-ones-own-on-q10s-file",
          a_queue_of_ones_own_on_q10s_file,
          ("a hand edit", "journal rows written by no call on q10 (SQL of your own, or a Queue "
           "of your own on its file): 7 (E1007 enqueued)"), AGAIN, SOLVED_FIGURES),
    Route(10, "a-handler-subclass-that-writes", with_refund(0, handler=Jump().supporting(
        "refund")),
          ("a handler of your own (Jump, whose apply is not Handler's) ran inside q10's ACK",
           "E1007's from 1120 to 0"), "process with the course's Handler", SOLVED_FIGURES),
    Route(10, "a-solved-copy-in-another-folder", a_solved_copy_in_another_folder,
          ("that queue was not handed out by start_10 in this kernel",),
          "run `q10 = exercises.start_10(workdir)`"),
    Route(10, "an-older-q10-whose-file-start-10-built-again", an_older_q10,
          ("start_10 has built this file again since that q10 was handed out",),
          "run your cells on the q10 that the last"),
    Route(10, "exercise-9s-queue-passed-to-check-10", lambda t: (exercises.start_9(t),),
          ("that is exercise 9's queue (q9, built by start_9), not exercise 10's",), "pass q10"),
]


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_each_wrong_route_of_exercise_10_is_refused_naming_what_is_wrong_and_what_to_do_next(
        route: Route, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = route.play(tmp_path)
    capsys.readouterr()
    verdict = exercises.check_10(*args)
    assert capsys.readouterr().out.splitlines() == [verdict.text]
    assert verdict.status == NOT_QUITE, verdict.text
    assert [said for said in route.says if said not in verdict.detail] == [], verdict.text
    assert route.next_step in verdict.next_step, verdict.text
    assert [said for said in route.not_says if said in verdict.text] == [], verdict.text
    assert verdict.text.endswith(f". Next: {verdict.next_step}")
    assert "Traceback" not in verdict.text and str(tmp_path) not in verdict.text
    if route.reaches is not None:  # the money is right; the route is what is wrong
        assert figures(args[0].path) == route.reaches


def test_the_routes_that_reach_the_right_order_by_hand_put_the_refund_first_in_the_journal(
        tmp_path: Path) -> None:
    """What the witness and the check's own findings refuse, the order alone would pass."""
    by_hand_routes = [route for route in ROUTES if route.name in (
        "available-at-updated-by-hand", "available-at-updated-inside-q10s-transaction",
        "priority-updated-by-hand", "priority-updated-inside-q10s-transaction",
        "a-claim-forged-into-the-journal", "the-clock-set-back-before-the-enqueue",
        "the-refund-enqueued-by-a-queue-of-ones-own-on-q10s-file")]
    assert len(by_hand_routes) == 7
    for route in by_hand_routes:
        [queue] = route.play(place(tmp_path, route.name))
        assert claims(queue) == ["E1007", *BULK], route.name
        assert figures(queue.path) == SOLVED_FIGURES, route.name
