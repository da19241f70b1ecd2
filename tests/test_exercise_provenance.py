"""A check accepts only work done through the package's calls on the queue that its
own start handed out in this kernel.

Three classes of wrong route, each played for real: someone else's queue (a
course helper's, one of the learner's own, a byte copy, one from another
interpreter, a start built again since), a forged history (rows written with
SQL in the engine's exact shape, so that the audit finds nothing, and such an
edit followed by a call that would sign it), and the answer key in reach (a
public name holding a right answer). Each verdict names what is wrong and
says what to do next; the right money proves that the figures alone would
have passed.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import shutil
import sqlite3
import subprocess
import sys
import pkgutil
from pathlib import Path
from typing import Callable

import pytest

from conftest import ROOT
from queue_core import Handler, ModelClock, Queue, drain
from queue_core.values import Effect
from queue_core.audit import check, snapshot
from queue_core.lab import exercises
from queue_core.lab.exercises import NOT_QUITE, SOLVED
from queue_core.lab.exercises.provenance import SUFFIX
from queue_core.lab.story import run_scenario
from test_exercises import figures

TOY = Handler().supporting("toy")


def solve_3(queue: Queue) -> Queue:
    queue.redrive("E0004")
    drain(queue, TOY)
    return queue


def verdict_of(capsys: pytest.CaptureFixture[str], verdict: exercises.Verdict) -> str:
    out = capsys.readouterr().out.strip()
    assert out == verdict.text  # one line, printed once
    return out


# -- someone else's queue ----------------------------------------------------------------

def test_a_queue_a_course_helper_built_and_finished_elsewhere_is_not_exercise_3s(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "helper").mkdir()
    exercises.start_3(tmp_path / "mine")
    run_scenario(tmp_path / "helper", say=lambda _: None)  # it ends with toy recovered
    helpers = Queue(tmp_path / "helper" / "demo.sqlite3")
    capsys.readouterr()
    assert figures(helpers.path) == (20000, 4, {"done": 4})  # the right figures

    verdict = exercises.check_3(helpers)

    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict) == (
        "Not quite: that queue was not handed out by start_3 in this kernel (a course helper's, "
        "a copy of a start's file, one your own code built, or one from before the kernel "
        "restarted), so its contents say nothing about your cells. Next: run "
        "`q3 = exercises.start_3(workdir)`, then your cells on that q3, and pass it here")


def test_a_byte_copy_of_a_solved_queue_in_another_folder_is_not_the_start_s_queue(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    q3 = solve_3(exercises.start_3(tmp_path / "a"))
    copy = tmp_path / "b" / "exercise_3.sqlite3"
    shutil.copy(q3.path, copy)
    shutil.copy(q3.path + SUFFIX, str(copy) + SUFFIX)  # its witness too
    capsys.readouterr()

    assert exercises.check_3(q3).status == SOLVED
    verdict = exercises.check_3(Queue(copy))

    assert verdict.status == NOT_QUITE
    assert "not handed out by start_3 in this kernel" in verdict.text
    assert "Next: run `q3 = exercises.start_3(workdir)`" in verdict.text


def test_a_queue_solved_in_another_interpreter_is_refused_though_its_witness_is_beside_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = ("import sys; from queue_core import Handler, drain; "
            "from queue_core.lab import exercises; q = exercises.start_3(sys.argv[1]); "
            "q.redrive('E0004'); drain(q, Handler().supporting('toy')); "
            "assert exercises.check_3(q).status == 'solved'")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=ROOT,
                   capture_output=True, timeout=120)
    assert figures(tmp_path / "exercise_3.sqlite3") == (20000, 4, {"done": 4})

    verdict = exercises.check_3(Queue(tmp_path / "exercise_3.sqlite3"))

    assert verdict.status == NOT_QUITE and "not handed out by start_3 in this kernel" in \
        verdict_of(capsys, verdict)


def test_an_older_q3_after_start_3_built_its_file_again_is_told_apart_from_a_hand_edit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    older = solve_3(exercises.start_3(tmp_path))
    newer = exercises.start_3(tmp_path)
    capsys.readouterr()

    verdict = exercises.check_3(older)

    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict) == (
        "Not quite: start_3 has built this file again since that q3 was handed out: the file "
        "holds the newer start now, not the older q3's work. Next: run your cells on the q3 "
        "that the last `q3 = exercises.start_3(workdir)` returned (or run that start once "
        "more, then your cells)")
    assert "hand edit" not in verdict.text
    assert exercises.check_3(solve_3(newer)).status == SOLVED


def test_a_queue_of_the_learners_own_on_the_start_s_file_is_not_the_start_s_queue(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q3 = exercises.start_3(tmp_path)
    solve_3(Queue(q3.path, clock=q3.clock, lease_seconds=2))  # the right calls, not on q3
    capsys.readouterr()
    assert figures(q3.path) == (20000, 4, {"done": 4})

    verdict = exercises.check_3(q3)

    assert verdict.status == NOT_QUITE
    assert verdict.text.startswith("Not quite: a hand edit: q3's file was changed around the "
                                   "package's calls since the last call on q3 (SQL of your own, "
                                   "or a Queue of your own on its file)")
    assert verdict.next_step == ("run `start_3` again (`q3 = exercises.start_3(workdir)`) and "
                                 "change the queue only through q3's calls")


# -- a forged history ------------------------------------------------------------------------

def forged_solution(tmp_path: Path) -> Queue:
    """q3 given, by plain SQL, exactly the rows that the real solution writes: the
    same messages, effects and journal, to the last column."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "scratch").mkdir()
    q3 = exercises.start_3(tmp_path / "mine")
    model = solve_3(exercises.start_3(tmp_path / "scratch"))
    source = sqlite3.connect(model.path)
    rows = {table: source.execute(f"SELECT * FROM {table}").fetchall()
            for table in ("messages", "effects", "transitions")}
    source.close()
    conn = sqlite3.connect(q3.path)
    conn.execute("PRAGMA foreign_keys = OFF")
    for table in ("transitions", "effects", "messages"):
        conn.execute(f"DELETE FROM {table}")
    for table, found in rows.items():
        width = len(found[0])
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * width)})", found)
    conn.commit()
    conn.close()
    return q3


def test_a_history_forged_in_the_engines_exact_shape_is_found_though_the_audit_is_clean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q3 = forged_solution(tmp_path)
    capsys.readouterr()
    world = snapshot(q3.path)
    assert check(world) == []  # the audit alone cannot tell
    assert figures(q3.path) == (20000, 4, {"done": 4})

    verdict = exercises.check_3(q3)

    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict) == (
        "Not quite: a hand edit: q3's file was changed around the package's calls since the "
        "last call on q3 (SQL of your own, or a Queue of your own on its file). Next: run "
        "`start_3` again (`q3 = exercises.start_3(workdir)`) and change the queue only through "
        "q3's calls")


def test_a_forged_row_followed_by_a_real_call_is_not_laundered_by_that_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q1 = exercises.start_1(tmp_path)
    conn = sqlite3.connect(q1.path)  # an effect of 2000 for E0002, around the protocol
    conn.execute("UPDATE effects SET amount_cents = 4000 WHERE event_id = 'E0002'")
    conn.commit()
    conn.close()
    assert q1.claim() is None  # a call on q1 after the edit: it signs what it found
    capsys.readouterr()

    verdict = exercises.check_1(q1)

    assert verdict.status == NOT_QUITE
    assert "a hand edit: q1's file was changed around the package's calls before a later " \
           "call on q1" in verdict_of(capsys, verdict)
    assert "effect_differs: E0002" in verdict.text  # and the audit's finding beside it


def test_an_edited_or_removed_witness_is_refused_with_the_way_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q3 = solve_3(exercises.start_3(tmp_path))
    record = Path(q3.path + SUFFIX)
    lines = record.read_text().splitlines()
    entry = json.loads(lines[-1])
    entry["after"] = "0" * 64
    record.write_text("\n".join([*lines[:-1], json.dumps(entry)]) + "\n")
    capsys.readouterr()

    edited = exercises.check_3(q3)
    record.unlink()
    removed = exercises.check_3(q3)

    assert edited.status == removed.status == NOT_QUITE
    assert "q3's witness was edited: an entry's signature does not match" in edited.text
    assert "q3's witness (the file exercise_3.sqlite3.witness beside it, which records each " \
           "call) is gone" in removed.text
    assert edited.next_step == removed.next_step == (
        "run `start_3` again (`q3 = exercises.start_3(workdir)`) and change the queue only "
        "through q3's calls")


def test_the_naive_workers_process_signs_its_steps_and_a_run_on_a_plain_queue_does_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = ["UPDATE messages SET state = 'done', lease_until = NULL, finished_at = :now "
             "WHERE event_id = :event_id AND generation = :generation",
             "INSERT INTO effects (event_id, category, amount_cents) "
             "VALUES (:event_id, :category, :amount_cents)"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    q6 = exercises.start_6(tmp_path / "a")
    run = exercises.run_naive_worker(q6, steps)
    other = exercises.start_6(tmp_path / "b")
    plain = Queue(other.path, clock=other.clock, lease_seconds=2)
    plain_run = exercises.run_naive_worker(plain, steps)
    capsys.readouterr()
    assert figures(q6.path) == figures(other.path) == (0, 0, {"done": 1})

    assert exercises.check_6(q6, run).status == SOLVED
    verdict = exercises.check_6(other, plain_run)
    assert verdict.status == NOT_QUITE
    assert "a hand edit: q6's file was changed around the package's calls before a later call " \
           "on q6" not in verdict.text
    assert "q6's file was changed around the package's calls since the last call on q6" in \
        verdict.text


# -- the answer key in reach -------------------------------------------------------------------

def test_no_public_name_of_the_exercises_holds_a_right_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    modules = [exercises] + [importlib.import_module(info.name) for info in
                             pkgutil.iter_modules(exercises.__path__, "queue_core.lab.exercises.")]
    public = {f"{module.__name__}.{name}": getattr(module, name) for module in modules
              for name in dir(module) if not name.startswith("_")}
    # exercise 2's right letter, typed by hand, is solved; no public name holds it
    q2 = exercises.start_2(tmp_path)
    try:
        q2.enqueue_file(ROOT / "data" / "conflict.jsonl")
    except Exception as exc:  # noqa: BLE001 - the refusal the exercise keeps
        refusal = exc
    capsys.readouterr()
    assert exercises.check_2(q2, refusal, "b").status == SOLVED
    assert [name for name, value in public.items() if isinstance(value, str)
            and value.strip().strip(")").lower() == "b"] == []
    assert not hasattr(exercises, "WHY_WHOLE_BATCH")


# -- what a check cannot tell apart, as EXERCISES.md says ----------------------------------

def test_a_lease_built_by_hand_with_w1s_fields_is_w1s_fencing_token_for_the_check_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from queue_core import Lease, LeaseLost
    from test_exercises import stalled_worker_story

    q4 = exercises.start_4(tmp_path)
    before, after, _ = stalled_worker_story(q4)
    w1 = before[0]
    by_hand = Lease(w1.event_id, w1.generation, w1.attempt, w1.lease_until)
    assert by_hand == w1 and isinstance(before[1], LeaseLost)
    capsys.readouterr()

    verdict = exercises.check_4(q4, (by_hand, before[1]), (by_hand, after[1]))

    assert verdict.status == SOLVED
    assert figures(q4.path) == (3000, 1, {"done": 1})


def test_no_chapter_prints_the_body_of_exercise_7s_answer_key() -> None:
    from queue_core.lab.broker import inbox_step

    source = inspect.getsource(inbox_step)
    body = [line.strip() for line in source.split('"""')[-1].splitlines() if line.strip()]
    assert body[0] == "accepted = queue.enqueue_jsonl(line)"  # the lines that solve it
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):  # the solutions' folder aside
        cells = json.loads(path.read_text())["cells"]
        shown = "\n".join("".join(output.get("text", "")) + "".join(
            output.get("data", {}).get("text/plain", ""))
            for cell in cells for output in cell.get("outputs", ()))
        assert not any(line in shown for line in body[:2]), path.name


# -- SQL of one's own inside the queue's own transaction ---------------------------------------

def model_rows(path: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table of a queue file that the real calls solved."""
    conn = sqlite3.connect(path)
    try:
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {table: conn.execute(f'SELECT * FROM "{table}"').fetchall() for table in tables}
    finally:
        conn.close()


def written_in_its_transaction(queue: Queue, rows: dict[str, list[tuple[object, ...]]]) -> None:
    """``queue``'s tables given, inside ``queue.transaction()`` itself, exactly the rows of
    a solved queue: SQL of one's own in the engine's exact shape, through the public API."""
    with queue.transaction() as conn:
        rows_written(conn, rows)


def rows_written(conn: sqlite3.Connection, rows: dict[str, list[tuple[object, ...]]]) -> None:
    """Each of the tables in ``rows`` given exactly those rows, in the caller's transaction."""
    conn.execute("PRAGMA defer_foreign_keys = ON")
    for table in rows:
        conn.execute(f'DELETE FROM "{table}"')
    for table, found in rows.items():
        if found:
            marks = ", ".join("?" * len(found[0]))
            conn.executemany(f'INSERT INTO "{table}" VALUES ({marks})', found)


def in_two(tmp: Path) -> tuple[Path, Path]:
    (tmp / "mine").mkdir()
    (tmp / "model").mkdir()
    return tmp / "mine", tmp / "model"


def by_sql(queue: Queue, solved: Queue) -> None:
    written_in_its_transaction(queue, model_rows(solved.path))


def forged_1(tmp: Path, write: Callable[[Queue, Queue], None] = by_sql
             ) -> tuple[Queue, tuple[object, ...]]:
    from test_exercises import EDIT_E0001, NEW_E0005, refused
    mine, model = in_two(tmp)
    solved = exercises.start_1(model)
    refused(lambda: solved.enqueue_jsonl(EDIT_E0001))
    solved.enqueue_jsonl(NEW_E0005)
    drain(solved, Handler())
    q1 = exercises.start_1(mine)
    edit_refusal = refused(lambda: q1.enqueue_jsonl(EDIT_E0001))  # the refusal is q1's own
    write(q1, solved)
    return q1, (edit_refusal,)


def forged_3(tmp: Path, write: Callable[[Queue, Queue], None] = by_sql
             ) -> tuple[Queue, tuple[object, ...]]:
    mine, model = in_two(tmp)
    q3 = exercises.start_3(mine)
    write(q3, solve_3(exercises.start_3(model)))
    return q3, ()


def forged_4(tmp: Path, write: Callable[[Queue, Queue], None] = by_sql
             ) -> tuple[Queue, tuple[object, ...]]:
    from test_exercises import refused, stall_then_dead
    mine, model = in_two(tmp)
    solved = exercises.start_4(model)
    from test_exercises import stalled_worker_story
    stalled_worker_story(solved)
    q4 = exercises.start_4(mine)  # the story played for real up to W3's ACK, refusals kept
    w1, before = stall_then_dead(q4, Handler())
    q4.redrive("E0004")
    assert q4.claim() is not None
    after = (w1, refused(lambda: q4.complete(w1, Handler().supporting("toy"))))
    write(q4, solved)  # ... and W3's ACK written by hand
    return q4, (before, after)


def forged_7(tmp: Path) -> tuple[Queue, tuple[object, ...]]:
    from test_exercise_inbox import learners_inbox
    mine, model = in_two(tmp)
    solved = exercises.start_7(model)
    assert exercises.run_takeover_7(solved, learners_inbox) is not None
    rows = model_rows(solved.path)

    def step(queue: Queue, line: str) -> None:  # the whole story's rows, on the first delivery
        if not queue.messages():
            written_in_its_transaction(queue, rows)

    q7 = exercises.start_7(mine)
    return q7, (exercises.run_takeover_7(q7, step),)


def forged_8(tmp: Path) -> tuple[Queue, tuple[object, ...]]:
    from test_exercise_retention import E0001_LINE
    mine, model = in_two(tmp)
    solved = exercises.start_8(model)
    solved.prune(60)
    q8 = exercises.start_8(mine)
    written_in_its_transaction(q8, model_rows(solved.path))  # the prune written by hand
    return q8, (q8.enqueue_jsonl(E0001_LINE),)                # then a real replay


def forged_9(tmp: Path) -> tuple[Queue, tuple[object, ...]]:
    mine, model = in_two(tmp)
    solved = exercises.start_9(model)
    assert exercises.run_after_cut_9(solved, lambda queue, lease, handler: None) is not None
    rows = model_rows(solved.path)

    def after_lost_connection(queue: Queue, lease: object, handler: Handler) -> None:
        if queue.status().states.get("done") != 3:
            written_in_its_transaction(queue, rows)

    q9 = exercises.start_9(mine)
    return q9, (exercises.run_after_cut_9(q9, after_lost_connection),)


def forged_10(tmp: Path) -> tuple[Queue, tuple[object, ...]]:
    mine, model = in_two(tmp)
    solved = exercises.start_10(model)
    solved.enqueue_jsonl(REFUND_LINE, priority=3)
    drain(solved, Handler().supporting("refund"))
    q10 = exercises.start_10(mine)
    q10.enqueue_jsonl(REFUND_LINE)  # priority 0: the order, and the rest, written by hand
    written_in_its_transaction(q10, model_rows(solved.path))
    return q10, ()


REFUND_LINE = '{"event_id": "E1007", "payload": {"category": "refund", "amount_cents": 2500}}'


@pytest.mark.parametrize("number, forge, tables", [
    (1, forged_1, "tables effects, messages, transitions"),
    (3, forged_3, "tables effects, messages, transitions"),
    (4, forged_4, "tables effects, messages, transitions"),
    (7, forged_7, "tables effects, messages, transitions"),
    (8, forged_8, "tables compacted, messages, transitions"),
    (9, forged_9, "tables effects, messages, transitions"),
    (10, forged_10, "tables effects, messages, transitions"),
], ids=["exercise-1", "exercise-3", "exercise-4", "exercise-7", "exercise-8", "exercise-9",
        "exercise-10"])
def test_rows_written_with_own_sql_inside_the_queues_own_transaction_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], number: int,
        forge: Callable[[Path], tuple[Queue, tuple[object, ...]]], tables: str) -> None:
    queue, arguments = forge(tmp_path)
    capsys.readouterr()
    assert check(snapshot(queue.path)) == []  # the audit alone cannot tell

    verdict = getattr(exercises, f"check_{number}")(queue, *arguments)

    mine = f"q{number}"
    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict).startswith(
        f"Not quite: a hand edit: {mine}'s file was changed by SQL of your own, run inside "
        f"`{mine}.transaction()` (it changed the {tables}): a transaction you open yourself "
        f"is not one of the package's calls, though it runs on {mine}"), verdict.text
    assert verdict.next_step == (
        f"run `start_{number}` again (`{mine} = exercises.start_{number}(workdir)`) and change "
        f"the queue only through {mine}'s calls")


class WritingClock(ModelClock):
    """A model clock that, the first time it is read inside one of the queue's write
    transactions, writes the given rows with the queue's own connection: SQL of one's
    own, run back by a call of the package's, inside that call's transaction."""

    def __init__(self, queue: Queue, rows: dict[str, list[tuple[object, ...]]]) -> None:
        super().__init__(queue.clock.now())
        self.queue, self.rows = queue, rows

    def now(self) -> int:
        conn = self.queue.connection
        if self.rows and conn is not None and conn.in_transaction:
            rows, self.rows = self.rows, {}
            rows_written(conn, rows)
        return super().now()


def by_clock(queue: Queue, solved: Queue) -> None:
    """The rows of ``solved`` written into ``queue`` by its clock, inside a real claim
    (past every lease: a claim reads the clock inside its transaction)."""
    queue.clock.advance(1000)
    queue.clock = WritingClock(queue, model_rows(solved.path))
    with queue.session():
        queue.claim()


@pytest.mark.parametrize("number, forge", [(1, forged_1), (3, forged_3), (4, forged_4)],
                         ids=["exercise-1", "exercise-3", "exercise-4"])
def test_rows_written_by_code_a_call_runs_back_are_refused_as_sql_inside_that_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], number: int,
        forge: Callable[[Path], tuple[Queue, tuple[object, ...]]]) -> None:
    queue, arguments = forge(tmp_path, by_clock)
    capsys.readouterr()
    assert check(snapshot(queue.path)) == []  # the audit alone cannot tell

    verdict = getattr(exercises, f"check_{number}")(queue, *arguments)

    mine = f"q{number}"
    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict) == (
        f"Not quite: a hand edit: SQL of your own ran inside `{mine}.claim_batch()`: code that "
        "the call runs back (a clock of your own, a handler's effect_of) wrote with "
        f"{mine}'s connection within the call's own transaction, so what the call left cannot "
        f"be told from the package's own work. Next: run `start_{number}` again "
        f"(`{mine} = exercises.start_{number}(workdir)`) and change the queue only through "
        f"{mine}'s calls")


def test_a_trigger_of_ones_own_that_makes_the_engines_statements_write_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q3 = exercises.start_3(tmp_path)
    conn = sqlite3.connect(q3.path)
    conn.executescript("""
        CREATE TRIGGER forge AFTER INSERT ON transitions
        WHEN NEW.event_id = 'E0004' AND NEW.reason = 'redrive' BEGIN
          UPDATE messages SET state = 'leased', attempts = 1, generation = generation + 1,
                 lease_until = NEW.at + 30 WHERE event_id = 'E0004';
          INSERT INTO transitions (at, event_id, from_state, to_state, generation, attempts,
                 reason) SELECT NEW.at, 'E0004', 'ready', 'leased', generation, 1, 'claimed'
                 FROM messages WHERE event_id = 'E0004';
          UPDATE messages SET state = 'done', lease_until = NULL, finished_at = NEW.at
                 WHERE event_id = 'E0004';
          INSERT INTO transitions (at, event_id, from_state, to_state, generation, attempts,
                 reason) SELECT NEW.at, 'E0004', 'leased', 'done', generation, 1, 'completed'
                 FROM messages WHERE event_id = 'E0004';
          INSERT INTO effects VALUES ('E0004', 'toy', 3000);
        END;""")
    conn.close()
    q3.redrive("E0004")  # the engine's own statement fires the trigger
    conn = sqlite3.connect(q3.path)
    conn.execute("DROP TRIGGER forge")
    conn.commit()
    conn.close()
    capsys.readouterr()
    assert figures(q3.path) == (20000, 4, {"done": 4})  # the figures of the right answer
    assert check(snapshot(q3.path)) == []

    verdict = exercises.check_3(q3)

    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict).startswith(
        "Not quite: a hand edit: q3's file was changed around the package's calls"), verdict.text


def test_sql_of_ones_own_behind_a_leading_comment_is_still_sql_of_ones_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q3 = solve_3(exercises.start_3(tmp_path))  # the honest route, then one more claim

    class Commented(ModelClock):  # a comment first, as a trigger's own lines begin
        def now(self) -> int:
            conn = q3.connection
            if conn is not None and conn.in_transaction:
                conn.execute("-- a note\n/* and another */ UPDATE messages SET attempts = attempts")
            return super().now()

    q3.clock = Commented(q3.clock.now())
    with q3.session():
        assert q3.claim() is None
    capsys.readouterr()
    assert figures(q3.path) == (20000, 4, {"done": 4}) and check(snapshot(q3.path)) == []

    verdict = exercises.check_3(q3)

    assert verdict.status == NOT_QUITE
    assert "SQL of your own ran inside `q3.claim_batch()`" in verdict_of(capsys, verdict)


def test_an_effect_of_that_rewrites_the_stored_payload_inside_the_ack_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_exercises import EDIT_E0001, refused
    q1 = exercises.start_1(tmp_path)
    edit_refusal = refused(lambda: q1.enqueue_jsonl(EDIT_E0001))
    q1.enqueue_jsonl('{"event_id": "E0005", "payload": {"category": "pen", "amount_cents": 1000}}')
    edited = '{"amount_cents":2000,"category":"pen"}'

    class Rewriting(Handler):  # only effect_of is its own: judged by what it wrote, not by name
        def effect_of(self, payload):  # type: ignore[no-untyped-def]
            if payload.get("amount_cents") == 1000 and q1.connection is not None:
                q1.connection.execute(
                    "UPDATE messages SET payload = ?, payload_sha256 = ? WHERE event_id = 'E0005'",
                    (edited, hashlib.sha256(edited.encode()).digest()))
                return Effect("pen", 2000)
            return super().effect_of(payload)

    with q1.session():
        drain(q1, Rewriting())
    capsys.readouterr()
    assert figures(q1.path) == (19000, 4, {"dead": 1, "done": 4})  # the right answer's figures
    assert check(snapshot(q1.path)) == []

    verdict = exercises.check_1(q1, edit_refusal)

    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict).startswith(
        "Not quite: a hand edit: SQL of your own ran inside `q1.complete_and_claim()`"), verdict.text


def test_a_handler_of_ones_own_that_writes_with_the_acks_connection_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Recording(Handler):
        def apply(self, conn, event_id, payload):  # type: ignore[no-untyped-def]
            return super().apply(conn, event_id, payload)  # it could write anything here

    q3 = exercises.start_3(tmp_path)
    q3.redrive("E0004")
    drain(q3, Recording().supporting("toy"))
    capsys.readouterr()
    assert figures(q3.path) == (20000, 4, {"done": 4})

    verdict = exercises.check_3(q3)

    assert verdict.status == NOT_QUITE
    assert verdict_of(capsys, verdict) == (
        "Not quite: a hand edit: a handler of your own (Recording, whose apply is not "
        "Handler's) ran inside q3's ACK with the ACK's connection, so what it wrote there "
        "cannot be told from the package's own work. Next: run `start_3` again "
        "(`q3 = exercises.start_3(workdir)`) and process with the course's Handler "
        "(`Handler()`, or `Handler().supporting(...)`)")


def test_the_course_handler_and_its_own_runners_sql_are_no_sql_of_the_learners(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from queue_core.lab.exercises.provenance import record_path

    q3 = solve_3(exercises.start_3(tmp_path))
    entries = [json.loads(line) for line in Path(record_path(q3.path)).read_text().splitlines()]
    capsys.readouterr()

    assert [(e["kind"], e.get("what")) for e in entries] == [
        ("start", None), ("call", "redrive"), ("call", "claim_batch"),
        ("call", "complete_and_claim")]
    assert exercises.check_3(q3).status == SOLVED


def test_the_recorder_driven_by_hand_signs_anything_as_exercises_md_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    said = " ".join((ROOT / "EXERCISES.md").read_text(encoding="utf-8").split())
    assert ("What a check cannot see, and does not promise: code that reads the kernel's key, "
            "or drives the course's own recorder by hand (the queue's private `_calling`, which "
            "the course's runners use) with statements compiled as if they were the package's "
            "own code, can sign any content") in said
    mine, model = in_two(tmp_path)
    rows = model_rows(solve_3(exercises.start_3(model)).path)
    q3 = exercises.start_3(mine)
    with q3._calling("complete"):  # type: ignore[attr-defined]
        written_in_its_transaction(q3, rows)  # SQL from this file: refused
    capsys.readouterr()
    assert exercises.check_3(q3).status == NOT_QUITE

    q3 = exercises.start_3(mine)
    posing: dict[str, object] = {"sqlite3": sqlite3}
    package_file = str(Path(exercises.__file__).resolve().parent / "posing.py")
    for function in (rows_written, written_in_its_transaction):
        exec(compile(inspect.getsource(function), package_file, "exec"), posing)
    with q3._calling("complete"):  # type: ignore[attr-defined]
        posing["written_in_its_transaction"](q3, rows)
    capsys.readouterr()

    assert exercises.check_3(q3).status == SOLVED  # what a check cannot see


def test_every_method_of_the_queue_that_opens_a_write_transaction_is_signed_as_a_call() -> None:
    from queue_core.lab.exercises.provenance import ENGINE_CALLS, WitnessedQueue

    writers = sorted(name for klass in Queue.__mro__ if klass.__module__.startswith("queue_core")
                     for name, member in vars(klass).items() if callable(member)
                     and not name.startswith("_") and name != "transaction"
                     and "self.transaction(" in inspect.getsource(member))
    assert writers and set(writers) <= set(ENGINE_CALLS), writers
    assert "prune" in ENGINE_CALLS  # it writes through retention's own helper
    assert all(getattr(WitnessedQueue, name) is not getattr(Queue, name) for name in ENGINE_CALLS)
