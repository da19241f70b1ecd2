"""Exercise 7's check fails on every wrong route a learner can take, and passes
once an inbox step of the learner's own stores each order once.

Each run is the real takeover on a real Redis server (a private one per run,
or ``QUEUE_CORE_REDIS_URL``): E0001 is delivered to A, then to B after the
broker's idle time. Solved cases are read back through a second connection.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest

import broker_server
from conftest import read_back
from queue_core import Handler, Queue, drain
from queue_core.lab import exercises
from queue_core.lab.broker.consumer import inbox_step as answer_key
from queue_core.lab.exercises import NOT_ATTEMPTED, NOT_QUITE, SOLVED, Verdict


@pytest.fixture(scope="module", autouse=True)
def redis_available() -> Iterator[str]:
    """Every run starts its own server; without one here, skip (or fail in CI)."""
    yield from broker_server.server_url()


def naive_step(queue: Queue, line: str) -> str:
    """The notebook's given step: a ledger, no record of what was seen."""
    event = json.loads(line)
    effect = Handler().effect_of(event["payload"])
    with queue.transaction() as conn:
        conn.execute("INSERT INTO naive_ledger (event_id, category, amount_cents) "
                     "VALUES (?, ?, ?)", (event["event_id"], effect.category, effect.amount_cents))
    return f"{effect.category} +{effect.amount_cents}"


def learners_inbox(queue: Queue, line: str) -> Any:
    """The reference solution's step, written in the learner's own words."""
    accepted = queue.enqueue_jsonl(line)
    drain(queue, Handler())
    return accepted


def figures(db: str) -> tuple[int, int, dict[str, int], int]:
    """Total, effects, states and the ledger's sum, read through a second connection."""
    total, effects = read_back(Path(db),
                               "SELECT coalesce(sum(amount_cents), 0), count(*) FROM effects")[0]
    states = dict(read_back(Path(db), "SELECT state, count(*) FROM messages GROUP BY state"))
    ledger = read_back(Path(db), "SELECT coalesce(sum(amount_cents), 0) FROM naive_ledger")[0][0]
    return total, effects, states, ledger


def one_verdict(capsys: pytest.CaptureFixture[str], verdict: Verdict) -> str:
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == verdict.text and sum(line == verdict.text for line in printed) == 1
    return verdict.text


def takeover(tmp_path: Path, step: Any) -> tuple[Queue, Any]:
    queue = exercises.start_7(tmp_path)
    return queue, exercises.run_takeover_7(queue, step)


# -- not attempted, and solved ---------------------------------------------------------------

def test_exercise_7_untouched_start_is_not_attempted(tmp_path: Path, capsys) -> None:
    queue = exercises.start_7(tmp_path)
    assert exercises.run_takeover_7(queue, None) is None
    assert capsys.readouterr().out.startswith("Nothing to run yet")
    verdict = exercises.check_7(queue, None)
    assert verdict.status == NOT_ATTEMPTED
    assert one_verdict(capsys, verdict).startswith("Not attempted yet: ")


def test_exercise_7_a_learners_own_inbox_step_is_solved_and_e0001_was_delivered_twice(
        tmp_path: Path, capsys) -> None:
    queue, run = takeover(tmp_path, learners_inbox)
    assert run.delivered("E0001") == [("A", 1), ("B", 2)]
    acked = [s.detail for s in run.steps if s.event_id == "E0001" and s.step == "acked"]
    assert acked == ["XACK -> 1", "XACK -> 0"]  # A's late acknowledgement was accepted
    capsys.readouterr()
    verdict = exercises.check_7(queue, run)
    assert verdict.status == SOLVED, one_verdict(capsys, verdict)
    assert figures(queue.path) == (17000, 3, {"done": 3}, 0)


# -- wrong routes ------------------------------------------------------------------------------

def test_exercise_7_without_an_inbox_the_ledger_doubles_e0001_and_is_not_quite(
        tmp_path: Path, capsys) -> None:
    queue, run = takeover(tmp_path, naive_step)
    assert figures(queue.path) == (0, 0, {}, 27000)
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert ("the naive ledger holds 27000 (E0001 2x, E0002 1x, E0003 1x): amounts no stored "
            "message accounts for, and a ledger cannot tell a repeat from a new order") in text
    assert "total expected 17000, found 0" in text


def test_exercise_7_the_answer_key_itself_or_called_is_not_quite(tmp_path: Path, capsys) -> None:
    for step in (answer_key, partial(answer_key), lambda queue, line: answer_key(queue, line)):
        queue, run = takeover(tmp_path, step)
        assert figures(queue.path) == (17000, 3, {"done": 3}, 0)  # right figures, wrong route
        capsys.readouterr()
        verdict = exercises.check_7(queue, run)
        assert verdict.status == NOT_QUITE
        assert "the answer key" in one_verdict(capsys, verdict)


class CallsTheKey:  # a callable object: no code of its own to read
    def __call__(self, queue: Queue, line: str) -> Any:
        return answer_key(queue, line)


def test_exercise_7_the_answer_key_reached_without_its_name_in_the_step_is_refused(
        tmp_path: Path, capsys) -> None:
    def by_default(queue: Queue, line: str, key: Any = answer_key) -> Any:
        return key(queue, line)

    steps = {"inbox": answer_key}

    def through_a_dict(queue: Queue, line: str) -> Any:
        return steps["inbox"](queue, line)

    for number, step in enumerate((by_default, through_a_dict, CallsTheKey())):
        (tmp_path / str(number)).mkdir()
        queue, run = takeover(tmp_path / str(number), step)
        assert figures(queue.path) == (17000, 3, {"done": 3}, 0)  # right figures, wrong route
        capsys.readouterr()
        verdict = exercises.check_7(queue, run)
        assert verdict.status == NOT_QUITE
        assert "the answer key" in one_verdict(capsys, verdict)


def copied_answer_key(keep_docstring: bool) -> Any:
    """The course's inbox step, copied with ``inspect.getsource`` and run again with
    ``exec`` in a namespace of the learner's (its docstring kept, or cut out)."""
    import inspect

    source = inspect.getsource(answer_key)
    if not keep_docstring:
        head, _, rest = source.partition('"""')
        source = head.rstrip() + "\n" + rest.split('"""', 1)[1].lstrip("\n")
    namespace: dict[str, Any] = {"Handler": Handler, "drain": drain, "Queue": Queue}
    exec(source, namespace)  # noqa: S102 - the learner's route under test
    return namespace["inbox_step"]


@pytest.mark.parametrize("keep_docstring", [True, False], ids=["as-printed", "docstring-cut"])
def test_exercise_7_the_answer_key_copied_with_getsource_and_exec_is_refused(
        tmp_path: Path, capsys, keep_docstring: bool) -> None:
    step = copied_answer_key(keep_docstring)
    assert step is not answer_key and step.__code__.co_filename == "<string>"
    queue, run = takeover(tmp_path, step)
    assert figures(queue.path) == (17000, 3, {"done": 3}, 0)  # right figures, wrong route
    capsys.readouterr()

    verdict = exercises.check_7(queue, run)

    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        "Not quite: your step is a copy of the course's own inbox step, the answer key (the "
        "same code as queue_core.lab.broker's inbox_step, run again with exec): a copy of the "
        "key is the key. Next: write the step yourself, in your own words (Hints 1 to 3 in "
        "EXERCISES.md)")


def test_exercise_7_a_ledger_that_checks_for_repeats_has_the_right_total_and_the_wrong_state(
        tmp_path: Path, capsys) -> None:
    def deduped_ledger(queue: Queue, line: str) -> None:
        event = json.loads(line)
        with queue.transaction() as conn:
            if conn.execute("SELECT 1 FROM naive_ledger WHERE event_id = ?",
                            (event["event_id"],)).fetchone() is None:
                conn.execute("INSERT INTO naive_ledger (event_id, category, amount_cents) "
                             "VALUES (?, ?, ?)", (event["event_id"], event["payload"]["category"],
                                                  event["payload"]["amount_cents"]))

    queue, run = takeover(tmp_path, deduped_ledger)
    assert figures(queue.path) == (0, 0, {}, 17000)
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert "effects expected 3, found 0" in text
    assert ("the naive ledger holds 17000 (E0001 1x, E0002 1x, E0003 1x): your step counted each "
            "order once, but in a ledger of its own: no stored message accounts for that money, "
            "so the audit cannot judge it") in text
    assert "it is not the inbox the exercise asks for: the queue's messages table" in text
    assert "cannot tell a repeat" not in text  # this ledger did tell one
    assert "hand each event to the queue" in verdict.next_step


def test_exercise_7_a_step_that_only_enqueues_skips_the_processing_and_is_not_quite(
        tmp_path: Path, capsys) -> None:
    queue, run = takeover(tmp_path, lambda queue, line: queue.enqueue_jsonl(line))
    assert figures(queue.path) == (0, 0, {"ready": 3}, 0)
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert "ready expected 0, found 3" in text and "no worker has processed them" in text


def test_exercise_7_a_hand_edit_after_the_naive_run_is_not_quite(tmp_path: Path, capsys) -> None:
    queue, run = takeover(tmp_path, naive_step)
    conn = sqlite3.connect(queue.path)  # remove the double behind the protocol's back
    conn.execute("DELETE FROM naive_ledger WHERE rowid = (SELECT max(rowid) FROM naive_ledger "
                 "WHERE event_id = 'E0001')")
    conn.commit()
    conn.close()
    assert figures(queue.path) == (0, 0, {}, 17000)
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    assert "the file changed after your run" in one_verdict(capsys, verdict)


def test_exercise_7_an_update_of_one_column_after_a_solved_run_is_named_and_not_quite(
        tmp_path: Path, capsys) -> None:
    queue, run = takeover(tmp_path, learners_inbox)
    conn = sqlite3.connect(queue.path)  # every count and every cent stay as they were
    conn.execute("UPDATE messages SET last_error = 'x' WHERE event_id = 'E0001'")
    conn.commit()
    conn.close()
    assert figures(queue.path) == (17000, 3, {"done": 3}, 0)
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        "Not quite: the file changed after your run: E0001's last_error (a change made around "
        "the protocol, with SQL of your own). Next: run `q7 = exercises.start_7(workdir)` "
        "again, then `run_takeover_7` once")


def test_exercise_7_a_second_run_on_a_used_start_is_refused_and_changes_nothing(
        tmp_path: Path, capsys) -> None:
    queue, first = takeover(tmp_path, learners_inbox)
    before = figures(queue.path)
    capsys.readouterr()
    assert exercises.run_takeover_7(queue, learners_inbox) is None
    assert capsys.readouterr().out.splitlines() == [
        "Cannot run: q7 was already used by a run (t=1000 total 17000 (book 15000, pen 2000); "
        "effects 3; ready 0, leased 0, done 3, dead 0): run `q7 = exercises.start_7(workdir)` "
        "again first, then run_takeover_7 once"]
    assert figures(queue.path) == before
    verdict = exercises.check_7(queue, None)  # what the refused second run returned
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert "found None (it returns None when it cannot run, on a used start for one)" in text
    assert verdict.next_step.startswith("run `q7 = exercises.start_7(workdir)` again")
    assert exercises.check_7(queue, first).status == SOLVED  # the first run still holds


def test_exercise_7_a_step_that_writes_the_rows_by_hand_is_found_by_the_witness_and_the_audit(
        tmp_path: Path, capsys) -> None:
    def by_hand(queue: Queue, line: str) -> None:
        event = json.loads(line)
        payload = json.dumps(event["payload"], sort_keys=True, separators=(",", ":"))
        with queue.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO messages (event_id, payload, payload_sha256, "
                         "state, available_at, finished_at) VALUES (?, ?, ?, 'done', 1000, 1000)",
                         (event["event_id"], payload, hashlib.sha256(payload.encode()).digest()))
            conn.execute("INSERT OR IGNORE INTO effects (event_id, category, amount_cents) "
                         "VALUES (?, ?, ?)", (event["event_id"], event["payload"]["category"],
                                              event["payload"]["amount_cents"]))

    queue, run = takeover(tmp_path, by_hand)
    assert figures(queue.path) == (17000, 3, {"done": 3}, 0)  # every figure right
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    text = one_verdict(capsys, verdict)
    assert text.startswith(
        "Not quite: a hand edit: q7's file was changed by SQL of your own, run inside "
        "`q7.transaction()` (it changed the tables effects, messages): a transaction you open "
        "yourself is not one of the package's calls, though it runs on q7; the audit also "
        "found journal_disagrees: E0001"), text


def test_exercise_7_a_run_on_another_file_is_not_quite(tmp_path: Path, capsys) -> None:
    (tmp_path / "other").mkdir()
    _, run = takeover(tmp_path / "other", learners_inbox)
    queue = exercises.start_7(tmp_path)
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    assert "another queue file" in one_verdict(capsys, verdict)


def test_exercise_7_a_step_that_raises_is_not_acknowledged_and_not_quite(
        tmp_path: Path, capsys) -> None:
    def fails_on_repeat(queue: Queue, line: str) -> None:
        if queue.enqueue_jsonl(line).duplicates:
            raise RuntimeError("seen it")
        drain(queue, Handler())

    queue, run = takeover(tmp_path, fails_on_repeat)
    assert figures(queue.path) == (17000, 3, {"done": 3}, 0)
    assert [s.step for s in run.steps if s.consumer == "B" and s.event_id == "E0001"] == [
        "received", "resumed", "failed"]  # no XACK for the delivery whose step raised
    verdict = exercises.check_7(queue, run)
    assert verdict.status == NOT_QUITE
    assert "your step raised on E0001 (delivery 2, B): RuntimeError: seen it" in one_verdict(
        capsys, verdict)


# -- whatever it is given ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(42,), ("no such file", object()), (None, "not a run"),
                                  (b"bytes", None)], ids=["number", "object", "string", "bytes"])
def test_exercise_7_a_check_given_garbage_prints_one_verdict_and_never_raises(
        args: tuple[Any, ...], capsys) -> None:
    verdict = exercises.check_7(*args)
    assert verdict.status in (NOT_ATTEMPTED, NOT_QUITE)
    text = one_verdict(capsys, verdict)
    assert "0x" not in text and "/tmp" not in text


def test_exercise_7_run_refuses_what_it_cannot_run_with_one_line(tmp_path: Path, capsys) -> None:
    queue = exercises.start_7(tmp_path)
    assert exercises.run_takeover_7(queue, "enqueue it") is None
    assert exercises.run_takeover_7("a queue", learners_inbox) is None
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["Cannot run: the step must be a function (queue, line), found 'enqueue it'",
                       "Cannot run: pass the queue that `q7 = exercises.start_7(workdir)` "
                       "returned, found a value of type str"]
    assert figures(queue.path) == (0, 0, {}, 0)


def test_exercise_7_start_again_starts_over(tmp_path: Path) -> None:
    queue, _ = takeover(tmp_path, naive_step)
    again = exercises.start_7(tmp_path)
    assert again.path == queue.path and figures(again.path) == (0, 0, {}, 0)
    assert exercises.check_7(again, None).status == NOT_ATTEMPTED


def test_exercise_7_a_solved_run_checked_after_the_naive_cell_rebuilt_q7_names_the_rebuild(
        tmp_path: Path, capsys) -> None:
    _, inbox_run = takeover(tmp_path, learners_inbox)  # the learner's inbox cell, solved
    q7, _ = takeover(tmp_path, naive_step)  # then the naive cell again: start_7 rebuilds q7
    assert figures(q7.path) == (0, 0, {}, 27000)

    verdict = exercises.check_7(q7, inbox_run)

    assert verdict.status == NOT_QUITE
    assert one_verdict(capsys, verdict) == (
        "Not quite: your run was made on an earlier start of q7's file: start_7 has built it "
        "again since (the naive cell calls start_7 too), so the file holds what came after, not "
        "your run. Next: run the cell with your inbox step again (it starts q7 over and runs the "
        "takeover), then this check")
    assert "SQL of your own" not in verdict.text
