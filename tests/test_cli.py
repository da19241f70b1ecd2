"""The command-line contract, through real subprocesses in a scratch folder:
``python -m queue_core`` and the ``queue-core`` console script alike."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import DATA, snapshot
from observe import expect, ledger, row
from queue_core import Handler, ModelClock, Queue, drain

MODULE = [sys.executable, "-m", "queue_core"]
SCRIPT = Path(sys.executable).parent / "queue-core"
LAUNCHERS = {
    "python-m": MODULE,
    "console-script": pytest.param(
        [str(SCRIPT)], marks=pytest.mark.skipif(not SCRIPT.exists(),
                                                reason="queue-core is not installed in this venv")),
}
REFUSAL = re.compile(r"^(line \d+: )?[a-z][a-z0-9_]*: \S[^\n]*\n$")


def run(cwd: Path, *args: str, launcher: list[str] = MODULE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*launcher, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def outcomes(stdout: str) -> list[tuple[str, str]]:
    """(event id, kind) per outcome line of ``work``; the summary line is last."""
    lines = stdout.splitlines()
    assert lines[-1].startswith(("nothing left to claim", "nothing due at")), stdout
    return [tuple(text.split()[:2]) for text in lines[:-1]]  # type: ignore[misc]


def status_json(cwd: Path, *global_args: str, launcher: list[str] = MODULE) -> dict:
    result = run(cwd, *global_args, "status", "--json", launcher=launcher)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # exactly one JSON object, nothing else


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    shutil.copy(DATA / "demo.jsonl", tmp_path / "demo.jsonl")
    shutil.copy(DATA / "conflict.jsonl", tmp_path / "conflict.jsonl")
    shutil.copy(DATA / "twenty.jsonl", tmp_path / "twenty.jsonl")
    return tmp_path


@pytest.mark.parametrize("launcher", LAUNCHERS.values(), ids=LAUNCHERS.keys())
def test_the_smoke_run_recovers_toy_to_20000_after_a_redrive_with_the_fix(
        scratch: Path, launcher: list[str]) -> None:
    db = ["--db", "smoke.sqlite3", "--now", "1000"]

    enqueued = run(scratch, *db, "enqueue", "demo.jsonl", launcher=launcher)
    assert (enqueued.returncode, enqueued.stdout.strip()) == (0, "inserted 4, duplicates 1")

    worked = run(scratch, *db, "work", launcher=launcher)
    assert worked.returncode == 0, worked.stderr  # dead outcomes are not an error
    assert outcomes(worked.stdout) == [("E0001", "done"), ("E0002", "done"), ("E0003", "done"),
                                       ("E0004", "dead")]
    assert status_json(scratch, *db, launcher=launcher) == {
        "states": {"ready": 0, "leased": 0, "done": 3, "dead": 1},
        "effects": 3, "totals": {"book": 15000, "pen": 2000}, "total": 17000}

    assert run(scratch, *db, "redrive", "E0004", launcher=launcher).returncode == 0
    again = run(scratch, *db, "work", launcher=launcher)
    assert (again.returncode, outcomes(again.stdout)) == (0, [("E0004", "dead")])
    assert status_json(scratch, *db, launcher=launcher)["states"] == \
        {"ready": 0, "leased": 0, "done": 3, "dead": 1}

    assert run(scratch, *db, "redrive", "E0004", launcher=launcher).returncode == 0
    fixed = run(scratch, *db, "work", "--accept", "toy", launcher=launcher)
    assert (fixed.returncode, outcomes(fixed.stdout)) == (0, [("E0004", "done")])
    assert status_json(scratch, *db, launcher=launcher) == {
        "states": {"ready": 0, "leased": 0, "done": 4, "dead": 0},
        "effects": 4, "totals": {"book": 15000, "pen": 2000, "toy": 3000}, "total": 20000}

    repeat = run(scratch, *db, "enqueue", "demo.jsonl", launcher=launcher)
    assert (repeat.returncode, repeat.stdout.strip()) == (0, "inserted 0, duplicates 5")
    assert ledger(scratch / "smoke.sqlite3") == expect(total=20000, effects=4, done=4)
    assert (row(scratch / "smoke.sqlite3", "E0004")["generation"],
            row(scratch / "smoke.sqlite3", "E0004")["attempts"]) == (3, 1)


REJECTIONS = {
    "conflict": ("conflict.jsonl", "batch_conflict", 2),
    "not-json": ("reject_not_json.jsonl", "invalid_json", 2),
    "not-utf8": ("reject_not_utf8.jsonl", "invalid_utf8", 1),
    "event-id": ("reject_event_id.jsonl", "invalid_event_id", 2),
}


@pytest.mark.parametrize("name, code, line", REJECTIONS.values(), ids=REJECTIONS.keys())
def test_a_rejected_batch_exits_2_with_line_and_code_and_leaves_the_database_unchanged(
        scratch: Path, name: str, code: str, line: int) -> None:
    Queue(scratch / "q.sqlite3", clock=ModelClock(1000)).enqueue_file(DATA / "demo.jsonl")
    before = snapshot(scratch / "q.sqlite3")

    result = run(scratch, "--db", "q.sqlite3", "--now", "1000", "enqueue", str(DATA / name))

    assert result.returncode == 2
    assert result.stderr.startswith(f"line {line}: {code}: ")
    assert REFUSAL.match(result.stderr) and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert snapshot(scratch / "q.sqlite3") == before
    assert ledger(scratch / "q.sqlite3") == expect(total=0, effects=0, ready=4)


def test_a_rejected_batch_does_not_even_create_the_database_file(scratch: Path) -> None:
    result = run(scratch, "--db", "fresh.sqlite3", "enqueue", str(DATA / "reject_nan.jsonl"))

    assert result.returncode == 2
    assert result.stderr.startswith("line 1: non_finite_number: ")
    assert not (scratch / "fresh.sqlite3").exists()


def test_a_missing_file_exits_2_with_a_file_level_code(scratch: Path) -> None:
    result = run(scratch, "--now", "1000", "enqueue", "no-such-file.jsonl")

    assert result.returncode == 2
    assert result.stderr.startswith("file_not_found: ") and REFUSAL.match(result.stderr)
    assert "Traceback" not in result.stderr
    assert not (scratch / "queue.sqlite3").exists()


@pytest.mark.parametrize("event_id, code", [("E0001", "not_redrivable"),
                                            ("E9999", "unknown_event"),
                                            ("bogus", "unknown_event")])
def test_redrive_of_a_message_that_is_not_dead_exits_2_and_changes_nothing(
        scratch: Path, event_id: str, code: str) -> None:
    queue = Queue(scratch / "q.sqlite3", clock=ModelClock(1000))
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, Handler())
    before = snapshot(scratch / "q.sqlite3")

    result = run(scratch, "--db", "q.sqlite3", "--now", "1000", "redrive", event_id)

    assert result.returncode == 2
    assert result.stderr.startswith(f"{code}: ") and REFUSAL.match(result.stderr)
    assert snapshot(scratch / "q.sqlite3") == before
    assert ledger(scratch / "q.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_the_default_database_is_queue_sqlite3_in_the_current_folder(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    assert run(scratch, "--now", "1000", "work").returncode == 0

    assert (scratch / "queue.sqlite3").is_file()
    assert status_json(scratch)["total"] == 17000
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_work_on_an_empty_queue_exits_0_having_processed_nothing(scratch: Path) -> None:
    result = run(scratch, "--now", "1000", "work", "--lease-seconds", "2")

    assert (result.returncode, outcomes(result.stdout)) == (0, [])
    assert status_json(scratch) == {"states": {"ready": 0, "leased": 0, "done": 0, "dead": 0},
                                    "effects": 0, "totals": {}, "total": 0}


def test_work_takes_only_what_is_due_at_now(scratch: Path) -> None:
    assert run(scratch, "--now", "2000", "enqueue", "demo.jsonl").returncode == 0

    early = run(scratch, "--now", "1999", "work")
    due = run(scratch, "--now", "2000", "work", "--batch-size", "3")

    assert (early.returncode, outcomes(early.stdout)) == (0, [])
    assert early.stdout.splitlines()[-1] == ("nothing due at t=1999 (0 processed); 4 ready "
                                             "messages waiting, the next due at t=2000, in 1 s")
    assert sorted(outcomes(due.stdout)) == [("E0001", "done"), ("E0002", "done"),
                                            ("E0003", "done"), ("E0004", "dead")]
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_status_without_json_prints_the_same_figures(scratch: Path) -> None:
    run(scratch, "--now", "1000", "enqueue", "demo.jsonl")
    run(scratch, "--now", "1000", "work")

    text = run(scratch, "status").stdout

    assert "done 3" in text and "dead 1" in text
    assert re.search(r"^total:\s+17000$", text, re.M)
    assert re.search(r"^\s+book\s+15000$", text, re.M)


@pytest.mark.parametrize("args", [
    ["--now", "-5", "status"], ["--now", "soon", "status"], ["--now", "1.5", "status"],
    ["--now", "9" * 20, "enqueue", "demo.jsonl"], ["work", "--lease-seconds", "0"],
    ["work", "--lease-seconds", "9" * 20], ["work", "--max", "0"], ["frobnicate"], [],
], ids=["negative-now", "word-now", "fractional-now", "now-beyond-64-bit", "zero-lease",
        "lease-beyond-64-bit", "zero-max", "unknown-command", "no-command"])
def test_bad_arguments_exit_2_without_a_traceback(scratch: Path, args: list[str]) -> None:
    result = run(scratch, *args)

    assert result.returncode == 2
    assert "usage:" in result.stderr and "Traceback" not in result.stderr
    assert not (scratch / "queue.sqlite3").exists()


MISPLACED = {
    "now-after-enqueue": (["enqueue", "demo.jsonl", "--now", "1000"],
                          "--now must come before the command 'enqueue', "
                          "as in: queue-core --now 1000 enqueue demo.jsonl"),
    "db-and-now-after-work": (["work", "--max", "2", "--db=q.sqlite3", "--now", "7"],
                              "--db and --now must come before the command 'work', "
                              "as in: queue-core --db=q.sqlite3 --now 7 work --max 2"),
    "db-between-redrive-and-its-id": (["--now", "5", "redrive", "--db", "q.sqlite3", "E0004"],
                                      "--db must come before the command 'redrive', "
                                      "as in: queue-core --now 5 --db q.sqlite3 redrive E0004"),
    "now-after-status": (["status", "--json", "--now", "1000"],
                         "--now must come before the command 'status', "
                         "as in: queue-core --now 1000 status --json"),
}


@pytest.mark.parametrize("args, explanation", MISPLACED.values(), ids=MISPLACED.keys())
def test_a_global_option_after_the_command_is_refused_with_the_command_line_put_right(
        scratch: Path, args: list[str], explanation: str) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    usage, refusal = result.stderr.splitlines()
    assert usage.startswith("usage: queue-core ") and "[--now T] COMMAND" in usage
    assert refusal == f"queue-core: error: misplaced_option: {explanation}"
    assert sorted(path.name for path in scratch.iterdir()) == before  # no database was made


def test_the_command_line_put_right_runs(scratch: Path) -> None:
    refused = run(scratch, "enqueue", "demo.jsonl", "--now", "1000")
    fixed = refused.stderr.splitlines()[-1].split("as in: queue-core ", 1)[1].split()

    result = run(scratch, *fixed)

    assert (result.returncode, result.stdout) == (0, "inserted 4, duplicates 1\n")
    assert row(scratch / "queue.sqlite3", "E0001")["available_at"] == 1000


def test_work_after_an_enqueue_on_the_system_clock_says_nothing_is_due_yet_and_when(
        scratch: Path) -> None:
    assert run(scratch, "enqueue", "demo.jsonl").returncode == 0  # stamped with the system clock
    stamped = row(scratch / "queue.sqlite3", "E0001")["available_at"]
    before = snapshot(scratch / "queue.sqlite3")

    result = run(scratch, "--now", "1000", "work")

    assert result.returncode == 0, result.stderr
    years = (stamped - 1000) / (365.25 * 86400)
    assert result.stdout == (f"nothing due at t=1000 (0 processed); 4 ready messages waiting, "
                             f"the next due at t={stamped}, in {stamped - 1000} s "
                             f"(about {years:.1f} years)\n")
    assert snapshot(scratch / "queue.sqlite3")["messages"] == before["messages"]
    assert ledger(scratch / "queue.sqlite3") == expect(total=0, effects=0, ready=4)


def test_work_max_stops_after_n_and_says_the_rest_is_still_queued(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "twenty.jsonl").returncode == 0

    first = run(scratch, "--now", "1000", "work", "--max", "3")
    batched = run(scratch, "--now", "1000", "work", "--max", "4", "--batch-size", "10")

    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "E0100 done (generation 1): book +100", "E0101 done (generation 1): pen +200",
        "E0102 done (generation 1): bag +300",
        "stopped at --max 3 (3 processed); the rest is still queued (ready 17, leased 0): "
        "run work again to go on"]
    assert batched.returncode == 0, batched.stderr
    assert [line.split()[0] for line in batched.stdout.splitlines()[:-1]] == [
        "E0103", "E0104", "E0105", "E0106"]  # a batch of 10 claims no more than the 4 left
    assert batched.stdout.splitlines()[-1].startswith("stopped at --max 4 (4 processed); "
                                                      "the rest is still queued (ready 13, ")
    assert ledger(scratch / "queue.sqlite3") == expect(total=2800, effects=7, done=7, ready=13)
    assert status_json(scratch, "--now", "1000")["states"]["leased"] == 0


def test_work_max_that_takes_the_last_message_says_nothing_is_left(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0

    result = run(scratch, "--now", "1000", "work", "--max", "4")

    assert (result.returncode, outcomes(result.stdout)) == (
        0, [("E0001", "done"), ("E0002", "done"), ("E0003", "done"), ("E0004", "dead")])
    assert result.stdout.splitlines()[-1] == "nothing left to claim at t=1000 (4 processed)"
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_metrics_prints_plain_figures_and_says_when_the_next_message_is_due(
        scratch: Path) -> None:
    assert run(scratch, "--now", "2000", "enqueue", "demo.jsonl").returncode == 0
    before = snapshot(scratch / "queue.sqlite3")

    early = run(scratch, "--now", "1990", "metrics")
    early_json = run(scratch, "--now", "1990", "metrics", "--json")

    assert (early.returncode, early.stderr) == (0, "")
    assert early.stdout.splitlines() == [
        "at:             t=1990 (model time)",
        "depth:          ready 4, leased 0, done 0, dead 0",
        "oldest due:     none due; 4 ready messages waiting, the next due at t=2000, in 10 s",
        "expired leases: 0",
        "dead attempts:  none dead"]
    assert json.loads(early_json.stdout) == {
        "at": 1990, "depth": {"ready": 4, "leased": 0, "done": 0, "dead": 0},
        "oldest_ready_age": None, "next_due_at": 2000, "expired_leases": 0, "dead_attempts": {}}
    assert snapshot(scratch / "queue.sqlite3") == before

    assert run(scratch, "--now", "2000", "work", "--max", "3").returncode == 0
    late = run(scratch, "--now", "2125", "metrics")
    assert late.stdout.splitlines()[1:3] == [
        "depth:          ready 1, leased 0, done 3, dead 0",
        "oldest due:     waiting 125 s (about 2.1 minutes), since t=2000"]
    assert run(scratch, "--now", "2125", "work").returncode == 0
    done = run(scratch, "--now", "2125", "metrics")
    assert done.stdout.splitlines()[2:] == ["oldest due:     none due, none ready",
                                            "expired leases: 0", "dead attempts:  E0004 1"]
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_metrics_on_the_system_clock_shows_the_moment_as_a_utc_date(scratch: Path) -> None:
    assert run(scratch, "enqueue", "demo.jsonl").returncode == 0

    result = run(scratch, "metrics")

    at = re.fullmatch(r"at:\s+t=(\d+) \((.*) UTC\)", result.stdout.splitlines()[0])
    assert at is not None, result.stdout
    moment = datetime.fromtimestamp(int(at.group(1)), timezone.utc)
    assert at.group(2) == f"{moment:%Y-%m-%d %H:%M:%S}"
    assert row(scratch / "queue.sqlite3", "E0001")["available_at"] <= int(at.group(1))


@pytest.mark.parametrize("make, command, code", [
    (lambda folder: folder, "status", "not_a_database"),
    (lambda folder: (folder / "junk.sqlite3").write_text("not a database " * 100) and
     folder / "junk.sqlite3", "status", "not_a_database"),
    (lambda folder: folder / "no-such-folder" / "q.sqlite3", "status", "no_queue_file"),
    (lambda folder: folder / "no-such-folder" / "q.sqlite3", "work", "database_error"),
], ids=["a-directory", "not-a-database", "missing-folder", "missing-folder-to-create"])
def test_an_unusable_database_file_is_an_operational_error_exit_1(
        scratch: Path, make, command: str, code: str) -> None:
    db = make(scratch)

    result = run(scratch, "--db", str(db), command)

    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {code}: ")
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_an_effect_written_behind_the_protocol_stops_work_with_exit_1_and_writes_nothing(
        scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    conn = sqlite3.connect(scratch / "queue.sqlite3")
    try:  # the file's owner bypasses the protocol: E0001 has an effect but is still ready
        with conn:
            conn.execute("INSERT INTO effects VALUES ('E0001', 'book', 10000)")
    finally:
        conn.close()
    before = snapshot(scratch / "queue.sqlite3")

    result = run(scratch, "--now", "1000", "work")

    assert result.returncode == 1
    assert result.stderr.startswith("error: integrity_violation: ")
    assert "Traceback" not in result.stderr
    assert snapshot(scratch / "queue.sqlite3")["effects"] == before["effects"]
    assert status_json(scratch)["states"] == {"ready": 3, "leased": 1, "done": 0, "dead": 0}


def test_the_demo_prints_the_reference_figures(tmp_path: Path) -> None:
    result = run(tmp_path, "demo")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    figures = {text.split(":", 1)[0]: text.split(":", 1)[1].strip() for text in lines
               if text.startswith(("snapshot:", "final:", "after the fix:"))}
    assert figures == {
        "snapshot": "total=10000 (book=10000); effects 1; ready 1, leased 1, done 1, dead 1",
        "final": "total=17000 (book=15000, pen=2000); effects 3; "
                 "ready 0, leased 0, done 3, dead 1",
        "after the fix": "total=20000 (book=15000, pen=2000, toy=3000); effects 4; "
                         "ready 0, leased 0, done 4, dead 0",
    }
    assert "4 messages, 1 duplicate" in lines[0]
    assert any("exit code 86" in text and "E0003 is leased, generation 1" in text
               for text in lines)
    assert any("0 inserted, 5 duplicates; total still 17000" in text for text in lines)
    assert any(text.startswith("redrive E0004 without the fix: E0004 dead") for text in lines)
    assert list(tmp_path.iterdir()) == []  # the demo's database lived in a temporary folder


def test_metrics_json_says_when_the_next_message_is_due_on_both_stores(
        scratch: Path, store: str) -> None:
    db = ["--db", store]
    assert run(scratch, *db, "--now", "2000", "enqueue", "demo.jsonl").returncode == 0
    assert run(scratch, *db, "--now", "2000", "work", "--max", "1").returncode == 0

    waiting = json.loads(run(scratch, *db, "--now", "1990", "metrics", "--json").stdout)
    due = json.loads(run(scratch, *db, "--now", "2005", "metrics", "--json").stdout)

    assert (waiting["oldest_ready_age"], waiting["next_due_at"]) == (None, 2000)
    assert (due["oldest_ready_age"], due["next_due_at"]) == (5, None)
    assert due["depth"] == {"ready": 3, "leased": 0, "done": 1, "dead": 0}
    assert status_json(scratch, *db)["total"] == 10000
