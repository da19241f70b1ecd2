"""Every exercise check fails on its untouched start, passes once the reference
solution's steps are applied (and their accepted variants: capitals, the batch
calls of exercise 4, any mapping in exercise 5), and never raises, all through
the public API a learner uses in notebook 09. The catalogue of wrong routes is
in test_exercise_routes.py.

The steps applied here are those of notebooks/solutions/09_exercises_solutions.ipynb,
which nbval re-executes too. Each solved case also reads the database back
through a second connection, so a check that said "solved" too easily fails.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
from collections import Counter, OrderedDict
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import pytest

from conftest import DATA, read_back, snapshot
from queue_core import BatchRejected, Handler, Lease, LeaseLost, Queue, drain, finish
from queue_core.lab import exercises
from queue_core.lab.exercises import NOT_ATTEMPTED, NOT_QUITE, SOLVED, Verdict

NEW_E0005 = '{"event_id": "E0005", "payload": {"category": "pen", "amount_cents": 2000}}'
EDIT_E0001 = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 12000}}'
ACK = ("UPDATE messages SET state = 'done', lease_until = NULL, finished_at = :now "
       "WHERE event_id = :event_id AND generation = :generation")
INSERT = ("INSERT INTO effects (event_id, category, amount_cents) "
          "VALUES (:event_id, :category, :amount_cents)")


def figures(db: str) -> tuple[int, int, dict[str, int]]:
    """Total, effect count and states, as a second connection reads them."""
    total, effects = read_back(Path(db),
                               "SELECT coalesce(sum(amount_cents), 0), count(*) FROM effects")[0]
    states = dict(read_back(Path(db), "SELECT state, count(*) FROM messages GROUP BY state"))
    return total, effects, states


def one_verdict(capsys: pytest.CaptureFixture[str], verdict: Verdict) -> str:
    """The check printed exactly one line, and it is the verdict it returned."""
    printed = capsys.readouterr().out.splitlines()
    assert printed == [verdict.text]
    return verdict.text


def refused(action: Callable[[], Any]) -> Exception:
    with pytest.raises((BatchRejected, LeaseLost)) as caught:
        action()
    return caught.value


# -- exercise 1 ---------------------------------------------------------------------

def test_exercise_1_untouched_start_is_not_attempted(tmp_path: Path, capsys) -> None:
    queue = exercises.start_1(tmp_path)
    verdict = exercises.check_1(queue, None)
    assert verdict.status == NOT_ATTEMPTED
    assert one_verdict(capsys, verdict).startswith("Not attempted yet: ")


def test_exercise_1_a_new_event_after_the_refused_edit_is_solved(tmp_path: Path, capsys) -> None:
    queue = exercises.start_1(tmp_path)
    refusal = refused(lambda: queue.enqueue_jsonl(EDIT_E0001))
    assert refusal.code == "batch_conflict"
    queue.enqueue_jsonl(NEW_E0005)
    drain(queue, Handler())
    verdict = exercises.check_1(queue, refusal)
    assert verdict.status == SOLVED, one_verdict(capsys, verdict)
    assert figures(queue.path) == (19000, 4, {"done": 4, "dead": 1})
    e0001 = read_back(Path(queue.path), "SELECT amount_cents FROM effects WHERE event_id = 'E0001'")
    assert e0001 == [(10000,)]


# -- exercise 2 ---------------------------------------------------------------------

def test_exercise_2_untouched_start_is_not_attempted(tmp_path: Path) -> None:
    assert exercises.check_2(exercises.start_2(tmp_path)).status == NOT_ATTEMPTED


@pytest.mark.parametrize("why, said", [
    ("a", "you chose a), which is not the right explanation"),
    ("C", "you chose c), which is not the right explanation"),
    ("x", "expected one of the letters a, b or c, found 'x'"),
    (None, "expected one of the letters a, b or c, found None"),
], ids=["choice-a", "choice-C", "no-letter", "no-choice"])
def test_exercise_2_a_wrong_or_missing_explanation_is_not_quite_and_says_which(
        tmp_path: Path, why: Any, said: str) -> None:
    queue = exercises.start_2(tmp_path)
    refusal = refused(lambda: queue.enqueue_file(DATA / "conflict.jsonl"))
    verdict = exercises.check_2(queue, refusal, why)
    assert verdict.status == NOT_QUITE and said in verdict.text
    assert figures(queue.path) == (17000, 3, {"done": 3, "dead": 1})


@pytest.mark.parametrize("why", ["B", " b ", "b)"])
def test_exercise_2_the_right_letter_in_any_case_is_solved(tmp_path: Path, why: str) -> None:
    queue = exercises.start_2(tmp_path)
    refusal = refused(lambda: queue.enqueue_file(DATA / "conflict.jsonl"))
    assert exercises.check_2(queue, refusal, why).status == SOLVED
    assert figures(queue.path) == (17000, 3, {"done": 3, "dead": 1})


def test_exercise_2_the_batch_refused_whole_with_the_right_reason_is_solved(tmp_path: Path) -> None:
    queue = exercises.start_2(tmp_path)
    before = snapshot(Path(queue.path))
    refusal = refused(lambda: queue.enqueue_file(DATA / "conflict.jsonl"))
    assert (refusal.code, refusal.line) == ("batch_conflict", 2)
    assert exercises.check_2(queue, refusal, "b").status == SOLVED
    assert snapshot(Path(queue.path)) == before


# -- exercise 3 ---------------------------------------------------------------------

def test_exercise_3_untouched_start_is_not_attempted(tmp_path: Path) -> None:
    assert exercises.check_3(exercises.start_3(tmp_path)).status == NOT_ATTEMPTED


def test_exercise_3_support_first_then_redrive_is_solved(tmp_path: Path) -> None:
    queue = exercises.start_3(tmp_path)
    newer = Handler().supporting("toy")
    queue.redrive("E0004")
    drain(queue, newer)
    assert exercises.check_3(queue).status == SOLVED
    assert figures(queue.path) == (20000, 4, {"done": 4})



def test_exercise_3_a_fixed_handler_without_a_redrive_is_not_quite_and_says_to_redrive(
        tmp_path: Path, capsys) -> None:
    queue = exercises.start_3(tmp_path)
    newer_handler = Handler().supporting("toy")
    assert drain(queue, newer_handler) == []  # nothing due: E0004 is dead
    capsys.readouterr()

    verdict = exercises.check_3(queue)

    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        "Not quite: a worker ran on q3 and found nothing to claim: E0004 is still dead, not "
        "redriven, and no worker takes a dead message, whatever its handler knows: a fixed "
        "handler alone does not bring E0004 back. Next: keep your handler that knows toy and "
        "redrive E0004 first: `q3.redrive(\"E0004\")`, then `drain(q3, newer_handler)`")
    assert exercises.check_3(exercises.start_3(tmp_path)).status == NOT_ATTEMPTED  # a new start

# -- exercise 4 ---------------------------------------------------------------------

Refusal = tuple[Lease, Exception]


def stall_then_dead(queue: Queue, handler: Handler) -> tuple[Lease, Refusal]:
    """W1 stalls past its lease, W2 takes E0004 over and sends it dead; W1's
    late ACK is refused. Returns W1's lease and that refusal."""
    w1 = queue.claim()
    queue.clock.advance(2)  # type: ignore[attr-defined]
    w2 = queue.claim()
    assert w1 is not None and w2 is not None
    before = (w1, refused(lambda: queue.complete(w1, handler)))
    finish(queue, w2, handler)
    return w1, before


def stalled_worker_story(queue: Queue) -> tuple[Refusal, Refusal, Lease]:
    """The reference solution: W1 stalls, W2 sends E0004 dead, a redrive, W3 finishes."""
    handler = Handler()
    w1, before = stall_then_dead(queue, handler)
    queue.redrive("E0004")
    newer = handler.supporting("toy")
    w3 = queue.claim()
    assert w3 is not None and w3.attempt == w1.attempt == 1
    after = (w1, refused(lambda: queue.complete(w1, newer)))
    queue.complete(w3, newer)
    return before, after, w3


def test_exercise_4_untouched_start_is_not_attempted(tmp_path: Path) -> None:
    assert exercises.check_4(exercises.start_4(tmp_path)).status == NOT_ATTEMPTED


def test_exercise_4_a_refusal_before_the_redrive_only_with_e0004_left_dead_is_not_quite(
        tmp_path: Path, capsys) -> None:
    queue = exercises.start_4(tmp_path)
    _, before = stall_then_dead(queue, Handler())
    verdict = exercises.check_4(queue, before, None)
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert "dead expected 0, found 1" in text and "after the redrive" in text


def test_exercise_4_the_stalled_worker_fenced_before_and_after_a_redrive_is_solved(
        tmp_path: Path) -> None:
    queue = exercises.start_4(tmp_path)
    before, after, _ = stalled_worker_story(queue)
    assert before[1].code == after[1].code == "stale_generation"
    assert exercises.check_4(queue, before, after).status == SOLVED
    assert figures(queue.path) == (3000, 1, {"done": 1})


def test_exercise_4_both_refusals_on_one_side_of_the_redrive_are_not_quite(
        tmp_path: Path, capsys) -> None:
    # Both taken before the redrive (each read generation 2), or both after W3's claim
    # (generation 3): the money is right, and "also after a redrive" was never shown.
    handler = Handler()
    (tmp_path / "early").mkdir()
    (tmp_path / "late").mkdir()
    early = exercises.start_4(tmp_path / "early")
    w1, first = stall_then_dead(early, handler)
    second = (w1, refused(lambda: early.complete(w1, handler)))
    early.redrive("E0004")
    newer = handler.supporting("toy")
    early.complete(early.claim(), newer)

    late = exercises.start_4(tmp_path / "late")
    w1 = late.claim()
    late.clock.advance(2)  # type: ignore[attr-defined]
    finish(late, late.claim(), handler)
    late.redrive("E0004")
    w3 = late.claim()
    one, two = (w1, refused(lambda: late.complete(w1, newer))), \
        (w1, refused(lambda: late.complete(w1, newer)))
    late.complete(w3, newer)

    verdict = exercises.check_4(early, first, second)
    assert verdict.status == NOT_QUITE
    assert "after the redrive: that refusal was taken before the redrive (E0004 was dead, " \
           "generation 2, when it came)" in one_verdict(capsys, verdict)
    verdict = exercises.check_4(late, one, two)
    assert verdict.status == NOT_QUITE
    assert "before the redrive: that refusal was taken after the redrive (E0004 was leased, " \
           "generation 3, when it came)" in one_verdict(capsys, verdict)
    for queue in (early, late):
        assert figures(queue.path) == (3000, 1, {"done": 1})


def test_exercise_4_a_refusal_read_ready_before_the_redrive_is_before_it(tmp_path: Path) -> None:
    # W2 gives E0004 back (ready, generation 2) before W1's first late ACK; W3 sends it
    # dead, and the redrive keeps generation 3: ready at generation 2 came before it.
    queue, handler = exercises.start_4(tmp_path), Handler()
    w1 = queue.claim()
    queue.clock.advance(2)  # type: ignore[attr-defined]
    queue.release(queue.claim())
    before = (w1, refused(lambda: queue.complete(w1, handler)))
    finish(queue, queue.claim(), handler)
    queue.redrive("E0004")
    newer = handler.supporting("toy")
    w4 = queue.claim()
    after = (w1, refused(lambda: queue.complete(w1, newer)))
    queue.complete(w4, newer)

    assert [(p[1].stored_state, p[1].stored_generation) for p in (before, after)] == [
        ("ready", 2), ("leased", 4)]
    assert exercises.check_4(queue, before, after).status == SOLVED
    assert figures(queue.path) == (3000, 1, {"done": 1})


def test_exercise_4_played_with_batch_claims_and_acks_is_solved_too(tmp_path: Path) -> None:
    """EXERCISES.md, going further: claim_batch and complete_batch, whose refusals
    come back in the result list instead of being raised."""
    queue, handler = exercises.start_4(tmp_path), Handler()
    [w1] = queue.claim_batch(1)
    queue.clock.advance(2)  # type: ignore[attr-defined]
    [w2] = queue.claim_batch(1)
    before = (w1, queue.complete_batch([w1], handler)[0])
    [dead] = queue.complete_batch([w2], handler)
    queue.fail(w2, "invalid_payload", permanent=True)
    queue.redrive("E0004")
    newer = handler.supporting("toy")
    [w3] = queue.claim_batch(1)
    after, done = queue.complete_batch([w1, w3], newer)
    assert isinstance(before[1], LeaseLost) and isinstance(after, LeaseLost)
    assert type(dead).__name__ == "InvalidPayload" and done.amount_cents == 3000
    assert exercises.check_4(queue, before, (w1, after)).status == SOLVED
    assert figures(queue.path) == (3000, 1, {"done": 1})


def test_exercise_4_its_story_run_again_on_a_used_start_asks_for_start_4_and_never_raises(
        tmp_path: Path, capsys) -> None:
    queue = exercises.start_4(tmp_path)
    before, after, _ = stalled_worker_story(queue)
    assert exercises.check_4(queue, before, after).status == SOLVED
    capsys.readouterr()
    assert queue.claim() is None  # what the story's first line now gets
    for parts in ((None, None), ((None, None), None)):
        verdict = exercises.check_4(queue, *parts)
        assert verdict.status == NOT_QUITE
        assert "run `start_4` again" in one_verdict(capsys, verdict)
    assert figures(queue.path) == (3000, 1, {"done": 1})

# -- exercise 5 ---------------------------------------------------------------------

def sql_metric(sql: str) -> Callable[[str], dict[str, int]]:
    def metric(db_path: str) -> dict[str, int]:
        conn = sqlite3.connect(db_path)
        try:
            return dict(conn.execute(sql))
        finally:
            conn.close()
    return metric


def test_exercise_5_a_none_placeholder_is_not_attempted() -> None:
    assert exercises.check_5(None).status == NOT_ATTEMPTED


def test_exercise_5_the_attempts_of_dead_rows_is_solved_and_matches_metrics(tmp_path: Path) -> None:
    metric = sql_metric("SELECT event_id, attempts FROM messages WHERE state = 'dead'")
    assert exercises.check_5(metric).status == SOLVED
    queue = exercises.start_5(tmp_path)
    assert metric(queue.path) == dict(queue.metrics().dead_attempts) == {"E0501": 3, "E0502": 3}


def rows_as(kind: Callable[[list[tuple[str, int]]], Any]) -> Callable[[str], Any]:
    """A metric in the learner's own SQL whose result is ``kind(rows)``."""
    def metric(db_path: str) -> Any:
        conn = sqlite3.connect(db_path)
        try:
            return kind(conn.execute("SELECT event_id, attempts FROM messages "
                                     "WHERE state = 'dead' ORDER BY event_id DESC").fetchall())
        finally:
            conn.close()
    return metric


@pytest.mark.parametrize("kind", [dict, OrderedDict, lambda rows: MappingProxyType(dict(rows)),
                                  lambda rows: Counter(dict(rows))],
                         ids=["dict", "OrderedDict", "mapping-proxy", "Counter"])
def test_exercise_5_any_mapping_of_event_ids_to_attempts_in_any_order_is_solved(
        kind: Callable[[list[tuple[str, int]]], Any]) -> None:
    assert exercises.check_5(rows_as(kind)).status == SOLVED


@pytest.mark.parametrize("escape", [SystemExit(3), KeyboardInterrupt()], ids=["exit", "interrupt"])
def test_exercise_5_a_metric_that_exits_or_is_interrupted_gets_a_verdict_not_a_raise(
        escape: BaseException, capsys) -> None:
    def leaving(db_path: str) -> None:
        raise escape
    verdict = exercises.check_5(leaving)
    assert verdict.status == NOT_QUITE and type(escape).__name__ in verdict.text
    assert verdict.next_step
    one_verdict(capsys, verdict)



def test_exercise_5_a_journal_mode_pragma_is_named_with_its_real_reason_not_as_a_lock(
        capsys) -> None:
    def leaving_wal(db_path: str) -> dict[str, int]:
        conn = sqlite3.connect(db_path)
        try:
            conn.execute("PRAGMA journal_mode=DELETE")  # SQLite answers: database is locked
            return dict(conn.execute("SELECT event_id, attempts FROM messages "
                                     "WHERE state = 'dead'"))
        finally:
            conn.close()

    verdict = exercises.check_5(leaving_wal)

    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        "Not quite: on 'the reference scenario (E0004, unknown category)' your function ran "
        "`PRAGMA journal_mode=DELETE`, which changes the file it measures (its journal_mode), "
        "not only reads it: SQLite changes a WAL file's journal mode only when no other "
        "connection has the file open, and the check holds one open, so it raised "
        "OperationalError: database is locked. Next: remove the PRAGMA and only read: "
        "`sqlite3.connect` and a SELECT; no CREATE, INSERT, UPDATE or DELETE, no claim")


def test_exercise_5_a_pragma_that_only_reads_or_keeps_wal_is_no_write() -> None:
    def reading_pragmas(db_path: str) -> dict[str, int]:
        conn = sqlite3.connect(db_path)
        try:
            conn.execute("PRAGMA journal_mode").fetchone()
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            return dict(conn.execute("SELECT event_id, attempts FROM messages "
                                     "WHERE state = 'dead'"))
        finally:
            conn.close()

    assert exercises.check_5(reading_pragmas).status == SOLVED

# -- exercise 6 ---------------------------------------------------------------------

def test_exercise_6_untouched_start_is_not_attempted(tmp_path: Path, capsys) -> None:
    queue = exercises.start_6(tmp_path)
    assert exercises.run_naive_worker(queue, None) is None
    assert capsys.readouterr().out.startswith("Nothing to run yet")
    assert exercises.check_6(queue, None).status == NOT_ATTEMPTED


def test_exercise_6_ack_before_insert_and_a_real_crash_lose_the_effect_and_is_solved(
        tmp_path: Path) -> None:
    queue = exercises.start_6(tmp_path)
    run = exercises.run_naive_worker(queue, [ACK, INSERT])
    assert run is not None and (run.exit_code, run.committed) == (86, 1)
    assert exercises.check_6(queue, run).status == SOLVED
    assert figures(queue.path) == (0, 0, {"done": 1})
    assert queue.claim() is None  # done: no worker will ever be handed E0003 again


def test_exercise_6_run_later_on_the_model_clock_is_solved_too(tmp_path: Path) -> None:
    """The check replays the run at the run's own model time."""
    queue = exercises.start_6(tmp_path)
    queue.clock.advance(5)  # type: ignore[attr-defined]
    run = exercises.run_naive_worker(queue, [ACK, INSERT])
    assert run is not None and run.now == 1005
    assert exercises.check_6(queue, run).status == SOLVED
    assert figures(queue.path) == (0, 0, {"done": 1})


def test_exercise_6_its_worker_run_again_on_a_used_start_asks_for_start_6(
        tmp_path: Path, capsys) -> None:
    queue = exercises.start_6(tmp_path)
    first = exercises.run_naive_worker(queue, [ACK, INSERT])
    assert exercises.check_6(queue, first).status == SOLVED
    again = exercises.run_naive_worker(queue, [ACK, INSERT])
    assert again is not None and again.event_id is None and again.exit_code == 0
    capsys.readouterr()
    verdict = exercises.check_6(queue, again)
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert "E0003 is already done" in text and "run `start_6` again" in text
    assert "exit code expected" not in text
    assert figures(queue.path) == (0, 0, {"done": 1})

# -- every check ----------------------------------------------------------------------

CHECKS: list[tuple[str, Callable[..., Verdict], tuple[Any, ...]]] = [
    ("check_1", exercises.check_1, (42, "not an error")),
    ("check_2", exercises.check_2, ("no such file", object(), 7)),
    ("check_3", exercises.check_3, (None,)),
    ("check_4", exercises.check_4, (3.5, ("a", "b"), [1])),
    ("check_5", exercises.check_5, ("SELECT 1",)),
    ("check_6", exercises.check_6, (b"bytes", "not a run")),
    ("check_8", exercises.check_8, (1.5, {"inserted": 0, "duplicates": 1})),
    ("check_10", exercises.check_10, ({"priority": 9},)),
]


@pytest.mark.parametrize("name, check, args", CHECKS, ids=[c[0] for c in CHECKS])
def test_a_check_given_garbage_prints_one_verdict_and_never_raises(
        name: str, check: Callable[..., Verdict], args: tuple[Any, ...], capsys) -> None:
    verdict = check(*args)
    assert verdict.status in (NOT_ATTEMPTED, NOT_QUITE)
    assert verdict.next_step  # every verdict short of solved says what to do next
    one_verdict(capsys, verdict)


@pytest.mark.parametrize("number", [1, 2, 3, 4, 6, 8, 10])
def test_a_not_attempted_verdict_says_where_to_begin(tmp_path: Path, number: int) -> None:
    queue = getattr(exercises, f"start_{number}")(tmp_path)
    verdict = getattr(exercises, f"check_{number}")(queue)
    assert verdict.status == NOT_ATTEMPTED
    assert verdict.next_step and verdict.text == f"Not attempted yet: {verdict.next_step}"


@pytest.mark.parametrize("number", [1, 2, 3, 4, 6, 8, 10])
def test_a_check_on_a_wrong_file_type_is_not_quite_and_leaves_the_file_alone(
        tmp_path: Path, number: int) -> None:
    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    verdict = getattr(exercises, f"check_{number}")(other)
    assert verdict.status == NOT_QUITE
    assert other.read_bytes() == before


def test_a_check_reads_without_writing_and_its_text_holds_no_path(tmp_path: Path) -> None:
    queue = exercises.start_3(tmp_path)
    queue.redrive("E0004")
    drain(queue, Handler())
    before = snapshot(Path(queue.path))
    verdicts = [exercises.check_3(target) for target in (queue, Path(queue.path), str(queue.path))]
    assert snapshot(Path(queue.path)) == before
    assert len({v.text for v in verdicts}) == 1 and str(tmp_path) not in verdicts[0].text


def test_running_a_start_again_starts_the_exercise_over(tmp_path: Path) -> None:
    queue = exercises.start_6(tmp_path)
    exercises.run_naive_worker(queue, [ACK, INSERT])
    again = exercises.start_6(tmp_path)
    assert figures(again.path) == (0, 0, {"ready": 1})
    assert exercises.check_6(again, None).status == NOT_ATTEMPTED


def test_a_verdict_shows_no_temporary_path_and_no_memory_address(tmp_path: Path) -> None:
    raised = exercises.check_5(lambda db_path: open(db_path + "/missing.txt"))
    assert raised.status == NOT_QUITE and "<path>" in raised.text and "/" not in raised.text
    odd = exercises.check_6(exercises.start_6(tmp_path), object())
    assert odd.status == NOT_QUITE and "0x" not in odd.text


# -- EXERCISES.md ----------------------------------------------------------------------

EXERCISES_MD = (DATA.parent / "EXERCISES.md").read_text(encoding="utf-8")
# every exercise has a check: EXERCISES.md must describe exactly those
NUMBERS = sorted(int(name[6:]) for name in dir(exercises) if re.fullmatch(r"check_\d+", name))


def anchors() -> set[str]:
    """The explicit anchors (``<a id="...">``) of EXERCISES.md: they work on a code
    forge and in JupyterLab alike, whose ids for headings differ."""
    return set(re.findall(r'<a id="([A-Za-z0-9_-]+)"></a>', EXERCISES_MD))


def sections() -> dict[int, str]:
    parts = EXERCISES_MD.split("\n## Exercise ")[1:]
    return {int(part.split(":", 1)[0]): part for part in parts}


def test_exercises_md_has_a_section_per_check_each_with_goal_why_start_hints_and_solved() -> None:
    found = sections()
    assert NUMBERS == list(range(1, max(NUMBERS) + 1)) and len(NUMBERS) >= 9
    assert sorted(found) == NUMBERS
    for number, text in found.items():
        for part in ("Goal.", "Why it matters.", "Where to start.", "Solved means:"):
            assert f"**{part}**" in text, (number, part)
        hints = [f"<summary>Hint {n}</summary>" in text for n in (1, 2, 3)]
        assert hints == [True, True, True], number
        assert f"exercises.start_{number}(workdir)" in text, number


def test_each_exercise_heading_has_an_explicit_anchor_right_before_it() -> None:
    for number in NUMBERS:
        assert re.search(rf'<a id="exercise-{number}"></a>\n(<a id="[^"]+"></a>\n)*\n'
                         rf"## Exercise {number}:", EXERCISES_MD), number


def test_every_link_to_an_exercise_lands_on_an_explicit_anchor() -> None:
    notebooks = (DATA.parent / "notebooks").rglob("*.ipynb")
    texts = [EXERCISES_MD, (DATA.parent / "README.md").read_text(encoding="utf-8")]
    texts += [path.read_text(encoding="utf-8") for path in notebooks
              if ".ipynb_checkpoints" not in path.parts]
    links = {match for text in texts
             for match in re.findall(r"EXERCISES\.md#([A-Za-z0-9_-]+)", text)}
    links |= set(re.findall(r"\]\(#([A-Za-z0-9_-]+)\)", EXERCISES_MD))
    assert {f"exercise-{n}" for n in NUMBERS} <= links
    assert sorted(links - anchors()) == []


def test_exercise_5s_prepared_databases_listed_in_exercises_md_are_those_the_check_runs(
        capsys) -> None:
    listed = sections()[5].split("The check prepares its own databases", 1)[1]
    bullets = re.findall(r"^- (.+);?$", listed.split("\n\n<details>", 1)[0], re.MULTILINE)
    metric = sql_metric("SELECT event_id, attempts FROM messages WHERE state = 'dead'")
    verdict = exercises.check_5(metric)
    assert verdict.status == SOLVED
    assert f"on all {len(bullets)} prepared databases" in verdict.text
    assert f"{_number_word(len(bullets))} of them" in listed


def _number_word(n: int) -> str:
    return ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"][n]


# -- a work folder removed, a queue of another exercise ----------------------------------

STARTS = [*range(1, 8), 10]


def removed_folder() -> Path:
    """A work folder as the notebook makes it, then removed by ``scratch.cleanup()``."""
    scratch = tempfile.TemporaryDirectory(prefix="queue-exercises-")
    scratch.cleanup()
    return Path(scratch.name)


@pytest.mark.parametrize("number", STARTS)
def test_a_start_in_a_removed_work_folder_says_to_run_the_first_cell_again_and_raises_nothing(
        number: int, capsys) -> None:
    gone = removed_folder()
    assert getattr(exercises, f"start_{number}")(gone) is None
    assert capsys.readouterr().out.splitlines() == [
        f"Cannot start exercise {number}: its work folder does not exist (any more: "
        "`scratch.cleanup()` removes it). Run the notebook's first code cell again (it makes a "
        f"new workdir), then `q{number} = exercises.start_{number}(workdir)`"]
    assert not gone.exists()  # refused: no folder made behind the learner's back
    exercises.show(None)      # the start cell's own next line
    assert capsys.readouterr().out == "Nothing to show: no queue (the start cell above says why)\n"


def test_a_start_given_no_folder_or_a_file_says_what_to_pass(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    assert exercises.start_3(42) is None and exercises.start_3(a_file) is None
    assert capsys.readouterr().out.splitlines() == [
        "Cannot start exercise 3: pass the work folder, `q3 = exercises.start_3(workdir)`, "
        "found a value of type int",
        "Cannot start exercise 3: the work folder given is a file, not a folder: pass workdir, "
        "`q3 = exercises.start_3(workdir)`"]


@pytest.mark.parametrize("number", [1, 2, 3, 4, 6, 7, 10])
def test_a_check_of_a_queue_whose_folder_was_removed_says_to_run_the_first_cell_again(
        number: int, capsys) -> None:
    scratch = tempfile.TemporaryDirectory(prefix="queue-exercises-")
    queue = getattr(exercises, f"start_{number}")(Path(scratch.name))
    scratch.cleanup()
    capsys.readouterr()
    verdict = getattr(exercises, f"check_{number}")(queue)
    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        f"Not quite: q{number}'s file does not exist any more (`scratch.cleanup()` removes the "
        "work folder). Next: run the notebook's first code cell again, then "
        f"`q{number} = exercises.start_{number}(workdir)` and your cells")


def test_the_workers_of_exercises_6_and_7_refuse_a_queue_whose_folder_was_removed(
        capsys) -> None:
    scratch = tempfile.TemporaryDirectory(prefix="queue-exercises-")
    q6, q7 = exercises.start_6(Path(scratch.name)), exercises.start_7(Path(scratch.name))
    scratch.cleanup()
    capsys.readouterr()
    assert exercises.run_naive_worker(q6, [ACK, INSERT]) is None
    assert exercises.run_takeover_7(q7, lambda queue, line: None) is None  # before any server
    assert capsys.readouterr().out.splitlines() == [
        f"Cannot run: q{n}'s file does not exist any more (`scratch.cleanup()` removes the work "
        f"folder): run the notebook's first code cell again, then "
        f"`q{n} = exercises.start_{n}(workdir)`" for n in (6, 7)]
    assert not Path(scratch.name).exists()


OTHER_QUEUE = [(3, 1), (1, 3), (2, 1), (4, 6), (6, 4), (7, 6), (1, 7), (8, 1), (1, 8), (10, 9),
               (9, 10), (10, 1)]


@pytest.mark.parametrize("number, other", OTHER_QUEUE, ids=[f"check_{n}-given-q{o}"
                                                            for n, o in OTHER_QUEUE])
def test_a_check_given_another_exercises_queue_says_whose_it_is_and_which_to_pass(
        tmp_path: Path, number: int, other: int, capsys) -> None:
    queue = getattr(exercises, f"start_{other}")(tmp_path)
    capsys.readouterr()
    verdict = getattr(exercises, f"check_{number}")(queue)
    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        f"Not quite: that is exercise {other}'s queue (q{other}, built by start_{other}), not "
        f"exercise {number}'s. Next: pass q{number}, the queue `q{number} = "
        f"exercises.start_{number}(workdir)` returned: `exercises.check_{number}(q{number}, ...)`")


# -- following a verdict's next step literally ----------------------------------------------

def snippets(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_exercise_3_redriven_but_not_drained_names_the_handler_that_works_and_it_solves_it(
        tmp_path: Path) -> None:
    queue = exercises.start_3(tmp_path)
    queue.redrive("E0004")
    verdict = exercises.check_3(queue)
    assert verdict.status == NOT_QUITE
    code = snippets(verdict.next_step)
    assert code[:2] == ["drain(q3, newer_handler)", 'newer_handler = Handler().supporting("toy")']
    assert "`Handler()` alone does not know toy" in verdict.next_step
    scope = {"q3": queue, "Handler": Handler, "drain": drain}
    exec(code[1], scope)   # the assignment first, then the worker, as the next step says
    exec(code[0], scope)
    assert exercises.check_3(queue).status == SOLVED
    assert figures(queue.path) == (20000, 4, {"done": 4})


def test_exercise_1_enqueued_but_not_drained_names_a_worker_call_that_solves_it(
        tmp_path: Path) -> None:
    queue = exercises.start_1(tmp_path)
    refusal = refused(lambda: queue.enqueue_jsonl(EDIT_E0001))
    queue.enqueue_jsonl(NEW_E0005)
    verdict = exercises.check_1(queue, refusal)
    assert verdict.status == NOT_QUITE and "E0005 is ready" in verdict.detail
    [call] = snippets(verdict.next_step)
    exec(call, {"q1": queue, "Handler": Handler, "drain": drain})
    assert exercises.check_1(queue, refusal).status == SOLVED


def test_exercise_2_the_path_written_from_the_repository_root_is_named_as_seen_from_the_notebook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The notebook runs in notebooks/: there the path EXERCISES.md's Goal shows first,
    data/conflict.jsonl, leads nowhere; the verdict names the one that does."""
    monkeypatch.chdir(DATA.parent / "notebooks")
    queue = exercises.start_2(tmp_path)
    missing = refused(lambda: queue.enqueue_file("data/conflict.jsonl"))
    assert missing.code == "file_not_found"
    verdict = exercises.check_2(queue, missing, "b")
    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        "Not quite: the conflicting batch: the file was not found (file_not_found): a relative "
        "path starts from the folder the notebook runs in (notebooks/ for notebook 09), so the "
        'batch\'s path is "../data/conflict.jsonl". Next: set `conflict_file = '
        '"../data/conflict.jsonl"` and run that cell again')
    [assignment] = snippets(verdict.next_step)
    scope: dict[str, Any] = {}
    exec(assignment, scope)
    conflict = refused(lambda: queue.enqueue_file(scope["conflict_file"]))
    assert exercises.check_2(queue, conflict, "b").status == SOLVED
    assert "../data/conflict.jsonl" in sections()[2].split("**Why it matters.**")[0]
