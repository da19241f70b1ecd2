"""Files that are not the queue's are left byte for byte as they were.

Every command (``status``, ``enqueue``, ``work``, ``redrive``) is run through
the real command line against files another application made, a file from
a later schema version, random bytes and a truncated queue file: each is
refused with one clear line and exit 1, and the folder holds exactly the
bytes it held before. A reading command never creates a file.
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from conftest import DATA
from queue_core import ModelClock, Queue, UnusableFile
from queue_core.marks import APPLICATION_ID
from queue_core.sqlite import SCHEMA_VERSION

COMMANDS = {
    "status": ["status"],
    "enqueue": ["enqueue", str(DATA / "demo.jsonl")],
    "work": ["work"],
    "redrive": ["redrive", "E0004"],
}


def cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", str(db), "--now", "1000",
                           *args], capture_output=True, text=True, timeout=60)


def sqlite_file(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def other_effects(path: Path) -> None:
    sqlite_file(path, "CREATE TABLE effects (id INTEGER PRIMARY KEY, note TEXT)",
                "INSERT INTO effects (note) VALUES ('an invoice')")


def look_alike_messages(path: Path) -> None:
    sqlite_file(path, "CREATE TABLE messages (event_id TEXT PRIMARY KEY, state TEXT, payload TEXT)",
                "INSERT INTO messages VALUES ('E0004', 'dead', '{}')")


def unrelated_tables(path: Path) -> None:
    sqlite_file(path, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)",
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER)")


def wal_mode_app(path: Path) -> None:
    sqlite_file(path, "PRAGMA journal_mode = WAL", "CREATE TABLE notes (body TEXT)",
                "INSERT INTO notes VALUES ('kept')")


def our_mark_on_other_tables(path: Path) -> None:
    sqlite_file(path, f"PRAGMA application_id = {APPLICATION_ID}", "PRAGMA user_version = 1",
                "CREATE TABLE notes (body TEXT)")


def tables_only_in_the_wal(path: Path) -> None:
    """A WAL file whose tables are committed to its -wal only: the file and its
    -wal copied while its writer still has it open (no -shm: none may appear)."""
    source = path.with_name("running.sqlite3")
    conn = sqlite3.connect(source)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
        for suffix in ("", "-wal"):
            Path(f"{path}{suffix}").write_bytes(Path(f"{source}{suffix}").read_bytes())
    finally:
        conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{source}{suffix}").unlink(missing_ok=True)


def future_schema(path: Path) -> None:
    Queue(path, clock=ModelClock(1000)).enqueue_jsonl(DATA.joinpath("demo.jsonl").read_text())
    sqlite_file(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")


def random_bytes(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 64)


def truncated_queue(path: Path) -> None:
    Queue(path, clock=ModelClock(1000)).enqueue_jsonl(DATA.joinpath("demo.jsonl").read_text())
    sqlite_file(path, "PRAGMA wal_checkpoint(TRUNCATE)")
    path.write_bytes(path.read_bytes()[:8192])


FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    "effects-of-another-shape": (other_effects, "not_a_queue"),
    "look-alike-messages": (look_alike_messages, "not_a_queue"),
    "only-unrelated-tables": (unrelated_tables, "not_a_queue"),
    "another-app-in-wal-mode": (wal_mode_app, "not_a_queue"),
    "the-queues-mark-on-other-tables": (our_mark_on_other_tables, "not_a_queue"),
    "another-app-only-in-its-wal": (tables_only_in_the_wal, "not_a_queue"),
    "future-schema-version": (future_schema, "schema_too_new"),
    "random-bytes": (random_bytes, "not_a_database"),
    "truncated-queue-file": (truncated_queue, "not_a_database"),
}


def folder_bytes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", FILES)
def test_a_file_that_is_not_the_queues_is_refused_and_left_byte_for_byte(
        tmp_path: Path, kind: str, command: str) -> None:
    make, code = FILES[kind]
    db = tmp_path / "app.sqlite3"
    make(db)
    before = folder_bytes(tmp_path)

    result = cli(db, *COMMANDS[command])

    assert result.returncode == 1, result
    assert result.stderr.startswith(f"error: {code}: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert folder_bytes(tmp_path) == before


def test_the_refusal_names_what_it_found(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite3"
    unrelated_tables(db)

    with pytest.raises(UnusableFile) as refused:
        Queue(db)

    assert refused.value.code == "not_a_queue"
    assert "tables customers, orders" in str(refused.value)


def test_a_file_with_the_queues_mark_and_no_queue_says_so(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite3"
    our_mark_on_other_tables(db)

    with pytest.raises(UnusableFile) as refused:
        Queue(db)

    assert refused.value.code == "not_a_queue"
    assert "carries the queue's mark" in str(refused.value)
    assert "holds no queue (tables notes)" in str(refused.value)


def test_tables_that_exist_only_in_the_wal_are_not_called_none_and_not_read(tmp_path: Path) -> None:
    db = tmp_path / "app.sqlite3"
    tables_only_in_the_wal(db)
    assert Path(f"{db}-wal").stat().st_size > 0

    with pytest.raises(UnusableFile) as refused:
        Queue(db)

    assert refused.value.code == "not_a_queue"
    assert ("(application_id 0: no tables in the file itself, and commits in its -wal that "
            "the queue leaves unread)") in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite3", "app.sqlite3-wal"]


@pytest.mark.parametrize("command", ["status", "metrics"])
def test_a_reading_command_on_a_missing_file_says_so_and_creates_nothing(
        tmp_path: Path, command: str) -> None:
    result = cli(tmp_path / "typo.sqlite3", command)

    assert result.returncode == 1
    assert result.stderr.startswith("error: no_queue_file: ")
    assert list(tmp_path.iterdir()) == []


def test_a_new_queue_file_carries_the_mark_and_is_in_wal_mode(tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    Queue(db)
    conn = sqlite3.connect(db)
    try:
        mark = [conn.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("application_id", "user_version", "journal_mode")]
    finally:
        conn.close()

    assert mark == [APPLICATION_ID, SCHEMA_VERSION, "wal"]


def test_an_empty_file_is_made_a_queue(tmp_path: Path) -> None:
    db = tmp_path / "empty.sqlite3"
    db.touch()

    Queue(db, clock=ModelClock(1000)).enqueue_jsonl(DATA.joinpath("demo.jsonl").read_text())

    assert Queue(db, create=False).status().states["ready"] == 4


def test_opening_a_marked_queue_writes_nothing_and_takes_no_lock(tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    Queue(db).enqueue_jsonl(DATA.joinpath("demo.jsonl").read_text())
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        before = folder_bytes(tmp_path)
        status = Queue(db, create=False).status()  # would wait 30 s if it needed the lock
        assert (status.states["ready"], status.total) == (4, 0)
        assert folder_bytes(tmp_path) == before
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def overwritten_schema(path: Path) -> None:
    """A real queue whose tables' definitions were overwritten on disk: SQLite's error
    then quotes text that is not UTF-8, which Python cannot decode."""
    queue = Queue(path, clock=ModelClock(1000))
    queue.enqueue_file(DATA / "demo.jsonl")
    del queue
    raw = bytearray(path.read_bytes())
    at = raw.index(b"tableeffectseffects") + len(b"table")  # its name, as sqlite_master holds it
    raw[at:at + 200] = b"\xfe" * 200
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("command", [("status",), ("metrics", "--json"), ("work",),
                                     ("redrive", "E0004"), ("enqueue", str(DATA / "demo.jsonl"))])
def test_a_queue_whose_schema_page_was_overwritten_is_refused_in_one_line_and_left_as_it_is(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    db = tmp_path / "queue.sqlite3"
    overwritten_schema(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    done = cli(db, *command)

    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"error: not_a_database: {db} is damaged: SQLite read text that is "
                           "not UTF-8 from it (a page of the file was overwritten)\n")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["queue.sqlite3"]


def test_the_api_refuses_an_overwritten_schema_with_a_code_not_a_decoding_error(
        tmp_path: Path) -> None:
    db = tmp_path / "queue.sqlite3"
    overwritten_schema(db)

    # refused when it is opened: the check that it holds a queue reads the schema
    with pytest.raises(UnusableFile) as refused:
        Queue(db, clock=ModelClock(1000))
    assert refused.value.code == "not_a_database" and "is damaged" in str(refused.value)


def overwritten_page(path: Path) -> None:
    """A queue of 400 messages with 200 bytes of one of its tree pages overwritten on disk."""
    queue = Queue(path, clock=ModelClock(1000))
    queue.enqueue_jsonl("\n".join(
        f'{{"event_id": "E{i:04d}", "payload": {{"category": "pen", "amount_cents": {i + 1}}}}}'
        for i in range(400)))
    del queue
    raw = bytearray(path.read_bytes())
    raw[20000:20200] = b"\xfe" * 200
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("command", [("work",), ("work", "--max", "2"), ("redrive", "E0001"),
                                     ("enqueue", str(DATA / "demo.jsonl"))])
def test_a_writing_command_refuses_a_damaged_file_before_it_writes_a_byte(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    db = tmp_path / "queue.sqlite3"
    overwritten_page(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    done = cli(db, *command)

    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: not_a_database: {db} is damaged: SQLite's quick_check found ")
    assert line.endswith("; nothing was written. A damaged file is outside the guarantee "
                         "(README: where the guarantee ends): restore it from a copy")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["queue.sqlite3"]
