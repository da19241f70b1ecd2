"""Queues written by the release before the id rule, tested with its own code.

The engine of e256d49 writes SQLite's schema 2 and PostgreSQL's schema 4,
and knows only the course's ids. The step to SQLite's 3 and PostgreSQL's 5
records the rule a queue's ids follow; a queue it finds becomes a course
queue, with no message, effect or journal row rewritten (nor by the next
step, which adds the priority: ``test_schema5_engine``). On each store: a
queue of that version is read as it is and refused for writes until
``migrate``; the step is crash-swept at its four points; a worker of that
engine running while the step commits is refused loudly (SQLite) or goes on
correct (PostgreSQL, whose tables the step leaves as they were); and that
engine refuses the migrated queue when it opens it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import previous_engine
from queue_core import CRASH_EXIT_CODE, Handler, ModelClock, Queue, UnusableFile, audit, drain
from queue_core import migrate, postgres, sqlite
from queue_core.errors import IdRuleDiffers
from queue_core.lab.lifetime.earlier import AFTER_MIGRATION, V1_STORY, worker_said
from queue_core.lab.lifetime.migration import migrate_killed_at
from queue_core.sqlite.schema import PRIORITY_COLUMN

ROOT = Path(__file__).resolve().parent.parent
ENGINE = previous_engine.SCHEMA4_ENGINE
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready"}
STORY = V1_STORY.split("import sqlite3")[0]  # every state, 15000 of money
OLD = {"sqlite": 2, "postgres": 4}
STEP = {"sqlite": 3, "postgres": 5}  # the id rule's step; the priority's follows
NEW = {"sqlite": sqlite.SCHEMA_VERSION, "postgres": postgres.SCHEMA_VERSION}
# what ``migrate`` applies: the id rule's step, the priority's, and on PostgreSQL the
# step's claim with a constant LIMIT
STEPS = {"sqlite": ((2, 0), (3, 0)), "postgres": ((4, 0), (5, 0), (6, 0))}
MIGRATION_POINTS = ("migrate.after_begin", "migrate.after_copy", "migrate.before_commit",
                    "migrate.after_commit")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    previous_engine.require_history()
    return previous_engine.export(ENGINE, tmp_path_factory.mktemp("engines"))


@pytest.fixture(params=["sqlite", "postgres"])
def written(request: pytest.FixtureRequest, engine: Path, tmp_path: Path) -> tuple[str, str]:
    """(store, target): a queue that engine wrote, every state in it."""
    target = (str(tmp_path / "queue.sqlite3") if request.param == "sqlite"
              else str(request.getfixturevalue("pg_dsn")))
    done = previous_engine.run(engine, STORY, target)
    assert done.returncode == 0, done.stderr
    assert audit.snapshot(target).version == OLD[request.param]
    return request.param, target


def cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def stored_rows(target: str) -> dict[str, Any]:
    """Every row of the three tables the step must not touch, and messages' own DDL or
    row versions: a row rewritten would show in them. The priority, which the next
    step adds in place (``ALTER TABLE ... ADD COLUMN``), is left out: its column, and
    the text SQLite adds to the table's DDL for it."""
    tables = ("messages", "effects", "transitions")
    if target.startswith("postgresql://"):
        with psycopg.connect(target, autocommit=True) as conn:
            return {table: conn.execute(f"SELECT ctid::text, {_columns(conn, table)} "
                                        f"FROM {table} AS t ORDER BY 1").fetchall()
                    for table in tables}
    conn = sqlite.connect_readonly(target)
    try:
        rows = {table: conn.execute(f"SELECT {_columns(conn, table)} FROM {table} ORDER BY 1"
                                    ).fetchall() for table in tables}
        rows["ddl"] = [(text.replace(f" {PRIORITY_COLUMN},", "", 1),) for text, in conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'messages'")]
        return rows
    finally:
        conn.close()


def _columns(conn: Any, table: str) -> str:
    """The columns of ``table`` but the priority, in order."""
    if isinstance(conn, sqlite3.Connection):
        names = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    else:
        names = [row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = %s ORDER BY ordinal_position", (table,))]
    return ", ".join(name for name in names if name != "priority")


def test_that_engines_queue_is_refused_for_writes_then_migrated_without_a_row_rewritten(
        engine: Path, written: tuple[str, str]) -> None:
    store, db = written
    before, rows = audit.snapshot(db), stored_rows(db)
    work = cli(db, "--now", "1020", "work")
    assert work.returncode == 1 and work.stdout == ""
    assert work.stderr.startswith("error: schema_too_old: ")
    assert f"schema version {OLD[store]};" in work.stderr
    assert Queue(db).id_rule == "course"  # read as it is: a course queue

    done = cli(db, "migrate")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:-1] == [
        f"schema {version} -> {version + 1}: 0 messages rewritten"
        for version, _ in STEPS[store]]
    after = audit.snapshot(db)
    assert after.version == NEW[store] and audit.check(after) == []
    assert (after.messages, after.journal, after.effect_rows, after.digests) == (
        before.messages, before.journal, before.effect_rows, before.digests)
    assert stored_rows(db) == rows
    queue = Queue(db, clock=ModelClock(2000))
    assert queue.id_rule == "course" and queue.status().ids == "course"
    with pytest.raises(IdRuleDiffers):
        Queue(db, ids="general")
    assert [o.kind for o in drain(queue, Handler())] == ["done", "done"]
    snap = audit.snapshot(db)
    assert snap.money == 17700 and set(snap.states().values()) == {"done", "dead"}
    refused = previous_engine.cli(engine, "--db", db, "status")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: schema_too_new: ")
    assert f"version {NEW[store]}" in refused.stderr


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_the_step_killed_at_each_point_leaves_the_old_version_intact_or_the_new_complete(
        point: str, written: tuple[str, str]) -> None:
    store, db = written
    before, rows = audit.snapshot(db), stored_rows(db)
    child = migrate_killed_at(db, point)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(db)
    committed = point == "migrate.after_commit"
    assert audit.check(snap) == [] and snap.version == (STEP if committed else OLD)[store]
    assert stored_rows(db) == rows and snap.messages == before.messages
    assert snap.money == 15000
    assert migrate(db).to_version == NEW[store] and audit.findings(db) == []
    assert Queue(db).id_rule == "course"


def test_a_running_worker_of_that_engine_is_refused_loudly_or_stays_correct(
        engine: Path, written: tuple[str, str]) -> None:
    store, db = written

    def step() -> None:  # that worker's session opened, and claimed, before it commits
        assert migrate(db).steps == STEPS[store]

    claimed, acked = worker_said(engine, db, step, AFTER_MIGRATION[:1])
    assert claimed["ok"].startswith("Lease(event_id='E0005'")
    snap = audit.snapshot(db)
    assert audit.check(snap) == []
    if store == "sqlite":
        # its transaction reads the version under the write lock: refused, nothing written
        assert (acked.get("error"), acked.get("code")) == ("UnusableFile", "schema_too_new"), acked
        assert snap.money == 15000 and snap.states() == {**STATES_BEFORE, "E0005": "leased"}
    else:
        # the step left every table as it was: that engine's ACK is sound, and counted once
        assert acked.get("ok") == "Effect(category='bag', amount_cents=700)", acked
        assert snap.money == 15700 and snap.states() == {**STATES_BEFORE, "E0005": "done"}
    drain(Queue(db, clock=ModelClock(3000)), Handler())
    final = audit.snapshot(db)
    assert final.money == 17700 and audit.check(final) == []
    assert sorted(final.states().values()) == ["dead", "done", "done", "done", "done"]


def test_this_engine_refuses_to_write_that_engines_queue_before_it_is_migrated(
        written: tuple[str, str]) -> None:
    store, db = written
    queue = Queue(db, clock=ModelClock(2000))
    assert queue.schema_version == OLD[store]
    with pytest.raises(UnusableFile) as refused:
        queue.claim()
    assert refused.value.code == "schema_too_old"
    assert audit.snapshot(db).states() == STATES_BEFORE
    queue.migrate()
    assert queue.schema_version == NEW[store]
    assert queue.claim() is not None


def test_a_sqlite_step_writes_the_same_schema_a_new_file_gets(
        engine: Path, tmp_path: Path) -> None:
    old = str(tmp_path / "old.sqlite3")
    previous_engine.run(engine, STORY, old)
    migrate(old)
    new = str(tmp_path / "new.sqlite3")
    Queue(new).enqueue_jsonl('{"event_id": "E0001", "payload": {"category": "book", '
                             '"amount_cents": 1}}')

    def ddl(path: str) -> list[tuple[str, str]]:
        # each run of white space as one: SQLite writes the column the step to 4
        # appends (``ADD COLUMN``) on the line of the one before it
        conn = sqlite3.connect(path)
        try:
            return [(name, text if text is None else " ".join(text.split())) for name, text in
                    conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name")]
        finally:
            conn.close()

    assert ddl(old) == ddl(new)
