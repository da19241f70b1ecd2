"""The command-line contract, through real subprocesses in a scratch folder:
``python -m queue_core`` and the ``queue-core`` console script alike."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
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
        "effects": 3, "totals": {"book": 15000, "pen": 2000}, "total": 17000, "pruned": 0, "ids": "course"}

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
        "effects": 4, "totals": {"book": 15000, "pen": 2000, "toy": 3000}, "total": 20000, "pruned": 0, "ids": "course"}

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
                                            ("e0001", "invalid_event_id"),
                                            ("bogus", "invalid_event_id")])
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


def test_redrive_of_what_is_no_event_id_is_refused_before_the_file_is_looked_at(
        scratch: Path) -> None:
    result = run(scratch, "--db", "missing.sqlite3", "redrive", "e0004")

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("invalid_event_id: 'e0004' is not an event id (E followed by "
                             "four ASCII digits): did you mean 'E0004'?\n")
    assert not (scratch / "missing.sqlite3").exists()


def test_the_default_database_is_queue_sqlite3_in_the_current_folder(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    assert run(scratch, "--now", "1000", "work").returncode == 0

    assert (scratch / "queue.sqlite3").is_file()
    assert status_json(scratch)["total"] == 17000
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_work_on_an_empty_queue_exits_0_having_processed_nothing(scratch: Path) -> None:
    Queue(scratch / "queue.sqlite3")  # a queue with nothing in it

    result = run(scratch, "--now", "1000", "work", "--lease-seconds", "2")

    assert (result.returncode, result.stdout) == (0, "nothing left to claim at t=1000 "
                                                     "(0 processed)\n")
    assert status_json(scratch) == {"states": {"ready": 0, "leased": 0, "done": 0, "dead": 0},
                                    "effects": 0, "totals": {}, "total": 0, "pruned": 0, "ids": "course"}


@pytest.mark.parametrize("command", [["work"], ["work", "--max", "1"], ["redrive", "E0004"],
                                     ["status"], ["metrics", "--json"]],
                         ids=["work", "work-max", "redrive", "status", "metrics"])
def test_only_enqueue_creates_a_queue_file_every_other_command_refuses_a_missing_one(
        scratch: Path, command: list[str]) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, "--db", "qeue.sqlite3", "--now", "1000", *command)  # a typo

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == ("error: no_queue_file: qeue.sqlite3: no queue here yet "
                             "(enqueue a batch to create one)\n")
    assert sorted(path.name for path in scratch.iterdir()) == before
    created = run(scratch, "--db", "qeue.sqlite3", "--now", "1000", "enqueue", "demo.jsonl")
    assert (created.returncode, created.stdout) == (0, "inserted 4, duplicates 1\n")
    assert ledger(scratch / "qeue.sqlite3") == expect(total=0, effects=0, ready=4)


COMMANDS = {
    "enqueue": (["enqueue", "demo.jsonl"], "inserted 4, duplicates 1"),
    "status": (["status"], "total:   0"),
    "metrics": (["metrics", "--json"], '"dead_attempts": {}, "pruned": 0, "ids": "course"}'),
    "work-max": (["work", "--max", "2"], "run work again to go on"),
    "work-batch": (["work", "--batch-size", "3"], "(2 processed)"),
    "metrics-after": (["metrics"], "dead attempts:  E0004 1"),
    "redrive": (["redrive", "E0004"], "E0004 is ready again (attempts reset, generation kept)"),
    "status-json": (["status", "--json"], '"total": 17000, "pruned": 0, "ids": "course"}'),
    "work": (["work", "--accept", "toy"], "nothing left to claim at t=1000 (1 processed)"),
}


def test_every_command_leaves_only_the_database_file_when_it_ends(scratch: Path) -> None:
    """SQLite removes -wal and -shm when the last connection closes, if it may write."""
    for name, (command, last) in COMMANDS.items():
        result = run(scratch, "--now", "1000", *command)

        assert result.returncode == 0, (name, result.stderr)
        assert result.stdout.splitlines()[-1].endswith(last), (name, result.stdout)
        assert sorted(path.name for path in scratch.iterdir()) == [
            "conflict.jsonl", "demo.jsonl", "queue.sqlite3"], name
    assert ledger(scratch / "queue.sqlite3") == expect(total=20000, effects=4, done=4)


def test_status_beside_an_open_connection_leaves_its_wal_alone(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    other = sqlite3.connect(scratch / "queue.sqlite3")  # another process's open connection
    try:
        assert other.execute("SELECT count(*) FROM messages").fetchone() == (4,)
        result = run(scratch, "status", "--json")
        assert (result.returncode, json.loads(result.stdout)["states"]["ready"]) == (0, 4)
        assert (scratch / "queue.sqlite3-wal").exists()  # still in use: not removed under it
        assert other.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    finally:
        other.close()
    assert not (scratch / "queue.sqlite3-wal").exists()  # the last to close removed it


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


COUNT = "expected a count of messages, a whole number from 1 to 1000000000000, got"
SECONDS = "expected seconds, a whole number from {} to 1000000000000, got"


@pytest.mark.parametrize("args, error", [
    (["work", "--max", "-1"], f"invalid_count: argument --max: {COUNT} '-1'"),
    (["work", "--batch-size", "-2"], f"invalid_count: argument --batch-size: {COUNT} '-2'"),
    (["work", "--max", "abc"], f"invalid_count: argument --max: {COUNT} 'abc'"),
    (["work", "--batch-size", "x"], f"invalid_count: argument --batch-size: {COUNT} 'x'"),
    (["work", "--max", "9" * 20], f"invalid_count: argument --max: {COUNT} '{'9' * 20}'"),
    (["work", "--lease-seconds", "-1"],
     f"invalid_seconds: argument --lease-seconds: {SECONDS.format(1)} '-1'"),
    (["work", "--lease-seconds", "soon"],
     f"invalid_seconds: argument --lease-seconds: {SECONDS.format(1)} 'soon'"),
    (["--now", "-5", "status"], f"invalid_seconds: argument --now: {SECONDS.format(0)} '-5'"),
    (["--db", "", "enqueue", "demo.jsonl"],
     "invalid_db: argument --db: expected a file path or a postgresql:// connection string, "
     "got ''"),
], ids=["negative-max", "negative-batch", "word-max", "word-batch", "max-beyond-64-bit",
        "negative-lease", "word-lease", "negative-now", "empty-db"])
def test_a_count_is_refused_as_a_count_and_a_time_as_a_time(
        scratch: Path, args: list[str], error: str) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1].endswith(f" error: {error}")
    assert sorted(path.name for path in scratch.iterdir()) == before


@pytest.mark.parametrize("option, code", [
    (["prune", "--older-than"], "invalid_seconds"),
    (["work", "--lease-seconds"], "invalid_seconds"),
    (["work", "--max"], "invalid_count"), (["work", "--batch-size"], "invalid_count"),
], ids=["older-than", "lease-seconds", "max", "batch-size"])
@pytest.mark.parametrize("text", ["1_0", "\uff15", " 5", "5 ", "+3", "-0", "0x10", "\u0665"],
                         ids=["underscore", "full-width", "leading-space", "trailing-space",
                              "plus", "minus-zero", "hex", "arabic-indic"])
def test_an_integer_option_takes_plain_ascii_digits_only(
        scratch: Path, option: list[str], code: str, text: str) -> None:
    run(scratch, "--now", "1000", "enqueue", "demo.jsonl")
    before = {path.name: path.read_bytes() for path in scratch.iterdir()}

    result = run(scratch, "--now", "2000", *option, text)

    assert (result.returncode, result.stdout) == (2, "")
    said = (SECONDS.format(1 if option[1] == "--lease-seconds" else 0)
            if code == "invalid_seconds" else COUNT)
    assert result.stderr.splitlines()[-1].endswith(
        f" error: {code}: argument {option[1]}: {said} {text!r}"), result.stderr
    assert {path.name: path.read_bytes() for path in scratch.iterdir()} == before


@pytest.mark.parametrize("args, error", [
    (["prune"], "missing_option: the following arguments are required: --older-than"),
    (["prune", "--older-than", "-1"], f"invalid_seconds: argument --older-than: "
                                      f"{SECONDS.format(0)} '-1'"),
    (["--now", "x", "status"], f"invalid_seconds: argument --now: {SECONDS.format(0)} 'x'"),
    (["--now"], "missing_value: argument --now: expected one argument"),
    (["--db", "queue.sqlite3", "--now"], "missing_value: argument --now: expected one argument"),
    (["status", "extra"], "unexpected_argument: unrecognized arguments: extra"),
    (["work", "--accept"], "missing_value: argument --accept: expected at least one argument"),
    (["redrive"], "missing_option: the following arguments are required: EVENT_ID"),
    (["prune", "--older", "60"], "unknown_option: the command 'prune' has no option --older; "
                                 "did you mean --older-than? as in: queue-core prune "
                                 "--older-than 60"),
    (["--no", "5", "status"], "unknown_option: queue-core has no option --no; did you mean "
                              "--now? as in: queue-core --now 5 status"),
], ids=["missing-older-than", "negative-older-than", "word-now", "now-without-value",
        "last-now-without-value", "extra-argument", "accept-without-value", "redrive-without-id",
        "abbreviated-older-than",
        "abbreviated-now"])
def test_every_argument_refusal_starts_with_a_stable_code_and_none_is_abbreviated(
        scratch: Path, args: list[str], error: str) -> None:
    run(scratch, "--now", "1000", "enqueue", "demo.jsonl")
    before = {path.name: path.read_bytes() for path in scratch.iterdir()}

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].endswith(f" error: {error}"), result.stderr
    assert {path.name: path.read_bytes() for path in scratch.iterdir()} == before


@pytest.mark.parametrize("make, command, code", [
    (lambda folder: folder, "status", "not_a_database"),
    (lambda folder: (folder / "junk.sqlite3").write_text("not a database " * 100) and
     folder / "junk.sqlite3", "status", "not_a_database"),
], ids=["a-directory", "not-a-database"])
def test_an_unusable_database_file_is_an_operational_error_exit_1(
        scratch: Path, make, command: str, code: str) -> None:
    db = make(scratch)

    result = run(scratch, "--db", str(db), command)

    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {code}: ")
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["enqueue", "demo.jsonl"], ["work"], ["status"],
                                     ["metrics"], ["redrive", "E0004"]],
                         ids=["enqueue", "work", "status", "metrics", "redrive"])
@pytest.mark.parametrize("db, why", [
    ("nodir/x.sqlite3", "No such file or directory (the folder nodir does not exist)"),
    ("demo.jsonl/x.sqlite3", "Not a directory (demo.jsonl is a file, not a folder)"),
], ids=["missing-folder", "a-file-as-folder"])
def test_a_database_path_in_a_missing_folder_says_so_and_leaves_nothing_behind(
        scratch: Path, command: list[str], db: str, why: str) -> None:
    before = {path.name: path.read_bytes() for path in scratch.iterdir()}

    result = run(scratch, "--db", db, "--now", "1000", *command)

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"error: os_error: {db}: {why}\n"
    assert {path.name: path.read_bytes() for path in scratch.iterdir()} == before


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
    # the refused ACK was rolled back and its message given back: no lease is left to run out
    assert status_json(scratch)["states"] == {"ready": 4, "leased": 0, "done": 0, "dead": 0}
    assert [row[0] for row in sqlite3.connect(scratch / "queue.sqlite3").execute(
        "SELECT reason FROM transitions WHERE event_id = 'E0001' ORDER BY seq")] == [
        "enqueued", "claimed", "released"]


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

