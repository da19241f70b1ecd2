"""Queues written by the release before PostgreSQL's schema 3, tested with its own code.

The engine of 5e07019 writes schema 2 on both stores. A SQLite file of schema 2
needs only the steps to 3 and 4 (the id rule recorded, the priority added, no
row rewritten: PostgreSQL's versions 3 and 4 add only its step function), then
works; that engine refuses the migrated file. A PostgreSQL schema of version 2 is read as it
is, refused for writes until ``migrate`` adds the function (no message
rewritten; schema 4 replaces that function), then worked by the step; a
worker of that engine running while the steps commit goes on unchanged and
correct, and that engine refuses the migrated schema when it opens it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import previous_engine
from queue_core import Handler, ModelClock, Queue, UnusableFile, audit, drain, migrate, postgres
from queue_core.lab.lifetime.earlier import AFTER_MIGRATION, V1_STORY, worker_said

ROOT = Path(__file__).resolve().parent.parent
ENGINE = previous_engine.SCHEMA2_ENGINE
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready"}
# The committed files' scenario (``V1_STORY``: every state, 15000 of money), without
# its last lines, which tidy a SQLite file's -wal.
STORY = V1_STORY.split("import sqlite3")[0]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    previous_engine.require_history()
    return previous_engine.export(ENGINE, tmp_path_factory.mktemp("engines"))


def written(engine: Path, target: str) -> str:
    done = previous_engine.run(engine, STORY, target)
    assert done.returncode == 0, done.stderr
    return target


def cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def finished(db: str) -> audit.Snapshot:
    drain(Queue(db, clock=ModelClock(2000)), Handler())
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 17700
    assert snap.states() == {**STATES_BEFORE, "E0004": "done", "E0005": "done"}
    return snap


def test_a_sqlite_file_of_schema_2_needs_only_the_id_rule_and_priority_steps_and_works(
        engine: Path, tmp_path: Path) -> None:
    db = written(engine, str(tmp_path / "queue.sqlite3"))
    snap = audit.snapshot(db)
    assert snap.version == 2 and audit.check(snap) == [] and snap.states() == STATES_BEFORE

    assert migrate(db).steps == ((2, 0), (3, 0))
    finished(db)
    refused = previous_engine.cli(engine, "--db", db, "status", "--json")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: schema_too_new: ") and "version 4" in refused.stderr


def _functions(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [row[0] for row in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace")]


def test_a_postgresql_schema_of_version_2_is_refused_for_writes_then_migrated_by_a_function(
        engine: Path, pg_dsn: str) -> None:
    db = written(engine, pg_dsn)
    before = audit.snapshot(db)
    assert before.version == 2 and audit.check(before) == [] and _functions(db) == []
    work = cli(db, "--now", "2000", "work")
    assert work.returncode == 1 and work.stdout == ""
    assert work.stderr.startswith("error: schema_too_old: ") and "schema version 2;" in work.stderr
    assert (f"writes version {postgres.SCHEMA_VERSION}: run `queue-core migrate` first"
            in work.stderr)

    done = cli(db, "migrate")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "schema 2 -> 3: 0 messages rewritten"
    after = audit.snapshot(db)
    assert after.version == postgres.SCHEMA_VERSION and audit.check(after) == []
    assert (after.messages, after.journal, after.effect_rows, after.digests) == (
        before.messages, before.journal, before.effect_rows, before.digests)
    assert _functions(db) == ["queue_core_step"]
    finished(db)
    refused = previous_engine.cli(engine, "--db", db, "status")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: schema_too_new: ")
    assert f"version {postgres.SCHEMA_VERSION}" in refused.stderr


# A worker of that engine whose session opened, and claimed, before the step commits.
AFTER_STEP = (("ack", "queue.complete(lease, Handler())"),
              ("enqueue", AFTER_MIGRATION[1][1]),
              ("work", "[o.kind for o in drain(queue, Handler())]"))


def test_a_running_worker_of_that_engine_goes_on_unchanged_across_the_step(
        engine: Path, pg_dsn: str) -> None:
    db = written(engine, pg_dsn)

    def step() -> None:
        assert migrate(db).steps == ((2, 0), (3, 0), (4, 0), (5, 0), (6, 0))

    said: dict[str, Any] = {line["step"]: line for line in
                            worker_said(engine, db, step, AFTER_STEP)}
    assert said["claim"]["ok"].startswith("Lease(event_id='E0005', generation=1")
    assert said["ack"]["ok"] == "Effect(category='bag', amount_cents=700)", said
    assert said["enqueue"]["ok"] == "EnqueueResult(inserted=1, duplicates=0)"
    assert said["work"]["ok"] == "['done']"  # E0009; E0004's lease is not yet over at 1020
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.version == postgres.SCHEMA_VERSION
    assert snap.money == 15800
    drain(Queue(db, clock=ModelClock(2000)), Handler())
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 17800


def test_this_engine_refuses_to_write_a_version_2_schema_before_it_is_migrated(
        engine: Path, pg_dsn: str) -> None:
    db = written(engine, pg_dsn)
    queue = Queue(db, clock=ModelClock(2000))
    assert queue.schema_version == 2
    with pytest.raises(UnusableFile) as refused:
        queue.claim()
    assert refused.value.code == "schema_too_old"
    assert audit.snapshot(db).states() == STATES_BEFORE
    queue.migrate()
    assert queue.schema_version == postgres.SCHEMA_VERSION
    assert queue.claim() is not None
