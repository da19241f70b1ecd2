"""Exercise 9: what a worker does after a lost connection. The check accepts
the answers that count every order once, and refuses, with the next step, the
ones that raise, lose money, write the effect again, or edit by hand.

Every start is real: two worker processes end during their ACK (one after its
COMMIT, one before), and every run is the learner's function on q9 itself.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from queue_core import Handler, LeaseLost, Queue
from queue_core.lab import exercises
from queue_core.lab.exercises import NOT_ATTEMPTED, NOT_QUITE, SOLVED


def do_nothing(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    pass


def retry_the_fenced_ack(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    try:
        queue.complete(lease, handler)
    except LeaseLost:
        pass


def retry_without_catching(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    queue.complete(lease, handler)


def give_up(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    try:
        queue.fail(lease, "connection_lost", permanent=True)
    except LeaseLost:
        pass


def write_the_effect_again(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    payload = json.loads(queue.message(lease.event_id).payload)
    with queue.transaction() as conn:
        handler.apply(conn, lease.event_id, payload)


def mark_done_by_hand_naively(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    conn = sqlite3.connect(queue.path)
    try:
        conn.execute("UPDATE messages SET state = 'done' WHERE event_id = ?", (lease.event_id,))
        conn.commit()
    finally:
        conn.close()


def mark_done_by_hand(queue: Queue, lease, handler: Handler) -> None:  # type: ignore[no-untyped-def]
    conn = sqlite3.connect(queue.path)
    conn.execute("UPDATE messages SET state = 'done', lease_until = NULL, finished_at = 1000 "
                 "WHERE event_id = ?",
                 (lease.event_id,))
    conn.commit()
    conn.close()


def figures(queue: Queue) -> tuple[int, int, dict[str, int]]:
    status = queue.status()
    return status.total, status.effects, dict(status.states)


def test_the_start_holds_one_committed_ack_and_one_that_never_committed(tmp_path: Path) -> None:
    q9 = exercises.start_9(tmp_path)
    assert q9 is not None
    messages = {m.event_id: (m.state, m.generation) for m in q9.messages()}

    assert messages == {"E0901": ("done", 1), "E0902": ("leased", 1), "E0903": ("ready", 0)}
    assert figures(q9) == (10000, 1, {"ready": 1, "leased": 1, "done": 1, "dead": 0})


def test_an_untouched_start_is_not_attempted(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    q9 = exercises.start_9(tmp_path)

    assert exercises.run_after_cut_9(q9, None) is None
    assert exercises.check_9(q9, None).status == NOT_ATTEMPTED
    assert "Nothing to run yet" in capsys.readouterr().out


@pytest.mark.parametrize("decide, how", [
    (do_nothing, "handed out again (once its lease ran out, or at once if it was given back), "
     "done by generation 2"),
    (retry_the_fenced_ack, "its ACK retried with the same lease, fenced"),
], ids=["do-nothing", "retry-the-fenced-ack"])
def test_an_answer_that_leaves_the_queue_to_settle_it_counts_every_order_once(
        tmp_path: Path, decide, how: str) -> None:  # type: ignore[no-untyped-def]
    q9 = exercises.start_9(tmp_path)
    run = exercises.run_after_cut_9(q9, decide)
    verdict = exercises.check_9(q9, run)

    assert verdict.status == SOLVED, verdict.text
    assert how in verdict.text
    assert figures(q9) == (17000, 3, {"ready": 0, "leased": 0, "done": 3, "dead": 0})


@pytest.mark.parametrize("decide, said, next_step, money", [
    (retry_without_catching, "for E0901 your function raised LeaseLost (not_leased): its COMMIT "
     "had taken effect", "catch LeaseLost", (17000, 3, 3)),
    (give_up, "E0902 dead (connection_lost): your function gave up a message whose ACK may "
     "never have committed, and its money is lost", "do not fail a message", (15000, 2, 2)),
    (write_the_effect_again, "for E0901 your function wrote the effect again, outside its ACK: "
     "the effects table's key refused it", "never run the effect yourself", (17000, 3, 2)),
    (mark_done_by_hand, "a hand edit", "run `start_9` again", (15000, 2, 3)),
    (mark_done_by_hand_naively, "wrote the queue's tables with SQL of its own, and the schema "
     "refused it", "never write the queue's rows yourself", (17000, 3, 3)),
], ids=["retry-without-catching", "give-up", "write-the-effect-again", "mark-done-by-hand",
        "mark-done-by-hand-refused-by-the-schema"])
def test_an_answer_that_raises_loses_or_writes_around_the_fence_is_refused_with_the_next_step(
        tmp_path: Path, decide, said: str, next_step: str,  # type: ignore[no-untyped-def]
        money: tuple[int, int, int]) -> None:
    q9 = exercises.start_9(tmp_path)
    run = exercises.run_after_cut_9(q9, decide)
    verdict = exercises.check_9(q9, run)

    assert verdict.status == NOT_QUITE
    assert said in verdict.detail, verdict.text
    assert verdict.next_step.startswith(next_step), verdict.text
    total, effects, by_state = figures(q9)  # a right total, where it is one: the wrong way
    assert (total, effects, by_state["done"]) == money


def test_a_run_on_another_start_or_a_used_start_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    elsewhere = exercises.start_9(tmp_path / "a")
    run = exercises.run_after_cut_9(elsewhere, do_nothing)
    q9 = exercises.start_9(tmp_path / "b")

    refused = exercises.check_9(q9, run)
    again = exercises.run_after_cut_9(elsewhere, do_nothing)

    assert refused.status == NOT_QUITE and "another database" in refused.detail
    assert again is None and "q9 is no fresh start" in capsys.readouterr().out
    assert exercises.check_9(exercises.start_6(tmp_path), run).status == NOT_QUITE
