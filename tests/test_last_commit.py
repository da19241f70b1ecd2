"""A file is what its last commit says, also while that commit is still in the -wal.

In WAL mode a commit is durable in the ``-wal`` before a checkpoint copies it
into the main file. A writer killed before its checkpoint leaves the main
file's header as it was before the commit; one killed inside its checkpoint
leaves a header that may count pages the main file does not have yet. The
queue judges a file's identity (application id, schema version, size) as
SQLite does, through the ``-wal``, and checks the version again inside each
write transaction. Real processes commit and die here (``os._exit``, and
``SIGKILL`` inside a checkpoint by ``lab.sweeps.checkpoint``'s shim).
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

from conftest import DATA, ROOT
from queue_core import Handler, ModelClock, Queue, UnusableFile, drain
from queue_core.audit import findings, snapshot
from queue_core.crashpoints import CRASH_EXIT_CODE
from queue_core.lab.servers.postgres_server import schema_of, with_schema
from queue_core.lab.sweeps.checkpoint import COMMANDS, run_checkpoint_sweep
from queue_core.sqlite import SCHEMA_VERSION, schema_version

SCHEMA1 = ROOT / "tests" / "files" / "schema1-265c64c.sqlite3"
TWENTY_MONEY = 21000  # data/twenty.jsonl: 20 events, 100 + 200 + ... + 2000 cents


def cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", str(db), "--now", "1000",
                           *args], capture_output=True, text=True, timeout=60)


def commit_and_die(db: Path, *statements: str) -> None:
    """Commit ``statements`` in another process, which then dies before any
    checkpoint: the commit stays in the ``-wal``."""
    script = ("import os, sqlite3, sys\n"
              "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "for statement in sys.argv[2:]:\n"
              "    conn.execute(statement)\n"
              "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", script, str(db), *statements], check=True, timeout=60)
    assert Path(f"{db}-wal").stat().st_size > 0


def digests(*paths: Path) -> list[str]:
    return [hashlib.sha256(path.read_bytes()).hexdigest() for path in paths]


def ready_queue(db: Path) -> Queue:
    queue = Queue(db, clock=ModelClock(1000))
    queue.enqueue_file(DATA / "twenty.jsonl")
    return queue


def test_a_newer_version_still_in_the_wal_is_refused_and_nothing_is_written(
        tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    ready_queue(db)
    commit_and_die(db, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with open(db, "rb") as file:  # the main file still says this engine's version
        assert int.from_bytes(file.read(64)[60:64], "big") == SCHEMA_VERSION
    before = digests(db, Path(f"{db}-wal"))
    worked = cli(db, "work")
    assert worked.returncode != 0
    assert f"schema_too_new: {db} has queue schema version {SCHEMA_VERSION + 1}" in worked.stderr
    assert "Traceback" not in worked.stderr
    assert digests(db, Path(f"{db}-wal")) == before
    assert schema_version(db) == SCHEMA_VERSION + 1
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT state, count(*) FROM messages GROUP BY state").fetchall() \
            == [("ready", 20)]
        assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)


def test_a_migration_killed_after_its_commit_is_seen_by_the_next_worker(tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    shutil.copyfile(SCHEMA1, db)
    script = ("import sys\nfrom queue_core.crashpoints import arm\n"
              "from queue_core.migrations import migrate\n"
              "arm('migrate.after_commit')\nmigrate(sys.argv[1])\n")
    died = subprocess.run([sys.executable, "-c", script, str(db)], timeout=60)
    assert died.returncode == CRASH_EXIT_CODE
    with open(db, "rb") as file:  # the commit is in the -wal only
        assert int.from_bytes(file.read(64)[60:64], "big") == 1
    assert schema_version(db) == 2
    # the next migrate reads version 2 from the -wal: it takes the step after, not 1 -> 2 again
    migrated = cli(db, "migrate")
    assert migrated.stdout.splitlines()[0] == "schema 2 -> 3: 0 messages rewritten", \
        migrated.stderr
    worked = subprocess.run([sys.executable, "-m", "queue_core", "--db", str(db), "--now", "2000",
                             "work"], capture_output=True, text=True, timeout=60)
    assert worked.returncode == 0, worked.stderr
    snap = snapshot(db)
    assert snap.version == SCHEMA_VERSION and findings(db) == []
    assert snap.states() == {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "done",
                           "E0005": "done"}
    assert snap.money == 17700  # lab.sweeps.lifetime: every message of the file once


def test_a_queue_opened_before_another_process_migrated_it_writes_at_once(
        tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    shutil.copyfile(SCHEMA1, db)
    queue = Queue(db, clock=ModelClock(2000))
    assert queue.schema_version == 1
    migrated = cli(db, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    result = queue.enqueue_file(DATA / "twenty.jsonl")  # no reopening needed
    assert (result.inserted, queue.schema_version) == (20, SCHEMA_VERSION)
    drain(queue, Handler())
    assert findings(db) == []
    assert snapshot(db).money == 17700 + TWENTY_MONEY


def test_a_writer_meets_a_version_changed_after_it_opened_the_file_inside_its_transaction(
        tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    queue = ready_queue(db)
    with queue.session():  # a long-lived connection, opened before the change
        commit_and_die(db, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        with pytest.raises(UnusableFile) as refused:
            queue.claim()
        assert refused.value.code == "schema_too_new"
    with pytest.raises(UnusableFile) as refused:
        queue.enqueue_file(DATA / "demo.jsonl")
    assert refused.value.code == "schema_too_new"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT state, count(*) FROM messages GROUP BY state").fetchall() \
            == [("ready", 20)]
        assert conn.execute("SELECT count(*) FROM transitions").fetchone() == (20,)


def test_a_command_killed_inside_its_checkpoint_leaves_a_file_every_command_uses(
        tmp_path: Path) -> None:
    # Every 12th point of each command, and its last: the first page copied, pages
    # in the middle, the flush. make reliability runs every point.
    cases, problems = run_checkpoint_sweep(tmp_path, every=12)
    assert problems == []
    assert {case.command for case in cases} == set(COMMANDS)
    assert len(cases) >= 2 * len(COMMANDS)
    assert all(case.killed for case in cases)


def test_prune_with_an_age_beyond_64_bits_prunes_nothing_and_raises_nothing(
        tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    queue = ready_queue(db)
    drain(queue, Handler())
    pruned = queue.prune(10**19)
    assert (pruned.older_than, pruned.messages, pruned.journal_rows, pruned.kept) \
        == (10**19, 0, 0, ())
    assert snapshot(db).money == TWENTY_MONEY and findings(db) == []
    assert snapshot(db).status.pruned == 0


def test_migrate_refuses_a_mark_with_version_0_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    ready_queue(db)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 0")
    conn.close()
    before = digests(db)
    for args in (("migrate",), ("status",), ("work",)):
        said = cli(db, *args)
        assert said.returncode != 0
        assert said.stderr.startswith(f"error: not_a_queue: {db} carries the queue's mark with "
                                      "schema version 0"), said.stderr
        assert "Traceback" not in said.stderr
    assert digests(db) == before


def test_the_audit_refuses_what_every_command_refuses(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite3"
    with pytest.raises(UnusableFile) as refused:
        snapshot(missing)
    assert refused.value.code == "no_queue_file"
    assert list(tmp_path.iterdir()) == []

    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    with pytest.raises(UnusableFile) as refused:
        findings(foreign)
    assert refused.value.code == "not_a_queue"

    newer = tmp_path / "newer.sqlite3"
    ready_queue(newer)
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UnusableFile) as refused:
        snapshot(newer)
    assert refused.value.code == "schema_too_new"


def test_a_schema_of_its_own_keeps_the_options_a_connection_string_already_has() -> None:
    dsn = "postgresql://user@localhost:5432/db?options=-c%20work_mem%3D8MB"
    scoped = with_schema(dsn, "queue_run_1")
    assert "+" not in scoped  # libpq would read a "+" as part of work_mem's value
    assert "options=-c%20work_mem%3D8MB%20-csearch_path%3Dqueue_run_1" in scoped
    assert schema_of(scoped) == "queue_run_1"
    assert with_schema(scoped, "queue_run_2").count("search_path") == 1


def test_a_schema_of_its_own_connects_with_the_options_kept(pg_server: str) -> None:
    import psycopg

    from queue_core.lab.servers.postgres_server import drop_schema, fresh_schema

    parts = urlsplit(pg_server)
    query = urlencode({**dict(parse_qsl(parts.query)), "options": "-c work_mem=8MB"},
                      quote_via=quote)
    scoped = fresh_schema(urlunsplit(parts._replace(query=query)), prefix="queue_test")
    try:
        with psycopg.connect(scoped) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
            assert conn.execute("SELECT current_schema()").fetchone() == (schema_of(scoped),)
    finally:
        drop_schema(scoped)
