"""PostgreSQL queues written by the release before schema 4, tested with its own code.

The engine of 275fe7a writes PostgreSQL's schema 3, whose step function
compares the payload an effect was computed from with the payload stored
now, but not with the one enqueued: a payload edited before the claim is
counted. Schema 4 replaces that function and changes no row and no index.
A schema of version 3 is read as it is and refused for writes until
``migrate``; the step is crash-swept; a worker of that engine running while
the step commits calls the new function from its next step and never counts
an edit; and that engine refuses the migrated schema when it opens it.
(Its SQLite files are schema 2, this engine's own: ``test_schema2_engine``.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import previous_engine
from queue_core import CRASH_EXIT_CODE, Handler, ModelClock, Queue, UnusableFile, audit, drain
from queue_core import migrate, postgres
from queue_core.lab.lifetime.earlier import V1_STORY, worker_said
from queue_core.lab.lifetime.migration import migrate_killed_at

ROOT = Path(__file__).resolve().parent.parent
ENGINE = previous_engine.SCHEMA3_ENGINE
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready"}
STORY = V1_STORY.split("import sqlite3")[0]  # every state, 15000 of money
EDITED = '{"amount_cents":999900,"category":"bag"}'  # E0005 was enqueued as bag 700
MIGRATION_POINTS = ("migrate.after_begin", "migrate.after_copy", "migrate.before_commit",
                    "migrate.after_commit")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    previous_engine.require_history()
    return previous_engine.export(ENGINE, tmp_path_factory.mktemp("engines"))


@pytest.fixture
def schema3(engine: Path, pg_dsn: str) -> str:
    done = previous_engine.run(engine, STORY, pg_dsn)
    assert done.returncode == 0, done.stderr
    assert audit.snapshot(pg_dsn).version == 3
    return pg_dsn


def cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def sql(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def step_source(dsn: str) -> str:
    return str(sql(dsn, "SELECT prosrc FROM pg_proc WHERE proname = 'queue_core_step' AND "
                        "pronamespace = current_schema()::regnamespace")[0][0])


def edit_e0005(dsn: str) -> None:
    sql(dsn, f"UPDATE messages SET payload = '{EDITED}' WHERE event_id = 'E0005'")


def test_that_engines_step_counts_a_payload_edited_before_the_claim(
        engine: Path, schema3: str) -> None:
    # The defect schema 4 removes, shown with that release's own code.
    edit_e0005(schema3)
    done = previous_engine.cli(engine, "--db", schema3, "--now", "1020", "work")
    assert done.returncode == 0, done.stderr
    assert sql(schema3, "SELECT amount_cents FROM effects WHERE event_id = 'E0005'") == [
        (999900,)]


def test_a_version_3_schema_is_refused_for_writes_then_migrated_without_a_row_rewritten(
        engine: Path, schema3: str) -> None:
    before = audit.snapshot(schema3)
    work = cli(schema3, "--now", "1020", "work")
    assert work.returncode == 1 and work.stdout == ""
    assert work.stderr.startswith("error: schema_too_old: ") and "schema version 3;" in work.stderr

    done = cli(schema3, "migrate")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:4] == ["schema 3 -> 4: 0 messages rewritten",
                                            "schema 4 -> 5: 0 messages rewritten",
                                            "schema 5 -> 6: 0 messages rewritten",
                                            "schema 6 -> 7: 0 messages rewritten"]
    after = audit.snapshot(schema3)
    assert after.version == postgres.SCHEMA_VERSION == 7 and audit.check(after) == []
    assert (after.messages, after.journal, after.effect_rows, after.digests) == (
        before.messages, before.journal, before.effect_rows, before.digests)
    # the function is this engine's own, as a new schema gets it
    assert "payload_edited" in step_source(schema3)
    edit_e0005(schema3)
    outcomes = drain(Queue(schema3, clock=ModelClock(2000)), Handler())
    assert sorted((o.event_id, o.kind, o.code) for o in outcomes) == [
        ("E0004", "done", None), ("E0005", "dead", "payload_differs")]
    snap = audit.snapshot(schema3)
    assert snap.money == 17000 and snap.states()["E0005"] == "dead"
    refused = previous_engine.cli(engine, "--db", schema3, "status")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: schema_too_new: ")
    assert f"version {postgres.SCHEMA_VERSION}" in refused.stderr


def test_the_new_function_is_the_one_a_new_schema_gets(schema3: str, pg_dsn: str) -> None:
    migrate(schema3)
    new = pg_dsn.replace(pg_dsn.rsplit("search_path%3D", 1)[1], "queue_fresh_4")
    sql(schema3, "CREATE SCHEMA queue_fresh_4")
    try:
        Queue(new).status()
        assert step_source(new) == step_source(schema3)
    finally:
        sql(schema3, "DROP SCHEMA queue_fresh_4 CASCADE")


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_the_step_killed_at_each_point_leaves_version_3_intact_or_version_4_complete(
        point: str, schema3: str) -> None:
    before, old_step = audit.snapshot(schema3), step_source(schema3)
    child = migrate_killed_at(schema3, point)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(schema3)
    committed = point == "migrate.after_commit"
    assert audit.check(snap) == [] and snap.version == (4 if committed else 3)  # the step to 4
    assert (step_source(schema3) == old_step) is not committed
    assert snap.messages == before.messages and snap.money == 15000
    assert migrate(schema3).to_version == postgres.SCHEMA_VERSION
    assert audit.findings(schema3) == []


# A worker of that engine whose session opened, and claimed, before the step commits.
AFTER_STEP = (("work", "[[o.event_id, o.kind, o.code] for o in drain(queue, Handler())]"),
              ("ack", "queue.complete_and_claim(lease, Handler())"))


def test_a_running_worker_of_that_engine_calls_the_new_function_and_counts_no_edit(
        engine: Path, schema3: str) -> None:
    def step_then_edit() -> None:
        assert migrate(schema3).steps == ((3, 0), (4, 0), (5, 0), (6, 0))
        edit_e0005(schema3)  # edited while that worker holds its lease

    claimed, drained, acked = worker_said(engine, schema3, step_then_edit, AFTER_STEP)
    assert claimed["ok"].startswith("Lease(event_id='E0005'")
    assert drained["ok"] == "[]"  # E0004's lease is not yet over at 1020: nothing else is due
    # the new function refused the edit and moved E0005 to dead; that engine, which
    # does not know the answer, reads the row it got back and says not_leased
    assert (acked["error"], acked.get("code")) == ("LeaseLost", "not_leased"), acked
    snap = audit.snapshot(schema3)
    assert snap.money == 15000 and snap.states() == {**STATES_BEFORE, "E0005": "dead"}
    assert sql(schema3, "SELECT last_error FROM messages WHERE event_id = 'E0005'") == [
        ("payload_differs",)]


def test_this_engine_refuses_to_write_a_version_3_schema_before_it_is_migrated(
        schema3: str) -> None:
    queue = Queue(schema3, clock=ModelClock(2000))
    assert queue.schema_version == 3
    with pytest.raises(UnusableFile) as refused:
        queue.claim()
    assert refused.value.code == "schema_too_old"
    assert audit.snapshot(schema3).states() == STATES_BEFORE
    queue.migrate()
    assert queue.schema_version == postgres.SCHEMA_VERSION
    assert queue.claim() is not None
