"""A learner's mistakes on the command line. Those that cannot mean anything (two id
rules, an empty category, a name SQLite keeps for its own files, or a database under
such a name beside the queue, a connection string
that is no URL, a path that is not UTF-8) are refused in one line with a stable code,
the folder and every file in it left as they were; those that can (``--accept`` given
twice, a path that starts with ``file:``) do what they say."""

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
                                "expected a category's name, got an empty one: leave it out, "
                                "or name the category")
    assert folder(scratch) == before
    # without it, the message is dead-lettered as any unknown category is
    worked = run(scratch, *db, "work")
    assert worked.stdout.startswith("E0100 dead (generation 1): invalid_payload: ")
    with pytest.raises(ValueError, match="a category is a name, a non-empty string; got '': "
                                         "leave it out, or name the category"):
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
        f"error: reserved_name: queue.sqlite3{ending}: SQLite names the files it keeps beside a "
        "database with -wal, -shm or -journal after the database's name, and would take a "
        "queue named so for one of them and delete it: choose a name that does not end so")
    assert folder(scratch) == before
    with pytest.raises(UnusableFile) as raised:
        Queue(scratch / f"other.sqlite3{ending}")
    assert raised.value.code == "reserved_name"
    assert folder(scratch) == before


@pytest.mark.parametrize("ending", ["-wal", "-shm", "-journal"])
def test_a_database_beside_the_queue_under_a_side_files_name_is_refused_and_kept(
        scratch: Path, ending: str) -> None:
    # A release before the names were reserved made a queue as queue.sqlite3-wal; then
    # a status of queue.sqlite3 deleted it with its messages (SQLite took it for the
    # -wal, found no WAL in it, and removed it on closing), and a -shm was overwritten.
    from queue_core import audit
    db = ["--now", "1000"]
    assert run(scratch, *db, "--db", "other.sqlite3", "enqueue", "demo.jsonl").returncode == 0
    assert run(scratch, *db, "enqueue", "demo.jsonl").returncode == 0
    os.rename(scratch / "other.sqlite3", scratch / f"queue.sqlite3{ending}")
    os.rename(scratch / "demo.jsonl", scratch / "batch.jsonl")  # a name no side file ends
    before = folder(scratch)
    why = (f"error: reserved_name: {{db}}: {{db}}{ending} beside it is a SQLite database of "
           "its own (a queue an earlier release made under that name, say), which SQLite "
           f"would take for the {ending} file of {{db}}, overwrite and delete: move it, and "
           "any -wal and -shm of its own, to a name that does not end in -wal, -shm or "
           "-journal, then run this again")

    for command in (["status"], ["metrics", "--json"], ["work"], ["redrive", "E0004"],
                    ["prune", "--older-than", "0"], ["migrate"], ["enqueue", "batch.jsonl"]):
        refused = run(scratch, *db, *command)
        assert refused.returncode == 1, command
        assert refusal(refused) == why.format(db="queue.sqlite3"), command
        assert folder(scratch) == before, command
    for opening in (lambda: Queue(scratch / "queue.sqlite3"),
                    lambda: audit.findings(scratch / "queue.sqlite3")):
        with pytest.raises(UnusableFile) as raised:
            opening()
        assert raised.value.code == "reserved_name"
        assert folder(scratch) == before
    # nor is a new queue made beside one
    os.rename(scratch / f"queue.sqlite3{ending}", scratch / f"new.sqlite3{ending}")
    made = run(scratch, *db, "--db", "new.sqlite3", "enqueue", "batch.jsonl")
    assert (made.returncode, refusal(made)) == (1, why.format(db="new.sqlite3"))
    assert "new.sqlite3" not in os.listdir(scratch)

    # moved to a name of its own, it is the queue it was, and so is the other
    os.rename(scratch / f"new.sqlite3{ending}", scratch / "other.sqlite3")
    for name in ("queue.sqlite3", "other.sqlite3"):
        status = Queue(scratch / name).status()
        assert (status.states["ready"], status.total) == (4, 0)
        assert audit.findings(scratch / name) == []


def test_a_path_that_starts_with_file_is_the_file_of_that_name_for_every_command(
        scratch: Path) -> None:
    # The defect needs a SQLite that reads a name starting with file: as a URI even
    # when the caller did not ask for URIs (SQLITE_USE_URI, as the Python builds here
    # have it): there the writers made new.sqlite3, where the readers looked for the
    # file of the whole name.
    db = ["--db", "file:new.sqlite3?mode=rwc", "--now", "1000"]

    enqueued = run(scratch, *db, "enqueue", "demo.jsonl")

    assert (enqueued.returncode, enqueued.stdout) == (0, "inserted 4, duplicates 1\n")
    assert sorted(os.listdir(scratch)) == ["demo.jsonl", "file:new.sqlite3?mode=rwc"]
    worked = run(scratch, *db, "work")
    assert worked.returncode == 0, worked.stderr
    status = run(scratch, *db, "status")
    assert status.stdout.splitlines()[0] == "states:  ready 0, leased 0, done 3, dead 1"
    assert sorted(os.listdir(scratch)) == ["demo.jsonl", "file:new.sqlite3?mode=rwc"]


LEARNER = "postgresql://learner:" + "tiger-lily"  # a password the refusal must not show


@pytest.mark.parametrize(("dsn", "why"), [
    (LEARNER + "@h:notaport/db", "Port could not be cast to integer value as 'notaport'"),
    (LEARNER + "@127.0.0.1:99999/db", "Port out of range 0-65535"),
    (LEARNER + "@[::1/db", "Invalid IPv6 URL")])
@pytest.mark.parametrize("command", ["status", "enqueue"])
def test_a_connection_string_that_is_no_valid_url_is_refused_without_its_password(
        scratch: Path, dsn: str, why: str, command: str) -> None:
    refused = run(scratch, "--db", dsn, command, *(["demo.jsonl"] if command == "enqueue"
                                                   else []))

    assert refused.returncode == 2
    assert refusal(refused) == (
        f"queue-core: error: invalid_db: argument --db: the connection string is not a valid "
        f"URL ({why}); write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    assert "tiger-lily" not in refused.stderr
    assert sorted(os.listdir(scratch)) == ["demo.jsonl"]


def test_a_queue_opened_on_a_connection_string_that_is_no_url_names_it_without_the_string(
        ) -> None:
    from queue_core.postgres.store import PostgresStore

    assert PostgresStore(LEARNER + "@[::1/db").describe() == \
        "postgresql://(a connection string that is not a valid URL)"


PART = "(a part of the connection string)"


@pytest.mark.parametrize(("dsn", "said"), [
    (LEARNER + "@[::1/db", "postgresql://(a connection string that is not a valid URL): end of "
     f"string reached when looking for matching {PART} in IPv6 host address in URI: {PART}"),
    (LEARNER + "@h/db?foo=bar", f"postgresql://h/db: invalid URI query parameter: {PART}"),
    # a % that is no escape: libpq quotes the part it was decoding, the password itself
    ("postgresql://learner:" + "tiger%zzlily@h/db?x=1",
     f"postgresql://h/db: invalid percent-encoded token: {PART}"),
    ("postgresql://h/db?password=tiger%zzlily&x=1",
     f"postgresql://h/db: invalid percent-encoded token: {PART}")])
def test_a_connection_string_libpq_cannot_parse_is_refused_without_its_password(
        scratch: Path, dsn: str, said: str) -> None:
    # Through the API the first raised psycopg's own error, which quoted the string,
    # password and all; the second did so on the command line too, as a database_error.
    with pytest.raises(UnusableFile) as raised:
        Queue(dsn)
    assert (raised.value.code, str(raised.value)) == ("cannot_connect", said)
    if "?" in dsn:  # a URL, so the command line hands it on to libpq
        refused = run(scratch, "--db", dsn, "status")
        assert (refused.returncode, refusal(refused)) == (1, f"error: cannot_connect: {said}")
        assert "tiger" not in refused.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="a file name of bytes that are not UTF-8 "
                    "is a Linux file system's (macOS refuses to create one)")
def test_a_path_that_is_not_utf8_is_refused_and_no_file_is_made(scratch: Path) -> None:
    name = os.fsdecode(b"\xff.sqlite3")

    # in a UTF-8 locale, where the byte is not text (in Latin-1 it is the letter y)
    refused = subprocess.run([*MODULE, "--db", name, "--now", "1000", "enqueue", "demo.jsonl"],
                             cwd=scratch, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"})

    assert refused.returncode == 2
    assert refusal(refused) == (
        "queue-core: error: invalid_db: argument --db: '\\udcff.sqlite3' is not UTF-8 text, "
        "and SQLite names its files in UTF-8: give a path whose every name is UTF-8 (rename "
        "the one that is not)")
    assert sorted(os.listdir(scratch)) == ["demo.jsonl"]


def test_the_audit_still_reports_an_effect_whose_category_was_emptied_behind_the_queue(
        tmp_path: Path) -> None:
    import sqlite3

    from queue_core import audit, drain

    queue = Queue(tmp_path / "q.sqlite3")
    queue.enqueue_file(DATA / "demo.jsonl")
    drain(queue, Handler())
    conn = sqlite3.connect(tmp_path / "q.sqlite3")
    conn.execute("PRAGMA ignore_check_constraints = ON")  # a hand on the file, not the queue
    conn.execute("UPDATE effects SET category = '' WHERE event_id = 'E0001'")
    conn.commit()
    conn.close()

    assert [(f.name, f.event_id) for f in audit.findings(tmp_path / "q.sqlite3")] == \
        [("effect_differs", "E0001")]
