"""Exercise 8: prune, then prove that a replay of E0001 is still a duplicate.

The right answer, the answer of notebook 09's solutions, is solved; every wrong
route (the naive cleanup of notebook 13, a hand edit, no prune, a replay kept
from another queue or with another payload) is refused, naming what is wrong
and the next step. Figures read back through a second connection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from queue_core import BatchConflict, EnqueueResult, Handler, Queue, drain
from queue_core.lab import exercises
from queue_core.lab.exercises import NOT_ATTEMPTED, NOT_QUITE, SOLVED
from queue_core.lab.story import naive_cleanup, read_books
from test_exercise_routes import Route, sql
from test_exercises import figures

E0001_LINE = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}'


def test_exercise_8_untouched_start_is_the_reference_end_an_hour_later(tmp_path: Path) -> None:
    queue = exercises.start_8(tmp_path)
    assert queue.clock.now() == 4602
    assert figures(queue.path) == (17000, 3, {"done": 3, "dead": 1})
    assert exercises.check_8(queue).status == NOT_ATTEMPTED


def test_exercise_8_prune_then_a_duplicate_replay_is_solved(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    queue = exercises.start_8(tmp_path)
    pruned = queue.prune(60)
    assert (pruned.messages, pruned.journal_rows) == (2, 8)  # E0003 owns the newest row
    replay = queue.enqueue_jsonl(E0001_LINE)
    assert replay == EnqueueResult(0, 1)
    drain(queue, Handler())  # nothing to process: the replay stored nothing
    capsys.readouterr()
    verdict = exercises.check_8(queue, replay)
    assert verdict.status == SOLVED, verdict.text
    assert capsys.readouterr().out == verdict.text + "\n"
    assert figures(queue.path) == (17000, 3, {"done": 3, "dead": 1})
    assert queue.message("E0001").payload is None
    assert verdict.text == (
        "Solved: E0001's payload and journal are gone and its key, digest, effect and compacted "
        "record kept; the replay of E0001 on q8 after the prune (an enqueue of E0001's line, "
        "which q8's witness records) was a duplicate (inserted 0, duplicates 1) and the money "
        "did not move: total 17000 (book 15000, pen 2000); effects 3; ready 0, leased 0, "
        "done 3, dead 1")


E0002_LINE = '{"event_id": "E0002", "payload": {"category": "pen", "amount_cents": 2000}}'


def test_exercise_8_a_replay_of_another_pruned_event_is_not_the_replay_of_e0001(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue = exercises.start_8(tmp_path)
    queue.prune(60)
    replay = queue.enqueue_jsonl(E0002_LINE)  # E0002 is pruned too: a duplicate as well
    assert replay == EnqueueResult(0, 1)
    capsys.readouterr()

    verdict = exercises.check_8(queue, replay)

    assert verdict.status == NOT_QUITE
    assert capsys.readouterr().out == verdict.text + "\n"
    assert verdict.text == (
        "Not quite: the replay after the prune carried E0002, not E0001's line alone: the "
        "exercise asks whether E0001, pruned, is still known as a duplicate. Next: replay "
        "E0001's own line on q8: `replay_8 = q8.enqueue_jsonl(E0001_LINE)`")
    assert figures(queue.path) == (17000, 3, {"done": 3, "dead": 1})


def naive_then_replay(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_8(tmp)
    naive_cleanup(queue)
    replay = queue.enqueue_jsonl(E0001_LINE)
    drain(queue, Handler())
    assert read_books(queue).total == 27000  # 17000 rolled up, then E0001's 10000 again
    return queue, replay


def hand_pruned(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_8(tmp)
    sql(queue.path, "DELETE FROM transitions WHERE event_id = 'E0001'",
        "UPDATE messages SET payload = NULL WHERE event_id = 'E0001'")
    return queue, queue.enqueue_jsonl(E0001_LINE)


def replay_only(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_8(tmp)
    return queue, queue.enqueue_jsonl(E0001_LINE)


def too_old_a_horizon(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_8(tmp)
    assert queue.prune(99999).messages == 0  # nothing finished that long before t=4602
    return queue, queue.enqueue_jsonl(E0001_LINE)


def pruned_then(replay: Any) -> Any:
    def play(tmp: Path) -> tuple[Any, ...]:
        queue = exercises.start_8(tmp)
        queue.prune(60)
        return queue, replay(queue, tmp) if callable(replay) else replay
    return play


def conflicting(queue: Queue, tmp: Path) -> Exception:
    with pytest.raises(BatchConflict) as refused:
        queue.enqueue_jsonl(E0001_LINE.replace("10000", "20000"))
    return refused.value


def replay_then_prune(tmp: Path) -> tuple[Any, ...]:
    queue = exercises.start_8(tmp)
    replay = queue.enqueue_jsonl(E0001_LINE)
    queue.prune(60)
    return queue, replay


def on_another_queue(queue: Queue, tmp: Path) -> EnqueueResult:
    return Queue(tmp / "mine.sqlite3").enqueue_jsonl(E0001_LINE)


PRUNE = "use `q8.prune(older_than)`"
ROUTES = [
    Route(8, "the-naive-cleanup-then-a-replay", naive_then_replay,
          ("the keys of E0002, E0003 were deleted with their rows",
           "E0001 was enqueued again as a new event", "a books table",
           "the replay inserted 1 event"), PRUNE, (10000, 1, {"done": 1, "dead": 1})),
    Route(8, "pruned-by-hand-with-sql", hand_pruned,
          ("a hand edit: q8's file was changed around the package's calls",), "run `start_8` "
          "again", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "a-replay-without-any-prune", replay_only,
          ("E0001 still holds its payload and journal: no prune has reached it",),
          "`q8.prune(3602)` or less", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "a-prune-that-reaches-nothing", too_old_a_horizon,
          ("no prune has reached it",), "q8.prune(3602)", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "pruned-but-the-replay-not-kept", pruned_then(None),
          ("expected what q8.enqueue_jsonl returned, found none",), "replay_8 = q8.enqueue_jsonl",
          (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "a-replay-with-another-amount", pruned_then(conflicting),
          ("the replay was refused (batch_conflict)",), "E0001_LINE", (17000, 3,
                                                                       {"done": 3, "dead": 1})),
    Route(8, "a-replay-kept-from-another-queue", pruned_then(on_another_queue),
          ("the replay inserted 1 event: where it ran, E0001's key was not there",),
          "on q8 itself", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "a-replay-made-up-by-hand", pruned_then({"inserted": 0, "duplicates": 1}),
          ("expected what q8.enqueue_jsonl returned (an EnqueueResult), found",),
          "replay_8 = q8.enqueue_jsonl", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "a-result-typed-by-hand-after-the-prune",
          pruned_then(EnqueueResult(inserted=0, duplicates=1)),
          ("no replay of E0001 ran on q8 after its prune", "a result typed by hand is no "
           "replay"), "prune first, then replay on q8", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "the-replay-before-the-prune", replay_then_prune,
          ("no replay of E0001 ran on q8 after its prune", "a replay before the prune proves "
           "nothing"), "prune first, then replay on q8", (17000, 3, {"done": 3, "dead": 1})),
    Route(8, "exercise-1s-queue-passed-to-check-8", lambda t: (exercises.start_1(t), None),
          ("that is exercise 1's queue (q1, built by start_1), not exercise 8's",), "pass q8"),
]


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_each_wrong_route_of_exercise_8_is_refused_naming_what_is_wrong_and_what_to_do_next(
        route: Route, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = route.play(tmp_path)
    capsys.readouterr()
    verdict = exercises.check_8(*args)
    assert capsys.readouterr().out.splitlines() == [verdict.text]
    assert verdict.status == NOT_QUITE, verdict.text
    assert [said for said in route.says if said not in verdict.detail] == [], verdict.text
    assert route.next_step in verdict.next_step, verdict.text
    assert verdict.text.endswith(f". Next: {verdict.next_step}")
    assert "Traceback" not in verdict.text
    if route.reaches is not None:
        assert figures(args[0].path) == route.reaches
