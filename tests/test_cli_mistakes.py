"""A learner's mistakes on the command line, each refused in one line with a stable
code, the folder and every file in it left byte for byte as they were: options given
twice, an empty category, a name SQLite keeps for itself, a path SQLite would read
as a URI, a broken connection string, a path that is not UTF-8."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from queue_core import Handler, Queue, UnusableFile

MODULE = [sys.executable, "-m", "queue_core"]


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODULE, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def folder(where: Path) -> dict[str, str]:
    """Every file in ``where``, by name, with its bytes' digest."""
    return {name: hashlib.sha256((where / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(where))}


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The refusal's last line, after checking it is one line with no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    shutil.copy(DATA / "demo.jsonl", tmp_path / "demo.jsonl")
    return tmp_path


def test_accept_given_twice_accepts_both_lists(scratch: Path) -> None:
    (scratch / "gifts.jsonl").write_text(
        '{"event_id": "E0010", "payload": {"category": "gift", "amount_cents": 700}}\n',
        encoding="utf-8")
    db = ["--db", "q.sqlite3", "--now", "1000"]
    for batch in ("demo.jsonl", "gifts.jsonl"):
        assert run(scratch, *db, "enqueue", batch).returncode == 0

    worked = run(scratch, *db, "work", "--accept", "toy", "--accept", "gift")

    assert worked.returncode == 0, worked.stderr
    assert [line.split()[:2] for line in worked.stdout.splitlines()[:-1]] == [
        ["E0001", "done"], ["E0002", "done"], ["E0003", "done"], ["E0004", "done"],
        ["E0010", "done"]]
    status = Queue(scratch / "q.sqlite3").status()
    assert (status.states["done"], status.total) == (5, 10000 + 2000 + 5000 + 3000 + 700)


def test_an_empty_category_is_refused_before_the_queue_is_touched(scratch: Path) -> None:
    (scratch / "blank.jsonl").write_text(
        '{"event_id": "E0100", "payload": {"category": "", "amount_cents": 100}}\n',
        encoding="utf-8")
    db = ["--db", "q.sqlite3", "--now", "1000"]
    assert run(scratch, *db, "enqueue", "blank.jsonl").returncode == 0
    before = folder(scratch)

    refused = run(scratch, *db, "work", "--accept", "", "toy")

    assert refused.returncode == 2
    assert refusal(refused) == ("queue-core work: error: invalid_category: argument --accept: "
                                "expected a category's name, got an empty one")
    assert folder(scratch) == before
    # without it, the message is dead-lettered as any unknown category is
    worked = run(scratch, *db, "work")
    assert worked.stdout.startswith("E0100 dead (generation 1): invalid_payload: ")
    with pytest.raises(ValueError, match="a category is a name, a non-empty string; got ''"):
        Handler().supporting("")


def test_two_different_id_rules_in_one_command_are_refused_and_no_queue_is_made(
        scratch: Path) -> None:
    before = folder(scratch)

    refused = run(scratch, "--db", "n.sqlite3", "--now", "1000", "enqueue",
                  "--ids", "general", "--ids", "course", "demo.jsonl")

    assert refused.returncode == 2
    assert refusal(refused) == ("queue-core enqueue: error: conflicting_option: argument "
                                "--ids: given as general and as course; choose one")
    assert folder(scratch) == before
    same = run(scratch, "--db", "n.sqlite3", "--now", "1000", "enqueue",
               "--ids", "general", "--ids", "general", "demo.jsonl")
    assert (same.returncode, same.stdout) == (0, "inserted 4, duplicates 1\n")
    assert Queue(scratch / "n.sqlite3").id_rule == "general"


@pytest.mark.parametrize("ending", ["-wal", "-shm", "-journal"])
def test_no_queue_is_made_under_a_name_sqlite_keeps_for_the_files_beside_another(
        scratch: Path, ending: str) -> None:
    db = ["--now", "1000"]
    assert run(scratch, *db, "enqueue", "demo.jsonl").returncode == 0  # queue.sqlite3
    before = folder(scratch)

    refused = run(scratch, "--db", f"queue.sqlite3{ending}", *db, "enqueue", "demo.jsonl")

    assert refused.returncode == 1
    assert refusal(refused) == (
        f"error: reserved_name: queue.sqlite3{ending}: a name ending in -wal, -shm or -journal "
        "is SQLite's, for a file it keeps beside a database, and SQLite would delete this "
        "one: choose another name")
    assert folder(scratch) == before
    with pytest.raises(UnusableFile) as raised:
        Queue(scratch / f"other.sqlite3{ending}")
    assert raised.value.code == "reserved_name"
    assert folder(scratch) == before


def test_a_path_that_starts_with_file_is_the_file_of_that_name_for_every_command(
        scratch: Path) -> None:
    db = ["--db", "file:new.sqlite3?mode=rwc", "--now", "1000"]

    enqueued = run(scratch, *db, "enqueue", "demo.jsonl")

    assert (enqueued.returncode, enqueued.stdout) == (0, "inserted 4, duplicates 1\n")
    assert sorted(os.listdir(scratch)) == ["demo.jsonl", "file:new.sqlite3?mode=rwc"]
    worked = run(scratch, *db, "work")
    assert worked.returncode == 0, worked.stderr
    status = run(scratch, *db, "status")
    assert status.stdout.splitlines()[0] == "states:  ready 0, leased 0, done 3, dead 1"
    assert sorted(os.listdir(scratch)) == ["demo.jsonl", "file:new.sqlite3?mode=rwc"]


@pytest.mark.parametrize("dsn", ["postgresql://USER:PASSWORD@h:notaport/db",
                                 "postgresql://USER:PASSWORD@127.0.0.1:99999/db",
                                 "postgresql://[::1"])
def test_a_connection_string_that_is_no_valid_url_is_one_line_without_its_password(
        scratch: Path, dsn: str) -> None:
    refused = run(scratch, "--db", dsn, "status")

    assert refused.returncode == 1
    line = refusal(refused)
    assert line.startswith("error: ") and len(refused.stderr.strip().splitlines()) == 1
    assert "postgresql://(a connection string that is no valid URL)" in line
    assert "PASSWORD" not in line
    assert sorted(os.listdir(scratch)) == ["demo.jsonl"]


@pytest.mark.skipif(sys.platform != "linux", reason="a file name of bytes that are not UTF-8 "
                    "is a Linux file system's (macOS refuses to create one)")
def test_a_path_that_is_not_utf8_is_refused_and_no_file_is_made(scratch: Path) -> None:
    name = os.fsdecode(b"\xff.sqlite3")

    refused = run(scratch, "--db", name, "--now", "1000", "enqueue", "demo.jsonl")

    assert refused.returncode == 2
    assert refusal(refused) == (
        "queue-core: error: invalid_db: argument --db: '\\udcff.sqlite3' is not UTF-8 text; "
        "SQLite names its files in UTF-8: rename the file or its folder")
    assert sorted(os.listdir(scratch)) == ["demo.jsonl"]
